"""``load_mliap`` checks a file's format before building anything from it: foreign, damaged or
code-carrying files are refused with a one-line ValueError naming the file."""
import os
import pickle

import pytest
import torch

from equikernels.lammps import EquikernelsMLIAP, load_mliap


class _RunsCode:
    """Unpickling this calls a function named in the file."""

    def __reduce__(self):
        return (os.getpid, ())


def _refused(path, match):
    with pytest.raises(ValueError, match=match) as info:
        load_mliap(path)
    msg = str(info.value)
    assert "\n" not in msg and str(path) in msg and "expected an ML-IAP model file" in msg


@pytest.mark.parametrize("suffix", [".pkl", ".pt"])
def test_empty_text_and_truncated_files(mliap_files, tmp_path, suffix):
    empty, text, cut = tmp_path / f"e{suffix}", tmp_path / f"t{suffix}", tmp_path / f"c{suffix}"
    empty.write_bytes(b"")
    text.write_text("pair_style mliap unified model.pt 0\n")
    data = (mliap_files / f"m{suffix}").read_bytes()
    cut.write_bytes(data[: len(data) // 2])
    _refused(empty, "empty")
    _refused(text, "text")
    _refused(cut, "cannot be read|truncated|not a model file")


def test_files_that_would_run_code_are_refused(tmp_path):
    pkl, pt = tmp_path / "x.pkl", tmp_path / "x.pt"
    with open(pkl, "wb") as f:
        pickle.dump({"obj": _RunsCode()}, f)
    torch.save({"obj": _RunsCode()}, pt)
    _refused(pkl, "refers to posix.getpid|refers to os.getpid|refers to nt.getpid")
    _refused(pt, "holds objects other than an EquikernelsMLIAP")


def test_other_objects_are_refused(tmp_path):
    pkl, pt = tmp_path / "d.pkl", tmp_path / "d.pt"
    with open(pkl, "wb") as f:
        pickle.dump({"weights": [1, 2]}, f)
    torch.save({"weights": torch.zeros(2)}, pt)
    _refused(pkl, "holds a dict")
    _refused(pt, "holds a dict")


def test_another_state_version_is_refused(mliap_files, tmp_path, monkeypatch):
    assert isinstance(load_mliap(mliap_files / "m.pt"), EquikernelsMLIAP)
    obj = load_mliap(mliap_files / "m.pkl")
    state = dict(obj.__getstate__(), version=99)
    monkeypatch.setattr(EquikernelsMLIAP, "__getstate__", lambda self: state)  # as another version writes it
    path = tmp_path / "v.pkl"
    with open(path, "wb") as f:
        pickle.dump(obj, f)
    _refused(path, "version 99 is not supported")
