"""What the real ML-IAP couplings hand ``compute_forces`` beyond the emulator's plain arrays: the host
(non-KOKKOS) coupling's write-only ``eatoms`` and ``energy`` and its missing ``nlocal``; NULL buffers
(``None``) for the pair arrays of a rank that never had a pair; ``update_pair_forces`` indexing the
first row of ``fij``; and clear errors for NULL atom types and couplings without what a model needs."""
import numpy as np
import pytest

from emulator import decompose
from equikernels.lammps import EquikernelsMLIAP
from test_lammps_mliap import GRIDS, check, reference, small_cell, tiny_model, with_isolated_atom

PAIR_ARRAYS = ("pair_i", "pair_j", "rij")


def _first_row(fij) -> None:
    """The couplings pass ``&fij_arr[0][0]`` to C++: an empty array fails its bounds check."""
    if len(fij) == 0:
        raise IndexError("Out of bounds on buffer access (axis 0)")


class HostCouplingData:
    """The host coupling's ``MLIAPDataPy`` around an emulated rank: ``nlistatoms`` but no ``nlocal``,
    ``eatoms`` and ``energy`` settable only, NULL pair buffers while there are no pairs, and
    ``update_pair_forces`` taking a C-contiguous float64 host array."""

    def __init__(self, rank):
        self._rank = rank

    ntotal = property(lambda self: self._rank.ntotal)
    nlistatoms = property(lambda self: self._rank.nlocal)
    npairs = property(lambda self: self._rank.npairs)
    elems = property(lambda self: self._rank.elems if self._rank.ntotal else None)
    pair_i = property(lambda self: self._rank.pair_i if self._rank.npairs else None)
    pair_j = property(lambda self: self._rank.pair_j if self._rank.npairs else None)
    rij = property(lambda self: self._rank.rij if self._rank.npairs else None)

    def _set_eatoms(self, value):
        value = memoryview(value)  # what `cdef double[:] value_view = value` accepts
        if value.format != "d" or value.shape != (self._rank.nlocal,):
            raise ValueError(f"eatoms: expected {self._rank.nlocal} doubles, got {value.format} {value.shape}")
        self._rank.eatoms[:] = np.asarray(value)

    def _set_energy(self, value):
        self._rank.energy = float(value)

    eatoms = property(None, _set_eatoms)
    energy = property(None, _set_energy)

    def update_pair_forces(self, fij) -> None:
        view = memoryview(fij)  # `cdef double[:, ::1] fij_arr = fij`: no torch tensors
        if view.format != "d" or not view.c_contiguous:
            raise ValueError("fij: expected a C-contiguous float64 array")
        _first_row(fij)
        self._rank.update_pair_forces(np.asarray(fij))


def _run_host(obj, em):
    """Each rank through the host coupling in turn (no exchange), gathered as ``Emulation.run`` does."""
    forces, energies, virial, energy = np.zeros((em.num_atoms, 3)), np.zeros(em.num_atoms), np.zeros((3, 3)), 0.0
    for r in em.ranks:
        obj.compute_forces(HostCouplingData(r))
        np.add.at(forces, r.global_ids, r.f)
        energies[r.global_ids[:r.nlocal]] = r.eatoms
        virial += r.virial
        energy += r.energy
    return type("Result", (), {"energy": energy, "energies": energies, "forces": forces, "virial": virial})


@pytest.fixture(scope="module")
def one_layer():
    return tiny_model(1, hidden="4x0e", max_ell=1, correlation=1)


@pytest.mark.parametrize("atoms, domains", [(small_cell(), 2), (with_isolated_atom(), 4)], ids=["cell", "isolated"])
def test_host_coupling_single_layer(one_layer, atoms, domains):
    obj = EquikernelsMLIAP(one_layer)
    em = decompose(atoms, obj.element_types, float(one_layer.r_max), GRIDS[domains], exchange=False)
    assert any(r.npairs == 0 and r.nlocal for r in em.ranks) == (domains == 4)  # NULL pair buffers
    check(_run_host(obj, em), reference(one_layer, atoms), atoms)


def test_kokkos_coupling_rank_without_pairs():
    """The KOKKOS coupling hands None for a NULL buffer too; the rank of the isolated atom has no pairs."""
    obj = EquikernelsMLIAP(tiny_model(2, hidden="4x0e", max_ell=1, correlation=1))
    atoms = with_isolated_atom()
    em = decompose(atoms, obj.element_types, float(obj.model.r_max), GRIDS[4])
    for r in em.ranks:
        if r.npairs == 0:
            for name in PAIR_ARRAYS:
                setattr(r, name, None)
        plain = r.update_pair_forces
        r.update_pair_forces = lambda fij, plain=plain: (_first_row(fij), plain(fij))
    assert [r.nlocal for r in em.ranks if r.pair_i is None] == [0, 0, 1]
    check(em.run(obj, separate_objects=False), reference(obj.model, atoms), atoms)


def test_null_atom_types_are_named(one_layer):
    obj = EquikernelsMLIAP(one_layer)
    em = decompose(small_cell(), obj.element_types, float(one_layer.r_max), exchange=False)
    data = em.ranks[0]
    data.elems[data.nlocal:] = -1  # LAMMPS's map[] of a type given as NULL in pair_coeff
    with pytest.raises(ValueError, match=r"NULL in pair_coeff .* one of Ni Cu$"):
        obj.compute_forces(data)


def test_coupling_without_pair_i_or_exchange():
    obj = EquikernelsMLIAP(tiny_model(2, hidden="4x0e", max_ell=1, correlation=1))
    em = decompose(small_cell(), obj.element_types, float(obj.model.r_max), GRIDS[2], exchange=False)

    class MLIAPDataPy:  # an older coupling: the same arrays, but no pair_i
        __module__ = "lammps.mliap.mliap_unified_couple"
        nlistatoms, ntotal, npairs = em.ranks[0].nlocal, em.ranks[0].ntotal, em.ranks[0].npairs
        elems, pair_j, rij = em.ranks[0].elems, em.ranks[0].pair_j, em.ranks[0].rij

    with pytest.raises(RuntimeError, match=r"MLIAPDataPy has no pair_i: .* update LAMMPS$"):
        obj.compute_forces(MLIAPDataPy())
    kokkos = type("MLIAPDataPy", (type(em.ranks[0]),), {"__module__": "lammps.mliap.mliap_unified_couple_kokkos"})
    em.ranks[0].__class__ = kokkos  # a KOKKOS coupling from before forward_exchange
    with pytest.raises(RuntimeError, match="KOKKOS ML-IAP coupling .* no forward_exchange.*update LAMMPS"):
        obj.compute_forces(em.ranks[0])
