"""Convolution kernel arrangements beside the defaults (covered by ops/test_conv.py): gradient kernels
with a single edge loop (EQUIKERNELS_CONV_GRAD_LOOPS=one), every edge-loop pipelining mode, both
atomic arrangements; checked against the float64 oracle, first and second order."""
import pytest
import torch

from conv_checks import channelwise, check_conv


@pytest.fixture(autouse=True)
def _loops(monkeypatch):
    monkeypatch.setenv("EQUIKERNELS_CONV_GRAD_LOOPS", "one")


@pytest.mark.parametrize("layout,dtype,second", [("ir_mul", torch.float64, True), ("mul_ir", torch.float32, False)])
def test_grad_single_loop(layout, dtype, second):
    check_conv(channelwise("3x0e+2x1o", "0e+1o+2e", "0e+1o+1e+2e"), "deterministic", dtype, layout,
               second_order=second)


@pytest.mark.parametrize("prefetch,stages", [("", "0"), ("idx", "0"), ("all", "0"), ("", "3")])
def test_edge_loop_pipelining(monkeypatch, prefetch, stages):
    """Every edge-loop pipelining mode (emit.Rowing.prefetch and .stages; defaults: staged float32
    forward and backward, 'all' in the double backward) in every direction, here with one loop per
    kernel."""
    monkeypatch.setenv("EQUIKERNELS_CONV_PREFETCH", prefetch)
    monkeypatch.setenv("EQUIKERNELS_CONV_STAGES", stages)
    check_conv(channelwise("3x0e+2x1o", "0e+1o+2e", "0e+1o+1e+2e"), "deterministic", torch.float64, "ir_mul",
               second_order=True)


@pytest.mark.parametrize("atomic", ["nodes", "edges"])
def test_atomic_kernels(monkeypatch, atomic):
    """Both atomic arrangements (EQUIKERNELS_CONV_ATOMIC): the default walks destinations and adds
    gx / dx atomically (ROWS = 1: one row per atomic), 'edges' scatters every node output."""
    monkeypatch.setenv("EQUIKERNELS_CONV_ATOMIC", atomic)
    check_conv(channelwise("3x0e+2x1o", "0e+1o+2e", "0e+1o+1e+2e"), "atomic", torch.float64, "ir_mul",
               second_order=True)


def test_node_kernels_two_edges_per_step(monkeypatch):
    """Node-parallel kernels visiting two edges per step (EQUIKERNELS_CONV_ROWS=2): a node with an
    odd number of edges ends on a step whose second edge is not its own; that row's loads must be
    masked (with one edge per step they need none)."""
    monkeypatch.setenv("EQUIKERNELS_CONV_ROWS", "2")
    check_conv(channelwise("3x0e+2x1o", "0e+1o+2e", "0e+1o+1e+2e"), "atomic", torch.float64, "ir_mul",
               second_order=True)
