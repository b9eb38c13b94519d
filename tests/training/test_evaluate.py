"""``training.evaluate.predict``: its errors are those of the labels the configs carry (unlabelled
values left out), computed by hand from its predictions; ASE Atoms give what their read configs give."""
import numpy as np
import pytest
import torch

from equikernels.training import DataKeys, read_configs
from equikernels.training.evaluate import predict
from emt_data import write_emt_dataset


def test_errors_are_those_of_the_labels(tmp_path):
    from equikernels.calculators.loading import resolve_model

    path = write_emt_dataset(str(tmp_path / "emt.xyz"), 5, seed=7, elements=("Cu", "Ni"), max_atoms=4)
    configs = read_configs(path, DataKeys())
    configs[2].energy = None  # an unlabelled energy does not count
    model = resolve_model(None, torch.device("cpu"))
    preds, metrics = predict(model, configs, dtype=torch.float64, device="cpu", batch_size=2)
    de = np.array([(p.energy - c.energy) / c.num_atoms for p, c in zip(preds, configs) if c.energy is not None])
    df = np.concatenate([(p.forces - c.forces).ravel() for p, c in zip(preds, configs)])
    ds = np.concatenate([(p.stress - c.stress).ravel() for p, c in zip(preds, configs)])
    assert len(de) == 4
    assert metrics["rmse_energy_per_atom"] == pytest.approx(np.sqrt(np.mean(de ** 2)), rel=1e-10)
    assert metrics["mae_forces"] == pytest.approx(np.mean(np.abs(df)), rel=1e-10)
    assert metrics["rmse_stress"] == pytest.approx(np.sqrt(np.mean(ds ** 2)), rel=1e-10)
    assert metrics["rmse_forces"] > 1e-4  # the model is not the labels: the comparison is not trivially 0


def test_atoms_give_what_their_configs_give(tmp_path):
    import ase.io

    from equikernels.calculators.loading import resolve_model

    path = write_emt_dataset(str(tmp_path / "emt.xyz"), 3, seed=3, elements=("Cu", "Ni"), max_atoms=4)
    model = resolve_model(None, torch.device("cpu"))
    kw = dict(dtype=torch.float64, device="cpu")
    want, want_metrics = predict(model, read_configs(path, DataKeys()), **kw)
    got, got_metrics = predict(model, ase.io.read(path, ":"), **kw)
    assert got_metrics == want_metrics and want_metrics["rmse_forces"] > 0
    for a, b in zip(got, want):
        assert a.energy == b.energy and np.array_equal(a.forces, b.forces)
    with pytest.raises(TypeError, match=r"^configs: expected a sequence of structures, got one ase.Atoms"):
        predict(model, ase.io.read(path, 0), **kw)
    with pytest.raises(TypeError, match=r"^configs\[1\]: expected an ase.Atoms or a training.data.Config, got str"):
        predict(model, [ase.io.read(path, 0), "emt.xyz"], **kw)


def test_batch_size_is_checked():
    from equikernels.calculators.loading import resolve_model

    with pytest.raises(ValueError, match="batch_size: expected a positive number"):
        predict(resolve_model(None, torch.device("cpu")), [], dtype=torch.float64, device="cpu", batch_size=0)


def test_metrics_table_keeps_its_columns_for_diverged_errors():
    from equikernels.training.evaluate import METRIC_COLUMNS, metrics_lines

    huge = {k: 3.2e40 for k, _ in METRIC_COLUMNS}
    small = {k: 0.0123 for k, _ in METRIC_COLUMNS}
    lines = metrics_lines([("diverged", huge), ("fine", small), ("nan", {k: float("nan") for k in huge})])
    header, rows = lines[1], lines[2:]
    assert [len(r) for r in rows] == [len(header)] * 3
    assert rows[0].split()[1:] == ["3.2e+43"] * 6 and rows[1].split()[1:] == ["12.300"] * 6
