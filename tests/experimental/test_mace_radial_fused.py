"""MACE interactions with the radial MLP's last layer fused into the convolution
(experimental.radial_fusion / experimental.radial_conv): a whole small model (16 channels, radial MLP [16, 16]) on
the Triton interpreter gives the energy and forces of the same model with the fusion off, and a
force loss differentiated to the parameters (create_graph, the composed second order) agrees; the
setting rejects bad values."""
import pytest
import torch

from equikernels.models import atoms_list_to_data
from equikernels import experimental
from equikernels.experimental import radial_fusion
from mace_models import R_MAX, ZS, layout_model as _model, mixed_atoms as _atoms


@pytest.fixture(autouse=True)
def _env(monkeypatch, single_thread):
    monkeypatch.setenv("EQUIKERNELS_BACKEND", "triton")
    monkeypatch.delenv("EQUIKERNELS_RADIAL_CONV", raising=False)
    experimental.enable()
    yield
    experimental.disable()


def _rel(a, b):
    return float((a - b).abs().max() / b.abs().max())


def test_fused_model_matches_unfused(monkeypatch):
    model = _model(dtype=torch.float64, hidden_irreps="16x0e+16x1o", MLP_irreps="4x0e", radial_MLP=[16, 16],
                   max_ell=1, correlation=1, num_interactions=1)
    calls = []
    real = radial_fusion.radial_fused

    def spy(*a):
        calls.append(real(*a))
        return calls[-1]
    monkeypatch.setattr(radial_fusion, "radial_fused", spy)

    def run(setting):
        monkeypatch.setenv("EQUIKERNELS_RADIAL_CONV", setting)
        data = atoms_list_to_data(_atoms()[1:], R_MAX, ZS, dtype=torch.float64)
        out = model(data, compute_force=True, training=True)
        params = [p for p in model.parameters() if p.requires_grad]
        loss = (out["forces"] ** 2).sum()
        return [out["energy"].detach(), out["forces"].detach()] + list(torch.autograd.grad(loss, params,
                                                                                           allow_unused=True))
    fused, plain = run("1"), run("0")
    assert calls == [True, False]
    for a, b in zip(fused, plain):
        if b is not None:
            assert _rel(a, b) < 1e-10


def test_setting_rejects_bad_values(monkeypatch):
    model = _model(dtype=torch.float64)
    monkeypatch.setenv("EQUIKERNELS_RADIAL_CONV", "yes")
    data = atoms_list_to_data(_atoms()[1:], R_MAX, ZS, dtype=torch.float64)
    with pytest.raises(ValueError, match="EQUIKERNELS_RADIAL_CONV"):
        model(data)


def test_default_path_needs_no_experimental_and_a_request_without_it_is_an_error(monkeypatch):
    """The default model runs with the hooks empty; asking for the fused path without enabling the
    experimental package raises instead of being ignored."""
    experimental.disable()
    model = _model(dtype=torch.float64)
    data = atoms_list_to_data(_atoms()[1:], R_MAX, ZS, dtype=torch.float64)
    model(data)
    monkeypatch.setenv("EQUIKERNELS_RADIAL_CONV", "1")
    with pytest.raises(RuntimeError, match="experimental.enable"):
        model(data)
