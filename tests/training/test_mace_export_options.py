"""mace-torch models built with non-default constructor options (use_so3, use_last_readout_only,
keep_last_layer_irreps, edge_irreps, use_edge_irreps_first, use_reduced_cg=False) go back to mace-torch
with the same structure, weights, energies and forces."""
import numpy as np
import pytest
import torch

pytestmark = pytest.mark.mace
pytest.importorskip("mace")

from mace_torch_cases import ZS, mace_batch, rattled_atoms  # noqa: E402

_ATTRS = ("use_so3", "use_last_readout_only", "use_edge_irreps_first", "use_reduced_cg")


def _mace(num_interactions=2, first="RealAgnosticInteractionBlock", **options):
    from mace import modules

    from equikernels._compat import o3

    if "edge_irreps" in options:
        options["edge_irreps"] = o3.Irreps(options["edge_irreps"])
    options.setdefault("use_reduced_cg", False)  # mace-torch's training default
    torch.manual_seed(0)
    m = modules.ScaleShiftMACE(
        r_max=3.0, num_bessel=4, num_polynomial_cutoff=5, max_ell=2,
        interaction_cls=modules.interaction_classes["RealAgnosticResidualInteractionBlock"],
        interaction_cls_first=modules.interaction_classes[first], num_interactions=num_interactions,
        num_elements=len(ZS), hidden_irreps=o3.Irreps("4x0e+4x1o"), MLP_irreps=o3.Irreps("4x0e"),
        atomic_energies=np.array([-1.0, -2.0, -3.0]), avg_num_neighbors=5.0, atomic_numbers=list(ZS),
        correlation=2, gate=torch.nn.functional.silu, radial_MLP=[8], atomic_inter_scale=1.3,
        atomic_inter_shift=0.2, **options)
    with torch.no_grad():  # zero-initialised parts would hide a weight left out
        for p in m.parameters():
            p.add_(torch.randn_like(p) * 0.3)
    return m.eval()


def _same_model(original, back):
    from equikernels.models.io import config_from_mace

    assert type(back) is type(original)
    assert {k: getattr(back, k, None) for k in _ATTRS} == {k: getattr(original, k, None) for k in _ATTRS}
    cfg_a, cfg_b = config_from_mace(original), config_from_mace(back)
    assert cfg_b == cfg_a
    sa, sb = original.state_dict(), back.state_dict()
    assert sorted(sb) == sorted(sa)
    for k in sa:
        assert sb[k].dtype == sa[k].dtype and torch.equal(sb[k], sa[k]), k
    batch = {k: (v.double() if v.is_floating_point() else v) for k, v in mace_batch(rattled_atoms()).items()}
    a = original(dict(batch), training=False, compute_force=True)
    b = back(dict(batch), training=False, compute_force=True)
    for k in ("energy", "forces"):
        torch.testing.assert_close(b[k], a[k], rtol=1e-12, atol=1e-12, msg=k)


@pytest.mark.parametrize("options", [
    {"use_so3": True},
    {"use_last_readout_only": True},
    {"keep_last_layer_irreps": True},
    {"edge_irreps": "2x0e+2x1o"},
    {"edge_irreps": "2x0e+2x1o", "use_edge_irreps_first": True},
    {"edge_irreps": "2x0e", "use_edge_irreps_first": True, "num_interactions": 1},
    {"use_last_readout_only": True, "keep_last_layer_irreps": True, "use_so3": True,
     "first": "RealAgnosticResidualInteractionBlock"},
], ids=["so3", "last_readout_only", "keep_last_layer_irreps", "edge_irreps", "edge_irreps_first",
        "edge_irreps_first_one_layer", "combined"])
def test_mace_torch_options_round_trip(options, single_thread):
    from equikernels._compat import default_dtype
    from equikernels.models import from_mace
    from equikernels.training.mace_export import to_mace

    with default_dtype(torch.float64):
        original = _mace(**options)
    _same_model(original, to_mace(from_mace(original)))


def test_per_layer_neighbour_counts_and_reduced_cg_flag_round_trip(single_thread):
    from equikernels._compat import default_dtype
    from equikernels.models import from_mace
    from equikernels.training.mace_export import to_mace

    with default_dtype(torch.float64):
        original = _mace()
    original.interactions[1].avg_num_neighbors = 7.5  # as mace-torch's fine-tuning may leave it
    _same_model(original, to_mace(from_mace(original)))


def test_convert_to_mace_of_our_file_keeps_the_options(tmp_path, single_thread):
    """``equikernels convert --to mace`` of our file (no mace-torch template to fill in)."""
    from equikernels._compat import default_dtype
    from equikernels.cli import main
    from equikernels.models import from_mace, save

    with default_dtype(torch.float64):
        original = _mace(keep_last_layer_irreps=True, edge_irreps="2x0e+2x1o", use_last_readout_only=True)
    ours = tmp_path / "ours.pt"
    save(from_mace(original), str(ours))
    out = tmp_path / "back.model"
    assert main(["convert", str(ours), str(out), "--to", "mace"]) == 0
    _same_model(original, torch.load(out, map_location="cpu", weights_only=False))


def test_a_basis_mace_torch_cannot_build_names_use_reduced_cg(monkeypatch, single_thread):
    from random_models import small_random_model

    from equikernels.training import mace_export

    # without cuequivariance mace-torch builds only its use_reduced_cg=False basis
    monkeypatch.setattr(mace_export, "_cuet_available", lambda: False)

    with pytest.raises(ValueError, match=r"different products; its symmetric contractions use another basis .*"
                                         r"use_reduced_cg") as info:
        mace_export.to_mace(small_random_model([29], seed=4))
    assert "\n" not in str(info.value)
