"""A new multi-head model built by mace-torch's constructor: each head gets its own E0s, and the
saved mace-torch copy gives ours energies per head."""
import numpy as np
import pytest

from cu_ni_frames import write_cu_ni_frames as _frames

NEW = {"hidden_irreps": "4x0e+4x1o", "MLP_irreps": "4x0e", "num_interactions": 1, "correlation": 2, "max_ell": 1,
       "r_max": 4.0, "radial_MLP": [8], "builder": "mace"}


@pytest.mark.mace
def test_a_new_two_head_model_built_by_mace_torch_exports_each_heads_energies(tmp_path, single_thread):
    pytest.importorskip("mace")
    import ase.io
    from mace.calculators import MACECalculator as MaceTorchCalculator

    from equikernels.calculators import MACECalculator
    from equikernels.training import TrainConfig, fine_tune
    from equikernels.training import model_factory as mf

    a = _frames(str(tmp_path / "a.xyz"), 4, 0)
    b = _frames(str(tmp_path / "b.xyz"), 4, 0, shift=0.7)  # a's frames, 0.7 eV/atom higher
    summary = fine_tune(TrainConfig(new_model=NEW, heads={"dft_a": {"train_file": a}, "dft_b": {"train_file": b}},
                                    epochs=1, batch_size=2, lr=1e-6, out_dir=str(tmp_path / "out"), progress=False,
                                    plot=False, device="cpu", valid_fraction=0.0, dtype="float64"))
    e0s = mf.get_e0s(mf.load_model(summary["model_path"], "equikernels")).double().numpy()
    assert e0s.shape == (2, 2) and e0s[1] == pytest.approx(e0s[0] + 0.7, abs=1e-6)  # each head's own
    for head, path in (("dft_a", a), ("dft_b", b)):
        got = []
        for calc in (MaceTorchCalculator(model_paths=summary["mace_model_path"], device="cpu",
                                         default_dtype="float64", head=head),
                     MACECalculator(summary["model_path"], device="cpu", default_dtype="float64", head=head)):
            atoms = ase.io.read(path, 0)
            atoms.calc = calc
            got.append(atoms.get_potential_energy())
        assert got[0] == pytest.approx(got[1], rel=1e-9), head
    assert not np.isclose(got[0], 0.0)
