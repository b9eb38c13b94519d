"""Models that read the total charge, spin or per-atom charges (charge and spin embeddings as in
MACE-OMOL, ``EnergyDipolesMACE``) through ``equikernels eval`` / ``training.evaluate.predict``,
``equikernels md`` and ``equikernels fine-tune``: the frames' charge and spin reach the model as
mace-torch's calculator gives them, or the entry point refuses in one line naming the model and the
input it does not give."""
import ase.io
import numpy as np
import pytest
import torch
from ase.build import molecule

from cli_checks import one_line_error
from embedding_models import SPECS, mace_torch_model
from equikernels.cli import main


@pytest.fixture(autouse=True)
def _one_thread(single_thread):
    yield


def _molecules(charges):
    """Ethanol frames; ``charges``: (charge, spin) per frame, None for a frame naming neither."""
    frames = []
    for k, cs in enumerate(charges):
        atoms = molecule("CH3CH2OH")
        atoms.rattle(0.05, seed=k)
        if cs is not None:
            atoms.info.update(charge=cs[0], spin=cs[1])
        frames.append(atoms)
    return frames


def _mace_torch_calculator(path):
    from mace.calculators import MACECalculator

    return MACECalculator(model_paths=path, device="cpu", default_dtype="float64")


@pytest.mark.mace
def test_eval_gives_the_frames_charge_and_spin_as_mace_torch_does(tmp_path, monkeypatch, capsys):
    """Frames naming no charge: mace_eval_configs' numbers (charge 0, spin 1); charged frames: mace-torch's
    calculator's (mace_eval_configs reads no charge or spin from the frames at all)."""
    eval_configs = pytest.importorskip("mace.cli.eval_configs")

    monkeypatch.setenv("TORCH_FORCE_NO_WEIGHTS_ONLY_LOAD", "1")
    path = str(tmp_path / "embedding.model")
    torch.save(mace_torch_model(embedding_specs=SPECS, use_embedding_readout=True), path)
    frames_file, ours, theirs = (str(tmp_path / n) for n in ("mols.xyz", "ours.xyz", "theirs.xyz"))
    ase.io.write(frames_file, _molecules([None, (1, 2), (-1, 2), None]), format="extxyz")
    saved = torch.get_default_dtype()
    try:
        monkeypatch.setattr("sys.argv", ["mace_eval_configs", "--configs", frames_file, "--model", path,
                                         "--output", theirs, "--batch_size", "3"])
        eval_configs.run(eval_configs.parse_args())
    finally:
        torch.set_default_dtype(saved)
    with pytest.warns(RuntimeWarning, match="equikernels.accelerate"):
        assert main(["eval", frames_file, "--model", path, "--out", ours, "--batch-size", "3", "--no-progress",
                     "--device", "cpu"]) == 0
    calc = _mace_torch_calculator(path)
    got, want = ase.io.read(ours, ":"), ase.io.read(theirs, ":")
    for k in (0, 3):
        assert got[k].info["MACE_energy"] == pytest.approx(want[k].info["MACE_energy"], abs=1e-8)
        np.testing.assert_allclose(got[k].arrays["MACE_forces"], want[k].arrays["MACE_forces"], atol=2e-8)
    for k in (1, 2):
        frame = ase.io.read(frames_file, k)
        frame.calc = calc
        assert got[k].info["MACE_energy"] == pytest.approx(frame.get_potential_energy(), abs=1e-8)
        np.testing.assert_allclose(got[k].arrays["MACE_forces"], frame.get_forces(), atol=2e-8)
        assert abs(got[k].info["MACE_energy"] - want[k].info["MACE_energy"]) > 1e-3  # the charge counted
    capsys.readouterr()

    # a total charge only under mace_run_train's key would be evaluated as neutral: refused, naming the frame
    renamed = _molecules([None])
    renamed[0].info["total_charge"] = 1
    ase.io.write(frames_file, renamed, format="extxyz")
    with pytest.warns(RuntimeWarning, match="equikernels.accelerate"):
        assert main(["eval", frames_file, "--model", path, "--out", ours, "--overwrite", "--no-progress",
                     "--device", "cpu"]) == 2
    one_line_error(capsys, "mols.xyz, frame 0: its total charge is under 'total_charge'", "rename the key to 'charge'")


@pytest.mark.mace
def test_predict_runs_an_energy_and_dipole_model_asmace_torch_model():
    """``predict`` gives an ``EnergyDipolesMACE`` the per-atom charges it reads (zeros without 'Qs')."""
    from equikernels.training.evaluate import predict

    MACECalculator = pytest.importorskip("mace.calculators").MACECalculator
    model = mace_torch_model("EnergyDipolesMACE")
    frames = _molecules([None, (1, 2)])
    frames[1].arrays["Qs"] = np.linspace(-0.5, 0.5, len(frames[1]))
    preds, _ = predict(model, frames, dtype=torch.float64, device="cpu", stress=False)
    calc = MACECalculator(models=model, device="cpu", default_dtype="float64")
    for p, atoms in zip(preds, frames):
        atoms.calc = calc
        assert p.energy == pytest.approx(atoms.get_potential_energy(), abs=1e-9)
        np.testing.assert_allclose(p.forces, atoms.get_forces(), atol=1e-9)


@pytest.mark.mace
def test_predict_refuses_an_embedding_it_does_not_take_from_the_frames():
    from equikernels.training.evaluate import predict

    specs = {"temperature": {"type": "continuous", "per": "graph", "in_dim": 1, "emb_dim": 4}}
    model = mace_torch_model(embedding_specs=specs)
    with pytest.raises(ValueError, match=r"^model: ScaleShiftMACE embeds 'temperature' \(embedding_specs\), which is "
                                         r"not taken from the frames: only the total charge"):
        predict(model, _molecules([None]), dtype=torch.float64, device="cpu")


@pytest.mark.mace
def test_md_gives_the_structure_files_charge_to_the_model(tmp_path):
    path = str(tmp_path / "embedding.model")
    torch.save(mace_torch_model(embedding_specs=SPECS, use_embedding_readout=True), path)
    frame = _molecules([(-1, 2)])[0]
    frame.center(vacuum=4.0)
    structure = str(tmp_path / "anion.xyz")
    ase.io.write(structure, frame, format="extxyz")
    out = str(tmp_path / "md")
    with pytest.warns(RuntimeWarning, match="equikernels.accelerate"):
        assert main(["md", structure, "--model", path, "--steps", "1", "--ensemble", "nve", "--log-interval", "1",
                     "--out", out, "--no-progress", "--device", "cpu"]) == 0
    epot = float(open(f"{out}/md.log").read().splitlines()[1].split()[3])
    frame.calc = _mace_torch_calculator(path)
    charged = frame.get_potential_energy()
    assert epot == pytest.approx(charged, abs=1e-5)
    frame.info = {}
    assert abs(frame.get_potential_energy() - charged) > 1e-3  # the charge counted


@pytest.mark.mace
@pytest.mark.parametrize("cls,kw,reads", [("ScaleShiftMACE", dict(embedding_specs=SPECS), "total_charge"),
                                          ("EnergyDipolesMACE", {}, "charges")])
def test_fine_tuning_such_a_model_is_refused_before_the_first_step(cls, kw, reads, tmp_path, capsys):
    path = str(tmp_path / "start.model")
    torch.save(mace_torch_model(cls, **kw), path)
    frames = _molecules([None, (1, 2), None, (0, 1)])
    for atoms in frames:
        atoms.info["REF_energy"] = -10.0
        atoms.arrays["REF_forces"] = np.zeros((len(atoms), 3))
    data = str(tmp_path / "train.xyz")
    ase.io.write(data, frames, format="extxyz")
    assert main(["fine-tune", "--model", path, "--backend", "mace", "--train", data, "--valid-fraction", "0.25",
                 "--epochs", "1", "--batch-size", "2", "--out", str(tmp_path / "run"), "--device", "cpu"]) == 2
    err = capsys.readouterr().err
    lines = [ln for ln in err.splitlines() if "error:" in ln]
    assert "Traceback" not in err and len(lines) == 1, err
    assert f"model: {cls} reads the input {reads!r}, which fine-tuning does not give" in lines[0]


class _ChargedDefault(torch.nn.Module):
    """The bundled default model plus 0.5 eV per unit of total charge: a model reading ``total_charge``."""

    def __init__(self):
        super().__init__()
        from equikernels.calculators.loading import resolve_model

        self.inner = resolve_model(None, torch.device("cpu"))
        self.r_max, self.atomic_numbers = self.inner.r_max, self.inner.atomic_numbers

    def forward(self, data, **kwargs):
        out = dict(self.inner(data, **kwargs))
        out["energy"] = out["energy"] + 0.5 * data["total_charge"]
        return out


def test_predict_reads_the_frames_charge_and_forward_names_a_missing_input(tmp_path):
    from equikernels.training import DataKeys, read_configs
    from equikernels.training.data import build_dataset, collate
    from equikernels.training.evaluate import forward, predict
    from emt_data import write_emt_dataset

    path = write_emt_dataset(str(tmp_path / "emt.xyz"), 3, seed=7, elements=("Cu", "Ni"), max_atoms=4)
    frames = ase.io.read(path, ":")
    frames[1].info["charge"] = 2
    frames[2].info["charge"] = -1
    ase.io.write(path, frames, format="extxyz")
    model = _ChargedDefault().double()
    kw = dict(dtype=torch.float64, device="cpu", batch_size=2)
    got, _ = predict(model, read_configs(path, DataKeys()), **kw)
    plain, _ = predict(model.inner, read_configs(path, DataKeys()), **kw)
    assert [g.energy - p.energy for g, p in zip(got, plain)] == pytest.approx([0.0, 1.0, -0.5], abs=1e-9)

    configs = read_configs(path, DataKeys())
    graphs = build_dataset(configs, model.atomic_numbers.tolist(), float(model.r_max), ["Default"]).graphs
    with pytest.raises(ValueError, match=r"^model: _ChargedDefault reads the input 'total_charge', which "
                                         r"fine-tuning does not give \("):
        forward(model, collate(graphs, torch.float64, "cpu"), training=True, stress=False)
