"""Run one fused-MLP kernel variant on a small input (for compute-sanitizer): dtype precision direction E.

    compute-sanitizer --tool memcheck python devtools/s5/mlp_sanitize.py float32 tf32x3 bwd_x 1000
"""
import sys

import torch

from equikernels.ops.mlp import radial_mlp

dtype, prec, direction, e = getattr(torch, sys.argv[1]), sys.argv[2], sys.argv[3], int(sys.argv[4])
widths = [int(v) for v in (sys.argv[5] if len(sys.argv) > 5 else "10,64,64,64,1280").split(",")]
torch.manual_seed(0)
x = torch.randn(e, widths[0], device="cuda", dtype=dtype, requires_grad=True)
ws = [(torch.randn(a, b, device="cuda", dtype=dtype) / a ** 0.5).requires_grad_(direction == "bwd_xw")
      for a, b in zip(widths, widths[1:])]
import os  # noqa: E402

from equikernels.codegen.mlp import MLPConfig, kernels_for  # noqa: E402

cfg = os.environ.get("MLP_CFG")  # rows,cols,warps,stages: call the backward kernel directly
if cfg:
    c = MLPConfig(*[int(v) for v in cfg.split(",")])
    gx, _, _ = kernels_for(tuple(widths)).backward(x.detach(), [w.detach() for w in ws],
                                                   torch.randn(e, widths[-1], device="cuda", dtype=dtype), 1.679,
                                                   prec, True, False, cfg=c)
    torch.cuda.synchronize()
    print(sys.argv[1:], cfg, "bwd kernel ok", bool(torch.isfinite(gx).all()))
    sys.exit(0)
out = radial_mlp(x, ws, 1.679, backend="triton", precision=prec)
if direction != "fwd":
    torch.autograd.grad(out, [x] + ([w for w in ws] if direction == "bwd_xw" else []), torch.randn_like(out))
torch.cuda.synchronize()
ref = x.detach().double()
for w in ws:
    ref = ref @ w.detach().double()
    if w is not ws[-1]:
        ref = torch.nn.functional.silu(ref) * 1.679
print(sys.argv[1:], "ok", f"fwd rel err {((out.double() - ref).abs().max() / ref.abs().max()).item():.2e}")
