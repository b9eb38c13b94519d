"""`equikernels eval` on mace_eval_configs' output of a MACELES model (--compute_bec): the Born effective
charges and latent charges under the prefix are an earlier model's, so they are not carried into --out."""
import ase.io
import numpy as np
from ase.build import bulk

from equikernels.cli import main


def test_earlier_bec_under_the_prefix_is_not_kept(tmp_path):
    a = bulk("Cu", "fcc", a=3.62, cubic=True)
    a.rattle(0.05, seed=1)
    a.info["MACE_energy"] = 0.0
    a.arrays["MACE_forces"] = np.zeros((len(a), 3))
    a.arrays["MACE_BEC"] = np.ones((len(a), 9))
    a.arrays["MACE_latent_charges"] = np.ones(len(a))
    a.arrays["other_BEC"] = np.ones(len(a))  # not under the prefix: the frame's own data, kept
    src, out = str(tmp_path / "maceles_pred.xyz"), str(tmp_path / "pred.xyz")
    ase.io.write(src, a, format="extxyz")
    assert main(["eval", src, "--out", out, "--no-progress", "--device", "cpu"]) == 0
    got = ase.io.read(out)
    assert "MACE_BEC" not in got.arrays and "MACE_latent_charges" not in got.arrays
    assert "other_BEC" in got.arrays and got.info["MACE_energy"] != 0.0
