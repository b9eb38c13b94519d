"""Training files written for mace-torch: isolated-atom frames give E0s, frames missing a label
leave it out of their loss, data without stress trains on energies and forces."""
import numpy as np
import pytest

from equikernels.training import DataError, DataKeys, TrainConfig, Trainer, read_configs
from equikernels.training.data import check_labels, config_to_data
from equikernels.training.statistics import average_e0s
from emt_data import emt_structures


def _isolated(symbol, energy):
    from ase import Atoms

    a = Atoms(symbol, positions=[[0.0, 0.0, 0.0]], pbc=False)
    a.info.update(REF_energy=energy, config_type="IsolatedAtom")
    return a


def _write(tmp_path, frames, name="train.xyz"):
    import ase.io

    path = str(tmp_path / name)
    ase.io.write(path, frames, format="extxyz")
    return path


def _trainer(path, tmp_path, **kw):
    from equikernels.default_model import default_model_path

    kw = {"valid_fraction": 0, **kw}
    cfg = TrainConfig(train_file=path, model=default_model_path(), out_dir=str(tmp_path / "out"),
                      progress=False, plot=False, device="cpu", **kw)
    said = []
    return Trainer(cfg, log=said.append), said


def test_isolated_atom_frames_give_e0s_and_are_not_trained_on(tmp_path):
    from equikernels.training import model_factory as mf

    frames = [_isolated("Cu", -0.25), _isolated("Ni", -0.5)] + emt_structures(3, seed=5, elements=("Cu", "Ni"))
    trainer, said = _trainer(_write(tmp_path, frames), tmp_path)
    assert len(trainer.train_set) == 3
    e0s = mf.get_e0s(trainer.model)[0]
    zs = mf.atomic_numbers(trainer.model)
    assert float(e0s[zs.index(29)]) == -0.25 and float(e0s[zs.index(28)]) == -0.5
    assert any("E0s from the isolated-atom frames" in s for s in said)


@pytest.mark.parametrize("e0s, cu, line", [
    ({"Cu": -0.75}, -0.75, "E0s from the isolated-atom frames (config_type=IsolatedAtom): Ni -0.5 eV; the given e0s "
                           "replace the isolated-atom frames' Cu -0.25 eV"),
    ({"Cu": -0.75, "Ni": -0.5}, -0.75, "the given e0s replace the isolated-atom frames' Ni -0.5 eV, Cu -0.25 eV"),
    ("foundation", -0.25, "E0s from the isolated-atom frames (config_type=IsolatedAtom): Ni -0.5 eV, Cu -0.25 eV"),
])
def test_the_e0s_line_names_those_used(tmp_path, e0s, cu, line):
    from equikernels.training import model_factory as mf

    frames = [_isolated("Cu", -0.25), _isolated("Ni", -0.5)] + emt_structures(3, seed=5, elements=("Cu", "Ni"))
    trainer, said = _trainer(_write(tmp_path, frames), tmp_path, e0s=e0s)
    zs = mf.atomic_numbers(trainer.model)
    assert float(mf.get_e0s(trainer.model)[0][zs.index(29)]) == cu
    assert [s for s in said if "isolated-atom frames" in s] == [line]


def test_isolated_atoms_fix_their_elements_in_average_e0s(tmp_path):
    configs = read_configs(_write(tmp_path, emt_structures(6, seed=3, elements=("Cu", "Ni"))), DataKeys())
    free = average_e0s(configs, [28, 29])
    fixed = average_e0s(configs, [28, 29], fixed={29: free[29] + 1.0})
    assert fixed[29] == free[29] + 1.0 and fixed[28] != pytest.approx(free[28])
    n = np.array([[np.sum(c.atomic_numbers == z) for z in (28, 29)] for c in configs])
    residual = np.array([c.energy for c in configs]) - n @ np.array([fixed[28], fixed[29]])
    assert abs(n[:, 0] @ residual) < 1e-8  # least squares in the free element alone


def test_isolated_atom_without_energy_is_named(tmp_path):
    iso = _isolated("Cu", 0.0)
    del iso.info["REF_energy"]
    path = _write(tmp_path, [iso] + emt_structures(2, seed=5, elements=("Cu",)))
    with pytest.raises(DataError, match=r"train.xyz, frame 0: marked config_type=IsolatedAtom but has no energy"):
        _trainer(path, tmp_path)


def test_frames_missing_a_label_leave_it_out_of_their_loss(tmp_path):
    frames = emt_structures(3, seed=3, elements=("Cu",))
    del frames[1].arrays["REF_forces"]
    del frames[2].info["REF_energy"]
    path = _write(tmp_path, frames)
    configs = read_configs(path, DataKeys())
    check_labels(configs, path, need_energy=True, need_forces=True, need_stress=True)
    d1, d2 = (config_to_data(c, [29], 5.0, ["Default"]) for c in configs[1:])
    assert (float(d1.forces_weight), float(d1.energy_weight)) == (0.0, 1.0)
    assert (float(d2.forces_weight), float(d2.energy_weight)) == (1.0, 0.0)


def test_data_without_stress_trains_on_energies_and_forces(tmp_path):
    frames = emt_structures(3, seed=4, elements=("Cu",))
    for a in frames:
        a.pbc = False
    trainer, said = _trainer(_write(tmp_path, frames), tmp_path)
    assert any("no frame has a stress label" in s for s in said)
    with pytest.raises(DataError, match="no frame has a stress or virials label"):  # a key the user chose
        _trainer(_write(tmp_path, frames), tmp_path, keys={"stress": "DFT_stress"})


def test_one_structure_with_a_validation_fraction_says_what_to_do(tmp_path):
    path = _write(tmp_path, emt_structures(1, seed=4, elements=("Cu",)))
    with pytest.raises(ValueError, match=r"cannot split 1 structure\(s\).*valid_fraction 0 \(--valid-fraction 0\)"):
        _trainer(path, tmp_path, valid_fraction=0.1)


def test_per_frame_property_weights_scale_their_labels(tmp_path):
    frames = emt_structures(2, seed=3, elements=("Cu",))
    frames[0].info.update(config_energy_weight=0.0, config_forces_weight=2.5, config_stress_weight=0.5)
    configs = read_configs(_write(tmp_path, frames), DataKeys())
    d0, d1 = (config_to_data(c, [29], 5.0, ["Default"]) for c in configs)
    assert [float(d0[k]) for k in ("energy_weight", "forces_weight", "stress_weight")] == [0.0, 2.5, 0.5]
    assert [float(d1[k]) for k in ("energy_weight", "forces_weight", "stress_weight")] == [1.0, 1.0, 1.0]
    frames[1].info["config_forces_weight"] = -1.0
    with pytest.raises(DataError, match=r"frame 1: weight 'config_forces_weight' is -1.0; expected >= 0"):
        read_configs(_write(tmp_path, frames, "neg.xyz"), DataKeys())
