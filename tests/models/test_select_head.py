"""select_head: one head of a multi-head MACE as a single-head model giving that head's energies,
forces and stress; the same model as mace-torch's remove_pt_head (mace_select_head)."""
import pytest
import torch

from equikernels.models import ScaleShiftMACE, atoms_list_to_data, select_head
from mace_models import R_MAX, ZS, _batch, _crystal, _model, _molecule, mace_torch_two_heads

VARIANTS = {
    "scaleshift-two-heads": dict(heads=["pbe", "r2scan"]),
    "plain-three-heads-zbl": dict(model="MACE", heads=["a", "b", "c"], pair_repulsion=True),
    "last-readout-only": dict(heads=["pt_head", "Default"], use_last_readout_only=True),
    "three-layers": dict(heads=["x", "y"], num_interactions=3, MLP_irreps="6x0e"),
}


def _outputs(model, atoms, **kw):
    out = model(_batch(atoms, **kw), compute_stress=True)
    return {k: out[k].detach() for k in ("energy", "forces", "stress")}


@pytest.mark.parametrize("name", list(VARIANTS))
def test_each_head_gives_the_multi_head_models_numbers(name):
    model = _model(**VARIANTS[name])
    atoms = [_crystal(), _molecule()]
    energies = []
    for head in model.heads:
        single = select_head(model, head)
        assert single.heads == [head] and type(single) is type(model)
        want, got = _outputs(model, atoms, head=head, heads=model.heads), _outputs(single, atoms)
        for k in want:
            assert torch.allclose(got[k], want[k], rtol=1e-12, atol=1e-12), (head, k)
        energies.append(want["energy"])
    assert min(float((a - b).abs().max()) for a in energies for b in energies if a is not b) > 1e-6


def test_float32_and_layout_kept():
    model = _model(dtype=torch.float32, heads=["pbe", "r2scan"])
    cfg = dict(model.config, layout="mul_ir")
    other = ScaleShiftMACE(cfg).float()
    other.load_state_dict(model.state_dict())
    single = select_head(other, "r2scan")
    assert single.layout == "mul_ir" and single.atomic_energies.dtype == torch.float32
    atoms = [_crystal()]
    want = model(atoms_list_to_data(atoms, R_MAX, ZS, dtype=torch.float32, head="r2scan", heads=model.heads))
    got = single(atoms_list_to_data(atoms, R_MAX, ZS, dtype=torch.float32))
    assert got["energy"].dtype == torch.float32
    assert torch.allclose(got["energy"], want["energy"], rtol=1e-6)


def test_head_names_resolved_as_elsewhere():
    model = _model(heads=["pt_head", "Default"])
    assert select_head(model).heads == ["Default"]  # no name: the 'default' one
    assert select_head(model, "default").heads == ["Default"]
    with pytest.raises(ValueError, match=r"^head: 'pbe' is not one of the model's heads \['pt_head', 'Default'\]$"):
        select_head(model, "pbe")
    with pytest.raises(ValueError, match=r"^--head: the model has several heads .* name the head to keep$"):
        select_head(_model(heads=["pbe", "r2scan"]), None, argument="--head")
    with pytest.raises(TypeError, match="model: expected an equikernels MACE"):
        select_head(torch.nn.Linear(2, 2), "pbe")


@pytest.mark.mace
def test_same_model_as_mace_torch_remove_pt_head(tmp_path, single_thread):
    pytest.importorskip("mace")
    from mace.tools.scripts_utils import remove_pt_head

    from equikernels._compat import default_dtype
    from equikernels.models import from_mace, load

    path = mace_torch_two_heads(tmp_path / "two.model")
    atoms = [_crystal(), _molecule()]
    for head in ("pt_head", "Default"):
        with default_dtype(torch.float64):
            their_single = remove_pt_head(torch.load(path, weights_only=False), head)
        ours = select_head(load(path), head)
        want = _outputs(from_mace(their_single), atoms)
        got = _outputs(ours, atoms)
        for k in want:
            assert torch.allclose(got[k], want[k], rtol=1e-10, atol=1e-10), (head, k)
