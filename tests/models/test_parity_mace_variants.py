"""Parity of ``equikernels.models`` with mace-torch 0.3.16 for model variants that users have and the
other parity tests leave out (radial bases, distance transforms, ZBL in range, correlation per layer,
odd/even hidden irreps, one and three layers, radial MLPs without hidden layers, readout gates,
single-head and fine-tuned multi-head models, save formats), and the errors for what is not
supported. Tiny models on a squeezed periodic crystal and a molecule, float64 to 1e-10 relative."""
import os

import numpy as np
import pytest
import torch

from equikernels.models import io as model_io
from equikernels.models import load

TOL = 1e-10
KEYS = ("energy", "node_energy", "forces", "stress")


def _mace_model(*, model="ScaleShiftMACE", first="RealAgnosticInteractionBlock",
                inter="RealAgnosticResidualInteractionBlock", hidden="4x0e+4x1o", correlation=2, heads=None,
                num_interactions=2, max_ell=2, radial_mlp=(8,), gate=torch.nn.functional.silu, **extra):
    from mace import modules  # noqa: PLC0415

    from equikernels._compat import default_dtype, o3  # noqa: PLC0415

    zs = (1, 6, 8)
    torch.manual_seed(0)
    nh = len(heads) if heads else 1
    e0 = np.random.default_rng(0).uniform(-3, -1, size=(nh, len(zs)) if heads else len(zs))
    kw = dict(r_max=3.0, num_bessel=5, num_polynomial_cutoff=5, max_ell=max_ell,
              interaction_cls=modules.interaction_classes[inter],
              interaction_cls_first=modules.interaction_classes[first],
              num_interactions=num_interactions, num_elements=len(zs), hidden_irreps=o3.Irreps(hidden),
              MLP_irreps=o3.Irreps("4x0e"), atomic_energies=e0, avg_num_neighbors=5.0, atomic_numbers=list(zs),
              correlation=correlation, gate=gate, radial_MLP=list(radial_mlp), heads=heads, **extra)
    with default_dtype(torch.float64):
        if model == "ScaleShiftMACE":
            m = modules.ScaleShiftMACE(atomic_inter_scale=[1.1, 0.7, 0.9][:nh] if heads else 1.3,
                                       atomic_inter_shift=[0.2, -0.1, 0.05][:nh] if heads else 0.2, **kw)
        else:
            m = modules.MACE(**kw)
        with torch.no_grad():  # zero-initialised parts would hide mistakes
            for p in m.parameters():
                p.add_(torch.randn_like(p) * 0.3)
    return m


def _structures():
    import ase.build  # noqa: PLC0415

    rng = np.random.default_rng(0)
    crystal = ase.build.bulk("C", "diamond", a=3.57 * 0.8, cubic=True)  # squeezed: ZBL and transforms in range
    crystal.numbers = rng.choice((1, 6, 8), size=len(crystal))
    crystal.rattle(0.1, seed=0)
    mol = ase.build.molecule("CH3CH2OH")
    mol.numbers = rng.choice((1, 6, 8), size=len(mol))
    mol.positions *= 0.85
    mol.rattle(0.05, seed=1)
    return [crystal, mol]


def _batch():
    from mace import data as mdata  # noqa: PLC0415
    from mace import tools  # noqa: PLC0415
    from mace.tools import torch_geometric  # noqa: PLC0415

    from equikernels._compat import default_dtype  # noqa: PLC0415

    z = tools.AtomicNumberTable([1, 6, 8])
    with default_dtype(torch.float64):
        graphs = [mdata.AtomicData.from_config(mdata.config_from_atoms(a), z_table=z, cutoff=3.0)
                  for a in _structures()]
    return next(iter(torch_geometric.dataloader.DataLoader(graphs, batch_size=len(graphs)))).to_dict()


def _rel(a, b):
    a, b = a.detach(), b.detach()
    return float((a - b).abs().max() / b.abs().max().clamp_min(1e-300))


def _check(ours, theirs):
    data = _batch()
    ref = theirs(dict(data), compute_stress=True)
    out = ours(dict(data), compute_stress=True)
    for k in KEYS:
        assert _rel(out[k], ref[k]) < TOL, (k, _rel(out[k], ref[k]))


VARIANTS = {
    "MACE-gaussian-soft-zbl": dict(model="MACE", radial_type="gaussian", distance_transform="Soft",
                                   pair_repulsion=True),
    "chebyshev-corr1": dict(radial_type="chebyshev", correlation=1),
    "agnesi-zbl-corr-per-layer": dict(distance_transform="Agnesi", pair_repulsion=True, correlation=[3, 1]),
    "scalars-only-1-layer": dict(hidden="8x0e", num_interactions=1),
    "residual-first-1-layer-ell1": dict(first="RealAgnosticResidualInteractionBlock", num_interactions=1, max_ell=1),
    "odd-even-hidden-3-layers": dict(hidden="2x0e+2x0o+2x1o+2x1e", num_interactions=3, radial_mlp=()),
    "ell3-tanh-gate-wide-mlp": dict(hidden="2x0e+2x1o+2x2e+2x3o", max_ell=3, gate=torch.tanh, radial_mlp=(4, 4, 4)),
    "so3-no-gate-keep-last-irreps": dict(use_so3=True, gate=None, keep_last_layer_irreps=True),
    "edge-irreps": dict(edge_irreps="4x0e+4x1o+4x2e"),
}


@pytest.mark.mace
@pytest.mark.parametrize("name", list(VARIANTS))
def test_parity_variant_fp64(name):
    pytest.importorskip("mace")
    from equikernels._compat import o3  # noqa: PLC0415
    from equikernels.models import from_mace  # noqa: PLC0415

    kw = dict(VARIANTS[name])
    if "edge_irreps" in kw:
        kw["edge_irreps"] = o3.Irreps(kw["edge_irreps"])
    m = _mace_model(**kw)
    _check(from_mace(m), m)


@pytest.mark.mace
def test_parity_fine_tuned_multihead_file_through_the_calculators(tmp_path):
    """A fine-tuned model saved whole (torch.save), its heads ["pt_head", "Default"], evaluated by
    both calculators for the head that is not the default."""
    pytest.importorskip("mace")
    from mace.calculators import MACECalculator as MaceTorchCalculator  # noqa: PLC0415

    from equikernels.calculators import MACECalculator  # noqa: PLC0415

    m = _mace_model(heads=["pt_head", "Default"], pair_repulsion=True)
    path = tmp_path / "ft.model"
    torch.save(m, path)
    crystal = _structures()[0]
    for head in ("pt_head",):
        results = []
        for calc in (MaceTorchCalculator(model_paths=str(path), device="cpu", default_dtype="float64", head=head),
                     MACECalculator(str(path), device="cpu", default_dtype="float64", head=head)):
            atoms = crystal.copy()
            atoms.calc = calc
            results.append((atoms.get_potential_energy(), atoms.get_forces(), atoms.get_stress()))
        (e_ref, f_ref, s_ref), (e, f, s) = results
        assert abs(e - e_ref) <= TOL * abs(e_ref), head
        assert np.abs(f - f_ref).max() <= TOL * np.abs(f_ref).max(), head
        assert np.abs(s - s_ref).max() <= TOL * np.abs(s_ref).max(), head


@pytest.mark.filterwarnings("ignore::DeprecationWarning")
def test_torchscript_file_is_refused_by_name(tmp_path):
    path = tmp_path / "MACE_compiled.model"
    torch.jit.save(torch.jit.script(torch.nn.Linear(2, 2)), path)
    with pytest.raises(ValueError, match=r"MACE_compiled\.model: a TorchScript \(compiled\) model") as info:
        load(path)
    assert len(str(info.value).splitlines()) == 1 and ".model file" in str(info.value)


@pytest.mark.parametrize("checkpoint", [False, True])
def test_mace_state_dict_is_refused_with_what_to_do(tmp_path, checkpoint):
    state = {"atomic_energies_fn.atomic_energies": torch.zeros(3), "atomic_numbers": torch.tensor([1, 6, 8])}
    obj = {"model": state, "optimizer": {}, "epochs": 3} if checkpoint else state
    torch.save(obj, tmp_path / "weights.pt")
    what = "training checkpoint" if checkpoint else "state dict"
    with pytest.raises(ValueError, match=rf"weights\.pt: a mace-torch {what} .*from_mace"):
        load(tmp_path / "weights.pt")


@pytest.mark.mace
def test_unsupported_mace_file_names_the_file(tmp_path):
    pytest.importorskip("mace")
    from mace.modules import blocks  # noqa: PLC0415

    path = tmp_path / "bias.model"
    torch.save(_mace_model(readout_cls=blocks.NonLinearBiasReadoutBlock), path)
    message = r"bias\.model: this mace-torch model cannot be converted: readout NonLinearBiasReadoutBlock"
    with pytest.warns(model_io.CodeExecutionWarning):
        with pytest.raises(model_io.UnconvertibleMaceModel, match=message):
            load(path)
    torch.save(torch.nn.Linear(2, 2), tmp_path / "linear.model")
    with pytest.raises(ValueError, match=r"NonLinearBiasReadoutBlock.*equikernels\.accelerate\(model\)"):
        load(path)
    with pytest.raises(TypeError, match=r"linear\.model: this mace-torch model cannot be converted: expected a "
                                        "mace-torch MACE or ScaleShiftMACE, got Linear$"):
        load(tmp_path / "linear.model")
    assert os.path.exists(path)


@pytest.mark.mace
@pytest.mark.parametrize("what", ["readout", "interaction"])
def test_calculator_runs_an_unconvertible_mace_file_accelerated(tmp_path, what):
    """A mace-torch file whose blocks equikernels' MACE does not read (a bias readout, non-linear
    residual interactions) runs in our calculator as mace-torch's module with its layers on our
    kernels, said in a warning, and gives mace-torch's calculator's energy, forces and stress."""
    pytest.importorskip("mace")
    from mace.calculators import MACECalculator as MaceTorchCalculator  # noqa: PLC0415
    from mace.modules import blocks  # noqa: PLC0415

    from equikernels.calculators import MACECalculator  # noqa: PLC0415

    kind = "RealAgnosticResidualNonLinearInteractionBlock"
    kw = (dict(readout_cls=blocks.NonLinearBiasReadoutBlock) if what == "readout" else
          dict(first=kind, inter=kind, heads=["pt_head", "Default"]))
    path = tmp_path / f"{what}.model"
    torch.save(_mace_model(**kw), path)
    named = "NonLinearBiasReadoutBlock" if what == "readout" else kind
    with pytest.warns(RuntimeWarning, match=rf"{what}\.model: .*{named}.*equikernels\.accelerate"):
        ours = MACECalculator(str(path), device="cpu", default_dtype="float64")
    assert any(type(m).__module__.startswith("equikernels.") for m in ours.model.modules())
    theirs = MaceTorchCalculator(model_paths=str(path), device="cpu", default_dtype="float64")
    results = []
    for calc in (theirs, ours):
        atoms = _structures()[0]
        atoms.calc = calc
        results.append((atoms.get_potential_energy(), atoms.get_forces(), atoms.get_stress()))
    (e_ref, f_ref, s_ref), (e, f, s) = results
    assert abs(e - e_ref) <= TOL * abs(e_ref)
    assert np.abs(f - f_ref).max() <= TOL * np.abs(f_ref).max()
    assert np.abs(s - s_ref).max() <= TOL * np.abs(s_ref).max()
