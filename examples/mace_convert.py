#!/usr/bin/env python
"""Convert a mace-torch model to equikernels, compare energies/forces/stress, save and reload.

With a mace-torch ``.model`` file:   python examples/mace_convert.py path/to/model.model
Without one (needs mace-torch):     python examples/mace_convert.py
  builds a small random mace-torch ScaleShiftMACE instead.
Without mace-torch at all, the script builds a random equikernels model with
``equikernels.models.builder`` and shows the same calls.
"""
from __future__ import annotations

import sys
import tempfile
from pathlib import Path

import ase.build
import torch

from equikernels.models import atoms_to_data, from_mace, load, save
from equikernels.models.builder import mace_config, random_model

DTYPE = torch.float64


def small_mace_torch_model():
    import numpy as np
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


def main() -> int:
    atoms = ase.build.bulk("Cu", "fcc", a=3.6, cubic=True).repeat((2, 2, 2))
    atoms.numbers[::5] = 79
    atoms.rattle(0.05, seed=0)
    reference = None
    try:
        if len(sys.argv) > 1:
            ours = load(sys.argv[1]).to(DTYPE)          # a mace-torch .model file
            print(f"loaded {sys.argv[1]}")
        else:
            mace_model = small_mace_torch_model()
            ours = from_mace(mace_model)                # a mace-torch model object
            data = atoms_to_data(atoms, float(mace_model.r_max), mace_model.atomic_numbers, dtype=DTYPE)
            reference = mace_model(dict(data), compute_stress=True)
    except ImportError:
        print("mace-torch is not installed: using a random equikernels model instead")
        cfg = mace_config(r_max=5.0, num_bessel=8, num_polynomial_cutoff=5, max_ell=3,
                          interaction="RealAgnosticResidualInteractionBlock",
                          interaction_first="RealAgnosticResidualInteractionBlock", num_interactions=2,
                          atomic_numbers=[29, 79], hidden_irreps="16x0e+16x1o", MLP_irreps="16x0e",
                          avg_num_neighbors=20.0, correlation=3)
        ours = random_model(cfg, dtype=DTYPE)
    data = atoms_to_data(atoms, float(ours.r_max), ours.atomic_numbers, dtype=DTYPE)
    out = {k: v.detach() for k, v in ours(dict(data), compute_stress=True).items() if v is not None}
    print(f"{type(ours).__name__}: E = {float(out['energy']):.8f} eV, max |F| = {float(out['forces'].abs().max()):.6f}"
          f" eV/A, stress[0,0] = {float(out['stress'][0, 0, 0]):.3e} eV/A^3")
    if reference is not None:
        for k in ("energy", "forces", "stress"):
            err = float((out[k] - reference[k]).abs().max() / reference[k].abs().max())
            print(f"  vs mace-torch {k:<7} max relative difference {err:.1e}")
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "model.ekm"
        save(ours, path)                                # config JSON + weights; loads without mace-torch
        again = load(path).to(DTYPE)(dict(data), compute_stress=True)
        same = all(torch.equal(again[k], out[k]) for k in ("energy", "forces", "stress"))
        print(f"saved to and reloaded from {path.name}: identical results = {same}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
