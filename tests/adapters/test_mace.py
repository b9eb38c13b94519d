"""accelerate() on a mace-torch model (random weights): interaction blocks fused through mace-torch's
conv_fusion hook and the symmetric contraction as equikernels path tables; evaluated through
mace-torch's own forward and MACECalculator, equal to the unmodified model to second order in
float64; the state_dict still loads into plain mace-torch."""
import copy
import io

import numpy as np
import pytest
import torch

pytestmark = pytest.mark.mace
mace = pytest.importorskip("mace")

import equikernels as ek  # noqa: E402
from equikernels.adapters.classes import original_class  # noqa: E402
from mace_torch_cases import TOL, ZS, mace_batch, random_mace, rattled_atoms, rel  # noqa: E402


def layers_only(model):
    """The accelerated model's layers through mace-torch's own forward (the whole-model path bypassed)."""
    return lambda *a, **k: original_class(model).forward(model, *a, **k)


def _second_order(model, batch, call=None):
    batch = {k: (v.clone() if torch.is_tensor(v) else v) for k, v in batch.items()}
    out = (call or model)(batch, training=True, compute_force=True, compute_stress=True)
    loss = out["forces"].pow(2).sum()  # force-matching loss: its parameter gradient is the double backward
    grads = torch.autograd.grad(loss, [p for p in model.parameters() if p.requires_grad], allow_unused=True)
    return out["energy"].detach(), out["forces"].detach(), out["stress"].detach(), grads


def test_mace_torch_model_triton_kernels(monkeypatch, single_thread):
    """The generated kernels (Triton's interpreter on CPU) in the accelerated mace-torch model: energy
    and forces (second order of the fused layers is covered by the reference-backend test)."""
    monkeypatch.setenv("EQUIKERNELS_BACKEND", "triton")
    torch.set_default_dtype(torch.float64)
    model = random_mace(correlation=2, num_interactions=1)
    batch = mace_batch(rattled_atoms())
    ref = model(dict(batch), compute_force=True)
    report = ek.accelerate(model)
    assert {"", "interactions.0", "products.0.symmetric_contractions"} <= set(report.fused_names), str(report)
    for call in (model, layers_only(model)):
        out = call(dict(batch), compute_force=True)
        assert rel(out["energy"], ref["energy"]) < TOL and rel(out["forces"], ref["forces"]) < TOL


def test_mace_torch_model_accelerated(monkeypatch, single_thread):
    monkeypatch.setenv("EQUIKERNELS_BACKEND", "reference")  # the fused convolution (the CPU backend does not fuse)
    torch.set_default_dtype(torch.float64)
    model = random_mace()
    plain = copy.deepcopy(model)
    batch = mace_batch(rattled_atoms())
    e_ref, f_ref, s_ref, g_ref = _second_order(plain, batch)
    keys = list(model.state_dict())
    classes = {n: type(m).__name__ for n, m in model.named_modules() if type(m).__module__.startswith("mace.")}

    report = ek.accelerate(model)
    fused = report.fused_names
    assert {"", "interactions.0", "interactions.1", "products.0.symmetric_contractions",
            "products.1.symmetric_contractions", "interactions.0.skip_tp", "interactions.1.skip_tp"} <= set(fused), str(report)
    assert not report.not_fused, str(report)
    assert list(model.state_dict()) == keys
    modules = dict(model.named_modules())
    assert {n: type(modules[n]).__name__ for n in classes} == classes  # mace-torch's layers keep their classes

    for call in (model, layers_only(model)):
        e, f, s, g = _second_order(model, batch, call)
        assert rel(e, e_ref) < TOL and rel(f, f_ref) < TOL and rel(s, s_ref) < TOL
        for a, b in zip(g, g_ref):
            if b is not None:
                assert rel(a, b) < TOL

    # mace-torch's own calculator on the accelerated model object
    from mace.calculators import MACECalculator  # noqa: PLC0415

    atoms = rattled_atoms()
    res = {}
    for name, m in (("plain", plain), ("fast", model)):
        atoms.calc = MACECalculator(models=m, device="cpu", default_dtype="float64")
        res[name] = (atoms.get_potential_energy(), atoms.get_forces(), atoms.get_stress())
    for a, b in zip(res["fast"], res["plain"]):
        assert np.abs(np.asarray(a) - np.asarray(b)).max() <= TOL * max(1.0, np.abs(np.asarray(b)).max())


def test_model_from_mace_cannot_read_runs_its_layers_accelerated(monkeypatch, single_thread):
    """Non-linear residual interaction blocks (from_mace refuses them): the whole model keeps mace-torch's
    forward, its convolutions and contractions run fused, equal to the unmodified model to second order."""
    monkeypatch.setenv("EQUIKERNELS_BACKEND", "reference")
    torch.set_default_dtype(torch.float64)
    kind = "RealAgnosticResidualNonLinearInteractionBlock"
    model = random_mace(correlation=2, interaction=kind, first=kind)
    plain = copy.deepcopy(model)
    batch = mace_batch(rattled_atoms())
    e_ref, f_ref, s_ref, g_ref = _second_order(plain, batch)
    report = ek.accelerate(model)
    assert {"interactions.0", "interactions.1", "products.0.symmetric_contractions"} <= set(report.fused_names)
    assert "" not in report.fused_names and kind in str(report), str(report)
    e, f, s, g = _second_order(model, batch)
    assert rel(e, e_ref) < TOL and rel(f, f_ref) < TOL and rel(s, s_ref) < TOL
    assert all(rel(a, b) < TOL for a, b in zip(g, g_ref) if b is not None)


def test_mace_state_dict_and_pickle(single_thread):
    torch.set_default_dtype(torch.float64)
    model = random_mace(seed=2)
    batch = mace_batch(rattled_atoms())
    ek.accelerate(model)
    e_fast = model(dict(batch), compute_force=False)["energy"].detach()
    fresh = random_mace(seed=3)  # plain mace-torch, other weights
    fresh.load_state_dict(model.state_dict())
    assert rel(fresh(dict(batch), compute_force=False)["energy"].detach(), e_fast) < TOL
    buf = io.BytesIO()
    torch.save(model, buf)  # mace-torch's .model files are pickled modules
    buf.seek(0)
    loaded = torch.load(buf, weights_only=False)
    assert type(loaded.products[0].symmetric_contractions).__name__ == "SymmetricContraction"
    assert rel(loaded(dict(batch), compute_force=False)["energy"].detach(), e_fast) < TOL
    assert not ek.accelerate(model).fused  # nothing left to do on a second call


def test_mace_skip_product_runs_per_element(monkeypatch, single_thread):
    """skip_tp on one-hot attributes runs as ElementLinear on its own weight (the original product is
    not called), equal to the plain product to second order in the features and weight; attributes
    that are not exactly one-hot, or that carry a gradient, take the original product."""
    torch.set_default_dtype(torch.float64)
    model = random_mace(seed=4)
    plain = copy.deepcopy(model)
    ek.accelerate(model)
    skip, ref = model.interactions[1].skip_tp, plain.interactions[1].skip_tp
    assert type(skip).__name__ == type(ref).__name__ and list(skip.state_dict()) == list(ref.state_dict())
    torch.manual_seed(0)
    x = torch.randn(7, ref.irreps_in1.dim)
    one_hot = torch.nn.functional.one_hot(torch.tensor([2, 0, 2, 1, 0, 2, 2]), len(ZS)).double()
    mixed = one_hot.clone()
    mixed[3] = torch.tensor([0.25, 0.5, 0.25])

    def second_order(tp, y):
        xs = x.clone().requires_grad_()
        out = tp(xs, y)
        gx, gw = torch.autograd.grad(out.pow(2).sum(), [xs, tp.weight], create_graph=True)
        return [out] + list(torch.autograd.grad((gx.pow(2).sum() + gw.pow(3).sum()), [xs, tp.weight])) + [gx, gw]

    base = type(skip).__mro__[1]
    original = base.forward
    monkeypatch.setattr(base, "forward", lambda *a, **k: (_ for _ in ()).throw(AssertionError("original product called")))
    for a, b in zip(second_order(skip, one_hot), [None] * 5):
        assert b is None and torch.isfinite(a).all()
    monkeypatch.setattr(base, "forward", original)
    for a, b in zip(second_order(skip, one_hot), second_order(ref, one_hot)):
        assert rel(a.detach(), b.detach()) < TOL
    assert rel(skip(x, mixed), ref(x, mixed)) < TOL  # not one-hot: the original product
    y = one_hot.clone().requires_grad_()
    gy = torch.autograd.grad(skip(x, y).sum(), y)[0]
    assert rel(gy, torch.autograd.grad(ref(x, y).sum(), y)[0]) < TOL


def test_mace_contraction_weights_by_element(single_thread):
    """The accelerated symmetric contraction (the CPU backend's evaluation) equals mace-torch's to
    second order for one-hot attributes (weights selected per element) and for mixed ones (weights
    summed over the attributes); with frozen weights the kept weight table follows an in-place
    change of a weight."""
    torch.set_default_dtype(torch.float64)
    model = random_mace(seed=5)
    plain = copy.deepcopy(model)
    ek.accelerate(model)
    sc, ref = model.products[1].symmetric_contractions, plain.products[1].symmetric_contractions
    torch.manual_seed(1)
    x = torch.randn(5, sc.contractions[0].num_features, sum(ir.dim for _, ir in ref.irreps_in))
    one_hot = torch.nn.functional.one_hot(torch.tensor([1, 0, 2, 1, 1]), len(ZS)).double()
    mixed = one_hot.clone()
    mixed[2] = torch.tensor([0.5, 0.25, 0.25])
    for y in (one_hot, mixed):
        assert rel(sc(x, y), ref(x, y)) < TOL

    def second_order(c, y):  # d/d(x, W) of a loss on d(out)/dx: the force-training derivative
        xs = x.clone().requires_grad_()
        w = c.contractions[0].weights_max
        gx = torch.autograd.grad(c(xs, y).pow(2).sum(), xs, create_graph=True)[0]
        return torch.autograd.grad(gx.pow(2).sum(), [xs, w])

    for y in (one_hot, mixed):
        for a, b in zip(second_order(sc, y), second_order(ref, y)):
            assert rel(a, b) < TOL
    for m in (model, plain):
        m.requires_grad_(False)
    assert rel(sc(x, one_hot), ref(x, one_hot)) < TOL
    assert sc.__dict__.get("_ek_table") is not None  # frozen: the table is kept, not concatenated per call
    with torch.no_grad():
        for c in (sc, ref):
            c.contractions[0].weights_max.mul_(-2.0)
    assert rel(sc(x, one_hot), ref(x, one_hot)) < TOL
