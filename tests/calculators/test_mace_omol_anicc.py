"""``mace_omol`` / ``mace_anicc``: mace-torch's shortcuts on our calculator. A MACE-OMOL model (charge
and spin embeddings, evaluated with its head "omol") downloaded into mace-torch's cache once, with the
energies and forces of mace-torch's ``mace_omol`` on the same file for charged and neutral molecules;
the ANI-CC model from a path or its download, in float64; unknown names refused. No network: the
download is stood in for by a local file."""
import numpy as np
import pytest
import torch
from ase.build import molecule

from download_stand_in import stand_in_download
from embedding_models import SPECS, mace_torch_model

pytestmark = pytest.mark.mace


@pytest.fixture(autouse=True)
def _one_thread(single_thread):
    yield


def _molecule(charge=None, spin=None):
    atoms = molecule("CH3CH2OH")
    atoms.rattle(0.05, seed=5)
    if charge is not None:
        atoms.info.update(charge=charge, spin=spin)
    return atoms


def test_mace_omol_downloads_once_and_gives_mace_torch_numbers(monkeypatch, tmp_path):
    model = mace_torch_model(embedding_specs=SPECS, use_embedding_readout=True, heads=["other", "omol"],
                             atomic_energies=np.array([[-1.5, -2.5, -3.5], [-1.0, -2.0, -3.0]]),
                             atomic_inter_scale=[1.2, 1.0], atomic_inter_shift=[0.1, 0.0])
    source = str(tmp_path / "omol.model")
    torch.save(model, source)
    from mace.calculators import mace_omol as theirs_omol

    from equikernels.calculators import mace_omol
    from equikernels.models.foundations import MACE_OMOL_URLS

    fetched = stand_in_download(monkeypatch, tmp_path, source)
    with pytest.warns(RuntimeWarning, match="equikernels.accelerate"):
        first = mace_omol(device="cpu")
    second = mace_omol("extra_large", device="cpu")
    assert fetched == [MACE_OMOL_URLS["extra_large"]]  # the second call reads the cache
    assert [p.name for p in (tmp_path / "cache").iterdir()] == ["MACE-omol-0-extra-large-1024.model"]
    assert first.dtype == torch.float64 and first.head == "omol"
    theirs = theirs_omol(source, device="cpu")
    energies = []
    for atoms in (_molecule(), _molecule(1, 2), _molecule(-1, 2)):
        for calc in (first, second):
            assert calc.get_potential_energy(atoms) == pytest.approx(theirs.get_potential_energy(atoms), rel=1e-10)
            np.testing.assert_allclose(calc.get_forces(atoms), theirs.get_forces(atoms), rtol=1e-9, atol=1e-10)
        energies.append(first.get_potential_energy(atoms))
    assert min(abs(energies[0] - energies[1]), abs(energies[1] - energies[2])) > 1e-4  # the charge counted
    raw = mace_omol(source, return_raw_model=True, device="cpu")
    assert type(raw).__name__ == "ScaleShiftMACE"
    with pytest.raises(FileNotFoundError, match=r"mace_omol: model 'large' is neither a model name \(extra_large\)"):
        mace_omol("large", device="cpu")


def test_mace_anicc_from_a_path_or_its_download(monkeypatch, tmp_path):
    model = mace_torch_model()
    source = str(tmp_path / "anicc.model")
    torch.save(model, source)
    from mace.calculators import mace_anicc as theirs_anicc

    from equikernels.calculators import mace_anicc
    from equikernels.models.foundations import MACE_ANICC_URL

    fetched = stand_in_download(monkeypatch, tmp_path, source)
    downloaded = mace_anicc(device="cpu")
    assert fetched == [MACE_ANICC_URL]
    assert [p.name for p in (tmp_path / "cache").iterdir()] == ["ani500k_large_CC.model"]
    given = mace_anicc(device="cpu", model_path=source)
    theirs = theirs_anicc(device="cpu", model_path=source)
    atoms = _molecule()
    for calc in (downloaded, given):
        assert calc.dtype == torch.float64
        assert calc.get_potential_energy(atoms) == pytest.approx(theirs.get_potential_energy(atoms), rel=1e-10)
    with pytest.raises(FileNotFoundError, match="mace_anicc: model .*missing.model.* is neither"):
        mace_anicc(device="cpu", model_path=str(tmp_path / "missing.model"))
