"""Values the modules keep between calls stay out of make_fx traces (torch.export and nequip's compilation
trace with it), and modules built under e3nn's jit_mode "script" stay copyable."""
import copy
import pickle

import pytest
import torch
from torch.fx.experimental.proxy_tensor import make_fx

from equikernels._compat import e3nn
from equikernels import nn as enn

TOL = dict(rtol=1e-12, atol=1e-12)


@pytest.mark.parametrize("irreps", [("4x0e+2x1o", "3x0e+1x1o"), ("2x0e", "3x0e")])
def test_frozen_linear_traced_twice_records_the_same_graph(irreps):
    torch.manual_seed(0)
    lin = enn.Linear(*irreps).double().requires_grad_(False)
    dim = lin.irreps_in.dim
    x = torch.randn(5, dim, dtype=torch.float64)
    lin(x)  # a frozen module's eager call keeps its scaled weights
    first = make_fx(lin, tracing_mode="symbolic", _allow_non_fake_inputs=True)(x)
    other = torch.randn(7, dim, dtype=torch.float64)
    second = make_fx(lin, tracing_mode="symbolic", _allow_non_fake_inputs=True)(other)
    assert first.code == second.code
    with torch.no_grad():
        lin.weight.mul_(2.0)  # the traced graph reads the parameter, not a copy made before
    torch.testing.assert_close(second(x), lin(x), **TOL)


def test_spherical_harmonics_built_in_script_mode_can_be_copied():
    get = getattr(e3nn, "get_optimization_defaults", None)
    if get is None or "jit_mode" not in get():
        pytest.skip("this e3nn has no jit_mode")
    mode = get()["jit_mode"]
    e3nn.set_optimization_defaults(jit_mode="script")
    try:
        sh = enn.SphericalHarmonics("1x0e+1x1o+1x2e", True, "component")
    finally:
        e3nn.set_optimization_defaults(jit_mode=mode)
    x = torch.randn(4, 3)
    for other in (copy.deepcopy(sh), pickle.loads(pickle.dumps(sh))):
        torch.testing.assert_close(other(x), sh(x))


@pytest.mark.parametrize("dense", [False, True], ids=["blocks", "dense"])
def test_linear_traced_before_any_call_records_the_same_graph_twice(dense, monkeypatch):
    from equikernels.nn import linear as linear_mod
    if dense:  # the small-input dense form (CUDA's) on the CPU
        monkeypatch.setattr(linear_mod, "DENSE_DEVICES", ("cpu", "cuda"))
    torch.manual_seed(0)
    lin = enn.Linear("4x0e+2x1o", "3x0e+1x1o").float().requires_grad_(False)  # float32: its float64 constants cast
    x = torch.randn(5, lin.irreps_in.dim)
    first = make_fx(lin, tracing_mode="symbolic", _allow_non_fake_inputs=True)(x)
    second = make_fx(lin, tracing_mode="symbolic", _allow_non_fake_inputs=True)(torch.randn(7, lin.irreps_in.dim))
    assert first.code == second.code
    torch.testing.assert_close(second(x), lin(x))
