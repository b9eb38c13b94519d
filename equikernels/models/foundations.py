"""Foundation-model names as mace-torch knows them: MACE-MP ("small", "medium", "medium-mpa-0", ...;
mace-torch's table), MACE-OFF ("small", "medium", "large"; "small_off" etc. where one name
must tell them apart, as mace-torch's training script takes them), MACE-OMOL ("extra_large") and
the ANI-CC model, resolved to local files in mace-torch's download cache (downloaded the first
time, by mace-torch's rules for MACE-MP)."""
from __future__ import annotations

import os
import urllib.request
from typing import Optional


def _foundations(fn: str, model):
    from .._compat import quiet_mace  # noqa: PLC0415

    quiet_mace()
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


class DownloadError(OSError):
    """A foundation model could not be downloaded (no network, a proxy, a moved URL)."""


def _fetched(model, download):
    """``download()``, a failure named by the model asked for."""
    try:
        return download()
    except (OSError, RuntimeError) as exc:  # urllib's URLError is an OSError; mace-torch raises RuntimeError
        raise DownloadError(f"the foundation model {model!r} could not be fetched ({type(exc).__name__}: {exc}); "
                            "check the network, or give the path of a downloaded .model file") from exc


def mace_mp_checkpoint(model=None) -> str:
    """The local file of MACE-MP model ``model``: None (mace-torch's default), a name such as
    "small", "medium", "medium-mpa-0" or an https URL, downloaded by mace-torch into its cache the
    first time; any other value is a path to a model file."""
    path = _given_file("mace_mp", model, "mace_mp_names")
    if path is not None:
        return path
    fm = _foundations("mace_mp", model)
    return _fetched(model, lambda: fm.download_mace_mp_checkpoint(model))


def mace_off_checkpoint(model=None) -> str:
    """The local file of MACE-OFF model ``model``: None ("medium"), "small", "medium", "large" or an
    https URL, downloaded into mace-torch's cache the first time (the MACE-OFF models are distributed
    under the Academic Software License); any other value is a path to a model file."""
    return _mace_off_checkpoint(model, model)


def _mace_off_checkpoint(model, given) -> str:
    """``mace_off_checkpoint(model)``, a failed download named ``given`` (the name the user typed)."""
    path = _given_file("mace_off", model, "mace_off_urls")
    if path is not None:
        return path
    fm = _foundations("mace_off", model)
    url = fm.mace_off_urls["medium"] if model is None else fm.mace_off_urls.get(model, model)
    return _cached(fm, url, given, " (Academic Software License: https://github.com/gabor1/ASL)")


# mace-torch's MACE-OMOL models (its mace_omol's table)
MACE_OMOL_URLS = {"extra_large": "https://github.com/ACEsuit/mace-foundations/releases/download/mace_omol_0/"
                                 "MACE-omol-0-extra-large-1024.model"}
MACE_ANICC_URL = "https://github.com/ACEsuit/mace/raw/main/mace/calculators/foundations_models/ani500k_large_CC.model"


def mace_omol_checkpoint(model=None) -> str:
    """The local file of MACE-OMOL model ``model``: None or "extra_large" (``MACE_OMOL_URLS``) or an
    https URL, downloaded into mace-torch's cache the first time (the MACE-OMOL models are distributed
    under the Academic Software License); any other value is a path to a model file."""
    if model is not None and not str(model).startswith("https:") and model not in MACE_OMOL_URLS:
        if os.path.isfile(os.fspath(model)):
            return os.fspath(model)
        raise FileNotFoundError(f"mace_omol: model {model!r} is neither a model name ({', '.join(MACE_OMOL_URLS)}), "
                                "an https URL nor a model file")
    url = MACE_OMOL_URLS[model or "extra_large"] if not str(model).startswith("https:") else model
    return _cached(_foundations("mace_omol", model), url, model,
                   " (Academic Software License: https://github.com/gabor1/ASL)")


def mace_anicc_checkpoint(model_path=None) -> str:
    """The local file of mace-torch's ANI-CC model (H, C, N, O): ``model_path`` where given, else the
    file in mace-torch's package where it is, else its download into mace-torch's cache."""
    if model_path is not None:
        return _local("mace_anicc", model_path)
    fm = _foundations("mace_anicc", model_path)
    packaged = os.path.join(os.path.dirname(fm.__file__), "foundations_models", os.path.basename(MACE_ANICC_URL))
    return packaged if os.path.isfile(packaged) else _cached(fm, MACE_ANICC_URL, "anicc", "")


def _cached(fm, url: str, given, note: str) -> str:
    """The file of ``url`` in mace-torch's cache, downloaded there the first time (a failure named
    ``given``, the model asked for; ``note``: said with the download)."""
    cache = fm.get_cache_dir()
    path = os.path.join(cache, os.path.basename(url).split("?")[0])
    if not os.path.isfile(path):
        os.makedirs(cache, exist_ok=True)
        print(f"downloading {url} to {path}{note}")
        partial = path + ".part"
        try:
            _fetched(given, lambda: urllib.request.urlretrieve(url, partial))
        except BaseException:  # a failed or interrupted download leaves no partial file in the cache
            if os.path.exists(partial):
                os.remove(partial)
            raise
        os.replace(partial, path)  # only a whole download takes the name that looks complete
    return path


def is_foundation_name(name) -> bool:
    """Whether ``name`` (not an existing path) is a foundation-model name ``foundation_checkpoint``
    fetches; False without mace-torch, which knows the names. Nothing is downloaded."""
    if not isinstance(name, str) or os.path.exists(name):
        return False
    from .._compat import quiet_mace  # noqa: PLC0415

    quiet_mace()
    try:
        from mace.calculators import foundations_models as fm  # noqa: PLC0415
    except ImportError:
        return False
    return name in fm.mace_mp_names or (name.endswith("_off") and name[:-len("_off")] in fm.mace_off_urls)


def foundation_checkpoint(name) -> Optional[str]:
    """The local file of a foundation-model name given where a model file is expected (a MACE-MP
    name, or a MACE-OFF one with the suffix "_off"), downloading it the first time; None when
    ``name`` is no such name (or mace-torch, which knows the names, is not installed)."""
    if not is_foundation_name(name):  # which imports mace-torch quietly
        return None
    from mace.calculators import foundations_models as fm  # noqa: PLC0415

    if name in fm.mace_mp_names:
        return mace_mp_checkpoint(name)
    return _mace_off_checkpoint(name[:-len("_off")], name)
