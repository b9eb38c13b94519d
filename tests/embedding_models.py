"""Small float64 mace-torch models of any class (charge and spin embeddings, dipole models), for the
tests of models that read inputs beyond the graph."""
import numpy as np
import pytest
import torch

ZS = [1, 6, 8]
# total charge and spin embedded as MACE-OMOL models do
SPECS = {"total_charge": {"type": "categorical", "per": "graph", "num_classes": 11, "emb_dim": 4, "offset": 5},
         "total_spin": {"type": "categorical", "per": "graph", "num_classes": 5, "emb_dim": 4}}


def mixed_cell(seed=1):
    """A rattled 8-atom periodic cell of H, C and O (the elements ``ZS``)."""
    from ase.build import bulk

    atoms = bulk("C", "diamond", a=3.57, cubic=True)
    atoms.numbers = [1, 6, 8, 6, 1, 6, 8, 6]
    atoms.rattle(0.1, seed=seed)
    return atoms


def mace_torch_model(cls="ScaleShiftMACE", **kw):
    """A small float64 mace-torch model of class ``cls`` over ``ZS`` with random weights (skips without mace-torch)."""
    pytest.importorskip("mace")
    from mace import modules

    from equikernels._compat import default_dtype, o3

    block = modules.interaction_classes["RealAgnosticResidualInteractionBlock"]
    args = dict(r_max=3.5, num_bessel=4, num_polynomial_cutoff=5, max_ell=2, interaction_cls=block,
                interaction_cls_first=block, num_interactions=2, num_elements=len(ZS),
                hidden_irreps=o3.Irreps("4x0e+4x1o"), MLP_irreps=o3.Irreps("4x0e"), avg_num_neighbors=6.0,
                atomic_numbers=ZS, correlation=2, gate=torch.nn.functional.silu, radial_MLP=[8],
                atomic_energies=np.array([-1.0, -2.0, -3.0]))
    if cls == "ScaleShiftMACE":
        args.update(atomic_inter_scale=1.0, atomic_inter_shift=0.0)
    if cls in ("AtomicDipolesMACE", "EnergyDipolesMACE"):  # the readout MLP's gated vectors give the dipoles
        args["MLP_irreps"] = o3.Irreps("4x1o" if cls == "AtomicDipolesMACE" else "4x0e+4x1o")
    if cls == "AtomicDipolesMACE":
        args["atomic_energies"] = None
    args.update(kw)
    with default_dtype(torch.float64):
        torch.manual_seed(0)
        model = getattr(modules, cls)(**args)
        for p in model.parameters():  # away from the initial values, which zero some paths
            p.data += 0.2 * torch.randn_like(p)
    return model
