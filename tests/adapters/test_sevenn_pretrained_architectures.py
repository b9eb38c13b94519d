"""accelerate() on the architecture of the pretrained SevenNet models that sevenn downloads on first use
(7net-mf-ompa, 7net-omat, 7net-omni): features up to l=3 with both parities, an XPLOR cutoff, the
tensor-product self connection on one-hot species (SelfConnectionIntro) and modality-dependent linears,
built small from a config with random weights. Energy, forces and stress through sevenn's calculator
for each modality, and batched training gradients (sevenn's fine-tuning), equal the unmodified model's."""
import copy

import numpy as np
import pytest
import torch

sevenn_calc = pytest.importorskip("sevenn.calculator")

import sevenn._keys as KEY  # noqa: E402
from sevenn._const import DEFAULT_E3_EQUIVARIANT_MODEL_CONFIG  # noqa: E402
from sevenn.atom_graph_data import AtomGraphData  # noqa: E402
from sevenn.model_build import build_E3_equivariant_model  # noqa: E402
from sevenn.train.dataload import unlabeled_atoms_to_graph  # noqa: E402

import equikernels as ek  # noqa: E402
from sevenn_cases import evaluate, structures  # noqa: E402

pytestmark = pytest.mark.sevenn

MODALS = {"mpa": 0, "omat24": 1}


def _model():
    cfg = copy.deepcopy(DEFAULT_E3_EQUIVARIANT_MODEL_CONFIG)
    cfg.update({
        KEY.CUTOFF: 4.0, KEY.NODE_FEATURE_MULTIPLICITY: 4, KEY.LMAX: 3, KEY.IS_PARITY: True, KEY.NUM_CONVOLUTION: 3,
        KEY.IRREPS_MANUAL: ["4x0e", "4x0e+2x1o+2x2e+1x3o", "4x0o+4x0e+2x1o+2x1e+1x2o+1x2e+1x3o+1x3e", "4x0e"],
        KEY.RADIAL_BASIS: {KEY.RADIAL_BASIS_NAME: "bessel", KEY.BESSEL_BASIS_NUM: 8},
        KEY.CUTOFF_FUNCTION: {KEY.CUTOFF_FUNCTION_NAME: "XPLOR", "cutoff_on": 3.5},
        KEY.CONVOLUTION_WEIGHT_NN_HIDDEN_NEURONS: [8, 8], KEY.CONV_DENOMINATOR: 7.0,
        KEY.SELF_CONNECTION_TYPE: "nequip",
        KEY.CHEMICAL_SPECIES: ["H", "C", "O", "Si"], KEY.NUM_SPECIES: 4, KEY.TYPE_MAP: {1: 0, 6: 1, 8: 2, 14: 3},
        KEY.SCALE: [1.0, 1.5, 0.5, 2.0], KEY.SHIFT: [[-1.0, -2.0, -3.0, -4.0], [-1.5, -2.5, -3.5, -4.5]],
        KEY.USE_MODALITY: True, KEY.NUM_MODALITIES: 2, KEY.MODAL_MAP: dict(MODALS),
        KEY.USE_MODAL_WISE_SHIFT: True, KEY.USE_MODAL_WISE_SCALE: False,
        KEY.USE_MODAL_SELF_INTER_INTRO: True, KEY.USE_MODAL_SELF_INTER_OUTRO: True, KEY.USE_MODAL_OUTPUT_BLOCK: True,
    })
    torch.manual_seed(0)
    return build_E3_equivariant_model(cfg)


def _close(a, b, rtol=2e-5):
    a, b = np.asarray(a, dtype=np.float64), np.asarray(b, dtype=np.float64)
    return np.abs(a - b).max() <= rtol * max(np.abs(b).max(), 1e-3)


def test_ompa_like_sevenn_model_each_modality(single_thread):
    model = _model()
    calcs = {m: sevenn_calc.SevenNetCalculator(model, file_type="model_instance", device="cpu", modal=m)
             for m in MODALS}
    systems = structures(water_vacuum=3.0, water_rattle=None)
    plain = {m: [evaluate(c, atoms) for atoms in systems] for m, c in calcs.items()}
    report = ek.accelerate(model)
    fused = {n for n, _, _ in report.fused}
    for i in range(3):
        assert {f"{i}_convolution", f"{i}_self_connection_intro.fc_tensor_product"} <= fused, str(report)
    assert not report.not_fused and not report.left_alone, str(report)
    for m, c in calcs.items():
        for atoms, want in zip(systems, plain[m]):
            got = evaluate(c, atoms)
            assert all(_close(g, w) for g, w in zip(got, want)), (m, atoms.get_chemical_formula())


def test_ompa_like_sevenn_model_batched_training_gradients(single_thread):
    """A batch of two graphs of different modalities in training mode (sevenn's fine-tuning): energies,
    forces, stress and the gradients of a loss over them with respect to every parameter."""
    from torch_geometric.data import Batch  # noqa: PLC0415

    plain = _model()
    fast = copy.deepcopy(plain)
    ek.accelerate(fast)

    def run(model):
        model.set_is_batch_data(True)
        model.train()
        graphs = []
        for atoms, modal in zip(structures(water_vacuum=3.0, water_rattle=None), MODALS):
            data = AtomGraphData.from_numpy_dict(unlabeled_atoms_to_graph(atoms, 4.0))
            data[KEY.DATA_MODALITY] = modal
            graphs.append(data)
        out = model(Batch.from_data_list(graphs))
        outputs = [out[KEY.PRED_TOTAL_ENERGY], out[KEY.PRED_FORCE], out[KEY.PRED_STRESS]]
        loss = sum(o.pow(2).sum() for o in outputs)
        params = [p for p in model.parameters() if p.requires_grad]
        return [o.detach() for o in outputs] + list(torch.autograd.grad(loss, params))

    got, want = run(fast), run(plain)
    assert len(got) == len(want)
    for g, w in zip(got, want):
        torch.testing.assert_close(g, w, rtol=1e-5, atol=1e-5 * float(w.abs().max()) + 1e-8)
