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

Light at import: no kernel is generated or compiled before its first use, and the models,
calculators and training packages load only when imported.
"""
from . import nn
from .adapters import AccelerateReport, accelerate
from .nn import (ChannelWiseTensorProduct, ElementwiseTensorProduct, FullTensorProduct, FullyConnectedTensorProduct,
                 Linear, TensorProductConv, SphericalHarmonics, TensorProduct, from_e3nn)
from .ops.conv import ConvGraph
from ._version import __version__
from .problem import TPProblem

__all__ = ["TensorProduct", "FullyConnectedTensorProduct", "ElementwiseTensorProduct", "FullTensorProduct",
           "ChannelWiseTensorProduct", "TensorProductConv", "Linear", "SphericalHarmonics", "from_e3nn", "accelerate",
           "AccelerateReport", "ConvGraph", "TPProblem", "__version__"]

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
if "TensorSquare" in nn.__all__:
    from .nn import TensorSquare  # noqa: F401
    __all__.append("TensorSquare")
