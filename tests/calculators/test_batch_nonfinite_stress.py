"""A structure whose model results are NaN (coincident atoms) leaves the other structures of the same
batched model call finite, also when stress is computed: batch evaluation names the bad structure, and
`equikernels eval` writes the others' predictions."""
import numpy as np
import pytest
from ase.build import bulk
from ase.io import read, write

from equikernels.calculators import MACECalculator
from equikernels.calculators.checks import NonFiniteError
from equikernels.cli import main


def frames():
    good = bulk("Cu", "fcc", a=3.61, cubic=True)
    bad = good.copy()
    bad.positions[2] = bad.positions[1]
    return [good, bad, good.copy()]


def test_batch_evaluate_with_stress_names_the_bad_structure(cu_model, single_thread):
    calc = MACECalculator(cu_model, device="cpu")
    with pytest.raises(NonFiniteError, match=r"atoms_list\[1\].*1 and 2"):
        calc.batch_evaluate(frames(), ("energy", "forces", "stress"))


def test_eval_keeps_the_other_frames_finite(cu_model, tmp_path, single_thread):
    src, out = tmp_path / "frames.xyz", tmp_path / "pred.xyz"
    write(str(src), frames())
    with pytest.warns(UserWarning, match=r"for 1 structure\(s\), first .*frame 1"):
        assert main(["eval", str(src), "--model", cu_model, "--out", str(out), "--no-progress"]) == 0
    pred = read(str(out), ":")
    for k in (0, 2):
        assert np.isfinite(pred[k].arrays["MACE_forces"]).all() and np.isfinite(pred[k].info["MACE_energy"])
    assert not np.isfinite(pred[1].arrays["MACE_forces"]).all()
