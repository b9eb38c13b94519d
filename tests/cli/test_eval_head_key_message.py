"""`equikernels eval` on frames whose head key names a head the model lacks: one line naming the
frame, the head, the model's heads and ``--head``, which evaluates them all with one head instead."""
import os

import pytest

from equikernels.cli import main
from cli_checks import one_line_error
from cu_ni_frames import two_head_model, write_cu_ni_frames


@pytest.fixture(scope="module")
def model(tmp_path_factory):
    return two_head_model(str(tmp_path_factory.mktemp("two_heads") / "two.pt"))


def test_unknown_frame_head_suggests_the_head_flag(model, tmp_path, capsys):
    src = write_cu_ni_frames(str(tmp_path / "tagged.xyz"), 2, 0, head="bogus")
    out = str(tmp_path / "pred.xyz")
    assert main(["eval", src, "--model", model, "--out", out, "--no-progress", "--device", "cpu"]) == 2
    one_line_error(capsys, "tagged.xyz, frame 0", "'bogus'", "['pt_head', 'Default']", "--head NAME")
    assert not os.path.exists(out)
    # the suggestion works: --head overrides the frames' keys
    assert main(["eval", src, "--model", model, "--out", out, "--no-progress", "--device", "cpu",
                 "--head", "pt_head"]) == 0
    assert os.path.exists(out)


def test_head_key_flag_is_named(model, tmp_path, capsys):
    import ase.io

    src = write_cu_ni_frames(str(tmp_path / "tagged.xyz"), 1, 0, head="bogus")
    frames = ase.io.read(src, ":")
    for f in frames:  # the head under another key, read with --head-key
        f.info["level"] = f.info.pop("head")
    ase.io.write(src, frames, format="extxyz")
    assert main(["eval", src, "--model", model, "--out", str(tmp_path / "p.xyz"), "--no-progress",
                 "--device", "cpu", "--head-key", "level"]) == 2
    one_line_error(capsys, "'level' key", "'bogus'", "--head NAME")
