"""Two-process (gloo) training runs for the tests: a rank's process-group setup and a launcher that
fails a run whose ranks do not finish instead of hanging the suite."""
import datetime
import os
import time

import pytest
import torch


def init_rank(rank: int, world: int, init_file: str) -> None:
    """Environment and gloo process group of ``rank``, as torchrun would give them."""
    import torch.distributed as dist

    from equikernels import settings

    torch.set_num_threads(1)
    os.environ.update(RANK=str(rank), WORLD_SIZE=str(world), LOCAL_RANK=str(rank))
    settings.reload()  # the package read the environment when it was imported
    # a rank waiting in a collective its peer never enters fails after the timeout instead of hanging
    dist.init_process_group("gloo", init_method=f"file://{init_file}", rank=rank, world_size=world,
                            timeout=datetime.timedelta(seconds=60))


def exit_rank() -> None:
    """End a rank whose results are saved and whose process group is closed, skipping the interpreter's
    teardown: a C++ thread (gloo's, autograd's) that takes the GIL while the interpreter finalizes
    aborts the process now and then (SIGABRT, "terminate called without an active exception"), which
    says nothing about the run these tests check."""
    import sys

    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(0)


def run_ranks(worker, cfg_dict: dict, tmp_path, world: int = 2, deadline_s: float = 240) -> list:
    """Spawn ``worker(rank, world, init_file, cfg_dict, out_dir)`` per rank; each saves ``rank<r>.pt``
    into ``tmp_path``; returns what they saved."""
    ctx = torch.multiprocessing.start_processes(worker, nprocs=world, join=False, start_method="spawn",
                                                args=(world, str(tmp_path / "init"), cfg_dict, str(tmp_path)))
    deadline = time.monotonic() + deadline_s
    try:
        while not ctx.join(timeout=5):
            if time.monotonic() > deadline:
                for p in ctx.processes:
                    p.kill()
                pytest.fail("the multi-process run did not finish: a rank is waiting in a collective")
    except torch.multiprocessing.ProcessExitedException as exc:  # a rank died outside Python
        saved = [r for r in range(world) if os.path.isfile(tmp_path / f"rank{r}.pt")]
        when = "after saving its results (at exit)" if exc.error_index in saved else "before saving its results"
        raise AssertionError(f"rank {exc.error_index} died {when}: {exc}") from exc
    return [torch.load(tmp_path / f"rank{r}.pt", weights_only=False) for r in range(world)]
