"""torch.jit.script of the e3nn-compatible modules (e3nn's are scriptable): the scripted module
gives the eager module's numbers, saves and loads, differentiates; the graph convolution refuses
with a message naming torch.export."""
import io

import pytest
import torch

import equikernels.nn as enn

pytestmark = pytest.mark.filterwarnings("ignore:`torch.jit:DeprecationWarning")

MODES = ["uvw", "uvu", "uvv", "uuw", "uuu", "uvuv", "uvu<v", "u<vw"]


def _tp(mode, weighted, layout, shared):
    mo = {"uvuv": 4, "uvu<v": 1}.get(mode, 2)
    if mode == "uuw" and not weighted:
        mo = 1
    ins = [(0, 0, 0, mode, weighted), (1, 1, 0, mode, weighted), (0, 1, 1, mode, weighted), (1, 1, 2, mode, weighted)]
    return enn.TensorProduct("2x0e+2x1o", "2x0e+2x1o", f"{mo}x0e+{mo}x1o+{mo}x1e", ins, layout=layout,
                             shared_weights=shared if weighted else None,
                             internal_weights=shared if weighted else None)


def _roundtrip(sm):
    buf = io.BytesIO()
    torch.jit.save(sm, buf)
    buf.seek(0)
    return torch.jit.load(buf)


@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize("layout", ["mul_ir", "ir_mul"])
def test_tensor_product_scripts_to_the_same_numbers(mode, layout):
    torch.manual_seed(0)
    for weighted, shared in ((True, True), (True, False), (False, True)):
        if mode in ("uvw", "u<vw") and not weighted:
            continue
        m = _tp(mode, weighted, layout, shared).double()
        x, y = torch.randn(3, 1, m.irreps_in1.dim, dtype=torch.float64), torch.randn(4, m.irreps_in2.dim,
                                                                                   dtype=torch.float64)
        args = (x, y) if m.internal_weights or m.weight_numel == 0 else (
            x, y, torch.randn(3, 4, m.weight_numel, dtype=torch.float64))
        sm = torch.jit.script(m)
        torch.testing.assert_close(sm(*args), m(*args))
        if len(args) == 2:
            torch.testing.assert_close(sm.right(y), m.right(y))
    loaded = _roundtrip(sm)
    torch.testing.assert_close(loaded(*args), m(*args))
    with pytest.raises(torch.jit.Error, match="x: expected last dimension"):
        sm(x[..., 1:], *args[1:])


def test_subclasses_linear_and_spherical_harmonics_script():
    torch.manual_seed(0)
    x = torch.randn(5, 8)
    for m, args in [
        (enn.FullyConnectedTensorProduct("2x0e+2x1o", "0e+1o", "3x0e+1x1e"), (x, torch.randn(5, 4))),
        (enn.TensorSquare("2x0e+2x1o"), (x,)),
        (enn.TensorSquare("2x0e+2x1o", "3x0e+1x1e"), (x,)),
        (enn.ElementwiseTensorProduct("2x0e+2x1o", "2x0e+2x1o"), (x, x)),
        (enn.Linear("2x0e+2x1o", "3x0e+1x1o", biases=True), (x,)),
        (enn.Linear("2x0e+2x1o", "3x0e+1x1o", layout="ir_mul"), (x,)),
        (enn.Linear("0e+1e", "2x0e+1e", f_in=3, f_out=2), (torch.randn(5, 3, 4),)),
        (enn.Linear("2x0e+2x1o", "3x0e+1x1o", shared_weights=False), (x, torch.randn(5, 8))),
        # per-row weights over two batch dimensions, and broadcast against the features' batch
        (enn.Linear("2x0e+2x1o", "3x0e+1x1o", shared_weights=False), (x.reshape(5, 1, 8), torch.randn(5, 3, 8))),
        (enn.Linear("0e+1e", "2x0e+1e", f_in=3, f_out=2, shared_weights=False),
         (torch.randn(2, 5, 3, 4), torch.randn(2, 5, 3, 2, 3))),
        (enn.SphericalHarmonics([1, 3], True, normalization="norm"), (x[:, :3],)),
        (enn.SphericalHarmonics("1o+2x2e", False, layout="ir_mul"), (x[:, :3],)),
    ]:
        sm = _roundtrip(torch.jit.script(m))
        torch.testing.assert_close(sm(*args), m(*args), msg=repr(m))


@pytest.mark.parametrize("lead", [(0,), (2, 0), (0, 3)])
def test_scripted_product_takes_empty_batches_with_per_row_weights(lead):
    tp = enn.FullyConnectedTensorProduct("2x0e+1x1o", "1x0e+1x1o", "2x0e+1x1o", shared_weights=False)
    x, y = torch.randn(*lead, tp.irreps_in1.dim), torch.randn(*lead, tp.irreps_in2.dim)
    w = torch.randn(*lead, tp.weight_numel)
    out = torch.jit.script(tp)(x, y, w)
    assert out.shape == tp(x, y, w).shape == (*lead, tp.irreps_out.dim)


def test_scripted_module_differentiates_and_keeps_weights():
    m = enn.FullyConnectedTensorProduct("2x0e+1x1o", "0e+1o", "2x0e+1x1o")
    sm = torch.jit.script(m)
    x = torch.randn(4, 5, requires_grad=True)
    y = torch.randn(4, 4)
    (gx_s,) = torch.autograd.grad(sm(x, y).pow(2).sum(), x)
    (gx,) = torch.autograd.grad(m(x, y).pow(2).sum(), x)
    torch.testing.assert_close(gx_s, gx)
    assert set(dict(sm.named_parameters())) == set(dict(m.named_parameters()))


def test_convolution_refuses_torchscript_naming_export():
    conv = enn.TensorProductConv("2x0e", "0e", "2x0e", [(0, 0, 0, "uvw", True)])
    with pytest.raises(RuntimeError, match="use torch.export"):
        torch.jit.script(torch.nn.Sequential(conv))


def test_linear_weight_view_for_instruction_and_dynamo():
    """e3nn's Linear API: per-instruction weight views (writes reach the module); and torch.compile of
    a freshly built Linear (no guards on e3nn Irreps objects, which dynamo cannot guard)."""
    m = enn.Linear("4x0e + 3x1o + 2x0e", "2x1o + 8x0e", instructions=[(0, 1), (1, 0)])
    assert m.weight_view_for_instruction(0).shape == (4, 8) and m.weight_view_for_instruction(1).shape == (3, 2)
    with torch.no_grad():
        m.weight_view_for_instruction(1).fill_(0.0)
    x = torch.randn(3, m.irreps_in.dim)
    assert (m(x)[:, :6] == 0).all()
    fresh = enn.Linear("2x0e+1x1o", "3x0e+1x1o")
    compiled = torch.compile(fresh, backend="eager", fullgraph=True)
    x = torch.randn(4, 5)
    torch.testing.assert_close(compiled(x), fresh(x))


def test_modules_pickled_without_derived_attributes_still_work():
    """Modules pickled before the plain-int attributes existed rebuild them when unpickled."""
    import pickle
    mods = [(enn.FullyConnectedTensorProduct("2x0e+1x1o", "0e+1o", "2x0e+1x1o"), (torch.randn(3, 5), torch.randn(3, 4))),
            (enn.Linear("2x0e+1x1o", "3x0e+1x1o"), (torch.randn(3, 5),)),
            (enn.SphericalHarmonics([1, 2], True), (torch.randn(3, 3),))]
    for m, args in mods:
        ref = m(*args)
        for k in [k for k in m.__dict__ if k.startswith(("_ts_", "_in_dims", "_plan", "_scaled", "_specialized",
                                                         "_optimize"))]:
            del m.__dict__[k]
        back = pickle.loads(pickle.dumps(m))
        torch.testing.assert_close(back(*args), ref)
        torch.testing.assert_close(torch.jit.script(back)(*args), ref)
