"""`equikernels eval` with mace_eval_configs' command line: --configs, --compute_stress, and the per-atom
energies, energy terms and descriptors it writes, checked against the model's own outputs and (with
mace-torch installed) against mace_eval_configs' file for the same model and structures."""
import ase.io
import numpy as np
import pytest
import torch
from ase import Atoms
from ase.build import bulk

from equikernels.cli import main
from cli_checks import one_line_error


def _frames():
    cu = bulk("Cu", "fcc", a=3.62, cubic=True) * (2, 1, 1)
    cu.numbers[::3] = 28
    cu.rattle(0.05, seed=1)
    dimer = Atoms("CuNi", positions=[[0, 0, 0], [0, 0, 2.3]])
    return [cu, dimer]


@pytest.fixture
def frames_file(tmp_path):
    path = str(tmp_path / "frames.xyz")
    ase.io.write(path, _frames(), format="extxyz")
    return path


def _eval(*argv):
    return main(["eval", *argv, "--no-progress", "--device", "cpu"])


def _model_outputs(model_path, frame):
    """The model's own node energies and node features for one frame, through the calculator's model."""
    from equikernels.calculators.loading import resolve_model
    from equikernels.models.data import atoms_to_data

    model = resolve_model(model_path, torch.device("cpu")).double()
    data = atoms_to_data(frame, float(model.r_max), model.atomic_numbers.tolist(), device="cpu", dtype=torch.float64)
    out = model(data, compute_force=True)
    return model, {k: v.detach() for k, v in out.items() if isinstance(v, torch.Tensor)}


def test_configs_flag_and_per_atom_outputs_are_the_models(frames_file, tmp_path, capsys):
    from e3nn import o3

    out = str(tmp_path / "pred.xyz")
    assert _eval("--configs", frames_file, "--output", out, "--compute_stress", "--return_node_energies",
                 "--return_descriptors") == 0
    got = ase.io.read(out, ":")
    for frame, written in zip(_frames(), got):
        model, ref = _model_outputs(None, written)
        np.testing.assert_allclose(written.arrays["MACE_node_energies"], ref["node_energy"].numpy(), atol=1e-7)
        assert written.arrays["MACE_node_energies"].sum() == pytest.approx(written.info["MACE_energy"], abs=1e-6)
        # invariants of every layer: the 0e block at the start of each layer's features (mul_ir)
        layers = [o3.Irreps(str(p.linear.irreps_out)) for p in model.products]
        start, blocks = 0, []
        for irreps in layers:
            scalars = sum(m.dim for m in irreps if m.ir.l == 0 and m.ir.p == 1)
            blocks.append(ref["node_feats"][:, start:start + scalars])
            start += irreps.dim
        assert start == ref["node_feats"].shape[1]
        np.testing.assert_allclose(written.arrays["MACE_descriptors"], torch.cat(blocks, 1).numpy(), atol=1e-7)
    assert "MACE_stress" in got[0].info and "MACE_stress" not in got[1].info


def test_descriptors_aggregated_per_structure_and_per_element(frames_file, tmp_path):
    per_atom, mean, per_element = (str(tmp_path / f"{n}.xyz") for n in ("atoms", "mean", "elements"))
    assert _eval(frames_file, "--out", per_atom, "--return-descriptors", "--descriptor_invariants_only", "false",
                 "--descriptor_num_layers", "1") == 0
    assert _eval(frames_file, "--out", mean, "--return-descriptors", "--descriptor_invariants_only", "false",
                 "--descriptor_num_layers", "1", "--descriptor_aggregation_method", "mean") == 0
    assert _eval(frames_file, "--out", per_element, "--return-descriptors", "--descriptor_invariants_only", "false",
                 "--descriptor_num_layers", "1", "--descriptor_aggregation_method", "per_element_mean") == 0
    model, ref = _model_outputs(None, _frames()[0])
    first_layer = model.products[0].linear.irreps_out.dim
    for a, m, e in zip(*(ase.io.read(p, ":") for p in (per_atom, mean, per_element))):
        d = a.arrays["MACE_descriptors"]
        assert d.shape == (len(a), first_layer)
        np.testing.assert_allclose(m.info["MACE_descriptors"], d.mean(0), atol=1e-8)  # d: 8 decimals
        symbols = np.array(a.get_chemical_symbols())
        assert sorted(e.info["MACE_descriptors"]) == sorted(set(symbols))
        for s, v in e.info["MACE_descriptors"].items():
            np.testing.assert_allclose(v, d[symbols == s].mean(0), atol=1e-8)


def test_earlier_extra_outputs_are_not_kept(frames_file, tmp_path):
    first, second = str(tmp_path / "first.xyz"), str(tmp_path / "second.xyz")
    assert _eval(frames_file, "--out", first, "--return_node_energies", "--return_descriptors",
                 "--descriptor_aggregation_method", "mean") == 0
    assert _eval(first, "--out", second) == 0
    for a in ase.io.read(second, ":"):
        assert "MACE_node_energies" not in a.arrays and "MACE_descriptors" not in a.info


@pytest.mark.parametrize("argv, needles", [
    ((), ["no structures file", "--configs"]),
    (("x.xyz", "--configs", "y.xyz"), ["two structures files", "--configs"]),
    (("{f}", "--compute_stress", "--no-stress"), ["--compute-stress", "--no-stress"]),
    (("{f}", "--descriptor_num_layers", "1"), ["--descriptor-num-layers needs --return-descriptors"]),
    (("{f}", "--return_descriptors", "--descriptor_num_layers", "3"), ["num_layers", "1 to 2", "got 3"]),
    (("{f}", "--return_contributions"), ["contributions", "ScaleShiftMACE"]),
])
def test_bad_combinations_end_in_one_line(argv, needles, frames_file, tmp_path, capsys):
    out = tmp_path / "o.xyz"
    assert _eval(*[a.format(f=frames_file) for a in argv], "--out", str(out)) == 2
    one_line_error(capsys, *needles)
    assert not out.exists()


def _mace_model(tmp_path, scale_shift: bool):
    from mace import modules

    from equikernels._compat import default_dtype, o3

    with default_dtype(torch.float64), torch.random.fork_rng():
        torch.manual_seed(0)
        inter = modules.interaction_classes["RealAgnosticResidualInteractionBlock"]
        kwargs = dict(r_max=4.0, num_bessel=4, num_polynomial_cutoff=5, max_ell=2, interaction_cls=inter,
                      interaction_cls_first=inter, num_interactions=2, num_elements=2,
                      hidden_irreps=o3.Irreps("4x0e+4x1o"), MLP_irreps=o3.Irreps("4x0e"),
                      atomic_energies=np.array([-1.0, -2.0]), avg_num_neighbors=8.0, atomic_numbers=[28, 29],
                      correlation=2, gate=torch.nn.functional.silu)
        if scale_shift:
            m = modules.ScaleShiftMACE(**kwargs, atomic_inter_scale=1.5, atomic_inter_shift=0.1)
        else:
            m = modules.MACE(**kwargs)
    path = str(tmp_path / ("scaleshift.model" if scale_shift else "mace.model"))
    torch.save(m.double(), path)
    return path


@pytest.mark.mace
@pytest.mark.parametrize("scale_shift", [False, True])
@pytest.mark.parametrize("aggregation", [None, "mean", "per_element_mean"])
def test_same_file_as_mace_eval_configs(scale_shift, aggregation, tmp_path, monkeypatch):
    pytest.importorskip("mace")
    from mace.cli import eval_configs

    monkeypatch.setenv("TORCH_FORCE_NO_WEIGHTS_ONLY_LOAD", "1")
    model = _mace_model(tmp_path, scale_shift)
    crystal = _frames()[0]
    cluster = crystal.copy()
    cluster.pbc = False
    cluster.rattle(0.1, seed=3)
    frames_file = str(tmp_path / "same_size.xyz")  # mace_eval_configs' node energies need frames of one size
    ase.io.write(frames_file, [crystal, cluster], format="extxyz")
    argv = ["--configs", frames_file, "--model", model, "--compute_stress", "--return_node_energies",
            "--return_descriptors", "--default_dtype", "float64", "--batch_size", "2"]
    argv += [] if scale_shift else ["--return_contributions"]
    argv += ["--descriptor_aggregation_method", aggregation] if aggregation else []
    theirs, ours = str(tmp_path / "theirs.xyz"), str(tmp_path / "ours.xyz")
    saved = torch.get_default_dtype()
    try:
        monkeypatch.setattr("sys.argv", ["mace_eval_configs", *argv, "--output", theirs])
        eval_configs.run(eval_configs.parse_args())
    finally:
        torch.set_default_dtype(saved)
    assert _eval(*argv, "--output", ours) == 0
    for t, o in zip(ase.io.read(theirs, ":"), ase.io.read(ours, ":")):
        # mace-torch writes a stress for every frame, ours only for frames periodic in all directions
        keys = [k for k in t.info if k.startswith("MACE_") and (t.pbc.all() or k != "MACE_stress")]
        assert sorted(keys) == sorted(k for k in o.info if k.startswith("MACE_")), (keys, list(o.info))
        assert sorted(k for k in t.arrays if k.startswith("MACE_")) == sorted(k for k in o.arrays if k.startswith("MACE_"))
        for k in keys:
            if isinstance(t.info[k], dict):
                assert sorted(t.info[k]) == sorted(o.info[k])
                for s in t.info[k]:
                    np.testing.assert_allclose(o.info[k][s], t.info[k][s], atol=1e-9, err_msg=k)
            else:
                np.testing.assert_allclose(np.ravel(o.info[k]), np.ravel(t.info[k]), atol=1e-9, err_msg=k)
        for k in (k for k in t.arrays if k.startswith("MACE_")):
            np.testing.assert_allclose(o.arrays[k], t.arrays[k], atol=2e-8, err_msg=k)  # 8 decimals in extxyz
