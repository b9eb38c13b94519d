"""The calculator's switches take real booleans: a string such as "no" is refused in one line naming
the argument, not read as True; cuda_graph also takes "auto" and the words EQUIKERNELS_CUDA_GRAPH takes."""
import numpy as np
import pytest
import torch

from equikernels.calculators import MACECalculator
from equikernels.calculators.mace_args import take_mace_torch_arguments


@pytest.mark.parametrize("value", ["no", "False", 0, 1, None])
def test_compute_atomic_stresses_takes_only_booleans(value):
    with pytest.raises(ValueError, match=r"^compute_atomic_stresses: expected True or False, got "):
        take_mace_torch_arguments({"compute_atomic_stresses": value})
    with pytest.raises(ValueError, match=r"^compute_atomic_stresses: expected True or False"):
        MACECalculator("never-read.model", compute_atomic_stresses=value)


@pytest.mark.parametrize("value", [True, False, np.bool_(True), np.bool_(False)])
def test_compute_atomic_stresses_booleans(value):
    taken = take_mace_torch_arguments({"compute_atomic_stresses": value})["compute_atomic_stresses"]
    assert taken is bool(value)


def test_cuda_graph_words_and_refusals(cu_model, single_thread):
    calc = MACECalculator(cu_model, device="cpu", cuda_graph=False)
    calc.device = torch.device("cuda")  # what the argument resolves to where graphs can run (no GPU needed)
    cases = [("auto", "auto"), ("AUTO", "auto"), ("1", True), ("yes", True), ("on", True), ("true", True),
             ("0", False), ("no", False), ("off", False), ("false", False), (True, True), (False, False),
             (np.bool_(True), True)]
    for value, expected in cases:
        got = calc._resolve_cuda_graph(value)
        assert got == expected and type(got) is type(expected), value
    for value in ("maybe", 0, 1, 2.0):
        with pytest.raises(ValueError, match=r"^cuda_graph: expected True, False"):
            calc._resolve_cuda_graph(value)
    words = r"EQUIKERNELS_CUDA_GRAPH takes \(one of auto, 0/1, true/false, yes/no, on/off\), got 'maybe'$"
    with pytest.raises(ValueError, match=words):
        calc._resolve_cuda_graph("maybe")
