"""Quick GPU check: correctness vs reference and fwd/bwd timings of the generated kernels."""
import os, sys, time, json
import torch, triton
from equikernels.catalog import problem
from equikernels.ops import tensor_product

names = sys.argv[1].split(",") if len(sys.argv) > 1 else ["mace-mp-medium-L2"]
layouts = sys.argv[2].split(",") if len(sys.argv) > 2 else ["ir_mul", "mul_ir"]
rows = int(os.environ.get("ROWS_N", 50000))
dev = "cuda"
# copy bandwidth
a = torch.empty(2**28, dtype=torch.float32, device=dev); b = torch.empty_like(a)
ms = triton.testing.do_bench(lambda: b.copy_(a), return_mode="median")
bw = 2 * a.numel() * 4 / ms / 1e6
print(f"copy bandwidth {bw:.0f} GB/s"); del a, b
res = []
for name in names:
    p = problem(name)
    for layout in layouts:
        for dtype in (torch.float32,):
            # correctness at small size vs reference in fp64
            B = 1000
            x = torch.randn(B, p.dim_in1, device=dev, dtype=torch.float64, requires_grad=True)
            y = torch.randn(B, p.dim_in2, device=dev, dtype=torch.float64, requires_grad=True)
            w = torch.randn(B, p.weight_numel, device=dev, dtype=torch.float64, requires_grad=True) if not p.shared_weights else torch.randn(p.weight_numel, device=dev, dtype=torch.float64, requires_grad=True)
            t0 = time.time()
            o = tensor_product(p, x.float(), y.float(), w.float(), layout=layout, backend="triton")
            torch.cuda.synchronize(); tc = time.time() - t0
            r = tensor_product(p, x, y, w, layout=layout, backend="reference")
            g = torch.randn_like(r)
            t0 = time.time()
            gt = torch.autograd.grad(o, [x, y, w], g.float())
            torch.cuda.synchronize(); tcb = time.time() - t0
            gr = torch.autograd.grad(r, [x, y, w], g)
            errs = [float((a.double() - b).norm() / b.norm()) for a, b in zip((o,) + gt, (r,) + gr)]
            # timing
            N = rows
            xs = [torch.randn(N, p.dim_in1, device=dev, dtype=dtype) for _ in range(2)]
            ys = [torch.randn(N, p.dim_in2, device=dev, dtype=dtype) for _ in range(2)]
            ws = [torch.randn(N, p.weight_numel, device=dev, dtype=dtype) if not p.shared_weights else torch.randn(p.weight_numel, device=dev, dtype=dtype) for _ in range(2)]
            gs = [torch.randn(N, p.dim_out, device=dev, dtype=dtype) for _ in range(2)]
            kern = p and __import__("equikernels.ops", fromlist=["plan_of"]).plan_of(__import__("equikernels.ops", fromlist=["spec_of"]).spec_of(p, layout)).kernels
            i = [0]
            def fwd():
                i[0] ^= 1; return kern.forward(xs[i[0]], ys[i[0]], ws[i[0]])
            def bwd():
                i[0] ^= 1; return kern.backward(xs[i[0]], ys[i[0]], ws[i[0]], gs[i[0]], 7)
            def dbwd():
                i[0] ^= 1; return kern.double_backward(xs[i[0]], ys[i[0]], ws[i[0]], gs[i[0]], xs[1-i[0]], ys[1-i[0]], ws[1-i[0]], 15)
            tf = triton.testing.do_bench(fwd, return_mode="median")
            t0 = time.time(); dbwd(); torch.cuda.synchronize(); tcd = time.time() - t0
            td = triton.testing.do_bench(dbwd, return_mode="median")
            tb = triton.testing.do_bench(bwd, return_mode="median")
            es = 4
            wb = p.weight_numel * (N if not p.shared_weights else 1)
            fbytes = es * (N * (p.dim_in1 + p.dim_in2 + p.dim_out) + wb)
            bbytes = es * (N * (2 * p.dim_in1 + 2 * p.dim_in2 + p.dim_out) + 2 * wb)
            row = dict(problem=name, layout=layout, dtype=str(dtype), fwd_ms=tf, bwd_ms=tb, dbwd_ms=td, compile_dbwd_s=tcd, fwd_GBs=fbytes / tf / 1e6,
                       bwd_GBs=bbytes / tb / 1e6, compile_fwd_s=tc, compile_bwd_s=tcb, errs=errs)
            res.append(row)
            print(json.dumps(row), flush=True)
out = os.environ.get("OUT", "/tmp")
json.dump(res, open(os.path.join(out, "gpu_check.json"), "w"), indent=1)
print(f"{'problem':24s} {'layout':7s} {'fwd ms':>8s} {'GB/s':>6s} {'bwd ms':>8s} {'GB/s':>6s} {'dbwd ms':>8s} {'cmp s':>6s} err")
for r in res:
    print(f"{r['problem']:24s} {r['layout']:7s} {r['fwd_ms']:8.3f} {r['fwd_GBs']:6.0f} {r['bwd_ms']:8.3f} {r['bwd_GBs']:6.0f} {r['dbwd_ms']:8.3f} {r['compile_fwd_s']+r['compile_bwd_s']+r['compile_dbwd_s']:6.1f} {max(r['errs']):.1e}")
