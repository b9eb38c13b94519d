"""Resume is exact across processes, and options changed on resume are honoured or refused."""
import os
import subprocess
import sys

import pytest
import torch

from equikernels.training import TrainConfig, Trainer
from emt_data import write_emt_dataset

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


@pytest.fixture(scope="module")
def files(tmp_path_factory):
    d = tmp_path_factory.mktemp("resume")
    return (write_emt_dataset(str(d / "train.xyz"), 6, seed=11, elements=("Cu", "Ni"), max_atoms=4),
            write_emt_dataset(str(d / "valid.xyz"), 2, seed=12, elements=("Cu", "Ni"), max_atoms=4))


def _cfg(files, out, **kw):
    from equikernels.default_model import default_model_path

    base = dict(train_file=files[0], valid_file=files[1], model=default_model_path(), epochs=2, batch_size=2,
                lr=1e-2, out_dir=str(out), progress=False, plot=False, checkpoint_every=1, device="cpu",
                ema_decay=0.9, warmup_steps=1)
    base.update(kw)
    return TrainConfig(**base)


def test_cpu_forward_runs_with_the_torchscript_optimiser_off():
    """TorchScript functions inside a model (e3nn's spherical harmonics) take a profiled first call
    and an optimised, symbolically differentiated path afterwards: their gradients differ in the
    last bit between the first call of a process and later ones, so a resumed run would drift."""
    from equikernels.training.trainer import forward

    seen = []

    class Probe(torch.nn.Module):
        def forward(self, data, **kw):
            seen.append(torch._C._get_graph_executor_optimize())
            return {}

    forward(Probe(), {"positions": torch.zeros(1, 3)}, training=True, stress=False)
    assert seen == [False]
    assert torch._C._get_graph_executor_optimize()  # restored afterwards


_RESUME = """
import sys, torch
torch.set_num_threads(1)
from equikernels.training import TrainConfig, Trainer
cfg = TrainConfig.from_dict(torch.load(sys.argv[1], weights_only=False))
t = Trainer(cfg, log=None)
t.fit(resume=True)
torch.save({"history": t.history, "state": t.model.state_dict()}, sys.argv[2])
"""


def _in_fresh_process(cfg, tmp_path, name):
    cfg_path, result = tmp_path / f"{name}.cfg.pt", tmp_path / f"{name}.pt"
    torch.save(cfg.to_dict(), cfg_path)
    env = dict(os.environ, PYTHONPATH=ROOT + os.pathsep + os.environ.get("PYTHONPATH", ""))
    subprocess.run([sys.executable, "-c", _RESUME, str(cfg_path), str(result)], check=True, env=env,
                   cwd=str(tmp_path), timeout=300)
    return torch.load(result, weights_only=False)


def test_resume_in_a_fresh_process_is_bitwise_identical(files, tmp_path, single_thread):
    """An uninterrupted run and one stopped mid-epoch and resumed, each in a fresh process (the
    first step of the resumed process is that process's first training call)."""
    full = _in_fresh_process(_cfg(files, tmp_path / "full"), tmp_path, "full")  # nothing to resume: from step 0
    part = Trainer(_cfg(files, tmp_path / "part", max_steps=4), log=None)  # stops mid-epoch 2
    part.fit()
    assert part.steps_per_epoch == 3 and part.batch_in_epoch == 1
    resumed = _in_fresh_process(_cfg(files, tmp_path / "part"), tmp_path, "resumed")
    assert [r["loss"] for r in resumed["history"]["train"]] == [r["loss"] for r in full["history"]["train"]]
    assert resumed["history"]["valid"] == full["history"]["valid"]
    assert all(torch.equal(full["state"][k], v) for k, v in resumed["state"].items())


def test_resume_refuses_changed_batch_size_or_seed_and_honours_lr(files, tmp_path, single_thread):
    out = tmp_path / "run"
    Trainer(_cfg(files, out, max_steps=2), log=None).fit()
    for change in (dict(batch_size=3), dict(seed=7)):
        (key, value), = change.items()
        with pytest.raises(ValueError, match=f"cannot resume with changed {key}"):
            Trainer(_cfg(files, out, max_steps=3, **change), log=None).resume()
    said = []
    t = Trainer(_cfg(files, out, max_steps=3, lr=2e-3), log=said.append)
    assert t.resume()
    assert any("lr 0.01 -> 0.002" in line for line in said)
    factor = t._schedule_factor(t.scheduler.last_epoch)
    assert t.optimizer.param_groups[0]["lr"] == pytest.approx(2e-3 * factor)
    t.fit()
    assert t.history["train"][-1]["lr"] == pytest.approx(2e-3 * t._schedule_factor(3))
