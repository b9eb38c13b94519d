"""accelerate() on a NequIP-style e3nn model: its gather -> tensor product -> scatter-sum layers run
as the fused convolution, to second order equal to the unmodified model (float64)."""
import copy
import io

import pytest
import torch

import equikernels as ek
from equikernels._compat import o3
from equikernels.ops import conv as conv_ops
from e3nn.math import soft_one_hot_linspace
from e3nn.nn import FullyConnectedNet, Gate

TOL = 1e-10


def rel(a, b):
    return ((a - b).norm() / b.norm().clamp_min(1e-300)).item()


class Convolution(torch.nn.Module):
    """x -> linear -> sum over edges of tp(x[src], sh, radial(|r|)) / sqrt(avg neighbours) -> gate."""

    def __init__(self, irreps_node, irreps_sh, irreps_out, num_basis=6):
        super().__init__()
        irreps_node, irreps_sh = o3.Irreps(irreps_node), o3.Irreps(irreps_sh)
        mid, instr = [], []
        for i, (mul, ir_in) in enumerate(irreps_node):
            for j, (_, ir_sh) in enumerate(irreps_sh):
                for ir in ir_in * ir_sh:
                    if ir in o3.Irreps(irreps_out) or ir == o3.Irrep("0e"):
                        instr.append((i, j, len(mid), "uvu", True))
                        mid.append((mul, ir))
        mid, perm, _ = o3.Irreps(mid).sort()
        instr = [(i, j, perm[k], m, w) for i, j, k, m, w in instr]
        self.num_basis = num_basis
        self.linear_in = o3.Linear(irreps_node, irreps_node)
        self.tp = o3.TensorProduct(irreps_node, irreps_sh, mid, instr, shared_weights=False, internal_weights=False)
        self.radial = FullyConnectedNet([num_basis, 8, self.tp.weight_numel], torch.nn.functional.silu)
        irreps_out = o3.Irreps(irreps_out)
        scalars = o3.Irreps([(m, ir) for m, ir in irreps_out if ir.l == 0])
        gated = o3.Irreps([(m, ir) for m, ir in irreps_out if ir.l > 0])
        self.gate = Gate(scalars, [torch.nn.functional.silu], f"{gated.num_irreps}x0e", [torch.sigmoid], gated)
        self.linear = o3.Linear(mid.simplify(), self.gate.irreps_in)

    def forward(self, x, sh, length, src, dst):
        emb = soft_one_hot_linspace(length, 0.0, 2.5, self.num_basis, basis="smooth_finite", cutoff=True)
        h = self.linear_in(x)
        msg = self.tp(h[src], sh, self.radial(emb * self.num_basis ** 0.5))
        agg = torch.zeros(x.shape[0], msg.shape[1], dtype=msg.dtype).index_add(0, dst, msg)
        return self.gate(self.linear(agg / 3.0 ** 0.5))


class TinyNequIP(torch.nn.Module):
    def __init__(self):
        super().__init__()
        hidden = "4x0e+2x1o+2x2e"
        self.sh = o3.SphericalHarmonics("0e+1o+2e", normalize=True, normalization="component")
        self.embed = o3.Linear("3x0e", "4x0e")
        self.layers = torch.nn.ModuleList([Convolution("4x0e", "0e+1o+2e", hidden),
                                           Convolution(hidden, "0e+1o+2e", hidden)])
        self.head = o3.Linear(hidden, "0e")

    def forward(self, pos, species, src, dst):
        vec = pos[dst] - pos[src]
        sh, length = self.sh(vec), vec.norm(dim=-1)
        x = self.embed(species)
        for layer in self.layers:
            x = x + layer(x, sh, length, src, dst) if x.shape[1] == 18 else layer(x, sh, length, src, dst)
        return self.head(x).sum()


def _graph(n=7, seed=0):
    g = torch.Generator().manual_seed(seed)
    pos = torch.randn(n, 3, generator=g, dtype=torch.float64) * 1.2
    species = torch.nn.functional.one_hot(torch.randint(0, 3, (n,), generator=g), 3).double()
    src, dst = [t.flatten() for t in torch.meshgrid(torch.arange(n), torch.arange(n), indexing="ij")]
    keep = (src != dst) & ((pos[src] - pos[dst]).norm(dim=1) < 2.5)
    return pos, species, src[keep], dst[keep]


def _second_order(model, pos, species, src, dst):
    pos = pos.clone().requires_grad_(True)
    energy = model(pos, species, src, dst)
    forces = -torch.autograd.grad(energy, pos, create_graph=True)[0]
    loss = forces.pow(2).sum()  # force-matching loss: its parameter gradient is the double backward
    grads = torch.autograd.grad(loss, list(model.parameters()))
    return energy.detach(), forces.detach(), [g.detach() for g in grads]


@pytest.mark.parametrize("backend", ["reference", "triton"])
def test_nequip_style_layers_fused(backend, monkeypatch, single_thread):
    monkeypatch.setenv("EQUIKERNELS_BACKEND", backend)
    torch.set_default_dtype(torch.float64)
    model = TinyNequIP()
    data = _graph()
    e_ref, f_ref, g_ref = _second_order(model, *data)
    keys, params = list(model.state_dict()), list(model.parameters())

    report = ek.accelerate(model)
    assert report.fused_names == ["layers.0", "layers.0.radial", "layers.0.gate", "layers.1", "layers.1.radial",
                                  "layers.1.gate"], str(report)
    assert "1 gather -> tensor product -> scatter-sum fused" in report.fused[0][2]
    assert all(type(m).__name__ == "Convolution" and isinstance(m, Convolution) for m in model.layers)
    assert list(model.state_dict()) == keys and all(a is b for a, b in zip(model.parameters(), params))

    builds = []
    real_build = conv_ops.ConvGraph.build
    monkeypatch.setattr(conv_ops.ConvGraph, "build", staticmethod(lambda *a, **k: builds.append(1) or real_build(*a, **k)))
    calls = []
    real_conv = ek.adapters.fused.tensor_product_conv
    monkeypatch.setattr(ek.adapters.fused, "tensor_product_conv", lambda *a, **k: calls.append(1) or real_conv(*a, **k))
    e, f, g = _second_order(model, *data)
    assert len(calls) == 2 and len(builds) == 1  # both layers fused, one graph shared by both
    assert rel(e, e_ref) < TOL and rel(f, f_ref) < TOL
    for a, b in zip(g, g_ref):
        assert rel(a, b) < TOL


def test_fused_model_copies_pickles_and_loads_plain_state(single_thread):
    torch.set_default_dtype(torch.float64)
    model = TinyNequIP()
    data = _graph(seed=1)
    plain = copy.deepcopy(model)
    e_ref = model(*data)
    ek.accelerate(model)
    assert not ek.accelerate(model).fused  # a second call finds nothing left to fuse
    buf = io.BytesIO()
    torch.save(model, buf)
    buf.seek(0)
    loaded = torch.load(buf, weights_only=False)
    for m in (copy.deepcopy(model), loaded):
        assert type(m.layers[0]).__name__ == "Convolution"
        assert rel(m(*data).detach(), e_ref.detach()) < TOL
    plain.load_state_dict(model.state_dict())  # the unmodified class loads the accelerated state
    assert rel(plain(*data).detach(), e_ref.detach()) < TOL


def test_layer_without_the_pattern_is_reported(single_thread):
    class Unfusable(torch.nn.Module):  # scatter with a data-dependent row count: cannot be fused
        def __init__(self):
            super().__init__()
            self.tp = o3.FullyConnectedTensorProduct("2x0e", "0e", "2x0e", shared_weights=False)

        def forward(self, x, y, w, src, dst):
            msg = self.tp(x[src], y, w)
            return torch.zeros_like(x).index_add(0, dst, msg)

    model = torch.nn.Sequential()
    model.add_module("conv", Unfusable())
    report = ek.accelerate(model)
    assert report.fused == [] and report.not_fused[0][:2] == ("conv", "Unfusable")
    assert "pattern" in report.not_fused[0][2]
    assert "not fused   conv: Unfusable" in str(report)
