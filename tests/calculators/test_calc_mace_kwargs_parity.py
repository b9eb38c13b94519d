"""mace-torch's ``MACECalculator`` arguments and model kinds in ours: model files as its first argument
(a list or a wildcard pattern), models with charge and spin embeddings read through ``info_keys`` /
``charges_key`` as mace-torch reads them, and polarizability models or models reading inputs the
calculator does not give refused by name."""
import copy

import numpy as np
import pytest
import torch
from ase.build import molecule

from random_models import small_random_mace_model
from embedding_models import SPECS, ZS, mace_torch_model, mixed_cell

pytestmark = pytest.mark.mace

KEYS = ("energy", "free_energy", "energies", "node_energy", "forces", "stress")


@pytest.fixture(autouse=True)
def _one_thread(single_thread):
    yield


def _theirs(model, **kw):
    from mace.calculators import MACECalculator as MaceTorchCalculator

    return MaceTorchCalculator(models=copy.deepcopy(model), device="cpu", default_dtype="float64", **kw)


def _ours(model, **kw):
    from equikernels.calculators import MACECalculator

    return MACECalculator(models=copy.deepcopy(model), device="cpu", default_dtype="float64", **kw)


def _same(ours, theirs, atoms, keys=KEYS):
    props = ["energy", "forces"] + (["stress"] if atoms.pbc.all() else [])
    ours.calculate(atoms, props)
    theirs.calculate(atoms, props)
    for key in keys:
        want = np.asarray(theirs.results[key], dtype=np.float64)
        np.testing.assert_allclose(ours.results[key], want, rtol=1e-10, atol=1e-10 * max(np.abs(want).max(), 1.0),
                                   err_msg=key)
    return ours.results["energy"]


def test_model_files_as_the_first_argument_as_mace_torch_takes_them(tmp_path):
    """mace-torch's first argument is ``model_paths``: a list of files, or a wildcard pattern, makes a committee."""
    pytest.importorskip("mace")
    from mace.calculators import MACECalculator as MaceTorchCalculator

    from equikernels.calculators import MACECalculator

    paths = [str(tmp_path / f"m_{k}.model") for k in range(2)]
    for k, path in enumerate(paths):
        torch.save(small_random_mace_model(ZS, seed=k, r_max=3.0, num_interactions=1), path)
    atoms = molecule("CH3CH2OH")
    theirs = MaceTorchCalculator(paths, device="cpu", default_dtype="float64")
    for first in (paths, str(tmp_path / "m_*.model")):
        ours = MACECalculator(first, device="cpu", default_dtype="float64")
        assert ours.num_models == 2
        _same(ours, theirs, atoms, ("energy", "forces", "energy_comm", "forces_var"))


def test_charge_and_spin_embeddings_read_from_atoms_info_as_mace_torch_does(tmp_path):
    """A model embedding the total charge and spin (as MACE-OMOL does), from ``models=`` or a file:
    mace-torch's numbers with atoms.info's charge and spin, without them (charge 0, spin 1), through
    other ``info_keys``; a changed charge is a new calculation; batches, Hessian and descriptors too."""
    model = mace_torch_model(embedding_specs=SPECS, use_embedding_readout=True)
    path = str(tmp_path / "embedding.model")
    torch.save(model, path)
    theirs = _theirs(model)
    atoms = mixed_cell()
    atoms.info.update(charge=1, spin=2)
    ours = _ours(model)
    with pytest.warns(RuntimeWarning, match="equikernels.accelerate"):
        from_file = type(ours)(path, device="cpu", default_dtype="float64")
    charged = _same(ours, theirs, atoms)
    assert _same(from_file, theirs, atoms) == pytest.approx(charged, rel=1e-12)
    plain = atoms.copy()
    plain.info = {}
    neutral = _same(ours, theirs, plain)
    assert abs(neutral - charged) > 1e-3
    atoms.calc = ours
    atoms.info["charge"] = -1  # only atoms.info changed: the calculator must not return the stored energy
    assert atoms.get_potential_energy() == pytest.approx(theirs.get_potential_energy(atoms), rel=1e-12)
    atoms.info["charge"] = 1
    assert atoms.get_potential_energy() == pytest.approx(charged, rel=1e-12)
    keyed = plain.copy()
    keyed.info.update(q=1, s=2)
    keys = {"total_charge": "q", "total_spin": "s"}
    assert _same(_ours(model, info_keys=keys), _theirs(model, info_keys=keys), keyed) == pytest.approx(charged,
                                                                                                     rel=1e-12)
    batch = ours.batch_evaluate([plain, atoms], ("energy", "forces"))
    assert [b["energy"] for b in batch] == pytest.approx([neutral, charged], rel=1e-12)
    np.testing.assert_allclose(ours.get_hessian(atoms), theirs.get_hessian(atoms), rtol=1e-9, atol=1e-10)
    np.testing.assert_allclose(ours.get_descriptors(atoms), theirs.get_descriptors(atoms), rtol=1e-10, atol=1e-12)


def test_models_without_energy_or_reading_other_inputs_are_refused_by_name():
    from equikernels.calculators import MACECalculator

    model = mace_torch_model()

    class AtomicDielectricMACE(torch.nn.Module):  # mace-torch's dipole-and-polarizability class, by its name
        r_max, atomic_numbers = model.r_max, model.atomic_numbers

    with pytest.raises(ValueError, match=r"model: AtomicDielectricMACE predicts dipoles and polarizabilities "
                                         r"\(mace-torch's model_type='DipolePolarizabilityMACE'\)"):
        MACECalculator(AtomicDielectricMACE(), device="cpu")

    class ReadsPbc(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.inner, self.r_max, self.atomic_numbers = model, model.r_max, model.atomic_numbers

        def forward(self, data, **kwargs):
            return self.inner({**data, "cell": data["cell"] * data["pbc"]}, **kwargs)

    with pytest.raises(ValueError, match=r"model: ReadsPbc reads the input 'pbc', which MACECalculator does not give"):
        MACECalculator(ReadsPbc(), device="cpu").get_potential_energy(mixed_cell())
    with pytest.raises(ValueError, match=r"info_keys: expected a dict"):
        _ours(model, info_keys=["charge"])
    specs = {"temperature": {"type": "continuous", "per": "graph", "in_dim": 1, "emb_dim": 4}}
    with pytest.raises(ValueError, match=r"info_keys: the model embeds 'temperature'; name its atoms key"):
        _ours(mace_torch_model(embedding_specs=specs))
