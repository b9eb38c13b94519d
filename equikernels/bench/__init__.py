"""The benchmark suite behind ``equikernels bench``: equikernels side by side with e3nn, cuEquivariance
and OpenEquivariance (whichever are installed) on one GPU, every result checked against e3nn in
float64, and the regression guard that compares a run with a stored baseline of the same GPU kind.

``compare`` and ``report`` need no GPU; ``suite`` measures. Modules: ``timing`` (CUDA-event timing,
copy bandwidth, minimal traffic), ``environment`` (GPU kind and versions), ``tp`` / ``conv`` /
``mace`` (the implementations of each group), ``suite`` (the cells), ``report`` (markdown, plots),
``compare`` (the guard).
"""
from .compare import DEFAULT_MARGIN, DEFAULT_SLACK_MS, GPUKindMismatch, compare, load_run

__all__ = ["compare", "load_run", "GPUKindMismatch", "DEFAULT_MARGIN", "DEFAULT_SLACK_MS"]
