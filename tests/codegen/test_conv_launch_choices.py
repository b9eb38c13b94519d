"""Launch choices of the node-parallel convolution kernels that depend on the dtype and the direction:
float32 forward and backward edge loops are staged through shared memory where the rows fit, the
double backward loads the next edge into registers instead; float64 gradient kernels stage their
edge loops but neither load the next edge into registers nor hold the node's rows (they would spill
registers), and take their warps per direction."""
import torch

from equikernels import settings
from equikernels.catalog import fully_connected_problem, uvu_problem
from equikernels.codegen.conv_planner import (STAGES, STAGES_F64, conv_config, conv_hoist, conv_in1_outer,
                                               conv_prefetch, conv_stages)
from equikernels.problem import TPProblem

MACE_L2 = TPProblem.create(**uvu_problem("128x0e+128x1o", "0e+1o+2e+3o", "128x0e+128x1o+128x2e+128x3o"))


def test_float32_staging_prefetch_and_hoist():
    assert [conv_stages(MACE_L2, k, torch.float32) for k in ("fwd", "bwd", "dbwd")] == [STAGES, STAGES, 0]
    assert conv_prefetch("bwd", torch.float32, staged=True) == ""
    assert conv_prefetch("bwd", torch.float32) == "all"
    assert conv_prefetch("dbwd", torch.float32) == "all"
    assert conv_prefetch("fwd", torch.float32) == ""
    assert conv_hoist("bwd", torch.float32)
    assert not conv_hoist("dbwd", torch.float32)


def test_rows_too_wide_to_stage_run_a_plain_loop():
    wide = TPProblem.create(**uvu_problem("1024x0e+1024x1o", "0e+1o+2e+3o", "1024x0e+1024x1o+1024x2e+1024x3o"))
    assert conv_stages(wide, "fwd", torch.float32) == 0 and conv_stages(wide, "bwd", torch.float32) == 0


def test_float64_gradients_stage_but_do_not_prefetch_or_hoist():
    for kind in ("fwd", "bwd", "dbwd"):
        assert conv_prefetch(kind, torch.float64) == ""
    assert [conv_stages(MACE_L2, k, torch.float64) for k in ("fwd", "bwd", "dbwd")] == [0, STAGES_F64, STAGES_F64]
    assert not conv_hoist("bwd", torch.float64)
    assert not conv_hoist("dbwd", torch.float64)


def test_setting_overrides_the_dtype_rule(monkeypatch):
    monkeypatch.setenv("EQUIKERNELS_CONV_PREFETCH_BWD", "idx")
    monkeypatch.setenv("EQUIKERNELS_CONV_HOIST", "1")
    monkeypatch.setenv("EQUIKERNELS_CONV_STAGES_DBWD", "3")
    settings.reload()
    try:
        assert conv_prefetch("bwd", torch.float64) == "idx"
        assert conv_hoist("bwd", torch.float64)
        assert conv_stages(MACE_L2, "dbwd", torch.float64) == 3
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
    with settings.override(conv_warps=8):
        assert conv_config("fwd", "nodes", torch.float64).num_warps == 8
