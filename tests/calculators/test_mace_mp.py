"""``mace_mp`` / ``mace_off``: mace-torch's foundation-model names resolved through mace-torch's own
tables and cache, the file loaded into our calculator (the model converted) with the energies and
forces of mace-torch's shortcut on the same file; local paths, downloads into the cache, D3
dispersion wiring, and the errors. No network: mace-torch's resolver and the download are stood in
for by local files."""
import sys
import types

import numpy as np
import pytest
import torch
from ase.build import molecule

from equikernels.calculators import MACECalculator, mace_mp, mace_off
from equikernels.models.mace import MACE
from download_stand_in import stand_in_download
from random_models import small_random_mace_model

ELEMENTS = [1, 6, 8, 29]


@pytest.fixture(autouse=True)
def _one_thread(single_thread):
    yield


def ethanol():
    atoms = molecule("CH3CH2OH")
    atoms.rattle(0.05, seed=5)
    return atoms


def test_unknown_local_path_names_the_model(tmp_path):
    """Neither a file nor a name mace-torch knows (without mace-torch: not a file, and names need it)."""
    missing = str(tmp_path / "nope.model")
    for fn in (mace_mp, mace_off):
        with pytest.raises((FileNotFoundError, ImportError), match=rf"{fn.__name__}.*'{missing}'.*(nor|not) a model file"):
            fn(missing)


def test_a_name_without_mace_torch_says_what_is_needed(monkeypatch):
    for name in [m for m in sys.modules if m == "mace" or m.startswith("mace.")] + ["mace"]:
        monkeypatch.setitem(sys.modules, name, None)  # import mace... -> ImportError
    with pytest.raises(ImportError, match=r"mace_mp\(model='medium'\): not a model file, and named foundation "
                                          r"models are found through mace-torch \(pip install mace-torch\)"):
        mace_mp("medium")
    with pytest.raises(ImportError, match=r"mace_off\(model=None\)"):
        mace_off()


@pytest.fixture(scope="module")
def model_file(tmp_path_factory):
    pytest.importorskip("mace")
    path = tmp_path_factory.mktemp("foundation") / "small-random.model"
    torch.save(small_random_mace_model(ELEMENTS, seed=2), path)
    return str(path)


@pytest.mark.mace
def test_mace_mp_name_resolved_by_mace_torch(model_file, monkeypatch):
    from mace.calculators import foundations_models as fm
    from mace.calculators import mace_mp as mace_torch_mp

    asked = []
    monkeypatch.setattr(fm, "download_mace_mp_checkpoint", lambda model=None: asked.append(model) or model_file)
    with pytest.warns(Warning, match="runs code"):
        ours = mace_mp("medium", device="cpu", default_dtype="float64")
    assert asked == ["medium"] and isinstance(ours, MACECalculator) and isinstance(ours.model, MACE)
    theirs = mace_torch_mp(model=model_file, device="cpu", default_dtype="float64")
    atoms = ethanol()
    ours.calculate(atoms, ["energy", "forces"])
    theirs.calculate(atoms, ["energy", "forces"])
    assert ours.results["energy"] == pytest.approx(theirs.results["energy"], rel=1e-10)
    np.testing.assert_allclose(ours.results["forces"], theirs.results["forces"], rtol=1e-9,
                               atol=1e-10 * np.abs(theirs.results["forces"]).max())
    assert mace_mp(None, device="cpu").dtype == torch.float32 and asked[-1] is None  # mace-torch's default, fp32
    assert mace_mp(model_file, device="").device == MACECalculator(device=None).device  # mace-torch's "" = auto
    raw = mace_mp(model_file, return_raw_model=True, device="cpu")
    assert isinstance(raw, MACE) and asked[-1] is None  # a local path is not sent to the resolver


@pytest.mark.mace
def test_mace_off_downloads_into_mace_torch_cache_once(model_file, monkeypatch, tmp_path):
    from mace.calculators import foundations_models as fm

    monkeypatch.setattr(fm, "mace_off_urls", {"medium": "https://models.example/MACE-OFF23_medium.model?raw=true"})
    fetched = stand_in_download(monkeypatch, tmp_path, model_file)
    first = mace_off(device="cpu")
    second = mace_off("medium", device="cpu")
    assert fetched == ["https://models.example/MACE-OFF23_medium.model?raw=true"]  # the second call reads the cache
    assert sorted(p.name for p in (tmp_path / "cache").iterdir()) == ["MACE-OFF23_medium.model"]
    assert first.dtype == torch.float64 and isinstance(second.model, MACE)
    atoms = ethanol()
    assert first.get_potential_energy(atoms) == pytest.approx(second.get_potential_energy(atoms.copy()), rel=1e-12)


@pytest.mark.mace
def test_dispersion_adds_d3_through_a_sum_calculator(model_file, monkeypatch):
    from ase.calculators.calculator import Calculator, all_changes
    from ase.calculators.mixing import SumCalculator

    made = {}

    class FakeD3(Calculator):
        implemented_properties = ["energy", "free_energy", "forces"]

        def __init__(self, **kw):
            super().__init__()
            made.update(kw)

        def calculate(self, atoms=None, properties=("energy",), system_changes=all_changes):
            super().calculate(atoms, properties, system_changes)
            self.results = {"energy": 1.5, "free_energy": 1.5, "forces": np.zeros((len(atoms), 3))}

    pkg = types.ModuleType("torch_dftd")
    sub = types.ModuleType("torch_dftd.torch_dftd3_calculator")
    sub.TorchDFTD3Calculator = FakeD3
    monkeypatch.setitem(sys.modules, "torch_dftd", pkg)
    monkeypatch.setitem(sys.modules, "torch_dftd.torch_dftd3_calculator", sub)
    plain = mace_mp(model_file, device="cpu", default_dtype="float64")
    summed = mace_mp(model_file, device="cpu", default_dtype="float64", dispersion=True, damping="zero",
                     dispersion_xc="pbe0")
    assert isinstance(summed, SumCalculator)
    assert made == {"device": "cpu", "damping": "zero", "dtype": torch.float64, "xc": "pbe0",
                    "cutoff": pytest.approx(40.0 * 0.52917721, rel=1e-6)}
    atoms = ethanol()
    assert summed.get_potential_energy(atoms) == pytest.approx(plain.get_potential_energy(atoms.copy()) + 1.5,
                                                               rel=1e-12)


@pytest.mark.mace
def test_dispersion_without_torch_dftd(model_file, monkeypatch):
    monkeypatch.setitem(sys.modules, "torch_dftd", None)
    with pytest.raises(ImportError, match=r"dispersion=True: needs torch-dftd"):
        mace_mp(model_file, device="cpu", dispersion=True)


@pytest.mark.mace
def test_dispersion_with_a_broken_torch_dftd_names_what_is_missing(model_file, monkeypatch, tmp_path):
    pkg = tmp_path / "torch_dftd"
    pkg.mkdir()
    (pkg / "__init__.py").write_text("")
    (pkg / "torch_dftd3_calculator.py").write_text("import a_missing_dependency_of_torch_dftd\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    for name in ("torch_dftd", "torch_dftd.torch_dftd3_calculator"):
        monkeypatch.delitem(sys.modules, name, raising=False)
    with pytest.raises(ImportError, match=r"torch-dftd is installed but cannot be imported: .*"
                                          r"\(pip install a_missing_dependency_of_torch_dftd\)$"):
        mace_mp(model_file, device="cpu", dispersion=True)
