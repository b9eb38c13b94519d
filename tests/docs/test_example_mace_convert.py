"""examples/mace_convert.py on a user's own model file: the test structure is built from the
model's own elements, and without mace-torch the comparison is skipped with a message."""
import runpy
import sys
from pathlib import Path

from equikernels.models import save
from random_models import small_random_model

EXAMPLE = Path(__file__).resolve().parents[2] / "examples" / "mace_convert.py"


def test_runs_on_a_model_of_other_elements(tmp_path, monkeypatch, capsys, single_thread):
    path = tmp_path / "pd_pt.model"
    save(small_random_model([46, 78], seed=3), str(path))  # Pd and Pt: neither Cu nor Au
    monkeypatch.setattr(sys, "argv", [str(EXAMPLE), str(path)])
    try:
        runpy.run_path(str(EXAMPLE), run_name="__main__")
    except SystemExit as exc:
        assert exc.code == 0
    out = capsys.readouterr().out
    assert "elements ['Pd', 'Pt']" in out and "identical results = True" in out
    assert "no mace-torch model to compare with" in out  # our own format: nothing to compare
