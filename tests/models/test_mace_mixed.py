"""Mixed precision in the MACE models: the symmetric contraction with half operands,
``MACE.set_precision("bf16-mixed" / "fp16-mixed")`` against the float64 model, gradients into the
float32 master parameters, a force-training step, the load/calculator options and their errors.

On CPU the models run on the reference backend (float16 and bfloat16); the symmetric
contraction's generated kernels run in Triton's interpreter in float16 only (the interpreter
cannot run bfloat16). Tolerances are for a small random model (16 channels, l <= 1, correlation 3)
on rattled cells; ``benchmarks/mixed_accuracy.py`` measures the MACE-MP-medium shape.
"""
import copy

import pytest
import torch
from ase.build import bulk, molecule

from equikernels.models import atoms_to_data, load, save
from equikernels.models import blocks as model_blocks
from equikernels.models.builder import coupled_u_matrices, mace_config, random_model
from equikernels.models.symmetric_contraction import SymmetricContraction

Z = [1, 6, 8, 29]
# |E - E_fp64| per atom (eV) and ||F - F_fp64|| / ||F_fp64|| allowed per precision
TOL = {"fp32": (1e-6, 1e-5), "fp16-mixed": (1e-3, 3e-3), "bf16-mixed": (1e-2, 2e-2)}


def _rel(a, b) -> float:
    a, b = a.detach().double(), b.detach().double()
    return float((a - b).norm() / b.norm().clamp_min(1e-300))


# --- symmetric contraction ------------------------------------------------------------------------
def _sc(backend, dtype=torch.float32, seed=0):
    us = coupled_u_matrices("2x0e+2x1o", "2x0e+2x1o", 2)
    torch.manual_seed(seed)
    sc = SymmetricContraction(2, [0, 1], [0, 1], [2, 2], 3, [[u.to(dtype) for u in per] for per in us],
                              backend=backend)
    return sc.to(dtype)


@pytest.mark.parametrize("backend", ["reference", "triton"])
def test_contraction_half_features_float32_weights(backend, monkeypatch):
    """x float16, weights float32: out in float16, d/dx in float16, d/dW in float32 at float32
    accuracy (before: the weight gradient was written in float16 and upcast), and several chunks
    add into a float32 buffer that is rounded once."""
    monkeypatch.setenv("EQUIKERNELS_MAX_PATHS", "3")  # several generated kernels per table
    sc = _sc(backend)
    sc64 = _sc("reference", torch.float64)
    sc64.load_state_dict(sc.state_dict())
    launched = []
    if backend == "triton":
        from equikernels.codegen import tp as codegen_tp
        real = codegen_tp.Kernel.launch

        def spy(self, tensors, outputs, *a, **k):
            launched.extend(t.dtype for t in outputs.values())
            return real(self, tensors, outputs, *a, **k)
        monkeypatch.setattr(codegen_tp.Kernel, "launch", spy)
    el = torch.tensor([0, 1, 2, 2, 0, 1, 1])
    x = torch.randn(7, 8, dtype=torch.float64).half().requires_grad_()
    x64 = x.detach().double().requires_grad_()
    out, ref = sc(x, el), sc64(x64, el)
    assert out.dtype == torch.float16
    assert _rel(out, ref) <= 1e-3
    if backend == "triton":
        assert len(sc.table.paths) > 3 and launched and set(launched) == {torch.float32}, launched
    g = torch.randn(ref.shape, dtype=torch.float64).half()
    grads = torch.autograd.grad(out, [x, *sc.parameters()], g, create_graph=True)
    grads64 = torch.autograd.grad(ref, [x64, *sc64.parameters()], g.double(), create_graph=True)
    assert grads[0].dtype == torch.float16 and _rel(grads[0], grads64[0]) <= 1e-3
    for a, b in zip(grads[1:], grads64[1:]):
        assert a.dtype == torch.float32
        assert _rel(a, b) <= 1e-5, f"weight gradient: {_rel(a, b):.2e} (rounded to float16 on the way?)"
    # second order (force training): d/dx and d/dW of a loss on the first-order gradients
    loss, loss64 = (grads[0].float() ** 2).sum(), (grads64[0] ** 2).sum()
    sec = torch.autograd.grad(loss, [x, *sc.parameters()])
    sec64 = torch.autograd.grad(loss64, [x64, *sc64.parameters()])
    assert sec[0].dtype == torch.float16 and all(s.dtype == torch.float32 for s in sec[1:])
    assert max(_rel(a, b) for a, b in zip(sec, sec64)) <= 3e-3


def test_contraction_half_weights_sum_per_element_in_float32():
    """float16 weights: each element's weight gradient is a sum over its nodes, taken in float32
    (gathered from a float32 copy, then rounded), and accurate to float16 rounding."""
    sc = _sc("reference").half()
    assert sc.node_weights(torch.tensor([0, 1])).grad_fn.name() == "ToCopyBackward0"
    sc64 = _sc("reference", torch.float64)
    sc64.load_state_dict(sc.state_dict())
    el = torch.zeros(3000, dtype=torch.int64)
    x = (torch.rand(3000, 8, dtype=torch.float64) + 0.5).half()
    out, ref = sc(x, el), sc64(x.double(), el)
    w, w64 = next(iter(sc.parameters())), next(iter(sc64.parameters()))
    (gw,), (gw64,) = torch.autograd.grad(out.float().sum(), [w]), torch.autograd.grad(ref.sum(), [w64])
    assert gw.dtype == torch.float16
    assert _rel(gw, gw64) <= 1e-3, f"{_rel(gw, gw64):.2e}"


def test_contraction_rejects_float64_with_half():
    sc = _sc("reference", torch.float64)
    with pytest.raises(TypeError, match="do not mix"):
        sc(torch.randn(3, 8).half(), torch.zeros(3, dtype=torch.int64))


# --- the model --------------------------------------------------------------------------------------
def _config(**kw):
    args = dict(r_max=4.5, num_bessel=8, num_polynomial_cutoff=5, max_ell=2,
                interaction="RealAgnosticResidualInteractionBlock",
                interaction_first="RealAgnosticResidualInteractionBlock", num_interactions=2, atomic_numbers=Z,
                hidden_irreps="16x0e+16x1o", MLP_irreps="16x0e", avg_num_neighbors=15.0, correlation=3,
                radial_MLP=[32, 32])
    args.update(kw)
    return mace_config(**args)


@pytest.fixture(scope="module")
def model64():
    return random_model(_config(), seed=3, dtype=torch.float64)


def _structures():
    cu = bulk("Cu", "fcc", a=3.6, cubic=True).repeat((2, 1, 1))
    cu.rattle(0.08, seed=1)
    mixed = bulk("Cu", "fcc", a=3.6, cubic=True).repeat((2, 1, 1))
    mixed.numbers[[0, 3, 5]] = [1, 6, 8]
    mixed.rattle(0.1, seed=2)
    mol = molecule("CH3CH2OH")
    mol.rattle(0.05, seed=3)
    return [cu, mixed, mol]


def _eval(model, atoms, dtype, **kw):
    data = atoms_to_data(atoms, float(model.r_max), Z, dtype=dtype)
    return model(data, **kw)


@pytest.mark.parametrize("precision", ["fp32", "fp16-mixed", "bf16-mixed"])
def test_energy_forces_close_to_float64(model64, precision, monkeypatch):
    model = copy.deepcopy(model64).set_precision(precision)
    assert model.precision == precision and next(model.parameters()).dtype == torch.float32
    seen = []
    real = model_blocks.tensor_product_conv

    def spy(problem, x, y, w, *a, **k):
        seen.append((x.dtype, y.dtype, w.dtype))
        return real(problem, x, y, w, *a, **k)
    monkeypatch.setattr(model_blocks, "tensor_product_conv", spy)
    e_tol, f_tol = TOL[precision]
    for atoms in _structures():
        ref = _eval(model64, atoms, torch.float64, compute_stress=atoms.pbc.all())
        del seen[:]
        out = _eval(model, atoms, torch.float32, compute_stress=atoms.pbc.all())
        for k in ("energy", "forces", "node_energy", "node_feats"):
            assert out[k].dtype in (torch.float32, torch.float64), k  # no half-precision outputs
        de = abs(float(out["energy"]) - float(ref["energy"])) / len(atoms)
        assert de <= e_tol, f"{precision} {atoms.get_chemical_formula()}: energy {de * 1e3:.3f} meV/atom"
        df = _rel(out["forces"], ref["forces"])
        assert df <= f_tol, f"{precision} {atoms.get_chemical_formula()}: forces {df:.2e}"
        if atoms.pbc.all():
            assert _rel(out["stress"], ref["stress"]) <= 5 * f_tol
    half = {"fp32": torch.float32, "fp16-mixed": torch.float16, "bf16-mixed": torch.bfloat16}[precision]
    # node operand and per-edge weights in the half type, spherical harmonics in float32
    assert seen and set(seen) == {(half, torch.float32, half)}, seen


def test_fp32_precision_is_plain_float32(model64):
    a = copy.deepcopy(model64).float()
    b = copy.deepcopy(model64).to_mixed_precision(torch.float16).set_precision("fp32")
    assert b.compute_dtype is None
    atoms = _structures()[1]
    oa, ob = _eval(a, atoms, torch.float32), _eval(b, atoms, torch.float32)
    assert torch.equal(oa["energy"], ob["energy"]) and torch.equal(oa["forces"], ob["forces"])


@pytest.mark.parametrize("precision", ["fp16-mixed", "bf16-mixed"])
def test_training_step_float32_masters(model64, precision):
    """Energy + force loss: every gradient arrives in the float32 parameters, close to the float64
    model's, and an optimiser step lowers the loss."""
    atoms = _structures()[1]
    model = copy.deepcopy(model64).set_precision(precision).train()
    ref_model = copy.deepcopy(model64).train()
    target_f = torch.randn(len(atoms), 3, generator=torch.Generator().manual_seed(0), dtype=torch.float64)

    def loss_of(m, dtype):
        out = _eval(m, atoms, dtype, training=True)
        return (out["energy"].sum() / len(atoms) - 1.0) ** 2 + ((out["forces"] - target_f.to(dtype)) ** 2).mean()

    loss, loss64 = loss_of(model, torch.float32), loss_of(ref_model, torch.float64)
    loss.backward()
    loss64.backward()
    params = dict(model.named_parameters())
    # per parameter (some, e.g. degree-3 weights of a rare element, are tiny and noisier), and all together
    tol, tol_all = (0.15, 0.03) if precision == "bf16-mixed" else (0.03, 0.005)
    checked, got, want = 0, [], []
    for name, p64 in ref_model.named_parameters():
        p = params[name]
        assert p.dtype == torch.float32
        if p64.grad is None or float(p64.grad.norm()) == 0.0:
            continue
        assert p.grad is not None and p.grad.dtype == torch.float32, name
        assert torch.isfinite(p.grad).all(), name
        assert _rel(p.grad, p64.grad) <= tol, f"{name}: {_rel(p.grad, p64.grad):.2e}"
        got.append(p.grad.flatten())
        want.append(p64.grad.flatten())
        checked += 1
    assert checked >= 10
    assert _rel(torch.cat(got), torch.cat(want)) <= tol_all, f"all gradients: {_rel(torch.cat(got), torch.cat(want)):.2e}"
    opt = torch.optim.SGD(model.parameters(), lr=1e-3)
    opt.step()
    assert float(loss_of(model, torch.float32)) < float(loss)


def test_load_and_calculator_options(model64, tmp_path):
    from equikernels.calculators import MACECalculator

    path = tmp_path / "m.ek"
    save(model64, path)
    m = load(path, precision="bf16")
    assert m.precision == "bf16-mixed" and m.atomic_energies.dtype == torch.float32
    with pytest.raises(ValueError, match="disagree"):
        load(path, dtype=torch.float64, precision="bf16-mixed")
    atoms = _structures()[0]
    calc = MACECalculator(load(path), device="cpu", precision="fp16-mixed", cuda_graph=False)
    assert calc.model.precision == "fp16-mixed" and calc.dtype == torch.float32
    ref = _eval(model64, atoms, torch.float64)
    atoms.calc = calc
    assert abs(atoms.get_potential_energy() - float(ref["energy"])) / len(atoms) <= TOL["fp16-mixed"][0]
    with pytest.raises(ValueError, match="disagree"):
        MACECalculator(load(path), device="cpu", precision="bf16-mixed", default_dtype="float64")


def test_bad_precision(model64):
    m = copy.deepcopy(model64)
    with pytest.raises(ValueError, match="precision: expected one of"):
        m.set_precision("int8")
    with pytest.raises(ValueError, match="torch.bfloat16 or torch.float16"):
        m.to_mixed_precision(torch.float32)
    m.to_mixed_precision().double()  # converted behind its back
    with pytest.raises(TypeError, match="needs float32 parameters"):
        _eval(m, _structures()[2], torch.float64)


# --- GPU ------------------------------------------------------------------------------------------
@pytest.mark.gpu
@pytest.mark.parametrize("precision", ["fp16-mixed", "bf16-mixed"])
def test_mixed_model_cuda(model64, precision):
    """Generated kernels (conv, contraction) in half precision on the GPU vs the float64 model on CPU."""
    model = copy.deepcopy(model64).set_precision(precision).cuda()
    e_tol, f_tol = TOL[precision]
    for atoms in _structures():
        ref = _eval(model64, atoms, torch.float64)
        data = atoms_to_data(atoms, float(model.r_max), Z, dtype=torch.float32, device="cuda")
        out = model(data, training=True)
        assert abs(float(out["energy"]) - float(ref["energy"])) / len(atoms) <= e_tol
        assert _rel(out["forces"].cpu(), ref["forces"]) <= f_tol
        # force training on the GPU: double backward through the half-precision kernels
        (out["forces"] ** 2).sum().backward()
        assert all(p.grad is None or (p.grad.dtype == torch.float32 and torch.isfinite(p.grad).all())
                   for p in model.parameters())
        model.zero_grad()


@pytest.mark.gpu
def test_contraction_bf16_cuda():
    sc = _sc("triton").cuda()
    sc64 = _sc("reference", torch.float64)
    sc64.load_state_dict(sc.state_dict())
    el = torch.randint(0, 3, (300,))
    x = torch.randn(300, 8, dtype=torch.float64).bfloat16()
    out = sc(x.cuda().requires_grad_(), el.cuda())
    ref = sc64(x.double(), el)
    assert out.dtype == torch.bfloat16 and _rel(out.cpu(), ref) <= 1e-2
    (gw,) = torch.autograd.grad(out.float().sum(), [next(iter(sc.parameters()))])
    (gw64,) = torch.autograd.grad(ref.sum(), [next(iter(sc64.parameters()))])
    assert gw.dtype == torch.float32 and _rel(gw.cpu(), gw64) <= 1e-5


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
def test_half_model_stress_close_to_float64(model64, dtype):
    atoms = _structures()[0]
    ref = _eval(model64, atoms, torch.float64, compute_stress=True)["stress"]
    out = _eval(copy.deepcopy(model64).to(dtype), atoms, dtype, compute_stress=True)["stress"]
    assert out.dtype == dtype and _rel(out, ref) <= 0.1


def test_half_cell_volume_above_the_float16_range():
    from equikernels.models.mace import _volumes

    cell = (torch.eye(3, dtype=torch.float64) * 50.0).to(torch.float16)  # 125,000 A^3 > float16's 65,504
    assert float(_volumes(cell)) == 125000.0
