"""``models.io.load_mace_module`` unpickles only mace-torch files: a file in our own format (the
bundled model) is recognised without running code from it and without a code-execution warning."""
import warnings

import pytest

from equikernels.default_model import default_model_path
from equikernels.models.io import CodeExecutionWarning, load_mace_module


def test_our_format_is_not_unpickled():
    with warnings.catch_warnings():
        warnings.simplefilter("error", CodeExecutionWarning)
        assert load_mace_module(default_model_path()) is None


def test_not_a_model_file(tmp_path):
    bad = tmp_path / "x.model"
    bad.write_text("not a model")
    with pytest.raises(ValueError, match="x.model"):
        load_mace_module(bad)
