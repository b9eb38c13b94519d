"""Options outside their range are refused by name before training starts, not met as a torch
error mid-run or silently trained with (a negative clipping norm or learning-rate floor climbs the loss)."""
import pytest

from equikernels.training import TrainConfig


@pytest.mark.parametrize("option, value, message", [
    ("clip_grad_norm", -1.0, "clip_grad_norm must be >= 0"),
    ("warmup_steps", -3, "warmup_steps must be >= 0"),
    ("eval_every_epochs", 0, "eval_every_epochs must be >= 1"),
    ("min_lr_ratio", -1.0, r"min_lr_ratio must be in \[0, 1\]"),
    ("plateau_factor", 2.0, r"plateau_factor must be in \(0, 1\)"),
    ("plateau_patience", -1, "plateau_patience must be >= 0"),
    ("seed", -1, "seed must be >= 0"),
])
def test_out_of_range_options_are_refused(tmp_path, option, value, message):
    (tmp_path / "t.xyz").write_text("")
    cfg = TrainConfig(train_file=str(tmp_path / "t.xyz"), model="m.model", **{option: value})
    with pytest.raises(ValueError, match=message):
        cfg.validate()


def test_huber_delta_zero_is_refused_only_for_the_huber_loss(tmp_path):
    (tmp_path / "t.xyz").write_text("")
    (tmp_path / "m.model").write_bytes(b"")
    base = dict(train_file=str(tmp_path / "t.xyz"), model=str(tmp_path / "m.model"), huber_delta=0.0)
    TrainConfig(loss="mse", **base).validate()
    with pytest.raises(ValueError, match="huber_delta must be > 0 for loss 'huber'"):
        TrainConfig(loss="huber", **base).validate()


def test_clipping_off_is_still_accepted(tmp_path):
    (tmp_path / "t.xyz").write_text("")
    (tmp_path / "m.model").write_bytes(b"")
    for norm in (None, 0.0):
        TrainConfig(train_file=str(tmp_path / "t.xyz"), model=str(tmp_path / "m.model"), clip_grad_norm=norm).validate()
