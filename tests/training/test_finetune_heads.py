"""Fine-tuning multi-head models: E0s written only into the heads the training frames name, and the
exported mace-torch model of a multi-head run giving the same per-head energies as ours."""
import numpy as np
import pytest
import torch

from cu_ni_frames import two_head_model as _two_head_model
from cu_ni_frames import write_cu_ni_frames


def _frames(path, n, seed, head=None):
    return write_cu_ni_frames(path, n, seed, stress=True, head=head)


def _cfg(tmp_path, model, train, **kw):
    from equikernels.training import TrainConfig

    return TrainConfig(model=model, train_file=train, epochs=1, batch_size=2, out_dir=str(tmp_path / "out"),
                       progress=False, plot=False, device="cpu", valid_fraction=0.0, **kw)


@pytest.mark.parametrize("e0s", ["average", {"Cu": -3.0, "Ni": -4.0}])
def test_e0s_are_written_only_into_the_trained_heads(tmp_path, e0s):
    from equikernels.training import Trainer
    from equikernels.training import model_factory as mf

    model = _two_head_model(str(tmp_path / "two.pt"))
    train = _frames(str(tmp_path / "train.xyz"), 4, 0)  # no head key: the "Default" head
    t = Trainer(_cfg(tmp_path, model, train, e0s=e0s), log=None)
    table = mf.get_e0s(t.model).double()
    np.testing.assert_array_equal(table[0].numpy(), [-1.0, -2.0])  # pt_head has no frames: untouched
    assert not np.allclose(table[1].numpy(), [-1.5, -2.5])


def test_average_e0s_are_fitted_per_head(tmp_path):
    from equikernels.training import Trainer
    from equikernels.training import model_factory as mf
    from equikernels.training.statistics import average_e0s

    import ase.io

    model = _two_head_model(str(tmp_path / "two.pt"))
    a = ase.io.read(_frames(str(tmp_path / "a.xyz"), 4, 0, "Default"), ":")
    b = ase.io.read(_frames(str(tmp_path / "b.xyz"), 4, 10, "pt_head"), ":")
    for x in b:  # the pt_head's energies offset, so that a shared fit would differ from its own
        x.info["REF_energy"] += 1.0 * len(x)
    train = str(tmp_path / "train.xyz")
    ase.io.write(train, a + b, format="extxyz")
    t = Trainer(_cfg(tmp_path, model, train, e0s="average"), log=None)
    table = mf.get_e0s(t.model).double().numpy()
    for row, head in ((0, "pt_head"), (1, "Default")):
        own = average_e0s([c for c in t.train_configs if c.head == head], [28, 29])
        np.testing.assert_allclose(table[row], [own[28], own[29]], rtol=1e-10)


def test_head_weight_of_a_head_without_frames_is_noted(tmp_path):
    from equikernels.training import Trainer

    model = _two_head_model(str(tmp_path / "two.pt"))
    train = _frames(str(tmp_path / "train.xyz"), 2, 0)  # all of the "Default" head
    said = []
    t = Trainer(_cfg(tmp_path, model, train, head_weights={"pt_head": 0.1, "Default": 2.0}), log=said.append)
    assert [float(g.weight) for g in t.train_set.graphs] == [2.0, 2.0]
    assert any("head_weights: no training frame is of head 'pt_head'" in s for s in said), said


def test_head_weight_of_a_single_named_head_applies_to_frames_naming_no_head(tmp_path):
    from equikernels.training import Trainer

    model = _two_head_model(str(tmp_path / "one.pt"), heads=("omat",))
    train = _frames(str(tmp_path / "train.xyz"), 2, 0)  # no head key: trains the model's one head
    t = Trainer(_cfg(tmp_path, model, train, head_weights={"omat": 3.0}), log=None)
    assert [float(g.weight) for g in t.train_set.graphs] == [3.0, 3.0]


@pytest.mark.mace
def test_exported_multihead_model_matches_ours_per_head(tmp_path, single_thread):
    pytest.importorskip("mace")
    from mace.calculators import MACECalculator as MaceTorchCalculator

    import ase.io

    from equikernels.calculators import MACECalculator
    from equikernels.training import fine_tune

    from mace import modules

    from equikernels._compat import default_dtype, o3

    with default_dtype(torch.float64), torch.random.fork_rng():
        torch.manual_seed(0)
        inter = modules.interaction_classes["RealAgnosticResidualInteractionBlock"]
        m = modules.ScaleShiftMACE(
            r_max=4.0, num_bessel=4, num_polynomial_cutoff=5, max_ell=1, interaction_cls=inter,
            interaction_cls_first=inter, num_interactions=2, num_elements=2, hidden_irreps=o3.Irreps("4x0e+4x1o"),
            MLP_irreps=o3.Irreps("4x0e"), atomic_energies=np.array([[-1.0, -2.0], [-1.5, -2.5]]),
            avg_num_neighbors=12.0, atomic_numbers=[28, 29], correlation=2, gate=torch.nn.functional.silu,
            radial_MLP=[8], heads=["pt_head", "Default"], atomic_inter_scale=[1.0, 0.5],
            atomic_inter_shift=[0.0, 0.1])
    model = str(tmp_path / "two.model")
    torch.save(m, model)  # as mace-torch saves its models
    train = _frames(str(tmp_path / "train.xyz"), 4, 0)
    summary = fine_tune(_cfg(tmp_path, model, train, e0s="average"))
    atoms = ase.io.read(train, 0)
    for head in ("pt_head", "Default"):
        got = []
        for calc in (MaceTorchCalculator(model_paths=summary["mace_model_path"], device="cpu",
                                         default_dtype="float64", head=head),
                     MACECalculator(summary["model_path"], device="cpu", default_dtype="float64", head=head)):
            a = atoms.copy()
            a.calc = calc
            got.append(a.get_potential_energy())
        assert got[0] == pytest.approx(got[1], rel=1e-9), head
