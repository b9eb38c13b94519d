"""Session 14 diagnostic (issue 4): where the host time of nequip-water's double backward goes.

For each row count, builds the bench_tp dbwd graph (L = <gx,Rx> + <gy,Ry> + <gw,Rw> from
create_graph grads, input sets rotated as bench_tp does) for equikernels (ir_mul), OpenEquivariance
and a floor (the same graph around a product whose backward and double backward are plain torch
ops of negligible host cost: one mul per output), and times ``autograd.grad(L, (x, y, w, g))``:
CUDA-event per-call medians (what bench_tp reports) and host microseconds per call (perf_counter
over a burst, no sync inside). Rounds interleave the implementations. With --profile, a
torch.profiler CPU table of one burst per implementation."""
import argparse
import statistics
import sys
import time
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parents[2]
sys.path[:0] = [str(ROOT), str(ROOT / "benchmarks"), str(Path(__file__).parent)]
import bench_tp as B  # noqa: E402
import common as C  # noqa: E402

from equikernels.catalog import standard_problems  # noqa: E402


class _Floor2(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x, y, w, g):
        ctx.save_for_backward(x, y, w, g)
        return x * 1, y * 1, w * 1

    @staticmethod
    def backward(ctx, a, b, c):
        x, y, w, g = ctx.saved_tensors
        return torch.empty_like(x), torch.empty_like(y), torch.empty_like(w), torch.empty_like(g)


class _Floor(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x, y, w):
        ctx.save_for_backward(x, y, w)
        return torch.empty(x.shape[0], ctx_dim[0], device=x.device)

    @staticmethod
    def backward(ctx, g):
        x, y, w = ctx.saved_tensors
        return _Floor2.apply(x, y, w, g)


ctx_dim = [0]


def graphs(fn, spec, rows, n_sets, dev):
    mk = lambda *s: torch.randn(*s, device=dev)  # noqa: E731
    sets = []
    for _ in range(n_sets):
        x, y, w = mk(rows, spec.d1).requires_grad_(), mk(rows, spec.d2).requires_grad_(), mk(rows, spec.nw).requires_grad_()
        out = fn(x, y, w)
        g = torch.randn_like(out).requires_grad_()
        gx, gy, gw = torch.autograd.grad(out, (x, y, w), g, create_graph=True)
        L = (gx * torch.randn_like(gx)).sum() + (gy * torch.randn_like(gy)).sum() + (gw * torch.randn_like(gw)).sum()
        sets.append((L, (x, y, w, g)))
    return sets


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--problem", default="nequip-water")
    ap.add_argument("--rows", default="64,20000")
    ap.add_argument("--impls", default="ek,oeq,floor")
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--calls", type=int, default=1000)
    ap.add_argument("--profile", action="store_true")
    ap.add_argument("--ab", action="store_true", help="also ek_old: the session-13 host path on ek's graphs "
                    "(needs the repository's git history)")
    a = ap.parse_args()
    dev = torch.device("cuda" if torch.cuda.is_available() else "cpu")  # cpu: a smoke test
    sync = torch.cuda.synchronize if dev.type == "cuda" else (lambda: None)
    spec = B.Spec.create(a.problem, standard_problems()[a.problem])
    ctx_dim[0] = spec.d3
    args = argparse.Namespace(backend="triton")
    fns = {}
    for impl in a.impls.split(","):
        if impl == "ek":
            fns[impl] = B.build("equikernels_ir_mul", spec, torch.float32, dev, args).fn
        elif impl == "oeq":
            fns[impl] = B.build("oeq", spec, torch.float32, dev, args).fn
        elif impl == "floor":
            fns[impl] = _Floor.apply
    from equikernels.ops import tp as ops_tp
    new_bwd = ops_tp._Bwd.backward
    backwards = {"ek": new_bwd}
    if a.ab:
        # session 13's host-path functions (ops/tp.py at commit 8560b04) executed over a copy of
        # today's namespace, so its _bwd_backward calls its own _cot / _dbwd_direct / env check
        import ast
        import subprocess
        old = subprocess.run(["git", "-C", str(ROOT), "show", "8560b04:equikernels/ops/tp.py"], check=True,
                             capture_output=True, text=True).stdout
        want = {"_cot", "_bwd_backward", "_env_tuning_or_poison", "_dbwd_direct"}
        src = "\n\n".join(ast.get_source_segment(old, f) for f in ast.parse(old).body
                          if isinstance(f, ast.FunctionDef) and f.name in want)
        ns = dict(vars(ops_tp))
        exec(compile(src, "tp_8560b04.py", "exec"), ns)
        backwards["ek_old"] = ns["_bwd_backward"]
        fns["ek_old"] = fns["ek"]
    for rows in [int(r) for r in a.rows.split(",")]:
        nbytes = C.minimal_bytes("dbwd", rows, spec.d1, spec.d2, spec.d3, spec.nw, False, 4)
        n_sets = C.rotation_sets(nbytes, dev)
        sets = {k: graphs(f, spec, rows, n_sets, dev) for k, f in fns.items() if k != "ek_old"}
        if "ek_old" in fns:
            sets["ek_old"] = sets["ek"]
        res = {k: ([], []) for k in fns}
        for _ in range(a.rounds):
            for k in fns:
                s = sets[k]
                ops_tp._Bwd.backward = staticmethod(backwards.get(k, new_bwd))
                call = lambda i: torch.autograd.grad(s[i % n_sets][0], s[i % n_sets][1], retain_graph=True)  # noqa: E731
                for i in range(50):
                    call(i)
                sync()
                t = C.call_times(call, a.calls, dev.type == "cuda")
                sync()
                t0 = time.perf_counter()
                for i in range(a.calls):
                    call(i)
                host = (time.perf_counter() - t0) / a.calls * 1e6
                sync()
                res[k][0].append(statistics.median(t))
                res[k][1].append(host)
        ops_tp._Bwd.backward = staticmethod(new_bwd)
        for k, (ev, host) in res.items():
            print(f"{a.problem} rows {rows:6d} {k:6s} median of rounds: event {statistics.median(ev):.3f} ms, "
                  f"host {statistics.median(host):.1f} us", flush=True)
            print(f"{a.problem} rows {rows:6d} sets {n_sets} {k:6s} event ms " + " ".join(f"{v:.3f}" for v in ev)
                  + "   host us/call " + " ".join(f"{v:.1f}" for v in host), flush=True)
        if a.profile:
            from torch.profiler import ProfilerActivity, profile
            for k in fns:
                s = sets[k]
                ops_tp._Bwd.backward = staticmethod(backwards.get(k, new_bwd))
                with profile(activities=[ProfilerActivity.CPU]) as prof:
                    for i in range(200):
                        torch.autograd.grad(s[i % n_sets][0], s[i % n_sets][1], retain_graph=True)
                    sync()
                print(f"--- profile {k} rows {rows} (200 calls)")
                print(prof.key_averages().table(sort_by="self_cpu_time_total", row_limit=18), flush=True)
            ops_tp._Bwd.backward = staticmethod(new_bwd)


if __name__ == "__main__":
    main()
