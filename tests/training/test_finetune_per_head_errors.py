"""A run whose frames are of several heads reports its errors per head as well (closing table and
metrics.json's ``summary["per_head"]``), each over that head's frames; a one-head run reports as before."""
import json
import os
from types import SimpleNamespace

import numpy as np
import torch

from ddp_runs import exit_rank, init_rank, run_ranks
from cu_ni_frames import two_head_model as _two_head_model
from cu_ni_frames import write_cu_ni_frames as _frames
from test_finetune_heads_block import NEW, _config

KEYS = ("train", "valid", "test", "valid_start", "test_start", "valid_last", "test_last")


def _errors(model, configs):
    from equikernels.training.evaluate import predict

    return predict(model, configs, dtype=torch.float64, device="cpu")[1]


def _close(got, want):
    assert set(got) - {"loss"} == set(want)
    for k, v in want.items():
        np.testing.assert_allclose(got[k], v, rtol=1e-9, atol=0, err_msg=k)


def _two_head_run(tmp_path, **values):
    """A two-head model and a config with train/valid/test files per head."""
    model = _two_head_model(str(tmp_path / "two.pt"))
    files = {head: {f"{part}_file": _frames(str(tmp_path / f"{head}_{part}.xyz"), n, seed + 100 * i, shift=0.1 * i)
                    for part, n, seed in (("train", 2, 0), ("valid", 3, 20), ("test", 2, 40))}
             for i, head in enumerate(("pt_head", "Default"))}
    return model, _config(tmp_path, {"model": model, "heads": files, **values})


def _check_per_head(summary, out_dir, start_model, trainer):
    """Each head's entries are predict's errors over that head's frames, with the model they name."""
    from equikernels.models import load

    models = {"": load(os.path.join(out_dir, "model.pt")), "_start": load(start_model)}
    if os.path.isfile(os.path.join(out_dir, "model_last.pt")):
        models["_last"] = load(os.path.join(out_dir, "model_last.pt"))
    with open(os.path.join(out_dir, "metrics.json")) as fh:
        written = json.load(fh)["summary"]
    assert written["per_head"] == json.loads(json.dumps(summary["per_head"]))
    assert list(summary["per_head"]) == ["pt_head", "Default"]
    sets = {"train": trainer.train_configs, "valid": trainer.valid_configs, "test": trainer.test_configs}
    for head, entries in summary["per_head"].items():
        assert set(entries) == {k for k in KEYS if k in summary}  # every combined entry, per head
        for key, got in entries.items():
            configs = [c for c in sets[key.split("_")[0]] if c.head == head]
            assert configs
            _close(got, _errors(models[key[len(key.split("_")[0]):]], configs))
    _close(summary["valid"], _errors(models[""], trainer.valid_configs))  # the combined numbers cover every head


def test_each_heads_errors_are_those_of_its_own_frames(tmp_path):
    from equikernels.training import Trainer

    model, cfg = _two_head_run(tmp_path, epochs=3, lr=1.0)
    log = []
    t = Trainer(cfg, log=log.append)
    summary = t.fit()
    assert summary["saved"] == "best"  # this lr overshoots in the last epoch: the last weights are reported too
    _check_per_head(summary, cfg.out_dir, model, t)
    table = log[-1].splitlines()
    for head in ("pt_head", "Default"):
        for row in ("valid, starting model", "test, last weights", "train, saved model"):
            assert any(line.startswith(f"head {head}: {row}") for line in table), (head, row, table)


def test_a_one_head_run_writes_no_per_head_entries(tmp_path):
    from equikernels.training import Trainer

    files = {f"{part}_file": _frames(str(tmp_path / f"{part}.xyz"), 2, seed) for part, seed in
             (("train", 0), ("valid", 20), ("test", 40))}
    log = []
    Trainer(_config(tmp_path, {"new_model": NEW, **files}), log=log.append).fit()
    with open(os.path.join(tmp_path, "out", "metrics.json")) as fh:
        written = json.load(fh)
    assert "per_head" not in written["summary"] and "per_head_start" not in written["history"]
    assert {"valid", "test", "valid_start", "test_start"} <= set(written["summary"])
    assert not any(line.startswith("head ") for line in log[-1].splitlines())


def _worker(rank, world, init_file, cfg, out_dir):
    import torch.distributed as dist

    from equikernels.training import Trainer

    init_rank(rank, world, init_file)
    try:
        t = Trainer(cfg, log=None)
        torch.save({"summary": t.fit(), "configs": {k: getattr(t, f"{k}_configs") for k in ("train", "valid", "test")}},
                   os.path.join(out_dir, f"rank{rank}.pt"))
    finally:
        dist.destroy_process_group()
    exit_rank()


def test_two_gloo_ranks_report_each_heads_errors_over_all_its_frames(tmp_path, single_thread):
    """Each rank evaluates every other frame (the heads' frames spread unevenly over the ranks)."""
    model, cfg = _two_head_run(tmp_path, epochs=1)
    ranks = run_ranks(_worker, cfg, tmp_path)
    assert ranks[0]["summary"] == ranks[1]["summary"]
    trainer = SimpleNamespace(**{f"{k}_configs": v for k, v in ranks[0]["configs"].items()})
    _check_per_head(ranks[0]["summary"], cfg.out_dir, model, trainer)
