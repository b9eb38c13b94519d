"""A mace-torch model that ``equikernels.accelerate`` ran on (and a file it was saved to whole, as
mace-torch's training scripts save it) still converts with ``from_mace`` / ``load`` to the same numbers."""
import pytest
import torch

pytestmark = pytest.mark.mace
mace = pytest.importorskip("mace")

import equikernels as ek  # noqa: E402
from equikernels.models import from_mace, load  # noqa: E402
from equikernels.models.io import CodeExecutionWarning  # noqa: E402

from mace_torch_cases import TOL, mace_batch, random_mace, rattled_atoms, rel  # noqa: E402


def test_accelerated_mace_model_converts_and_loads(tmp_path, single_thread):
    torch.set_default_dtype(torch.float64)
    model = random_mace(seed=3, correlation=2)
    batch = mace_batch(rattled_atoms())
    ref = model(dict(batch), compute_stress=True)
    ek.accelerate(model)
    model(dict(batch), compute_stress=True)  # builds its equikernels twin before the save
    torch.save(model, tmp_path / "accelerated.model")
    with pytest.warns(CodeExecutionWarning):
        loaded = load(tmp_path / "accelerated.model")
    for ours in (from_mace(model), loaded):
        assert type(ours).__name__ == "ScaleShiftMACE"
        out = ours(dict(batch), compute_stress=True)
        for k in ("energy", "node_energy", "forces", "stress"):
            assert rel(out[k].detach(), ref[k].detach()) < TOL, k


def test_save_of_a_mace_torch_model_says_what_to_do(tmp_path):
    from equikernels.models import save  # noqa: PLC0415

    model = random_mace(seed=3, correlation=1, num_interactions=1)
    with pytest.raises(TypeError, match=r"got mace\.modules\.models\.ScaleShiftMACE; a mace-torch model is saved as "
                                        r"equikernels\.models\.save\(equikernels\.models\.from_mace\(model\)"):
        save(model, tmp_path / "m.pt")
    assert not (tmp_path / "m.pt").exists()
