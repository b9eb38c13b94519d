"""TPProblem: hashing, equality, spec round-trip and e3nn's normalisation / weight bookkeeping."""
import dataclasses
import itertools
import json

import pytest

from equikernels._compat import o3
from equikernels.catalog import problem as catalog_problem
from equikernels.catalog import standard_problems
from equikernels.problem import TPProblem, problem_from_spec, problem_to_spec
from problems import NORMALIZATION_PAIRS, e3nn_tp, problem_of, random_problem, supported_modes

SEEDS = range(60)


def _kw():
    return dict(irreps_in1="4x0e+2x1o", irreps_in2="1x0e+1x1o", irreps_out="4x0e+4x1o+2x1e",
                instructions=[(0, 0, 0, "uvu", True), (1, 1, 0, "uvw", True, 0.5), (0, 1, 1, "uvu", True),
                              (1, 1, 2, "uvu", False)])


# --- identity -----------------------------------------------------------------------------------
def test_equal_problems_hash_equal():
    a, b = TPProblem.create(**_kw()), TPProblem.create(**_kw())
    assert a == b and hash(a) == hash(b) and a.key() == b.key()
    assert len({a: 1, b: 2}) == 1


def test_equivalent_spellings_are_equal():
    kw = _kw()
    forms = [kw["irreps_in1"], "4x0e + 2x1o", o3.Irreps("4x0e+2x1o"), [(4, (0, 1)), (2, (1, -1))]]
    problems = [TPProblem.create(**dict(kw, irreps_in1=f)) for f in forms]
    assert all(p == problems[0] and p.key() == problems[0].key() for p in problems)
    # instructions given with and without the default path weight
    instr = [tuple(i) + ((1.0,) if len(i) == 5 else ()) for i in kw["instructions"]]
    assert TPProblem.create(**dict(kw, instructions=instr)) == problems[0]


@pytest.mark.parametrize("change", [
    dict(irreps_out="4x0e+4x1o+2x1e+1x2e"),
    dict(instructions=[(0, 0, 0, "uvu", True), (1, 1, 0, "uvw", True, 0.25), (0, 1, 1, "uvu", True),
                       (1, 1, 2, "uvu", False)]),
    dict(instructions=[(0, 0, 0, "uvu", True), (1, 1, 0, "uvw", True, 0.5), (0, 1, 1, "uvu", True),
                       (1, 1, 2, "uvu", True)]),
    dict(instructions=[(0, 0, 0, "uvu", True), (1, 1, 0, "uvw", True, 0.5), (0, 1, 1, "uvu", True)]),
    dict(irrep_normalization="norm"),
    dict(path_normalization="path"),
    dict(in1_var=[1.0, 2.0]),
    dict(out_var=[1.0, 1.0, 3.0]),
    dict(shared_weights=False),
    dict(internal_weights=False),
], ids=lambda c: next(iter(c)))
def test_any_change_makes_a_different_problem(change):
    a, b = TPProblem.create(**_kw()), TPProblem.create(**dict(_kw(), **change))
    assert a != b and a.key() != b.key()


def test_frozen():
    p = TPProblem.create(**_kw())
    with pytest.raises(dataclasses.FrozenInstanceError):
        p.shared_weights = False


def test_key_is_stable_hex():
    p = TPProblem.create(**_kw())
    assert len(p.key()) == 16 and int(p.key(), 16) >= 0
    assert p.key() == TPProblem.create(**_kw()).key()


def test_describe():
    s = TPProblem.create(**_kw()).describe()
    assert "4x0e+2x1o x 1x0e+1x1o -> 4x0e+4x1o+2x1e" in s and "4 paths" in s
    assert f"{TPProblem.create(**_kw()).weight_numel} weights" in s


# --- spec round trip ----------------------------------------------------------------------------
@pytest.mark.parametrize("seed", SEEDS)
def test_spec_round_trip(seed):
    p = problem_of(random_problem(seed))
    spec = json.loads(json.dumps(problem_to_spec(p)))
    q = problem_from_spec(spec)
    assert q == p and q.key() == p.key()
    assert q.path_coefficients == p.path_coefficients
    assert json.dumps(problem_to_spec(q)) == json.dumps(problem_to_spec(p))


def test_spec_round_trip_edge_cases():
    for kw in (dict(irreps_in1="0x1o+3x0e", irreps_in2="2x1o", irreps_out="3x1e+0x2e", instructions=[]),
               dict(irreps_in1="", irreps_in2="1x0e", irreps_out="", instructions=[])):
        p = TPProblem.create(**kw)
        assert problem_from_spec(json.loads(json.dumps(problem_to_spec(p)))) == p


@pytest.mark.parametrize("name", sorted(standard_problems()))
def test_catalog_round_trip(name):
    p = catalog_problem(name)
    assert problem_from_spec(json.loads(json.dumps(problem_to_spec(p)))) == p


# --- e3nn bookkeeping ---------------------------------------------------------------------------
def _compare_with_e3nn(kw):
    p = problem_of(kw)
    tp = e3nn_tp(kw)
    assert p.weight_numel == tp.weight_numel
    assert (p.dim_in1, p.dim_in2, p.dim_out) == (tp.irreps_in1.dim, tp.irreps_in2.dim, tp.irreps_out.dim)
    assert len(p.instructions) == len(tp.instructions)
    for ins, coef, ref in zip(p.instructions, p.path_coefficients, tp.instructions):
        assert (ins.i_in1, ins.i_in2, ins.i_out, ins.mode, ins.has_weight) == (
            ref.i_in1, ref.i_in2, ref.i_out, ref.connection_mode, ref.has_weight)
        assert ins.path_shape(p) == tuple(ref.path_shape)
        # e3nn stores the normalised coefficient in Instruction.path_weight
        assert coef == pytest.approx(ref.path_weight, rel=1e-14, abs=1e-300)
    assert (p.shared_weights, p.internal_weights) == (tp.shared_weights, tp.internal_weights)


@pytest.mark.parametrize("seed", SEEDS)
def test_normalisation_matches_e3nn(seed):
    _compare_with_e3nn(random_problem(seed))


@pytest.mark.parametrize("norm", NORMALIZATION_PAIRS, ids=lambda n: "-".join(n))
@pytest.mark.parametrize("mode", supported_modes())
def test_normalisation_every_mode(mode, norm):
    kw = random_problem(77, force_mode=mode, normalization=norm)
    kw["in1_var"] = [0.5 + i for i in range(len(o3.Irreps(kw["irreps_in1"])))]
    kw["in2_var"] = [2.0 - 0.25 * i for i in range(len(o3.Irreps(kw["irreps_in2"])))]
    kw["out_var"] = [1.0 + 0.1 * i for i in range(len(o3.Irreps(kw["irreps_out"])))]
    _compare_with_e3nn(kw)


def test_normalisation_known_values():
    """Hand-computed: 2x1o x 1x1o -> 2x0e+2x2e, uvu, component/element, path weight 3 on the first."""
    p = TPProblem.create("2x1o", "1x1o", "2x0e+2x2e", [(0, 0, 0, "uvu", True, 3.0), (0, 0, 1, "uvu", True)])
    # alpha = (2 l_out + 1) / (in1_var * in2_var * num_elements) * path_weight, num_elements = mul_in2 = 1
    assert p.path_coefficients == pytest.approx((3 ** 0.5, 5 ** 0.5), rel=1e-15)
    q = TPProblem.create("2x1o", "3x1o", "2x0e", [(0, 0, 0, "uvw", True), (0, 0, 0, "uvu", True)],
                         irrep_normalization="norm", path_normalization="path")
    # norm: alpha = 3 * 3; path: x = num_elements * (#paths into the output) = (2*3) * 2 and 3 * 2
    assert q.path_coefficients == pytest.approx(((9 / 12) ** 0.5, (9 / 6) ** 0.5), rel=1e-15)


@pytest.mark.parametrize("internal,shared", list(itertools.product([None, True, False], repeat=2)))
def test_weight_flags_resolve_like_e3nn(internal, shared):
    kw = dict(_kw(), internal_weights=internal, shared_weights=shared)
    if internal is True and shared is False:
        with pytest.raises(ValueError):
            TPProblem.create(**kw)
        with pytest.raises(AssertionError):
            e3nn_tp(kw)
        return
    p, tp = TPProblem.create(**kw), e3nn_tp(kw)
    assert (p.shared_weights, p.internal_weights) == (tp.shared_weights, tp.internal_weights)
    if tp.internal_weights:
        assert tp.weight.numel() == p.weight_numel


def test_unweighted_problem_has_no_internal_weights():
    kw = dict(irreps_in1="2x1o", irreps_in2="2x1o", irreps_out="2x0e",
              instructions=[(0, 0, 0, "uuu", False)])
    p, tp = TPProblem.create(**kw), e3nn_tp(kw)
    assert p.weight_numel == 0 and p.internal_weights is False and tp.internal_weights is False


@pytest.mark.parametrize("name", sorted(standard_problems()))
def test_catalog_matches_e3nn(name):
    _compare_with_e3nn(standard_problems()[name])


def test_catalog_known_sizes():
    """MACE-MP medium layer 2 conv TP: 10 paths / 1280 weights / 5120 outputs; large 17/2176/9088."""
    med, large = catalog_problem("mace-mp-medium-L2"), catalog_problem("mace-large")
    assert (len(med.instructions), med.weight_numel, med.dim_out) == (10, 1280, 5120)
    assert (len(large.instructions), large.weight_numel, large.dim_out) == (17, 2176, 9088)
    assert all(not p.shared_weights for p in (med, large))
