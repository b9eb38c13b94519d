"""examples/md_cluster.py runs NVE dynamics of a Cu-Ni nanoparticle with the bundled default model
and conserves the total energy; a negative step count is refused."""
import re
import runpy
import sys
from pathlib import Path

import pytest

EXAMPLE = Path(__file__).resolve().parents[2] / "examples" / "md_cluster.py"


def test_md_cluster_conserves_energy(monkeypatch, capsys, single_thread):
    monkeypatch.setattr(sys, "argv", [str(EXAMPLE), "--steps", "10", "--timestep", "1.0"])
    runpy.run_path(str(EXAMPLE), run_name="__main__")
    out = capsys.readouterr().out
    assert "Cu42Ni13 nanoparticle" in out
    deviation = float(re.search(r"largest deviation (\S+) eV", out).group(1))
    assert deviation < 1e-2  # 55 atoms, 10 fs: kinetic energy of ~2 eV, exchanged, not lost


def test_md_cluster_refuses_negative_steps(monkeypatch, capsys):
    monkeypatch.setattr(sys, "argv", [str(EXAMPLE), "--steps", "-5"])
    with pytest.raises(SystemExit) as exc:  # ASE runs no step for it, and the summary would claim -5
        runpy.run_path(str(EXAMPLE), run_name="__main__")
    assert exc.value.code == 2
    assert "--steps must be a non-negative integer, got -5" in capsys.readouterr().err
