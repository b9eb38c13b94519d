"""Non-finite results stop with a message naming the cause: coincident atoms (which indices) in
the calculator, batch evaluation and `equikernels md`; a one-atom periodic cell gets finite
velocities and runs."""
import json

import numpy as np
import pytest
from ase import Atoms
from ase.build import bulk
from ase.io import write

from equikernels.calculators import MACECalculator
from equikernels.calculators.checks import NonFiniteError
from equikernels.calculators.md import MDSettings, initialise_velocities, run_md
from equikernels.cli import main


def overlapping():
    atoms = bulk("Cu", "fcc", a=3.61, cubic=True)
    atoms.positions[2] = atoms.positions[1]
    return atoms


def test_calculator_names_the_coincident_atoms(cu_model, single_thread):
    atoms = overlapping()
    atoms.calc = MACECalculator(cu_model, device="cpu")
    with pytest.raises(NonFiniteError, match=r"atoms coincide: 1 and 2 \(0 A apart\)"):
        atoms.get_potential_energy()


def test_batch_evaluate_names_the_structure(cu_model, single_thread):
    calc = MACECalculator(cu_model, device="cpu")
    with pytest.raises(NonFiniteError, match=r"atoms_list\[1\].*1 and 2"):
        calc.batch_evaluate([bulk("Cu", "fcc", a=3.61, cubic=True), overlapping()])


def test_md_stops_with_the_cause(cu_model, tmp_path, capsys):
    path = tmp_path / "overlap.extxyz"
    write(str(path), overlapping())
    assert main(["md", str(path), "--model", cu_model, "--steps", "3", "--out", str(tmp_path / "run"),
                 "--no-progress", "--device", "cpu"]) == 2
    err = [ln for ln in capsys.readouterr().err.splitlines() if ln.strip()]
    assert len(err) == 1 and "non-finite" in err[0] and "1 and 2" in err[0]


def test_one_atom_periodic_cell(cu_model, tmp_path, single_thread):
    atoms = bulk("Cu", "fcc", a=3.61)  # primitive cell: one atom, many periodic images
    initialise_velocities(atoms, 300.0, seed=0)
    assert np.isfinite(atoms.get_momenta()).all() and atoms.get_temperature() > 0
    atoms.calc = MACECalculator(cu_model, device="cpu")
    summary = run_md(atoms, MDSettings(steps=3, ensemble="nvt-langevin"), out_dir=str(tmp_path), progress=False)
    assert summary["status"] == "completed" and np.isfinite(atoms.positions).all()
    assert json.loads((tmp_path / "summary.json").read_text())["steps_done"] == 3


def test_non_finite_positions_are_refused(cu_model):
    atoms = Atoms("Cu2", positions=[[0, 0, 0], [np.nan, 0, 0]])
    atoms.calc = MACECalculator(cu_model, device="cpu")
    with pytest.raises(ValueError, match=r"positions of atoms 1 are not finite"):
        atoms.get_potential_energy()


def test_structure_check_names_every_non_finite_atom_and_accepts_huge_finite_ones():
    from equikernels.calculators.checks import check_structure

    atoms = Atoms("Cu4", positions=[[0, 0, 0], [0, np.inf, 0], [1, 1, 1], [0, 0, -np.nan]])
    with pytest.raises(ValueError, match=r"positions of atoms 1, 3 are not finite"):
        check_structure(atoms)
    check_structure(Atoms("Cu2", positions=[[1e308, 1e308, 0], [0, 0, 0]]))  # their sum overflows: still valid


def test_failure_mid_run_is_recorded(cu_model, tmp_path, monkeypatch, single_thread):
    import equikernels.calculators.md as md_module

    atoms = bulk("Cu", "fcc", a=3.61, cubic=True)
    atoms.calc = MACECalculator(cu_model, device="cpu")
    real = md_module.make_dynamics

    def collapsing(atoms, settings):  # after step 3, atom 3 lands on atom 0
        dyn = real(atoms, settings)
        dyn.attach(lambda: dyn.nsteps == 3 and atoms.positions.__setitem__(3, atoms.positions[0].copy()))
        return dyn
    monkeypatch.setattr(md_module, "make_dynamics", collapsing)
    with pytest.raises(NonFiniteError, match="0 and 3"):
        run_md(atoms, MDSettings(steps=10, ensemble="nve", log_interval=0, traj_interval=0), out_dir=str(tmp_path),
               progress=False)
    summary = json.loads((tmp_path / "summary.json").read_text())
    assert summary["status"] == "failed" and "0 and 3" in summary["error"] and summary["steps_done"] == 3
