"""A float64 model written over a float32 mace-torch template (a float32 foundation model fine-tuned
with --dtype float64) keeps its float64 weights."""
import pytest
import torch

pytestmark = pytest.mark.mace


def test_float64_weights_survive_a_float32_template(tmp_path, single_thread):
    pytest.importorskip("mace")
    from mace_torch_cases import mace_batch, random_mace, rattled_atoms

    from equikernels._compat import default_dtype
    from equikernels.models import from_mace
    from equikernels.training.mace_export import to_mace

    with default_dtype(torch.float32):
        template = random_mace(seed=0).float()
    path = tmp_path / "foundation.model"
    torch.save(template, path)
    ours = from_mace(template).double()
    with torch.no_grad():  # weights no float32 number holds, as float64 training leaves them
        for p in ours.parameters():
            p.add_(torch.randn(p.shape, dtype=torch.float64, generator=torch.Generator().manual_seed(1)) * 1e-4)
    theirs = to_mace(ours, template=str(path))
    assert all(v.dtype == torch.float64 for v in theirs.state_dict().values() if v.is_floating_point())
    batch = {k: (v.double() if v.is_floating_point() else v) for k, v in mace_batch(rattled_atoms()).items()}
    # the template's own constants (Wigner 3j) stay float32-rounded, as in any upcast float32 model
    reference = to_mace(ours)  # built from the config in float64, no template
    a = theirs(dict(batch), training=False, compute_force=True)
    b = reference(dict(batch), training=False, compute_force=True)
    for k in ("energy", "forces"):
        torch.testing.assert_close(a[k], b[k], rtol=1e-10, atol=1e-10)
