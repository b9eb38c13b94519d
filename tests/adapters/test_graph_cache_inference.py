"""The shared graph and element grouping of accelerated layers on tensors made under
torch.inference_mode (no version counter): built on every call, never a stale entry."""
import torch

from equikernels.adapters.graph_cache import GraphCache, shared_element_groups


def test_graph_of_inference_tensors_is_built_each_call():
    cache = GraphCache()
    with torch.inference_mode():
        src, dst = torch.tensor([0, 1, 2]), torch.tensor([1, 2, 0])
        g = cache.get(src, dst, 3)
        assert torch.equal(g.src, src) and torch.equal(g.dst, dst)
        dst.copy_(torch.tensor([2, 0, 1]))  # an in-place write that bumps no version
        assert torch.equal(cache.get(src, dst, 3).dst, dst)


def test_graph_of_normal_tensors_is_still_shared():
    cache = GraphCache()
    src, dst = torch.tensor([0, 1, 2]), torch.tensor([1, 2, 0])
    g = cache.get(src, dst, 3)
    assert cache.get(src, dst, 3) is g
    with torch.inference_mode():
        assert cache.get(src, dst, 3) is g  # normal tensors read inside inference mode keep their version


def test_element_groups_of_inference_tensors():
    with torch.inference_mode():
        attrs = torch.nn.functional.one_hot(torch.tensor([2, 0, 2, 1]), 3).float()
        groups = shared_element_groups(attrs)
        assert groups is not None and groups.runs == [(0, 0, 1), (1, 1, 2), (2, 2, 4)]
        attrs.copy_(torch.nn.functional.one_hot(torch.tensor([0, 0, 0, 1]), 3).float())
        assert shared_element_groups(attrs).runs == [(0, 0, 3), (1, 3, 4)]


def test_graph_first_built_inside_inference_mode_serves_autograd_later():
    cache = GraphCache()
    src, dst = torch.tensor([0, 1, 2]), torch.tensor([1, 2, 0])
    with torch.inference_mode():
        g = cache.get(src, dst, 3)
    assert cache.get(src, dst, 3) is g
    assert not any(t.is_inference() for t in (g.src, g.dst, g.perm_dst, g.ptr_dst, g.perm_src, g.ptr_src))
