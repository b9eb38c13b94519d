"""equikernels: fast e3nn-compatible equivariant tensor products, MACE, MD and fine-tuning.

Main entry points:

- ``equikernels.TensorProduct``, ``FullyConnectedTensorProduct``, ``Linear``, ``SphericalHarmonics``
  ... : drop-in replacements for ``e3nn.o3`` modules (same arguments, weights and results);
  ``equikernels.from_e3nn(module)`` converts one, ``equikernels.accelerate(model)`` every one in a model.
- ``equikernels.TensorProductConv`` / ``ConvGraph``: the fused gather, tensor product and scatter of
  message passing.
- ``equikernels.models``: MACE without mace-torch (``load``/``save``, ``from_mace``; ``load`` also reads
  mace-torch ``.model`` files).
- ``equikernels.calculators.MACECalculator``: the ASE calculator (bundled default model, a model
  file, or a module); ``equikernels.calculators.md.run_md`` for MD from Python.
- ``equikernels.training.fine_tune``: fine-tune or train a MACE on ASE-readable data.
- The ``equikernels`` command (also ``python -m equikernels``): ``md``, ``fine-tune``, ``convert``,
  ``tune`` and more; ``equikernels --help`` lists them, ``--version`` prints the version.

Light at import: the names above (and torch with them) load at first use, no kernel is generated
or compiled before its first use, and the models, calculators and training packages load only when
used.
"""
import importlib
import importlib.util
from typing import TYPE_CHECKING, Any, List

from . import _e3nn_constants
from ._version import __version__

if TYPE_CHECKING:  # the names for type checkers and editors; at run time __getattr__ imports them
    from .adapters import AccelerateReport, accelerate
    from .nn import (ChannelWiseTensorProduct, ElementwiseTensorProduct, FullTensorProduct,
                     FullyConnectedTensorProduct, Linear, SphericalHarmonics, TensorProduct, TensorProductConv,
                     from_e3nn)
    from .ops.conv import ConvGraph
    from .problem import TPProblem

_e3nn_constants.install()  # importing equikernels ahead of e3nn 0.4.4 lets e3nn load on torch >= 2.6

# public names and the modules that define them, imported at first use: importing the package (and
# its command line, whose Ctrl-C handler must be in place before torch loads) imports no torch
_EXPORTS = {name: ".nn" for name in (
    "TensorProduct", "FullyConnectedTensorProduct", "ElementwiseTensorProduct", "FullTensorProduct",
    "ChannelWiseTensorProduct", "TensorProductConv", "Linear", "SphericalHarmonics", "from_e3nn", "TensorSquare")}
_EXPORTS.update({"accelerate": ".adapters", "AccelerateReport": ".adapters", "ConvGraph": ".ops.conv",
                 "TPProblem": ".problem"})

_ALL = [name for name in _EXPORTS if name != "TensorSquare"] + ["__version__"]


def __getattr__(name: str) -> Any:
    """The public names, ``__all__`` (TensorSquare only where the installed e3nn has it) and the
    subpackages (``equikernels.models`` after ``import equikernels``), imported at first use."""
    if name == "__all__":
        value: Any = _ALL + (["TensorSquare"] if "TensorSquare" in importlib.import_module(".nn", __name__).__all__
                             else [])
    elif name in _EXPORTS:
        module = importlib.import_module(_EXPORTS[name], __name__)
        if name not in getattr(module, "__all__", [name]):
            raise AttributeError(f"module {__name__!r} has no attribute {name!r} (the installed e3nn has no {name})")
        value = getattr(module, name)
    elif not name.startswith("_") and importlib.util.find_spec(f"{__name__}.{name}") is not None:
        value = importlib.import_module(f".{name}", __name__)
    else:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    globals()[name] = value
    return value


def __dir__() -> List[str]:
    return sorted(set(globals()) | set(_ALL))


def _load_experimental() -> None:
    """The experimental paths, when the environment asks for them (a bad value raises at first use)."""
    from . import settings  # noqa: PLC0415
    try:
        wanted = settings.get().radial_conv != "0" or settings.get().fused_mlp
    except settings.SettingsError:
        return
    if wanted:
        from . import experimental  # noqa: PLC0415
        experimental.enable()


_load_experimental()
