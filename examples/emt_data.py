"""Reproducible labelled structures from ASE's EMT potential (Cu, Ni, Al, Ag, Au, Pd, Pt and their
alloys): bulk, strained and rattled cells, surfaces. ``train_default_model.py`` trains the bundled
default model on them and the training tests use them; every structure is a pure function of the
seed."""
from __future__ import annotations

from typing import List, Sequence

import ase.io
import numpy as np
from ase.build import bulk, fcc100, fcc111
from ase.calculators.emt import EMT
from ase.data import atomic_numbers, reference_states

EMT_ELEMENTS = ("Cu", "Ni", "Al", "Ag", "Au", "Pd", "Pt")


def _label(atoms, keys_prefix: str = "REF_"):
    """Attach EMT energy/forces/stress under REF_* keys (stress only for periodic cells)."""
    atoms.calc = EMT()
    energy = atoms.get_potential_energy()
    forces = atoms.get_forces()
    stress = atoms.get_stress(voigt=True) if atoms.pbc.all() else None  # xx yy zz yz xz xy
    atoms.calc = None
    atoms.info.pop("adsorbate_info", None)  # a dict the extxyz writer cannot store
    atoms.info[f"{keys_prefix}energy"] = float(energy)
    atoms.arrays[f"{keys_prefix}forces"] = np.array(forces)
    if stress is not None:
        atoms.info[f"{keys_prefix}stress"] = np.array(stress).reshape(-1)
    return atoms


def _bulk(rng, elements: Sequence[str], n_species: int, repeat):
    host = elements[rng.integers(len(elements))]
    a = reference_states[atomic_numbers[host]]["a"]
    kind = rng.integers(3)
    if kind == 0:
        atoms = bulk(host, "fcc", a=a, cubic=True)         # 4 atoms
    elif kind == 1:
        atoms = bulk(host, "fcc", a=a) * (2, 1, 1)         # 2 atoms, triclinic cell
    else:
        atoms = bulk(host, "fcc", a=a) * (2, 2, 1)
    atoms = atoms * repeat
    n_species = min(n_species, len(elements))
    if n_species > 1:
        others = rng.choice([e for e in elements if e != host], size=n_species - 1, replace=False)
        symbols = rng.choice([host, *others], size=len(atoms))
        atoms.set_chemical_symbols(symbols.tolist())
        # alloys take a lattice constant between their constituents' (Vegard-like)
        avg_a = np.mean([reference_states[atomic_numbers[s]]["a"] for s in symbols])
        atoms.set_cell(atoms.cell.array * avg_a / a, scale_atoms=True)
    return atoms


def _strain_and_rattle(rng, atoms, max_strain: float, rattle: float):
    eps = rng.uniform(-max_strain, max_strain, size=(3, 3))
    eps = 0.5 * (eps + eps.T)
    atoms.set_cell(atoms.cell.array @ (np.eye(3) + eps), scale_atoms=True)
    atoms.positions += rng.normal(scale=rattle, size=atoms.positions.shape)
    return atoms


def _surface(rng, elements: Sequence[str]):
    host = elements[rng.integers(len(elements))]
    build = fcc111 if rng.random() < 0.5 else fcc100
    atoms = build(host, size=(2, 2, 3), vacuum=6.0, periodic=True)
    if rng.random() < 0.4:
        other = elements[rng.integers(len(elements))]
        symbols = np.array(atoms.get_chemical_symbols())
        symbols[rng.random(len(atoms)) < 0.3] = other
        atoms.set_chemical_symbols(symbols.tolist())
    atoms.positions += rng.normal(scale=0.06, size=atoms.positions.shape)
    return atoms


def emt_structures(n: int, seed: int = 0, elements: Sequence[str] = EMT_ELEMENTS,
                   max_atoms: int = 16) -> List:
    """``n`` labelled ``ase.Atoms``: ~55 % strained+rattled bulk (pure and alloys), ~20 % hot
    (more strongly rattled, as in MD well above room temperature) bulk, ~25 % rattled surface
    slabs. Sizes stay at or under ``max_atoms``. Displacements stay physical (<~0.1 Å rms):
    larger ones make a few structures with forces of tens of eV/Å that dominate any loss."""
    unknown = sorted(set(elements) - set(EMT_ELEMENTS))
    if unknown:
        raise ValueError(f"elements {unknown} are not supported here; choose from {EMT_ELEMENTS}")
    rng = np.random.default_rng(seed)
    out = []
    while len(out) < n:
        r = rng.random()
        if r < 0.55:
            atoms = _bulk(rng, elements, int(rng.integers(1, 4)), (1, 1, 1))
            atoms = _strain_and_rattle(rng, atoms, 0.04, rng.uniform(0.01, 0.07))
        elif r < 0.75:
            atoms = _bulk(rng, elements, int(rng.integers(1, 3)), (1, 1, 1))
            atoms = _strain_and_rattle(rng, atoms, 0.05, 0.1)
        else:
            atoms = _surface(rng, elements)
        if len(atoms) <= max_atoms:
            out.append(_label(atoms))
    return out


def write_emt_dataset(path: str, n: int, seed: int = 0, **kwargs) -> str:
    """``emt_structures(n, seed, **kwargs)`` written to ``path`` as extended XYZ; returns ``path``."""
    ase.io.write(path, emt_structures(n, seed, **kwargs), format="extxyz")
    return path
