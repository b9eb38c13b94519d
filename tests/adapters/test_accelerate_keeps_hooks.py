"""accelerate() keeps the hooks registered on the e3nn modules it replaces (forward hooks that capture
features, pre-hooks, backward hooks): they run on the replacement, and their handles still remove them."""
import torch

import equikernels as ek
from equikernels._compat import o3


def test_hooks_on_a_replaced_module_still_run_and_remove():
    torch.manual_seed(0)
    model = torch.nn.Sequential(o3.Linear("4x0e+2x1o", "4x0e+2x1o"), o3.Linear("4x0e+2x1o", "3x0e"))
    seen, pre, grads = [], [], []
    handle = model[0].register_forward_hook(lambda m, args, out: seen.append(out.detach().clone()))
    model[0].register_forward_pre_hook(lambda m, args: pre.append(args[0].shape))
    model[1].register_full_backward_hook(lambda m, gin, gout: grads.append(gout[0].clone()))
    x = torch.randn(5, 10, requires_grad=True)
    model(x).sum().backward()
    assert ek.accelerate(model).replaced_names == ["0", "1"]
    model(x).sum().backward()
    assert len(seen) == len(pre) == len(grads) == 2
    torch.testing.assert_close(seen[1], seen[0])
    torch.testing.assert_close(grads[1], grads[0])
    handle.remove()
    model(x)
    assert len(seen) == 2 and len(pre) == 3
