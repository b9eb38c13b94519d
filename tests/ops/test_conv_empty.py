"""Convolutions over graphs without edges (an isolated atom, atoms beyond the cutoff) and batches
with edge-free parts: every backend and dataflow, forces through create_graph, and the gradient of
a force loss to the parameters. Outputs must stay in the inputs' autograd graph (zero gradients,
never "does not require grad"). Also: a graph passed with other src/dst is refused."""
import pytest
import torch

from equikernels import ConvGraph
from equikernels.ops import tensor_product_conv
from equikernels.problem import TPProblem

CASES = [("reference", "auto"), ("triton", "atomic"), ("triton", "deterministic"), ("triton", "unfused")]


def _problem(shared=False):
    return TPProblem.create("2x0e+1x1o", "0e+1o", "2x0e+1x1o",
                            [(0, 0, 0, "uvw", True), (1, 1, 0, "uvw", True), (1, 0, 1, "uvw", True)],
                            shared_weights=shared, internal_weights=False)


def _energy(p, pos, feats, param, src, dst, backend, flow):
    """A MACE-shaped energy: edge attributes and weights from edge vectors, one convolution."""
    vec = pos.index_select(0, dst) - pos.index_select(0, src)
    y = torch.cat([vec.norm(dim=-1, keepdim=True), vec], -1)
    w = param if p.shared_weights else y[:, :1] * param
    out = tensor_product_conv(p, feats, y, w, src, dst, backend=backend, dataflow=flow)
    return (out ** 2).sum() + out[:, 0].sum(), out


@pytest.mark.parametrize("shared", [False, True])
@pytest.mark.parametrize("backend,flow", CASES)
def test_no_edges_energy_forces_and_force_loss_gradient(backend, flow, shared):
    p = _problem(shared)
    g = torch.Generator().manual_seed(0)
    pos = torch.randn(3, 3, generator=g, dtype=torch.float64, requires_grad=True)
    feats = torch.randn(3, p.dim_in1, generator=g, dtype=torch.float64, requires_grad=True)
    param = torch.randn(p.weight_numel, generator=g, dtype=torch.float64, requires_grad=True)
    none = torch.zeros(0, dtype=torch.long)
    energy, out = _energy(p, pos, feats, param, none, none, backend, flow)
    assert out.shape == (3, p.dim_out) and (out == 0).all() and float(energy.detach()) == 0
    (forces,) = torch.autograd.grad(-energy, pos, create_graph=True)
    assert (forces == 0).all()
    grads = torch.autograd.grad((forces - 1).pow(2).sum(), (param, feats))
    assert all(t is not None and (t == 0).all() for t in grads)

    # a molecule (atoms 0-2) batched with an atom far away (3): the same numbers as the molecule alone
    pos4 = torch.cat([pos.detach(), torch.full((1, 3), 50.0, dtype=torch.float64)]).requires_grad_()
    feats4 = torch.cat([feats.detach(), feats.detach()[:1]]).requires_grad_()
    src, dst = torch.tensor([0, 1, 2, 1]), torch.tensor([1, 0, 1, 2])
    e_mol, _ = _energy(p, pos4[:3], feats4[:3], param, src, dst, backend, flow)
    e_all, out = _energy(p, pos4, feats4, param, src, dst, backend, flow)
    assert (out[3] == 0).all()
    torch.testing.assert_close(e_all, e_mol)
    (f_all,) = torch.autograd.grad(-e_all, pos4, create_graph=True)
    assert (f_all[3] == 0).all()
    (gp,) = torch.autograd.grad(f_all.pow(2).sum(), param)
    assert torch.isfinite(gp).all() and gp.abs().sum() > 0


def test_graph_with_other_edges_is_refused():
    p = _problem()
    src, dst = torch.tensor([0, 1, 2], dtype=torch.int32), torch.tensor([1, 2, 0], dtype=torch.int32)
    graph = ConvGraph.build(src, dst, 3)
    x, y, w = torch.randn(3, p.dim_in1), torch.randn(3, p.dim_in2), torch.randn(3, p.weight_numel)
    ref = tensor_product_conv(p, x, y, w, src, dst)
    for s, d in ((src, dst), (graph.src, graph.dst), (None, None), (src.clone().long(), dst.clone())):
        torch.testing.assert_close(tensor_product_conv(p, x, y, w, s, d, graph=graph), ref)
    with pytest.raises(ValueError, match="dst: differs from the edges graph was built for"):
        tensor_product_conv(p, x, y, w, src, src, graph=graph)
    with pytest.raises(ValueError, match="src: has 2 edges"):
        tensor_product_conv(p, x, y, w, src[:2], dst, graph=graph)
    with pytest.raises(TypeError, match="graph: expected a ConvGraph"):
        tensor_product_conv(p, x, y, w, src, dst, graph=(src, dst))
    with pytest.raises(ValueError, match="src and dst: required"):
        tensor_product_conv(p, x, y, w, None, None)


@pytest.mark.parametrize("backend", ["reference", "triton"])
def test_zero_width_operand_with_broadcast_batch(backend):
    """An operand with no features (empty irreps) and broadcast batch dimensions: zeros of the
    broadcast shape, as e3nn gives."""
    from equikernels.nn import FullyConnectedTensorProduct
    tp = FullyConnectedTensorProduct("0e + 1e", "", "0e + 1e", backend=backend)
    out = tp(torch.randn(1, 2, 4), torch.randn(2, 1, 0))
    assert out.shape == (2, 2, 4) and (out == 0).all()
