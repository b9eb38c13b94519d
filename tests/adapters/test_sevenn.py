"""accelerate() on SevenNet-0 (the pretrained model shipped in the sevenn wheel): its five
IrrepsConvolution layers run as fused convolutions; energy, forces and stress through sevenn's own
calculator equal the unmodified model's within float32 noise (SevenNet runs in float32 as shipped)."""
import numpy as np
import pytest
import torch

sevenn_calc = pytest.importorskip("sevenn.calculator")

import equikernels as ek  # noqa: E402


@pytest.mark.parametrize("backend", ["reference", "cpu"])
def test_sevenn0_fused_matches(backend, monkeypatch, single_thread):
    monkeypatch.setenv("EQUIKERNELS_BACKEND", backend)  # reference: the fused convolution; cpu: gather/scatter
    import ase.build  # noqa: PLC0415

    plain = sevenn_calc.SevenNetCalculator("7net-0", device="cpu")
    fast = sevenn_calc.SevenNetCalculator("7net-0", device="cpu")
    keys = list(fast.model.state_dict())
    report = ek.accelerate(fast.model)
    assert [n for n, t, _ in report.fused if t == "IrrepsConvolution"] == [f"{i}_convolution" for i in range(5)]
    assert not report.not_fused and list(fast.model.state_dict()) == keys
    assert type(fast.model._modules["0_convolution"]).__name__ == "IrrepsConvolution"

    atoms = ase.build.bulk("Si", "diamond", a=5.43) * (1, 1, 2)
    atoms.numbers[1] = 8
    atoms.rattle(0.05, seed=0)
    res = {}
    for name, calc in (("plain", plain), ("fast", fast)):
        a = atoms.copy()
        a.calc = calc
        res[name] = (a.get_potential_energy(), a.get_forces(), a.get_stress())
    assert abs(res["fast"][0] - res["plain"][0]) / len(atoms) <= 5e-6
    assert np.abs(res["fast"][1] - res["plain"][1]).max() <= 1e-5
    assert np.abs(res["fast"][2] - res["plain"][2]).max() <= 1e-5 * max(1.0, np.abs(res["plain"][2]).max())
