"""`equikernels eval` on a file that already holds predictions under the prefix (an earlier eval's or
mace-torch's output): every prediction key it writes is this model's, none left from the earlier run."""
import ase.io
import numpy as np
import pytest
from ase import Atoms
from ase.build import bulk

from equikernels.cli import main


@pytest.mark.parametrize("no_stress", [False, True])
def test_earlier_stress_under_the_prefix_is_not_kept(tmp_path, no_stress):
    stale = np.full((3, 3), 123.0)
    crystal = bulk("Cu", "fcc", a=3.62, cubic=True)
    crystal.rattle(0.05, seed=1)
    dimer = Atoms("CuNi", positions=[[0, 0, 0], [0, 0, 2.4]])
    for a in (crystal, dimer):
        a.info["MACE_energy"] = 0.0
        a.arrays["MACE_forces"] = np.zeros((len(a), 3))
        a.info["MACE_stress"] = stale
    src, out = str(tmp_path / "earlier_pred.xyz"), str(tmp_path / "pred.xyz")
    ase.io.write(src, [crystal, dimer], format="extxyz")
    args = ["eval", src, "--out", out, "--no-progress", "--device", "cpu"] + (["--no-stress"] if no_stress else [])
    assert main(args) == 0
    got = ase.io.read(out, ":")
    assert "MACE_stress" not in got[1].info  # not periodic: no stress predicted
    if no_stress:
        assert "MACE_stress" not in got[0].info
    else:
        assert not np.allclose(np.reshape(got[0].info["MACE_stress"], (3, 3)), stale)
    assert all(a.info["MACE_energy"] != 0.0 for a in got)
