"""The calculator's change check (``calculators.state``): ASE's answer in every case, ASE's
tolerance test run only on the properties that are not exactly equal (never in MD's repeated
asks)."""
import numpy as np
import pytest
from ase import units
from ase.build import bulk
from ase.calculators import calculator as ase_calculator
from ase.md.langevin import Langevin

from equikernels.calculators import MACECalculator
from equikernels.calculators.state import changes
from random_models import small_random_model


def _base():
    atoms = bulk("Cu", "fcc", a=3.61, cubic=True)
    atoms.rattle(0.05, seed=1)
    return atoms


def _positions_tiny(a):
    a.positions[0, 0] += 1e-17 * (1.0 + abs(a.positions[0, 0]))


def _positions(a):
    a.positions[1, 2] += 1e-6


def _numbers(a):
    a.numbers[2] = 28


def _cell(a):
    a.set_cell(a.cell.array * 1.0001, scale_atoms=False)


def _pbc(a):
    a.pbc = [True, True, False]


def _magmoms_added(a):
    a.set_initial_magnetic_moments(np.zeros(len(a)))


def _charges(a):
    a.set_initial_charges(np.arange(len(a), dtype=float))


def _momenta(a):  # not a structure change for ASE
    a.set_momenta(np.ones((len(a), 3)))


def _atom_removed(a):
    del a[0]


EDITS = [None, _positions_tiny, _positions, _numbers, _cell, _pbc, _magmoms_added, _charges, _momenta,
         _atom_removed]


@pytest.mark.parametrize("edit", EDITS, ids=lambda e: "none" if e is None else e.__name__.strip("_"))
def test_agrees_with_ase(edit):
    old = _base()
    new = old.copy()
    if edit is not None:
        edit(new)
    ase_says = ase_calculator.compare_atoms(old, new, tol=1e-15)
    assert (ase_says == []) == (edit in (None, _positions_tiny, _momenta))
    assert sorted(changes(old, new, tol=1e-15)) == sorted(ase_says)
    assert sorted(changes(new, old, tol=1e-15)) == sorted(ase_calculator.compare_atoms(new, old, tol=1e-15))
    assert sorted(changes(old, new, tol=1e-3)) == sorted(ase_calculator.compare_atoms(old, new, tol=1e-3))
    assert changes(None, new) == list(ase_calculator.all_changes)
    skip = {"positions", "cell"}
    assert sorted(changes(old, new, excluded=skip)) == sorted(
        ase_calculator.compare_atoms(old, new, tol=1e-15, excluded_properties=skip))


def test_several_changes_at_once():
    old = _base()
    new = old.copy()
    for edit in (_positions, _cell, _charges):
        edit(new)
    assert sorted(changes(old, new)) == sorted(ase_calculator.compare_atoms(old, new, tol=1e-15)) == [
        "cell", "initial_charges", "positions"]


def test_changes_are_reported(monkeypatch):
    """The calculator recomputes after each kind of change, exactly as with ASE's check alone."""
    calc = MACECalculator(small_random_model([28, 29], seed=0, backend="equikernels"), device="cpu",
                          default_dtype="float64")
    atoms = _base()
    e0 = calc.get_potential_energy(atoms)
    for edit in (_positions, _numbers, _cell):
        atoms = atoms.copy()
        edit(atoms)
        assert calc.check_state(atoms)
        assert calc.get_potential_energy(atoms) != e0


def test_repeated_asks_in_md_skip_ases_comparison(monkeypatch):
    calc = MACECalculator(small_random_model([29], seed=0, backend="equikernels"), device="cpu")
    atoms = _base()
    atoms.calc = calc
    compared = []
    real = ase_calculator.compare_atoms
    monkeypatch.setattr(ase_calculator, "compare_atoms", lambda *a, **k: compared.append(1) or real(*a, **k))
    calls = []
    forward = calc.model.forward
    calc.model.forward = lambda *a, **k: calls.append(1) or forward(*a, **k)
    dyn = Langevin(atoms, timestep=1.0 * units.fs, temperature_K=300.0, friction=0.01 / units.fs, fixcm=False,
                   rng=np.random.default_rng(0))
    dyn.attach(atoms.get_forces, interval=1)  # an observer asking again, as loggers do
    dyn.run(4)
    assert len(calls) == 5  # the first structure and one per step
    assert not compared  # ASE's element-wise comparison of every array never runs
    np.testing.assert_array_equal(atoms.get_forces(), calc.results["forces"])
