"""`equikernels convert` to a `.model` name without --to: the file is written in equikernels' format
(which mace-torch cannot read), and a one-line warning says so and names --to mace."""
import warnings

import pytest

from equikernels.cli import main
from equikernels.models import load, save


@pytest.fixture(scope="module")
def model_file(tmp_path_factory):
    from random_models import small_random_model

    path = tmp_path_factory.mktemp("model") / "cu.pt"
    save(small_random_model([29], seed=4), str(path))
    return str(path)


def test_model_suffix_without_to_warns_that_mace_torch_cannot_read_it(model_file, tmp_path):
    out = tmp_path / "back.model"
    with pytest.warns(UserWarning, match=r"OUT '.*back\.model': written in equikernels' format, which mace-torch "
                                         r"cannot read; convert with --to mace") as record:
        assert main(["convert", model_file, str(out)]) == 0
    assert len(record) == 1 and len(str(record[0].message).splitlines()) == 1
    assert load(str(out)).atomic_numbers.tolist() == [29]


def test_explicit_to_equikernels_and_other_names_do_not_warn(model_file, tmp_path):
    with warnings.catch_warnings(record=True) as record:
        warnings.simplefilter("always")
        assert main(["convert", model_file, str(tmp_path / "ours.model"), "--to", "equikernels"]) == 0
        assert main(["convert", model_file, str(tmp_path / "ours.pt")]) == 0
    assert [str(w.message) for w in record if "mace-torch cannot read" in str(w.message)] == []
