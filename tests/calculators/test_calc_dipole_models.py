"""mace-torch's dipole models in the calculator, loaded from their files: an ``EnergyDipolesMACE``
gives mace-torch's energy, forces, stress and dipole (and no per-atom energies, which mace-torch's
model does not compute: its ``node_energy`` is the isolated-atom energies alone), an
``AtomicDipolesMACE`` its dipole alone
(model_type 'EnergyDipoleMACE' / 'DipoleMACE', or from the model's class), committees the spread of
the dipole; per-atom charges enter the dipole and a change of them alone is a new calculation."""
import copy

import numpy as np
import pytest
import torch
from ase.calculators.calculator import PropertyNotImplementedError

from embedding_models import mace_torch_model, mixed_cell

pytestmark = pytest.mark.mace
DEBYE_PER_E_ANGSTROM = 299792458.0 * 1.602176634e-19 / 1e-11  # c e / 1e-11: 1 e*A = 4.8032 D


@pytest.fixture(autouse=True)
def _one_thread(single_thread):
    yield


def _theirs(model, model_type, **kw):
    from mace.calculators import MACECalculator as MaceTorchCalculator

    models = [copy.deepcopy(m) for m in model] if isinstance(model, list) else copy.deepcopy(model)
    return MaceTorchCalculator(models=models, device="cpu", default_dtype="float64", model_type=model_type, **kw)


def _file(model, tmp_path, name):
    path = str(tmp_path / name)
    torch.save(model, path)
    return path


def _ours(path, **kw):
    from equikernels.calculators import MACECalculator

    with pytest.warns(RuntimeWarning, match="dipole readouts, which equikernels' MACE does not read"):
        return MACECalculator(path, device="cpu", default_dtype="float64", **kw)


def _close(ours, theirs, keys):
    for key in keys:
        want = np.asarray(theirs[key], dtype=np.float64)
        np.testing.assert_allclose(ours[key], want, rtol=1e-10, atol=1e-12 * max(np.abs(want).max(), 1.0),
                                   err_msg=key)


def test_energy_and_dipole_model_file_gives_mace_torch_results(tmp_path):
    model = mace_torch_model("EnergyDipolesMACE")
    path = _file(model, tmp_path, "energy_dipole.model")
    atoms = mixed_cell()
    theirs = _theirs(model, "EnergyDipoleMACE")
    theirs.calculate(atoms, ["energy", "forces", "stress", "dipole"])
    assert np.abs(theirs.results["dipole"]).max() > 1e-4  # the test reads a dipole, not zeros
    for model_type in (None, "MACE", "EnergyDipoleMACE"):
        ours = _ours(path, **({} if model_type is None else {"model_type": model_type}))
        assert "dipole" in ours.implemented_properties
        ours.calculate(atoms, ["energy", "forces", "stress", "dipole"])
        _close(ours.results, theirs.results, ("energy", "forces", "stress", "dipole"))
    probe = atoms.copy()
    probe.calc = ours
    np.testing.assert_allclose(probe.get_dipole_moment(), theirs.results["dipole"], rtol=1e-10)
    assert abs(theirs.results["energies"].sum() - theirs.results["energy"]) > 1e-3  # mace-torch's are E0 only
    assert not {"energies", "node_energy"} & (set(ours.implemented_properties) | set(ours.results))
    with pytest.raises(PropertyNotImplementedError, match="energies: the model's per-atom energies are not its "
                                                          "energy's terms"):
        probe.get_potential_energies()
    batch = ours.batch_evaluate([atoms, atoms], ("energy", "forces", "dipole"))
    for res in batch:
        _close(res, theirs.results, ("energy", "forces", "dipole"))
    for call in (ours.get_hessian, ours.get_descriptors):
        with pytest.raises(PropertyNotImplementedError, match="not available for EnergyDipolesMACE models"):
            call(atoms)
    with pytest.raises(ValueError, match=r"model_type='DipoleMACE' does not fit the model: EnergyDipolesMACE "
                                         r"predicts energies and dipoles"):
        _ours(path, model_type="DipoleMACE")


def test_dipole_only_model_file_gives_mace_torch_dipole(tmp_path):
    model = mace_torch_model("AtomicDipolesMACE")
    path = _file(model, tmp_path, "dipole.model")
    atoms = mixed_cell()
    theirs = _theirs(model, "DipoleMACE")
    theirs.calculate(atoms, ["dipole"])
    assert np.abs(theirs.results["dipole"]).max() > 1e-4
    for model_type in (None, "DipoleMACE"):
        ours = _ours(path, **({} if model_type is None else {"model_type": model_type}))
        assert ours.implemented_properties == ["dipole"]
        ours.calculate(atoms, ["dipole"])
        _close(ours.results, theirs.results, ("dipole",))
    atoms.calc = ours
    with pytest.raises(PropertyNotImplementedError):
        atoms.get_potential_energy()
    [res] = ours.batch_evaluate([atoms])  # the default properties of a dipole-only model: its dipole
    _close(res, theirs.results, ("dipole",))
    with pytest.raises(ValueError, match=r"model_type='MACE' does not fit the model: AtomicDipolesMACE predicts "
                                         r"dipoles only \(model_type='DipoleMACE', or leave model_type out\)"):
        _ours(path, model_type="MACE")


def test_per_atom_charges_enter_the_dipole_and_a_change_of_them_is_a_new_calculation(tmp_path):
    """The dipole of fixed per-atom charges, sum q_i r_i in Debye as mace-torch's dipole models give
    theirs, is added to the predicted one (``charges_key``, default 'Qs'); changing only
    atoms.arrays['Qs'] must not return the stored dipole."""
    path = _file(mace_torch_model("AtomicDipolesMACE"), tmp_path, "dipole.model")
    atoms = mixed_cell()
    atoms.calc = _ours(path)
    neutral = atoms.get_dipole_moment()
    charges = np.linspace(-0.35, 0.35, len(atoms))
    atoms.arrays["Qs"] = charges
    fixed = charges @ atoms.positions * DEBYE_PER_E_ANGSTROM
    np.testing.assert_allclose(atoms.get_dipole_moment() - neutral, fixed, rtol=1e-10)
    atoms.arrays["Qs"] = 2 * charges
    np.testing.assert_allclose(atoms.get_dipole_moment() - neutral, 2 * fixed, rtol=1e-10)
    keyed = atoms.copy()
    keyed.arrays["q"] = keyed.arrays.pop("Qs")
    keyed.calc = _ours(path, charges_key="q")
    np.testing.assert_allclose(keyed.get_dipole_moment() - neutral, 2 * fixed, rtol=1e-10)


def test_committee_of_dipole_models_gives_mace_torch_spread(tmp_path):
    import torch.nn.utils

    models = [mace_torch_model("EnergyDipolesMACE"), mace_torch_model("EnergyDipolesMACE")]
    with torch.no_grad():
        torch.nn.utils.vector_to_parameters(torch.nn.utils.parameters_to_vector(models[1].parameters()) * 1.05,
                                            models[1].parameters())
    paths = [_file(m, tmp_path, f"m_{k}.model") for k, m in enumerate(models)]
    atoms = mixed_cell()
    theirs = _theirs(models, "EnergyDipoleMACE")
    theirs.calculate(atoms, ["energy", "forces", "dipole"])
    assert np.abs(theirs.results["dipole_var"]).max() > 1e-10  # the members differ
    from equikernels.calculators import MACECalculator

    with pytest.warns(RuntimeWarning, match="dipole readouts"):
        ours = MACECalculator(paths, device="cpu", default_dtype="float64")
    assert {"dipole_comm", "dipole_var"} <= set(ours.implemented_properties)
    ours.calculate(atoms, ["energy", "forces", "dipole"])
    _close(ours.results, theirs.results, ("energy", "energy_var", "dipole", "dipole_comm", "dipole_var"))
    dipole_only = _file(mace_torch_model("AtomicDipolesMACE"), tmp_path, "dipole.model")
    with pytest.warns(RuntimeWarning, match="dipole readouts"):
        with pytest.raises(ValueError, match="models: a committee's models must predict the same quantities"):
            MACECalculator([paths[0], dipole_only], device="cpu", default_dtype="float64")
