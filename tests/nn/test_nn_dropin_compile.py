"""torch.compile(fullgraph=True) of the e3nn-compatible modules as an e3nn user builds them: every
Linear variant (biases, per-row weights, not only the internal-weight fast path) and tensor products
converted with ``from_e3nn`` and compiled before any eager call; the conversion module's exports."""
import pytest
import torch
from e3nn import o3

import equikernels.nn as enn


@pytest.mark.parametrize("kwargs", [dict(biases=True), dict(shared_weights=False), dict(f_in=2, f_out=3)])
def test_linear_general_path_compiles_whole(kwargs):
    m = enn.Linear("4x0e+3x1o", "5x0e+2x1o+1x2e", **kwargs)
    lead = (6, 2) if "f_in" in kwargs else (6,)
    args = [torch.randn(*lead, m.irreps_in.dim)]
    if not m.internal_weights:
        args += [torch.randn(6, m.weight_numel), torch.randn(6, m.bias_numel)]
    compiled = torch.compile(m, backend="eager", fullgraph=True)
    torch.testing.assert_close(compiled(*args), m(*args))


def test_converted_tensor_product_compiles_before_any_eager_call():
    torch.manual_seed(0)
    ref = o3.FullyConnectedTensorProduct("4x0e+3x1o", "0e+1o", "5x0e+2x1o")
    x, y = torch.randn(6, ref.irreps_in1.dim), torch.randn(6, ref.irreps_in2.dim)
    compiled = torch.compile(enn.from_e3nn(ref), backend="eager", fullgraph=True)
    torch.testing.assert_close(compiled(x, y), ref(x, y))


def test_convert_module_star_import():
    """Every name in ``nn.convert.__all__`` exists (a star import works)."""
    import equikernels.nn.convert as convert
    assert all(hasattr(convert, name) for name in convert.__all__)


def test_each_module_class_has_its_own_recompile_budget():
    """torch.compile counts recompiles per code object: modules whose forwards shared one (a common
    wrapper) spent one budget, and a compiled Linear failed after a product's recompiles."""
    torch._dynamo.reset()
    tp = torch.compile(enn.from_e3nn(o3.FullyConnectedTensorProduct("2x0e+1x1o", "1x0e+1x1o", "2x0e+1x1o")),
                       backend="eager", fullgraph=True)
    lin = torch.compile(enn.Linear("2x0e+1x1o", "2x0e+1x1o"), backend="eager", fullgraph=True)
    for n in (3, 5, 1):  # batch sizes and with or without grad: recompiles of the product
        for grad in (False, True):
            tp(torch.randn(n, 5, requires_grad=grad), torch.randn(n, 4))
    for n in (3, 5, 1):
        for grad in (False, True):
            lin(torch.randn(n, 5, requires_grad=grad))
    assert enn.TensorProduct.forward.__code__ is not enn.Linear.forward.__code__
