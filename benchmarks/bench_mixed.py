#!/usr/bin/env python
"""Mixed precision: float32 vs bfloat16 vs float16 operands (float32 math) for the MACE uvu problems,
equikernels side by side with cuEquivariance given the same half-precision inputs.

Same harness as bench_tp.py (same problem specs, input rotation against L2, CUDA events around
every call, median of n; fwd = ``tp(x, y, w)``, bwd = ``autograd.grad(out, [x, y, w], g)`` on a
retained graph) and its correctness check, run per dtype:

* ``err``: max over out, gx, gy, gw of ||a - ref|| / ||ref|| against e3nn built in float64 on the
  original float64 inputs (what a user loses end to end, input rounding included);
* ``kerr``: the same against e3nn float64 on the inputs *rounded to the dtype* (what the kernel
  itself loses: only the final rounding of each result should remain).

Both libraries compute in float32 (cuEquivariance ``math_dtype=torch.float32``). The issue's target:
bfloat16 forward and backward at least 1.6x faster than our own float32 (the ``bf16 x`` column).

Usage (GPU, ~2-3 min cold):  python benchmarks/bench_mixed.py
Debug (CPU):                 python benchmarks/bench_mixed.py --device cpu --backend reference --rows 64 --check-rows 16
"""
from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent
for _p in (str(HERE), str(ROOT)):
    if _p not in sys.path:
        sys.path.insert(0, _p)

import torch  # noqa: E402

import bench_tp  # noqa: E402
import common as C  # noqa: E402

from equikernels.bench import tp as TP  # noqa: E402

DTYPES = {"fp32": torch.float32, "bf16": torch.bfloat16, "fp16": torch.float16}
IMPLS = ("ek", "cue")
TARGET_SPEEDUP = 1.6  # bf16 over our own fp32, forward and backward


def build(impl: str, spec: TP.Spec, dtype, device, args) -> TP.Built:
    if impl == "ek":
        return TP.build_equikernels(spec, dtype, device, args.layout, args.backend)
    if spec.mode != "uvu":
        raise TP.Absent("only the channel-wise (uvu) problems are set up here")
    # weights in the half type, float32 arithmetic: what a half-precision run wants
    return TP.build_cue(spec, dtype, device, args.layout, math_dtype=torch.float32)


def rounded_reference(spec: TP.Spec, inp: dict, dtype, device) -> dict:
    """e3nn float64 on the inputs rounded to ``dtype``."""
    from equikernels._compat import o3
    with C.default_dtype(torch.float64):
        m = o3.TensorProduct(**spec.kw).to(device)
    r = {k: v.to(dtype).double() for k, v in inp.items()}
    return TP.all_orders(m, r["x"], r["y"], r["w"], r["g"], r["Rx"], r["Ry"], r["Rw"], 1)


def max_err(errs):
    return max(errs.values()) if errs else None


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--problems", default="mace-large,mace-medium",
                    help="comma list from equikernels.catalog (uvu), default: %(default)s")
    ap.add_argument("--dtypes", default="fp32,bf16,fp16")
    ap.add_argument("--impls", default="ek,cue")
    ap.add_argument("--layout", default="ir_mul", choices=("ir_mul", "mul_ir"))
    ap.add_argument("--rows", type=int, default=50000)
    ap.add_argument("--check-rows", type=int, default=2000)
    ap.add_argument("--device", default="cuda")
    ap.add_argument("--backend", default=None, help="equikernels backend (default: triton on CUDA)")
    ap.add_argument("--target-ms", type=float, default=100.0)
    ap.add_argument("--min-reps", type=int, default=5)
    ap.add_argument("--max-reps", type=int, default=2000)
    ap.add_argument("--warmup", type=int, default=3)
    ap.add_argument("--max-sets", type=int, default=8)
    ap.add_argument("--rotate-factor", type=float, default=4.0)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--out", default=str(HERE / "results"))
    args = ap.parse_args()
    args.backend = args.backend or ("triton" if args.device.startswith("cuda") else "reference")
    dtypes = [d for d in args.dtypes.split(",") if d]
    impls = [i for i in args.impls.split(",") if i]
    bad = [d for d in dtypes if d not in DTYPES] + [i for i in impls if i not in IMPLS]
    if bad:
        raise SystemExit(f"unknown dtype/impl {bad}; dtypes {list(DTYPES)}, impls {list(IMPLS)}")
    device = torch.device(args.device)
    from equikernels.catalog import standard_problems
    catalog = standard_problems()
    env = C.env_info(device)
    print(f"device: {env.get('gpu')}  torch {torch.__version__}  cue {env.get('cuequivariance_torch')}  "
          f"layout {args.layout}  rows {args.rows}", flush=True)
    data = {"schema": "equikernels-bench-mixed/1", "args": vars(args), "env": env, "cells": [], "checks": []}
    t0 = time.perf_counter()
    for pname in args.problems.split(","):
        spec = TP.Spec.create(pname, catalog[pname])
        print(f"== {pname}: {spec.P.describe()}", flush=True)
        inp, ref = TP.reference(spec, args.check_rows, device, level=1, seed=args.seed)
        for impl in impls:
            for dname in dtypes:
                dtype = DTYPES[dname]
                rec = {"problem": pname, "impl": impl, "dtype": dname}
                try:
                    built = build(impl, spec, dtype, device, args)
                    rec["info"] = built.info
                    rec["err"] = max_err(TP.errors(spec, built, dtype, inp, ref, 1))
                    rounded = rounded_reference(spec, inp, dtype, device)
                    rec["kerr"] = max_err(TP.errors(spec, built, dtype, inp, rounded, 1))
                except TP.Absent as exc:
                    rec["status"] = "absent: " + str(exc)
                    built = None
                except Exception as exc:  # report and go on: one failure never stops the run
                    rec["status"] = ("oom: " if C.is_oom(exc) else "error: ") + C.describe_exception(exc)
                    built = None
                data["checks"].append(rec)
                for direction in ("fwd", "bwd"):
                    cell = {"problem": pname, "impl": impl, "dtype": dname, "direction": direction,
                            "rows": args.rows}
                    if built is None:
                        cell["status"] = rec.get("status")
                    else:
                        try:
                            cell.update(bench_tp.time_cell(spec, built, direction, args.rows, dtype, device, args))
                            cell.pop("times_ms", None)
                            cell["status"] = "ok"
                        except Exception as exc:
                            cell["status"] = ("oom: " if C.is_oom(exc) else "error: ") + C.describe_exception(exc)
                        C.free_memory(device)
                    data["cells"].append(cell)
                    ms = cell.get("ms_median")
                    print(f"  {impl:3s} {dname} {direction}: "
                          f"{C.fmt_ms(ms) + ' ms' if ms is not None else cell['status']}"
                          f"  err {C.fmt_err(rec.get('err'))}  kerr {C.fmt_err(rec.get('kerr'))}", flush=True)
                del built
                C.free_memory(device)
    data["wall_s"] = round(time.perf_counter() - t0, 1)
    table = summary(data, args)
    print(table)
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    name = f"mixed_{C.slug(str(env.get('gpu') or device.type))}_{C.stamp()}"
    (out / f"{name}.json").write_text(json.dumps(data, indent=1, default=str))
    (out / f"{name}.md").write_text(table + "\n")
    print(f"wrote {out / name}.json/.md  ({data['wall_s']} s)")


def summary(data, args) -> str:
    ms = {(c["problem"], c["impl"], c["dtype"], c["direction"]): c.get("ms_median") for c in data["cells"]}
    gpu = {(c["problem"], c["impl"], c["dtype"], c["direction"]): c.get("gpu_ms_median") if c.get("gpu_queued") else None
           for c in data["cells"]}
    errs = {(c["problem"], c["impl"], c["dtype"]): (c.get("err"), c.get("kerr")) for c in data["checks"]}
    problems = list(dict.fromkeys(c["problem"] for c in data["cells"]))
    dts = list(dict.fromkeys(c["dtype"] for c in data["cells"]))
    impls = list(dict.fromkeys(c["impl"] for c in data["cells"]))
    head = ["problem", "dir"] + [f"{i} {d} ms" for i in impls for d in dts]
    if "fp32" in dts:
        head += [f"ek {d} x" for d in dts if d != "fp32"]
        head += [f"ek {d} GPU ms" for d in dts] + [f"ek {d} x GPU" for d in dts if d != "fp32"]
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    verdict = []
    for p in problems:
        for direction in ("fwd", "bwd"):
            row = [p, direction] + [C.fmt_ms(ms.get((p, i, d, direction))) for i in impls for d in dts]
            base = ms.get((p, "ek", "fp32", direction))
            for d in dts:
                if d == "fp32" or "fp32" not in dts:
                    continue
                t = ms.get((p, "ek", d, direction))
                sp = base / t if base and t else None
                row.append("—" if sp is None else f"{sp:.2f}")
                if d == "bf16" and sp is not None:
                    verdict.append(f"{p} {direction} bf16 {sp:.2f}x {'PASS' if sp >= TARGET_SPEEDUP else 'FAIL'}")
            if "fp32" in dts:  # the kernels alone: each call's GPU time with the host queued ahead
                row += [C.fmt_ms(gpu.get((p, "ek", d, direction))) for d in dts]
                gbase = gpu.get((p, "ek", "fp32", direction))
                for d in dts:
                    if d != "fp32":
                        t = gpu.get((p, "ek", d, direction))
                        row.append(f"{gbase / t:.2f}" if gbase and t else "—")
            lines.append("| " + " | ".join(row) + " |")
    lines += ["", "relative error vs float64 e3nn (err: original inputs / kerr: rounded inputs), max over out, gx, gy, gw:",
              "| problem | impl | dtype | err | kerr |", "|---|---|---|---|---|"]
    for (p, i, d), (e, k) in errs.items():
        lines.append(f"| {p} | {i} | {d} | {C.fmt_err(e)} | {C.fmt_err(k)} |")
    if verdict:
        lines += ["", f"target: bf16 >= {TARGET_SPEEDUP}x our fp32: " + "; ".join(verdict)]
    lines += ["", "ms: CUDA events per call, host work the GPU cannot hide included. GPU ms: the same "
              "calls issued while the GPU is held by a sleep, so the host is ahead: the kernels' time "
              "(benchmarks/common.queued_gpu_times; — where the host did not get ahead)."]
    return "\n".join(lines)


if __name__ == "__main__":
    main()
