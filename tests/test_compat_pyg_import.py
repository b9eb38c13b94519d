"""torch-geometric's data classes come without torch's deprecation warning about the torch.jit.script
that torch-geometric calls when first imported (a warning users of our commands cannot act on)."""
import subprocess
import sys

CHECK = """
import warnings
import equikernels._compat as compat
with warnings.catch_warnings(record=True) as caught:
    warnings.simplefilter("always")
    Batch, Data = compat.pyg_data()
print(Batch.__name__, Data.__name__, sum("torch.jit.script" in str(w.message) for w in caught))
"""


def test_first_import_shows_no_jit_script_deprecation():
    out = subprocess.run([sys.executable, "-c", CHECK], capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stderr
    assert out.stdout.split() == ["Batch", "Data", "0"]
