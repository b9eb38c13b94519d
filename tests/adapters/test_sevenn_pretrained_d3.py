"""A calculator combining others (ASE's SumCalculator, as SevenNetD3Calculator is: SevenNet plus D3)
passed to accelerate() is refused with where its model is; accelerating that model speeds up the sum."""
import numpy as np
import pytest
import torch

pytest.importorskip("ase")

import equikernels as ek  # noqa: E402


def test_sum_calculator_is_refused_naming_its_models_model():
    from ase.calculators.calculator import Calculator  # noqa: PLC0415
    from ase.calculators.lj import LennardJones  # noqa: PLC0415
    from ase.calculators.mixing import SumCalculator  # noqa: PLC0415

    class Potential(Calculator):
        implemented_properties = ["energy"]

        def __init__(self):
            super().__init__()
            self.model = torch.nn.Linear(2, 2)

    with pytest.raises(TypeError, match=r"got SumCalculator; pass its \.mixer\.calcs\[1\]\.model \(Potential\)"):
        ek.accelerate(SumCalculator([LennardJones(), Potential()]))
    with pytest.raises(TypeError, match=r"got SumCalculator$"):  # nothing holding a model inside
        ek.accelerate(SumCalculator([LennardJones()]))


@pytest.mark.sevenn
def test_sevenn_plus_dispersion_sum_accelerated_through_its_sevenn_model(single_thread):
    """SevenNetD3Calculator needs CUDA for its D3 part; a Lennard-Jones term stands in for it."""
    sevenn_calc = pytest.importorskip("sevenn.calculator")
    import ase.build  # noqa: PLC0415
    from ase.calculators.lj import LennardJones  # noqa: PLC0415
    from ase.calculators.mixing import SumCalculator  # noqa: PLC0415

    atoms = ase.build.bulk("Si", "diamond", a=5.43) * (1, 1, 2)
    atoms.rattle(0.05, seed=0)
    calc = SumCalculator([sevenn_calc.SevenNetCalculator("7net-0", device="cpu"), LennardJones(sigma=2.0)])
    atoms.calc = calc
    plain = atoms.get_potential_energy(), atoms.get_forces()
    with pytest.raises(TypeError, match=r"mixer\.calcs\[0\]\.model \(SevenNetCalculator\)"):
        ek.accelerate(calc)
    report = ek.accelerate(calc.mixer.calcs[0].model)
    assert len([t for _, t, _ in report.fused if t == "IrrepsConvolution"]) == 5, str(report)
    atoms.calc = SumCalculator(calc.mixer.calcs)  # a fresh sum: no results cached
    calc.mixer.calcs[0].reset()
    assert abs(atoms.get_potential_energy() - plain[0]) <= 5e-6 * len(atoms)
    assert np.abs(atoms.get_forces() - plain[1]).max() <= 1e-5
