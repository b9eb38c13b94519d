"""Small labelled structures and a two-head model for the multi-head training tests."""
import numpy as np
import torch


def write_cu_ni_frames(path, n, seed, *, energy_key="REF_energy", shift=0.0, stress=False, head=None,
                       config_type=None):
    """``n`` rattled cubic Cu cells (every other one with a Ni atom), EMT energies (plus ``shift`` eV per
    atom) under ``energy_key`` and forces under REF_forces (and stresses under REF_stress), written to
    ``path`` as extxyz; returns ``path``."""
    import ase.io
    from ase.build import bulk
    from ase.calculators.emt import EMT

    out = []
    for s in range(n):
        a = bulk("Cu", "fcc", a=3.6, cubic=True)
        if s % 2:
            a.numbers[0] = 28
        a.rattle(0.05, seed=seed + s)
        a.calc = EMT()
        a.info[energy_key] = a.get_potential_energy() + shift * len(a)
        a.arrays["REF_forces"] = a.get_forces()
        if stress:
            a.info["REF_stress"] = a.get_stress()
        a.calc = None
        if head:
            a.info["head"] = head
        if config_type:
            a.info["config_type"] = config_type
        out.append(a)
    ase.io.write(path, out, format="extxyz")
    return path


def two_head_model(path, heads=("pt_head", "Default")):
    """A small float64 model of ours for Ni and Cu, saved to ``path``; with two heads, E0 rows
    [-1, -2] and [-1.5, -2.5]."""
    from equikernels.training import model_factory as mf

    hp = dict(hidden_irreps="4x0e+4x1o", MLP_irreps="4x0e", num_interactions=1, correlation=2, max_ell=1, r_max=4.0,
              radial_MLP=[8], builder="equikernels")
    with torch.random.fork_rng():
        torch.manual_seed(0)
        model = mf.build_new_model(hp, [28, 29], np.array([-1.0, -2.0]), 12.0, 1.0, 0.0, heads=heads,
                                   backend="equikernels").double()
    if len(heads) == 2:
        mf.set_e0s(model, torch.tensor([[-1.0, -2.0], [-1.5, -2.5]], dtype=torch.float64))
    return mf.save_model(model, path)
