"""`equikernels md` with an equikernels model file (no mace-torch): a structure file read by ASE,
outputs written, and a clear error for elements the model does not know."""
import json

import pytest
from ase.build import bulk
from ase.io import read, write

from equikernels.cli import main


@pytest.fixture(scope="module")
def cu_model(tmp_path_factory):
    from equikernels.calculators.random_models import small_random_model
    from equikernels.models import save

    path = tmp_path_factory.mktemp("model") / "cu.model"
    save(small_random_model([29], seed=4), str(path))
    return str(path)


def test_md_from_structure_file(cu_model, tmp_path, single_thread):
    structure = tmp_path / "cu.extxyz"
    write(str(structure), bulk("Cu", "fcc", a=3.61, cubic=True))
    out = tmp_path / "run"
    assert main(["md", str(structure), "--model", cu_model, "--steps", "6", "--supercell", "1", "1", "2",
                 "--ensemble", "nvt-langevin", "--traj-interval", "3", "--out", str(out), "--no-progress",
                 "--device", "cpu"]) == 0
    assert len(read(str(out / "md.traj"), ":")) == 3
    summary = json.loads((out / "summary.json").read_text())
    assert summary["num_atoms"] == 8 and summary["neighbor_list_builds"] >= 1


def test_md_unknown_elements(cu_model, tmp_path):
    with pytest.raises(SystemExit, match="does not know: H, C, O"):
        main(["md", "ethanol", "--model", cu_model, "--steps", "1", "--out", str(tmp_path), "--no-progress",
              "--device", "cpu"])


def test_md_out_of_the_box_with_the_default_model(tmp_path, single_thread):
    """No structure, no model: the built-in Cu crystal with the bundled default model."""
    from equikernels.calculators.loading import default_model_path

    try:
        default_model_path()
    except FileNotFoundError:
        pytest.skip("no default model is bundled in this checkout")
    out = tmp_path / "run"
    assert main(["md", "--steps", "3", "--out", str(out), "--no-progress", "--device", "cpu"]) == 0
    summary = json.loads((out / "summary.json").read_text())
    assert summary["num_atoms"] == 108 and summary["temperature_end_K"] > 0
