"""A convolution kernel's launches (equikernels/codegen/conv.py) with a stand-in for the Triton kernel:
after a first build with ptxas's register collapse, the later launches ask for the -O1 build."""
from types import SimpleNamespace

import pytest
import torch

from equikernels.codegen import conv, launch
from equikernels.codegen.plan_types import LaunchConfig


class _Built:
    def __init__(self, regs, words):
        self.n_regs, self.n_spills = regs, words


class _Jit:
    def __init__(self, regs, words):
        self.regs, self.words, self.calls = regs, words, []

    def __getitem__(self, grid):
        def run(*args, **kw):
            self.calls.append(kw.get("ptx_options"))
            return _Built(self.regs, self.words)
        return run


@pytest.mark.parametrize("regs,words,later", [(32, 6750, "--opt-level 1"), (255, 700, None)])
def test_conv_kernel_rebuilds_a_collapsed_build(monkeypatch, regs, words, later):
    monkeypatch.setattr(launch, "_Compiled", _Built)
    k = conv._ConvKernel.__new__(conv._ConvKernel)
    k.step = SimpleNamespace(mode="edges", inputs=("x",), outputs=("out",), index_args=("src", "dst"))
    k.fn, k.opts = _Jit(regs, words), None
    graph = SimpleNamespace(src=torch.zeros(3, dtype=torch.long), dst=torch.zeros(3, dtype=torch.long), num_edges=3)
    t = {"x": torch.zeros(3, dtype=torch.float64), "out": torch.zeros(3, dtype=torch.float64)}
    for _ in range(3):
        k.launch(t, t, graph, LaunchConfig(rows=1, num_warps=1), torch.float64)
    assert k.fn.calls == [None, later, later]
