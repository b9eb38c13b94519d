"""Parity of ``equikernels.ops.tensor_product`` with ``e3nn.o3.TensorProduct``.

The oracle is an e3nn module built under float64 default dtype (its CG buffers are then exact to
float64). Outputs and the gradients with respect to x, y and the weights (for a random cotangent)
must agree to 1e-10 (float64) / 1e-5 (float32, compared with the float64 e3nn result on the same
inputs upcast). Errors are max|a - b| / max|b|.
"""
import collections

import pytest
import torch

from equikernels.catalog import standard_problems
from problems import (NORMALIZATION_PAIRS, describe, e3nn_forward_backward, e3nn_tp, ek_forward_backward,
                      ir_mul_to_mul_ir, mul_ir_to_ir_mul, problem_of, random_inputs, random_problem, rel_err,
                      supported_modes)

pytestmark = pytest.mark.usefixtures("single_thread")

N_RANDOM = 200
TOL = {torch.float64: 1e-10, torch.float32: 1e-5}
NAMES = ("out", "grad_x", "grad_y", "grad_weight")
BATCHES = ((5,), (2, 3), (1,), (4,))


def check_parity(kw, batch=(5,), dtypes=(torch.float64, torch.float32), layouts=("mul_ir",), seed=0,
                 device="cpu", backend=None):
    """Compare every (dtype, layout) with a float64 e3nn evaluation; return the errors."""
    p = problem_of(kw)
    tp = e3nn_tp(kw, torch.float64)
    assert p.weight_numel == tp.weight_numel, describe(kw)
    assert p.dim_out == tp.irreps_out.dim
    inputs = random_inputs(p, batch, torch.float64, seed=seed)
    g0 = torch.randn(batch + (p.dim_out,), dtype=torch.float64, generator=torch.Generator().manual_seed(seed + 1))
    errors = {}
    for dtype in dtypes:
        # the oracle sees exactly the (rounded) inputs the kernel sees, upcast to float64
        x, y, w, g = (t.to(dtype).to(torch.float64) for t in inputs + (g0,))
        ref = e3nn_forward_backward(tp, x, y, w, g)
        for layout in layouts:
            xi, yi, gi = x, y, g
            if layout == "ir_mul":
                xi, yi = mul_ir_to_ir_mul(x, kw["irreps_in1"]), mul_ir_to_ir_mul(y, kw["irreps_in2"])
                gi = mul_ir_to_ir_mul(g, kw["irreps_out"])
            args = [t.to(device=device, dtype=dtype) for t in (xi, yi, w, gi)]
            got = [t.cpu() for t in ek_forward_backward(p, *args, layout=layout, backend=backend)]
            assert got[0].dtype == dtype, f"output dtype {got[0].dtype}, expected {dtype}"
            if layout == "ir_mul":
                got[0] = ir_mul_to_mul_ir(got[0], kw["irreps_out"])
                got[1] = ir_mul_to_mul_ir(got[1], kw["irreps_in1"])
                got[2] = ir_mul_to_mul_ir(got[2], kw["irreps_in2"])
            errs = {n: rel_err(a, b) for n, a, b in zip(NAMES, got, ref)}
            bad = {n: e for n, e in errs.items() if not e <= TOL[dtype]}
            assert not bad, f"{dtype} {layout}: errors {bad} exceed {TOL[dtype]:g} for {describe(kw)}"
            errors[(dtype, layout)] = errs
    return errors


# --- random problems ----------------------------------------------------------------------------
@pytest.mark.parametrize("seed", range(N_RANDOM))
def test_random_problem(seed):
    kw = random_problem(seed)
    layouts = ("mul_ir", "ir_mul") if seed % 2 == 0 else ("mul_ir",)
    check_parity(kw, batch=BATCHES[seed % len(BATCHES)], layouts=layouts, seed=seed)


def test_random_problems_cover_the_space():
    """The generator really draws every mode, normalisation pair, weight sharing and option."""
    seen = collections.defaultdict(set)
    for seed in range(N_RANDOM):
        kw = random_problem(seed)
        seen["norm"].add((kw["irrep_normalization"], kw["path_normalization"]))
        seen["shared"].add(kw["shared_weights"])
        seen["var"].add("in1_var" in kw)
        outs = collections.Counter(i[2] for i in kw["instructions"])
        seen["shared_out_segment"].add(max(outs.values()) > 1)
        seen["unused_out_segment"].add(len(outs) < len(problem_of(kw).irreps_out))
        for ins in kw["instructions"]:
            seen["mode"].add(ins[3])
            seen["has_weight"].add((ins[3], ins[4]))
            seen["path_weight"].add(len(ins) == 6)
        p = problem_of(kw)
        seen["max_l"].add(max(l for _, l, _ in p.irreps_in1 + p.irreps_in2))
        seen["mul"].update(m for m, _, _ in p.irreps_in1 + p.irreps_in2)
    assert seen["mode"] == set(supported_modes())
    assert seen["norm"] == set(NORMALIZATION_PAIRS)
    for key in ("shared", "var", "shared_out_segment", "unused_out_segment", "path_weight"):
        assert seen[key] == {True, False}, key
    for mode in ("uvu", "uvv", "uuw", "uuu", "uvuv"):
        assert {(mode, True), (mode, False)} <= seen["has_weight"], mode
    assert max(seen["max_l"]) == 5
    assert min(seen["mul"]) == 1 and max(seen["mul"]) == 17


@pytest.mark.parametrize("mode", supported_modes())
@pytest.mark.parametrize("norm", NORMALIZATION_PAIRS, ids=lambda n: "-".join(n))
def test_every_mode_and_normalisation(mode, norm):
    """Each mode under each normalisation pair, shared and per-row (first instruction forced)."""
    for shared in (True, False):
        seed = 1000 + 17 * supported_modes().index(mode) + NORMALIZATION_PAIRS.index(norm) + 500 * shared
        kw = random_problem(seed, force_mode=mode, normalization=norm, shared=shared, max_instructions=2)
        assert kw["instructions"][0][3] == mode
        check_parity(kw, batch=(3,), dtypes=(torch.float64,), seed=seed)


# --- the standard problems --------------------------------------------------------------------
@pytest.mark.parametrize("name", sorted(standard_problems()))
def test_standard_problem(name):
    check_parity(standard_problems()[name], batch=(7,), layouts=("mul_ir", "ir_mul"))


# --- edge cases ---------------------------------------------------------------------------------
EDGE_CASES = {
    "zero-mul-input": dict(irreps_in1="0x1o+3x0e", irreps_in2="2x1o", irreps_out="3x1e+2x1o",
                           instructions=[(0, 0, 0, "uvw", True), (1, 0, 1, "uvw", True), (1, 0, 1, "uvv", True)]),
    "zero-mul-output": dict(irreps_in1="3x1e", irreps_in2="2x1e", irreps_out="0x0e+4x1e",
                            instructions=[(0, 0, 0, "uvw", True), (0, 0, 1, "uvw", True)]),
    "no-instructions": dict(irreps_in1="2x0e", irreps_in2="2x1o", irreps_out="3x1o", instructions=[]),
    "zero-path-weight": dict(irreps_in1="2x1o", irreps_in2="1x1o", irreps_out="2x0e+2x2e",
                             instructions=[(0, 0, 0, "uvu", True, 0.0), (0, 0, 1, "uvu", True, 2.0)]),
    "l5-x-l5": dict(irreps_in1="3x5e", irreps_in2="2x5o", irreps_out="2x5o+1x0o+1x1o",
                    instructions=[(0, 0, 0, "uvw", True), (0, 0, 1, "uvw", True), (0, 0, 2, "uvw", True)],
                    irrep_normalization="norm", path_normalization="path"),
    "unweighted-only": dict(irreps_in1="4x2e+1x0e", irreps_in2="4x1o", irreps_out="4x1o+1x3o+4x2o",
                            instructions=[(0, 0, 0, "uuu", False), (0, 0, 1, "uuw", False),
                                          (1, 0, 0, "uvv", False), (0, 0, 2, "uvu", False)]),
    "one-output-many-paths": dict(irreps_in1="2x0e+2x1o+2x2e", irreps_in2="0e+1o", irreps_out="2x1o",
                                  instructions=[(0, 1, 0, "uvu", True), (1, 0, 0, "uvu", True),
                                                (2, 1, 0, "uvu", True), (2, 1, 0, "uvu", False)],
                                  in1_var=[1.0, 2.0, 0.5], in2_var=[3.0, 0.25], out_var=[1.5]),
}


@pytest.mark.parametrize("shared", [True, False], ids=["shared", "per-row"])
@pytest.mark.parametrize("name", sorted(EDGE_CASES))
def test_edge_case(name, shared):
    kw = dict(EDGE_CASES[name], shared_weights=shared, internal_weights=False)
    check_parity(kw, batch=(4,), layouts=("mul_ir", "ir_mul"))


def test_unused_output_is_zero():
    """Output irreps that no instruction writes are exactly zero (and get zero gradient)."""
    kw = dict(EDGE_CASES["zero-path-weight"], shared_weights=True, internal_weights=False)
    p = problem_of(kw)
    x, y, w = random_inputs(p, (3,))
    out = ek_forward_backward(p, x, y, w, torch.ones(3, p.dim_out, dtype=torch.float64))[0]
    assert torch.count_nonzero(out[:, :2]) == 0
    assert torch.count_nonzero(out[:, 2:]) == out[:, 2:].numel()


def test_broadcast_batch_dims():
    """Leading dimensions broadcast like e3nn's; compared with e3nn on explicitly expanded inputs."""
    kw = dict(random_problem(3), shared_weights=False)
    p = problem_of(kw)
    tp = e3nn_tp(kw)
    gen = torch.Generator().manual_seed(0)
    x = torch.randn(4, 1, p.dim_in1, dtype=torch.float64, generator=gen)
    y = torch.randn(1, 3, p.dim_in2, dtype=torch.float64, generator=gen)
    w = torch.randn(3, p.weight_numel, dtype=torch.float64, generator=gen)
    from equikernels.ops import tensor_product

    out = tensor_product(p, x, y, w)
    assert out.shape == (4, 3, p.dim_out)
    ref = tp(x.expand(4, 3, -1), y.expand(4, 3, -1), w.expand(4, 3, -1))
    assert rel_err(out, ref) <= 1e-10


# --- the same on CUDA (Triton when available) ---------------------------------------------------
@pytest.mark.gpu
@pytest.mark.parametrize("layout", ("mul_ir", "ir_mul"))
@pytest.mark.parametrize("dtype", (torch.float64, torch.float32), ids=("float64", "float32"))
@pytest.mark.parametrize("seed", range(0, N_RANDOM, 5))
def test_random_problem_cuda(seed, dtype, layout):
    # one (dtype, layout) per test: a high-order problem's kernels take minutes to build, in parallel runs
    kw = random_problem(seed)
    check_parity(kw, batch=BATCHES[seed % len(BATCHES)], dtypes=(dtype,), layouts=(layout,), seed=seed,
                 device="cuda")


@pytest.mark.gpu
@pytest.mark.parametrize("name", sorted(standard_problems()))
def test_standard_problem_cuda(name):
    check_parity(standard_problems()[name], batch=(33,), layouts=("mul_ir", "ir_mul"), device="cuda")
