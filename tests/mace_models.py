"""Small random MACE models (three elements, 4x0e+4x1o) and structures shared by the model tests."""
import numpy as np
import torch
from ase import Atoms

from equikernels.models import atoms_list_to_data
from equikernels.models.builder import mace_config, random_model

ZS = (1, 6, 8)
R_MAX = 3.0


def _batch(atoms_list, **kw):
    return atoms_list_to_data(atoms_list, R_MAX, ZS, dtype=torch.float64, **kw)


def _config(**kw):
    base = dict(r_max=R_MAX, num_bessel=5, num_polynomial_cutoff=5, max_ell=2,
                interaction="RealAgnosticResidualInteractionBlock", interaction_first="RealAgnosticInteractionBlock",
                num_interactions=2, atomic_numbers=list(ZS), hidden_irreps="4x0e+4x1o", MLP_irreps="4x0e",
                avg_num_neighbors=6.0, correlation=2, radial_MLP=[8])
    base.update(kw)
    return mace_config(**base)


def _model(dtype=torch.float64, seed=0, **kw):
    return random_model(_config(**kw), seed=seed, dtype=dtype)


def _crystal(seed=0):
    import ase.build

    a = ase.build.bulk("C", "diamond", a=3.57, cubic=True)
    a.numbers = np.random.default_rng(seed).choice(ZS, size=len(a))
    a.rattle(0.1, seed=seed)
    return a


def _molecule(seed=0):
    import ase.build

    m = ase.build.molecule("CH3CH2OH")
    m.rattle(0.05, seed=seed)
    return m


def layout_model(dtype=torch.float64, layout="ir_mul", device="cpu", **kw):
    base = dict(r_max=R_MAX, num_bessel=5, num_polynomial_cutoff=5, max_ell=2,
                interaction="RealAgnosticResidualInteractionBlock", interaction_first="RealAgnosticInteractionBlock",
                num_interactions=2, atomic_numbers=list(ZS), hidden_irreps="4x0e+4x1o", MLP_irreps="4x0e",
                avg_num_neighbors=6.0, correlation=2, radial_MLP=[8])
    base.update(kw)
    cfg = mace_config(**base)
    cfg["layout"] = layout
    return random_model(cfg, seed=0, dtype=dtype).to(device)


def mixed_atoms():
    import ase.build

    crystal = ase.build.bulk("C", "diamond", a=3.57, cubic=True).repeat((2, 1, 1))  # 16 in-edges per atom
    crystal.numbers = np.random.default_rng(0).choice(ZS, size=len(crystal))
    crystal.rattle(0.1, seed=0)
    lone = Atoms("O", positions=[[0.0, 0.0, 0.0]])  # no edges, between the other graphs' nodes
    mol = ase.build.molecule("CH3CH2OH")
    mol.rattle(0.05, seed=1)
    return [crystal, lone, mol]


def mace_torch_two_heads(path, heads=("pt_head", "Default")):
    """A small float64 mace-torch ScaleShiftMACE with two heads (distinct E0s, scales, shifts and readout
    weights), saved whole as mace-torch saves its models; needs mace-torch."""
    from mace import modules

    from equikernels._compat import default_dtype, o3

    with default_dtype(torch.float64), torch.random.fork_rng():
        torch.manual_seed(0)
        inter = modules.interaction_classes["RealAgnosticResidualInteractionBlock"]
        model = modules.ScaleShiftMACE(
            r_max=R_MAX, num_bessel=4, num_polynomial_cutoff=5, max_ell=2, interaction_cls=inter,
            interaction_cls_first=inter, num_interactions=2, num_elements=3, hidden_irreps=o3.Irreps("4x0e+4x1o"),
            MLP_irreps=o3.Irreps("4x0e"), atomic_energies=np.array([[-1.0, -2.0, -3.0], [-1.5, -2.5, -3.5]]),
            avg_num_neighbors=6.0, atomic_numbers=list(ZS), correlation=2, gate=torch.nn.functional.silu,
            radial_MLP=[8], heads=list(heads), atomic_inter_scale=[1.0, 0.5], atomic_inter_shift=[0.0, 0.1])
        for p in model.parameters():  # every readout weight away from its initial value
            p.data += 0.1 * torch.randn_like(p)
    torch.save(model, str(path))
    return str(path)
