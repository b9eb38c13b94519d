#!/usr/bin/env python
"""Convert a mace-torch model to equikernels, compare energies/forces/stress with mace-torch, save
and reload.

Your own model:   python examples/mace_convert.py path/to/model.model
  loads it with ``equikernels.models.load`` (a mace-torch ``.model`` file, or one of ours), builds a
  test crystal from the model's own elements, and, when the file is a mace-torch model and
  mace-torch is installed, evaluates the same structure with mace-torch and prints the differences.
No argument:      python examples/mace_convert.py
  builds a small random mace-torch ScaleShiftMACE (needs mace-torch) and does the same; without
  mace-torch, a random equikernels model shows the calls (no comparison).
"""
from __future__ import annotations

import importlib
import importlib.util
import pickle
import sys
import tempfile
from pathlib import Path

import ase.build
import numpy as np
import torch
from ase.data import covalent_radii

from equikernels.models import atoms_to_data, from_mace, load, save
from equikernels.models.builder import mace_config, random_model

DTYPE = torch.float64


def test_structure(atomic_numbers):
    """A rattled 32-atom fcc crystal cycling through ``atomic_numbers``, with the nearest-neighbour
    distance set by their mean covalent radius: every element of the model, in a periodic cell."""
    zs = [int(z) for z in atomic_numbers]
    nn = 2.0 * float(np.mean([covalent_radii[z] for z in zs]))
    atoms = ase.build.bulk("Cu", "fcc", a=nn * np.sqrt(2.0), cubic=True).repeat((2, 2, 2))
    atoms.numbers = [zs[k % len(zs)] for k in range(len(atoms))]
    atoms.rattle(0.05, seed=0)
    return atoms


def small_mace_torch_model():
    from mace import modules

    from equikernels._compat import default_dtype, o3

    residual = modules.interaction_classes["RealAgnosticResidualInteractionBlock"]
    with default_dtype(DTYPE):
        return modules.ScaleShiftMACE(
            r_max=5.0, num_bessel=8, num_polynomial_cutoff=5, max_ell=3, interaction_cls=residual,
            interaction_cls_first=residual, num_interactions=2, num_elements=2, hidden_irreps=o3.Irreps("16x0e+16x1o"),
            MLP_irreps=o3.Irreps("16x0e"), atomic_energies=np.array([-3.7, -4.1]), avg_num_neighbors=20.0,
            atomic_numbers=[29, 79], correlation=3, gate=torch.nn.functional.silu, atomic_inter_scale=1.0,
            atomic_inter_shift=0.0)


def mace_torch_module(path: str):
    """The mace-torch model in ``path``, or None (with the reason printed) when there is none to compare."""
    try:
        torch.load(path, map_location="cpu", weights_only=True)  # equikernels' own files load this way
        print(f"{path} is an equikernels model file: no mace-torch model to compare with")
        return None
    except pickle.UnpicklingError:
        pass
    if importlib.util.find_spec("mace") is None:
        print("mace-torch is not installed: skipping the comparison with mace-torch")
        return None
    importlib.import_module("equikernels._compat")  # lets e3nn load its constants on torch >= 2.6 first
    print(f"unpickling {path} for mace-torch (this runs code stored in the file: only for files you trust)")
    return torch.load(path, map_location="cpu", weights_only=False).to(DTYPE)


def model_and_reference():
    """(our model, mace-torch model or None, where it came from)."""
    if len(sys.argv) > 1:
        path = sys.argv[1]
        if Path(path).is_dir():
            return load(path).to(DTYPE), None, path
        return load(path).to(DTYPE), mace_torch_module(path), path
    try:
        mace_model = small_mace_torch_model()
    except ImportError:
        print("mace-torch is not installed: using a random equikernels model instead (no comparison)")
        cfg = mace_config(r_max=5.0, num_bessel=8, num_polynomial_cutoff=5, max_ell=3,
                          interaction="RealAgnosticResidualInteractionBlock",
                          interaction_first="RealAgnosticResidualInteractionBlock", num_interactions=2,
                          atomic_numbers=[29, 79], hidden_irreps="16x0e+16x1o", MLP_irreps="16x0e",
                          avg_num_neighbors=20.0, correlation=3)
        return random_model(cfg, dtype=DTYPE), None, "a random equikernels model"
    return from_mace(mace_model), mace_model, "a random mace-torch model"


def main() -> int:
    ours, mace_model, source = model_and_reference()
    atoms = test_structure(ours.atomic_numbers.tolist())
    print(f"{source}: {type(ours).__name__}, elements {sorted(set(atoms.get_chemical_symbols()))}, "
          f"test structure {atoms.get_chemical_formula()} ({len(atoms)} atoms, periodic)")
    data = atoms_to_data(atoms, float(ours.r_max), ours.atomic_numbers, dtype=DTYPE)
    out = {k: v.detach() for k, v in ours(dict(data), compute_stress=True).items() if v is not None}
    print(f"equikernels: E = {float(out['energy']):.8f} eV, max |F| = {float(out['forces'].abs().max()):.6f} eV/A, "
          f"stress[0,0] = {float(out['stress'][0, 0, 0]):.3e} eV/A^3")
    if mace_model is not None:
        reference = mace_model(dict(data), compute_stress=True)
        for k in ("energy", "forces", "stress"):
            diff = float((out[k] - reference[k].detach()).abs().max())
            scale = float(reference[k].detach().abs().max())
            print(f"  vs mace-torch {k:<7} max |difference| {diff:.2e} (relative {diff / max(scale, 1e-300):.1e})")
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "model.ekm"
        save(ours, path)                                # config JSON + weights; loads without mace-torch
        again = load(path).to(DTYPE)(dict(data), compute_stress=True)
        same = all(torch.equal(again[k], out[k]) for k in ("energy", "forces", "stress"))
        print(f"saved to and reloaded from {path.name}: identical results = {same}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
