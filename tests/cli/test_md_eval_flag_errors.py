"""`equikernels md` and `eval` with a bad option value: one line naming the option and what it
expects, exit status 2, no traceback, nothing written; an option the chosen ensemble does not read
is refused, not ignored; Ctrl-C before the command runs ends in one line and status 130."""
import numpy as np
import pytest
from ase.build import bulk
from ase.calculators.singlepoint import SinglePointCalculator
from ase.io import write

import equikernels.cli as cli
from equikernels.cli import main
from cli_checks import one_line_error


@pytest.fixture
def cu_file(tmp_path):
    path = tmp_path / "cu.xyz"
    write(str(path), bulk("Cu", "fcc", a=3.61, cubic=True))
    return str(path)


@pytest.mark.parametrize("flags, needles", [
    (["--skin", "-1"], ["--skin must be", ">= 0", "-1"]),
    (["--skin", "nan"], ["--skin must be", "nan"]),
    (["--seed", "-1"], ["--seed must be a non-negative integer", "-1"]),
    (["--temperature", "0"], ["--temperature", "positive temperature"]),
    (["--pressure", "5"], ["--pressure applies to --ensemble npt only", "nvt-langevin"]),
    (["--friction", "3", "--ensemble", "nve"], ["--friction applies to --ensemble nvt-langevin only", "nve"]),
    (["--tdamp", "10"], ["--tdamp applies to", "nvt-nose-hoover", "nvt-langevin"]),
    (["--pdamp", "10", "--ensemble", "nvt-bussi"], ["--pdamp applies to --ensemble npt only"]),
    (["--device", "nonsense"], ["--device must be", "'nonsense'"]),
    (["--head", "nope"], ["--head 'nope'", "heads"]),
])
def test_md_bad_option_names_it(cu_model, cu_file, tmp_path, capsys, flags, needles):
    out = tmp_path / "run"
    assert main(["md", cu_file, "--model", cu_model, "--out", str(out), "--no-progress", *flags]) == 2
    one_line_error(capsys, *needles)
    assert not out.exists()


@pytest.mark.parametrize("kind", ["below a file", "empty"])
def test_md_out_that_cannot_be_a_folder_fails_before_the_model_loads(cu_file, tmp_path, capsys, monkeypatch, kind):
    from equikernels.calculators import calculator

    def no_model(*args, **kwargs):
        raise AssertionError("the model was loaded")
    monkeypatch.setattr(calculator, "MACECalculator", no_model)
    (tmp_path / "afile").write_text("x")
    out = str(tmp_path / "afile" / "run") if kind == "below a file" else ""
    assert main(["md", cu_file, "--out", out, "--no-progress"]) == 2
    one_line_error(capsys, "--out", "afile" if out else "empty")


def test_md_ensemble_options_reach_the_run(cu_model, cu_file, tmp_path, single_thread):
    import json

    out = tmp_path / "npt"
    assert main(["md", cu_file, "--model", cu_model, "--out", str(out), "--no-progress", "--steps", "1",
                 "--ensemble", "npt", "--pressure", "-2.5", "--pdamp", "500"]) == 0
    settings = json.loads((out / "summary.json").read_text())["settings"]
    assert (settings["pressure_bar"], settings["pdamp_fs"], settings["friction_per_ps"]) == (-2.5, 500.0, 10.0)


@pytest.fixture
def labelled(tmp_path):
    """Two Cu frames with labels under REF_* keys, and a copy with them as ASE calculator results."""
    frames, as_results = [], []
    for n in (1, 2):
        a = bulk("Cu", "fcc", a=3.6) * (n, 1, 1)
        a.info["REF_energy"] = -1.0 * n
        a.arrays["REF_forces"] = np.zeros((n, 3))
        frames.append(a)
        b = a.copy()
        b.calc = SinglePointCalculator(b, energy=-1.0 * n, forces=np.zeros((n, 3)))
        as_results.append(b)
    write(str(tmp_path / "ref.xyz"), frames)
    write(str(tmp_path / "calc.xyz"), as_results)
    return tmp_path


@pytest.mark.parametrize("source, flags, needles", [
    ("ref.xyz", ["--device", "nonsense"], ["--device must be", "'nonsense'"]),
    ("ref.xyz", ["--head", "nope"], ["--head 'nope'", "heads"]),
    ("ref.xyz", ["--prefix", "REF_"], ["--prefix 'REF_'", "REF_energy", "labels"]),
    ("ref.xyz", ["--prefix", "P_", "--energy-key", "P_energy"], ["--prefix 'P_'", "P_energy"]),
    ("ref.xyz", ["--prefix", "my pred:"], ["--prefix 'my pred:'", "MACE_"]),
    ("calc.xyz", ["--prefix", ""], ["--prefix ''", "calculator results", "calc.xyz"]),
])
def test_eval_bad_option_names_it(labelled, cu_model, capsys, source, flags, needles):
    out = labelled / "pred.xyz"
    assert main(["eval", str(labelled / source), "--model", cu_model, "--out", str(out), "--no-progress",
                 *flags]) == 2
    one_line_error(capsys, *needles)
    assert not out.exists()


def test_eval_empty_prefix_without_calculator_labels_still_works(labelled, cu_model):
    from ase.io import read

    out = labelled / "pred.xyz"
    assert main(["eval", str(labelled / "ref.xyz"), "--model", cu_model, "--out", str(out), "--no-progress",
                 "--prefix", "", "--device", "cpu"]) == 0
    assert np.isfinite(read(str(out), index=0).get_potential_energy())


def test_interrupt_before_the_command_runs_is_one_line(monkeypatch, capsys):
    def interrupted():
        raise KeyboardInterrupt
    monkeypatch.setattr(cli, "build_parser", interrupted)  # as when Ctrl-C arrives while the commands import
    assert main(["md", "--steps", "1"]) == 130
    one_line_error(capsys, "equikernels: interrupted (SIGINT)")
    with pytest.raises(KeyboardInterrupt):
        main(["--debug", "md"])
