"""equikernels.bench.train: the timed training step trains the model it is given."""
import pytest
import torch

pytestmark = pytest.mark.mace
pytest.importorskip("mace")


@pytest.mark.parametrize("impl,precision,stress", [("equikernels", "fp32", False), ("equikernels", "bf16-mixed", False),
                                                   ("mace-e3nn", "fp32", False), ("equikernels", "fp32", True),
                                                   ("mace-e3nn", "fp32", True)])
def test_step_trains_the_model_and_matches_the_float64_forces(impl, precision, stress):
    from equikernels.bench import mace as MC
    from equikernels.bench import train as TR

    cpu = torch.device("cpu")
    ref64 = MC.mace_model(10.0, **MC.TINY)
    before = {k: v.clone() for k, v in ref64.state_dict().items()}
    atoms = MC.cu_atoms(1008)[:16]
    data = MC.graph(atoms, 6.0, MC.Z_ALL, torch.float32, cpu)
    ref = MC.step(MC.build("mace-e3nn", ref64, torch.float64, cpu), MC.graph(atoms, 6.0, MC.Z_ALL, torch.float64,
                                                                             cpu), stress)
    model = TR.train_model(impl, ref64, precision, cpu)
    assert model.training and all(p.requires_grad and p.dtype == torch.float32 for p in model.parameters())
    errs = MC.errors(TR.forward(model, data, stress), ref, stress)
    assert set(errs) == ({"energy", "forces", "stress"} if stress else {"energy", "forces"})
    assert max(errs.values()) < (1e-4 if precision == "fp32" else 5e-2)
    params = {n: p.detach().clone() for n, p in model.named_parameters()}
    step = TR.step_call(model, data, stress, lr=1e-2)
    losses = [float(step(i)) for i in range(3)]
    assert all(torch.isfinite(torch.tensor(losses)))
    if stress:  # the loss has the stress term, and it reaches the parameters
        out = TR.forward(model, data, True)
        unit = dict(out, stress=torch.ones_like(out["stress"]))
        assert float(TR.loss_of(unit, len(atoms), True) - TR.loss_of(unit, len(atoms))) == pytest.approx(1.0)
        grads = torch.autograd.grad(out["stress"].pow(2).sum(), list(model.parameters()), allow_unused=True)
        assert sum(1 for g in grads if g is not None and bool(g.abs().sum() > 0)) > len(grads) // 2
    moved = [n for n, p in model.named_parameters() if not torch.equal(p.detach(), params[n])]
    assert len(moved) == len(params)  # Adam moved every parameter
    assert all(torch.equal(before[k], v) for k, v in ref64.state_dict().items())  # the source is left as it was


def test_mixed_precision_only_for_equikernels():
    from equikernels.bench import mace as MC
    from equikernels.bench import train as TR

    with pytest.raises(ValueError, match="only the equikernels model"):
        TR.train_model("mace-e3nn", MC.mace_model(10.0, **MC.TINY), "bf16-mixed", torch.device("cpu"))
    with pytest.raises(ValueError, match="precision: expected one of"):
        TR.train_model("equikernels", MC.mace_model(10.0, **MC.TINY), "fp8", torch.device("cpu"))
