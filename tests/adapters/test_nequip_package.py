"""accelerate() on a model of the nequip package (skipped without it): its TensorProductScatter layers
fused, the same energies, forces and stress (float64), state dicts loading both ways, and the model
still copied, pickled and deployed as nequip deploys it (TorchScript through e3nn's script)."""
import copy
import io

import pytest
import torch

pytest.importorskip("nequip")

import equikernels as ek  # noqa: E402
from equikernels._compat import e3nn  # noqa: E402

pytestmark = pytest.mark.nequip

TOL = 1e-11
TYPES = ["H", "C", "O"]
KEYS = ("total_energy", "forces", "stress")


@pytest.fixture
def nequip_state():
    """nequip's global state for building models; e3nn's optimisation defaults restored after."""
    from nequip.utils.global_state import global_state_initialized, set_global_state

    saved = e3nn.get_optimization_defaults() if hasattr(e3nn, "get_optimization_defaults") else None
    if not global_state_initialized():
        set_global_state(allow_tf32=False)
    torch.set_default_dtype(torch.float64)  # nequip's global dtype (the suite restores the default after each test)
    yield
    if saved is not None:
        e3nn.set_optimization_defaults(**{k: v for k, v in saved.items() if k != "jit_script_fx"})


def _model():
    from nequip.model import NequIPGNNModel

    return NequIPGNNModel(seed=123, model_dtype="float64", type_names=TYPES, r_max=3.5, avg_num_neighbors=8.0,
                          per_type_energy_shifts={"H": 1.0, "C": 2.0, "O": 3.0}, per_type_energy_scales=1.3,
                          l_max=1, parity=True, num_features=4, num_layers=2, radial_mlp_depth=1,
                          radial_mlp_width=8)


def _data():
    from ase.build import bulk
    from nequip.data import compute_neighborlist_, from_ase
    from nequip.data.transforms import ChemicalSpeciesToAtomTypeMapper

    atoms = bulk("C", "diamond", a=3.57).repeat((2, 1, 1))
    atoms.set_chemical_symbols(["C", "O", "C", "H"])
    atoms.rattle(0.05, seed=2)
    return compute_neighborlist_(ChemicalSpeciesToAtomTypeMapper(TYPES)(from_ase(atoms)), 3.5)


def _assert_same(out, ref):
    for k in KEYS:
        torch.testing.assert_close(out[k].detach(), ref[k].detach(), rtol=TOL, atol=TOL)


def test_nequip_model_fused_with_the_same_numbers_and_state(nequip_state):
    model, data = _model(), _data()
    plain = copy.deepcopy(model)
    ref = plain(dict(data))
    keys = list(model.state_dict())
    report = ek.accelerate(model)
    fused = [n for n, cls, _ in report.fused if cls == "TensorProductScatter"]
    assert fused == [f"model.func.layer{i}_convnet.conv.tp_scatter" for i in (0, 1)], str(report)
    assert report.left_alone == [] and report.not_fused == [], str(report)
    _assert_same(model(dict(data)), ref)
    assert list(model.state_dict()) == keys
    other = _model()
    other.load_state_dict(model.state_dict())  # accelerated -> plain
    ek.accelerate(other)
    other.load_state_dict(plain.state_dict())  # plain -> accelerated
    _assert_same(other(dict(data)), ref)
    buf = io.BytesIO()
    torch.save(model, buf)
    buf.seek(0)
    for m in (copy.deepcopy(model), torch.load(buf, weights_only=False)):
        _assert_same(m(dict(data)), ref)


def test_nequip_torchscript_deploy_of_the_accelerated_model(nequip_state, tmp_path):
    from nequip.model.inference_models.torchscript import save_torchscript_model

    model, data = _model(), _data()
    ref = model(dict(data))
    ek.accelerate(model)
    path = str(tmp_path / "model.nequip.pth")
    save_torchscript_model(copy.deepcopy(model), {"r_max": 3.5, "type_names": " ".join(TYPES)}, path, "cpu")
    _assert_same(torch.jit.load(path)(dict(data)), ref)


def test_nequip_compiled_training_model_gives_eager_forces(nequip_state):
    from ase.build import bulk
    from nequip.data import AtomicDataDict, compute_neighborlist_, from_ase
    from nequip.data.transforms import ChemicalSpeciesToAtomTypeMapper
    from nequip.model import NequIPGNNModel

    kw = dict(seed=0, model_dtype="float64", type_names=TYPES, r_max=3.5, l_max=1, num_features=8, num_layers=3,
              radial_mlp_width=8, avg_num_neighbors=10.0, per_type_energy_shifts=0.0, per_type_energy_scales=1.0)

    def frame(seed):
        atoms = bulk("C", "diamond", a=3.57, cubic=True)
        atoms.set_chemical_symbols([TYPES[(i * seed) % 3] for i in range(len(atoms))])
        atoms.rattle(0.05, seed=seed)
        return compute_neighborlist_(ChemicalSpeciesToAtomTypeMapper(TYPES)(from_ase(atoms)), 3.5)

    batch = AtomicDataDict.batched_from_list([frame(1), frame(2)])  # nequip traces batches of two or more
    ref = NequIPGNNModel(**kw).train()(dict(batch))
    compiled = NequIPGNNModel(compile_mode="compile", **kw).train()
    ek.accelerate(compiled)
    out = compiled(dict(batch))
    for k in ("total_energy", "forces"):
        torch.testing.assert_close(out[k].detach(), ref[k].detach(), rtol=TOL, atol=TOL)
