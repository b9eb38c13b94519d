"""The calculator chooses torch's CPU thread count (overridable; OMP_NUM_THREADS wins) and the md
command reports it."""
import pytest
import torch

from equikernels.calculators import MACECalculator
from equikernels.calculators.threads import default_threads
from random_models import small_random_model


@pytest.fixture
def restore_threads():
    old = torch.get_num_threads()
    yield
    torch.set_num_threads(old)


@pytest.fixture(scope="module")
def model():
    return small_random_model([29], seed=1)


def test_default_override_and_environment(model, restore_threads, monkeypatch):
    monkeypatch.delenv("OMP_NUM_THREADS", raising=False)
    torch.set_num_threads(2)
    assert MACECalculator(model, device="cpu").num_threads == default_threads() == torch.get_num_threads()
    assert MACECalculator(model, device="cpu", num_threads=2).num_threads == 2 == torch.get_num_threads()
    monkeypatch.setenv("OMP_NUM_THREADS", "2")
    torch.set_num_threads(2)
    assert MACECalculator(model, device="cpu").num_threads == 2  # the user's choice is kept
    with pytest.raises(ValueError, match="num_threads"):
        MACECalculator(model, device="cpu", num_threads=0)
