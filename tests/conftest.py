"""Test configuration.

Without CUDA, Triton kernels run in its interpreter (``TRITON_INTERPRET=1``) so CI on a CPU
machine still executes the generated code. The variable must be set before anything imports
Triton, so this runs before the package (or Triton) is imported; ``import torch`` alone does not
import Triton.
"""
import os

import torch

HAS_CUDA = torch.cuda.is_available()
if not HAS_CUDA:
    os.environ.setdefault("TRITON_INTERPRET", "1")

import random  # noqa: E402

import pytest  # noqa: E402

from equikernels import settings  # noqa: E402


def _rereads_settings(method):
    def changed_env(self, *args, **kwargs):
        try:
            return method(self, *args, **kwargs)
        finally:
            settings.reload()
    return changed_env


# tests change EQUIKERNELS_* variables with monkeypatch: the parsed settings follow every change
for _name in ("setenv", "delenv", "undo"):
    setattr(pytest.MonkeyPatch, _name, _rereads_settings(getattr(pytest.MonkeyPatch, _name)))


def pytest_configure(config):
    # also declared in pyproject.toml; repeated here so the markers exist when run from elsewhere
    config.addinivalue_line("markers", "gpu: needs a CUDA device (skipped without one)")
    config.addinivalue_line("markers", "slow: long-running test")
    config.addinivalue_line("markers", "mace: needs mace-torch")
    config.addinivalue_line("markers", "sevenn: needs SevenNet")


def pytest_collection_modifyitems(config, items):
    if HAS_CUDA:
        return
    skip = pytest.mark.skip(reason="needs CUDA (marked gpu)")
    for item in items:
        if "gpu" in item.keywords:
            item.add_marker(skip)


@pytest.fixture(autouse=True)
def _restore_default_dtype():
    """Tests may change the default dtype (e3nn references are built under float64)."""
    old = torch.get_default_dtype()
    yield
    torch.set_default_dtype(old)


@pytest.fixture(autouse=True)
def _seed():
    """Every test starts from the same RNG state, independent of test order."""
    torch.manual_seed(0)
    random.seed(0)
    yield


@pytest.fixture
def single_thread():
    """Tiny tensors: one intra-op thread is faster and immune to oversubscribed CPUs."""
    old = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(old)


@pytest.fixture(scope="session")
def cu_model(tmp_path_factory):
    """The path of a small random MACE model file for Cu (our format), shared by the calculator,
    MD and CLI tests."""
    from random_models import small_random_model
    from equikernels.models import save

    path = tmp_path_factory.mktemp("model") / "cu.model"
    save(small_random_model([29], seed=4), str(path))
    return str(path)


@pytest.fixture(scope="session")
def mliap_files(tmp_path_factory):
    """A folder with the bundled default model exported for LAMMPS as m.pkl and m.pt."""
    from equikernels.default_model import default_model_path
    from equikernels.lammps import export_mliap

    d = tmp_path_factory.mktemp("mliap")
    for name in ("m.pkl", "m.pt"):
        export_mliap(default_model_path(), d / name)
    return d


@pytest.fixture
def generator():
    """A private torch.Generator for tests that draw their own inputs."""
    return torch.Generator().manual_seed(1234)


@pytest.fixture(params=["cpu", pytest.param("cuda", marks=pytest.mark.gpu)])
def device(request):
    return torch.device(request.param)
