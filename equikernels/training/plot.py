"""The end-of-run figure: training loss per step, validation errors per evaluation."""
from __future__ import annotations

import os
from typing import Dict, List


def plot_history(history: Dict[str, List], path: str) -> str:
    import matplotlib

    matplotlib.use("Agg")  # files only; never needs a display
    import matplotlib.pyplot as plt

    fig, (ax_loss, ax_err) = plt.subplots(1, 2, figsize=(11, 4))
    steps = [row["step"] for row in history["train"]]
    ax_loss.plot(steps, [row["loss"] for row in history["train"]], lw=0.8, label="train (per step)")
    evals = history["valid"]
    if evals:
        ax_loss.plot([r["step"] for r in evals], [r["loss"] for r in evals], "o-", label="validation")
    ax_loss.set_yscale("log")
    ax_loss.set_xlabel("optimiser step")
    ax_loss.set_ylabel("loss")
    ax_loss.legend()
    units = {"energy_per_atom": ("E/atom", "meV/atom"), "forces": ("F", "meV/Å"), "stress": ("stress", "meV/Å³")}
    for prop, (label, unit) in units.items():
        key = f"rmse_{prop}"
        pts = [(r["step"], 1000.0 * r[key]) for r in evals if key in r]
        if pts:
            ax_err.plot(*zip(*pts), "o-", label=f"RMSE {label} [{unit}]")
    ax_err.set_yscale("log")
    ax_err.set_xlabel("optimiser step")
    ax_err.set_ylabel("validation RMSE")
    if evals:
        ax_err.legend()
    fig.tight_layout()
    tmp = f"{path}.tmp{os.getpid()}"  # written whole, then renamed: a failed write leaves the earlier figure
    try:
        fig.savefig(tmp, dpi=110, format="png")
        os.replace(tmp, path)
    finally:
        plt.close(fig)
        if os.path.exists(tmp):
            os.remove(tmp)
    return path
