"""`equikernels md` with a multi-head model says which head ran, chosen by --head or not, on its model
line and in summary.json; a single-head model's run records no head."""
import json

import pytest
from ase.build import molecule
from ase.io import write

from equikernels.cli import main
from equikernels.models import save
from mace_models import _model


@pytest.fixture(scope="module")
def two_heads(tmp_path_factory):
    path = tmp_path_factory.mktemp("model") / "two.pt"
    save(_model(heads=["pt_head", "Default"]), str(path))
    return str(path)


@pytest.mark.parametrize("flags, head", [([], "Default"), (["--head", "pt_head"], "pt_head")])
def test_multi_head_run_records_its_head(two_heads, tmp_path, capsys, single_thread, flags, head):
    water = molecule("H2O")
    water.center(vacuum=3.0)
    path = tmp_path / "water.extxyz"
    write(str(path), water)
    out = tmp_path / "run"
    assert main(["md", str(path), "--model", two_heads, "--out", str(out), "--no-progress", "--steps", "1",
                 "--device", "cpu", *flags]) == 0
    assert f"two.pt, head {head} on cpu" in capsys.readouterr().out
    assert json.loads((out / "summary.json").read_text())["head"] == head


def test_single_head_run_records_no_head(cu_model, tmp_path, single_thread):
    out = tmp_path / "run"
    assert main(["md", "cu-fcc", "--model", cu_model, "--out", str(out), "--no-progress", "--steps", "0",
                 "--device", "cpu"]) == 0
    assert "head" not in json.loads((out / "summary.json").read_text())
