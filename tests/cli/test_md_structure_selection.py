"""``equikernels md STRUCTURE``: ASE's FILE@INDEX frame selections, as eval and fine-tune take them."""
import ase.build
import ase.io
import pytest

from equikernels.cli.md import load_structure


@pytest.fixture()
def three_frames(tmp_path):
    path = tmp_path / "frames.xyz"
    frames = [ase.build.bulk("Cu", "fcc", a=3.6).repeat((n, 1, 1)) for n in (1, 2, 3)]
    ase.io.write(path, frames)
    return str(path)


@pytest.mark.parametrize("suffix,atoms", [("", 3), ("@0", 1), ("@1", 2), ("@-1", 3), ("@1:2", 2)])
def test_md_structure_takes_frame_selection(three_frames, suffix, atoms):
    got, described = load_structure(three_frames + suffix)
    assert len(got) == atoms and described == three_frames + suffix


@pytest.mark.parametrize("suffix,message", [("@5", "selects no frame"), ("@0:2", "selects 2 frames"),
                                            ("@x", "not a frame selection")])
def test_md_structure_bad_selection_is_named(three_frames, suffix, message):
    with pytest.raises(ValueError, match=message):
        load_structure(three_frames + suffix)


def test_md_structure_missing_file_named_without_selection(tmp_path):
    with pytest.raises(FileNotFoundError, match=r"missing\.xyz' is neither"):
        load_structure(str(tmp_path / "missing.xyz") + "@0")
