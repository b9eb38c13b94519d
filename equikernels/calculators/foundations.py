"""mace-torch's foundation-model shortcuts on equikernels: ``mace_mp``, ``mace_off``, ``mace_omol`` and
``mace_anicc`` take the same model names, download into the same cache as mace-torch's
(``models.foundations``), and return our ``MACECalculator`` (MACE-MP and MACE-OFF converted to our
MACE; MACE-OMOL, whose charge and spin embeddings ours does not read, as mace-torch's module on our
kernels)."""
from __future__ import annotations

from ase.calculators.calculator import Calculator
from ase.units import Bohr

from ..models.foundations import mace_anicc_checkpoint, mace_mp_checkpoint, mace_off_checkpoint, mace_omol_checkpoint
from .calculator import MACECalculator


def mace_mp(model=None, device=None, default_dtype: str = "float32", dispersion: bool = False,
            damping: str = "bj", dispersion_xc: str = "pbe", dispersion_cutoff: float = 40.0 * Bohr,
            return_raw_model: bool = False, **kwargs):
    """``mace.calculators.mace_mp`` on equikernels: a MACE-MP foundation model (``mace_mp_checkpoint``)
    in our calculator (``MACECalculator`` keywords in ``kwargs``), float32 by default as there. With
    ``dispersion``, D3 (torch-dftd's ``TorchDFTD3Calculator``: ``damping``, ``dispersion_xc``,
    ``dispersion_cutoff``) is added through ASE's ``SumCalculator``. ``return_raw_model``: the
    converted model instead of a calculator. ``device`` "" or None: CUDA when available (mace-torch's "")."""
    device = device or None
    path = mace_mp_checkpoint(model)
    if return_raw_model:
        return _raw(path, device)
    calc = MACECalculator(path, device=device, default_dtype=default_dtype, **kwargs)
    if not dispersion:
        return calc
    return _with_d3(calc, damping, dispersion_xc, dispersion_cutoff)


def mace_off(model=None, device=None, default_dtype: str = "float64", return_raw_model: bool = False, **kwargs):
    """``mace.calculators.mace_off`` on equikernels: a MACE-OFF foundation model
    (``mace_off_checkpoint``) in our calculator, float64 by default as there; ``device`` as ``mace_mp``'s."""
    device = device or None
    path = mace_off_checkpoint(model)
    if return_raw_model:
        return _raw(path, device)
    return MACECalculator(path, device=device, default_dtype=default_dtype, **kwargs)


def mace_omol(model=None, device=None, default_dtype: str = "float64", return_raw_model: bool = False, **kwargs):
    """``mace.calculators.mace_omol`` on equikernels: a MACE-OMOL model (``mace_omol_checkpoint``:
    None or "extra_large", an https URL or a file) in our calculator, float64 by default as there.
    It reads each structure's ``atoms.info["charge"]`` and ``["spin"]`` (multiplicity; default 0 and
    1) as mace-torch's calculator does, with the model's head "omol" unless ``head`` is given;
    ``device`` as ``mace_mp``'s."""
    device = device or None
    path = mace_omol_checkpoint(model)
    if return_raw_model:
        return _raw(path, device)
    kwargs.setdefault("head", "omol")
    return MACECalculator(path, device=device, default_dtype=default_dtype, **kwargs)


def mace_anicc(device=None, model_path=None, return_raw_model: bool = False):
    """``mace.calculators.mace_anicc`` on equikernels: mace-torch's ANI-CC model (H, C, N, O;
    ``mace_anicc_checkpoint``) in our calculator, in float64 as there; ``device`` as ``mace_mp``'s."""
    device = device or None
    path = mace_anicc_checkpoint(model_path)
    if return_raw_model:
        return _raw(path, device)
    return MACECalculator(path, device=device, default_dtype="float64")


def _raw(path: str, device):
    """The model of ``path`` as the calculator loads it (converted, or mace-torch's module on our kernels)."""
    from .loading import load_model_file, resolve_device  # noqa: PLC0415
    return load_model_file(path, resolve_device(device))


def _with_d3(calc: MACECalculator, damping: str, xc: str, cutoff: float) -> Calculator:
    import torch  # noqa: PLC0415
    from ase.calculators.mixing import SumCalculator  # noqa: PLC0415
    try:
        from torch_dftd.torch_dftd3_calculator import TorchDFTD3Calculator  # noqa: PLC0415
    except ImportError as exc:
        missing = getattr(exc, "name", None) or ""
        if missing and missing.split(".")[0] != "torch_dftd":  # installed, but one of its own imports fails
            raise ImportError(f"dispersion=True: torch-dftd is installed but cannot be imported: {exc} "
                              f"(pip install {missing.split('.')[0]})") from exc
        raise ImportError("dispersion=True: needs torch-dftd for the D3 correction (pip install torch-dftd)") from exc
    dtype = torch.float64 if calc.dtype == torch.float64 else torch.float32
    d3 = TorchDFTD3Calculator(device=str(calc.device), damping=damping, dtype=dtype, xc=xc, cutoff=cutoff)
    return SumCalculator([calc, d3])
