"""The field's standard tensor-product problems, shared by tests and benchmarks.

Each entry gives the e3nn constructor arguments, so the same problem can be built as an
``e3nn.o3.TensorProduct``, an ``equikernels.TensorProduct`` or a ``TPProblem``.
"""
from __future__ import annotations

from typing import Dict, List, Tuple

from ._compat import o3
from .problem import TPProblem

SH_3 = "1x0e+1x1o+1x2e+1x3o"


def uvu_problem(irreps_in1: str, irreps_in2: str, filter_out: str) -> dict:
    """Channel-wise (uvu) product as MACE/NequIP build it: one output segment per instruction,
    output irreps sorted (MACE's ``tp_out_irreps_with_instructions``), per-row weights."""
    i1, i2, allowed = o3.Irreps(irreps_in1), o3.Irreps(irreps_in2), o3.Irreps(filter_out)
    allowed_irs = {ir for _, ir in allowed}
    out: List[Tuple[int, object]] = []
    instr = []
    for a, (mul, ir1) in enumerate(i1):
        for b, (_, ir2) in enumerate(i2):
            for ir in ir1 * ir2:
                if ir in allowed_irs:
                    instr.append((a, b, len(out), "uvu", True))
                    out.append((mul, ir))
    irreps_out = o3.Irreps(out)
    irreps_out, perm, _ = irreps_out.sort()
    instr = [(a, b, perm[c], m, w) for a, b, c, m, w in instr]
    return dict(irreps_in1=str(i1), irreps_in2=str(i2), irreps_out=str(irreps_out), instructions=instr,
                shared_weights=False, internal_weights=False)


def fully_connected_problem(irreps_in1: str, irreps_in2: str, irreps_out: str, shared: bool) -> dict:
    i1, i2, io = o3.Irreps(irreps_in1), o3.Irreps(irreps_in2), o3.Irreps(irreps_out)
    instr = [(a, b, c, "uvw", True)
             for a, (_, ir1) in enumerate(i1) for b, (_, ir2) in enumerate(i2) for c, (_, ir) in enumerate(io)
             if ir in ir1 * ir2]
    return dict(irreps_in1=str(i1), irreps_in2=str(i2), irreps_out=str(io), instructions=instr,
                shared_weights=shared, internal_weights=False)


def standard_problems() -> Dict[str, dict]:
    """name -> e3nn TensorProduct keyword arguments."""
    return {
        "mace-large": uvu_problem("128x0e+128x1o+128x2e", SH_3, "128x0e+128x1o+128x2e+128x3o"),
        "mace-medium": uvu_problem("128x0e+128x1o", SH_3, "128x0e+128x1o+128x2e"),
        "mace-mp-medium-L2": uvu_problem("128x0e+128x1o", SH_3, "128x0e+128x1o+128x2e+128x3o"),
        "nequip-lips": uvu_problem("32x0o+32x0e+32x1o+32x1e+32x2o+32x2e", "0e+1o+2e",
                                   "32x0o+32x0e+32x1o+32x1e+32x2o+32x2e"),
        "nequip-revmd17-benzene": uvu_problem("64x0o+64x0e+64x1o+64x1e+64x2o+64x2e+64x3o+64x3e",
                                              "0e+1o+2e+3o", "64x0o+64x0e+64x1o+64x1e+64x2o+64x2e+64x3o+64x3e"),
        "nequip-water": uvu_problem("32x0o+32x0e+32x1o+32x1e", "0e+1o", "32x0o+32x0e+32x1o+32x1e"),
        "diffdock-L2": fully_connected_problem("10x1o+10x1e+48x0e+48x0o", "1x0e+1x1o+1x2e",
                                               "10x1o+10x1e+48x0e+48x0o", shared=False),
        "tetris-poly-1": fully_connected_problem(SH_3, SH_3, "64x0e+24x1e+24x1o+16x2e+16x2o", shared=True),
    }


def problem(name: str) -> TPProblem:
    """The ``TPProblem`` of a standard problem (a name of ``standard_problems()``); KeyError otherwise."""
    problems = standard_problems()
    if name not in problems:
        raise KeyError(f"problem: unknown name {name!r}; expected one of {', '.join(problems)}")
    return TPProblem.create(**problems[name])
