"""Fine-tuning as the README documents it: its commands and options work as written."""
import pytest
from ase.build import bulk
from ase.calculators.emt import EMT
from ase.io import write

from equikernels.default_model import default_model_path
from equikernels.training import TrainConfig


@pytest.fixture
def emt_file(tmp_path):
    frames = []
    for seed in range(4):
        a = bulk("Cu", "fcc", a=3.6, cubic=True)
        a.rattle(0.05, seed=seed)
        a.calc = EMT()
        a.get_stress()
        frames.append(a)
    path = tmp_path / "train.xyz"
    write(path, frames)
    return str(path)


def test_frame_selection_of_the_structure_files_is_accepted(emt_file, tmp_path):
    # the README: FILE@INDEX picks frames for --train / --valid / --test as for eval
    cfg = TrainConfig(model=default_model_path(), train_file=emt_file + "@:3", valid_file=emt_file + "@-1",
                      test_file=emt_file + "@0", out_dir=str(tmp_path / "out"))
    cfg.validate()
    with pytest.raises(FileNotFoundError, match="train_file: no such file"):
        TrainConfig(model=default_model_path(), train_file=str(tmp_path / "nope.xyz@:3"),
                    out_dir=str(tmp_path / "out")).validate()
    with pytest.raises(ValueError, match="valid_file: .*not a frame selection"):
        TrainConfig(model=default_model_path(), train_file=emt_file, valid_file=emt_file + "@foo",
                    out_dir=str(tmp_path / "out")).validate()


@pytest.mark.parametrize("suffix, count", [("", 4), ("@1:3", 2), ("@-1", 1)])
def test_a_file_with_an_at_sign_in_its_name_is_read(emt_file, tmp_path, suffix, count):
    """A file named with '@' reads whole, and with a selection after its name ASE's selection applies."""
    from equikernels.training.data import read_frames
    named = tmp_path / "cu@300K.xyz"
    named.write_bytes(open(emt_file, "rb").read())
    frames = read_frames(str(named) + suffix)
    assert len(frames) == count and all(len(a) == 4 for a in frames)
