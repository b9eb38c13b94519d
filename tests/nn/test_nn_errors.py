"""Invalid e3nn-style arguments: our modules raise a ValueError with a message naming the argument,
which is also an instance of what e3nn raises for the same input (AssertionError for parity and
the triangle rule, TypeError for a float index, ...), so code written against e3nn still catches it."""
import pytest

import equikernels.nn as enn
from equikernels._compat import E3NN_VERSION, o3
from equikernels.problem import TensorProductError

W = [(0, 0, 0, "uvw", True)]

# name -> (constructor given a module namespace, e3nn's exception type or None when e3nn accepts or
# fails obscurely, regex of our message)
CASES = {
    "parity": (lambda m: m.TensorProduct("0e", "0e", "0o", W), AssertionError, r"parity mismatch"),
    "triangle": (lambda m: m.TensorProduct("0e", "1o", "2o", [(0, 0, 0, "uvw", True)]), AssertionError,
                 r"triangle rule"),
    "mode": (lambda m: m.TensorProduct("0e", "0e", "0e", [(0, 0, 0, "uvx", True)]), KeyError,
             r"unknown connection mode 'uvx'"),
    "multiplicity": (lambda m: m.TensorProduct("2x0e", "0e", "3x0e", [(0, 0, 0, "uvu", True)]), AssertionError,
                     r"'uvu' requires mul_in1 == mul_out"),
    "float index": (lambda m: m.TensorProduct("0e", "0e", "0e", [(0.0, 0, 0, "uvw", True)]), TypeError,
                    r"instructions\[0\]: i_in1 must be an integer index, got 0.0"),
    "index range": (lambda m: m.TensorProduct("0e", "0e", "0e", [(0, 0, 1, "uvw", True)]), IndexError,
                    r"instructions\[0\]: i_out=1 out of range"),
    "path_weight": (lambda m: m.TensorProduct("0e", "0e", "0e", [(0, 0, 0, "uvw", True, -1.0)]), ValueError,
                    r"instructions\[0\]: path_weight must be a finite number >= 0, got -1"),
    "instructions None": (lambda m: m.TensorProduct("0e", "0e", "0e", None), TypeError,
                          r"instructions: expected a list of tuples"),
    "in1_var text": (lambda m: m.TensorProduct("0e", "0e", "0e", W, in1_var="ab"), ValueError,
                     r"in1_var: expected one number \(variance\) per irrep"),
    "in1_var length": (lambda m: m.TensorProduct("0e", "0e", "0e", W, in1_var=[1.0, 2.0]), AssertionError,
                       r"in1_var: expected 1 variances"),
    "irrep_normalization": (lambda m: m.TensorProduct("0e", "0e", "0e", W, irrep_normalization="unit"),
                            AssertionError, r"irrep_normalization: expected one of"),
    "internal not shared": (lambda m: m.TensorProduct("0e", "0e", "0e", W, internal_weights=True,
                                                      shared_weights=False), AssertionError,
                            r"internal_weights=True requires shared_weights=True"),
    "elementwise": (lambda m: m.ElementwiseTensorProduct("0e", "0e+1o"), AssertionError,
                    r"same number of irreps"),
    "sh l=-1": (lambda m: m.SphericalHarmonics(-1, True), ValueError, r"irreps_out: each degree l must lie in"),
    "sh no l": (lambda m: m.SphericalHarmonics([], True), ValueError, r"irreps_out: expected at least one degree"),
    "sh normalization": (lambda m: m.SphericalHarmonics(1, True, normalization="unit"), AssertionError,
                         r"normalization: expected 'integral'"),
    "linear float index": (lambda m: m.Linear("0e", "0e", instructions=[(0.0, 0)]), TypeError,
                           r"instructions\[0\]: indices must be integers, got 0.0"),
    "linear index range": (lambda m: m.Linear("0e", "0e", instructions=[(0, 1)]), IndexError,
                           r"instructions: 1 is not a valid index for irreps_out"),
    "linear bias": (lambda m: m.Linear("0e", "1o", biases=[True]), AssertionError,
                    r"biases: only scalar \(0e\) outputs"),
}


@pytest.mark.parametrize("name", list(CASES))
def test_error_is_catchable_as_e3nn_raises_it(name):
    build, e3nn_type, message = CASES[name]
    if not (name.startswith("sh") and E3NN_VERSION < (0, 5)):  # older e3nn accepts some bad degrees
        with pytest.raises(e3nn_type):
            build(o3)
    with pytest.raises(TensorProductError, match=message) as info:
        build(enn)
    assert isinstance(info.value, ValueError) and isinstance(info.value, e3nn_type)
    assert "\n" not in str(info.value) and not str(info.value).startswith("'")  # one line, not a quoted key


def test_integer_like_indices_still_work():
    np = pytest.importorskip("numpy")
    tp = enn.TensorProduct("0e+1o", "0e", "0e+1o", [(np.int64(1), 0, 1, "uvw", True), (0, 0, 0, "uvw", True)])
    assert [i.i_in1 for i in tp.instructions] == [1, 0]
    assert enn.Linear("0e+1o", "1o", instructions=[(np.int64(1), 0)]).weight_numel == 1


def test_codegen_attributes_are_kept():
    tp = enn.FullyConnectedTensorProduct("2x0e", "0e", "0e", _specialized_code=False, _optimize_einsums=False)
    assert tp._specialized_code is False and tp._optimize_einsums is False
    tp = enn.FullyConnectedTensorProduct("2x0e", "0e", "0e")
    assert tp._specialized_code is True and tp._optimize_einsums is True
    assert enn.Linear("0e", "0e", _optimize_einsums=False)._optimize_einsums is False


def test_missing_weight_is_a_runtime_error_as_in_e3nn():
    import torch
    args = ("2x0e", "0e", "2x0e")
    x, y = torch.randn(3, 2), torch.randn(3, 1)
    with pytest.raises(RuntimeError):
        o3.FullyConnectedTensorProduct(*args, internal_weights=False, shared_weights=False)(x, y)
    tp = enn.FullyConnectedTensorProduct(*args, internal_weights=False, shared_weights=False)
    with pytest.raises(RuntimeError, match="weight: required") as info:
        tp(x, y)
    assert isinstance(info.value, ValueError)


def test_per_row_weights_need_a_batch_dimension_as_in_e3nn():
    import torch
    args = ("1e", "1e", "1e")
    x = torch.randn(2, 3)
    ref = o3.FullyConnectedTensorProduct(*args, internal_weights=False, shared_weights=False)
    with pytest.raises(AssertionError):
        ref(x, x, torch.randn(ref.weight_numel))
    tp = enn.FullyConnectedTensorProduct(*args, internal_weights=False, shared_weights=False)
    with pytest.raises(TensorProductError, match="need a batch dimension"):
        tp(x, x, torch.randn(tp.weight_numel))
    with pytest.raises(torch.jit.Error, match="batch dimension"):
        torch.jit.script(tp)(x, x, torch.randn(tp.weight_numel))
    assert tp(x, x, torch.randn(1, tp.weight_numel)).shape == (2, 3)
