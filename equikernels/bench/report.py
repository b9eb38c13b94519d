"""Report of a benchmark run: the markdown table and the plots (speed-up over each baseline; achieved
bandwidth of equikernels against the measured device-to-device copy)."""
from __future__ import annotations

from collections import OrderedDict
from pathlib import Path
from typing import Dict, List, Optional

from .._files import atomic_write
from .compare import VERSION_KEYS
from .timing import fmt_ms

IMPL_ORDER = ("equikernels", "cuequivariance", "mace-cueq", "openequivariance", "mace-oeq", "e3nn", "mace-e3nn")
TITLES = {"tp": "Batched tensor product", "conv": "Graph convolution (float32)",
          "mace": "MACE-MP-medium shape, one model call",
          "md": "MD through ASE, MACE-MP-medium shape, float32 (milliseconds per step)",
          "train": "MACE training step, E+F loss, backward and Adam (milliseconds per step)", "model": "User model"}
MIXED_TRAIN, FP32_TRAIN = "train/bf16-mixed/", "train/fp32/"  # only our model has a mixed-precision step


def _by_cell(cells: List[dict]) -> "OrderedDict[str, Dict[str, dict]]":
    rows: "OrderedDict[str, Dict[str, dict]]" = OrderedDict()
    for c in cells:
        rows.setdefault(c["id"], {})[c["impl"]] = c
    return rows


def speedups(cells: List[dict]) -> List[dict]:
    """Per cell: equikernels' ms and its speed-up over every baseline that ran (baseline ms / ours)."""
    out = []
    for cid, impls in _by_cell(cells).items():
        ours = impls.get("equikernels")
        if not ours or ours.get("status") != "ok":
            continue
        sp = {name: c["ms"] / ours["ms"] for name, c in impls.items()
              if name != "equikernels" and c.get("status") == "ok" and ours["ms"] > 0}
        out.append({"id": cid, "ms": ours["ms"], "speedup": sp})
    return out


def _baseline_ms(row: Dict[str, dict]) -> List[float]:
    """The measured times of one row's accelerated baselines (e3nn and mace-torch with e3nn not among them)."""
    return [c["ms"] for n, c in row.items() if n != "equikernels" and c.get("status") == "ok"
            and not n.endswith("e3nn")]


def _fmt_cell(c: Optional[dict]) -> str:
    if c is None:
        return "–"
    if c.get("status") != "ok":
        return c.get("status", "?")
    s = fmt_ms(c["ms"])
    if c.get("err") is not None and c.get("tol") is not None and not c["err"] <= c["tol"]:
        s += f" (err {c['err']:.0e}!)"
    return s


def _group(cell: dict) -> str:
    return cell.get("group") or cell["id"].split("/")[0]


def _copy_gbps(data: dict) -> Optional[float]:
    """The run's device-to-device copy bandwidth (absent from runs joined from files without it)."""
    gbps = (data.get("copy") or {}).get("gbps_median")
    return float(gbps) if isinstance(gbps, (int, float)) and gbps > 0 else None


def _other_versions(run: dict, env: dict) -> str:
    """``"; torch 2.13.0"`` for each version in which a joined run differs from the header's environment."""
    return "".join(f"; {k} {run[k]}" for k in VERSION_KEYS
                   if run.get(k) is not None and env.get(k) is not None and run[k] != env[k])


def markdown(data: dict) -> str:
    env = data.get("env") or {}
    copy = _copy_gbps(data)
    lines = [f"# equikernels bench: {env.get('gpu')}", "",
             f"{env.get('date_utc')}; torch {env.get('torch')} (CUDA {env.get('torch_cuda')}), triton "
             f"{env.get('triton')}, e3nn {env.get('e3nn')}, cuequivariance_torch {env.get('cuequivariance_torch')}, "
             f"openequivariance {env.get('openequivariance')}, mace-torch {env.get('mace_torch')}; equikernels "
             f"{(env.get('equikernels') or {}).get('version')} ({(env.get('equikernels') or {}).get('git_commit')})."
             + ("" if copy is None else f" Device-to-device copy: {copy:.0f} GB/s."), "",
             "Milliseconds per call (median of CUDA-event timings, host work included); `absent`: library "
             "not installed; `err ...!`: error against e3nn in float64 above tolerance.", ""]
    if data.get("interrupted"):
        lines += [f"Interrupted after {data['interrupted'].get('after_s')} s: only the cells measured before "
                  "that are listed.", ""]
    if data.get("merged"):
        lines += [f"Joined from {len(data['merged'])} runs (a later run's cells replace an earlier one's):", ""]
        lines += [f"- {m.get('date_utc')}: {', '.join(m.get('groups') or ['?'])}; equikernels "
                  f"{(m.get('equikernels') or {}).get('git_commit')}" + _other_versions(m, env)
                  for m in data["merged"]] + [""]
    groups: "OrderedDict[str, List[dict]]" = OrderedDict()
    for c in data["cells"]:
        groups.setdefault(_group(c), []).append(c)
    for g, cells in groups.items():
        impls = [i for i in IMPL_ORDER if any(c["impl"] == i for c in cells)]
        lines += [f"## {TITLES.get(g, g)}", "",
                  "| cell | " + " | ".join(impls) + " | speed-up vs fastest baseline | error (ours) |",
                  "|---|" + "---:|" * (len(impls) + 2)]
        rows = _by_cell(cells)
        stand_in = False
        for cid, row in rows.items():
            ours = row.get("equikernels")
            base, mark = _baseline_ms(row), ""
            if not base and cid.startswith(MIXED_TRAIN) and cid.replace(MIXED_TRAIN, FP32_TRAIN, 1) in rows:
                base, mark = _baseline_ms(rows[cid.replace(MIXED_TRAIN, FP32_TRAIN, 1)]), "†"
                stand_in = stand_in or bool(base)
            sp = (f"{min(base) / ours['ms']:.2f}x{mark}" if base and ours and ours.get("status") == "ok" else "–")
            err = f"{ours['err']:.1e}" if ours and ours.get("err") is not None else "–"
            lines.append(f"| {cid.split('/', 1)[1]} | " + " | ".join(_fmt_cell(row.get(i)) for i in impls)
                         + f" | {sp} | {err} |")
        lines.append("")
        if stand_in:
            lines += ["† against the other libraries' float32 step of the same size and loss (they have no "
                      "mixed-precision mode).", ""]
    absent = sorted({f"{c['impl']}: {c.get('error')}" for c in data["cells"] if c["status"] == "absent"})
    if absent:
        lines += ["Absent:", ""] + [f"- {a}" for a in absent] + [""]
    return "\n".join(lines)


def _save(fig, path: Path) -> None:
    """``fig`` as a PNG renamed into place (an interrupted write leaves the earlier plot), then closed."""
    import matplotlib.pyplot as plt
    try:
        atomic_write(path, lambda tmp: fig.savefig(tmp, format="png", dpi=120))
    finally:
        plt.close(fig)


def plots(data: dict, out_dir: Path, stem: str) -> List[Path]:
    """Write ``<stem>_speedup.png`` and ``<stem>_bandwidth.png``, each renamed into place whole;
    returns the paths (none without matplotlib)."""
    try:
        import matplotlib
        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        return []
    written = []
    sp = speedups(data["cells"])
    baselines = [b for b in IMPL_ORDER[1:] if any(b in s["speedup"] for s in sp)]
    if sp and baselines:
        fig, ax = plt.subplots(figsize=(10, max(3, 0.28 * len(sp) + 1)))
        h = 0.8 / len(baselines)
        for k, b in enumerate(baselines):
            ys = [i + k * h for i in range(len(sp))]
            ax.barh(ys, [s["speedup"].get(b, 0) for s in sp], height=h, label=b)
        ax.set_yticks([i + 0.4 - h / 2 for i in range(len(sp))])
        ax.set_yticklabels([s["id"] for s in sp], fontsize=6)
        ax.axvline(1.0, color="k", lw=0.8)
        ax.set_xscale("log")
        ax.set_xlabel("speed-up of equikernels (baseline ms / equikernels ms; > 1: equikernels faster)")
        ax.invert_yaxis()
        ax.legend(fontsize=7)
        fig.tight_layout()
        p = out_dir / f"{stem}_speedup.png"
        _save(fig, p)
        written.append(p)
    copy = _copy_gbps(data)
    bw = [c for c in data["cells"] if c["impl"] == "equikernels" and c.get("status") == "ok" and c.get("gbps")]
    if bw and copy is not None:
        fig, ax = plt.subplots(figsize=(10, max(3, 0.22 * len(bw) + 1)))
        ax.barh(range(len(bw)), [100 * c["gbps"] / copy for c in bw])
        ax.set_yticks(range(len(bw)))
        ax.set_yticklabels([c["id"] for c in bw], fontsize=6)
        ax.axvline(100, color="k", lw=0.8)
        ax.set_xlabel(f"achieved bandwidth (minimal traffic / time), % of the device copy ({copy:.0f} GB/s)")
        ax.invert_yaxis()
        fig.tight_layout()
        p = out_dir / f"{stem}_bandwidth.png"
        _save(fig, p)
        written.append(p)
    return written
