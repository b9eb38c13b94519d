"""equikernels.bench.mace: the models the suite times are built as the ASE calculators run them."""
import pytest
import torch

pytestmark = pytest.mark.mace
pytest.importorskip("mace")


@pytest.mark.parametrize("impl", ["equikernels", "mace-e3nn"])
def test_suite_models_are_frozen_and_in_eval_mode(impl):
    from equikernels.bench import mace as MC

    ref = MC.mace_model(10.0, **MC.TINY)
    assert any(p.requires_grad for p in ref.parameters())
    model = MC.build(impl, ref, torch.float32, torch.device("cpu"))
    params = list(model.parameters())
    assert params and not any(p.requires_grad for p in params)
    assert not model.training
    assert any(p.requires_grad for p in ref.parameters())  # the source model is left as it was
    data = MC.graph(MC.cu_atoms(1008)[:20], 6.0, MC.Z_ALL, torch.float32, torch.device("cpu"))
    out = MC.step(model, data, False)
    assert torch.isfinite(out["forces"]).all() and out["forces"].shape == (20, 3)
