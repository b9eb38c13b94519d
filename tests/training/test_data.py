"""Training pieces that need no mace-torch: data checks, E0s, losses, batching order, checkpoints."""
import os

import numpy as np
import pytest
import torch

from equikernels.training import DataError, DataKeys, TrainConfig, read_configs
from equikernels.training import checkpoint as ckpt
from equikernels.training.data import (build_dataset, check_elements, check_labels, collate,
                                       split_train_valid)
from emt_data import emt_structures
from equikernels.training.loss import error_sums, local_counts, loss_terms, metrics_from_sums
from equikernels.training.statistics import average_e0s, parse_given_e0s
from equikernels.training.trainer import epoch_batches


@pytest.fixture(scope="module")
def frames():
    return emt_structures(6, seed=3, elements=("Cu", "Ni"))


def _write(tmp_path, frames, name="data.xyz"):
    import ase.io

    path = str(tmp_path / name)
    ase.io.write(path, frames, format="extxyz")
    return path


def test_read_roundtrip(tmp_path, frames):
    configs = read_configs(_write(tmp_path, frames), DataKeys())
    assert len(configs) == len(frames)
    for c, a in zip(configs, frames):
        assert c.energy == pytest.approx(a.info["REF_energy"])
        np.testing.assert_allclose(c.forces, a.arrays["REF_forces"], atol=1e-7)  # extxyz keeps 8 decimals
        s = a.info["REF_stress"]  # Voigt -> 3x3, symmetric
        assert c.stress[0, 0] == pytest.approx(s[0]) and c.stress[1, 2] == pytest.approx(s[3])
        np.testing.assert_allclose(c.stress, c.stress.T)


def test_ase_frame_selection_reads_the_frames_it_picks(tmp_path, frames):
    path = _write(tmp_path, frames)
    assert [c.energy for c in read_configs(path + "@1:4", DataKeys())] == pytest.approx(
        [a.info["REF_energy"] for a in frames[1:4]])
    assert len(read_configs(path + "@-1", DataKeys())) == 1
    with pytest.raises(ValueError, match="selects no frame"):
        read_configs(path + "@9", DataKeys())


def test_virials_become_stress(tmp_path, frames):
    a = frames[0].copy()
    configs = read_configs(_write(tmp_path, [frames[0]]), DataKeys())
    del a.info["REF_stress"]
    a.info["REF_virials"] = (-configs[0].stress * a.get_volume()).reshape(-1)
    c = read_configs(_write(tmp_path, [a], "v.xyz"), DataKeys())[0]
    np.testing.assert_allclose(c.stress, configs[0].stress, atol=1e-12)


@pytest.mark.parametrize("breakage, message", [
    ("nan_forces", "NaN"),
    ("short_forces", "expected (4, 3)"),
    ("bad_stress", "expected 6 (Voigt) or 9"),
])
def test_bad_frames_name_file_and_frame(tmp_path, frames, breakage, message):
    frames = [a.copy() for a in frames]
    bad = frames[2] if len(frames[2]) == 4 else next(a for a in frames if len(a) == 4)
    index = next(i for i, a in enumerate(frames) if a is bad)
    if breakage == "nan_forces":
        bad.arrays["REF_forces"][1, 2] = np.nan
    elif breakage == "short_forces":
        del bad.arrays["REF_forces"]
        bad.info["REF_forces"] = np.zeros(9)
    elif breakage == "bad_stress":
        bad.info["REF_stress"] = np.zeros(4)
    path = _write(tmp_path, frames)
    with pytest.raises(DataError) as err:
        configs = read_configs(path, DataKeys())
        check_labels(configs, path, need_energy=True, need_forces=True, need_stress=True)
    assert f"{path}, frame {index}" in str(err.value) and message in str(err.value)


def test_missing_key_everywhere_is_named(tmp_path, frames):
    path = _write(tmp_path, frames)
    configs = read_configs(path, DataKeys(forces="DFT_forces"))
    with pytest.raises(DataError, match=r"frame 0: no forces label"):
        check_labels(configs, path, need_energy=True, need_forces=True, need_stress=False)
    configs = read_configs(path, DataKeys(stress="nothing", virials="nothing"))
    with pytest.raises(DataError, match="no frame has a stress"):
        check_labels(configs, path, need_energy=True, need_forces=True, need_stress=True)


def test_unknown_element_named(tmp_path, frames):
    path = _write(tmp_path, frames)
    configs = read_configs(path, DataKeys())
    index = next(i for i, c in enumerate(configs) if 28 in c.atomic_numbers)
    with pytest.raises(DataError, match=rf"frame {index}: element\(s\) Ni \(Z=28\) unknown to the model"):
        check_elements(configs, [29])


def test_unreadable_and_missing_file(tmp_path):
    with pytest.raises(FileNotFoundError, match="does not exist"):
        read_configs(str(tmp_path / "absent.xyz"), DataKeys())
    junk = tmp_path / "junk.xyz"
    junk.write_text("not a number\nhello\n")
    with pytest.raises(DataError, match="junk.xyz"):
        read_configs(str(junk), DataKeys())


def test_config_rejects_bad_options():
    with pytest.raises(ValueError, match="unknown training option"):
        TrainConfig.from_dict({"epoch": 3})
    with pytest.raises(ValueError, match="lr_schedule"):
        TrainConfig(train_file="x", model="m", lr_schedule="linear").validate()
    with pytest.raises(ValueError, match="train_file is required"):
        TrainConfig(model="m").validate()


def test_graphs_match_ase_neighbour_list(frames):
    """Edge vectors from our graph equal ASE's neighbour list (mace-torch convention)."""
    from ase.neighborlist import neighbor_list

    configs = [c for c in read_configs_from(frames)]
    ds = build_dataset(configs, [28, 29], 4.0, ["Default"])
    for g, a in zip(ds.graphs, frames):
        snd, rcv = g.edge_index
        vec = g.positions[rcv] - g.positions[snd] + g.shifts
        i, j, D = neighbor_list("ijD", a, 4.0)
        ours = sorted(map(tuple, np.round(np.c_[snd, rcv, vec.numpy()], 8).tolist()))
        ref = sorted(map(tuple, np.round(np.c_[i, j, D], 8).tolist()))
        assert ours == ref


def read_configs_from(frames):
    from equikernels.training.data import config_from_atoms

    return [config_from_atoms(a, DataKeys(), f"mem, frame {k}") for k, a in enumerate(frames)]


def test_average_e0s_least_squares():
    from equikernels.training.data import Config

    rng = np.random.default_rng(0)
    true = {29: -3.7, 28: -5.1}
    configs = []
    for _ in range(8):
        zs = rng.choice([28, 29], size=rng.integers(2, 9))
        configs.append(Config(atomic_numbers=zs, positions=np.zeros((len(zs), 3)), cell=np.eye(3),
                              pbc=np.ones(3, bool), energy=float(sum(true[z] for z in zs))))
    e0s = average_e0s(configs, [28, 29, 79])
    assert set(e0s) == {28, 29}
    assert e0s[28] == pytest.approx(-5.1) and e0s[29] == pytest.approx(-3.7)
    unlabelled = [Config(atomic_numbers=c.atomic_numbers, positions=c.positions, cell=c.cell, pbc=c.pbc)
                  for c in configs]
    with pytest.raises(ValueError, match="needs structures with energy labels"):
        average_e0s(unlabelled, [28, 29])
    assert parse_given_e0s({"Cu": -1.0, 28: -2.0}, [28, 29]) == {29: -1.0, 28: -2.0}
    with pytest.raises(ValueError, match="not one of the model's elements"):
        parse_given_e0s({"Au": 1.0}, [28, 29])


def _fake_outputs(batch, generator):
    n, b = batch["positions"].shape[0], batch["energy"].shape[0]
    return {"energy": batch["energy"] + torch.randn(b, generator=generator, dtype=torch.float64),
            "forces": batch["forces"] + torch.randn(n, 3, generator=generator, dtype=torch.float64),
            "stress": batch["stress"] + torch.randn(b, 3, 3, generator=generator, dtype=torch.float64)}


@pytest.mark.parametrize("kind", ["mse", "huber"])
def test_split_batches_sum_to_the_whole(frames, generator, kind):
    """Loss terms divided by global counts: two halves add up to the whole batch (what makes DDP's
    averaged gradients equal one process's)."""
    ds = build_dataset(read_configs_from(frames), [28, 29], 4.0, ["Default"])
    cfg = TrainConfig(loss=kind, huber_delta=0.5)
    full = collate(ds.graphs, torch.float64, "cpu")
    out = _fake_outputs(full, generator)
    whole, _ = loss_terms(out, full, cfg, local_counts(full))
    halves = [collate(ds.graphs[:2], torch.float64, "cpu"), collate(ds.graphs[2:], torch.float64, "cpu")]
    counts = local_counts(halves[0]) + local_counts(halves[1])
    n0, g0 = halves[0]["positions"].shape[0], 2
    parts = [{"energy": out["energy"][:g0], "forces": out["forces"][:n0], "stress": out["stress"][:g0]},
             {"energy": out["energy"][g0:], "forces": out["forces"][n0:], "stress": out["stress"][g0:]}]
    split = sum(loss_terms(p, h, cfg, counts)[0] for p, h in zip(parts, halves))
    torch.testing.assert_close(split, whole, rtol=1e-12, atol=0)
    # and the MSE loss by hand
    if kind == "mse":
        nat = (full["ptr"][1:] - full["ptr"][:-1]).double()
        e = (((out["energy"] - full["energy"]) / nat) ** 2).mean()
        f = ((out["forces"] - full["forces"]) ** 2).mean()
        s = ((out["stress"] - full["stress"]) ** 2).mean()
        torch.testing.assert_close(whole, e + 10 * f + s)
        m = metrics_from_sums(error_sums(out, full))
        assert m["rmse_forces"] == pytest.approx(float(f.sqrt()))


def test_epoch_batches_partition():
    for world in (1, 2, 3):
        seen = []
        for rank in range(world):
            for b in epoch_batches(23, 4, epoch=5, seed=1, rank=rank, world=world):
                seen.extend(b)
        assert len(seen) == len(set(seen)) and len(seen) >= 23 - world + 1
    assert epoch_batches(10, 3, 0, 0) == epoch_batches(10, 3, 0, 0)
    assert epoch_batches(10, 3, 0, 0) != epoch_batches(10, 3, 1, 0)
    # global batch j of one process = the union of the ranks' batch j
    one = epoch_batches(16, 4, 2, 7)
    two = [epoch_batches(16, 2, 2, 7, rank=r, world=2) for r in range(2)]
    assert [two[0][j] + two[1][j] for j in range(4)] == one


def test_split_train_valid():
    items = list(range(20))
    tr, va = split_train_valid(items, 0.25, seed=0)
    assert len(va) == 5 and sorted(tr + va) == items
    assert split_train_valid(items, 0.25, seed=0) == (tr, va)


def test_checkpoints_atomic_and_pruned(tmp_path):
    d = str(tmp_path / "ck")
    for step in (1, 2, 3):
        ckpt.save(d, step, {"step": step, "rng": ckpt.rng_states()}, keep=2)
    names = sorted(os.listdir(d))
    assert names == ["checkpoint-000000002.pt", "checkpoint-000000003.pt"]  # no temp files left
    assert ckpt.load(ckpt.latest(d))["step"] == 3
    state = ckpt.rng_states()
    a = torch.rand(3)
    ckpt.set_rng_states(state)
    assert torch.equal(torch.rand(3), a)
