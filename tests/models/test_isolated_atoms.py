"""MACE and the ASE calculator on structures with no edges: one atom (the E0 reference
calculation), two atoms beyond the cutoff, a molecule plus a far-away atom, alone and batched;
energies, forces, stress and the parameter gradient of a force loss, reference and Triton backends."""
import numpy as np
import pytest
import torch
from ase import Atoms

from equikernels import settings
from equikernels.models import atoms_list_to_data
from equikernels.models.builder import mace_config, random_model

ZS = (1, 6, 8)
R_MAX = 3.0


def _model(**kw):
    base = dict(r_max=R_MAX, num_bessel=4, num_polynomial_cutoff=5, max_ell=1, model="MACE",
                interaction="RealAgnosticResidualInteractionBlock", interaction_first="RealAgnosticInteractionBlock",
                num_interactions=2, atomic_numbers=list(ZS), hidden_irreps="2x0e+2x1o", MLP_irreps="2x0e",
                avg_num_neighbors=3.0, correlation=2, radial_MLP=[4])
    base.update(kw)
    return random_model(mace_config(**base), seed=0, dtype=torch.float64)


def _structures():
    one = Atoms("O", positions=[[0.0, 0.0, 0.0]], cell=[8.0, 8.0, 8.0], pbc=True)
    far = Atoms("HC", positions=[[0.0, 0.0, 0.0], [0.0, 0.0, 9.0]])
    mol = Atoms("OHH", positions=[[0.0, 0.0, 0.0], [0.96, 0.0, 0.0], [-0.24, 0.93, 0.0]])
    mol_far = mol + Atoms("C", positions=[[30.0, 0.0, 0.0]])
    return one, far, mol, mol_far


@pytest.mark.parametrize("backend", ["reference", "triton"])
def test_mace_without_edges_all_orders(backend):
    model = _model()
    e0 = dict(zip(ZS, model.atomic_energies.tolist()))
    one, far, mol, mol_far = _structures()
    data = atoms_list_to_data([one, far, mol, mol_far], R_MAX, ZS, dtype=torch.float64)
    with settings.override(backend=backend):
        out = model(dict(data), training=True, compute_stress=True)
        energy, forces, stress = out["energy"], out["forces"], out["stress"]
        # no neighbours: no messages, so the non-residual first layer leaves nothing but E0
        torch.testing.assert_close(energy[0], torch.tensor(e0[8], dtype=torch.float64))
        torch.testing.assert_close(energy[1], torch.tensor(e0[1] + e0[6], dtype=torch.float64))
        torch.testing.assert_close(energy[3], energy[2] + e0[6])
        assert (forces[:3] == 0).all() and (forces[-1] == 0).all()
        torch.testing.assert_close(forces[-4:-1], forces[3:6])
        assert (stress[0] == 0).all()
        forces.pow(2).sum().backward()  # force training: the parameter gradient of a force loss
        grads = {n: p.grad for n, p in model.named_parameters()}
        assert all(g is not None and torch.isfinite(g).all() for g in grads.values())
        # a batch of isolated atoms only: every gradient exists and is zero
        model.zero_grad()
        alone = atoms_list_to_data([one, far], R_MAX, ZS, dtype=torch.float64)
        out = model(dict(alone), training=True, compute_stress=True)
        assert (out["forces"] == 0).all() and (out["stress"] == 0).all()
        (out["forces"].pow(2).sum() + out["stress"].pow(2).sum()).backward()
        assert all(p.grad is None or (p.grad == 0).all() for p in model.parameters())


def test_calculator_default_model_isolated_atoms():
    from equikernels.calculators import MACECalculator
    calc = MACECalculator(device="cpu", default_dtype="float64")
    z = int(calc.model.atomic_numbers[0])
    one = Atoms([z], positions=[[0.0, 0.0, 0.0]], cell=[12.0, 12.0, 12.0], pbc=True)
    e_one = calc.get_potential_energy(one)
    assert np.isfinite(e_one)
    assert (calc.get_forces(one) == 0).all() and (calc.get_stress(one) == 0).all()
    far = Atoms([z, z], positions=[[0.0, 0.0, 0.0], [40.0, 0.0, 0.0]])
    assert calc.get_potential_energy(far) == pytest.approx(2 * e_one, rel=1e-12)
    assert (calc.get_forces(far) == 0).all()
    mol = Atoms([z] * 3, positions=[[0.0, 0.0, 0.0], [2.3, 0.0, 0.1], [0.2, 2.4, 0.0]])
    e_mol, f_mol = calc.get_potential_energy(mol), calc.get_forces(mol)
    mol_far = mol + Atoms([z], positions=[[50.0, 0.0, 0.0]])
    assert calc.get_potential_energy(mol_far) == pytest.approx(e_mol + e_one, rel=1e-12)
    f = calc.get_forces(mol_far)
    assert (f[3] == 0).all() and np.abs(f_mol).max() > 0
    np.testing.assert_allclose(f[:3], f_mol, rtol=1e-10, atol=1e-12)


@pytest.mark.parametrize("backend", ["reference", "triton"])
def test_node_ops_with_no_nodes(backend):
    """A batch part without atoms of an element, or no nodes at all: empty results that still carry
    gradients (zeros) to the features and weights, to second order."""
    from equikernels._compat import default_dtype
    from equikernels.models.builder import coupled_u_matrices
    from equikernels.models.element_linear import ElementGroups, ElementLinear
    from equikernels.models.symmetric_contraction import SymmetricContraction

    us = coupled_u_matrices("2x0e+2x1o+2x2e", "2x0e+2x1o", 3)
    with default_dtype(torch.float64):
        sc = SymmetricContraction(2, [0, 1, 2], [0, 1], [3, 3], 2, us, backend=backend)
        lin = ElementLinear("3x0e+2x1o", 4, "4x0e+3x1o", "ir_mul")
    none = torch.zeros(0, dtype=torch.long)
    for op, x, param in ((lambda t: sc(t, none), torch.zeros(0, 18, dtype=torch.float64), sc.weights[1][2]),
                         (lambda t: lin(t, ElementGroups.build(none, 4)), torch.zeros(0, 9, dtype=torch.float64),
                          lin.weight)):
        x.requires_grad_()
        out = op(x)
        assert out.shape[0] == 0
        (g,) = torch.autograd.grad(out.pow(2).sum() + out.sum(), x, create_graph=True)
        (gw,) = torch.autograd.grad(g.pow(2).sum() + out.sum(), param)
        assert (gw == 0).all()
