"""from_e3nn and accelerate: same numbers, same Parameters, same state_dict."""
import copy
import itertools

import pytest
import torch

import equikernels as ek
from equikernels._compat import o3
from e3nn.math import soft_one_hot_linspace
from e3nn.nn import FullyConnectedNet, Gate, NormActivation

TOL = 1e-10


@pytest.fixture(autouse=True)
def dtype64():
    old = torch.get_default_dtype()
    torch.set_default_dtype(torch.float64)
    yield
    torch.set_default_dtype(old)


def rel(a, b):
    a, b = a.detach(), b.detach()
    return float((a - b).norm() / b.norm().clamp_min(1e-30))


def same_state(a: dict, b: dict) -> bool:
    return list(a) == list(b) and all(torch.equal(a[k], b[k]) for k in a)


I1, I2, IO = "3x0e+2x1o+1x2e", "2x0e+1x1o", "4x0e+2x1o+1x2e"
INSTR = [(0, 0, 0, "uvw", True), (1, 1, 0, "uvw", True, 0.7), (1, 0, 1, "uvu", True), (2, 1, 1, "uvw", True),
         (0, 1, 1, "uvw", True), (2, 0, 2, "uvu", True), (1, 1, 2, "uvw", True)]


@pytest.mark.parametrize("irrep_norm,path_norm,variances", list(itertools.product(
    ["component", "norm", "none"], ["element", "path", "none"], [False, True])))
def test_from_e3nn_every_normalisation(irrep_norm, path_norm, variances):
    kw = dict(in1_var=[1.0, 2.0, 0.5], in2_var=[0.3, 1.2], out_var=[1.5, 0.8, 2.0]) if variances else {}
    ref = o3.TensorProduct(I1, I2, IO, INSTR, irrep_normalization=irrep_norm, path_normalization=path_norm, **kw)
    ours = ek.from_e3nn(ref)
    assert type(ours) is ek.TensorProduct
    assert ours.weight is ref.weight  # the same Parameter object
    # bit-identical normalised path weights and state
    assert [tuple(i) for i in ours.instructions] == [tuple(i) for i in ref.instructions]
    assert same_state(ours.state_dict(), ref.state_dict())
    x = torch.randn(5, ref.irreps_in1.dim, requires_grad=True)
    y = torch.randn(5, ref.irreps_in2.dim)
    out_ref, out = ref(x, y), ours(x, y)
    assert rel(out, out_ref) < TOL
    cot = torch.randn_like(out)
    grads = torch.autograd.grad(out, [x, ours.weight], cot)
    for a, b in zip(grads, torch.autograd.grad(out_ref, [x, ref.weight], cot)):
        assert rel(a, b) < TOL


def test_from_e3nn_subclasses_keep_their_class():
    cases = [
        (o3.FullyConnectedTensorProduct("2x0e+1x1o", "0e+1o", "2x0e+2x1o", shared_weights=False),
         ek.FullyConnectedTensorProduct, 2),
        (o3.ElementwiseTensorProduct("2x0e+2x1o", "4x1o", ["0e", "1e"]), ek.ElementwiseTensorProduct, 2),
        (o3.FullTensorProduct("2x0e+1x1o", "1o+2e", irrep_normalization="norm"), ek.FullTensorProduct, 2),
    ]
    if hasattr(o3, "TensorSquare"):
        cases += [(o3.TensorSquare("3x0e+2x1o"), ek.TensorSquare, 1),
                  (o3.TensorSquare("3x0e+2x1o", "2x0e+2x1e+1x2e"), ek.TensorSquare, 1)]
    for ref, cls, nargs in cases:
        ours = ek.from_e3nn(ref)
        assert type(ours) is cls
        assert same_state(ours.state_dict(), ref.state_dict())
        args = [torch.randn(4, d) for d in (ref.irreps_in1.dim, ref.irreps_in2.dim)[:nargs]]
        if ref.weight_numel and not ref.internal_weights:
            args.append(torch.randn(4, ref.weight_numel))
        assert rel(ours(*args), ref(*args)) < TOL, type(ref).__name__


@pytest.mark.parametrize("kw", [{}, {"biases": True, "path_normalization": "path"}, {"f_in": 2, "f_out": 3},
                                {"shared_weights": False}, {"instructions": [(0, 0)], "biases": [True, False]}])
def test_from_e3nn_linear(kw):
    ref = o3.Linear("3x0e+2x1o+2x0e", "4x0e+3x1o", **kw)
    with torch.no_grad():
        if ref.bias.numel():
            ref.bias.normal_()
    ours = ek.from_e3nn(ref)
    assert isinstance(ours, ek.Linear) and same_state(ours.state_dict(), ref.state_dict())
    for name, p in ref.named_parameters():
        assert getattr(ours, name) is p
    x = torch.randn(5, *((kw["f_in"],) if "f_in" in kw else ()), ref.irreps_in.dim)
    args = (x,) if ref.internal_weights else (x, torch.randn(5, ref.weight_numel))
    assert rel(ours(*args), ref(*args)) < TOL


def test_from_e3nn_spherical_harmonics_and_errors():
    ref = o3.SphericalHarmonics("0e+1o+2e+3o", normalize=True, normalization="component")
    ours = ek.from_e3nn(ref)
    v = torch.randn(6, 3)
    assert isinstance(ours, ek.SphericalHarmonics) and rel(ours(v), ref(v)) < TOL
    with pytest.raises(TypeError, match=r"cannot convert .*FullyConnectedNet.*equikernels\.accelerate\(model\)"):
        ek.from_e3nn(FullyConnectedNet([3, 4]))
    with pytest.raises(TypeError, match=r"cannot convert torch\.nn\.modules\.linear\.Linear"):
        ek.from_e3nn(torch.nn.Linear(2, 2))

    class Custom(o3.FullyConnectedTensorProduct):
        def forward(self, x, y, weight=None):
            return 2 * super().forward(x, y, weight)

    with pytest.raises(TypeError, match=r"Custom overrides forward"):
        ek.from_e3nn(Custom("0e", "0e", "0e"))


# --- a small NequIP-style model -----------------------------------------------------------------
class Interaction(torch.nn.Module):
    def __init__(self, irreps_node, irreps_sh, irreps_out, num_basis=8):
        super().__init__()
        irreps_node, irreps_sh = o3.Irreps(irreps_node), o3.Irreps(irreps_sh)
        mid, instr = [], []
        for i, (mul, ir_in) in enumerate(irreps_node):
            for j, (_, ir_sh) in enumerate(irreps_sh):
                for ir in ir_in * ir_sh:
                    if ir in o3.Irreps(irreps_out) or ir == o3.Irrep("0e"):
                        instr.append((i, j, len(mid), "uvu", True))
                        mid.append((mul, ir))
        mid, perm, _ = o3.Irreps(mid).sort()
        instr = [(i, j, perm[k], m, w) for i, j, k, m, w in instr]
        self.num_basis = num_basis
        self.tp = o3.TensorProduct(irreps_node, irreps_sh, mid, instr, shared_weights=False, internal_weights=False)
        self.radial = FullyConnectedNet([num_basis, 16, self.tp.weight_numel], torch.nn.functional.silu)
        irreps_out = o3.Irreps(irreps_out)
        scalars = o3.Irreps([(m, ir) for m, ir in irreps_out if ir.l == 0])
        gated = o3.Irreps([(m, ir) for m, ir in irreps_out if ir.l > 0])
        self.gate = Gate(scalars, [torch.nn.functional.silu], f"{gated.num_irreps}x0e", [torch.sigmoid], gated)
        self.linear = o3.Linear(mid.simplify(), self.gate.irreps_in)

    def forward(self, x, sh, length, src, dst):
        emb = soft_one_hot_linspace(length, 0.0, 2.5, self.num_basis, basis="smooth_finite", cutoff=True)
        msg = self.tp(x[src], sh, self.radial(emb * self.num_basis ** 0.5))
        agg = torch.zeros(x.shape[0], msg.shape[1], dtype=msg.dtype).index_add(0, dst, msg)
        return self.gate(self.linear(agg))


class TinyNequIP(torch.nn.Module):
    def __init__(self):
        super().__init__()
        hidden = "4x0e+2x1o+2x2e"
        self.sh = o3.SphericalHarmonics("0e+1o+2e", normalize=True, normalization="component")
        self.embed = o3.Linear("3x0e", "4x0e", biases=True)
        self.layers = torch.nn.ModuleList([Interaction("4x0e", "0e+1o+2e", hidden),
                                           Interaction(hidden, "0e+1o+2e", hidden)])
        self.head = torch.nn.Sequential(o3.Linear(hidden, "2x0e"), o3.Linear("2x0e", "0e"))
        self.norm_act = NormActivation("2x1o", torch.tanh)  # holds e3nn TensorProducts inside

    def forward(self, pos, species, src, dst):
        vec = pos[dst] - pos[src]
        sh, length = self.sh(vec), vec.norm(dim=-1)
        x = self.embed(species)
        for layer in self.layers:
            x = layer(x, sh, length, src, dst)
        extra = self.norm_act(x[:, 4:10]).pow(2).sum()  # the 2x1o block of the hidden irreps
        return self.head(x).sum() + 0.1 * extra


def _graph(n=6, seed=0):
    g = torch.Generator().manual_seed(seed)
    pos = torch.randn(n, 3, generator=g) * 1.2
    species = torch.nn.functional.one_hot(torch.randint(0, 3, (n,), generator=g), 3).double()
    src, dst = [t.flatten() for t in torch.meshgrid(torch.arange(n), torch.arange(n), indexing="ij")]
    keep = src != dst
    return pos, species, src[keep], dst[keep]


def _energy_forces_grads(model, pos, species, src, dst):
    pos = pos.clone().requires_grad_(True)
    energy = model(pos, species, src, dst)
    forces = -torch.autograd.grad(energy, pos, create_graph=True)[0]
    loss = energy + forces.pow(2).sum()  # force-matching loss needs the double backward
    params = list(model.parameters())
    return energy.detach(), forces.detach(), [g.detach() for g in torch.autograd.grad(loss, params)]


def test_accelerate_nequip_style_model():
    torch.manual_seed(0)
    model = TinyNequIP()
    data = _graph()
    e_ref, f_ref, g_ref = _energy_forces_grads(model, *data)
    params_before = list(model.parameters())
    state_before = {k: v.clone() for k, v in model.state_dict().items()}

    report = ek.accelerate(model)

    # every supported e3nn module was replaced, also inside ModuleList/Sequential/Gate/NormActivation
    replaced = set(report.replaced_names)
    expected = {"sh", "embed", "head.0", "head.1", "layers.0.tp", "layers.0.linear", "layers.0.gate.mul",
                "layers.1.tp", "layers.1.linear", "layers.1.gate.mul", "norm_act.norm.tp",
                "norm_act.scalar_multiplier"}
    assert replaced == expected, replaced ^ expected
    assert not any(type(m).__module__.startswith("e3nn.o3") for m in model.modules()
                   if isinstance(m, (o3.TensorProduct, o3.Linear, o3.SphericalHarmonics)))
    kept = dict((n, why) for n, _, why in report.left_alone)
    assert "norm_act" in kept and "replaced" in kept["norm_act"] and "layers.0.radial" not in kept
    assert "layers.0.gate" not in kept  # the gates are rewired whole (adapters.e3nn_gate)
    fused = dict((n, what) for n, _, what in report.fused)  # the radial MLPs: constants folded into weights
    assert "folded into the weights" in fused["layers.0.radial"] and "layers.1.radial" in fused
    assert "gating multiplication" in fused["layers.0.gate"] and "layers.1.gate" in fused
    text = str(report)
    assert "replaced 12 module(s)" in text and "layers.1.tp: TensorProduct -> equikernels.TensorProduct" in text

    # same Parameters, same state_dict (keys, order and values)
    assert all(a is b for a, b in zip(model.parameters(), params_before))
    assert same_state(model.state_dict(), state_before)

    e, f, g = _energy_forces_grads(model, *data)
    assert rel(e, e_ref) < TOL and rel(f, f_ref) < TOL
    for a, b in zip(g, g_ref):
        assert rel(a, b) < TOL

    # a second call finds nothing left; a deep copy still works; the e3nn checkpoint still loads
    assert len(ek.accelerate(model)) == 0
    clone = copy.deepcopy(model)
    clone.load_state_dict(state_before)
    assert rel(_energy_forces_grads(clone, *data)[0], e_ref) < TOL


def test_accelerate_shared_module_and_root_errors():
    tp = o3.FullyConnectedTensorProduct("2x0e", "0e", "2x0e")
    model = torch.nn.ModuleDict({"a": tp, "b": torch.nn.Sequential(tp)})
    report = ek.accelerate(model)
    assert report.replaced_names == ["a"]  # converted once ...
    assert model["a"] is model["b"][0]  # ... and still shared
    with pytest.raises(TypeError, match="use equikernels.from_e3nn"):
        ek.accelerate(o3.Linear("0e", "0e"))
    with pytest.raises(TypeError, match="model: expected a torch.nn.Module"):
        ek.accelerate("not a model")

    class Calculator:  # an ASE calculator holding its model, as SevenNet's and ours do
        model = torch.nn.Linear(2, 2)
    with pytest.raises(TypeError, match=r"got Calculator; pass its \.model$"):
        ek.accelerate(Calculator())


def test_accelerate_leaves_user_subclasses_alone():
    class Doubled(o3.Linear):
        def forward(self, x):
            return 2 * super().forward(x)

    class Tagged(o3.Linear):  # same forward, but may carry extras the model relies on
        tag = "keep me"

    model = torch.nn.Sequential(Doubled("2x0e", "2x0e"), Tagged("2x0e", "2x0e"), o3.Linear("2x0e", "0e"))
    x = torch.randn(3, 2)
    out = model(x)
    report = ek.accelerate(model)
    assert report.replaced_names == ["2"] and isinstance(model[0], Doubled) and isinstance(model[1], Tagged)
    kept = {n: why for n, _, why in report.left_alone}
    assert "overrides forward" in kept["0"] and "user-defined subclass" in kept["1"]
    assert rel(model(x), out) < TOL
    assert isinstance(ek.from_e3nn(model[1]), ek.Linear)  # explicit conversion is allowed


def test_accelerate_keeps_a_module_it_cannot_convert_and_goes_on():
    # from_e3nn refuses an external-weight Linear with f_in / f_out: accelerate keeps it, with the
    # reason, and converts the rest (never a model left half converted by an exception)
    odd = o3.Linear("2x0e", "2x0e", f_in=3, f_out=4, internal_weights=False)
    with pytest.raises(TypeError, match="f_in/f_out"):
        ek.from_e3nn(odd)
    model = torch.nn.Sequential(o3.Linear("2x0e", "2x0e"), odd, o3.Linear("2x0e", "0e"))
    report = ek.accelerate(model)
    assert report.replaced_names == ["0", "2"] and model[1] is odd
    kept = {n: why for n, _, why in report.left_alone}
    assert "f_in/f_out" in kept["1"]


@pytest.mark.parametrize("args", [
    ("0x0e", "1x0e", "2x0e", [(0, 0, 0, "uvw", False)]),
    ("0x1o+1x0e", "2x0e", "2x1o+2x0e", [(0, 0, 0, "uuw", False), (1, 0, 1, "uvw", True)]),
    ("0x1o+2x0e", "2x0e", "3x1o+2x0e", [(0, 0, 0, "uvu", True), (1, 0, 1, "uvu", True)]),
])
def test_empty_paths_accept_any_mode_as_e3nn(args):
    # a path with a zero multiplicity contributes nothing; e3nn builds it whatever its mode's rules
    e = o3.TensorProduct(*args)
    x = torch.randn(4, e.irreps_in1.dim, requires_grad=True)
    y = torch.randn(4, e.irreps_in2.dim, requires_grad=True)
    def grads(t):  # zeros where the output does not depend on an input
        if not t.requires_grad:
            return [torch.zeros_like(x), torch.zeros_like(y)]
        gs = torch.autograd.grad(t.pow(2).sum(), (x, y), allow_unused=True)
        return [torch.zeros_like(v) if g is None else g for g, v in zip(gs, (x, y))]

    ref = e(x, y)
    g_ref = grads(ref)
    for m in (ek.from_e3nn(e), ek.TensorProduct(*args)):
        m.load_state_dict(e.state_dict())
        out = m(x, y)
        torch.testing.assert_close(out, ref, rtol=TOL, atol=TOL)
        for g, gr in zip(grads(out), g_ref):
            torch.testing.assert_close(g, gr, rtol=TOL, atol=TOL)
