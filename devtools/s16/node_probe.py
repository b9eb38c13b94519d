"""Session 16 probe: host cost per autograd.grad call of a Python autograd node against C++ nodes on
CUDA tensors (the autograd engine runs CUDA nodes on its device thread, so a Python node takes the
GIL there), and nequip-water's double backward at 20k rows with the Triton launch mocked out."""
import os, subprocess, sys, sysconfig, time
import torch
HERE = os.path.dirname(os.path.abspath(__file__))
dev = os.environ.get("DEV", "cuda")


def build_probe():
    T = os.path.dirname(torch.__file__)
    out = "/tmp/ekprobe" + sysconfig.get_config_var("EXT_SUFFIX")
    cmd = ["g++", "-O2", "-shared", "-fPIC", "-std=c++17", "-w",
           f"-D_GLIBCXX_USE_CXX11_ABI={int(torch.compiled_with_cxx11_abi())}", "-DTORCH_EXTENSION_NAME=ekprobe",
           f"-I{T}/include", f"-I{T}/include/torch/csrc/api/include", "-I" + sysconfig.get_paths()["include"],
           os.path.join(HERE, "probe.cpp"), f"-L{T}/lib", "-lc10", "-ltorch", "-ltorch_cpu", "-ltorch_python",
           f"-Wl,-rpath,{T}/lib", "-o", out]
    t = time.perf_counter()
    r = subprocess.run(cmd, capture_output=True, text=True)
    print(f"probe compile rc={r.returncode} {time.perf_counter() - t:.1f}s", r.stderr[-2000:])
    sys.path.insert(0, "/tmp")
    import ekprobe
    return ekprobe


class PyIdent(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x):
        return x.view(x.shape)

    @staticmethod
    def backward(ctx, g):
        return g


def per_call(fn, n=2000, reps=5):
    for _ in range(50):
        fn()
    (torch.cuda.synchronize() if dev == "cuda" else None)
    best = []
    for _ in range(reps):
        t = time.perf_counter()
        for _ in range(n):
            fn()
        host = time.perf_counter() - t
        (torch.cuda.synchronize() if dev == "cuda" else None)
        best.append(host / n * 1e6)
    return sorted(best)


def graphs(ext):
    x = torch.randn(64, 8, device=dev, requires_grad=True)
    r = torch.randn(64, 8, device=dev)
    res = {}
    for name, f in (("builtin view (C++ node)", lambda t: t.view(t.shape)), ("python Function", PyIdent.apply),
                    ("C++ custom Function", ext.ident if ext else None)):
        if f is None:
            continue
        L = (f(x) * r).sum()
        res[name] = per_call(lambda: torch.autograd.grad(L, x, retain_graph=True))
    return res


def water():
    sys.path.insert(0, os.path.join(os.getcwd(), "benchmarks"))
    import argparse
    import bench_tp as B
    from equikernels.catalog import standard_problems
    from equikernels.codegen import launch
    spec = B.Spec.create("nequip-water", standard_problems()["nequip-water"])
    args = argparse.Namespace(rotate_factor=4.0, max_sets=1, seed=0, backend=None)
    out = {}
    for impl in ("equikernels_ir_mul", "oeq"):
        try:
            built = B.build(impl, spec, torch.float32, torch.device(dev), args)
        except Exception as e:  # noqa: BLE001
            print(impl, "build failed", repr(e)[:300]); continue
        call, _, _ = B.make_call(spec, built, "dbwd", 20000, torch.float32, torch.device(dev), args)
        out[impl] = per_call(lambda: call(0), n=500)
        if impl.startswith("equikernels"):
            real = launch.Pinned.__call__
            launch.Pinned.__call__ = lambda self, *a: None
            out[impl + " launch mocked"] = per_call(lambda: call(0), n=500)
            launch.Pinned.__call__ = real
    return out


if __name__ == "__main__":
    for tool in ("gcc", "g++", "ninja", "nvcc"):
        print(tool, subprocess.run(["which", tool], capture_output=True, text=True).stdout.strip() or "-")
    try:
        ext = build_probe()
    except Exception as e:  # noqa: BLE001
        print("probe failed", repr(e)); ext = None
    res = graphs(ext)
    res.update(water())
    print("\n| graph | host us per autograd.grad call (sorted over 5 reps) |\n|---|---|")
    for k, v in res.items():
        print(f"| {k} | {' '.join(f'{t:.1f}' for t in v)} |")
