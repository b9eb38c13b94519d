"""mace-torch's foundation-model shortcuts on equikernels: ``mace_mp`` and ``mace_off`` take the same
model names, download into the same cache as mace-torch's (whose tables resolve the names, so a
name mace-torch knows works here), and return our ``MACECalculator`` with the model converted."""
from __future__ import annotations

import os
import urllib.request

from ase.calculators.calculator import Calculator
from ase.units import Bohr

from .calculator import MACECalculator


def _foundations(fn: str, model):
    try:
        from mace.calculators import foundations_models  # noqa: PLC0415
    except ImportError as exc:
        raise ImportError(f"{fn}(model={model!r}): named foundation models are found through mace-torch "
                          "(pip install mace-torch); or pass the path of a .model file") from exc
    return foundations_models


def _local(fn: str, model) -> str:
    path = os.fspath(model)
    if not os.path.isfile(path):
        raise FileNotFoundError(f"{fn}: model {path!r} is neither a model name nor a model file")
    return path


def _given_file(fn: str, model, names: str):
    """``model`` as a local file, or None where mace-torch resolves it (None, an https URL, a name
    in mace-torch's table ``names``)."""
    if model is None or str(model).startswith("https:"):
        return None
    try:
        table = getattr(_foundations(fn, model), names)
    except ImportError as exc:
        if os.path.isfile(os.fspath(model)):
            return os.fspath(model)
        raise ImportError(f"{fn}(model={model!r}): not a model file, and named foundation models are found "
                          "through mace-torch (pip install mace-torch)") from exc
    return None if model in table else _local(fn, model)


def mace_mp_checkpoint(model=None) -> str:
    """The local file of MACE-MP model ``model``: None (mace-torch's default), a name such as
    "small", "medium", "medium-mpa-0" or an https URL, downloaded by mace-torch into its cache the
    first time; any other value is a path to a model file."""
    path = _given_file("mace_mp", model, "mace_mp_names")
    return path if path is not None else _foundations("mace_mp", model).download_mace_mp_checkpoint(model)


def mace_off_checkpoint(model=None) -> str:
    """The local file of MACE-OFF model ``model``: None ("medium"), "small", "medium", "large" or an
    https URL, downloaded into mace-torch's cache the first time (the MACE-OFF models are distributed
    under the Academic Software License); any other value is a path to a model file."""
    path = _given_file("mace_off", model, "mace_off_urls")
    if path is not None:
        return path
    fm = _foundations("mace_off", model)
    url = fm.mace_off_urls["medium"] if model is None else fm.mace_off_urls.get(model, model)
    cache = fm.get_cache_dir()
    path = os.path.join(cache, os.path.basename(url).split("?")[0])
    if not os.path.isfile(path):
        os.makedirs(cache, exist_ok=True)
        print(f"downloading {url} to {path} (Academic Software License: https://github.com/gabor1/ASL)")
        partial = path + ".part"
        urllib.request.urlretrieve(url, partial)
        os.replace(partial, path)  # an interrupted download leaves no file that looks complete
    return path


def mace_mp(model=None, device=None, default_dtype: str = "float32", dispersion: bool = False,
            damping: str = "bj", dispersion_xc: str = "pbe", dispersion_cutoff: float = 40.0 * Bohr,
            return_raw_model: bool = False, **kwargs):
    """``mace.calculators.mace_mp`` on equikernels: a MACE-MP foundation model (``mace_mp_checkpoint``)
    in our calculator (``MACECalculator`` keywords in ``kwargs``), float32 by default as there. With
    ``dispersion``, D3 (torch-dftd's ``TorchDFTD3Calculator``: ``damping``, ``dispersion_xc``,
    ``dispersion_cutoff``) is added through ASE's ``SumCalculator``. ``return_raw_model``: the
    converted model instead of a calculator."""
    path = mace_mp_checkpoint(model)
    if return_raw_model:
        return _raw(path, device)
    calc = MACECalculator(path, device=device, default_dtype=default_dtype, **kwargs)
    if not dispersion:
        return calc
    return _with_d3(calc, damping, dispersion_xc, dispersion_cutoff)


def mace_off(model=None, device=None, default_dtype: str = "float64", return_raw_model: bool = False, **kwargs):
    """``mace.calculators.mace_off`` on equikernels: a MACE-OFF foundation model
    (``mace_off_checkpoint``) in our calculator, float64 by default as there."""
    path = mace_off_checkpoint(model)
    if return_raw_model:
        return _raw(path, device)
    return MACECalculator(path, device=device, default_dtype=default_dtype, **kwargs)


def _raw(path: str, device):
    from ..models import load  # noqa: PLC0415
    from .loading import resolve_device  # noqa: PLC0415
    return load(path, device=resolve_device(device))


def _with_d3(calc: MACECalculator, damping: str, xc: str, cutoff: float) -> Calculator:
    import torch  # noqa: PLC0415
    from ase.calculators.mixing import SumCalculator  # noqa: PLC0415
    try:
        from torch_dftd.torch_dftd3_calculator import TorchDFTD3Calculator  # noqa: PLC0415
    except ImportError as exc:
        raise ImportError("dispersion=True: needs torch-dftd for the D3 correction (pip install torch-dftd)") from exc
    dtype = torch.float64 if calc.dtype == torch.float64 else torch.float32
    d3 = TorchDFTD3Calculator(device=str(calc.device), damping=damping, dtype=dtype, xc=xc, cutoff=cutoff)
    return SumCalculator([calc, d3])
