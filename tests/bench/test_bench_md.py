"""equikernels.bench.md: real calculators on a small crystal, Langevin steps through ASE."""
import numpy as np
import pytest
import torch

pytestmark = pytest.mark.mace
pytest.importorskip("mace")


@pytest.mark.parametrize("impl", ["equikernels", "mace-e3nn"])
def test_calculators_step_and_match_the_float64_model(impl):
    from equikernels.bench import mace as MC
    from equikernels.bench import md as MD

    cpu = torch.device("cpu")
    ref64 = MD.md_model(torch.float64, **MC.TINY)
    before = {k: v.clone() for k, v in ref64.state_dict().items()}
    atoms = MC.cu_atoms(1008)[:24]
    model64 = MC.build("mace-e3nn", ref64, torch.float64, cpu)
    forces = MC.step(model64, MC.graph(atoms, 6.0, MC.Z_ALL, torch.float64, cpu), False)["forces"].detach().numpy()
    assert np.abs(forces).max() > 1e-2  # the scaled model gives forces worth checking
    calc = MD.calculator(impl, ref64, "float32", cpu)
    assert torch.get_default_dtype() == torch.float32
    assert MD.force_error(calc, atoms, forces) < 1e-4
    assert MD.force_error(calc, atoms, -forces) > 1.0  # the error compares, it does not just run
    after = ref64.state_dict()
    assert all(torch.equal(before[k], after[k]) for k in before)  # the source model is left as it was
    run = MD.step_runner(calc, atoms)
    t = run(1.0)
    assert t["steps"] == 10 and t["ms"] > 0 and np.isfinite(t["temperature_K"])
    assert abs(t["ns_per_day"] - MD.ns_per_day(t["ms"])) < 1e-12


def test_unknown_calculator_is_named():
    from equikernels.bench import mace as MC
    from equikernels.bench import md as MD

    with pytest.raises(ValueError, match="impl: expected one of"):
        MD.calculator("openequivariance", MD.md_model(torch.float64, **MC.TINY), "float32", torch.device("cpu"))
