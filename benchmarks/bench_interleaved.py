#!/usr/bin/env python
"""Host-bound cells, timed with the implementations interleaved.

bench_tp times one implementation after another. Where a call is shorter than the host work around
it (nequip-water's double backward at 20,000 rows: ~0.13 ms of GPU work, 0.2-0.4 ms of Python and
autograd on an H200's host), a cell's time is the host's speed at that moment, and that
drifts within a process and from one process to the next by more than the gap between
implementations. Here every implementation's graphs are built first (``equikernels.bench.tp.make_call``,
the calls bench_tp times), then R rounds each time ``--calls`` calls of every implementation, the order
rotated per round, so each implementation sees the same host. Per implementation: the median over
all timed calls, the median of the round medians, the rounds it was fastest in, and the GPU time
with the host queued ahead (common.queued_gpu_times). Every implementation is checked against e3nn
in float64 first (``equikernels.bench.tp.errors``), as bench_tp does.

Usage (GPU):  python benchmarks/bench_interleaved.py --problems nequip-water --directions dbwd \
                  --rows 20000,50000 --impls equikernels_ir_mul,oeq,cue_ir_mul
Debug (CPU):  python benchmarks/bench_interleaved.py --device cpu --backend reference --rows 64 \
                  --impls equikernels,e3nn --rounds 3 --calls 5 --out /tmp/x
"""
from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent
for _p in (str(HERE), str(ROOT)):
    if _p not in sys.path:
        sys.path.insert(0, _p)

import torch  # noqa: E402

import bench_tp as B  # noqa: E402
import common as C  # noqa: E402

from equikernels.bench import tp as TP  # noqa: E402


def measure(problem: str, direction: str, rows: int, args, device, log) -> dict:
    """Builds, checks and times every implementation of one cell, interleaved."""
    from equikernels.catalog import standard_problems
    spec = TP.Spec.create(problem, standard_problems()[problem])
    dtype = B.DTYPES[args.dtype]
    level = TP.LEVEL[direction]
    inp_ref = None if args.no_check else TP.reference(spec, args.check_rows, device, level=level, seed=args.seed)
    cell = {"problem": problem, "direction": direction, "rows": rows, "dtype": args.dtype, "impls": {}}
    calls = {}
    for impl in args.impls:
        rec = cell["impls"][impl] = {"status": "ok"}
        try:
            built = B.build(impl, spec, dtype, device, args)
            if inp_ref is not None:
                rec["rel_err"] = TP.direction_error(TP.errors(spec, built, dtype, inp_ref[0], inp_ref[1], level),
                                                    direction)
            call, n_sets, nbytes = TP.make_call(spec, built, direction, rows, dtype, device, max_sets=args.max_sets,
                                                rotate_factor=args.rotate_factor, seed=args.seed)
            for i in range(max(args.warmup, n_sets)):
                call(i)
            C.synchronize(device)
            calls[impl] = call
            rec.update(n_sets=n_sets, bytes_min=nbytes)
        except TP.Absent as exc:
            rec.update(status="absent", error=str(exc))
        except Exception as exc:  # reported, never skipped silently
            rec.update(status="oom" if C.is_oom(exc) else "error", error=C.describe_exception(exc))
        if rec["status"] != "ok":
            log(f"   {impl}: {rec['status'].upper()} {rec.get('error', '')}"[:300])
    names = list(calls)
    per_round = {n: [] for n in names}
    pooled = {n: [] for n in names}
    wins = {n: 0 for n in names}
    cuda = device.type == "cuda"
    k = 0
    for r in range(args.rounds):
        order = names[r % len(names):] + names[:r % len(names)] if names else []
        med = {}
        for n in order:
            t = C.call_times(calls[n], args.calls, cuda, first=k)
            k += args.calls
            pooled[n].extend(t)
            med[n] = statistics.median(t)
            per_round[n].append(round(med[n], 6))
        if med:
            wins[min(med, key=med.get)] += 1
    for n in names:
        rec = cell["impls"][n]
        rec.update(C._stats(pooled[n]))
        rec["round_medians_ms"] = per_round[n]
        rec["median_of_rounds_ms"] = statistics.median(per_round[n])
        rec["rounds_fastest"] = wins[n]
        rec["gbps"] = rec["bytes_min"] / (rec["ms_median"] * 1e-3) / 1e9
        if cuda:
            rec.update(C.queued_gpu_times(calls[n], device, rec["ms_median"]))
    cell["rounds"], cell["calls_per_round"] = args.rounds, args.calls
    return cell


def render(data: dict) -> str:
    env = data["env"]
    lines = [f"# Interleaved timing ({data['stamp']})", "",
             f"GPU: {env.get('gpu')}; torch {env.get('torch')}; cuEquivariance {env.get('cuequivariance_torch')}; "
             f"OpenEquivariance {env.get('openequivariance')}; equikernels {env.get('equikernels')}.", "",
             f"`{' '.join(data['argv'])}`", "",
             "Each round times `calls` back-to-back calls (CUDA events per call) of every implementation in turn, "
             "the order rotated per round. ms: median over all timed calls; rounds: median of round medians, and "
             "in how many rounds it was the fastest; GPU ms: the same calls queued behind a sleep (host ahead); "
             "err: relative error against e3nn float64 (the direction's results).", "",
             "| problem | dir | rows | impl | ms (all calls) | ms (median of rounds) | fastest in rounds | "
             "GPU ms | host us/call | err |",
             "|---|---|---:|---|---:|---:|---:|---:|---:|---:|"]
    for c in data["cells"]:
        for impl, r in c["impls"].items():
            head = f"| {c['problem']} | {c['direction']} | {c['rows']} | {impl} |"
            if r["status"] != "ok":
                lines.append(f"{head} {r['status']}: {r.get('error', '')[:80]} | | | | | |")
                continue
            gpu = C.fmt_ms(r.get("gpu_ms_median")) + ("" if r.get("gpu_queued", True) else " (not queued)")
            host = f"{r['host_us_per_call']:.0f}" if r.get("host_us_per_call") is not None else "-"
            lines.append(f"{head} {C.fmt_ms(r['ms_median'])} | {C.fmt_ms(r['median_of_rounds_ms'])} | "
                         f"{r['rounds_fastest']}/{c['rounds']} | {gpu} | {host} | {C.fmt_err(r.get('rel_err'))} |")
    return "\n".join(lines) + "\n"


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--problems", default="nequip-water")
    ap.add_argument("--directions", default="dbwd")
    ap.add_argument("--rows", default="20000,50000", help="comma list")
    ap.add_argument("--impls", default="equikernels_ir_mul,oeq,cue_ir_mul")
    ap.add_argument("--dtype", default="float32", choices=list(B.DTYPES))
    ap.add_argument("--rounds", type=int, default=15)
    ap.add_argument("--calls", type=int, default=100, help="timed calls per implementation per round")
    ap.add_argument("--warmup", type=int, default=10)
    ap.add_argument("--device", default="cuda")
    ap.add_argument("--backend", choices=("auto", "triton", "reference"))
    ap.add_argument("--max-sets", type=int, default=8)
    ap.add_argument("--rotate-factor", type=float, default=4.0)
    ap.add_argument("--check-rows", type=int, default=1000)
    ap.add_argument("--no-check", action="store_true")
    ap.add_argument("--seed", type=int, default=1234)
    ap.add_argument("--out", default=str(HERE / "results"))
    ap.add_argument("--tag", default="")
    args = ap.parse_args(argv)
    from equikernels.catalog import standard_problems
    problems = B.parse_list(args.problems, list(standard_problems()), "problem")
    directions = B.parse_list(args.directions, B.DIRECTIONS, "direction")
    args.impls = B.parse_list(args.impls, B.IMPLS, "implementation")
    rows = [int(v) for v in B.parse_list(args.rows)]
    if args.rounds < 1 or args.calls < 1:
        raise SystemExit("--rounds and --calls must be at least 1")
    if args.backend is None:
        args.backend = "triton" if args.device.startswith("cuda") else "reference"
    device = torch.device(args.device)
    data = {"argv": sys.argv, "stamp": C.stamp(), "env": C.env_info(device), "cells": []}
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    base = out / f"interleaved_{C.slug(B.device_name(device))}_{data['stamp']}{'_' + args.tag if args.tag else ''}"
    t0 = time.perf_counter()
    for p in problems:
        for d in directions:
            for r in rows:
                B.progress(f"== {p} {d} {r} rows")
                cell = measure(p, d, r, args, device, B.progress)
                data["cells"].append(cell)
                for impl, rec in cell["impls"].items():
                    if rec["status"] == "ok":
                        B.progress(f"   {impl:20s} {rec['ms_median']:.3f} ms (rounds {rec['median_of_rounds_ms']:.3f}, "
                                   f"fastest {rec['rounds_fastest']}/{args.rounds}) gpu "
                                   f"{C.fmt_ms(rec.get('gpu_ms_median'))} err {C.fmt_err(rec.get('rel_err'))}")
                C.free_memory(device)
                base.with_suffix(".json").write_text(json.dumps(data, indent=1, default=str))
    data["wall_s"] = time.perf_counter() - t0
    base.with_suffix(".json").write_text(json.dumps(data, indent=1, default=str))
    md = render(data)
    base.with_suffix(".md").write_text(md)
    print(md)
    return 0


if __name__ == "__main__":
    sys.exit(main())
