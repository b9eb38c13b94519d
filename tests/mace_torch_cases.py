"""A small mace-torch ScaleShiftMACE with random (non-zero) weights on a rattled four-atom structure,
for the tests of ``accelerate`` on mace-torch models (needs mace-torch, imported lazily)."""
import numpy as np
import torch

from equikernels._compat import o3

TOL = 1e-10
ZS = (1, 6, 8)


def rel(a, b):
    return float((a - b).norm() / b.norm().clamp_min(1e-300))


def random_mace(seed=0, correlation=3, num_interactions=2, interaction="RealAgnosticResidualInteractionBlock",
                first="RealAgnosticInteractionBlock"):
    from mace import modules  # noqa: PLC0415

    torch.manual_seed(seed)
    m = modules.ScaleShiftMACE(
        r_max=3.0, num_bessel=4, num_polynomial_cutoff=5, max_ell=2,
        interaction_cls=modules.interaction_classes[interaction],
        interaction_cls_first=modules.interaction_classes[first],
        num_interactions=num_interactions, num_elements=len(ZS), hidden_irreps=o3.Irreps("4x0e+4x1o"), MLP_irreps=o3.Irreps("4x0e"),
        atomic_energies=np.array([-1.0, -2.0, -3.0]), avg_num_neighbors=5.0, atomic_numbers=list(ZS), correlation=correlation,
        gate=torch.nn.functional.silu, radial_MLP=[8, 8], atomic_inter_scale=1.3, atomic_inter_shift=0.2)
    with torch.no_grad():  # zero-initialised parts would hide mistakes
        for p in m.parameters():
            p.add_(torch.randn_like(p) * 0.3)
    return m


def rattled_atoms():
    import ase.build  # noqa: PLC0415

    atoms = ase.build.bulk("C", "diamond", a=3.57)
    atoms.numbers = np.array([1, 8])
    atoms = atoms.repeat((2, 1, 1))
    atoms.numbers = np.array([1, 6, 8, 6])
    atoms.rattle(0.1, seed=1)
    return atoms


def mace_batch(atoms):
    from mace import data as mdata  # noqa: PLC0415
    from mace import tools  # noqa: PLC0415
    from mace.tools import torch_geometric  # noqa: PLC0415

    cfg = mdata.config_from_atoms(atoms)
    graph = mdata.AtomicData.from_config(cfg, z_table=tools.AtomicNumberTable(list(ZS)), cutoff=3.0)
    return next(iter(torch_geometric.dataloader.DataLoader([graph], batch_size=1))).to_dict()
