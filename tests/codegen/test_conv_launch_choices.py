"""Launch choices of the node-parallel convolution kernels that depend on the dtype: float64 gradient
kernels neither prefetch the next edge nor hold the node's rows (they would spill registers)."""
import torch

from equikernels import settings
from equikernels.codegen.conv import ConvKernels


def test_float32_gradients_prefetch_and_hoist():
    assert ConvKernels._prefetch("bwd", torch.float32) == "all"
    assert ConvKernels._prefetch("dbwd", torch.float32) == "all"
    assert ConvKernels._prefetch("fwd", torch.float32) == ""
    assert ConvKernels._hoist("bwd", torch.float32)
    assert not ConvKernels._hoist("dbwd", torch.float32)


def test_float64_gradients_do_not_prefetch_or_hoist():
    for kind in ("fwd", "bwd", "dbwd"):
        assert ConvKernels._prefetch(kind, torch.float64) == ""
    assert not ConvKernels._hoist("bwd", torch.float64)
    assert not ConvKernels._hoist("dbwd", torch.float64)


def test_setting_overrides_the_dtype_rule(monkeypatch):
    monkeypatch.setenv("EQUIKERNELS_CONV_PREFETCH_BWD", "idx")
    monkeypatch.setenv("EQUIKERNELS_CONV_HOIST", "1")
    settings.reload()
    try:
        assert ConvKernels._prefetch("bwd", torch.float64) == "idx"
        assert ConvKernels._hoist("bwd", torch.float64)
    finally:
        monkeypatch.undo()
        settings.reload()
