"""The deterministic convolution's gradient kernels with one edge loop per first-input segment
(EQUIKERNELS_CONV_GRAD_LOOPS=in1, not the default yet): gy is written by several loops and added
into, so this checks that path against the float64 oracle, first and second order."""
import pytest
import torch

from test_conv import channelwise, check_conv


@pytest.fixture(autouse=True)
def _loops(monkeypatch):
    monkeypatch.setenv("EQUIKERNELS_CONV_GRAD_LOOPS", "in1")


@pytest.mark.parametrize("layout,dtype,second", [("ir_mul", torch.float64, True), ("mul_ir", torch.float32, False)])
def test_grad_loops_per_x_segment(layout, dtype, second):
    check_conv(channelwise("3x0e+2x1o", "0e+1o+2e", "0e+1o+1e+2e"), "deterministic", dtype, layout,
               second_order=second)
