"""What a user of ASE or of mace-torch's calculator meets first: mace-torch's calculator attributes,
and stochastic thermostats that do not replay the initial velocities."""
import pytest
from ase.build import bulk
from ase.calculators.emt import EMT

from equikernels.calculators import MACECalculator
from equikernels.calculators.md import MDSettings, initialise_velocities, make_dynamics
from random_models import small_random_model


@pytest.fixture(scope="module")
def cu_model():
    return small_random_model([29], seed=2)


def test_mace_torch_attributes(cu_model, single_thread):
    calc = MACECalculator(cu_model, device="cpu")
    assert calc.models == [calc.model] and calc.num_models == 1
    assert calc.available_heads == calc.heads == [calc.head]
    committee = MACECalculator(models=[cu_model, small_random_model([29], seed=3)], device="cpu")
    assert committee.num_models == 2 and committee.models[1] is committee.members[1].model
    assert committee.models[0] is not committee.models[1]


def test_z_table_and_default_dtype_read_as_mace_torch_names_them(single_thread):
    model = small_random_model([8, 1, 29], seed=2)
    calc = MACECalculator(model, device="cpu", default_dtype="float32")
    assert calc.default_dtype == "float32"
    table = calc.z_table
    assert list(table.zs) == [int(z) for z in model.atomic_numbers] and len(table) == 3
    assert [table.z_to_index(z) for z in table.zs] == [0, 1, 2] and table.index_to_z(2) == table.zs[2]
    assert MACECalculator(model, device="cpu", default_dtype="float64").default_dtype == "float64"


@pytest.mark.parametrize("ensemble", ["nvt-langevin", "nvt-bussi"])
def test_the_first_thermostat_step_does_not_repeat_the_initial_velocities(ensemble):
    """Velocities and thermostat noise come from the same seed; were they one stream, the first
    Langevin kick would point along every atom's velocity and heat 108 atoms by about 90 K."""
    for seed in range(3):
        atoms = bulk("Cu", "fcc", a=3.61, cubic=True).repeat(3)
        atoms.calc = EMT()
        initialise_velocities(atoms, 300.0, seed=seed)
        start = atoms.get_temperature()
        make_dynamics(atoms, MDSettings(ensemble=ensemble, temperature_K=300.0, seed=seed)).run(1)
        assert abs(atoms.get_temperature() - start) < 0.1 * start, (seed, start, atoms.get_temperature())


def test_batch_evaluate_of_one_atoms_says_to_pass_a_list(cu_model, single_thread):
    calc = MACECalculator(cu_model, device="cpu")
    atoms = bulk("Cu", "fcc", a=3.61, cubic=True)
    with pytest.raises(TypeError, match=r"got one Atoms \(pass \[atoms\]\)"):
        calc.batch_evaluate(atoms)
    assert len(calc.batch_evaluate([atoms])) == 1


def test_the_builtin_slab_is_periodic_in_its_plane_only():
    from equikernels.calculators.md import BUILTIN_STRUCTURES, builtin_structure, check_ensemble

    slab = builtin_structure("pt-surface")
    assert slab.pbc.tolist() == [True, True, False] and "surface plane only" in BUILTIN_STRUCTURES["pt-surface"]
    with pytest.raises(ValueError, match="ensemble 'npt' needs a periodic structure"):
        check_ensemble(slab, MDSettings(ensemble="npt"))
