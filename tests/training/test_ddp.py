"""DDP on CPU: two gloo processes give the gradients, the training run and the validation metrics
of one process on the same global batches."""
import os

import pytest
import torch

from ddp_runs import exit_rank, init_rank, run_ranks
from emt_data import write_emt_dataset

TINY = dict(hidden_irreps="4x0e+4x1o", MLP_irreps="4x0e", max_ell=1, correlation=2, num_bessel=4,
            radial_MLP=[8], r_max=3.6)


def _config(train, out, batch_size):
    return dict(train_file=train, valid_fraction=0.2, new_model=TINY, epochs=2, max_steps=3,
                batch_size=batch_size, lr=0.02, out_dir=out, progress=False, plot=False,
                checkpoint_every=2, device="cpu", seed=5)


def _run(cfg_dict, result_path):
    """One process's part: gradients of the first batch, then a short training run."""
    from equikernels.training import TrainConfig, Trainer
    from equikernels.training.data import collate
    from equikernels.training.trainer import backward_step, epoch_batches

    cfg = TrainConfig.from_dict(cfg_dict)
    trainer = Trainer(cfg, log=None)
    rank, world = trainer.dist.rank, trainer.dist.world_size
    idx = epoch_batches(len(trainer.train_set), cfg.batch_size, 0, cfg.seed, rank, world)[0]
    batch = collate([trainer.train_set.graphs[i] for i in idx], trainer.dtype, trainer.device)
    initial = {k: v.clone() for k, v in trainer.model.state_dict().items()}
    loss, _, _ = backward_step(trainer.ddp, batch, cfg)
    grads = {n: p.grad.clone() for n, p in trainer.model.named_parameters() if p.grad is not None}
    trainer.optimizer.zero_grad(set_to_none=True)
    summary = trainer.fit()
    torch.save({"loss": loss, "grads": grads, "idx": idx, "initial": initial, "summary": summary,
                "final": trainer.model.state_dict(), "history": trainer.history}, result_path)


def _worker(rank, world, init_file, cfg_dict, out_dir):
    import torch.distributed as dist

    init_rank(rank, world, init_file)
    try:
        _run(cfg_dict, os.path.join(out_dir, f"rank{rank}.pt"))
    finally:
        dist.destroy_process_group()  # at once: fit returns on every rank together
    exit_rank()


def test_ddp_two_gloo_processes_match_one(tmp_path, single_thread):
    train = write_emt_dataset(str(tmp_path / "train.xyz"), 10, seed=21, elements=("Cu", "Ni"), max_atoms=4)
    single = str(tmp_path / "single.pt")
    _run(_config(train, str(tmp_path / "one"), batch_size=4), single)

    ranks = run_ranks(_worker, _config(train, str(tmp_path / "two"), 2), tmp_path)
    one = torch.load(single, weights_only=False)

    assert sorted(ranks[0]["idx"] + ranks[1]["idx"]) == sorted(one["idx"])  # the same global batch
    for k, v in one["initial"].items():
        assert torch.equal(ranks[0]["initial"][k], v)
    for r in ranks:
        assert r["loss"] == pytest.approx(one["loss"], rel=1e-12)
        assert r["grads"].keys() == one["grads"].keys()
        for name, g in one["grads"].items():
            torch.testing.assert_close(r["grads"][name], g, rtol=1e-10, atol=1e-13, msg=name)
    # whole run: same steps, same weights, same (sharded then reduced) validation metrics
    for r in ranks:
        assert len(r["history"]["train"]) == len(one["history"]["train"]) == 3
        for k, v in one["final"].items():
            torch.testing.assert_close(r["final"][k], v, rtol=1e-8, atol=1e-11, msg=k)
        for key, value in one["summary"]["valid"].items():
            assert r["summary"]["valid"][key] == pytest.approx(value, rel=1e-8)
    assert os.path.isfile(tmp_path / "two" / "model.pt") and os.listdir(tmp_path / "two" / "checkpoints")
