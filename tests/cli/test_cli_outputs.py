"""Files the commands write: an existing output is refused unless --overwrite (eval, export-lammps, as md
does), every file is renamed into place whole (bench's plots too), and inputs take what the other commands
take (tune --structure FILE@INDEX, bench --model directories)."""
import importlib
import json
import os
import subprocess

import ase.io
import pytest
import torch
from ase.build import bulk

from equikernels.cli import main
from equikernels.default_model import default_model_path
from cli_checks import one_line_error


def _dead_pid() -> int:
    child = subprocess.Popen(["true"])
    child.wait()
    return child.pid


@pytest.fixture
def structures(tmp_path):
    frames = []
    for n in (1, 2, 3):  # frames told apart by their size
        a = bulk("Cu", "fcc", a=3.6) * (n, 1, 1)
        a.rattle(0.02, seed=n)
        frames.append(a)
    path = tmp_path / "in.xyz"
    ase.io.write(str(path), frames, format="extxyz")
    return str(path)


def test_eval_refuses_an_existing_out_unless_overwrite(structures, tmp_path, capsys, monkeypatch):
    from equikernels.training import evaluate
    out = tmp_path / "pred.xyz"
    out.write_text("earlier predictions\n")
    real = evaluate.predict

    def not_run(*args, **kwargs):
        raise AssertionError("evaluated before the output was checked")
    monkeypatch.setattr(evaluate, "predict", not_run)
    argv = ["eval", structures + "@0", "--out", str(out), "--no-progress", "--device", "cpu"]
    assert main(argv) == 2
    one_line_error(capsys, "--out", "pred.xyz", "already exists", "--overwrite")
    assert out.read_text() == "earlier predictions\n"

    monkeypatch.setattr(evaluate, "predict", real)
    stale = tmp_path / f"pred.xyz.tmp{_dead_pid()}"  # a killed writer's leftover
    stale.write_text("half a file")
    assert main(argv + ["--overwrite"]) == 0
    assert "MACE_energy" in ase.io.read(str(out)).info
    assert sorted(p.name for p in tmp_path.iterdir()) == ["in.xyz", "pred.xyz"]


def test_eval_refuses_to_write_over_its_model(structures, tmp_path, capsys):
    model = tmp_path / "m.model"
    model.write_bytes(open(default_model_path(), "rb").read())
    before = model.read_bytes()
    assert main(["eval", structures, "--model", str(model), "--out", str(model), "--overwrite", "--no-progress",
                 "--device", "cpu"]) == 2
    one_line_error(capsys, "--out", "is the --model file itself")
    assert model.read_bytes() == before


def test_eval_interrupted_while_writing_keeps_the_earlier_file(structures, tmp_path, monkeypatch):
    out = tmp_path / "pred.xyz"
    out.write_text("earlier predictions\n")
    real = ase.io.write

    def cut_short(path, *args, **kwargs):
        real(path, *args, **kwargs)
        with open(path, "r+") as f:
            f.truncate(10)
        raise KeyboardInterrupt
    monkeypatch.setattr(ase.io, "write", cut_short)
    assert main(["eval", structures + "@0", "--out", str(out), "--overwrite", "--no-progress", "--device", "cpu"]) \
        == 130
    assert out.read_text() == "earlier predictions\n"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["in.xyz", "pred.xyz"]


def test_export_lammps_refuses_an_existing_out_unless_overwrite(tmp_path, capsys, monkeypatch):
    from equikernels.lammps import load_mliap
    from equikernels.models import io as model_io
    out = tmp_path / "m.pkl"
    out.write_bytes(b"an earlier export")
    real = model_io.load

    def not_read(*args, **kwargs):
        raise AssertionError("the model was read before the output was checked")
    monkeypatch.setattr(model_io, "load", not_read)
    assert main(["export-lammps", default_model_path(), str(out)]) == 2
    one_line_error(capsys, "OUT", "m.pkl", "already exists", "--overwrite")
    assert out.read_bytes() == b"an earlier export"

    monkeypatch.setattr(model_io, "load", real)
    assert main(["export-lammps", default_model_path(), str(out), "--overwrite"]) == 0
    assert load_mliap(out).element_types
    assert sorted(p.name for p in tmp_path.iterdir()) == ["m.pkl"]


def test_export_lammps_onto_a_link_to_its_model_is_refused(tmp_path, capsys):
    model = tmp_path / "model.model"
    model.write_bytes(open(default_model_path(), "rb").read())
    link = tmp_path / "link.model"
    link.symlink_to(model)
    before = model.read_bytes()
    assert main(["export-lammps", str(model), str(link), "--overwrite"]) == 2
    one_line_error(capsys, "OUT", "is the model file itself")
    assert model.read_bytes() == before and link.is_symlink()


def _tuned_structures(monkeypatch, tmp_path, structure):
    """The structures `equikernels tune --model --structure` runs a training step on (the GPU faked)."""
    cli = importlib.import_module("equikernels.cli.tune")
    monkeypatch.setenv("EQUIKERNELS_TUNE_FILE", str(tmp_path / "tuning.json"))
    monkeypatch.setattr(cli, "_device", lambda value: torch.device("cpu"))
    monkeypatch.setattr(torch.cuda, "synchronize", lambda *a, **k: None)
    seen = []
    monkeypatch.setattr(cli, "_model_step", lambda model, at, dtype, device: seen.append(len(at)))
    assert main(["tune", "--model", default_model_path(), "--structure", structure]) == 0
    return seen


@pytest.mark.parametrize("selection, sizes", [("", [3]), ("@0", [1]), ("@-2", [2]), ("@:2", [1, 2]),
                                              ("@::2", [1, 3])])
def test_tune_structure_takes_ases_frame_selection(selection, sizes, structures, tmp_path, monkeypatch):
    assert _tuned_structures(monkeypatch, tmp_path, structures + selection) == sizes


@pytest.mark.parametrize("selection, needles", [("@7", ["selects no frame", "holds 3"]),
                                                ("@x", ["'x' after '@' is not a frame selection"])])
def test_tune_structure_bad_selection_names_the_option(selection, needles, structures, capsys, monkeypatch):
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    assert main(["tune", "--model", default_model_path(), "--structure", structures + selection]) == 2
    one_line_error(capsys, "--structure", *needles)


def _run_file(tmp_path):
    from equikernels.bench.compare import SCHEMA
    tp = "tp/mace-large/float32/50000/fwd"
    run = {"schema": SCHEMA, "gpu_kind": "nvidia-h200", "env": {"torch": "2.11.0"}, "copy": {"gbps_median": 3000.0},
           "cells": [{"id": tp, "group": "tp", "impl": "equikernels", "status": "ok", "ms": 0.8, "gbps": 1500.0},
                     {"id": tp, "group": "tp", "impl": "cuequivariance", "status": "ok", "ms": 1.0}],
           "scope": {"groups": ["tp"], "problems": ["mace-large"]}}
    path = tmp_path / "run.json"
    path.write_text(json.dumps(run))
    return str(path)


def test_bench_plots_interrupted_while_writing_keep_the_earlier_plot(tmp_path, monkeypatch):
    from matplotlib.figure import Figure
    out = tmp_path / "out"
    out.mkdir()
    earlier = out / "nvidia-h200_speedup.png"
    earlier.write_bytes(b"an earlier plot")
    real = Figure.savefig

    def cut_short(self, fname, *args, **kwargs):
        real(self, fname, *args, **kwargs)
        with open(fname, "r+b") as f:
            f.truncate(10)
        raise KeyboardInterrupt
    monkeypatch.setattr(Figure, "savefig", cut_short)
    assert main(["bench", "--merge", _run_file(tmp_path), "--out", str(out)]) == 130
    assert earlier.read_bytes() == b"an earlier plot"
    assert not [p.name for p in out.iterdir() if ".tmp" in p.name]


def test_bench_plots_are_written_whole(tmp_path):
    out = tmp_path / "out"
    assert main(["bench", "--merge", _run_file(tmp_path), "--out", str(out)]) == 0
    names = sorted(p.name for p in out.iterdir())
    assert names == ["nvidia-h200.json", "nvidia-h200.md", "nvidia-h200_bandwidth.png", "nvidia-h200_speedup.png"]
    assert all((out / n).read_bytes()[:4] == b"\x89PNG" for n in names if n.endswith(".png"))


def test_bench_model_takes_a_model_directory(tmp_path, capsys, monkeypatch):
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    from equikernels.models import load, save
    folder = tmp_path / "model_dir"
    folder.mkdir()
    save(load(default_model_path()), folder)
    assert main(["bench", "--model", str(folder) + os.sep, "--out", str(tmp_path / "out")]) == 2
    one_line_error(capsys, "needs a CUDA GPU")  # the model argument passed: the missing GPU is what stops it
    assert main(["bench", "--model", str(tmp_path / "nope.model"), "--out", str(tmp_path / "out")]) == 2
    one_line_error(capsys, "--model", "nope.model", "neither a model file or directory nor a foundation-model name")
