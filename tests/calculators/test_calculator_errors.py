"""Bad input to the calculator, the MD runner and the CLI gives clear errors (no mace-torch needed:
every check here fires before the model runs, so a stand-in module with MACE's attributes serves)."""
import pytest
import torch
from ase import Atoms
from ase.build import bulk, molecule

from equikernels.calculators import MACECalculator, loading
from equikernels.calculators.md import MDSettings, builtin_structure, make_dynamics, run_md


class StandIn(torch.nn.Module):
    """Has the attributes the calculator reads at construction; never called in these tests."""

    def __init__(self, atomic_numbers=(1, 6, 8), heads=None):
        super().__init__()
        self.register_buffer("atomic_numbers", torch.tensor(atomic_numbers))
        self.register_buffer("r_max", torch.tensor(4.0))
        self.weight = torch.nn.Parameter(torch.zeros(1, dtype=torch.float64))
        if heads is not None:
            self.heads = heads

    def forward(self, data, **kwargs):
        raise AssertionError("the stand-in model must not be called")


@pytest.fixture
def no_default_model(monkeypatch):
    monkeypatch.setattr(loading, "_default_model_finder", lambda: None)


def test_no_default_model(no_default_model):
    with pytest.raises(FileNotFoundError, match="no default model is bundled"):
        MACECalculator()


def test_missing_model_file(tmp_path):
    with pytest.raises(FileNotFoundError, match="no such model file"):
        MACECalculator(str(tmp_path / "missing.model"), device="cpu")


def test_model_of_wrong_type():
    with pytest.raises(TypeError, match="model must be"):
        MACECalculator(model=3.0, device="cpu")
    with pytest.raises(TypeError, match="r_max and atomic_numbers"):
        MACECalculator(model=torch.nn.Linear(2, 2), device="cpu")


def test_unknown_keywords_and_model_paths(tmp_path):
    # a misspelt or foreign keyword must not leave the bundled default model running silently
    with pytest.raises(TypeError, match="unexpected keyword argument 'defualt_dtype'"):
        MACECalculator(StandIn(), device="cpu", defualt_dtype="float32")
    with pytest.raises(TypeError, match="'compile'"):
        MACECalculator(StandIn(), device="cpu", compile="default")
    # mace-torch's model_paths names the model file, alone or as a list of one; models the module
    missing = str(tmp_path / "missing.model")
    for paths in (missing, [missing]):
        with pytest.raises(FileNotFoundError, match="no such model file"):
            MACECalculator(model_paths=paths, device="cpu")
    with pytest.raises(ValueError, match="models: expected at least one model, got none"):
        MACECalculator(models=[], device="cpu")
    with pytest.raises(ValueError, match="model and model_paths: give one of them"):
        MACECalculator(StandIn(), model_paths=missing, device="cpu")
    with pytest.raises(ValueError, match=r"model_type='DipoleMACE' does not fit the model: StandIn predicts "
                                         r"energies, not dipoles \(model_type='MACE', or leave model_type out\)"):
        MACECalculator(StandIn(), device="cpu", model_type="DipoleMACE")
    with pytest.raises(ValueError, match=r"model_type: expected one of \('MACE', 'EnergyDipoleMACE', 'DipoleMACE'\) "
                                         r".*got 'PolarMACE'"):
        MACECalculator(StandIn(), device="cpu", model_type="PolarMACE")
    with pytest.raises(ValueError, match=r"energy_units_to_eV: only 1.0 is supported .*got 0.0433"):
        MACECalculator(StandIn(), device="cpu", energy_units_to_eV=0.0433)
    with pytest.raises(FileNotFoundError, match="no such model file"):
        MACECalculator(model_path=missing, device="cpu")  # mace-torch's older name of model_paths
    # the rest of mace-torch's calculator call reads as there (its kernel, compilation and input-key
    # arguments have no effect)
    stand_in = StandIn()
    calc = MACECalculator(models=[stand_in], device="cpu", default_dtype="", model_type="MACE", enable_cueq=True,
                          enable_oeq=False, compile_mode="default", fullgraph=True, energy_units_to_eV=1.0,
                          length_units_to_A=1.0, charges_key="Qs", info_keys=None, arrays_keys=None,
                          compute_atomic_stresses=False, pad_num_atoms=0, pad_num_edges=0, warmup=False)
    assert calc.model is stand_in
    assert MACECalculator(StandIn(), device="cpu", label="run", directory=str(tmp_path)).label.endswith("run")


def test_bad_dtype_and_device():
    with pytest.raises(ValueError, match="default_dtype"):
        MACECalculator(StandIn(), device="cpu", default_dtype="float16")
    with pytest.raises(ValueError, match="device"):
        MACECalculator(StandIn(), device="not-a-device")


def test_heads():
    with pytest.raises(ValueError, match="not one of the model's heads"):
        MACECalculator(StandIn(), device="cpu", head="pbe")
    with pytest.raises(ValueError, match="none is called 'default'"):
        MACECalculator(StandIn(heads=["pbe", "r2scan"]), device="cpu")
    calc = MACECalculator(StandIn(heads=["pbe", "Default"]), device="cpu")
    assert calc.head == "Default"
    assert MACECalculator(StandIn(heads=["pbe", "r2scan"]), device="cpu", head="r2scan").head == "r2scan"


def test_empty_atoms():
    calc = MACECalculator(StandIn(), device="cpu")
    with pytest.raises(ValueError, match="empty"):
        calc.get_potential_energy(Atoms())
    with pytest.raises(ValueError, match=r"atoms_list\[1\] is empty"):
        calc.batch_evaluate([molecule("H2O"), Atoms()])


def test_calculate_without_atoms():
    calc = MACECalculator(StandIn(), device="cpu")
    with pytest.raises(ValueError, match="atoms: no structure"):
        calc.calculate()


def test_unknown_elements():
    calc = MACECalculator(StandIn(), device="cpu")
    with pytest.raises(ValueError, match="does not know: Na, Cl"):
        calc.get_potential_energy(Atoms("NaClH", positions=[[0, 0, 0], [2.5, 0, 0], [0, 2.5, 0]]))
    with pytest.raises(ValueError, match="does not know: Cu"):
        calc.batch_evaluate([molecule("H2O"), bulk("Cu")])


def test_stress_without_a_cell():
    calc = MACECalculator(StandIn(), device="cpu")
    with pytest.raises(ValueError, match="stress was requested"):
        calc.get_stress(molecule("H2O"))


def test_batch_arguments():
    calc = MACECalculator(StandIn(), device="cpu")
    assert calc.batch_evaluate([]) == []
    with pytest.raises(ValueError, match="unknown properties"):
        calc.batch_evaluate([molecule("H2O")], properties=("energy", "dipole"))
    with pytest.raises(ValueError, match="max_atoms_per_batch"):
        calc.batch_evaluate([molecule("H2O")], max_atoms_per_batch=0)
    with pytest.raises(TypeError, match="ase.Atoms"):
        calc.batch_evaluate(["H2O"])


def test_md_settings():
    with pytest.raises(ValueError, match="ensemble must be one of"):
        MDSettings(ensemble="nvt-nose").validate()
    with pytest.raises(ValueError, match="timestep_fs"):
        MDSettings(timestep_fs=0).validate()
    with pytest.raises(ValueError, match="needs a positive temperature"):
        MDSettings(ensemble="nvt-langevin", temperature_K=0).validate()
    with pytest.raises(ValueError, match="steps"):
        MDSettings(steps=-1).validate()
    with pytest.raises(ValueError, match="timestep_fs must be a finite number"):
        MDSettings(timestep_fs=float("inf")).validate()
    with pytest.raises(ValueError, match="npt"):
        make_dynamics(molecule("H2O"), MDSettings(ensemble="npt"))
    with pytest.raises(ValueError, match="no calculator"):
        run_md(molecule("H2O"), MDSettings(steps=1))
    with pytest.raises(ValueError, match="unknown built-in structure"):
        builtin_structure("argon")


def test_cli_without_default_model(no_default_model, tmp_path, capsys):
    from equikernels.cli import main
    assert main(["md", "--steps", "1", "--out", str(tmp_path), "--no-progress", "--device", "cpu"]) == 2
    assert "no default model is bundled" in capsys.readouterr().err
    assert main(["md", str(tmp_path / "nothing.xyz"), "--steps", "1"]) == 2
    assert "neither a file nor a built-in" in capsys.readouterr().err
