"""Launch choices of the node-parallel convolution kernels that depend on the dtype: float64 gradient
kernels neither prefetch the next edge nor hold the node's rows (they would spill registers), and
take their warps per direction."""
import torch

from equikernels import settings
from equikernels.catalog import fully_connected_problem, uvu_problem
from equikernels.codegen.conv_planner import conv_config, conv_hoist, conv_in1_outer, conv_prefetch
from equikernels.problem import TPProblem


def test_float32_gradients_prefetch_and_hoist():
    assert conv_prefetch("bwd", torch.float32) == "all"
    assert conv_prefetch("dbwd", torch.float32) == "all"
    assert conv_prefetch("fwd", torch.float32) == ""
    assert conv_hoist("bwd", torch.float32)
    assert not conv_hoist("dbwd", torch.float32)


def test_float64_gradients_do_not_prefetch_or_hoist():
    for kind in ("fwd", "bwd", "dbwd"):
        assert conv_prefetch(kind, torch.float64) == ""
    assert not conv_hoist("bwd", torch.float64)
    assert not conv_hoist("dbwd", torch.float64)


def test_setting_overrides_the_dtype_rule(monkeypatch):
    monkeypatch.setenv("EQUIKERNELS_CONV_PREFETCH_BWD", "idx")
    monkeypatch.setenv("EQUIKERNELS_CONV_HOIST", "1")
    settings.reload()
    try:
        assert conv_prefetch("bwd", torch.float64) == "idx"
        assert conv_hoist("bwd", torch.float64)
    finally:
        monkeypatch.undo()
        settings.reload()


def test_float64_node_kernels_warps_and_shared_sums_per_direction():
    kinds = ("fwd", "bwd", "dbwd")
    assert [conv_config(k, "nodes", torch.float64).num_warps for k in kinds] == [4, 1, 2]
    assert {(conv_config(k, "nodes", torch.float32).rows, conv_config(k, "nodes", torch.float32).num_warps)
            for k in kinds} == {(1, 1)}
    assert {conv_config(k, "edges", torch.float64).num_warps for k in kinds} == {2}
    uvu = TPProblem.create(**uvu_problem("4x0e+4x1o", "0e+1o", "4x0e+4x1o"))
    uvw = TPProblem.create(**fully_connected_problem("2x0e", "0e", "2x0e", shared=False))
    assert conv_in1_outer(uvu, "bwd", torch.float64, True) and not conv_in1_outer(uvu, "bwd", torch.float32, True)
    assert not conv_in1_outer(uvu, "bwd", torch.float64, False) and not conv_in1_outer(uvw, "bwd", torch.float64, True)
    with settings.override(conv_warps=3):
        assert conv_config("fwd", "nodes", torch.float64).num_warps == 3
