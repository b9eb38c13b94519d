"""Importing equikernels ahead of e3nn lets e3nn 0.4.4 load its constants on torch >= 2.6 (``slice``
allowed in torch.load's safe globals before e3nn's first import), without importing torch itself."""
import subprocess
import sys

ORDER = """
import sys
import equikernels
import torch
before = slice in torch.serialization.get_safe_globals()
from e3nn import o3
print(before, slice in torch.serialization.get_safe_globals(), "torch" in sys.modules)
"""


def test_slice_is_allowed_before_e3nn_is_first_imported():
    out = subprocess.run([sys.executable, "-c", ORDER], capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stderr
    assert out.stdout.split() == ["False", "True", "True"]


def test_the_finder_steps_aside_once_e3nn_is_imported():
    check = ("import sys, e3nn, equikernels._e3nn_constants as c; c.install(); "
             "print(any(isinstance(f, c.BeforeE3nn) for f in sys.meta_path))")
    out = subprocess.run([sys.executable, "-c", check], capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stderr
    assert out.stdout.split() == ["False"]
