"""mace-torch imported through equikernels says nothing of cuEquivariance being absent (equikernels'
kernels run its products), while anything else it prints at import still shows."""
import importlib.util
import subprocess
import sys

import pytest

from equikernels._compat import quiet_mace

NOISY = '''print("cuequivariance or cuequivariance_torch is not available. Cuequivariance acceleration will be disabled.")
print("a line of its own")
VALUE = 7
'''


def test_only_the_cuequivariance_line_is_held_back(tmp_path, monkeypatch, capsys):
    (tmp_path / "noisy_mace_stand_in.py").write_text(NOISY)
    monkeypatch.syspath_prepend(str(tmp_path))
    quiet_mace("noisy_mace_stand_in")
    assert sys.modules["noisy_mace_stand_in"].VALUE == 7
    assert capsys.readouterr().out == "a line of its own\n"
    quiet_mace("no_such_mace_module")  # without mace-torch: nothing, the caller's import says what is missing
    assert capsys.readouterr().out == ""


@pytest.mark.mace
@pytest.mark.skipif(importlib.util.find_spec("cuequivariance_torch") is not None,
                    reason="with cuEquivariance installed mace-torch prints nothing to hold back")
def test_writing_a_mace_torch_file_prints_no_cuequivariance_line(tmp_path):
    pytest.importorskip("mace")
    from equikernels.default_model import default_model_path

    out = subprocess.run([sys.executable, "-m", "equikernels", "convert", default_model_path(),
                          str(tmp_path / "m.model"), "--to", "mace"], capture_output=True, text=True, timeout=600)
    assert out.returncode == 0, out.stderr
    assert "Cuequivariance" not in out.stdout + out.stderr and "converted" in out.stdout
