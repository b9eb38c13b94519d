"""Import e3nn (and torch-geometric's data classes) safely on every supported torch/e3nn pair
(e3nn 0.4.4's constants: ``_e3nn_constants``)."""
import contextlib
import importlib
import io
import sys
import warnings

import torch

from . import _e3nn_constants

_e3nn_constants.allow()

import e3nn  # noqa: E402
from e3nn import o3  # noqa: E402

E3NN_VERSION = tuple(int(p) for p in e3nn.__version__.split(".")[:3] if p.isdigit())



@contextlib.contextmanager
def default_dtype(dtype: torch.dtype):
    """e3nn builds its CG buffers in the default dtype at construction: build e3nn
    references under the dtype they will run in."""
    old = torch.get_default_dtype()
    torch.set_default_dtype(dtype)
    try:
        yield
    finally:
        torch.set_default_dtype(old)


def pyg_data():
    """torch-geometric's ``(Batch, Data)``. Its first import calls ``torch.jit.script``, which torch
    2.14 warns is deprecated: a warning the user can do nothing about, so it is not shown."""
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", message="`torch.jit.script` is deprecated")  # Deprecation/Future
        from torch_geometric.data import Batch, Data  # noqa: PLC0415
    return Batch, Data


# printed by mace-torch's mace.tools.cg at its first import when cuEquivariance is absent
_MACE_NO_CUEQ = "Cuequivariance acceleration will be disabled"


def quiet_mace(module: str = "mace.tools.cg") -> None:
    """Imports mace-torch's ``module`` (nothing without mace-torch) holding back the line it prints
    when cuEquivariance is absent: where equikernels loads a mace-torch model its products run on
    equikernels' kernels, so "acceleration will be disabled" would mislead. Call it before importing
    mace-torch; anything else it prints still shows."""
    if module in sys.modules:
        return
    printed = io.StringIO()
    try:
        with contextlib.redirect_stdout(printed):
            importlib.import_module(module)
    except ImportError:
        pass  # the caller's own import of mace-torch says what is missing
    finally:
        kept = "".join(line for line in printed.getvalue().splitlines(keepends=True) if _MACE_NO_CUEQ not in line)
        if kept:
            sys.stdout.write(kept)


__all__ = ["o3", "e3nn", "E3NN_VERSION", "default_dtype", "pyg_data", "quiet_mace"]
