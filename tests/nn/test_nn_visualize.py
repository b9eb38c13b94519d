"""``visualize`` draws what e3nn's draws for the same product and weights."""
import pytest
import torch

from equikernels import nn as enn
from equikernels._compat import o3

matplotlib = pytest.importorskip("matplotlib")
matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402


def _reference_drawing(module, **kw):
    try:
        return _drawing(module, **kw)
    except AttributeError as e:  # e3nn 0.4's visualize calls matplotlib.cm.get_cmap, gone in matplotlib 3.9
        pytest.skip(f"e3nn's own visualize fails here: {e}")


def _drawing(module, **kw):
    fig, ax = plt.subplots()
    try:
        out = module.visualize(ax=ax, **kw)
        assert out == (fig, ax)
        return ([(p.get_path().vertices.round(12).tolist(), p.get_edgecolor()) for p in ax.patches],
                [(t.get_text(), t.xy) for t in ax.texts])
    finally:
        plt.close(fig)


@pytest.mark.parametrize("kw", [{}, {"plot_weight": False}, {"aspect_ratio": "auto"}])
def test_visualize_matches_e3nn(kw):
    args = ("2x0e+3x1o+1x2e", "0e+1o", "2x0e+2x1o+1x2e")
    torch.manual_seed(0)
    ref = o3.FullyConnectedTensorProduct(*args)
    ours = enn.FullyConnectedTensorProduct(*args)
    ours.load_state_dict(ref.state_dict())
    want = _reference_drawing(ref, **kw)
    assert len(want[0]) == len(ref.instructions) + 1  # the frame and one patch per path
    assert _drawing(ours, **kw) == want


def test_visualize_external_weights():
    args = ("2x0e+1x1o", "1x1o", "2x1o+1x1e", [(0, 0, 0, "uvw", True), (1, 0, 1, "uvw", True)])
    ref = o3.TensorProduct(*args, internal_weights=False, shared_weights=True)
    ours = enn.TensorProduct(*args, internal_weights=False, shared_weights=True)
    w = torch.randn(ref.weight_numel)
    assert _reference_drawing(ref, weight=w) == _drawing(ours, weight=w)
    assert _reference_drawing(ref) == _drawing(ours)  # no weight: paths drawn uncoloured
