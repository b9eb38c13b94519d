"""Bad input raises a clear exception that names the offending argument."""
import pytest
import torch

from equikernels.ops import tensor_product
from equikernels.problem import TPProblem

# 2x0e (dim 2) x 1x1o (dim 3) -> 2x1o (dim 6), uvu: 2 weights
IRREPS = ("2x0e", "1x1o", "2x1o")
INSTR = [(0, 0, 0, "uvu", True)]


@pytest.fixture
def shared():
    return TPProblem.create(*IRREPS, INSTR, shared_weights=True, internal_weights=False)


@pytest.fixture
def per_row():
    return TPProblem.create(*IRREPS, INSTR, shared_weights=False)


def _xyw(rows=3, nw=2, dtype=torch.float64, per_row=True):
    return (torch.randn(rows, 2, dtype=dtype), torch.randn(rows, 3, dtype=dtype),
            torch.randn((rows, nw) if per_row else (nw,), dtype=dtype))


# --- tensor_product arguments -------------------------------------------------------------------
def test_valid_call_works(shared, per_row):
    """The baseline the error tests perturb is itself valid."""
    x, y, w = _xyw()
    assert tensor_product(per_row, x, y, w).shape == (3, 6)
    assert tensor_product(shared, x, y, w[0]).shape == (3, 6)


def test_wrong_last_dim_x(per_row):
    x, y, w = _xyw()
    with pytest.raises(ValueError, match=r"x: expected last dimension 2 \(irreps_in1\)"):
        tensor_product(per_row, x[:, :1], y, w)


def test_wrong_last_dim_y(per_row):
    x, y, w = _xyw()
    with pytest.raises(ValueError, match=r"y: expected last dimension 3 \(irreps_in2\)"):
        tensor_product(per_row, x, torch.randn(3, 4, dtype=torch.float64), w)


def test_scalar_x(per_row):
    _, y, w = _xyw()
    with pytest.raises(ValueError, match=r"x: expected last dimension"):
        tensor_product(per_row, torch.tensor(1.0, dtype=torch.float64), y, w)


def test_mismatched_batch_dims(per_row):
    x, y, w = _xyw()
    with pytest.raises(ValueError, match=r"x and y: batch dimensions \(3,\) and \(4,\)"):
        tensor_product(per_row, x, torch.randn(4, 3, dtype=torch.float64), w)


def test_wrong_shared_weight_shape(shared):
    x, y, _ = _xyw()
    with pytest.raises(ValueError, match=r"weight: expected shape \(2,\) for shared weights"):
        tensor_product(shared, x, y, torch.randn(3, dtype=torch.float64))
    with pytest.raises(ValueError, match=r"weight: expected shape \(2,\) for shared weights"):
        tensor_product(shared, x, y, torch.randn(3, 2, dtype=torch.float64))


def test_wrong_per_row_weight_shape(per_row):
    x, y, _ = _xyw()
    with pytest.raises(ValueError, match=r"weight: expected shape \(\.\.\., 2\) for per-row weights"):
        tensor_product(per_row, x, y, torch.randn(3, 5, dtype=torch.float64))
    with pytest.raises(ValueError, match=r"weight: batch dimensions \(4,\)"):
        tensor_product(per_row, x, y, torch.randn(4, 2, dtype=torch.float64))


def test_missing_weight(shared, per_row):
    x, y, _ = _xyw()
    for p in (shared, per_row):
        with pytest.raises(ValueError, match=r"weight: .*pass weight"):
            tensor_product(p, x, y)


def test_weightless_problem_needs_no_weight():
    p = TPProblem.create(*IRREPS, [(0, 0, 0, "uvu", False)])
    x, y, _ = _xyw()
    assert p.weight_numel == 0
    assert tensor_product(p, x, y).shape == (3, 6)


@pytest.mark.parametrize("which", ["y", "weight"])
def test_dtype_mismatch(per_row, which):
    x, y, w = _xyw()
    args = {"x": x, "y": y, "weight": w}
    args[which] = args[which].float()
    with pytest.raises(TypeError, match=rf"{which}: dtype torch.float32 does not match x \(torch.float64\)"):
        tensor_product(per_row, args["x"], args["y"], args["weight"])


@pytest.mark.parametrize("which", ["y", "weight"])
def test_device_mismatch(per_row, which):
    x, y, w = _xyw()
    args = {"x": x, "y": y, "weight": w}
    args[which] = args[which].to("meta")  # a second device without a GPU
    with pytest.raises(ValueError, match=rf"{which}: device meta does not match x \(cpu\)"):
        tensor_product(per_row, args["x"], args["y"], args["weight"])


@pytest.mark.parametrize("which", ["x", "y"])
def test_integer_input(per_row, which):
    x, y, w = _xyw()
    args = {"x": x, "y": y}
    args[which] = torch.ones_like(args[which], dtype=torch.int64)
    with pytest.raises(TypeError, match=rf"{which}: expected a floating-point tensor, got torch.int64"):
        tensor_product(per_row, args["x"], args["y"], w)


@pytest.mark.parametrize("which", ["x", "y", "weight"])
def test_not_a_tensor(per_row, which):
    x, y, w = _xyw()
    args = {"x": x, "y": y, "weight": w}
    args[which] = args[which].tolist()
    with pytest.raises(TypeError, match=rf"{which}: expected a torch.Tensor, got list"):
        tensor_product(per_row, args["x"], args["y"], args["weight"])


def test_bad_layout(per_row):
    x, y, w = _xyw()
    with pytest.raises(ValueError, match=r"layout: expected one of \('mul_ir', 'ir_mul'\), got 'irmul'"):
        tensor_product(per_row, x, y, w, layout="irmul")


def test_bad_backend(per_row, monkeypatch):
    x, y, w = _xyw()
    with pytest.raises(ValueError, match=r"backend: expected one of \('auto', 'triton', 'reference', 'cpu'\), got 'cuda'"):
        tensor_product(per_row, x, y, w, backend="cuda")
    monkeypatch.setenv("EQUIKERNELS_BACKEND", "fast")
    with pytest.raises(ValueError, match=r"EQUIKERNELS_BACKEND: expected one of .*got 'fast'"):
        tensor_product(per_row, x, y, w)


def test_triton_backend_on_cpu_needs_the_interpreter(per_row):
    from equikernels import settings

    x, y, w = _xyw()
    with settings.override(triton_interpret=False):
        with pytest.raises(ValueError, match=r"backend 'triton' runs on CUDA devices, or on the CPU with TRITON_INTERPRET=1"):
            tensor_product(per_row, x, y, w, backend="triton")


def test_reference_backend_by_name_and_env(per_row, monkeypatch):
    x, y, w = _xyw()
    ref = tensor_product(per_row, x, y, w, backend="reference")
    monkeypatch.setenv("EQUIKERNELS_BACKEND", "reference")
    assert torch.equal(tensor_product(per_row, x, y, w), ref)


# --- empty batches ------------------------------------------------------------------------------
@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
@pytest.mark.parametrize("batch", [(0,), (2, 0)])
def test_empty_batch_per_row(per_row, dtype, batch):
    x = torch.randn(batch + (2,), dtype=dtype, requires_grad=True)
    y = torch.randn(batch + (3,), dtype=dtype, requires_grad=True)
    w = torch.randn(batch + (2,), dtype=dtype, requires_grad=True)
    out = tensor_product(per_row, x, y, w)
    assert out.shape == batch + (6,) and out.dtype == dtype
    gx, gy, gw = torch.autograd.grad(out.sum(), (x, y, w))
    assert (gx.shape, gy.shape, gw.shape) == (x.shape, y.shape, w.shape)
    assert gx.dtype == gy.dtype == gw.dtype == dtype


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
def test_empty_batch_shared(shared, dtype):
    x = torch.randn(0, 2, dtype=dtype, requires_grad=True)
    y = torch.randn(0, 3, dtype=dtype, requires_grad=True)
    w = torch.randn(2, dtype=dtype, requires_grad=True)
    out = tensor_product(shared, x, y, w)
    assert out.shape == (0, 6) and out.dtype == dtype
    gx, gy, gw = torch.autograd.grad(out.sum(), (x, y, w))
    assert gx.shape == (0, 2) and gy.shape == (0, 3)
    assert gw.shape == (2,) and gw.dtype == dtype and torch.count_nonzero(gw) == 0


# --- TPProblem.create validation ----------------------------------------------------------------
@pytest.mark.parametrize("bad", ["2x0e+bad", "2x0q", "x1o", 5], ids=str)
def test_malformed_irreps(bad):
    with pytest.raises(ValueError, match=r"irreps_in2: expected irreps such as"):
        TPProblem.create("1x0e", bad, "1x0e", [])


@pytest.mark.parametrize("field,index", [(0, "i_in1=1"), (1, "i_in2=3"), (2, "i_out=-1")])
def test_instruction_index_out_of_range(field, index):
    ins = [0, 0, 0, "uvw", True]
    ins[field] = {0: 1, 1: 3, 2: -1}[field]
    with pytest.raises(ValueError, match=rf"instructions\[1\]: {index} out of range"):
        TPProblem.create("1x0e", "1x0e", "1x0e", [(0, 0, 0, "uvw", True), tuple(ins)])


def test_triangle_rule():
    with pytest.raises(ValueError, match=r"instructions\[0\]: l_out=3 violates the triangle rule for l1=1, l2=1"):
        TPProblem.create("1x1o", "1x1o", "1x3e", [(0, 0, 0, "uvw", True)])


def test_parity():
    with pytest.raises(ValueError, match=r"instructions\[0\]: parity mismatch, 1o x 1o cannot give 1o"):
        TPProblem.create("1x1o", "1x1o", "1x1o", [(0, 0, 0, "uvw", True)])


def test_unknown_mode():
    with pytest.raises(ValueError, match=r"instructions\[0\]: unknown connection mode 'uwv'"):
        TPProblem.create("1x0e", "1x0e", "1x0e", [(0, 0, 0, "uwv", True)])


@pytest.mark.parametrize("mode,irreps,need", [
    ("uvu", ("2x0e", "3x0e", "3x0e"), "mul_in1 == mul_out"),
    ("uvv", ("2x0e", "3x0e", "2x0e"), "mul_in2 == mul_out"),
    ("uuw", ("2x0e", "3x0e", "2x0e"), "mul_in1 == mul_in2"),
    ("uuu", ("2x0e", "2x0e", "3x0e"), "mul_in1 == mul_in2 == mul_out"),
    ("uvuv", ("2x0e", "3x0e", "5x0e"), r"mul_in1 \* mul_in2 == mul_out"),
    ("uvu<v", ("3x0e", "3x0e", "4x0e"), r"mul_in1 == mul_in2 and mul_out == m\(m-1\)/2"),
    ("u<vw", ("3x0e", "2x0e", "4x0e"), "mul_in1 == mul_in2"),
])
def test_multiplicity_mismatch(mode, irreps, need):
    with pytest.raises(ValueError, match=rf"instructions\[0\]: mode '{mode}' requires {need}"):
        TPProblem.create(*irreps, [(0, 0, 0, mode, True)])


@pytest.mark.parametrize("mode", ["uvw", "u<vw"])
def test_mode_needs_weight(mode):
    with pytest.raises(ValueError, match=rf"instructions\[0\]: mode '{mode}' requires has_weight=True"):
        TPProblem.create("2x0e", "2x0e", "3x0e", [(0, 0, 0, mode, False)])


def test_unweighted_uuw_needs_single_output_channel():
    with pytest.raises(ValueError, match=r"instructions\[0\]: unweighted 'uuw' requires mul_out == 1"):
        TPProblem.create("2x0e", "2x0e", "3x0e", [(0, 0, 0, "uuw", False)])
    TPProblem.create("2x0e", "2x0e", "1x0e", [(0, 0, 0, "uuw", False)])


def test_instruction_tuple_length():
    with pytest.raises(ValueError, match=r"instructions\[0\]: expected \(i_in1, i_in2, i_out, mode, has_weight"):
        TPProblem.create("1x0e", "1x0e", "1x0e", [(0, 0, 0, "uvw")])


def test_bad_path_weight_names_instruction():
    with pytest.raises(ValueError, match=r"instructions\[0\]"):
        TPProblem.create("1x0e", "1x0e", "1x0e", [(0, 0, 0, "uvw", True, "heavy")])


@pytest.mark.parametrize("name", ["in1_var", "in2_var", "out_var"])
def test_variance_length(name):
    with pytest.raises(ValueError, match=rf"{name}: expected 2 variances \(one per irrep\), got 3"):
        TPProblem.create("1x0e+1x1o", "1x0e+1x1o", "1x0e+1x1o", [(0, 0, 0, "uvw", True)], **{name: [1.0] * 3})


def test_normalization_names():
    with pytest.raises(ValueError, match=r"irrep_normalization: expected one of .*got 'integral'"):
        TPProblem.create("1x0e", "1x0e", "1x0e", [], irrep_normalization="integral")
    with pytest.raises(ValueError, match=r"path_normalization: expected one of .*got 'paths'"):
        TPProblem.create("1x0e", "1x0e", "1x0e", [], path_normalization="paths")


def test_internal_weights_need_shared_weights():
    with pytest.raises(ValueError, match=r"internal_weights=True requires shared_weights=True"):
        TPProblem.create("1x0e", "1x0e", "1x0e", [(0, 0, 0, "uvw", True)], internal_weights=True,
                         shared_weights=False)


def test_triton_backend_without_triton_says_so_in_one_line(monkeypatch):
    from equikernels.ops import tp as tp_ops

    monkeypatch.setattr(tp_ops, "triton_available", lambda: False)
    with pytest.raises(ValueError, match=r"^backend 'triton' needs Triton, which is not installed") as info:
        tp_ops.resolve_backend("triton", torch.device("cpu"))
    assert "\n" not in str(info.value)
    assert tp_ops.resolve_backend("auto", torch.device("cpu")) == "cpu"
