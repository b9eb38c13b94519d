"""equikernels.nn.blocks: an irreps block of feature rows as component rows."""
import pytest
import torch

from equikernels.nn.blocks import rows_by_component


@pytest.mark.parametrize("ir_mul", [False, True])
def test_rows_by_component_of_a_strided_block(ir_mul):
    n, d, mul = 5, 3, 4
    rows = torch.randn(n, 2 + mul * d + 1, dtype=torch.float64)
    block = rows[:, 2:2 + mul * d]  # a block inside wider rows: not contiguous
    out = rows_by_component(block, n, d, mul, ir_mul)
    assert out.shape == (n * d, mul)
    for i in range(n):
        for m in range(d):
            for u in range(mul):
                want = block[i, m * mul + u] if ir_mul else block[i, u * d + m]
                assert out[i * d + m, u] == want
