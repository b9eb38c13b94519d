"""e3nn drop-in details: the state_dict of tensor products built with e3nn's codegen options
(``compile_right``, ``compile_left_right``, ``_specialized_code``) has e3nn's keys, order and
constants, so checkpoints load strictly both ways; bad inputs get errors naming the argument."""
import pytest
import torch
from e3nn import o3

import equikernels.nn as enn

IRREPS = "2x0e+2x1o+2x2e"


def _instructions(mode, weighted):
    ins, outs = [], []
    for a, (_, ir1) in enumerate(o3.Irreps(IRREPS)):
        for b, (_, ir2) in enumerate(o3.Irreps(IRREPS)):
            for ir in ir1 * ir2:
                if ir.l <= 2:
                    ins.append((a, b, len(outs), mode, weighted))
                    outs.append((4 if mode == "uvuv" else 1 if mode == "uuw" and not weighted else 2, ir))
    return outs, ins


@pytest.mark.parametrize("mode,weighted", [("uvw", True), ("uvu", False), ("uvv", False), ("uuw", True),
                                           ("uuu", True), ("uuu", False), ("uvuv", False)])
@pytest.mark.parametrize("kwargs", [dict(compile_right=True), dict(compile_right=True, _specialized_code=False),
                                    dict(compile_left_right=False)])
def test_codegen_options_give_e3nns_state_dict(mode, weighted, kwargs):
    outs, ins = _instructions(mode, weighted)
    ref = o3.TensorProduct(IRREPS, IRREPS, outs, ins, **kwargs)
    ours = enn.TensorProduct(IRREPS, IRREPS, outs, ins, **kwargs)
    want, got = ref.state_dict(), ours.state_dict()
    assert list(got) == list(want)
    for key in want:
        if key != "weight":
            torch.testing.assert_close(got[key], want[key], rtol=0, atol=0)
    ref.load_state_dict(got)  # strict, both ways
    ours.load_state_dict(want)


def test_spherical_harmonics_integer_vectors_named_in_the_error():
    with pytest.raises(TypeError, match="x: expected a floating-point tensor"):
        enn.SphericalHarmonics([0, 1, 2], True)(torch.ones(4, 3, dtype=torch.long))
