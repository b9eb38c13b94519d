#!/usr/bin/env python
"""Fill a Triton cache for sm_90 on a machine without a GPU, so a cold device call skips compiles.

The generated kernels of a problem are launched through the normal code path with tiny CPU
tensors, but Triton's driver is a stand-in (H200 target: cuda, sm_90, warp 32) and every launch is
``warmup=True``: Triton specialises and compiles exactly as a launch would, stores the result in
TRITON_CACHE_DIR, and launches nothing. On the GPU machine the same Triton build then finds the
kernels in that cache (the cache key covers Triton's own sources, ptxas, the kernel source, the
specialisation and the options; nothing device-specific beyond the target).

Specialisation follows the row count only through the ints N and NBLK (== 1, divisible by 16,
32/64-bit), so ``--like-rows 50000`` compiles with tiny tensors whose N / NBLK fall in the same
classes as 50,000 rows (and as --check-rows of bench_tp, when it is chosen to match).

    TRITON_CACHE_DIR=/tmp/tc python devtools/s9/precompile.py --problem nequip-revmd17-benzene \
        --directions dbwd [--like-rows 50000] [--shard I/N] [--real-driver]
    python devtools/s9/precompile.py --print-key      (Triton's own key: compare with the GPU machine)

Triton's key includes a hash of libtriton.so, which differs between Python versions' wheels of
the same release (this machine: 3.11; the GPU machine: 3.12). So: dump the GPU machine's key once
(``--dump-key FILE`` there), then ``--gpu-key FILE --pack OUT.tgz`` here: every kernel is compiled
(or found) under the local key as usual and a copy is filed under the GPU's key, pruned to what a
launch loads (cubin + metadata), its group file pointing into --target-dir (TRITON_CACHE_DIR there).
"""
from __future__ import annotations

import argparse
import hashlib
import json
import os
import shutil
import tarfile
import tempfile
import sys
import time
from pathlib import Path

os.environ.pop("TRITON_INTERPRET", None)
ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))

import torch  # noqa: E402
import triton  # noqa: E402
from triton.backends.compiler import GPUTarget  # noqa: E402
from triton.runtime.driver import driver  # noqa: E402
from triton.runtime.jit import JITFunction  # noqa: E402


class _H200Driver:
    """What JITFunction.run asks of the active driver before a warm-up compile."""

    def __init__(self):
        from triton.backends.nvidia.driver import CudaDriver  # noqa: PLC0415
        self._cuda = CudaDriver  # class attributes only (no CUDA calls)

    def get_current_device(self):
        return 0

    def get_current_stream(self, device=None):
        return 0

    def get_current_target(self):
        return GPUTarget("cuda", 90, 32)

    def get_active_torch_device(self):
        return torch.device("cpu")


def triton_key() -> str:
    from triton.backends.nvidia.compiler import get_ptxas_version  # noqa: PLC0415
    from triton.runtime.cache import triton_key as tk  # noqa: PLC0415
    ptxas = get_ptxas_version(90).strip().splitlines()[-1]
    return f"{hashlib.sha256(tk().encode()).hexdigest()[:16]} ptxas {ptxas!r}"


def rekey_compiles(gpu_key: str, stage: Path, target_dir: str) -> list:
    """Wrap triton.compile: after each compile (or cache hit) under the local key, file a pruned copy
    of the kernel under the hash ``gpu_key`` gives, in ``stage``. Returns the (local, gpu) hashes."""
    import triton.compiler.compiler as tc  # noqa: PLC0415
    import triton.runtime.cache as rc  # noqa: PLC0415
    from triton.runtime.jit import JITFunction as J  # noqa: PLC0415
    orig, done = tc.compile, []

    def compile_and_rekey(src, target=None, options=None, _env_vars=None):
        k = orig(src, target=target, options=options, _env_vars=_env_vars)
        backend = tc.make_backend(target)
        opts = backend.parse_options(dict(options or dict(), **src.parse_options()))
        env = tc.get_cache_invalidating_env_vars() if _env_vars is None else _env_vars
        local = rc.triton_key
        rc.triton_key = lambda: gpu_key
        try:
            key = rc.get_cache_key(src, backend, opts, env_vars=env)
        finally:
            rc.triton_key = local
        h = hashlib.sha256(key.encode("utf-8")).hexdigest()
        src_dir, d = Path(rc.knobs.cache.dir) / rc._base32(k.hash), rc._base32(h)  # Triton's folder names
        dst = stage / d
        dst.mkdir(parents=True, exist_ok=True)
        name = src.name[:150]
        keep = {f"{name}.json", f"{name}.cubin"}
        for f in keep:
            data = (src_dir / f).read_bytes()
            if f.endswith(".json"):
                meta = json.loads(data)
                meta["hash"] = h
                data = json.dumps(meta).encode()
            (dst / f).write_bytes(data)
        (dst / f"__grp__{name}.json").write_text(json.dumps({"child_paths": {f: f"{target_dir}/{d}/{f}" for f in keep}}))
        done.append((k.hash, h))
        return k

    tc.compile = compile_and_rekey
    orig_binder = J.create_binder

    def create_binder(self):  # JITFunction binds ``compile`` when it first runs
        res = orig_binder(self)
        self.compile = compile_and_rekey
        return res
    J.create_binder = create_binder
    return done


def log_keys(path: str, gpu_key) -> None:
    """Wrap Triton's get_cache_key: each key's parts (hashed) as a JSON line, to find what differs
    between two machines. With ``gpu_key`` the Triton part is that key (as --pack files them)."""
    import triton.compiler.compiler as tc  # noqa: PLC0415
    import triton.runtime.cache as rc  # noqa: PLC0415
    orig = rc.get_cache_key
    sha = lambda v: hashlib.sha256(str(v).encode()).hexdigest()[:16]  # noqa: E731

    def logged(src, backend, backend_options, env_vars):
        tk = gpu_key if gpu_key is not None else rc.triton_key()
        parts = {"name": src.name, "triton": sha(tk), "src": sha(src.hash()), "fn": sha(src.fn.cache_key),
                 "attrs": str(src.attrs), "signature": str(sorted(src.signature.items())),
                 "constants": str(sorted(src.constants.items())), "backend": backend.hash(),
                 "options": sha(backend_options.hash()), "options_dict": {k: str(v) for k, v in backend_options.__dict__.items()},
                 "env": env_vars}
        key = f"{tk}-{src.hash()}-{backend.hash()}-{backend_options.hash()}-{str(sorted(env_vars.items()))}"
        parts["hash"] = hashlib.sha256(key.encode()).hexdigest()
        with open(path, "a") as f:
            f.write(json.dumps(parts) + "\n")
        return orig(src, backend, backend_options, env_vars)
    rc.get_cache_key = tc.get_cache_key = logged  # compile() holds its own reference


def like_rows(rows: int, per_program: int) -> int:
    """The smallest row count whose N and NBLK classes equal those of ``rows``."""
    from equikernels.codegen.launch import int_class  # noqa: PLC0415
    want = (int_class(rows), int_class(-(-rows // per_program)))
    for n in range(1, 1 << 16):
        if (int_class(n), int_class(-(-n // per_program))) == want:
            return n
    raise ValueError(rows)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--problem", default="nequip-revmd17-benzene")
    ap.add_argument("--layout", default="ir_mul")
    ap.add_argument("--directions", default="fwd,bwd,dbwd")
    ap.add_argument("--like-rows", default="50000", help="comma list of row counts to specialise like")
    ap.add_argument("--print-key", action="store_true")
    ap.add_argument("--dump-key", help="write Triton's full cache key prefix to this file and stop")
    ap.add_argument("--gpu-key", help="file from --dump-key on the GPU machine: file copies under its key")
    ap.add_argument("--pack", help="with --gpu-key: tar.gz of the re-keyed kernels")
    ap.add_argument("--target-dir", default="/tmp/tcache", help="TRITON_CACHE_DIR on the GPU machine")
    ap.add_argument("--log-keys", help="append the parts of every kernel's cache key here (JSON lines)")
    ap.add_argument("--real-driver", action="store_true", help="the machine's own driver (on the GPU)")
    ap.add_argument("--shard", default="0/1", help="i/n: compile only every n-th kernel launch from the i-th "
                    "(n processes side by side: cold compiles in parallel, e.g. on the GPU machine's 16 cores)")
    args = ap.parse_args(argv)
    print("triton", triton.__version__, "key", triton_key(), "cache", os.environ.get("TRITON_CACHE_DIR"), flush=True)
    if args.dump_key:
        from triton.runtime.cache import triton_key as tk  # noqa: PLC0415
        Path(args.dump_key).write_text(tk())
    if args.print_key or args.dump_key:
        return 0
    stage = Path(tempfile.mkdtemp(prefix="rekey_"))
    rekeyed = rekey_compiles(Path(args.gpu_key).read_text(), stage, args.target_dir) if args.gpu_key else None
    from equikernels.catalog import standard_problems  # noqa: PLC0415
    from equikernels.codegen import launch  # noqa: PLC0415
    from equikernels.codegen import tp as ct  # noqa: PLC0415
    from equikernels.ops.tp import plan_of, spec_of  # noqa: PLC0415
    from equikernels.problem import TPProblem  # noqa: PLC0415

    if args.log_keys:
        log_keys(args.log_keys, Path(args.gpu_key).read_text() if args.gpu_key else None)
    if not args.real_driver:
        driver.set_active(_H200Driver())
    launch.set_enabled(False)  # every launch through fn[grid], i.e. Triton's run
    shard, nshards = (int(v) for v in args.shard.split("/"))
    count = [0]

    def warmup_launch(self, grid):
        def run(*a, **kw):
            count[0] += 1
            if (count[0] - 1) % nshards == shard:
                return self.run(*a, grid=grid, warmup=True, **kw)
        return run
    JITFunction.__getitem__ = warmup_launch
    ct._num_sms = lambda device: 132  # shared-weight partial sums: programs = min(blocks, 4 * SMs)
    P = TPProblem.create(**standard_problems()[args.problem])
    K = plan_of(spec_of(P, args.layout)).kernels
    dirs = args.directions.split(",")
    for rows in (int(r) for r in args.like_rows.split(",")):
        for d in dirs:
            cfg = K._cfg(d, torch.float32)
            n = like_rows(rows, cfg.rows)
            mk = lambda *s: torch.zeros(*s)  # noqa: E731
            x, y, g = mk(n, P.dim_in1), mk(n, P.dim_in2), mk(n, P.dim_out)
            w = mk(P.weight_numel) if P.shared_weights else mk(n, P.weight_numel)
            t0 = time.perf_counter()
            if d == "fwd":
                K.forward(x, y, w)
            elif d == "bwd":
                K.backward(x, y, w, g, 7)
            else:  # bench_tp's double backward: all three cotangents, all four results
                K.double_backward(x, y, w, g, torch.zeros_like(x), torch.zeros_like(y), torch.zeros_like(w), 15)
            print(f"{args.problem} {d} like {rows} rows (n={n}): {time.perf_counter() - t0:.1f} s", flush=True)
    if rekeyed is not None and args.pack:
        with tarfile.open(args.pack, "w:gz") as tar:
            for p in sorted(stage.iterdir()):
                tar.add(p, arcname=p.name)
        print(f"packed {len(rekeyed)} kernels -> {args.pack} ({os.path.getsize(args.pack) / 1e6:.1f} MB)")
    shutil.rmtree(stage, ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
