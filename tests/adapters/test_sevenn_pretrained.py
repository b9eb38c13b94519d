"""accelerate() on every pretrained SevenNet model shipped inside the sevenn wheel, in place as the README
shows: each model's convolutions, radial MLPs and gates are rewired, no supported e3nn module is left,
and energy, forces and stress through sevenn's own calculator equal the unmodified model's within
float32 noise (SevenNet runs in float32 as shipped), for a crystal and a molecule in a box. 7net-0
(the 11Jul2024 weights) is covered, with both CPU backends, in test_sevenn.py."""
import numpy as np
import pytest

sevenn_calc = pytest.importorskip("sevenn.calculator")

import equikernels as ek  # noqa: E402
from e3nn import o3  # noqa: E402
from sevenn_cases import evaluate, structures  # noqa: E402

pytestmark = pytest.mark.sevenn

SUPPORTED = (o3.TensorProduct, o3.Linear, o3.SphericalHarmonics)


def _assert_close(fast, plain, natoms):
    assert abs(fast[0] - plain[0]) / natoms <= 5e-6, (fast[0], plain[0])
    assert np.abs(fast[1] - plain[1]).max() <= 1e-5 * max(1.0, np.abs(plain[1]).max())
    assert np.abs(fast[2] - plain[2]).max() <= 1e-5 * max(1.0, np.abs(plain[2]).max())


def _check_report(model, report, keys):
    fused = {t: sorted(n for n, tt, _ in report.fused if tt == t) for t in ("IrrepsConvolution", "FullyConnectedNet",
                                                                          "Gate")}
    assert fused["IrrepsConvolution"] == [f"{i}_convolution" for i in range(5)], str(report)
    assert fused["FullyConnectedNet"] == [f"{i}_convolution.weight_nn" for i in range(5)], str(report)
    assert fused["Gate"] == [f"{i}_equivariant_gate.gate" for i in range(5)], str(report)
    assert not report.not_fused and not report.left_alone, str(report)
    assert not [n for n, m in model.named_modules() if isinstance(m, SUPPORTED)], "an e3nn module was left"
    assert list(model.state_dict()) == keys


@pytest.mark.parametrize("name", ["7net-0_22may2024", "7net-l3i5"])
def test_pretrained_sevenn_model_accelerated_in_place(name, single_thread):
    calc = sevenn_calc.SevenNetCalculator(name, device="cpu")
    systems = structures()
    plain = [evaluate(calc, atoms) for atoms in systems]
    keys = list(calc.model.state_dict())
    _check_report(calc.model, ek.accelerate(calc.model), keys)
    for atoms, want in zip(systems, plain):
        _assert_close(evaluate(calc, atoms), want, len(atoms))


def test_multi_fidelity_sevenn_model_each_modality(single_thread):
    """7net-mf-0: one model, a calculator per modality (its ``modal`` argument); each modality gives its own
    numbers before and after the model is accelerated."""
    first = sevenn_calc.SevenNetCalculator("7net-mf-0", device="cpu", modal="PBE")
    modals = list(first.model.modal_map)
    assert sorted(modals) == ["PBE", "R2SCAN"]
    calcs = {m: sevenn_calc.SevenNetCalculator(first.model, file_type="model_instance", device="cpu", modal=m)
             for m in modals}
    systems = structures()
    plain = {m: [evaluate(c, atoms) for atoms in systems] for m, c in calcs.items()}
    assert abs(plain["PBE"][0][0] - plain["R2SCAN"][0][0]) > 1.0  # the modality is honoured
    keys = list(first.model.state_dict())
    _check_report(first.model, ek.accelerate(first.model), keys)
    for m, c in calcs.items():
        for atoms, want in zip(systems, plain[m]):
            _assert_close(evaluate(c, atoms), want, len(atoms))
