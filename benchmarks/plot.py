#!/usr/bin/env python
"""Bar chart of a bench_tp.py result JSON (matplotlib is optional).

    python benchmarks/plot.py RESULT.json [--out chart.png]

One panel per (dtype, direction, rows); problems on the x axis; one bar per implementation,
height = median time in ms (log scale). Failed / absent cells get no bar but an 'x' marker at the
bottom of the panel, so a missing bar is never mistaken for a fast one.
"""
from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import Optional

ORDER = ("equikernels", "equikernels_ir_mul", "e3nn", "cue_ir_mul", "cue_mul_ir", "oeq")
COLORS = {"equikernels": "#d62728", "equikernels_ir_mul": "#ff9896", "e3nn": "#7f7f7f",
          "cue_ir_mul": "#2ca02c", "cue_mul_ir": "#98df8a", "oeq": "#1f77b4"}


def plot_results(data: dict, png_path) -> Optional[str]:
    """Write the chart; return its path, or None when matplotlib is not installed."""
    try:
        import matplotlib
        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except Exception as exc:  # optional dependency
        print(f"plot: matplotlib unavailable ({type(exc).__name__}); no PNG written", file=sys.stderr)
        return None
    cells = data.get("cells", [])
    if not cells:
        return None
    panels = []
    for c in cells:
        k = (c["dtype"], c["direction"], c["rows"])
        if k not in panels:
            panels.append(k)
    problems = []
    for c in cells:
        if c["problem"] not in problems:
            problems.append(c["problem"])
    impls = [i for i in ORDER if any(c["impl"] == i for c in cells)]
    by = {(c["dtype"], c["direction"], c["rows"], c["problem"], c["impl"]): c for c in cells}
    ncols = 1 if len(panels) == 1 else 2
    nrows = (len(panels) + ncols - 1) // ncols
    fig, axes = plt.subplots(nrows, ncols, figsize=(max(7.0, 1.3 * len(problems) * ncols + 2), 3.6 * nrows),
                             squeeze=False)
    width = 0.8 / max(1, len(impls))
    for ax, (dt, dr, rows) in zip(axes.flat, panels):
        for j, impl in enumerate(impls):
            xs, ys, miss = [], [], []
            for i, p in enumerate(problems):
                c = by.get((dt, dr, rows, p, impl))
                x = i - 0.4 + (j + 0.5) * width
                if c is None:
                    continue
                if c["status"] == "ok":
                    xs.append(x)
                    ys.append(c["ms_median"])
                else:
                    miss.append(x)
            ax.bar(xs, ys, width, label=impl, color=COLORS.get(impl))
            if miss:
                ax.plot(miss, [0] * len(miss), "x", color=COLORS.get(impl), transform=ax.get_xaxis_transform(),
                        clip_on=False, markersize=6)
        ax.set_yscale("log")
        ax.set_title(f"{dt} {dr} ({rows} rows)", fontsize=10)
        ax.set_ylabel("ms (median)")
        ax.set_xticks(range(len(problems)))
        ax.set_xticklabels(problems, rotation=30, ha="right", fontsize=8)
        ax.set_axisbelow(True)
        ax.grid(axis="y", which="major", alpha=0.3)
    for ax in list(axes.flat)[len(panels):]:
        ax.axis("off")
    from matplotlib.patches import Patch
    handles = [Patch(color=COLORS.get(i), label=i) for i in impls]
    env = data.get("env", {})
    top = 1 - 0.9 / fig.get_figheight()  # keep ~0.9 inch for the title and the legend
    fig.suptitle(f"batched tensor product — {env.get('gpu')} — {env.get('date_utc')}  (x = failed/absent)",
                 fontsize=10, y=1 - 0.15 / fig.get_figheight(), va="top")
    fig.legend(handles=handles, loc="upper center", ncol=len(impls), fontsize=8, frameon=False,
               bbox_to_anchor=(0.5, 1 - 0.45 / fig.get_figheight()))
    fig.tight_layout(rect=(0, 0, 1, top))
    fig.savefig(png_path, dpi=120)
    plt.close(fig)
    return str(png_path)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("json")
    ap.add_argument("--out", help="PNG path (default: the JSON path with .png)")
    a = ap.parse_args(argv)
    data = json.loads(Path(a.json).read_text())
    out = a.out or str(Path(a.json).with_suffix(".png"))
    made = plot_results(data, out)
    print(made or "no plot written")
    return 0 if made else 1


if __name__ == "__main__":
    sys.exit(main())
