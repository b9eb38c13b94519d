"""``equikernels plan``: print the kernel plan of a standard problem's or a model's tensor products (no GPU needed).

The plan is what the launcher runs on a CUDA device with the settings in force: the kernels in
launch order, with their generator choices, launch shape and buffer handling. With ``--model``,
every distinct tensor product of the model is listed with the modules that use it; a product run
inside the fused graph convolution (a MACE interaction block, TensorProductConv) is printed as the
convolution's plan, in the module's dataflow unless --dataflow is given. ``--conv`` /
``--dataflow`` print a standard problem's convolution plan."""
from __future__ import annotations

import argparse
from typing import Dict, List, Tuple

from .. import plan as _plan


def register(sub) -> None:
    p = sub.add_parser("plan", help="print the kernel plan of a standard problem or of a model's products",
                       description=__doc__.replace("``", "'"), formatter_class=argparse.RawDescriptionHelpFormatter)
    _plan.add_arguments(p)
    p.add_argument("--model", default=None, metavar="FILE",
                   help="a model file (ours or mace-torch) instead of a problem: plans each of its distinct "
                        "products, in each module's own layout unless --layout is given")
    p.set_defaults(func=run)


def _fused(module) -> bool:
    from ..models.blocks import InteractionBlock
    from ..nn.conv import TensorProductConv
    return isinstance(module, (InteractionBlock, TensorProductConv))


def _dataflow(module, args) -> str:
    """The dataflow a fused module runs: --dataflow, else its own ``dataflow`` resolved as a CUDA
    call here would resolve it (the autotuner may still pick the other fused one)."""
    from ..ops.conv import resolve_dataflow
    if args.dataflow:
        return args.dataflow
    return resolve_dataflow(getattr(module, "dataflow", "auto"), getattr(module, "deterministic", None), "triton")[0]


def model_products(model) -> Dict[Tuple[object, str], List[Tuple[str, object]]]:
    """(problem, layout) -> [(module name, module)] for the modules of ``model`` holding a ``TPProblem``."""
    from ..problem import TPProblem
    found: Dict[Tuple[object, str], List[Tuple[str, object]]] = {}
    for name, module in model.named_modules():
        problem = getattr(module, "problem", None)
        if isinstance(problem, TPProblem):
            found.setdefault((problem, getattr(module, "layout", "mul_ir")), []).append((name or "(model)", module))
    return found


def _batched(args: argparse.Namespace) -> argparse.Namespace:
    return argparse.Namespace(**dict(vars(args), conv=False, dataflow=None))


def model_text(path: str, args: argparse.Namespace) -> str:
    from ..models import load
    model = load(path, device="cpu")
    if args.dtype is None:  # the dtype the model runs in
        dtype = next((str(t.dtype).replace("torch.", "") for t in model.parameters() if t.is_floating_point()), None)
        args = argparse.Namespace(**dict(vars(args), dtype=dtype if dtype in ("float32", "float64") else None))
    products = model_products(model)
    if not products:
        return f"{path}: no tensor product modules"
    lines = [f"{path}: {len(products)} distinct tensor product(s)"]
    for i, ((problem, layout), users) in enumerate(products.items(), 1):
        lines.append(f"[{i}] used by " + ", ".join(f"{n} ({type(m).__name__})" for n, m in users))
        fused = [m for _, m in users if _fused(m)]
        flows = sorted({_dataflow(m, args) for m in fused})
        if len(fused) < len(users) and fused:
            lines.append("    used as a batched product too:")
            lines.extend("    " + ln for ln in _plan.plan_text(problem, _batched(args), layout).splitlines())
        if not fused:
            lines.extend("    " + ln for ln in _plan.plan_text(problem, args, layout).splitlines())
        for flow in flows:
            names = ", ".join(sorted({type(m).__name__ for m in fused if _dataflow(m, args) == flow}))
            if flow == "unfused":  # gathered batched product + index_add
                lines.append(f"    runs as the unfused convolution ({names}): the batched product's plan")
                lines.extend("    " + ln for ln in _plan.plan_text(problem, _batched(args), layout).splitlines())
            else:
                lines.append(f"    runs inside the fused graph convolution ({names})")
                lines.extend("    " + ln for ln in _plan.plan_text(problem, args, layout, flow).splitlines())
    return "\n".join(lines)


# the plan's parameter names -> this command's options, for its error messages
OPTIONS = {"need": "--need", "have": "--have", "direction": "--direction", "dtype": "--dtype", "layout": "--layout"}


def run(args) -> int:
    try:
        return _run(args)
    except ValueError as exc:
        from . import option_names  # noqa: PLC0415
        text = str(exc)
        named = option_names(text, OPTIONS)
        if named == text or (args.model and text.startswith(args.model)):  # a model file's error names the file
            raise
        raise type(exc)(named) from exc


def _run(args) -> int:
    from ..catalog import standard_problems
    from .show_settings import warn_unknown
    warn_unknown("plan")  # the plan shows the settings in force: a misspelt one is named
    _plan.check_direction_options(args.direction, args.need, args.have)
    if args.model and args.problem:
        raise ValueError(f"give a problem name or --model, not both (got {args.problem!r} and --model {args.model})")
    if args.model and args.conv:
        raise ValueError("--conv applies to a standard problem; with --model each product is planned as it runs "
                         "(a product inside the fused graph convolution as the convolution)")
    if args.model:
        print(model_text(args.model, args))
    elif args.problem is None:
        raise ValueError(f"give a standard problem ({', '.join(standard_problems())}) or --model FILE")
    else:
        print(_plan.run(args))
    return 0
