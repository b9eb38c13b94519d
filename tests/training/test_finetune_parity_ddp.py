"""DDP keeps the gradients in its communication buckets: for a one-element model, whose
symmetric-contraction weights have a size-1 leading dimension, autograd's own gradients differ from
the parameters in that dimension's stride, and DDP warned "Grad strides do not match bucket view
strides". A one-process gloo group stands in for torchrun here (the same DDP code path, in seconds)."""
import datetime
import warnings

import pytest
import torch

from emt_data import write_emt_dataset
from equikernels.training import TrainConfig, Trainer
from equikernels.training import distributed as dist_utils


@pytest.fixture
def one_process_group(tmp_path, monkeypatch):
    """A gloo group of one process, and the trainer told to take the DDP path on it."""
    import torch.distributed as dist

    dist.init_process_group("gloo", init_method=f"file://{tmp_path / 'init'}", rank=0, world_size=1,
                            timeout=datetime.timedelta(seconds=60))
    monkeypatch.setattr(dist_utils.DistInfo, "enabled", property(lambda self: True))
    monkeypatch.setattr(dist_utils, "setup", lambda device: dist_utils.DistInfo(device=device))
    try:
        yield
    finally:
        dist.destroy_process_group()


def test_gradients_stay_bucket_views_with_their_parameters_strides(cu_model, tmp_path, one_process_group,
                                                                   single_thread):
    train = write_emt_dataset(str(tmp_path / "train.xyz"), 3, seed=5, elements=("Cu",), max_atoms=2)
    cfg = TrainConfig(model=cu_model, train_file=train, valid_fraction=0.0, epochs=1, max_steps=3, batch_size=1,
                      lr=1e-2, out_dir=str(tmp_path / "out"), progress=False, plot=False, device="cpu")
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        t = Trainer(cfg, log=None)
        assert isinstance(t.ddp, torch.nn.parallel.DistributedDataParallel)
        t.fit()
    assert t.step == 3
    assert not [w for w in caught if "Grad strides do not match" in str(w.message)]
    one_element = [p for p in t.params if p.dim() == 3 and p.shape[0] == 1]
    assert one_element  # the symmetric-contraction weights of the one element
    for p in t.params:
        assert p.grad.stride() == p.stride(), p.shape
        assert p.grad._base is not None  # a view of a DDP bucket, not a tensor of its own
