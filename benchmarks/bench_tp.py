#!/usr/bin/env python
"""Batched tensor-product benchmark: equikernels vs e3nn, cuEquivariance and OpenEquivariance.

Methodology (docs/performance.md, benchmarks/README.md):

* problems: ``equikernels.catalog.standard_problems()`` (e3nn constructor kwargs);
* directions (OpenEquivariance's definitions):
    fwd  = ``tp(x, y, w)`` on inputs without grad;
    bwd  = ``autograd.grad(out, [x, y, w], g, retain_graph=True)`` on a retained forward graph
           (the forward is not timed);
    dbwd = ``autograd.grad(L, [x, y, w, g], retain_graph=True)`` with
           ``L = <gx, Rx> + <gy, Ry> + <gw, Rw>`` built from first-order grads taken with
           ``create_graph=True`` (forward and first backward not timed);
* timing: CUDA events around every call, warm-up, median of n (n for ~250 ms of work), inputs
  rotated over several sets when a set is small compared with L2 (``equikernels.bench.tp.make_call``
  and ``equikernels.bench.timing``);
* correctness: every implementation against e3nn built in float64 (under
  ``torch.set_default_dtype(torch.float64)``) on fresh random inputs at a small row count:
  relative error ``||a - ref|| / ||ref||`` of the output, the three grads and the four
  second-order grads, mapped back to e3nn's layout and weight order.

Every implementation that is missing or fails is reported (status absent / error / oom, with the
exception type and message); nothing is skipped silently and one failure never stops the run.

Usage (GPU):  python benchmarks/bench_tp.py [--quick] [--compile-time] ...
Debug (CPU):  python benchmarks/bench_tp.py --device cpu --backend reference --quick --rows 64 --out /tmp/x
"""
from __future__ import annotations

import argparse
import json
import math
import os
import shutil
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable, Dict, List, Optional, Tuple

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent
for _p in (str(HERE), str(ROOT)):
    if _p not in sys.path:
        sys.path.insert(0, _p)

import torch  # noqa: E402

import common as C  # noqa: E402

from equikernels.bench import tp as TP  # noqa: E402

IMPLS = ("equikernels", "equikernels_ir_mul", "e3nn", "cue_ir_mul", "cue_mul_ir", "oeq")
SHORT = {"equikernels": "ek", "equikernels_ir_mul": "ek_ir", "e3nn": "e3nn", "cue_ir_mul": "cue_ir",
         "cue_mul_ir": "cue_mi", "oeq": "oeq"}
DIRECTIONS = ("fwd", "bwd", "dbwd")
BASELINES = ("cue_ir_mul", "oeq")  # the best library: the faster of cue[ir_mul] and OEQ
OURS = ("equikernels", "equikernels_ir_mul")
QUICK_PROBLEMS = ("mace-medium", "nequip-water", "tetris-poly-1")
DTYPES = {"float32": torch.float32, "float64": torch.float64}
DT_SHORT = {"float32": "f32", "float64": "f64"}
TOL = {"float32": 1e-5, "float64": 1e-10}  # parity targets (used only to flag)
SCHEMA = "equikernels-bench-tp/1"


def build(impl: str, spec: TP.Spec, dtype, device, args) -> TP.Built:
    """This script's implementations: the package's builders in both layouts."""
    if impl == "equikernels":
        return TP.build_equikernels(spec, dtype, device, "mul_ir", args.backend)
    if impl == "equikernels_ir_mul":
        return TP.build_equikernels(spec, dtype, device, "ir_mul", args.backend)
    if impl == "e3nn":
        return TP.build_e3nn(spec, dtype, device)
    if impl == "cue_ir_mul":
        return TP.build_cue(spec, dtype, device, "ir_mul")
    if impl == "cue_mul_ir":
        return TP.build_cue(spec, dtype, device, "mul_ir")
    if impl == "oeq":
        return TP.build_oeq(spec, dtype, device)
    raise ValueError(f"unknown implementation {impl!r}; expected one of {IMPLS}")


# --- timing one cell ----------------------------------------------------------------------------
def time_cell(spec: TP.Spec, built: TP.Built, direction: str, rows: int, dtype, device, args) -> dict:
    C.reset_peak(device)
    call, n_sets, nbytes = TP.make_call(spec, built, direction, rows, dtype, device, max_sets=args.max_sets,
                                        rotate_factor=args.rotate_factor, seed=args.seed)
    res = C.time_calls(call, device, n_sets=n_sets, target_ms=args.target_ms, min_reps=args.min_reps,
                       max_reps=args.max_reps, warmup=args.warmup)
    if getattr(args, "gpu_time", True):
        res.update(C.queued_gpu_times(call, device, res["est_ms"]))
    res["peak_gib"] = C.peak_gib(device)
    res["bytes_min"] = nbytes
    res["gbps"] = nbytes / (res["ms_median"] * 1e-3) / 1e9
    del call
    return res


# --- the run ------------------------------------------------------------------------------------
def parse_list(s: Optional[str], allowed=None, what="value") -> Optional[List[str]]:
    if s is None:
        return None
    vals = [v.strip() for v in s.split(",") if v.strip()]
    if allowed is not None:
        bad = [v for v in vals if v not in allowed]
        if bad:
            raise SystemExit(f"unknown {what}: {bad}; expected some of {list(allowed)}")
    return vals


def resolve_args(args) -> None:
    from equikernels.catalog import standard_problems
    names = list(standard_problems())
    q = args.quick
    args.problems = parse_list(args.problems, names, "problem") or (list(QUICK_PROBLEMS) if q else names)
    args.dtypes = parse_list(args.dtypes, DTYPES, "dtype") or (["float32"] if q else ["float32", "float64"])
    args.directions = parse_list(args.directions, DIRECTIONS, "direction") or list(DIRECTIONS)
    args.impls = parse_list(args.impls, IMPLS, "implementation") or list(IMPLS)
    if args.rows is None:
        args.rows = 10000 if q else 50000
    dr = parse_list(args.dbwd_rows)
    args.dbwd_rows = [int(v) for v in dr] if dr else ([args.rows] if q else [20000, 50000])
    if args.target_ms is None:
        args.target_ms = 30.0 if q else 250.0
    if args.min_reps is None:
        args.min_reps = 3 if q else 5
    if args.warmup is None:
        args.warmup = 2 if q else 3
    if args.check_rows is None:
        args.check_rows = min(256 if q else 1000, max(args.rows, 16))
    if args.backend is None:
        args.backend = "triton" if args.device.startswith("cuda") else "reference"
    if args.compile_rows is None:
        args.compile_rows = 1000 if q else min(args.rows, 50000)


def progress(msg: str) -> None:
    print(msg, flush=True)


def run(args, paths: Dict[str, Path]) -> dict:
    from equikernels.catalog import standard_problems
    device = torch.device(args.device)
    if device.type == "cuda" and device.index is not None:
        torch.cuda.set_device(device)
    t_run = time.perf_counter()
    catalog = standard_problems()
    data = {"schema": SCHEMA, "args": {k: v for k, v in vars(args).items() if not k.startswith("_")},
            "env": C.env_info(device), "problems": {}, "correctness": [], "cells": [], "compile_time": []}
    progress(f"device: {data['env'].get('gpu')}  torch {torch.__version__}  e3nn {data['env']['e3nn']}  "
             f"cue {data['env']['cuequivariance_torch']}  oeq {data['env']['openequivariance']}")
    data["copy_bandwidth"] = C.copy_bandwidth(device)
    copy_gbps = data["copy_bandwidth"]["gbps_median"]
    progress(f"device-to-device copy: {copy_gbps:.0f} GB/s (median; {data['copy_bandwidth']['bytes_per_copy'] / 1e9:.2f} GB)")
    max_level = max(TP.LEVEL[d] for d in args.directions) if args.directions else -1
    plan = [(d, r) for d in args.directions for r in (args.dbwd_rows if d == "dbwd" else [args.rows])]
    total = len(args.problems) * len(args.dtypes) * len(args.impls) * len(plan)
    k = 0
    for pname in args.problems:
        spec = TP.Spec.create(pname, catalog[pname])
        data["problems"][pname] = spec.summary()
        progress(f"== {pname}: {spec.P.describe()}")
        ref = None
        over = args.time_budget_s is not None and time.perf_counter() - t_run > args.time_budget_s
        if max_level >= 0 and not args.no_check and not over:
            try:
                ref = TP.reference(spec, args.check_rows, device, level=max_level, seed=args.seed)
            except Exception as exc:
                ref = C.describe_exception(exc)
                progress(f"   e3nn float64 reference failed: {ref}")
        for dtname in args.dtypes:
            dtype = DTYPES[dtname]
            for impl in args.impls:
                status, err, built = "ok", None, None
                try:
                    if args.time_budget_s is not None and time.perf_counter() - t_run > args.time_budget_s:
                        status, err = "skipped", f"time budget of {args.time_budget_s:.0f} s exhausted"
                    else:
                        built = build(impl, spec, dtype, device, args)
                except TP.Absent as exc:
                    status, err = "absent", str(exc)
                except Exception as exc:
                    status, err = ("oom" if C.is_oom(exc) else "error"), "build: " + C.describe_exception(exc)
                errs, check_err = None, None
                if built is not None and isinstance(ref, tuple):
                    try:
                        errs = TP.errors(spec, built, dtype, ref[0], ref[1], max_level)
                    except Exception as exc:
                        check_err = C.describe_exception(exc)
                elif isinstance(ref, str):
                    check_err = "no reference: " + ref
                elif args.no_check:
                    check_err = "not checked (--no-check)"
                if status != "skipped":
                    data["correctness"].append({"problem": pname, "dtype": dtname, "impl": impl,
                                                "rows": args.check_rows, "errors": errs,
                                                "error": check_err if built is not None else err})
                C.free_memory(device)
                for direction, rows in plan:
                    k += 1
                    cell = {"problem": pname, "dtype": dtname, "direction": direction, "rows": rows,
                            "impl": impl, "status": status, "error": err,
                            "info": built.info if built is not None else {},
                            "rel_err": TP.direction_error(errs, direction), "check_error": check_err}
                    over = args.time_budget_s is not None and time.perf_counter() - t_run > args.time_budget_s
                    if built is not None and over:
                        cell["status"] = "skipped"
                        cell["error"] = f"time budget of {args.time_budget_s:.0f} s exhausted before this cell"
                    elif built is not None:
                        try:
                            cell.update(time_cell(spec, built, direction, rows, dtype, device, args))
                            cell["frac_copy"] = cell["gbps"] / copy_gbps if copy_gbps else None
                        except Exception as exc:
                            cell["status"] = "oom" if C.is_oom(exc) else "error"
                            cell["error"] = C.describe_exception(exc)
                        C.free_memory(device)
                    data["cells"].append(cell)
                    progress(cell_line(k, total, cell))
                del built
                C.free_memory(device)
            write_outputs(data, paths, plot=False)  # partial results survive a timeout
        del ref
        C.free_memory(device)
    return data


def cell_line(k: int, total: int, c: dict) -> str:
    head = f"[{k}/{total}] {c['problem']} {DT_SHORT[c['dtype']]} {c['direction']} {c['rows']} {c['impl']}:"
    if c["status"] != "ok":
        return f"{head} {c['status'].upper()} {c.get('error') or ''}"[:400]
    extra = f" err {C.fmt_err(c.get('rel_err'))}" if c.get("rel_err") is not None else \
        (f" check: {c['check_error'][:120]}" if c.get("check_error") else "")
    fb = " FALLBACK" if c.get("info", {}).get("fallback") else ""
    gpu = ""
    if c.get("gpu_ms_median") is not None:
        gpu = f" gpu {C.fmt_ms(c['gpu_ms_median'])} ms{'' if c.get('gpu_queued') else ' (not queued)'}" \
              f" host {c['host_us_per_call']:.0f} us/call"
    return (f"{head} {C.fmt_ms(c['ms_median'])} ms (min {C.fmt_ms(c['ms_min'])}, n={c['n']}, sets={c['n_sets']}) "
            f"{c['gbps']:.0f} GB/s{gpu}{extra}{fb}")


# --- compile time -------------------------------------------------------------------------------
def compile_child(cfg: dict) -> None:
    """Runs in a fresh interpreter: first-call times of the equikernels TP (fwd, bwd, dbwd)."""
    t_start = time.perf_counter()
    import torch as T
    from equikernels.catalog import problem
    from equikernels.ops import tensor_product
    t_import = time.perf_counter() - t_start
    dev = T.device(cfg["device"])
    dtype = DTYPES[cfg["dtype"]]
    P = problem(cfg["problem"])
    rows = cfg["rows"]
    sync = (lambda: T.cuda.synchronize(dev)) if dev.type == "cuda" else (lambda: None)
    T.manual_seed(0)
    x = T.randn(rows, P.dim_in1, device=dev, dtype=dtype, requires_grad=True)
    y = T.randn(rows, P.dim_in2, device=dev, dtype=dtype, requires_grad=True)
    w = T.randn(*((P.weight_numel,) if P.shared_weights else (rows, P.weight_numel)), device=dev,
                dtype=dtype, requires_grad=True)
    res = {"import_s": t_import}
    f = lambda: tensor_product(P, x, y, w, layout=cfg["layout"], backend=cfg["backend"])  # noqa: E731

    def two(name, call):
        for which in ("first_s", "second_s"):
            sync()
            t0 = time.perf_counter()
            call()
            sync()
            res[f"{name}_{which}"] = time.perf_counter() - t0

    with T.no_grad():
        two("fwd", f)
    out = f()
    g = T.randn_like(out, requires_grad=True)
    if "bwd" in cfg["directions"] or "dbwd" in cfg["directions"]:
        two("bwd", lambda: T.autograd.grad(out, (x, y, w), g, retain_graph=True))
    if "dbwd" in cfg["directions"]:
        gx, gy, gw = T.autograd.grad(out, (x, y, w), g, create_graph=True)
        L = (gx * T.randn_like(gx)).sum() + (gy * T.randn_like(gy)).sum() + (gw * T.randn_like(gw)).sum()
        two("dbwd", lambda: T.autograd.grad(L, (x, y, w, g), retain_graph=True))
    res["total_in_process_s"] = time.perf_counter() - t_start
    print("@@RESULT " + json.dumps(res), flush=True)


def _dir_size(p: Path) -> Tuple[int, int]:
    n = size = 0
    for f in p.rglob("*"):
        if f.is_file():
            n += 1
            size += f.stat().st_size
    return n, size


def measure_compile(args) -> List[dict]:
    out = []
    for layout in parse_list(args.compile_layouts, ("mul_ir", "ir_mul"), "layout"):
        tmp = Path(tempfile.mkdtemp(prefix="ek-compile-"))
        env = dict(os.environ, EQUIKERNELS_CACHE_DIR=str(tmp / "equikernels"), TRITON_CACHE_DIR=str(tmp / "triton"))
        env["PYTHONPATH"] = os.pathsep.join([str(ROOT)] + [p for p in env.get("PYTHONPATH", "").split(os.pathsep) if p])
        cfg = {"problem": args.compile_problem, "layout": layout, "dtype": "float32", "rows": args.compile_rows,
               "device": args.device, "backend": args.backend, "directions": args.directions}
        entry = {"problem": args.compile_problem, "layout": layout, "dtype": "float32", "rows": args.compile_rows,
                 "backend": args.backend, "note": "fresh subprocess each; cold = empty EQUIKERNELS_CACHE_DIR and "
                 "TRITON_CACHE_DIR, warm = second subprocess reusing both"}
        for phase in ("cold", "warm"):
            t0 = time.perf_counter()
            try:
                r = subprocess.run([sys.executable, str(Path(__file__).resolve()), "--_compile-child", json.dumps(cfg)],
                                   env=env, capture_output=True, text=True, timeout=args.compile_timeout)
                wall = time.perf_counter() - t0
                line = next((ln for ln in r.stdout.splitlines() if ln.startswith("@@RESULT ")), None)
                if r.returncode == 0 and line:
                    entry[phase] = dict(json.loads(line[len("@@RESULT "):]), process_wall_s=wall)
                else:
                    entry[phase] = {"error": f"exit {r.returncode}: " + " ".join((r.stderr or r.stdout)[-600:].split())}
            except subprocess.TimeoutExpired:
                entry[phase] = {"error": f"timeout after {args.compile_timeout} s"}
            if phase == "cold":
                entry["cache_files"], entry["cache_bytes"] = _dir_size(tmp)
            progress(f"compile {args.compile_problem} {layout} {phase}: " + ", ".join(
                f"{k}={v:.2f}" if isinstance(v, float) else f"{k}={v}" for k, v in entry[phase].items()))
        shutil.rmtree(tmp, ignore_errors=True)
        out.append(entry)
    return out


# --- outputs ------------------------------------------------------------------------------------
def device_name(device: torch.device) -> str:
    return torch.cuda.get_device_name(device) if device.type == "cuda" else "cpu"


def output_paths(args, gpu: str) -> Dict[str, Path]:
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    base = f"tp_{C.slug(gpu)}_{C.stamp()}{('_' + C.slug(args.tag)) if args.tag else ''}"
    return {"json": out / f"{base}.json", "md": out / f"{base}.md", "png": out / f"{base}.png"}


def write_outputs(data: dict, paths: Dict[str, Path], plot: bool = True) -> None:
    paths["json"].write_text(json.dumps(data, indent=1, default=str))
    paths["md"].write_text(render_markdown(data))
    if plot:
        try:
            import plot as plot_mod
            made = plot_mod.plot_results(data, paths["png"])
            if made is None:
                paths.pop("png", None)
        except Exception as exc:
            progress(f"plot skipped: {C.describe_exception(exc)}")
            paths.pop("png", None)


def _groups(data):
    keys = []
    for c in data["cells"]:
        k = (c["problem"], c["dtype"], c["direction"], c["rows"])
        if k not in keys:
            keys.append(k)
    by = {}
    for c in data["cells"]:
        by.setdefault((c["problem"], c["dtype"], c["direction"], c["rows"]), {})[c["impl"]] = c
    return keys, by


def _best_baseline(cells: Dict[str, dict]):
    ok = [(c["ms_median"], i) for i, c in cells.items() if i in BASELINES and c["status"] == "ok"]
    return min(ok) if ok else (None, None)


def _cell_ms(c: Optional[dict]) -> Optional[float]:
    return c["ms_median"] if c is not None and c["status"] == "ok" else None


def _detail_row(impl: str, c: dict, note: str) -> str:
    if c["status"] != "ok":
        return f"| {impl} | — | | | | | | | | | | | {C.fmt_err(c.get('rel_err'))} | | {note} |"
    frac = f"{100 * c['frac_copy']:.0f} %" if c.get("frac_copy") is not None else "—"
    peak = f"{c['peak_gib']:.2f}" if c.get("peak_gib") is not None else "—"
    # GPU time with the host queued ahead (common.queued_gpu_times); "*": the host did not get ahead
    gpu = "—" if c.get("gpu_ms_median") is None else C.fmt_ms(c["gpu_ms_median"]) + ("" if c.get("gpu_queued") else "*")
    host = f"{c['host_us_per_call']:.0f}" if c.get("host_us_per_call") is not None else "—"
    return (f"| {impl} | {C.fmt_ms(c['ms_median'])} | {C.fmt_ms(c['ms_min'])} | {C.fmt_ms(c['ms_p20'])} | "
            f"{C.fmt_ms(c['ms_p80'])} | {c['ms_stdev']:.3g} | {c['n']} | {c['n_sets']} | {c['gbps']:.0f} | {frac} | "
            f"{gpu} | {host} | {C.fmt_err(c.get('rel_err'))} | {peak} | {note} |")


def render_markdown(data: dict) -> str:
    env = data["env"]
    cb = data.get("copy_bandwidth", {})
    L = [f"# Tensor-product benchmark: {env.get('gpu')} ({env.get('date_utc')})", ""]
    ek = env.get("equikernels", {})
    L += ["| item | value |", "|---|---|",
          f"| GPU | {env.get('gpu')} ({env.get('gpu_sms', '?')} SMs, {env.get('gpu_mem_gib', '?')} GiB), "
          f"driver {env.get('nvidia_smi', {}).get('driver_version', '?')} |",
          f"| torch / CUDA | {env.get('torch')} / {env.get('torch_cuda')} |",
          f"| triton | {env.get('triton')} |", f"| e3nn | {env.get('e3nn')} |",
          f"| cuequivariance / _torch / _ops_torch | {env.get('cuequivariance')} / {env.get('cuequivariance_torch')}"
          f" / {env.get('cuequivariance_ops_torch')} |",
          f"| OpenEquivariance | {env.get('openequivariance')} |",
          f"| equikernels | commit {ek.get('git_commit')}{' (dirty)' if ek.get('git_dirty') else ''}, "
          f"source sha256 {ek.get('source_sha256')}, backend {data['args'].get('backend')} |",
          f"| device-to-device copy | {cb.get('gbps_median', float('nan')):.0f} GB/s median "
          f"({cb.get('bytes_per_copy', 0) / 1e9:.2f} GB buffer, read + write counted) |",
          f"| timing | {'CUDA events' if env.get('gpu') != 'cpu' else 'perf_counter (CPU debug run)'} per call, median of n (≈{data['args'].get('target_ms')} ms of work, "
          f"min {data['args'].get('min_reps')}), warm-up {data['args'].get('warmup')}, inputs rotated over "
          f"≥1 sets to cover {data['args'].get('rotate_factor')}× L2 |",
          f"| correctness | vs e3nn float64, {data['args'].get('check_rows')} rows, fresh random inputs; "
          f"rel. err = ‖a−ref‖/‖ref‖ (fwd: out; bwd: max of gx, gy, gw; dbwd: max of the 4 second-order grads) |",
          ""]
    L += ["Directions: fwd = `tp(x,y,w)`; bwd = `autograd.grad(out,[x,y,w],g)` on a retained graph; "
          "dbwd = `autograd.grad(L,[x,y,w,g])`, `L=<gx,Rx>+<gy,Ry>+<gw,Rw>` from create_graph grads. "
          "GB/s = minimal traffic (fwd d1+d2+w+d3, bwd 2(d1+d2+w)+d3, dbwd 3(d1+d2+w)+2·d3 words/row; "
          "shared weights once) / median time. `ek` = equikernels (mul_ir), `ek_ir` = equikernels ir_mul "
          "(inputs already in ir_mul, no conversion timed), `cue_ir`/`cue_mi` = cuEquivariance ir_mul / e3nn "
          "layout (cue's transposes included).", ""]
    keys, by = _groups(data)
    # speed-up summary
    L += ["## Speed-up summary", "",
          "speed-up = t(best of cue_ir_mul, oeq) ÷ t(equikernels); >1 means equikernels is faster.", "",
          "| problem | dtype | dir | rows | best baseline | ms | ek ms | ek speed-up | ek_ir ms | ek_ir speed-up | e3nn ms | e3nn/ek |",
          "|---|---|---|---:|---|---:|---:|---:|---:|---:|---:|---:|"]
    for k in keys:
        cells = by[k]
        tb, nb = _best_baseline(cells)
        t_ek, t_eki, t_e3 = (_cell_ms(cells.get(i)) for i in ("equikernels", "equikernels_ir_mul", "e3nn"))
        sp = lambda t: f"{tb / t:.2f}×" if (tb and t) else "—"  # noqa: E731
        L.append(f"| {k[0]} | {k[1]} | {k[2]} | {k[3]} | {nb or '—'} | {C.fmt_ms(tb)} | {C.fmt_ms(t_ek)} | {sp(t_ek)} | "
                 f"{C.fmt_ms(t_eki)} | {sp(t_eki)} | {C.fmt_ms(t_e3)} | "
                 f"{(f'{t_e3 / t_ek:.3g}×' if (t_e3 and t_ek) else '—')} |")
    L.append("")
    # detailed tables
    L += ["## Details", ""]
    for k in keys:
        p = data["problems"].get(k[0], {})
        L += [f"### {k[0]} · {k[1]} · {k[2]} · {k[3]} rows", "", f"{p.get('description', '')}", "",
              "| impl | ms median | min | p20 | p80 | stdev | n | sets | GB/s | % copy | GPU ms | host us/call | rel. err | peak GiB | note |",
              "|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---|"]
        for impl, c in by[k].items():
            note = []
            if c["status"] != "ok":
                note.append(f"**{c['status']}**: {c.get('error') or ''}")
            if c.get("check_error"):
                note.append(f"check: {c['check_error']}")
            info = c.get("info") or {}
            if info.get("fallback"):
                note.append("FALLBACK: " + info["fallback"])
            if info.get("kernel_class"):
                note.append(f"{info.get('method')}/{info['kernel_class']}")
            if c.get("rel_err") is not None and c["rel_err"] > TOL[c["dtype"]] * (100 if impl not in OURS else 1):
                note.append("error above tolerance")
            note_s = "; ".join(note).replace("|", "\\|")
            L.append(_detail_row(impl, c, note_s))
        L.append("")
    if data.get("correctness"):
        L += ["## Correctness (all orders, vs e3nn float64)", "",
              "| problem | dtype | impl | rows | out | gx | gy | gw | dx | dy | dw | dg | note |",
              "|---|---|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---|"]
        for r in data["correctness"]:
            e = r.get("errors") or {}
            vals = " | ".join(C.fmt_err(e.get(n)) for n in ("out", "gx", "gy", "gw", "dx", "dy", "dw", "dg"))
            L.append(f"| {r['problem']} | {r['dtype']} | {r['impl']} | {r['rows']} | {vals} | "
                     f"{(r.get('error') or '').replace('|', '/')} |")
        L.append("")
    if data.get("compile_time"):
        L += ["## equikernels compile time (first call, fresh subprocess)", "",
              "| problem | layout | rows | phase | import s | fwd 1st s | fwd 2nd s | bwd 1st s | bwd 2nd s | "
              "dbwd 1st s | dbwd 2nd s | process s | note |",
              "|---|---|---:|---|---:|---:|---:|---:|---:|---:|---:|---:|---|"]
        for e in data["compile_time"]:
            for phase in ("cold", "warm"):
                r = e.get(phase, {})
                f = lambda n: f"{r[n]:.2f}" if isinstance(r.get(n), (int, float)) else "—"  # noqa: E731
                note = r.get("error", "") if phase == "warm" else \
                    (r.get("error", "") or f"cache after cold: {e.get('cache_files')} files, "
                     f"{(e.get('cache_bytes') or 0) / 1e6:.1f} MB")
                L.append(f"| {e['problem']} | {e['layout']} | {e['rows']} | {phase} | {f('import_s')} | "
                         f"{f('fwd_first_s')} | {f('fwd_second_s')} | {f('bwd_first_s')} | {f('bwd_second_s')} | "
                         f"{f('dbwd_first_s')} | {f('dbwd_second_s')} | {f('process_wall_s')} | "
                         f"{note.replace('|', '/')} |")
        L.append("")
    return "\n".join(L)


def summary_text(data: dict) -> str:
    """Short fixed-width table (the remote run returns only the tail of stdout)."""
    keys, by = _groups(data)
    impls = [i for i in IMPLS if any(c["impl"] == i for c in data["cells"])]
    errs = {}
    for c in data["cells"]:
        if c["status"] != "ok" or c.get("check_error"):
            msg = c.get("error") if c["status"] != "ok" else "check: " + c["check_error"]
            errs.setdefault((c["impl"], msg[:150]), 0)
            errs[(c["impl"], msg[:150])] += 1
    out = []
    if errs:
        out.append("-- failures (impl: message [cells]) --")
        for (impl, msg), n in list(errs.items())[:15]:
            out.append(f"{SHORT[impl]}: {msg[:120]} [{n}]")
        if len(errs) > 15:
            out.append(f"... {len(errs) - 15} more distinct failures in the JSON / markdown")
    fb = sorted({c["impl"] for c in data["cells"] if (c.get("info") or {}).get("fallback")})
    if fb:
        out.append(f"!! cue ran its naive PyTorch fallback (no CUDA kernel) for: {', '.join(fb)}")
    cb = data.get("copy_bandwidth") or {}
    copy_s = f", copy {cb['gbps_median']:.0f} GB/s" if cb.get("gbps_median") else ""
    if keys:
        out.append(f"-- summary: {data['env'].get('gpu')}{copy_s}; ms median; "
                   f"sp = best(cue_ir,oeq)/t (>1: equikernels faster); bad = rel.err above tol --")
    hdr = f"{'problem':<22} {'dt':<3} {'dir':<4} {'rows':>6} |" + "".join(f"{SHORT[i]:>8}" for i in impls) + \
          " | sp_ek sp_ekir | max_err_ek bad"
    if keys:
        out.append(hdr)
    for k in keys:
        cells = by[k]
        vals = ""
        for i in impls:
            c = cells.get(i)
            if c is None:
                s = "·"
            elif c["status"] == "ok":
                s = C.fmt_ms(c["ms_median"])
            else:
                s = {"absent": "abs", "oom": "OOM", "skipped": "skip"}.get(c["status"], "ERR")
            vals += f"{s:>8}"
        tb, _ = _best_baseline(cells)
        sp = []
        for i in OURS:
            t = _cell_ms(cells.get(i))
            sp.append(f"{tb / t:.2f}" if (tb and t) else "-")
        ek_err = [cells[i]["rel_err"] for i in OURS if i in cells and cells[i].get("rel_err") is not None]
        bad = [SHORT[i] for i, c in cells.items()
               if c.get("rel_err") is not None and c["rel_err"] > TOL[k[1]] * (1 if i in OURS else 100)]
        out.append(f"{k[0][:22]:<22} {DT_SHORT[k[1]]:<3} {k[2]:<4} {k[3]:>6} |{vals} | {sp[0]:>5} {sp[1]:>6} | "
                   f"{(C.fmt_err(max(ek_err)) if ek_err else '-'):>10} {','.join(bad)}")
    for e in data.get("compile_time", []):
        parts = []
        for phase in ("cold", "warm"):
            r = e.get(phase, {})
            if "error" in r:
                parts.append(f"{phase}: {r['error'][:100]}")
            else:
                parts.append(f"{phase}: fwd {r.get('fwd_first_s', float('nan')):.1f}s bwd "
                             f"{r.get('bwd_first_s', float('nan')):.1f}s dbwd {r.get('dbwd_first_s', float('nan')):.1f}s "
                             f"(process {r.get('process_wall_s', float('nan')):.1f}s)")
        out.append(f"compile {e['problem']} {e['layout']}: " + " | ".join(parts))
    return "\n".join(out)


def merge(files: List[str], args) -> dict:
    datas = [json.loads(Path(f).read_text()) for f in files]
    base = datas[0]
    merged = {"schema": SCHEMA, "args": base["args"], "env": base["env"], "merged_from": files,
              "env_all": [d["env"] for d in datas], "copy_bandwidth": base.get("copy_bandwidth", {}),
              "copy_bandwidth_all": [d.get("copy_bandwidth") for d in datas], "problems": {},
              "correctness": [], "cells": [], "compile_time": []}
    gpus = {d["env"].get("gpu") for d in datas}
    if len(gpus) > 1:
        progress(f"WARNING: merging results from different devices: {sorted(map(str, gpus))}")
    for d in datas:
        merged["problems"].update(d.get("problems", {}))
        merged["correctness"] += d.get("correctness", [])
        merged["cells"] += d.get("cells", [])
        merged["compile_time"] += d.get("compile_time", [])
    return merged


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--problems", help="comma list (default: all of equikernels.catalog; --quick: a few)")
    ap.add_argument("--dtypes", help="float32,float64 (default both; --quick: float32)")
    ap.add_argument("--rows", type=int, help="rows for fwd and bwd (default 50000; --quick 10000)")
    ap.add_argument("--dbwd-rows", help="comma list of rows for dbwd (default 20000,50000; --quick: --rows)")
    ap.add_argument("--directions", help="fwd,bwd,dbwd (default all)")
    ap.add_argument("--impls", help=f"comma list of {','.join(IMPLS)} (default all)")
    ap.add_argument("--out", default=str(HERE / "results"), help="output folder (default benchmarks/results)")
    ap.add_argument("--tag", default="", help="suffix for the output file names")
    ap.add_argument("--quick", action="store_true", help="smoke run: few problems, short timing")
    ap.add_argument("--device", default="cuda", help="cuda (default) or cpu (debug: perf_counter timing)")
    ap.add_argument("--backend", choices=("auto", "triton", "reference"),
                    help="equikernels backend (default triton on cuda, reference on cpu)")
    ap.add_argument("--target-ms", type=float, help="timed work per cell (default 250; --quick 30)")
    ap.add_argument("--min-reps", type=int, help="minimum timed calls (default 5; --quick 3)")
    ap.add_argument("--max-reps", type=int, default=2000)
    ap.add_argument("--no-gpu-time", dest="gpu_time", action="store_false",
                    help="skip the per-cell GPU time with the host queued ahead (common.queued_gpu_times)")
    ap.add_argument("--warmup", type=int, help="warm-up calls (default 3; --quick 2)")
    ap.add_argument("--max-sets", type=int, default=8, help="max rotated input sets (1 disables rotation)")
    ap.add_argument("--rotate-factor", type=float, default=4.0, help="rotate sets until they cover this × L2")
    ap.add_argument("--check-rows", type=int, help="rows of the correctness check (default 1000)")
    ap.add_argument("--no-check", action="store_true", help="skip the correctness check")
    ap.add_argument("--seed", type=int, default=1234)
    ap.add_argument("--time-budget-s", type=float, help="stop timing new cells after this many seconds "
                    "(the rest are reported as skipped); keeps a run inside a remote time limit")
    ap.add_argument("--compile-time", action="store_true", help="also measure cold/warm first-call time")
    ap.add_argument("--compile-problem", default="mace-large")
    ap.add_argument("--compile-layouts", default="mul_ir", help="mul_ir,ir_mul")
    ap.add_argument("--compile-rows", type=int)
    ap.add_argument("--compile-timeout", type=int, default=900)
    ap.add_argument("--skip-bench", action="store_true", help="only --compile-time (or --merge)")
    ap.add_argument("--merge", nargs="+", metavar="JSON", help="merge result JSONs into one report and exit")
    ap.add_argument("--_compile-child", dest="compile_child", help=argparse.SUPPRESS)
    args = ap.parse_args(argv)
    if args.compile_child:
        compile_child(json.loads(args.compile_child))
        return 0
    if args.merge:
        data = merge(args.merge, args)
        paths = output_paths(args, str(data["env"].get("gpu", "cpu")))
        write_outputs(data, paths)
        print(summary_text(data))
        print("written: " + ", ".join(str(p) for p in paths.values()))
        return 0
    resolve_args(args)
    device = torch.device(args.device)
    if device.type == "cuda" and not torch.cuda.is_available():
        raise SystemExit("--device cuda requested but torch.cuda.is_available() is False "
                         "(use --device cpu --backend reference for a CPU debug run)")
    paths = output_paths(args, device_name(device))
    if args.skip_bench:
        data = {"schema": SCHEMA, "args": {k: v for k, v in vars(args).items() if not k.startswith("_")},
                "env": C.env_info(device), "problems": {}, "correctness": [], "cells": [], "compile_time": []}
    else:
        data = run(args, paths)
    if args.compile_time:
        data["compile_time"] = measure_compile(args)
    write_outputs(data, paths)
    print(summary_text(data))
    print("written: " + ", ".join(str(p) for p in paths.values()))
    return 0


if __name__ == "__main__":
    sys.exit(main())
