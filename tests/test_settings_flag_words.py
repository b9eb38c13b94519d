"""EQUIKERNELS_CUDA_GRAPH takes the on/off words of the other 0-or-1 settings, and auto; a bad on/off
value's message names the variable and every word it takes."""
import pytest

from equikernels import settings
from equikernels.settings import SettingsError


@pytest.mark.parametrize("raw,expected", [("auto", "auto"), (" Auto ", "auto"), ("1", True), ("true", True),
                                          ("yes", True), ("ON", True), ("0", False), ("false", False),
                                          ("no", False), ("off", False)])
def test_cuda_graph_takes_the_on_off_words_and_auto(raw, expected):
    assert settings.from_environ({"EQUIKERNELS_CUDA_GRAPH": raw}).cuda_graph == expected
    with settings.override(cuda_graph=raw) as s:
        assert s.cuda_graph == expected


def test_cuda_graph_default_and_bool_override():
    assert settings.from_environ({}).cuda_graph == "auto"
    with settings.override(cuda_graph=False) as s:
        assert s.cuda_graph is False


@pytest.mark.parametrize("name,value,words", [
    ("EQUIKERNELS_AUTOTUNE", "maybe", "0 or 1 (or true/false, yes/no, on/off)"),
    ("EQUIKERNELS_CUDA_GRAPH", "maybe", "one of auto, 0/1, true/false, yes/no, on/off"),
])
def test_bad_on_off_value_lists_the_words(name, value, words):
    with pytest.raises(SettingsError) as err:
        settings.from_environ({name: value})
    assert str(err.value) == f"{name}: expected {words}, got {value!r}"
