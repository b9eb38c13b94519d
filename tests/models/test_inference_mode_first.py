"""A model or module first called inside ``torch.inference_mode`` (an energy-only screening, as with
mace-torch's models and e3nn's modules) and later with autograd (forces, training): the constants and
caches made by the first call must not be inference tensors. Run in a fresh process, so that no earlier
test has made them already."""
import subprocess
import sys
import textwrap

SCRIPT = textwrap.dedent("""
    import torch
    from ase.build import bulk
    from equikernels.calculators.loading import default_model_path
    from equikernels.models import atoms_to_data, load
    from equikernels.nn import FullyConnectedTensorProduct, Linear, SphericalHarmonics

    model = load(default_model_path(), dtype=torch.float64)
    for p in model.parameters():
        p.requires_grad_(False)
    atoms = bulk("Cu", "fcc", a=3.6, cubic=True).repeat(2)
    atoms.rattle(0.05, seed=0)
    data = atoms_to_data(atoms, float(model.r_max), [int(z) for z in model.atomic_numbers], dtype=torch.float64)
    with torch.inference_mode():
        e_inf = model(dict(data), compute_force=False)["energy"]
    out = model(dict(data), compute_force=True, compute_stress=True)
    assert torch.equal(out["energy"], e_inf), (out["energy"], e_inf)
    assert torch.isfinite(out["forces"]).all() and out["forces"].abs().max() > 0

    x, y = torch.randn(5, 16), torch.randn(5, 4)
    for module, args in ((FullyConnectedTensorProduct("4x0e+4x1o", "0e+1o", "4x0e+4x1o"), (x, y)),
                         (Linear("4x0e+4x1o", "3x0e+2x1o"), (x,)), (SphericalHarmonics("0e+1o+2e", True), (y[:, 1:],))):
        with torch.inference_mode():
            ref = module(*args)
        leaf = args[0].clone().requires_grad_()
        got = module(leaf, *args[1:])
        got.sum().backward()
        assert torch.allclose(got.detach(), ref) and leaf.grad is not None, type(module).__name__
    print("ok")
""")


def test_first_call_inside_inference_mode_then_autograd():
    r = subprocess.run([sys.executable, "-c", SCRIPT], capture_output=True, text=True, timeout=300)
    assert r.returncode == 0 and r.stdout.strip().endswith("ok"), r.stderr[-2000:]
