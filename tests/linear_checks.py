"""An e3nn ``o3.Linear`` and an equikernels ``Linear`` with the same weights, float64, and both run
on the same rows (ours mapped back to mul_ir)."""
import torch

import equikernels as ek
from equikernels._compat import o3
from equikernels.nn.spherical_harmonics import ir_mul_permutation


def linear_pair(irreps_in, irreps_out, layout, **kw):
    torch.manual_seed(0)
    ref = o3.Linear(irreps_in, irreps_out, **kw).double()
    ours = ek.Linear(irreps_in, irreps_out, layout=layout, **kw).double()
    with torch.no_grad():
        ours.weight.copy_(ref.weight)
    return ref, ours


def run_both(ref, ours, layout, x):
    """(ours, e3nn) outputs for the mul_ir rows ``x``, ours mapped back to mul_ir."""
    pi, po = ir_mul_permutation(ref.irreps_in), ir_mul_permutation(ref.irreps_out)
    out = ours(x[:, pi] if layout == "ir_mul" else x)
    return (out[:, torch.argsort(po)] if layout == "ir_mul" else out), ref(x)
