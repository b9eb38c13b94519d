"""Foundation-model names where a model file is expected (``models.load``, and so the calculator and
the commands; the fine-tuning loader and ``convert``, which look for the file first): MACE-MP names
and MACE-OFF names with "_off", resolved through mace-torch's tables and cache (stood in for by
local files: no network); a local file of the same name wins."""
import numpy as np
import pytest
import torch
from ase.build import molecule

from equikernels.models import MACE, load
from equikernels.models.foundations import foundation_checkpoint
from random_models import small_random_mace_model


@pytest.fixture(autouse=True)
def _one_thread(single_thread):
    yield


@pytest.mark.parametrize("mace_torch", [True, False])
def test_unknown_name_is_a_missing_file(tmp_path, monkeypatch, mace_torch):
    """The message names what would have made it a model: a name mace-torch knows, or mace-torch itself."""
    import importlib.util
    monkeypatch.chdir(tmp_path)
    assert foundation_checkpoint("no-such-model") is None
    find = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec",
                        lambda name, *a: (object() if mace_torch else None) if name == "mace" else find(name, *a))
    hint = ("nor a foundation-model name mace-torch knows" if mace_torch
            else "foundation-model names such as 'medium' need mace-torch: pip install mace-torch")
    with pytest.raises(FileNotFoundError, match=r"no-such-model: no such model file or directory \(" + hint):
        load("no-such-model")


@pytest.fixture
def stood_in(tmp_path, monkeypatch):
    """mace-torch's resolvers pointed at a small local model file; returns (file, names asked)."""
    pytest.importorskip("mace")
    from mace.calculators import foundations_models as fm

    path = tmp_path / "small-random.model"
    torch.save(small_random_mace_model([1, 6, 8], seed=4), path)
    asked = []
    monkeypatch.setattr(fm, "download_mace_mp_checkpoint", lambda model=None: asked.append(("mp", model)) or str(path))
    monkeypatch.setattr(fm, "mace_off_urls", {"small": "https://models.example/MACE-OFF23_small.model"})
    cache = tmp_path / "cache"
    cache.mkdir()
    (cache / "MACE-OFF23_small.model").write_bytes(path.read_bytes())
    monkeypatch.setattr(fm, "get_cache_dir", lambda: str(cache))
    monkeypatch.chdir(tmp_path)
    return path, asked, cache


@pytest.mark.mace
def test_names_load_the_foundation_models(stood_in):
    path, asked, cache = stood_in
    with pytest.warns(Warning, match="runs code"):
        mp = load("medium")
    assert asked == [("mp", "medium")] and isinstance(mp, MACE)
    off = load("small_off")
    assert foundation_checkpoint("small_off") == str(cache / "MACE-OFF23_small.model")
    assert foundation_checkpoint("large_off") is None and foundation_checkpoint("small") is not None
    atoms = molecule("CH3OH")
    from equikernels.calculators import MACECalculator
    e = [MACECalculator(m, device="cpu").get_potential_energy(atoms.copy()) for m in (mp, off, load(str(path)))]
    np.testing.assert_allclose(e[:2], e[2], rtol=1e-12)


@pytest.mark.mace
def test_a_local_file_of_that_name_wins(stood_in, tmp_path):
    path, asked, _ = stood_in
    (tmp_path / "medium").write_bytes(path.read_bytes())
    assert foundation_checkpoint("medium") is None
    assert isinstance(load("medium"), MACE) and asked == []


@pytest.mark.mace
def test_fine_tuning_and_convert_take_names(stood_in, tmp_path):
    """The fine-tuning loader and ``equikernels convert`` check for a file themselves: names pass too."""
    from equikernels.cli import main
    from equikernels.training.model_factory import load_model

    path, asked, _ = stood_in
    assert isinstance(load_model("medium", backend="equikernels"), MACE) and asked == [("mp", "medium")]
    assert main(["convert", "small_off", str(tmp_path / "off.pt")]) == 0
    assert isinstance(load(str(tmp_path / "off.pt")), MACE)


@pytest.mark.mace
@pytest.mark.parametrize("name", ["medium", "small_off"])
def test_a_failed_download_names_the_model(stood_in, monkeypatch, name):
    import urllib.error
    import urllib.request

    from mace.calculators import foundations_models as fm
    from equikernels.models.foundations import DownloadError

    def offline(*args, **kwargs):
        raise urllib.error.URLError("Name or service not known")
    monkeypatch.setattr(fm, "download_mace_mp_checkpoint", offline)
    monkeypatch.setattr(fm, "get_cache_dir", lambda: str(stood_in[2] / "empty"))
    monkeypatch.setattr(urllib.request, "urlretrieve", offline)
    with pytest.raises(DownloadError, match=rf"foundation model '{name}' could not be fetched "
                                            r"\(URLError: .*Name or service not known"):
        load(name)
