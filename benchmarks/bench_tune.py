#!/usr/bin/env python
"""Autotuner benchmark: tuned versus default configuration, and the price of tuning.

For every standard problem (fp32, ir_mul, 50,000 rows) and direction (fwd, bwd, dbwd as
in bench_tp.py), and for the fused convolution (MACE-MP-medium layer 2 on bench_conv.py's periodic
Cu graphs; the tuner chooses its dataflow), one process with a fresh tune file measures:

* default first call: wall clock of the first call with EQUIKERNELS_AUTOTUNE=0 (code generation
  and the compile of the heuristic configuration; cold only if Triton's cache is);
* first-use tuning: wall clock of the first call with EQUIKERNELS_AUTOTUNE=1 (the tuner compiles
  the other candidates, in parallel threads, and times them all); the tuner's own record
  (candidates, their times, the choice) is read back from the tune file;
* default and tuned times: CUDA events per call, warm-up, median, calls alternating between two
  input sets (common.time_calls), in interleaved rounds default / tuned / tuned / default ...; the
  spread of the round medians is the noise. The tuned rounds are checked to do no tuning (no
  timing call of the tuner runs during them) and the default rounds run with tuning off, i.e.
  with the heuristic configuration. Results of both are compared (max. relative difference).

A TP launch configuration is chosen when the kernel runs, so one set of inputs and autograd
graphs serves both settings; the convolution's dataflow is fixed when its forward runs, so the
backward directions get graphs built under each setting.

    PYTHONPATH=. python benchmarks/bench_tune.py --out /tmp/tune
    python benchmarks/bench_tune.py --device cpu --tiny --out /tmp/tune   # plumbing check (interpreter)
"""
from __future__ import annotations

import argparse
import json
import os
import sys
import time
import traceback
import zlib
from pathlib import Path

HERE = Path(__file__).resolve().parent
for _p in (str(HERE), str(HERE.parent)):
    if _p not in sys.path:
        sys.path.insert(0, _p)

DIRS = ("fwd", "bwd", "dbwd")
SLOW = ("nequip-revmd17-benzene",)  # cold compiles of minutes (dbwd 268 s): only when named
# settings that would make the "default" something other than the package's heuristic
OVERRIDES = ("EQUIKERNELS_ROWS", "EQUIKERNELS_WARPS", "EQUIKERNELS_TF32", "EQUIKERNELS_VISIT",
             "EQUIKERNELS_MAX_PATHS", "EQUIKERNELS_CONV_DATAFLOW", "EQUIKERNELS_CONV_ROWS",
             "EQUIKERNELS_CONV_WARPS", "EQUIKERNELS_BACKEND", "EQUIKERNELS_POISON")


def parse(argv=None):
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--problems", default=None,
                    help="comma-separated standard problems, 'all', or 'none' (default: all but benzene)")
    ap.add_argument("--dirs", default="fwd,bwd,dbwd", help="TP directions (default fwd,bwd,dbwd)")
    ap.add_argument("--rows", type=int, default=None, help="rows per TP call (default 50000; --tiny 64)")
    ap.add_argument("--atoms", default=None, help="Cu graph sizes for the convolution, comma-separated "
                    "(default 2916,10192; --tiny: a 24-node ring graph); 'none' skips the convolution")
    ap.add_argument("--conv-problem", default="mace-mp-medium-L2")
    ap.add_argument("--conv-dirs", default="fwd,bwd,dbwd")
    ap.add_argument("--r-cut", type=float, default=None, help="graph cutoff in Å (default 6; --tiny 3)")
    ap.add_argument("--rounds", type=int, default=None, help="interleaved timing rounds per setting (default 3)")
    ap.add_argument("--target-ms", type=float, default=None, help="timed work per round (default 100 ms)")
    ap.add_argument("--max-candidates", type=int, default=None,
                    help="cap on the tuner's candidates, the default included (EQUIKERNELS_TUNE_MAX_CANDIDATES)")
    ap.add_argument("--tune-file", default=None, help="fresh tune file (default: <out>/tuning_<stamp>.json)")
    ap.add_argument("--no-host", action="store_true",
                    help="skip the host-cost check (tuning on vs off, tiny launch-bound forward calls)")
    ap.add_argument("--device", default="cuda")
    ap.add_argument("--tiny", action="store_true", help="small sizes, fewer problems (CPU plumbing check)")
    ap.add_argument("--out", required=True, help="output directory (JSON + Markdown)")
    args = ap.parse_args(argv)
    t = args.tiny
    args.rows = args.rows or (16 if t else 50000)
    args.r_cut = args.r_cut or (3.0 if t else 6.0)
    args.rounds = args.rounds or (2 if t else 3)
    args.target_ms = args.target_ms or (5.0 if t else 100.0)
    atoms = args.atoms or ("0" if t else "2916,10192")
    args.atoms = [] if atoms == "none" else [int(a) for a in atoms.split(",") if a]
    args.dirs = [d for d in args.dirs.split(",") if d]
    args.conv_dirs = [d for d in args.conv_dirs.split(",") if d]
    for d in args.dirs + args.conv_dirs:
        if d not in DIRS:
            ap.error(f"direction {d!r}: one of {DIRS}")
    return args


def main(argv=None) -> int:
    args = parse(argv)
    if args.device == "cpu":
        os.environ.setdefault("TRITON_INTERPRET", "1")  # before anything imports Triton
    removed = {k: os.environ.pop(k) for k in list(os.environ)
               if k in OVERRIDES or k.startswith("EQUIKERNELS_ROWS_")}
    if removed:
        print(f"[env] unset for this run (they override the heuristic default): {removed}", flush=True)
    if args.max_candidates:
        os.environ["EQUIKERNELS_TUNE_MAX_CANDIDATES"] = str(args.max_candidates)

    import torch

    import common as C
    from equikernels import settings, tune
    from equikernels.catalog import standard_problems

    device = torch.device(args.device)
    if device.type == "cuda" and not torch.cuda.is_available():
        raise SystemExit("no CUDA device; use --device cpu --tiny for a plumbing check")
    catalog = standard_problems()
    if args.problems in (None, ""):
        names = ["nequip-water", "tetris-poly-1"] if args.tiny else [n for n in catalog if n not in SLOW]
    elif args.problems == "all":
        names = list(catalog)
    elif args.problems == "none":
        names = []
    else:
        names = [n for n in args.problems.split(",") if n]
    unknown = [n for n in names if n not in catalog]
    if unknown:
        raise SystemExit(f"--problems: unknown {unknown}; known: {', '.join(catalog)}")

    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    stamp = C.stamp()
    tune_file = Path(args.tune_file) if args.tune_file else out / f"tuning_{stamp}.json"
    if tune_file.exists():
        raise SystemExit(f"--tune-file {tune_file} exists: first-use tuning needs a fresh file")
    os.environ["EQUIKERNELS_TUNE_FILE"] = str(tune_file)
    settings.reload()  # the package read the environment at import
    tcache = Path(os.environ.get("TRITON_CACHE_DIR") or Path.home() / ".triton" / "cache")
    triton_cold = not tcache.is_dir() or not any(tcache.iterdir())

    # every timing the tuner does goes through tune.time_ms: count the calls, so that a tuned
    # measurement can be shown to do none
    calls = [0]
    orig_time_ms = tune.time_ms

    def counted(fn, dev, reps=10, warmup=2):
        calls[0] += 1
        if args.tiny:  # plumbing check: one timed call per candidate
            reps, warmup = 1, 0
        return orig_time_ms(fn, dev, reps=reps, warmup=warmup)
    tune.time_ms = counted
    if device.type != "cuda":
        # the tuner only runs on a GPU; for the CPU plumbing check it runs on the interpreter
        tune.active = lambda dev: tune.enabled()
    backend = "triton"
    ctx = Ctx(args, device, C, tune, calls, backend)

    res = {"env": C.env_info(device), "gpu": ctx.gpu, "date": time.strftime("%Y-%m-%d %H:%M"),
           "args": {k: v for k, v in vars(args).items()}, "tune_file": str(tune_file),
           "triton_cache": str(tcache), "triton_cache_cold": triton_cold, "unset_env": removed,
           "tp": [], "conv": []}
    stem = out / f"tune_{C.slug(ctx.gpu)}_{stamp}"
    t_start = time.perf_counter()
    print(f"[start] {ctx.gpu}; tune file {tune_file}; Triton cache {'cold' if triton_cold else 'warm'} "
          f"({tcache})", flush=True)
    if not args.no_host:
        res["host"] = ctx.guard(ctx.host_cell, {"problem": "nequip-water", "rows": 64})
    for name in names:
        for d in args.dirs:
            res["tp"].append(ctx.guard(ctx.tp_cell, {"problem": name, "dir": d, "rows": args.rows}))
            write(res, stem, t_start)
    for atoms in args.atoms:
        res["conv"].append(ctx.guard(ctx.conv_cell, {"problem": args.conv_problem, "atoms": atoms}))
        write(res, stem, t_start)
    tune.time_ms = orig_time_ms
    write(res, stem, t_start)
    print(f"\nwrote {stem}.json, {stem}.md; total {res['total_s']:.0f} s\n")
    h = res.get("host", {})
    if "hook_us" in h:
        print(f"host cost per forward call (nequip-water, {h['rows']} rows): tuning off {h['us_off']:.1f} us, "
              f"on {h['us_on']:.1f} us (hook {h['hook_us']:+.1f} us)\n")
    print(short_table(res))
    return 0


def write(res: dict, stem: Path, t_start: float) -> None:
    res["total_s"] = time.perf_counter() - t_start
    Path(f"{stem}.json").write_text(json.dumps(res, indent=1, default=str))
    Path(f"{stem}.md").write_text(markdown(res))


class Ctx:
    def __init__(self, args, device, C, tune, calls, backend):
        self.args, self.device, self.C, self.tune, self.calls, self.backend = args, device, C, tune, calls, backend
        import torch
        self.torch = torch
        from equikernels import settings
        self.settings = settings
        self.gpu = torch.cuda.get_device_name(device) if device.type == "cuda" else "cpu"

    # --- helpers ---------------------------------------------------------------------------------
    def autotune(self, on: bool) -> None:
        os.environ["EQUIKERNELS_AUTOTUNE"] = "1" if on else "0"
        self.settings.reload()

    def wall(self, fn):
        """(seconds, result) of one call, device synchronized on both sides."""
        self.C.synchronize(self.device)
        t0 = time.perf_counter()
        r = fn()
        self.C.synchronize(self.device)
        return time.perf_counter() - t0, r

    def entries(self) -> dict:
        return self.tune.cache()._read()

    def guard(self, fn, cell: dict) -> dict:
        label = " ".join(str(v) for v in cell.values())
        t0 = time.perf_counter()
        try:
            fn(cell)
        except Exception as exc:  # one failing cell must not stop the run
            cell["error"] = self.C.describe_exception(exc, 400)
            traceback.print_exc()
        finally:
            self.autotune(False)
            self.C.free_memory(self.device)
        cell["cell_s"] = time.perf_counter() - t0
        print(f"[{label}] " + (cell["error"] if "error" in cell else line(cell)), flush=True)
        return cell

    def first_use(self, cell: dict, call) -> None:
        """Tune through one call with a fresh key; record its wall clock and the tuner's record."""
        before = set(self.entries())
        self.autotune(True)
        n0 = self.calls[0]
        cell["tune_first_s"], _ = self.wall(call)
        cell["tuner_timings"] = self.calls[0] - n0
        new = {k: v for k, v in self.entries().items() if k not in before}
        cell["tuned_keys"] = {k.split("|", 4)[-1]: v for k, v in new.items()}
        if not new:
            cell["note"] = "no tuning happened (cached key, or a path the tuner does not cover)"

    def rounds(self, cell: dict, fns: dict, n_sets: int) -> None:
        """Interleaved timing rounds; fns: setting -> (autotune on?, fn(i))."""
        C, a = self.C, self.args
        samples = {k: [] for k in fns}
        meds = {k: [] for k in fns}
        for r in range(a.rounds):
            for k in (list(fns) if r % 2 == 0 else list(fns)[::-1]):  # ABBA: cancels slow drift
                on, fn = fns[k]
                self.autotune(on)
                n0 = self.calls[0]
                t = C.time_calls(fn, self.device, n_sets=n_sets, target_ms=a.target_ms, min_reps=1 if a.tiny else 5,
                                 warmup=2)
                if self.calls[0] != n0:
                    raise RuntimeError(f"the tuner timed candidates during the {k} measurement")
                samples[k] += t["times_ms"]
                meds[k].append(t["ms_median"])
        self.autotune(False)
        for k in fns:
            s = C._stats(samples[k])
            cell[f"{k}_ms"] = s["ms_median"]
            cell[f"{k}_p20"], cell[f"{k}_p80"], cell[f"{k}_n"] = s["ms_p20"], s["ms_p80"], s["n"]
            cell[f"{k}_round_ms"] = meds[k]
        noise = max((max(m) - min(m)) / (sum(m) / len(m)) for m in meds.values())
        cell["noise"] = noise
        tol = max(noise, 0.02)
        d, t = cell["default_ms"], cell["tuned_ms"]
        cell["speedup"] = d / t
        cell["verdict"] = "faster" if t < d * (1 - tol) else "slower" if t > d * (1 + tol) else "same"

    def compare(self, a, b) -> float:
        ta = a if isinstance(a, (tuple, list)) else (a,)
        tb = b if isinstance(b, (tuple, list)) else (b,)
        errs = [self.C.rel_err(x, y) for x, y in zip(ta, tb) if x is not None and y is not None and y.numel()]
        return max(errs) if errs else 0.0

    def host_cell(self, cell: dict) -> None:
        """Host cost of the tuner's hook: µs per launch-bound forward call (64 rows), tuning on
        (a cache hit) minus off. The 64-row bucket is "tuned" with the default as the only
        candidate, so both settings launch the same kernel configuration."""
        torch = self.torch
        from equikernels.catalog import problem
        from equikernels.ops import tensor_product
        P = problem(cell["problem"])
        dev, rows = self.device, cell["rows"]
        x, y, w = (torch.randn(rows, d, device=dev) for d in (P.dim_in1, P.dim_in2, P.weight_numel))
        fn = lambda: tensor_product(P, x, y, w, layout="ir_mul", backend=self.backend)  # noqa: E731
        self.autotune(False)
        fn()
        cap = os.environ.get("EQUIKERNELS_TUNE_MAX_CANDIDATES")
        os.environ["EQUIKERNELS_TUNE_MAX_CANDIDATES"] = "1"  # the tuner keeps the default: same kernel
        self.settings.reload()
        try:
            self.first_use(cell, fn)
        finally:
            if cap is None:
                os.environ.pop("EQUIKERNELS_TUNE_MAX_CANDIDATES")
            else:
                os.environ["EQUIKERNELS_TUNE_MAX_CANDIDATES"] = cap
            self.settings.reload()
        reps = 20 if self.args.tiny else 2000
        us = {"off": [], "on": []}
        with torch.no_grad():
            for r in range(4):
                k = ("off", "on")[r % 2] if r < 2 else ("on", "off")[r % 2]
                self.autotune(k == "on")
                fn()
                dt, _ = self.wall(lambda: [fn() for _ in range(reps)])
                us[k].append(dt / reps * 1e6)
        self.autotune(False)
        cell["us_off"], cell["us_on"] = min(us["off"]), min(us["on"])
        cell["hook_us"] = cell["us_on"] - cell["us_off"]

    # --- batched tensor product --------------------------------------------------------------------
    def tp_cell(self, cell: dict) -> None:
        torch, C = self.torch, self.C
        from equikernels.catalog import problem
        from equikernels.codegen.tp import default_config
        from equikernels.ops import tensor_product
        P = problem(cell["problem"])
        rows, d, dev = cell["rows"], cell["dir"], self.device
        cell["default_config"] = cfg_str(default_config(d, torch.float32, P).__dict__)
        self.autotune(False)

        def fn(x, y, w):
            return tensor_product(P, x, y, w, layout="ir_mul", backend=self.backend)
        gen = torch.Generator(device=dev).manual_seed(zlib.crc32(f"{cell['problem']}|{d}".encode()))
        mk = lambda *s: torch.randn(*s, device=dev, generator=gen)  # noqa: E731
        wshape = (P.weight_numel,) if P.shared_weights else (rows, P.weight_numel)
        sets = []
        t0 = time.perf_counter()
        for _ in range(2):
            x, y, w = mk(rows, P.dim_in1), mk(rows, P.dim_in2), mk(*wshape)
            if d == "fwd":
                sets.append((x, y, w))
                continue
            for t in (x, y, w):
                t.requires_grad_()
            out = fn(x, y, w)
            if d == "bwd":
                sets.append((out, (x, y, w), torch.randn_like(out)))
                continue
            g = torch.randn_like(out).requires_grad_()
            gx, gy, gw = torch.autograd.grad(out, (x, y, w), g, create_graph=True)
            L = (gx * torch.randn_like(gx)).sum() + (gy * torch.randn_like(gy)).sum() + (gw * torch.randn_like(gw)).sum()
            sets.append((L, (x, y, w, g)))
            del out, gx, gy, gw
        cell["setup_s"] = time.perf_counter() - t0
        if d == "fwd":
            def call(i):
                with torch.no_grad():
                    return fn(*sets[i % 2])
        elif d == "bwd":
            def call(i):
                s = sets[i % 2]
                return torch.autograd.grad(s[0], s[1], s[2], retain_graph=True)
        else:
            def call(i):
                s = sets[i % 2]
                return torch.autograd.grad(s[0], s[1], retain_graph=True)
        cell["default_first_s"], ref = self.wall(lambda: call(0))  # tuning off: the heuristic
        self.first_use(cell, lambda: call(1))
        if cell["tuned_keys"]:  # the keys this direction's call tuned (its sets were built untuned)
            cell["tuned_config"] = ", ".join(cfg_str(e["config"]) for e in cell["tuned_keys"].values())
        self.autotune(True)
        cell["max_rel_diff"] = self.compare(call(0), ref)  # same numbers either way
        self.rounds(cell, {"default": (False, call), "tuned": (True, call)}, 2)
        if cell.get("tuned_config") and set(cell["tuned_config"].split(", ")) == {cell["default_config"]}:
            # the tuner kept the heuristic: both settings launch the same kernels, so a timing
            # difference is the harness's noise (host-bound calls swing by tens of percent)
            cell["verdict"] = "same config"
        del sets, ref

    # --- fused convolution ------------------------------------------------------------------------
    def conv_cell(self, cell: dict) -> None:
        torch, C, a, dev = self.torch, self.C, self.args, self.device
        from equikernels.bench.conv import cu_graph, direction_calls
        from equikernels.catalog import problem
        from equikernels.ops import ConvGraph, tensor_product_conv
        from equikernels.ops.conv import resolve_dataflow
        P = problem(cell["problem"])
        src, dst, n = cu_graph(cell["atoms"], dev, r_cut=a.r_cut) if cell["atoms"] else tiny_graph(dev)
        graph = ConvGraph.build(src, dst, n)
        cell.update(edges=int(src.numel()), nodes=n, r_cut=a.r_cut)
        cell["default_config"] = resolve_dataflow("auto", None, self.backend)[0]
        gen = torch.Generator(device=dev).manual_seed(cell["atoms"])
        mk = lambda *s: torch.randn(*s, device=dev, generator=gen)  # noqa: E731
        sets = []
        for _ in range(2):
            x, y, w = mk(n, P.dim_in1), mk(len(src), P.dim_in2), mk(len(src), P.weight_numel)
            g = mk(n, P.dim_out)
            sets.append((x, y, w, g, torch.randn_like(x), torch.randn_like(y), torch.randn_like(w)))

        def raw(x, y, w):
            return tensor_product_conv(P, x, y, w, src, dst, n, graph=graph, layout="ir_mul", backend=self.backend,
                                       dataflow="auto", validate=False)

        def family(on: bool) -> dict:
            """Per direction fn(i) over the two sets; graphs built (dataflow fixed) under ``on``."""
            self.autotune(on)
            per = [direction_calls(raw, *s) for s in sets]
            return {d: (lambda i, d=d: per[i % 2][d](i)) for d in DIRS}

        self.autotune(False)
        cell["default_setup_s"], fam_d = self.wall(lambda: family(False))  # fwd + bwd compile (default)
        firsts = {}
        for d in a.conv_dirs:
            firsts[d], _ = self.wall(lambda: fam_d[d](0))
        cell["default_first_s"] = firsts
        x, y, w = sets[1][:3]
        self.first_use(cell, lambda: raw(x, y, w).detach())  # one forward: tunes the dataflow
        if cell["tuned_keys"]:
            cell["tuned_config"] = ", ".join(cfg_str(e["config"]) for e in cell["tuned_keys"].values())
        cell["tuned_setup_s"], fam_t = self.wall(lambda: family(True))
        firsts = {}
        for d in a.conv_dirs:  # e.g. the double backward of a newly chosen dataflow compiles here
            firsts[d], _ = self.wall(lambda: fam_t[d](0))
        cell["tuned_first_s"] = firsts
        cell["dirs"] = {}
        for d in a.conv_dirs:
            sub = {}
            self.autotune(False)
            ref = fam_d[d](0)
            self.autotune(True)
            sub["max_rel_diff"] = self.compare(fam_t[d](0), ref)
            del ref
            self.rounds(sub, {"default": (False, fam_d[d]), "tuned": (True, fam_t[d])}, 2)
            cell["dirs"][d] = sub
        del fam_d, fam_t, sets


def tiny_graph(device, n: int = 24):
    """Plumbing check only: each node receives edges from its next three neighbours on a ring."""
    import torch
    dst = torch.arange(n).repeat_interleave(3)
    src = (dst + torch.tensor([1, 2, 5]).repeat(n)) % n
    return src.to(device), dst.to(device), n


# --- formatting -------------------------------------------------------------------------------------
def cfg_str(c) -> str:
    if c is None:
        return "-"
    if "dataflow" in c:
        return c["dataflow"]
    s = f"{c['rows']}r/{c['num_warps']}w"
    if c.get("num_stages", 1) != 1:
        s += f"/{c['num_stages']}st"
    return s + ("/tf32" if c.get("tf32") else "")


def tried_str(cell: dict) -> str:
    parts = []
    for e in (cell.get("tuned_keys") or {}).values():
        for t in e.get("tried", []):
            parts.append(f"{cfg_str(t['config'])}:" + (f"{t['ms']:.3f}" if t.get("ms") is not None else "fail"))
    return " ".join(parts) or "-"


def f3(v) -> str:
    return "-" if v is None else f"{v:.3f}"


def line(c: dict) -> str:
    if "hook_us" in c:
        return f"host: {c['us_off']:.1f} us per call untuned, {c['us_on']:.1f} us tuned (cache hit)"
    if "dirs" in c:
        return "; ".join(f"{d}: {f3(s.get('default_ms'))} -> {f3(s.get('tuned_ms'))} ms ({s.get('verdict')})"
                         for d, s in c["dirs"].items()) + f"; {c.get('default_config')} -> {c.get('tuned_config')}, " \
            f"tuning {c.get('tune_first_s', 0):.1f} s"
    return (f"{c.get('default_config')} {f3(c.get('default_ms'))} ms -> {c.get('tuned_config')} {f3(c.get('tuned_ms'))} ms "
            f"x{c.get('speedup', 0):.3f} ({c.get('verdict')}, noise {100 * c.get('noise', 0):.1f}%); first call "
            f"{c.get('default_first_s', 0):.1f} s, tuning {c.get('tune_first_s', 0):.1f} s")


def rows_of(res: dict):
    """(what, dir, default cfg, tuned cfg, cell-with-times, first-call s, tuning s, tried)."""
    for c in res["tp"]:
        yield (c["problem"], c["dir"], c, c, c.get("default_first_s"), c.get("tune_first_s"))
    for c in res["conv"]:
        what = f"conv {c['problem']} " + (f"{c['atoms']} atoms" if c["atoms"] else "24-node ring")
        if "dirs" not in c:
            yield (what, "-", c, c, None, c.get("tune_first_s"))
        for d, s in c.get("dirs", {}).items():
            yield (what + (f" ({c['edges']} edges)" if "edges" in c else ""), d, c, s,
                   (c.get("default_first_s") or {}).get(d), c.get("tune_first_s") if d == next(iter(c["dirs"])) else None)


def short_table(res: dict) -> str:
    out = ["| problem | dir | default | tuned | default ms | tuned ms | speed-up | noise | verdict | tuning s |",
           "|---|---|---|---|---:|---:|---:|---:|---|---:|"]
    for what, d, c, t, _, tun in rows_of(res):
        if "error" in c:
            out.append(f"| {what} | {d} | error: {c['error'][:80]} | | | | | | | |")
            continue
        out.append(f"| {what} | {d} | {c.get('default_config', '-')} | {c.get('tuned_config', '-')} | "
                   f"{f3(t.get('default_ms'))} | {f3(t.get('tuned_ms'))} | "
                   f"{t['speedup']:.3f} | {100 * t['noise']:.1f}% | {t['verdict']} | "
                   f"{'' if tun is None else f'{tun:.1f}'} |" if "speedup" in t else
                   f"| {what} | {d} | {c.get('default_config', '-')} | {c.get('tuned_config', '-')} | - | - | - | - | - | |")
    return "\n".join(out)


def markdown(res: dict) -> str:
    a = res["args"]
    cold = "cold" if res.get("triton_cache_cold") else "warm"
    lines = [f"# Autotuner: tuned vs default ({res['gpu']}, {res['date']})", "",
             f"fp32, ir_mul layout, {a['rows']} rows per TP call; convolution {a['conv_problem']} on periodic Cu "
             f"fcc graphs (r_cut {a['r_cut']} Å; the tuner chooses the convolution's dataflow, its launch "
             f"configuration stays the heuristic). Times: "
             f"{'CUDA events' if res['gpu'] != 'cpu' else 'perf_counter (CPU plumbing check, interpreter)'} per call, median over "
             f"{a['rounds']} interleaved rounds per setting (~{a['target_ms']:.0f} ms of calls each, inputs "
             f"alternating between two sets). Noise = spread of the round medians; the verdict allows "
             f"max(noise, 2%); 'same config' = the tuner kept the heuristic (identical kernels: any timing "
             f"difference is noise). Default = EQUIKERNELS_AUTOTUNE=0 (heuristic); tuned = cache hit after "
             f"tuning (checked: the tuner timed nothing during tuned rounds). Triton cache at start: {cold}. "
             f"Total run {res.get('total_s', 0):.0f} s.", "",
             "First call = wall clock of the first call with tuning off (code generation + compile of "
             "the default configuration); tuning = wall clock of the first call with tuning on and a fresh "
             "tune file (compile of the other candidates + timing all). A cold first use with tuning "
             "costs about their sum.", "",
             "| problem | dir | default | tuned | default ms (p20-p80) | tuned ms (p20-p80) | speed-up | noise | "
             "verdict | first call s | tuning s | tuner's candidates (ms) | max rel. diff |",
             "|---|---|---|---|---:|---:|---:|---:|---|---:|---:|---|---:|"]
    for what, d, c, t, first, tun in rows_of(res):
        if "error" in c:
            lines.append(f"| {what} | {d} | error: {c['error']} |" + " |" * 10)
            continue
        if "speedup" not in t:
            lines.append(f"| {what} | {d} | {c.get('default_config', '-')} | {c.get('tuned_config', '-')} |" + " - |" * 9)
            continue
        lines.append(
            f"| {what} | {d} | {c.get('default_config', '-')} | {c.get('tuned_config', '-')} | "
            f"{f3(t['default_ms'])} ({f3(t['default_p20'])}-{f3(t['default_p80'])}) | "
            f"{f3(t['tuned_ms'])} ({f3(t['tuned_p20'])}-{f3(t['tuned_p80'])}) | {t['speedup']:.3f} | "
            f"{100 * t['noise']:.1f}% | {t['verdict']} | {'-' if first is None else f'{first:.1f}'} | "
            f"{'' if tun is None else f'{tun:.1f}'} | {tried_str(c) if tun is not None else ''} | "
            f"{t.get('max_rel_diff', 0):.1e} |")
    h = res.get("host", {})
    if "hook_us" in h:
        lines += ["", f"Host cost of the tuner's hook (launch-bound forward, {h['problem']}, {h['rows']} rows, "
                  f"best of 2 x 2 interleaved bursts): tuning off {h['us_off']:.1f} µs per call, on (cache hit) "
                  f"{h['us_on']:.1f} µs, difference {h['hook_us']:+.1f} µs."]
    notes = [f"- {c.get('problem')} {c.get('dir', c.get('atoms'))}: {c['note']}" for c in res["tp"] + res["conv"]
             if c.get("note")]
    conv = [f"- conv {c['atoms'] or 'ring'} atoms: tuned-graph first calls (a newly chosen dataflow compiles its "
            f"kernels here) {json.dumps({k: round(v, 2) for k, v in c.get('tuned_first_s', {}).items()})} s"
            for c in res["conv"] if "tuned_first_s" in c]
    if notes or conv:
        lines += ["", *notes, *conv]
    return "\n".join(lines) + "\n"


if __name__ == "__main__":
    sys.exit(main())
