"""torch-geometric's data classes come without torch's deprecation warning about the torch.jit.script
that torch-geometric calls when first imported (a warning users of our commands cannot act on), and
only when first used: importing torch-geometric (2.8) replaces torch.index_select with a function
TorchScript cannot compile, which broke scripting other models (nequip's deploy, mace-torch's LAMMPS
export) in a process that had merely imported our package's commands, calculators or training."""
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


LIGHT = """
import sys
import equikernels, equikernels.cli, equikernels.calculators, equikernels.training, equikernels.training.evaluate
print("torch_geometric" in sys.modules)
"""


def test_importing_the_package_leaves_torch_geometric_unimported():
    out = subprocess.run([sys.executable, "-c", LIGHT], capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stderr
    assert out.stdout.split() == ["False"]
