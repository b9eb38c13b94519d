"""Training data with an element the model lacks is refused in one line naming the frame and the
element, whatever the E0s option."""
import ase.io
import pytest
from ase.build import bulk
from ase.calculators.emt import EMT

from equikernels.training import DataError, TrainConfig, Trainer


@pytest.mark.parametrize("e0s", ["average", "foundation"])
def test_an_element_the_model_lacks_is_named(tmp_path, e0s):
    from equikernels.default_model import default_model_path

    frames = []
    for symbol in ("Cu", "C"):  # the bundled model has no carbon
        a = bulk("Cu", "fcc", a=3.6) * (2, 1, 1)
        a[1].symbol = symbol
        a.calc = EMT()
        a.get_potential_energy(), a.get_forces()
        frames.append(a)
    path = str(tmp_path / "train.xyz")
    ase.io.write(path, frames, format="extxyz")
    cfg = TrainConfig(train_file=path, valid_fraction=0.0, model=default_model_path(), e0s=e0s, epochs=1,
                      out_dir=str(tmp_path / "out"), progress=False, plot=False, device="cpu")
    with pytest.raises(DataError, match=r"train\.xyz, frame 1: element\(s\) C \(Z=6\) unknown to the model"):
        Trainer(cfg, log=None)
