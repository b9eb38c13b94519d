"""equikernels.models without mace-torch: random MACE models from the builder (coupled-CG U
tensors) checked for physics (finite differences, invariance, energy sums), storage, layouts,
the symmetric contraction and the element-indexed linear against independent oracles, and errors."""
import numpy as np
import pytest
import torch

from equikernels._compat import default_dtype, o3
from equikernels.models import MACE, ScaleShiftMACE, atoms_list_to_data, atoms_to_data, load, save
from equikernels.models.builder import coupled_u_matrices, mace_config, random_model
from mace_models import R_MAX, ZS, _batch, _config, _crystal, _model, _molecule


def _one(atoms, **kw):
    return atoms_to_data(atoms, R_MAX, ZS, dtype=torch.float64, **kw)


MODELS = {
    "scaleshift": dict(),
    "plain-mace-corr3": dict(model="MACE", correlation=3, interaction_first="RealAgnosticResidualInteractionBlock"),
    "mp0b3-like": dict(interaction="RealAgnosticDensityResidualInteractionBlock",
                       interaction_first="RealAgnosticDensityResidualInteractionBlock", pair_repulsion=True,
                       distance_transform="Agnesi"),
    "density-soft-nocutoff": dict(interaction_first="RealAgnosticDensityInteractionBlock", distance_transform="Soft",
                                  apply_cutoff=False),
}


@pytest.mark.parametrize("name", list(MODELS))
def test_rotation_translation_invariance(name):
    model = _model(**MODELS[name])
    crystal = _crystal()
    R = o3.rand_matrix(dtype=torch.float64).numpy()
    moved = crystal.copy()
    moved.set_cell(crystal.cell.array @ R.T, scale_atoms=False)
    moved.positions = crystal.positions @ R.T + np.array([0.3, -1.2, 2.0])
    mol = _molecule()
    mol2 = mol.copy()
    mol2.positions = mol.positions @ R.T - 0.7
    a = model(_batch([crystal, mol]), compute_stress=True)
    b = model(_batch([moved, mol2]), compute_stress=True)
    Rt = torch.from_numpy(R)
    assert torch.allclose(a["energy"], b["energy"], rtol=1e-11, atol=1e-11)
    assert torch.allclose(a["forces"] @ Rt.T, b["forces"], atol=1e-10)
    assert torch.allclose(Rt @ a["stress"][0] @ Rt.T, b["stress"][0], atol=1e-10)
    assert a["forces"].abs().max() > 1e-3  # a non-trivial model


@pytest.mark.parametrize("name", ["scaleshift", "mp0b3-like"])
def test_finite_difference_forces_and_stress(name):
    model = _model(**MODELS[name])
    data = _one(_crystal())
    out = model(dict(data), compute_stress=True)

    def energy(pos, cell):
        d = dict(data)
        d["positions"] = pos
        d["cell"] = cell
        d["shifts"] = d["unit_shifts"] @ cell
        return float(model(d, compute_force=False)["energy"])

    pos, cell, h = data["positions"].detach(), data["cell"], 1e-5
    for atom, k in ((0, 0), (3, 1), (5, 2)):
        dp = torch.zeros_like(pos)
        dp[atom, k] = h
        fd = -(energy(pos + dp, cell) - energy(pos - dp, cell)) / (2 * h)
        assert abs(fd - float(out["forces"][atom, k])) < 1e-7
    volume = abs(float(torch.linalg.det(cell)))
    for i, j in ((0, 0), (1, 2), (2, 1), (0, 1)):
        eps = torch.zeros(3, 3, dtype=pos.dtype)
        eps[i, j] = eps[j, i] = h / 2 if i != j else h
        deform = lambda s: (pos @ (torch.eye(3) + s * eps), cell @ (torch.eye(3) + s * eps))  # noqa: E731
        fd = (energy(*deform(1)) - energy(*deform(-1))) / (2 * h) / volume
        assert abs(fd - float(out["stress"][0, i, j])) < 1e-7, (i, j)


@pytest.mark.parametrize("name", ["scaleshift", "plain-mace-corr3"])
def test_node_energies_sum_to_energy_and_batching(name):
    model = _model(**MODELS[name])
    atoms = [_crystal(), _molecule()]
    out = model(_batch(atoms), compute_stress=True)
    data = _batch(atoms)
    sums = torch.zeros(2, dtype=torch.float64).index_add(0, data["batch"], out["node_energy"].double())
    assert torch.allclose(sums, out["energy"].double(), rtol=1e-12)
    for g, a in enumerate(atoms):
        single = model(_one(a), compute_stress=True)
        assert torch.allclose(single["energy"], out["energy"][g:g + 1], rtol=1e-12)
        sl = slice(int(data["ptr"][g]), int(data["ptr"][g + 1]))
        assert torch.allclose(single["forces"], out["forces"][sl], atol=1e-12)
        assert torch.allclose(single["stress"], out["stress"][g:g + 1], atol=1e-12)


def test_outputs_only_when_asked_and_training_graph():
    model = _model()
    data = _one(_crystal())
    out = model(dict(data))
    assert out["stress"] is None and out["virials"] is None and out["forces"] is not None
    assert not out["forces"].requires_grad
    out = model(dict(data), compute_virials=True)
    assert out["virials"].shape == (1, 3, 3) and out["stress"] is not None
    assert model(dict(data), compute_force=False)["forces"] is None
    out = model(dict(data), training=True, compute_stress=True)
    assert out["forces"].requires_grad and out["stress"].requires_grad
    (out["forces"].pow(2).sum() + out["stress"].pow(2).sum()).backward()
    for name, p in model.named_parameters():
        assert p.grad is not None and torch.isfinite(p.grad).all(), name
    assert sum(float(p.grad.abs().sum()) for p in model.parameters()) > 0


def test_edge_forces_atomic_virials_and_hessian():
    model = _model()
    import ase.build

    data = _one(ase.build.molecule("H2O"))
    out = model(dict(data), compute_stress=True, compute_edge_forces=True, compute_atomic_stresses=True,
                compute_hessian=True)
    n = data["positions"].shape[0]
    assert out["edge_forces"].shape == data["shifts"].shape
    # edge forces are dE/dvec: sender gets +, receiver - (forces = -dE/dpos)
    f = torch.zeros(n, 3, dtype=torch.float64)
    f.index_add_(0, data["edge_index"][0], out["edge_forces"]).index_add_(0, data["edge_index"][1], -out["edge_forces"])
    assert torch.allclose(f, out["forces"], atol=1e-10)
    assert torch.allclose(out["atomic_virials"].sum(0), out["virials"][0], atol=1e-10)
    assert out["hessian"].shape == (3 * n, n, 3)
    h = out["hessian"].reshape(3 * n, 3 * n)
    assert torch.allclose(h, h.T, atol=1e-8)


def test_multihead_selection():
    model = _model(heads=["pbe", "r2scan"])
    assert model.heads == ["pbe", "r2scan"]
    atoms = _crystal()
    e = [float(model(_one(atoms, head=h, heads=model.heads))["energy"]) for h in model.heads]
    assert abs(e[0] - e[1]) > 1e-6
    both = model(_batch([atoms, atoms], head="r2scan", heads=model.heads))
    assert torch.allclose(both["energy"], torch.tensor([e[1], e[1]], dtype=torch.float64), rtol=1e-12)
    data = _batch([atoms, atoms])
    data["head"] = torch.tensor([1, 0])
    mixed = model(data)
    assert torch.allclose(mixed["energy"], torch.tensor([e[1], e[0]], dtype=torch.float64), rtol=1e-12)


def test_layouts_agree():
    a = _model(correlation=3)
    cfg = dict(a.config, layout="mul_ir")
    with default_dtype(torch.float64):
        b = ScaleShiftMACE(cfg)
    b.load_state_dict(a.state_dict())
    data = _batch([_crystal(), _molecule()])
    oa, ob = a(dict(data), compute_stress=True), b(dict(data), compute_stress=True)
    for k in ("energy", "forces", "stress", "node_feats"):
        assert torch.allclose(oa[k], ob[k], rtol=1e-11, atol=1e-12), k


@pytest.mark.parametrize("as_dir", [False, True])
def test_save_load_roundtrip(tmp_path, as_dir):
    model = _model(pair_repulsion=True, distance_transform="Agnesi", heads=["a", "b"])
    path = tmp_path / ("dir" if as_dir else "model.pt")
    if as_dir:
        path.mkdir()
    save(model, path)
    back = load(path)
    assert type(back) is ScaleShiftMACE and back.heads == model.heads
    assert torch.equal(back.atomic_numbers, model.atomic_numbers) and float(back.r_max) == R_MAX
    data = _batch([_crystal(), _molecule()])
    a, b = model(dict(data), compute_stress=True), back(dict(data), compute_stress=True)
    for k in ("energy", "forces", "stress"):
        assert torch.equal(a[k], b[k]), k
    f32 = load(path, dtype=torch.float32)
    c = f32(atoms_list_to_data([_crystal(), _molecule()], R_MAX, ZS, dtype=torch.float32), compute_stress=True)
    assert torch.allclose(c["energy"].double(), a["energy"], rtol=1e-5)


def test_convert_cli_on_our_format(tmp_path):
    from equikernels.cli import main

    save(_model(), tmp_path / "a.pt")
    assert main(["convert", str(tmp_path / "a.pt"), str(tmp_path / "b.pt"), "--dtype", "float32"]) == 0
    assert load(tmp_path / "b.pt").atomic_energies.dtype == torch.float32


# --- components against independent oracles ------------------------------------------------------
@pytest.mark.parametrize("layout", ["mul_ir", "ir_mul"])
def test_symmetric_contraction_matches_dense_polynomial(layout):
    from equikernels.models.symmetric_contraction import SymmetricContraction
    from equikernels.nn.spherical_harmonics import ir_mul_permutation

    C, E, N, corr = 3, 2, 7, 3
    irr_in, irr_out = f"{C}x0e+{C}x1o+{C}x2e", f"{C}x0e+{C}x1o"
    us = coupled_u_matrices(irr_in, irr_out, corr)
    with default_dtype(torch.float64):
        sc = SymmetricContraction(C, [0, 1, 2], [0, 1], [corr, corr], E, us, layout=layout)
    x = torch.randn(N, C, 9, dtype=torch.float64)  # per channel: components of 0e, 1o, 2e
    elem = torch.tensor([0, 1, 1, 0, 1, 0, 0])
    ref = []
    for o, l in enumerate([0, 1]):
        acc = torch.zeros(N, C, 2 * l + 1, dtype=torch.float64)
        for nu in range(1, corr + 1):
            u = us[o][nu - 1] if l else us[o][nu - 1].unsqueeze(0)
            w = sc.weights[o][nu - 1][elem]  # [N, K, C]
            t = torch.einsum("m...k,nkc->ncm...", u, w)
            for _ in range(nu):
                t = torch.einsum("ncm...i,nci->ncm...", t, x)
            acc = acc + t
        ref.append(acc.reshape(N, -1))  # mul_ir
    ref = torch.cat(ref, 1)
    flat = torch.cat([x[:, :, 0:1].reshape(N, -1), x[:, :, 1:4].reshape(N, -1), x[:, :, 4:9].reshape(N, -1)], 1)
    if layout == "ir_mul":
        flat, ref = flat[:, ir_mul_permutation(irr_in)], ref[:, ir_mul_permutation(irr_out)]
    out = sc(flat, elem)
    assert torch.allclose(out, ref, rtol=1e-12, atol=1e-12)
    # differentiable twice (force training)
    xx = flat.clone().requires_grad_()
    (g,) = torch.autograd.grad(sc(xx, elem).pow(2).sum(), xx, create_graph=True)
    assert torch.autograd.grad(g.sum(), sc.weights[1][2])[0].abs().sum() > 0


@pytest.mark.parametrize("frozen", [False, True])
@pytest.mark.parametrize("layout", ["mul_ir", "ir_mul"])
def test_element_linear_matches_one_hot_tensor_product(layout, frozen):
    import equikernels
    from equikernels.models.element_linear import ElementGroups, ElementLinear
    from equikernels.nn.spherical_harmonics import ir_mul_permutation

    irr_in, irr_out, E = "3x0e+2x1o+2x0e+1x2e", "4x0e+3x1o+2x2e", 4
    with default_dtype(torch.float64):
        lin = ElementLinear(irr_in, E, irr_out, layout)
        fctp = equikernels.FullyConnectedTensorProduct(irr_in, f"{E}x0e", irr_out)
    fctp.weight.data.copy_(lin.weight.data)
    lin.requires_grad_(not frozen)
    elem = torch.tensor([3, 0, 0, 2, 3, 3])
    x = torch.randn(6, o3.Irreps(irr_in).dim, dtype=torch.float64)
    ref = fctp(x, torch.nn.functional.one_hot(elem, E).double())
    if layout == "ir_mul":
        x, ref = x[:, ir_mul_permutation(irr_in)], ref[:, ir_mul_permutation(irr_out)]
    x.requires_grad_(True)
    with torch.profiler.profile() as prof:
        out = lin(x, ElementGroups.build(elem, E))
        (gx,) = torch.autograd.grad(out, x, ref)
    assert torch.allclose(out, ref, atol=1e-13)
    xr = x.detach().requires_grad_(True)
    xin = xr[:, torch.argsort(ir_mul_permutation(irr_in))] if layout == "ir_mul" else xr
    ref2 = fctp(xin, torch.nn.functional.one_hot(elem, E).double())
    ref2 = ref2[:, ir_mul_permutation(irr_out)] if layout == "ir_mul" else ref2
    assert torch.allclose(gx, torch.autograd.grad(ref2, xr, ref)[0], atol=1e-12)
    # one matrix product per block and element run, never a batched product per node
    assert "aten::bmm" not in [e.name for e in prof.events()]


def test_coupled_u_matrices_are_equivariant():
    irr_in, irr_out = o3.Irreps("1x0e+1x1o+1x2e"), o3.Irreps("1x0e+1x1o")
    us = coupled_u_matrices(irr_in, irr_out, 3)
    R = o3.rand_matrix(dtype=torch.float64)
    with default_dtype(torch.float64):  # e3nn 0.6 builds D matrices in the default dtype
        D_in, D_out = irr_in.D_from_matrix(R), [ir.D_from_matrix(R) for _, ir in irr_out]
    for o, per in enumerate(us):
        for nu, u in enumerate(per, start=1):
            u = u if o else u.unsqueeze(0)
            rot = torch.einsum("mn,n...k->m...k", D_out[o], u)
            back = u
            for axis in range(1, nu + 1):
                back = torch.movedim(torch.tensordot(back, D_in, dims=([axis], [0])), -1, axis)  # U D_in per axis
            assert torch.allclose(rot, back, atol=1e-10), (o, nu)


def test_atoms_to_data_edges_match_ase():
    from ase.neighborlist import neighbor_list

    for atoms in (_crystal(), _molecule()):
        data = _one(atoms)
        i, j, S = neighbor_list("ijS", atoms, R_MAX)
        ours = {(int(a), int(b), *map(int, s)) for a, b, s in zip(data["edge_index"][0], data["edge_index"][1],
                                                                   data["unit_shifts"].round().long())}
        assert ours == {(int(a), int(b), *map(int, s)) for a, b, s in zip(i, j, S)}
        vec = (data["positions"][data["edge_index"][1]] - data["positions"][data["edge_index"][0]] + data["shifts"])
        assert float(vec.norm(dim=1).max()) < R_MAX


# --- errors -----------------------------------------------------------------------------------------------
def test_bad_inputs(tmp_path):
    model = _model()
    good = _one(_crystal())
    with pytest.raises(KeyError, match="edge_index"):
        model({k: v for k, v in good.items() if k != "edge_index"})
    with pytest.raises(TypeError, match="positions.*dtype"):
        model({**good, "positions": good["positions"].float()})
    with pytest.raises(ValueError, match="node_attrs"):
        model({**good, "node_attrs": good["node_attrs"][:, :2]})
    with pytest.raises(IndexError, match="edge_index"):
        model({**good, "edge_index": good["edge_index"] + 100})
    with pytest.raises(KeyError, match="unit_shifts"):
        model({k: v for k, v in good.items() if k != "unit_shifts"}, compute_stress=True)
    with pytest.raises(TypeError, match="data"):
        model([good])
    with pytest.raises(ValueError, match=r"atomic numbers \[29\]"):
        import ase
        _one(ase.Atoms("Cu2", positions=[[0, 0, 0], [0, 0, 2.0]]))
    with pytest.raises(ValueError, match="head"):
        _one(_molecule(), head="nope", heads=["Default"])
    with pytest.raises(ValueError, match="r_max"):
        atoms_to_data(_molecule(), -1.0, ZS)
    with pytest.raises(FileNotFoundError, match="no such model file"):
        load(tmp_path / "missing.pt")
    (tmp_path / "junk.pt").write_bytes(b"not a model")
    with pytest.raises(ValueError, match="junk.pt: not a model file, it is text"):
        load(tmp_path / "junk.pt")
    with pytest.raises(TypeError, match="model"):
        save(torch.nn.Linear(1, 1), tmp_path / "x.pt")
    with pytest.raises(ValueError, match="layout"):
        MACE(dict(model.config, layout="xyz"))
    with pytest.raises(ValueError, match="interaction"):
        _config(interaction="NoSuchBlock")
    with default_dtype(torch.float64):
        blank = ScaleShiftMACE(model.config)  # no U tensors given or loaded
    with pytest.raises(RuntimeError, match="U tensors"):
        blank(dict(good))


@pytest.mark.gpu
def test_cuda_matches_cpu():
    model = _model(correlation=3)
    data = _batch([_crystal(), _molecule()])
    ref = model(dict(data), compute_stress=True)
    gpu = model.to("cuda")
    out = gpu({k: v.cuda() for k, v in data.items()}, compute_stress=True)
    for k in ("energy", "forces", "stress"):
        assert torch.allclose(out[k].cpu(), ref[k], rtol=1e-9, atol=1e-10), k


def test_symmetric_contraction_gradcheck_to_second_order():
    from equikernels.models.symmetric_contraction import SymmetricContraction

    C, corr = 1, 3
    us = coupled_u_matrices(f"{C}x0e+{C}x1o", f"{C}x0e+{C}x1o", corr)
    with default_dtype(torch.float64):
        sc = SymmetricContraction(C, [0, 1], [0, 1], [corr, corr], 2, us, layout="ir_mul")
    elem = torch.tensor([1, 0])
    x = torch.randn(2, 4, dtype=torch.float64, requires_grad=True)
    wt = sc.weight_table().detach()[elem].clone().requires_grad_()
    assert torch.autograd.gradcheck(lambda x, w: sc.op({"x": x, "w": w}), (x, wt))
    # second order in x with the weights live: d/dw of (dE/dx) is what force training needs
    assert torch.autograd.gradgradcheck(lambda x: sc(x, elem), (x,))
    (gx,) = torch.autograd.grad(sc.op({"x": x, "w": wt}).pow(2).sum(), x, create_graph=True)
    (gw,) = torch.autograd.grad(gx.pow(2).sum(), wt)
    h, dw = 1e-6, torch.zeros_like(wt)
    dw[1, 3] = h
    fd = [torch.autograd.grad(sc.op({"x": x, "w": wt.detach() + s * dw}).pow(2).sum(), x)[0].pow(2).sum()
          for s in (1, -1)]
    assert abs(float((fd[0] - fd[1]) / (2 * h)) - float(gw[1, 3])) < 1e-6 * max(1.0, abs(float(gw[1, 3])))


def test_symmetric_contraction_generated_kernels_match_reference():
    """The contraction's tables (forward and gradient tables) through the Triton generator (run by
    Triton's interpreter on CPU) against the reference, to second order."""
    pytest.importorskip("triton")
    from equikernels.models.symmetric_contraction import SymmetricContraction

    us = coupled_u_matrices("2x0e+2x1o+2x2e", "2x0e+2x1o", 3)
    with default_dtype(torch.float64):
        ref = SymmetricContraction(2, [0, 1, 2], [0, 1], [3, 3], 2, us, backend="reference")
        gen = SymmetricContraction(2, [0, 1, 2], [0, 1], [3, 3], 2, us, backend="triton")
    gen.load_state_dict(ref.state_dict())
    elem = torch.tensor([0, 1, 1, 0, 1])
    x = torch.randn(5, 18, dtype=torch.float64, requires_grad=True)
    results = []
    for m in (ref, gen):
        y = m(x, elem)
        (g,) = torch.autograd.grad(y.pow(2).sum(), x, create_graph=True)
        (gw,) = torch.autograd.grad(g.pow(2).sum(), m.weights[1][2])
        results.append((y, g, gw))
    for a, b in zip(*results):
        assert torch.allclose(a, b, rtol=1e-12, atol=1e-12 * float(a.abs().max()))
    assert gen.op._kernels[torch.float64] is not None  # really generated, not the fallback


def test_conv_graph_kept_for_the_same_unchanged_edge_index(monkeypatch):
    from equikernels.models import mace as mace_module

    model = _model()
    data = _one(_crystal())
    builds = []
    real = mace_module.ConvGraph.build

    def counting(*args, **kwargs):
        builds.append(1)
        return real(*args, **kwargs)

    monkeypatch.setattr(mace_module.ConvGraph, "build", staticmethod(counting))
    first = model(dict(data))["forces"]
    second = model(dict(data))["forces"]
    assert len(builds) == 1 and torch.equal(first, second)
    # the same tensor changed in place (its last two edges become copies of the first): rebuilt
    ei, shifts = data["edge_index"], data["shifts"]
    ei[:, -2:] = ei[:, :1]
    shifts[-2:] = shifts[:1]
    got = model(dict(data))["forces"]
    assert len(builds) == 2
    expected = model(dict(data, edge_index=ei.clone(), shifts=shifts.clone()))["forces"]  # another tensor: built
    assert len(builds) == 3
    assert torch.allclose(got, expected, atol=1e-12) and not torch.allclose(got, first, atol=1e-6)


@pytest.mark.parametrize("name", list(MODELS))
def test_paired_edges_run_the_radial_mlps_once_per_pair(name):
    """Edges E/2 + p reversed from edges p (``pair_edges``): the same energy, forces and stress,
    with every radial MLP given one row per pair."""
    from equikernels.models.data import PAIRED_KEY, pair_edges
    from equikernels.models.radial import RadialMLP
    model = _model(**MODELS[name])
    data = _batch([_crystal(), _molecule()])
    paired = pair_edges(data)
    e = data["edge_index"].shape[1]
    assert paired[PAIRED_KEY] and paired["edge_index"].shape[1] == e
    rows = []
    hooks = [m.register_forward_pre_hook(lambda mod, args: rows.append(args[0].shape[0]))
             for m in model.modules() if isinstance(m, RadialMLP)]
    ref = model(dict(data), compute_stress=True)
    assert rows and set(rows) == {e}
    rows.clear()
    out = model(dict(paired), compute_stress=True)
    assert set(rows) == {e // 2}
    for h in hooks:
        h.remove()
    for k in ("energy", "forces", "stress"):
        torch.testing.assert_close(out[k], ref[k], rtol=1e-12, atol=1e-12)
    assert ref["forces"].abs().max() > 1e-3


def test_paired_edges_are_checked():
    from equikernels.models.data import PAIRED_KEY, first_of_pairs, pair_edges
    model = _model()
    paired = pair_edges(_one(_crystal()))
    bad = dict(paired, shifts=paired["shifts"].clone())
    bad["shifts"][0, 0] += 1.0
    with pytest.raises(ValueError, match="paired_edges"):
        model(bad)
    with pytest.raises(ValueError, match="paired_edges"):  # a device flag would cost a sync per call
        model(dict(paired, **{PAIRED_KEY: torch.ones(2, dtype=torch.bool)}))
    full = _one(_crystal())
    one_way = dict(full, edge_index=full["edge_index"][:, :-1], shifts=full["shifts"][:-1],
                   unit_shifts=full["unit_shifts"][:-1])
    with pytest.raises(ValueError, match="reverse"):
        pair_edges(one_way)
    # as many first edges as others, but one of the others is not a reverse
    first = torch.nonzero(first_of_pairs(full["edge_index"], full["unit_shifts"])).squeeze(1)
    unit = full["unit_shifts"].clone()
    rest = torch.nonzero(~first_of_pairs(full["edge_index"], full["unit_shifts"])).squeeze(1)
    unit[rest[0]] = unit[rest[0]] + 7.0
    assert first.numel() * 2 == full["edge_index"].shape[1]
    with pytest.raises(ValueError, match="reverse"):
        pair_edges(dict(full, unit_shifts=unit))
