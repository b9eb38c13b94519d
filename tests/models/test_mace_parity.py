"""Parity of equikernels.models with mace-torch 0.3.16 models built here with random weights.

Inputs come from mace-torch's own data pipeline (AtomicData + its DataLoader). Every model is
compared on one batch holding a periodic, rattled crystal and a molecule (non-periodic), for energy,
node energies, forces, stress and virials; fp64 to 1e-8 relative, fp32 to 1e-5.
"""
import os
import subprocess
import sys

import numpy as np
import pytest
import torch

pytestmark = pytest.mark.mace
mace = pytest.importorskip("mace")

from equikernels._compat import default_dtype, o3  # noqa: E402

KEYS = ("energy", "node_energy", "forces", "stress", "virials")


def _rel(a, b):
    a, b = a.detach(), b.detach()
    return float((a - b).abs().max() / b.abs().max().clamp_min(1e-30))


def _mace_model(dtype, *, model="ScaleShiftMACE", first="RealAgnosticResidualInteractionBlock",
                inter="RealAgnosticResidualInteractionBlock", hidden="8x0e+8x1o", correlation=3, zs=(1, 6, 8),
                heads=None, num_interactions=2, seed=0, **extra):
    from mace import modules  # noqa: PLC0415

    torch.manual_seed(seed)
    nh = len(heads) if heads else 1
    e0 = np.random.default_rng(seed).uniform(-3, -1, size=(nh, len(zs)) if heads else len(zs))
    kw = dict(r_max=3.5, num_bessel=6, num_polynomial_cutoff=5, max_ell=3,
              interaction_cls=modules.interaction_classes[inter], interaction_cls_first=modules.interaction_classes[first],
              num_interactions=num_interactions, num_elements=len(zs), hidden_irreps=o3.Irreps(hidden),
              MLP_irreps=o3.Irreps("8x0e"), atomic_energies=e0, avg_num_neighbors=7.0, atomic_numbers=list(zs),
              correlation=correlation, gate=torch.nn.functional.silu, radial_MLP=[16, 16], heads=heads, **extra)
    with default_dtype(dtype):
        if model == "ScaleShiftMACE":
            scale = [1.1, 0.7][:nh] if heads else 1.3
            shift = [0.2, -0.1][:nh] if heads else 0.2
            m = modules.ScaleShiftMACE(atomic_inter_scale=scale, atomic_inter_shift=shift, **kw)
        else:
            m = modules.MACE(**kw)
        with torch.no_grad():  # zero-initialised parts would hide mistakes: randomise every parameter
            for p in m.parameters():
                if p.requires_grad:
                    p.add_(torch.randn_like(p) * 0.3)
    return m


def _structures(zs, seed=0):
    import ase.build  # noqa: PLC0415

    rng = np.random.default_rng(seed)
    crystal = ase.build.bulk("C", "diamond", a=3.57, cubic=True)
    crystal.numbers = rng.choice(zs, size=len(crystal))
    crystal.rattle(0.15, seed=seed)
    mol = ase.build.molecule("CH3CH2OH")
    mol.numbers = rng.choice(zs, size=len(mol))
    mol.rattle(0.05, seed=seed + 1)
    return [crystal, mol]


def _mace_batch(atoms_list, zs, r_max, dtype, heads=None, head_names=None):
    from mace import data as mdata  # noqa: PLC0415
    from mace import tools  # noqa: PLC0415
    from mace.tools import torch_geometric  # noqa: PLC0415

    z = tools.AtomicNumberTable(list(zs))
    graphs = []
    with default_dtype(dtype):
        for n, atoms in enumerate(atoms_list):
            cfg = mdata.config_from_atoms(atoms, head_name=head_names[n] if head_names else "Default")
            graphs.append(mdata.AtomicData.from_config(cfg, z_table=z, cutoff=r_max, heads=heads))
    batch = next(iter(torch_geometric.dataloader.DataLoader(graphs, batch_size=len(graphs))))
    return batch.to_dict()


def _compare(m, dtype, tol, heads=None, head_names=None, training=False, pick=None):
    from equikernels.models import from_mace  # noqa: PLC0415

    ours = from_mace(m)
    zs = tuple(m.atomic_numbers.tolist())
    data = _mace_batch(_structures(pick or zs), zs, float(m.r_max), dtype, heads, head_names)
    ref = m(dict(data), compute_stress=True, training=training)
    out = ours(dict(data), compute_stress=True, training=training)
    for k in KEYS:
        assert out[k].dtype == ref[k].dtype, k
        assert _rel(out[k], ref[k]) < tol, (k, _rel(out[k], ref[k]))
    assert _rel(out["node_feats"], ref["node_feats"]) < tol
    return ours, m, data, out, ref


CONFIGS = {
    "small-residual-corr2": dict(hidden="8x0e", correlation=2),
    "medium-plain-first": dict(first="RealAgnosticInteractionBlock", correlation=3),
    "large-MACE-89el": dict(model="MACE", hidden="4x0e+4x1o+4x2e", correlation=2, zs=tuple(range(1, 90))),
    "mp0b3-like": dict(first="RealAgnosticDensityResidualInteractionBlock",
                       inter="RealAgnosticDensityResidualInteractionBlock", pair_repulsion=True,
                       distance_transform="Agnesi", hidden="8x0e+8x1o", correlation=3),
    "agnostic-product-last-readout": dict(use_agnostic_product=True, use_last_readout_only=True, correlation=2,
                                          hidden="4x0e+4x1o"),
    "density-plain-3layers": dict(first="RealAgnosticDensityInteractionBlock",
                                  inter="RealAgnosticResidualInteractionBlock", num_interactions=3, correlation=2,
                                  hidden="4x0e+4x1o"),
    "cutoff-on-weights-density": dict(first="RealAgnosticDensityInteractionBlock", apply_cutoff=False, correlation=2,
                                      hidden="8x0e+8x1o"),
}


@pytest.mark.parametrize("name", list(CONFIGS))
def test_parity_fp64(name):
    cfg = dict(CONFIGS[name])
    zs = cfg.pop("zs", (1, 6, 8))
    m = _mace_model(torch.float64, zs=zs, **cfg)
    _compare(m, torch.float64, 1e-8, pick=None if len(zs) < 10 else (1, 8, 29, 79))


@pytest.mark.parametrize("name", ["medium-plain-first", "mp0b3-like", "cutoff-on-weights-density"])
def test_parity_fp32(name):
    m = _mace_model(torch.float32, **CONFIGS[name])
    _compare(m, torch.float32, 1e-5)


def test_parity_multihead():
    heads = ["pbe", "r2scan"]
    m = _mace_model(torch.float64, heads=heads, correlation=2)
    ours, *_ = _compare(m, torch.float64, 1e-8, heads=heads, head_names=["r2scan", "pbe"])
    assert ours.heads == heads


@pytest.mark.parametrize("apply_cutoff", [True, False])
def test_training_gradients_match(apply_cutoff):
    """Force loss gradients w.r.t. parameters (double backward through every op) equal mace-torch's."""
    from equikernels.models.io import config_from_mace, mace_key_map  # noqa: PLC0415

    m = _mace_model(torch.float64, correlation=2, hidden="4x0e+4x1o", apply_cutoff=apply_cutoff)
    ours, m, data, out, ref = _compare(m, torch.float64, 1e-8, training=True)
    keymap = mace_key_map(m, config_from_mace(m))
    (out["forces"].pow(2).sum() + out["energy"].sum()).backward()
    (ref["forces"].pow(2).sum() + ref["energy"].sum()).backward()
    theirs = dict(m.named_parameters())
    checked = 0
    for name, p in ours.named_parameters():
        q = theirs[keymap[name]]
        assert p.grad is not None and q.grad is not None, name
        assert _rel(p.grad, q.grad) < 1e-7, (name, _rel(p.grad, q.grad))
        checked += 1
    assert checked == len(theirs)


def test_config_builder_matches_mace():
    from equikernels.models import config_from_mace  # noqa: PLC0415
    from equikernels.models.builder import mace_config  # noqa: PLC0415

    m = _mace_model(torch.float64, first="RealAgnosticInteractionBlock", heads=["a", "b"])
    ours = mace_config(r_max=3.5, num_bessel=6, num_polynomial_cutoff=5, max_ell=3,
                       interaction="RealAgnosticResidualInteractionBlock", interaction_first="RealAgnosticInteractionBlock",
                       num_interactions=2, atomic_numbers=[1, 6, 8], hidden_irreps="8x0e+8x1o", MLP_irreps="8x0e",
                       avg_num_neighbors=7.0, correlation=3, radial_MLP=[16, 16], heads=["a", "b"])
    theirs = config_from_mace(m)
    for p in ours["products"] + theirs["products"]:
        p.pop("u_shapes")  # the builder's coupled basis has its own sizes
    ours["interactions"] = [{**i, "instructions": [list(t) for t in i["instructions"]]} for i in ours["interactions"]]
    theirs["interactions"] = [{**i, "instructions": [list(t) for t in i["instructions"]]} for i in theirs["interactions"]]
    assert ours == theirs


def test_atoms_to_data_matches_mace_graph():
    from equikernels.models import atoms_list_to_data  # noqa: PLC0415

    zs = (1, 6, 8)
    atoms = _structures(zs)
    ref = _mace_batch(atoms, zs, 3.5, torch.float64)
    ours = atoms_list_to_data(atoms, 3.5, zs, dtype=torch.float64)
    for k in ("positions", "node_attrs", "cell", "batch", "ptr"):
        assert torch.equal(ours[k], ref[k]), k

    def edges(d):
        rows = torch.cat([d["edge_index"].T.double(), d["unit_shifts"], d["shifts"]], 1)
        return rows[torch.argsort(rows[:, 0] * 1e6 + rows[:, 1] * 1e3 + rows[:, 2] * 100 + rows[:, 3] * 10 + rows[:, 4])]

    a, b = edges(ours), edges(ref)
    assert a.shape == b.shape and torch.allclose(a, b, atol=1e-12)


def test_load_mace_file_save_and_load_without_mace(tmp_path):
    from equikernels.cli import main  # noqa: PLC0415
    from equikernels.models import load  # noqa: PLC0415

    m = _mace_model(torch.float64, correlation=2, hidden="4x0e+4x1o")
    torch.save(m, tmp_path / "m.model")
    ours = load(tmp_path / "m.model")
    data = _mace_batch(_structures((1, 6, 8)), (1, 6, 8), 3.5, torch.float64)
    ref = m(dict(data), compute_stress=True)
    out = ours(dict(data), compute_stress=True)
    for k in KEYS:
        assert _rel(out[k], ref[k]) < 1e-8, k
    assert main(["convert", str(tmp_path / "m.model"), str(tmp_path / "converted.pt")]) == 0
    torch.save({k: v.detach() for k, v in data.items()}, tmp_path / "data.pt")
    np.save(tmp_path / "ref.npy", torch.cat([ref["energy"], ref["forces"].reshape(-1), ref["stress"].reshape(-1)]).detach().numpy())
    script = (
        "import sys, torch, numpy as np\n"
        "from equikernels.models import load\n"
        f"m = load({str(tmp_path / 'converted.pt')!r})\n"
        f"d = torch.load({str(tmp_path / 'data.pt')!r})\n"
        "o = m(d, compute_stress=True)\n"
        "assert not any(k == 'mace' or k.startswith('mace.') for k in sys.modules), 'mace-torch was imported'\n"
        "got = torch.cat([o['energy'], o['forces'].reshape(-1), o['stress'].reshape(-1)]).detach().numpy()\n"
        f"ref = np.load({str(tmp_path / 'ref.npy')!r})\n"
        "assert np.abs(got - ref).max() <= 1e-8 * np.abs(ref).max(), np.abs(got - ref).max()\n"
        "print('ok')\n")
    res = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=300,
                         env={**os.environ, "PYTHONPATH": os.getcwd()})
    assert res.returncode == 0 and "ok" in res.stdout, res.stderr[-3000:]


def test_unsupported_mace_models_are_refused():
    from mace import modules  # noqa: PLC0415

    from equikernels.models import from_mace  # noqa: PLC0415

    with default_dtype(torch.float64):
        dip = modules.AtomicDipolesMACE(
            r_max=3.5, num_bessel=4, num_polynomial_cutoff=5, max_ell=1,
            interaction_cls=modules.interaction_classes["RealAgnosticResidualInteractionBlock"],
            interaction_cls_first=modules.interaction_classes["RealAgnosticResidualInteractionBlock"],
            num_interactions=2, num_elements=2, hidden_irreps=o3.Irreps("4x0e+4x1o"), MLP_irreps=o3.Irreps("4x0e"),
            avg_num_neighbors=3.0, atomic_numbers=[1, 8], correlation=2, gate=torch.nn.functional.silu,
            atomic_energies=None)
    with pytest.raises(TypeError, match="mace_model"):
        from_mace(dip)
    with pytest.raises(TypeError, match="mace_model"):
        from_mace(torch.nn.Linear(2, 2))
