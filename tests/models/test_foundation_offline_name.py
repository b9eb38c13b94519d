"""A MACE-OFF name given with "_off" whose download fails is named as the user gave it, and a cut-off
download leaves no partial file; convert refuses its OUT before downloading (mace-torch's name tables
stood in for, so this runs without mace-torch or the network)."""
import sys
import types
import urllib.error
import urllib.request

import pytest

from equikernels.cli import main
from equikernels.models.foundations import DownloadError, mace_off_checkpoint
from cli_checks import one_line_error


@pytest.fixture
def offline(tmp_path, monkeypatch):
    fm = types.SimpleNamespace(mace_mp_names=["medium"], get_cache_dir=lambda: str(tmp_path / "cache"),
                               mace_off_urls={"small": "https://models.example/MACE-OFF23_small.model"})
    calculators = types.ModuleType("mace.calculators")
    calculators.foundations_models = fm
    monkeypatch.setitem(sys.modules, "mace", types.ModuleType("mace"))
    monkeypatch.setitem(sys.modules, "mace.calculators", calculators)

    def no_network(*args, **kwargs):
        raise urllib.error.URLError("Name or service not known")
    monkeypatch.setattr(urllib.request, "urlretrieve", no_network)
    monkeypatch.chdir(tmp_path)


def test_convert_names_the_off_model_as_given(offline, tmp_path, capsys):
    assert main(["convert", "small_off", str(tmp_path / "out.pt")]) == 2
    one_line_error(capsys, "'small_off' could not be fetched", "URLError")
    assert not (tmp_path / "out.pt").exists()


def test_mace_off_names_its_own_argument(offline):
    with pytest.raises(DownloadError, match=r"foundation model 'small' could not be fetched"):
        mace_off_checkpoint("small")


def test_interrupted_download_leaves_no_partial_file(offline, tmp_path, monkeypatch):
    def cut_off(url, filename):
        with open(filename, "wb") as f:
            f.write(b"half a model")
        raise urllib.error.URLError("connection reset")
    monkeypatch.setattr(urllib.request, "urlretrieve", cut_off)
    with pytest.raises(DownloadError, match="connection reset"):
        mace_off_checkpoint("small")
    assert list((tmp_path / "cache").iterdir()) == []


def test_out_refused_before_the_download(offline, tmp_path, capsys, monkeypatch):
    def no_download(*args, **kwargs):
        raise AssertionError("downloaded before OUT was checked")
    monkeypatch.setattr(urllib.request, "urlretrieve", no_download)
    (tmp_path / "out.pt").write_text("mine")
    assert main(["convert", "small_off", str(tmp_path / "out.pt")]) == 2
    one_line_error(capsys, "out.pt", "already exists")
    assert (tmp_path / "out.pt").read_text() == "mine"
