"""One rule for a multi-head model's head names (``equikernels.models.data.head_index``), used by the
calculator, ``equikernels eval``, graph building, training data and the LAMMPS export: a name as
given, else up to letter case ('default' for mace-torch's 'Default'); no name picks the only head or
the one called 'default'; anything else is a one-line error listing the heads, never a fallback."""
import types

import numpy as np
import pytest
import torch

from equikernels.models.data import head_index

TWO = ["Default", "pt_head"]


@pytest.mark.parametrize("head, heads, want", [
    ("pt_head", TWO, 1),
    ("Default", TWO, 0),
    (None, ["omat"], 0),
    (None, ["pt_head", "Default"], 1),
    (None, ["pt_head", "DEFAULT"], 1),
    ("default", TWO, 0),
    ("PT_HEAD", TWO, 1),
    ("default", ["pt_head", "default", "Default"], 1),  # an exact name wins over a case-folded one
])
def test_head_index_selects(head, heads, want):
    assert head_index(head, heads) == want


@pytest.mark.parametrize("head, heads, message", [
    ("nope", TWO, r"^head 'nope' is not one of the model's heads \['Default', 'pt_head'\]$"),
    ("Default", ["omat"], r"^head 'Default' is not one of the model's heads \['omat'\]$"),
    ("DEFAULT", ["default", "Default"], r"^head 'DEFAULT' is not one of the model's heads"),  # two case matches
    (3, TWO, r"^head 3 is not one of the model's heads"),
    (None, ["pbe", "r2scan"], r"^the model has several heads and none is called 'default': pass head=, "
                              r"one of \['pbe', 'r2scan'\]$"),
])
def test_head_index_refuses_in_one_line(head, heads, message):
    with pytest.raises(ValueError, match=message):
        head_index(head, heads)


def test_callers_name_their_argument():
    from equikernels.calculators.loading import resolve_head
    from equikernels.lammps.mliap import _resolve_head
    from equikernels.models.data import _head_index

    assert resolve_head("default", TWO) == 0 and _resolve_head("default", TWO) == "Default"
    assert _head_index("PT_HEAD", TWO) == 1 and _head_index(None, ["a", "Default"]) == 1
    assert _head_index(None, None) == 0 and _head_index(1, TWO) == 1
    with pytest.raises(ValueError, match=r"^head 'x' is not one of the model's heads \['Default', 'pt_head'\]$"):
        resolve_head("x", TWO)
    with pytest.raises(ValueError, match=r"^head: 'x' is not one of the model's heads \['Default', 'pt_head'\]$"):
        _resolve_head("x", TWO)
    with pytest.raises(ValueError, match=r"^head: 'x' is not one of the model's heads \['Default', 'pt_head'\]$"):
        _head_index("x", TWO)
    with pytest.raises(ValueError, match=r"^head: the model has several heads \['a', 'b'\], none called 'default'"):
        _resolve_head(None, ["a", "b"])


def _frames_file(path, heads):
    """One small Cu/Ni cell per entry of ``heads``, its info 'head' set unless None."""
    import ase.io
    from ase.build import bulk
    from ase.calculators.emt import EMT

    out = []
    for k, head in enumerate(heads):
        a = bulk("Cu", "fcc", a=3.6, cubic=True)
        a.numbers[0] = 28
        a.rattle(0.05, seed=k)
        a.calc = EMT()
        a.get_potential_energy()
        if head is not None:
            a.info["head"] = head
        out.append(a)
    ase.io.write(str(path), out, format="extxyz")
    return str(path)


@pytest.mark.parametrize("heads", [TWO, list(reversed(TWO))])
def test_training_frames_name_heads_in_any_letter_case(tmp_path, heads):
    from equikernels.training import DataKeys, read_configs
    from equikernels.training.data import build_dataset

    configs = read_configs(_frames_file(tmp_path / "f.xyz", ["default", "PT_HEAD", None]), DataKeys())
    graphs = build_dataset(configs, [28, 29], 4.0, heads).graphs
    assert [int(g.head) for g in graphs] == [heads.index("Default"), heads.index("pt_head"), heads.index("Default")]


def test_training_frame_of_an_unknown_head_is_refused_not_put_on_head_0(tmp_path):
    from equikernels.training import DataError, DataKeys, read_configs
    from equikernels.training.data import config_to_data

    path = _frames_file(tmp_path / "f{1}.xyz", ["r2scan", None])  # braces: the message is no format string
    unknown, unnamed = read_configs(path, DataKeys())
    with pytest.raises(DataError, match=r"^.*f\{1\}\.xyz, frame 0: head 'r2scan' is not one of the model's heads "
                                        r"\['Default', 'pt_head'\]$"):
        config_to_data(unknown, [28, 29], 4.0, TWO)
    with pytest.raises(DataError, match=r"f\{1\}\.xyz, frame 1: no head named .*\['pbe', 'r2scan'\].*"
                                        r"name the frame's head$"):
        config_to_data(unnamed, [28, 29], 4.0, ["pbe", "r2scan"])
    assert int(config_to_data(unnamed, [28, 29], 4.0, ["omat"]).head) == 0  # a single head of any name


def test_trainer_puts_a_frame_on_the_head_it_names_in_any_case(tmp_path):
    from equikernels.training import DataError, DataKeys, TrainConfig, Trainer, read_configs
    from equikernels.training import model_factory as mf

    heads = ["pt_head", "Default"]
    configs = read_configs(_frames_file(tmp_path / "f.xyz", ["default", "nope"]), DataKeys())
    trainer = types.SimpleNamespace(head_names=heads)
    assert Trainer._head_of(trainer, configs[0]) == "Default"
    with pytest.raises(DataError, match=r"frame 1: head 'nope' is not one of the model's heads"):
        Trainer._head_of(trainer, configs[1])

    hp = dict(hidden_irreps="4x0e", MLP_irreps="4x0e", num_interactions=1, correlation=1, max_ell=1, r_max=4.0,
              radial_MLP=[8], builder="equikernels")
    with torch.random.fork_rng():
        torch.manual_seed(0)
        model = mf.build_new_model(hp, [28, 29], np.zeros(2), 12.0, 1.0, 0.0, heads=heads, backend="equikernels")
    mf.set_e0s(model, torch.tensor([[-1.0, -2.0], [-1.5, -2.5]]))
    model_path = mf.save_model(model.double(), str(tmp_path / "two.pt"))
    cfg = TrainConfig(model=model_path, train_file=_frames_file(tmp_path / "t.xyz", ["default", "default"]),
                      epochs=1, batch_size=2, out_dir=str(tmp_path / "out"), progress=False, plot=False,
                      device="cpu", valid_fraction=0.0, e0s={"Ni": -3.0, "Cu": -4.0}, head_weights={"DEFAULT": 3.0})
    t = Trainer(cfg, log=None)
    assert [int(g.head) for g in t.train_set.graphs] == [1, 1]
    assert [float(g.weight) for g in t.train_set.graphs] == [3.0, 3.0]  # the weight's head in any case too
    np.testing.assert_array_equal(mf.get_e0s(t.model).double().numpy(), [[-1.0, -2.0], [-3.0, -4.0]])


class _StandIn(torch.nn.Module):
    """The attributes the calculator reads at construction."""

    def __init__(self, heads):
        super().__init__()
        self.register_buffer("atomic_numbers", torch.tensor([28, 29]))
        self.register_buffer("r_max", torch.tensor(4.0))
        self.weight = torch.nn.Parameter(torch.zeros(1, dtype=torch.float64))
        self.heads = heads


def test_calculator_head_in_any_letter_case():
    from equikernels.calculators import MACECalculator

    assert MACECalculator(_StandIn(TWO), device="cpu", head="default").head == "Default"
    assert MACECalculator(_StandIn(["pt_head", "Default"]), device="cpu", head="DEFAULT").head == "Default"
    with pytest.raises(ValueError, match=r"^head 'pbe' is not one of the model's heads \['Default', 'pt_head'\]$"):
        MACECalculator(_StandIn(TWO), device="cpu", head="pbe")
