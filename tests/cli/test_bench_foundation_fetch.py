"""`equikernels bench --model NAME` names a mistyped name on any machine, but downloads a foundation
model only once a GPU is found to measure it on (not on a machine that would then refuse to run)."""
import importlib.machinery
import sys
import types

import pytest
import torch

from equikernels.bench import environment, suite
from equikernels.cli import main
from cli_checks import one_line_error


@pytest.fixture
def downloads(monkeypatch):
    """mace-torch's foundation-model table with one name, "medium", whose download is recorded and fails."""
    calls = []

    def download(model):
        calls.append(model)
        raise OSError("no network")
    fm = types.SimpleNamespace(mace_mp_names=["medium"], mace_off_urls={}, download_mace_mp_checkpoint=download)
    mace = types.ModuleType("mace")
    mace.__spec__ = importlib.machinery.ModuleSpec("mace", None)
    calculators = types.ModuleType("mace.calculators")
    calculators.foundations_models = fm
    mace.calculators = calculators
    for name, module in (("mace", mace), ("mace.calculators", calculators),
                         ("mace.calculators.foundations_models", fm)):
        monkeypatch.setitem(sys.modules, name, module)
    return calls


def test_no_download_without_a_gpu(downloads, tmp_path, capsys, monkeypatch):
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    assert main(["bench", "--model", "medium", "--out", str(tmp_path / "out")]) == 2
    one_line_error(capsys, "needs a CUDA GPU")
    assert downloads == []
    assert main(["bench", "--model", "mediun", "--out", str(tmp_path / "out")]) == 2
    one_line_error(capsys, "--model", "'mediun'", "neither a model file or directory nor a foundation-model name")


def test_downloaded_before_measuring(downloads, tmp_path, capsys, monkeypatch):
    measured = []
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(environment, "gpu_kind", lambda device: "nvidia-h200")
    monkeypatch.setattr(suite, "run_suite", lambda opts, device: measured.append(opts))
    assert main(["bench", "--model", "medium", "--out", str(tmp_path / "out")]) == 2
    one_line_error(capsys, "--model 'medium'", "could not be fetched")
    assert downloads == ["medium"] and measured == []
