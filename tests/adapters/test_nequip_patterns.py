"""accelerate() on message-passing layers as the nequip package and e3nn's example networks write
them, built from e3nn alone: a scatter-sum helper in torch_scatter's convention (with Python control
flow inside), keyword calls from a scripted parent, nequip's compilation by make_fx, and e3nn's
jit_mode "script" left set by nequip's model builders."""
import copy
import io
import pickle
from typing import Optional

import pytest
import torch
from torch.fx.experimental.proxy_tensor import make_fx

import equikernels as ek
from equikernels._compat import e3nn, o3
from e3nn.nn import FullyConnectedNet

TOL = 1e-12


def scatter(src: torch.Tensor, index: torch.Tensor, dim: int = -1, out: Optional[torch.Tensor] = None,
            dim_size: Optional[int] = None, reduce: str = "sum") -> torch.Tensor:
    """torch_scatter's convention; branches on dtypes and optional arguments (fx cannot trace into it)."""
    assert reduce == "sum"
    if dim < 0:
        dim = src.dim() + dim
    index = index.view([-1 if d == dim else 1 for d in range(src.dim())]).expand_as(src)
    if out is None:
        size = list(src.shape)
        size[dim] = dim_size if dim_size is not None else int(index.max()) + 1
        dtype = src.dtype if src.dtype in (torch.float32, torch.float64) else torch.float32
        out = torch.zeros(size, dtype=dtype, device=src.device)
    return out.scatter_add_(dim, index, src.to(out.dtype))


def scatter_mean(src: torch.Tensor, index: torch.Tensor, dim: int = 0, dim_size: Optional[int] = None):
    """Same convention, but an average: not a sum (and, like ``scatter``, not traceable by fx)."""
    if src.dtype not in (torch.float32, torch.float64):
        raise TypeError("src: expected floating-point messages")
    total = torch.zeros(dim_size, src.shape[1], dtype=src.dtype).index_add(0, index, src)
    count = torch.zeros(dim_size, dtype=src.dtype).index_add(0, index, torch.ones_like(index, dtype=src.dtype))
    return total / count.clamp_min(1)[:, None]


def _product(irreps_in="4x0e+2x1o", irreps_sh="0e+1o"):
    irreps_in, irreps_sh = o3.Irreps(irreps_in), o3.Irreps(irreps_sh)
    mid, instr = [], []
    for i, (mul, ir_in) in enumerate(irreps_in):
        for j, (_, ir_sh) in enumerate(irreps_sh):
            for ir in ir_in * ir_sh:
                if ir.l <= 1:
                    instr.append((i, j, len(mid), "uvu", True))
                    mid.append((mul, ir))
    return o3.TensorProduct(irreps_in, irreps_sh, mid, instr, shared_weights=False, internal_weights=False)


class TPScatter(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.tp = _product()

    def forward(self, x, edge_attr, edge_weight, edge_dst, edge_src):
        msg = self.tp(x[edge_src], edge_attr, edge_weight)
        return scatter(msg, edge_dst, dim=0, dim_size=x.size(0))


class TPScatterMean(TPScatter):
    def forward(self, x, edge_attr, edge_weight, edge_dst, edge_src):
        msg = self.tp(x[edge_src], edge_attr, edge_weight)
        return scatter_mean(msg, edge_dst, dim=0, dim_size=x.size(0))


class Block(torch.nn.Module):
    """Calls its message passing by keywords, as nequip's InteractionBlock does."""

    def __init__(self, conv=TPScatter):
        super().__init__()
        self.sh = o3.SphericalHarmonics("0e+1o", normalize=True, normalization="component")
        self.linear = o3.Linear("4x0e+2x1o", "4x0e+2x1o")
        self.conv = conv()
        self.radial = torch.nn.Linear(1, self.conv.tp.weight_numel)
        self.head = o3.Linear(self.conv.tp.irreps_out.simplify(), "0e")

    def forward(self, pos: torch.Tensor, x: torch.Tensor, edge_index: torch.Tensor) -> torch.Tensor:
        vec = pos[edge_index[1]] - pos[edge_index[0]]
        weight = self.radial(torch.linalg.norm(vec, dim=1, keepdim=True))
        h = self.conv(x=self.linear(x), edge_attr=self.sh(vec), edge_weight=weight, edge_dst=edge_index[0],
                      edge_src=edge_index[1])
        return self.head(h).sum()


def _graph(n=5, seed=0):
    g = torch.Generator().manual_seed(seed)
    pos = torch.randn(n, 3, generator=g, dtype=torch.float64)
    x = torch.randn(n, 10, generator=g, dtype=torch.float64)
    src, dst = [t.flatten() for t in torch.meshgrid(torch.arange(n), torch.arange(n), indexing="ij")]
    keep = src != dst
    return pos, x, torch.stack([dst[keep], src[keep]])


def _energy_forces(model, pos, x, edge_index):
    pos = pos.clone().requires_grad_(True)
    energy = model(pos, x, edge_index)
    return energy.detach(), -torch.autograd.grad(energy, pos)[0]


def _close(a, b):
    return all((p - q).abs().max().item() <= TOL * max(1.0, q.abs().max().item()) for p, q in zip(a, b))


@pytest.mark.parametrize("backend", ["reference", "triton"])
def test_scatter_helper_with_control_flow_is_fused(backend, monkeypatch):
    monkeypatch.setenv("EQUIKERNELS_BACKEND", backend)
    torch.manual_seed(0)
    model = Block().double()
    data = _graph()
    want = _energy_forces(model, *data)
    report = ek.accelerate(model)
    assert "conv" in report.fused_names, str(report)
    assert _close(_energy_forces(model, *data), want)


def test_helper_that_does_not_sum_is_not_fused():
    torch.manual_seed(0)
    model = Block(TPScatterMean).double()
    data = _graph()
    want = _energy_forces(model, *data)
    report = ek.accelerate(model)
    assert "conv" not in report.fused_names
    assert "conv" in dict((n, w) for n, _, w in report.not_fused)
    assert _close(_energy_forces(model, *data), want)


def test_reason_names_the_per_edge_product_not_a_shared_one():
    class Layer(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.sc = o3.FullyConnectedTensorProduct("2x0e", "2x0e", "2x0e")  # shared weights, not message passing
            self.tp = o3.FullyConnectedTensorProduct("2x0e", "0e", "2x0e", shared_weights=False)

        def forward(self, x, attrs, y, w, src):
            return self.sc(x, attrs) + self.tp(x[src], y, w).sum(0)

    model = torch.nn.Sequential()
    model.add_module("layer", Layer())
    why = ek.accelerate(model).not_fused[0][2]
    assert "output of tp is not only summed onto nodes" in why and "shared" not in why, why


def test_e3nn_points_convolution_is_fused_and_scripts():
    from e3nn.nn.models.v2106.points_convolution import Convolution

    torch.manual_seed(0)
    conv = Convolution("4x0e+2x1o", "2x0e", "0e+1o", "4x0e+2x1o", [3, 8], 3.0).double()
    with torch.no_grad():
        conv.alpha.weight.normal_()  # e3nn starts it at zero, which would hide the convolution's output
    n, g = 5, torch.Generator().manual_seed(1)
    src, dst = torch.tensor([0, 1, 2, 3, 4, 1, 2]), torch.tensor([1, 2, 3, 4, 0, 0, 4])
    args = (torch.randn(n, 10, generator=g, dtype=torch.float64),
            torch.nn.functional.one_hot(torch.tensor([0, 1, 0, 1, 1]), 2).double(), src, dst,
            torch.randn(7, 4, generator=g, dtype=torch.float64), torch.randn(7, 3, generator=g, dtype=torch.float64))
    want = conv(*args)
    report = ek.accelerate(conv)
    assert "" in report.fused_names, str(report)  # the convolution itself
    torch.testing.assert_close(conv(*args), want, rtol=TOL, atol=TOL)
    torch.testing.assert_close(torch.jit.script(conv)(*args), want, rtol=1e-10, atol=1e-10)


def test_fused_layer_scripts_inside_a_parent_calling_it_by_keywords():
    torch.manual_seed(0)
    model = Block().double()
    data = _graph()
    want = model(*data)
    assert "conv" in ek.accelerate(model).fused_names
    scripted = torch.jit.script(model)
    buf = io.BytesIO()
    torch.jit.save(scripted, buf)
    buf.seek(0)
    loaded = torch.jit.load(buf)
    for m in (scripted, loaded):
        torch.testing.assert_close(m(*data), want, rtol=1e-10, atol=1e-10)
    torch.testing.assert_close(model(*data), want, rtol=TOL, atol=TOL)  # eager still the fused forward


def test_make_fx_keeps_the_node_count_symbolic():
    torch.manual_seed(0)
    model = Block().double()
    ek.accelerate(model)
    small, large = _graph(4), _graph(6, seed=1)
    traced = make_fx(model, tracing_mode="symbolic", _allow_non_fake_inputs=True)(*small)
    torch.testing.assert_close(traced(*large), model(*large), rtol=TOL, atol=TOL)


def test_frozen_radial_mlp_traced_twice_records_the_same_graph():
    torch.manual_seed(0)
    model = torch.nn.Sequential(FullyConnectedNet([4, 8, 6], torch.nn.functional.silu)).double()
    ek.accelerate(model)
    for p in model.parameters():
        p.requires_grad_(False)  # as nequip prepares a model for compilation
    x = torch.randn(5, 4, dtype=torch.float64)
    model(x)  # a frozen model's eager call keeps its scaled weights
    first = make_fx(model, tracing_mode="symbolic", _allow_non_fake_inputs=True)(x)
    other = torch.randn(7, 4, dtype=torch.float64)
    second = make_fx(model, tracing_mode="symbolic", _allow_non_fake_inputs=True)(other)
    assert first.code == second.code
    with torch.no_grad():
        model[0].layer0.weight.mul_(2.0)  # the traced graph reads the parameter, not a copy of it
    torch.testing.assert_close(second(x), model(x), rtol=TOL, atol=TOL)


def test_accelerate_under_e3nn_script_mode_keeps_the_model_copyable():
    if "jit_mode" not in getattr(e3nn, "get_optimization_defaults", dict)():
        pytest.skip("this e3nn has no jit_mode")
    model = Block().double()
    data = _graph()
    want = model(*data)
    before = e3nn.get_optimization_defaults()["jit_mode"]
    e3nn.set_optimization_defaults(jit_mode="script")  # what nequip's model builders leave set
    try:
        ek.accelerate(model)
        assert e3nn.get_optimization_defaults()["jit_mode"] == "script"
    finally:
        e3nn.set_optimization_defaults(jit_mode=before)
    for copied in (copy.deepcopy(model), pickle.loads(pickle.dumps(model))):
        torch.testing.assert_close(copied(*data), want, rtol=TOL, atol=TOL)
