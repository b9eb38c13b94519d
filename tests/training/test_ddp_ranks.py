"""Every rank of a multi-process run takes part in the same collectives, on its own device, and
finishes with the same summary; rank-0-only work shares its result and its errors."""
import os

import torch

from ddp_runs import exit_rank, init_rank, run_ranks
from emt_data import write_emt_dataset

TINY = dict(hidden_irreps="4x0e+4x1o", MLP_irreps="4x0e", max_ell=1, correlation=2, num_bessel=4,
            radial_MLP=[8], r_max=3.6)
_COLLECTIVES = ("all_reduce", "barrier", "broadcast", "broadcast_object_list", "all_gather",
                "all_gather_object", "reduce", "gather", "scatter")


def _trace_collectives(log):
    import torch.distributed as dist

    for name in _COLLECTIVES:
        real = getattr(dist, name)

        def traced(*args, _real=real, _name=name, **kwargs):
            shape = tuple(args[0].shape) if args and torch.is_tensor(args[0]) else None
            log.append((_name, shape))
            return _real(*args, **kwargs)

        setattr(dist, name, traced)


def _worker(rank, world, init_file, cfg_dict, out_dir):
    import torch.distributed as dist

    from equikernels.training import TrainConfig, Trainer
    from equikernels.training import distributed as dist_utils

    init_rank(rank, world, init_file)
    log = []
    _trace_collectives(log)
    try:
        summary = Trainer(TrainConfig.from_dict(cfg_dict), log=None).fit()
        last_in_fit = log[-1]
        try:
            dist_utils.on_main(lambda: 1 / 0)
            shared_error = None
        except Exception as exc:  # noqa: BLE001
            shared_error = f"{type(exc).__name__}: {exc}"
        torch.save({"summary": summary, "collectives": log, "error": shared_error, "last_in_fit": last_in_fit},
                   os.path.join(out_dir, f"rank{rank}.pt"))
        dist_utils.barrier()  # no rank closes its connections while a peer still reads on_main's broadcast
    finally:
        dist.destroy_process_group()
    exit_rank()


def test_two_gloo_ranks_finish_with_the_same_collectives_and_summary(tmp_path, single_thread):
    train = write_emt_dataset(str(tmp_path / "train.xyz"), 10, seed=21, elements=("Cu", "Ni"), max_atoms=4)
    cfg = dict(train_file=train, valid_fraction=0.3, new_model=TINY, epochs=2, batch_size=2, lr=0.02,
               out_dir=str(tmp_path / "out"), progress=False, plot=False, checkpoint_every=2, device="cpu",
               seed=5, ema_decay=0.9)
    ranks = run_ranks(_worker, cfg, tmp_path)
    assert ranks[0]["collectives"] == ranks[1]["collectives"]
    assert ranks[0]["last_in_fit"] == ("barrier", None)  # every rank returns from fit together
    assert ranks[0]["summary"] == ranks[1]["summary"]  # paths written by rank 0 included
    assert os.path.isfile(ranks[1]["summary"]["model_path"])
    assert "valid_start" in ranks[0]["summary"]
    assert ranks[0]["error"].startswith("ZeroDivisionError")
    assert ranks[1]["error"].startswith("RuntimeError: rank 0 failed: ZeroDivisionError")


def test_nccl_process_group_is_bound_to_the_process_device(monkeypatch):
    """Under torchrun on GPUs each process makes cuda:LOCAL_RANK current and binds it to the group,
    and barriers and object broadcasts name it: a barrier on the current device (cuda:0 in every
    process that never set one) makes rank 1 wait in a collective rank 0 never joins."""
    import torch.distributed as dist

    from equikernels.training import distributed as dist_utils

    calls = {}
    monkeypatch.setenv("WORLD_SIZE", "2")
    monkeypatch.setenv("LOCAL_RANK", "1")
    monkeypatch.setattr(dist_utils, "_DEVICE", None)
    monkeypatch.setattr(torch.cuda, "set_device", lambda d: calls.setdefault("set_device", torch.device(d)))
    monkeypatch.setattr(dist, "is_initialized", lambda: "init" in calls)
    monkeypatch.setattr(dist, "init_process_group", lambda **kw: calls.setdefault("init", kw))
    monkeypatch.setattr(dist, "get_rank", lambda *a: 1)
    monkeypatch.setattr(dist, "get_world_size", lambda *a: 2)
    monkeypatch.setattr(dist, "get_backend", lambda *a: "nccl")
    monkeypatch.setattr(dist, "barrier", lambda **kw: calls.setdefault("barrier", kw))
    monkeypatch.setattr(dist, "broadcast_object_list", lambda box, src, **kw: calls.setdefault("bcast", kw))

    info = dist_utils.setup(torch.device("cuda"))
    assert info.device == torch.device("cuda", 1) and info.rank == 1
    assert calls["set_device"] == torch.device("cuda", 1)
    assert calls["init"]["backend"] == "nccl" and calls["init"]["device_id"] == torch.device("cuda", 1)
    dist_utils.barrier()
    assert calls["barrier"]["device_ids"] == [1]
    dist_utils.broadcast_object({"x": 1})
    assert calls["bcast"]["device"] == torch.device("cuda", 1)
