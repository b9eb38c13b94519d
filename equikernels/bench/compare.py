"""The regression guard: compare a benchmark run with a stored baseline of the same GPU kind.

A cell (one implementation of one measurement) regresses when its median is slower than the
baseline's by more than ``margin`` (relative) plus ``slack_ms`` (absolute)::

    current_ms > baseline_ms * (1 + margin) + slack_ms

Defaults: ``margin = 0.10`` and ``slack_ms = 0.05``. Reruns of unchanged code on machines of one GPU
kind agree to a few per cent on cells whose time is GPU time (clocks, the allocator and the
machine differ between runs); 10 % stays clear of that while a real regression (the kind the guard
exists for is 20 % and more) still stands out. Cells below a few tenths of a millisecond are bound
by host work, whose tens of microseconds vary more between processes than any relative margin can
absorb: the absolute slack covers them. A cell that ran in the baseline but failed or vanished in
the current run regresses too, and so does an equikernels result whose error against e3nn in
float64 exceeds its tolerance. A check that compared no cell at all fails: it vouches for nothing.
Runs on different GPU kinds are never compared; other torch, triton, CUDA or driver versions are
named in the summary.

A cell timed in several rounds (``ms_rounds``: the MACE, MD and training groups, whose cells are
bound by host work at 1,008 atoms) is judged against its baseline's slowest round: the rounds of one
process have differed by up to 45 % on such cells with unchanged code, and a slowdown inside the
baseline's own spread cannot be told from that noise. Cells of one round keep ``ms``. Measuring
with ``--check``, such a cell over its limit is first timed in more rounds (``bench.suite._rounds``).

Cells bound by host work (1,008-atom model calls, MD steps and training steps) follow the speed of
the machine's processor as much as the code. Each cell records its run's host probe (``host_us``,
microseconds to issue one tiny op); where both runs have it, a finding names the ratio and the
summary the median ratio, so that a slower host is told apart from slower code. The verdict does
not change with it.
"""
from __future__ import annotations

import json
import math
import re
import statistics
from dataclasses import dataclass, field
from pathlib import Path
from typing import Dict, Iterable, List, Optional, Sequence, Tuple, Union

DEFAULT_MARGIN = 0.10
DEFAULT_SLACK_MS = 0.05
SCHEMA = "equikernels-bench/1"
SIZED_GROUPS = ("mace", "md", "train")  # groups whose cells are per system size (``NNNNatoms`` in the id)


class GPUKindMismatch(ValueError):
    """The two runs were measured on different GPU kinds."""


@dataclass
class Finding:
    cell: str
    impl: str
    kind: str  # "slower" | "failed" | "skipped" | "missing" | "inaccurate"
    baseline_ms: Optional[float]
    current_ms: Optional[float]
    detail: str

    def line(self) -> str:
        return f"{self.kind:<10} {self.cell} [{self.impl}]: {self.detail}"


@dataclass
class Comparison:
    gpu_kind: str
    margin: float
    slack_ms: float
    compared: int = 0
    findings: List[Finding] = field(default_factory=list)
    faster: List[Tuple[str, str, float]] = field(default_factory=list)  # (cell, impl, ratio) beyond the margin
    new_cells: List[str] = field(default_factory=list)
    out_of_scope: int = 0  # baseline cells of groups / problems this run did not measure
    host_ratios: List[float] = field(default_factory=list)  # current / baseline host probe, per compared cell
    notes: List[str] = field(default_factory=list)  # what differs between the runs besides the code
    guarded: Optional[Tuple[str, ...]] = None  # the implementations guarded (None: all)
    baseline_guarded: int = -1  # the baseline's measured cells of the guarded implementations (-1: not counted)

    @property
    def ok(self) -> bool:
        """No finding, and at least one cell compared: a check that compared nothing vouches for nothing."""
        return not self.findings and self.compared > 0

    def summary(self) -> str:
        head = (f"compared {self.compared} cells on {self.gpu_kind} (slower than baseline x {1 + self.margin:.2f}"
                f" + {self.slack_ms:g} ms counts as a regression)")
        lines = [head] + [f"  note: {n}" for n in self.notes]
        if self.host_ratios:
            r = statistics.median(self.host_ratios)
            lines.append(f"  host probe: this run's processor took {r:.2f}x the baseline's time to issue work "
                         "(median over compared cells; host-bound cells follow it)")
        lines += [f"  {f.line()}" for f in self.findings]
        if self.faster:
            lines.append(f"  {len(self.faster)} cells faster than the baseline beyond the margin "
                         "(refresh the baseline deliberately if this is the new normal)")
        if self.new_cells:
            lines.append(f"  {len(self.new_cells)} cells not in the baseline (not compared)")
        if self.out_of_scope:
            lines.append(f"  {self.out_of_scope} baseline cells outside this run's groups, problems and sizes "
                         "or the cells a --quick run and a full one share (not compared)")
        if self.ok:
            lines.append("OK: no regression")
        elif not self.findings and self.baseline_guarded == 0:
            which = "" if self.guarded is None else " " + "/".join(self.guarded)
            lines.append(f"FAIL: the baseline holds no measured{which} cell (none with status ok), so there is "
                         "nothing to compare against: check against a baseline of a run that measured them")
        elif not self.findings:
            lines.append("FAIL: no guarded cell of the baseline was measured in this run, so nothing was compared "
                         "(run the groups, problems and sizes the baseline holds)")
        else:
            kinds: Dict[str, int] = {}
            for f in self.findings:
                kinds[f.kind] = kinds.get(f.kind, 0) + 1
            lines.append(f"FAIL: {len(self.findings)} guarded cell(s) not as good as the baseline ("
                         + ", ".join(f"{v} {k}" for k, v in kinds.items()) + ")")
        return "\n".join(lines)


def load_run(path: Union[str, Path], what: str = "benchmark results file") -> dict:
    """A benchmark JSON written by ``equikernels bench``; a clear error, naming ``what`` (the argument
    that gave the path) and the file, for anything else."""
    p = Path(path)
    where = f"{what} {str(p)!r}"
    if p.is_dir():
        raise IsADirectoryError(f"{where} is a folder; expected a JSON file written by 'equikernels bench' "
                                "(<gpu-kind>.json)")
    try:
        text = p.read_text()
        if not text.strip():
            raise ValueError(f"{where} is empty; expected a JSON file written by 'equikernels bench'")
        data = json.loads(text)
    except FileNotFoundError:
        raise FileNotFoundError(f"{where} does not exist") from None
    except UnicodeDecodeError:
        raise ValueError(f"{where} is not JSON (not UTF-8 text)") from None
    except json.JSONDecodeError as exc:
        raise ValueError(f"{where} is not JSON ({exc.msg} at line {exc.lineno})") from None
    if not isinstance(data, dict) or data.get("schema") != SCHEMA or not isinstance(data.get("cells"), list):
        found = f"schema {data.get('schema')!r}" if isinstance(data, dict) else f"a JSON {_json_type(data)}"
        raise ValueError(f"{where} is not an 'equikernels bench' result (expected schema {SCHEMA!r} and a "
                         f"'cells' list; found {found})")
    if not data.get("gpu_kind"):
        raise ValueError(f"{where} does not say which GPU kind it was measured on ('gpu_kind')")
    problem = _run_problem(data)
    if problem:
        raise ValueError(f"{where}: {problem}")
    seen: Dict[Tuple[str, str], int] = {}
    for i, c in enumerate(data["cells"]):
        problem = _cell_problem(c)
        if problem:
            raise ValueError(f"{where}: cells[{i}] {problem}")
        # two results for one cell: the guard would judge only the last and ignore the other
        j = seen.setdefault((c["id"], c["impl"]), i)
        if j != i:
            raise ValueError(f"{where}: cells[{i}] repeats cells[{j}] ({c['id']}, {c['impl']}); expected one "
                             "result per cell and implementation")
    return data


def _run_problem(data: dict) -> Optional[str]:
    """What is wrong with the fields of a result file besides its cells (None: usable)."""
    kind = data["gpu_kind"]
    # the kind names the written files: anything else could escape --out or name no file
    if not isinstance(kind, str) or not re.fullmatch(r"[a-z0-9][a-z0-9._-]*", kind):
        return (f"'gpu_kind' {kind!r} is not a GPU-kind name (lower-case letters, digits and '-', as "
                "'equikernels bench' writes it, e.g. 'nvidia-h200')")
    for key in ("env", "copy", "scope", "interrupted"):
        if data.get(key) is not None and not isinstance(data[key], dict):
            return f"{key!r} is a JSON {_json_type(data[key])}; expected an object"
    merged = data.get("merged")
    if merged is not None and (not isinstance(merged, list) or not all(isinstance(m, dict) for m in merged)):
        return f"'merged' is {str(merged)[:60]!r}; expected a list of objects (one per joined run)"
    # the report and the merge notes read each run's versions and groups from these objects
    runs = [("'env'", data.get("env") or {})] + [(f"'merged'[{i}]", m) for i, m in enumerate(merged or ())]
    for where, info in runs:
        value = info.get("equikernels")
        if value is not None and not isinstance(value, dict):
            return f"{where} 'equikernels' is a JSON {_json_type(value)}; expected an object"
        for key in VERSION_KEYS:
            if info.get(key) is not None and not isinstance(info[key], (str, int, float)):
                return f"{where} {key!r} is a JSON {_json_type(info[key])}; expected a version"
        groups = info.get("groups")
        if groups is not None and (not isinstance(groups, list) or not all(isinstance(g, str) for g in groups)):
            return f"{where} 'groups' is {str(groups)[:60]}; expected a list of names"
    scope = data.get("scope") or {}
    for key, item, what in (("groups", str, "names"), ("problems", str, "names"), ("atoms", int, "atom counts")):
        if key not in scope or (key == "atoms" and scope[key] is None):  # null atoms: every size
            continue
        value = scope[key]
        # a string would be searched by substring ("md" in "mace,md"), silently widening the scope
        if not isinstance(value, list) or not all(isinstance(v, item) and not isinstance(v, bool) for v in value):
            return f"'scope' {key!r} is {value!r}; expected a list of {what}"
    if data.get("quick") is not None and not isinstance(data["quick"], bool):
        return f"'quick' is {data['quick']!r}; expected true or false"
    wall = data.get("wall_s")
    if wall is not None and not _is_number(wall):
        return f"'wall_s' is {wall!r}; expected seconds"
    return None


def _json_type(value) -> str:
    """The JSON name of a parsed value's type, for messages about files."""
    names = ((bool, "boolean"), (dict, "object"), (list, "array"), (str, "string"), ((int, float), "number"))
    return "null" if value is None else next((n for t, n in names if isinstance(value, t)), type(value).__name__)


def _is_number(value) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool)


def _time(value) -> bool:
    """A measured time: a finite number > 0."""
    return _is_number(value) and math.isfinite(value) and value > 0


def _cell_problem(c) -> Optional[str]:
    """What is wrong with one cell of a result file (None: usable by compare, merge and the report)."""
    if not isinstance(c, dict):
        return f"is not an object (found a JSON {_json_type(c)})"
    for key in ("id", "impl", "status"):
        if not isinstance(c.get(key), str) or not c[key]:
            return f"has no {key!r} string"
    if "/" not in c["id"]:
        return f"id {c['id']!r} is not '<group>/...'"
    if c.get("group") is not None and not isinstance(c["group"], str):
        return f"({c['id']}, {c['impl']}) has 'group' {c['group']!r}; expected a group name"
    if c["status"] == "ok":
        ms = c.get("ms")
        if not _time(ms):
            return f"({c['id']}, {c['impl']}) has status 'ok' but 'ms' {ms!r}; expected a time > 0"
        rounds = c.get("ms_rounds")
        # an infinite baseline round would lift the limit of that cell out of reach
        if rounds is not None and (not isinstance(rounds, list) or not all(_time(r) for r in rounds)):
            return f"({c['id']}, {c['impl']}) has 'ms_rounds' {rounds!r}; expected a list of times > 0"
    for key in ("err", "tol", "host_us", "gbps"):  # gbps: the bandwidth plot's bars
        if c.get(key) is not None and not _is_number(c[key]):
            return f"({c['id']}, {c['impl']}) has {key!r} {c[key]!r}; expected a number"
    if c.get("host_us") is not None and not _time(c["host_us"]):
        return f"({c['id']}, {c['impl']}) has 'host_us' {c['host_us']!r}; expected microseconds > 0"
    return None


def _index(cells: Iterable[dict]) -> Dict[Tuple[str, str], dict]:
    return {(c["id"], c["impl"]): c for c in cells}


def in_scope(cell: dict, scope: Optional[dict]) -> bool:
    """Whether a run of ``scope`` (its ``"groups"``, batched-product ``"problems"`` and, where given,
    the ``"atoms"`` of the mace, md and train groups; None: every cell) measures ``cell``."""
    if not scope:
        return True
    group = cell.get("group") or cell["id"].split("/")[0]
    if group not in scope.get("groups", ()):
        return False
    if group in SIZED_GROUPS and scope.get("atoms") is not None:
        m = re.search(r"/(\d+)atoms/", cell["id"])
        return m is None or int(m.group(1)) in scope["atoms"]
    return group != "tp" or cell["id"].split("/")[1] in scope.get("problems", ())


def _id_slots(cells: Iterable[dict]) -> Dict[Tuple[str, int, int], set]:
    """(group, id length, position) -> the id segments found there among ``cells``."""
    slots: Dict[Tuple[str, int, int], set] = {}
    for c in cells:
        parts = c["id"].split("/")
        for i, part in enumerate(parts[1:], 1):
            slots.setdefault((parts[0], len(parts), i), set()).add(part)
    return slots


def _quick_measures(cell: dict, slots: Dict[Tuple[str, int, int], set]) -> bool:
    """Whether a ``--quick`` run whose cell ids gave ``slots`` measures a cell like ``cell`` of a full
    run: each segment of its id (problem, dtype, rows or size, direction or mode) occurs at its place
    in the run's ids of that group. A group of which the run has no cell at all counts as measured,
    so that a vanished group is still reported."""
    parts = cell["id"].split("/")
    keys = [(parts[0], len(parts), i) for i in range(1, len(parts))]
    if keys and keys[0] not in slots:
        return True
    return all(part in slots.get(k, ()) for k, part in zip(keys, parts[1:]))


VERSION_KEYS = ("torch", "torch_cuda", "triton", "driver")  # what besides the code moves a GPU timing
UNMEASURED = ("skipped", "absent")  # statuses of cells a run did not time: the time budget ran out, no library


def version_changes(before: Optional[dict], after: Optional[dict]) -> List[str]:
    """``"torch 2.11.0 -> 2.13.0"`` for each of ``VERSION_KEYS`` that both environments name and differ in."""
    before, after = before or {}, after or {}
    return [f"{k} {before[k]} -> {after[k]}" for k in VERSION_KEYS
            if before.get(k) is not None and after.get(k) is not None and before[k] != after[k]]


def replacements(runs: Sequence[dict]) -> List[Tuple[str, str, str, str]]:
    """The cells ``merge(runs)`` takes from a later run over an earlier one's, as (id, impl, earlier
    status, later status)."""
    seen: Dict[Tuple[str, str], str] = {}
    out = []
    for r in runs:
        for key, c in _index(r["cells"]).items():
            if key in seen and c["status"] not in UNMEASURED:
                out.append((key[0], key[1], seen[key], c["status"]))
            if key not in seen or c["status"] not in UNMEASURED:
                seen[key] = c["status"]
    return out


def merge(runs: Sequence[dict]) -> dict:
    """One run of several runs of one GPU kind (e.g. a suite measured group by group): the cells of
    all, a later run's cell replacing an earlier one of the same id and implementation unless the
    later one was not measured (skipped, or its library absent in that run); the scopes united;
    ``env`` of the first, ``merged`` listing each run's date, versions, wall time and groups (a run
    that is itself a merge contributes its own list)."""
    if not runs:
        raise ValueError("merge: expected at least one run")
    kinds = {r["gpu_kind"] for r in runs}
    if len(kinds) != 1:
        raise GPUKindMismatch(f"merge: runs of different GPU kinds {sorted(kinds)} cannot be one baseline")
    cells: Dict[Tuple[str, str], dict] = {}
    groups: List[str] = []
    problems: List[str] = []
    atoms: Optional[List[int]] = []
    for r in runs:
        for key, c in _index(r["cells"]).items():
            if c.get("status") not in UNMEASURED or key not in cells:
                cells[key] = c
        scope = r.get("scope") or {"groups": sorted({c.get("group", c["id"].split("/")[0]) for c in r["cells"]}),
                                   "problems": sorted({c["id"].split("/")[1] for c in r["cells"]
                                                       if c["id"].startswith("tp/")})}
        groups += [g for g in scope.get("groups", ()) if g not in groups]
        problems += [p for p in scope.get("problems", ()) if p not in problems]
        # a run without an "atoms" entry measured every size: the union is then unrestricted
        atoms = None if scope.get("atoms") is None or atoms is None else sorted(set(atoms) | set(scope["atoms"]))
    first = runs[0]
    return {"schema": SCHEMA, "gpu_kind": first["gpu_kind"], "quick": any(r.get("quick") for r in runs),
            "env": first.get("env", {}), "copy": first.get("copy", {}), "cells": list(cells.values()),
            "scope": {"groups": groups, "problems": problems, **({} if atoms is None else {"atoms": atoms})},
            "merged": [m for r in runs for m in (r.get("merged") or [_summary(r)])],
            "wall_s": round(sum(float(r.get("wall_s") or 0) for r in runs), 1)}


def _summary(run: dict) -> dict:
    env = run.get("env") or {}
    return {"date_utc": env.get("date_utc"), "equikernels": env.get("equikernels"), "wall_s": run.get("wall_s"),
            "groups": (run.get("scope") or {}).get("groups"), **{k: env.get(k) for k in VERSION_KEYS if k in env}}


def limit_ms(base_cell: dict, margin: float = DEFAULT_MARGIN, slack_ms: float = DEFAULT_SLACK_MS) -> float:
    """The slowest time a measured cell may take against this baseline cell (an ``ok`` one)."""
    return max([float(base_cell["ms"])] + [float(r) for r in base_cell.get("ms_rounds") or ()]) * (1 + margin) \
        + slack_ms


def limits(baseline: dict, *, margin: float = DEFAULT_MARGIN, slack_ms: float = DEFAULT_SLACK_MS,
           impls: Optional[Iterable[str]] = ("equikernels",)) -> Dict[Tuple[str, str], float]:
    """``{(cell id, impl): limit_ms}`` for the baseline's guarded ``ok`` cells."""
    guarded = None if impls is None else set(impls)
    return {key: limit_ms(b, margin, slack_ms) for key, b in _index(baseline["cells"]).items()
            if b.get("status") == "ok" and (guarded is None or key[1] in guarded)}


def compare(baseline: dict, current: dict, *, margin: float = DEFAULT_MARGIN, slack_ms: float = DEFAULT_SLACK_MS,
            impls: Optional[Iterable[str]] = ("equikernels",)) -> Comparison:
    """Compare ``current`` with ``baseline`` (both as written by ``equikernels bench``).

    ``impls``: which implementations are guarded (default: equikernels only; None: all). Baseline
    cells outside ``current``'s scope (groups, problems and system sizes it was asked to run) are not compared,
    nor, for a ``--quick`` run against a full baseline (or a full run against a ``--quick`` one),
    baseline cells of rows, sizes, dtypes or modes the run does not time.
    Raises ``GPUKindMismatch`` when the runs come from different GPU kinds."""
    for name, value in (("margin", margin), ("slack_ms", slack_ms)):
        if not (math.isfinite(value) and value >= 0):  # NaN would pass every cell
            raise ValueError(f"{name}: expected a finite number >= 0, got {value}")
    kb, kc = baseline.get("gpu_kind"), current.get("gpu_kind")
    if kb != kc:
        raise GPUKindMismatch(f"the baseline was measured on {kb!r} and this run on {kc!r}: timings of different "
                              "GPU kinds are not comparable (use benchmarks/baselines/<gpu-kind>.json of this GPU)")
    guarded = None if impls is None else set(impls)
    base, cur = _index(baseline["cells"]), _index(current["cells"])
    # --quick measures other rows, sizes, dtypes and modes than a full run: compare what both measured
    quick = _id_slots(current["cells"]) if current.get("quick") and not baseline.get("quick") else None
    # a full run lists every cell it planned (failures too): a --quick baseline's cell it lacks is one it
    # does not time, unless the run has no cell of that group at all
    quick_base = {c["id"].split("/")[0] for c in current["cells"]} if baseline.get("quick") and not current.get(
        "quick") else set()
    res = Comparison(gpu_kind=str(kc), margin=margin, slack_ms=slack_ms,
                     guarded=None if guarded is None else tuple(sorted(guarded)),
                     baseline_guarded=sum(1 for (_, impl), b in base.items() if b.get("status") == "ok"
                                          and (guarded is None or impl in guarded)))
    changed = version_changes(baseline.get("env"), current.get("env"))
    if changed:
        res.notes.append("measured with other versions than the baseline (" + ", ".join(changed)
                         + "): a slower cell may be theirs, not the code's")
    if current.get("interrupted"):
        res.notes.append(f"this run was interrupted after {current['interrupted'].get('after_s')} s: the cells it "
                         "did not reach count as missing")
    for key in sorted(set(base) | set(cur)):
        cid, impl = key
        if guarded is not None and impl not in guarded:
            continue
        b, c = base.get(key), cur.get(key)
        if c is None and b is not None and (not in_scope(b, current.get("scope"))
                                            or (quick is not None and not _quick_measures(b, quick))
                                            or cid.split("/")[0] in quick_base):
            res.out_of_scope += 1
            continue
        if c is not None and c.get("status") == "ok" and c.get("err") is not None and c.get("tol") is not None \
                and not c["err"] <= c["tol"]:
            res.findings.append(Finding(cid, impl, "inaccurate", None, c.get("ms"),
                                        f"error against e3nn (float64) {c['err']:.2e} > tolerance {c['tol']:.0e}"))
        if b is None or b.get("status") != "ok":
            if c is not None and c.get("status") == "ok":
                res.new_cells.append(cid)
            continue
        if c is None:
            res.findings.append(Finding(cid, impl, "missing", b.get("ms"), None, "in the baseline, not in this run"))
            continue
        if c.get("status") == "skipped":  # not measured: the guard cannot vouch for it
            res.findings.append(Finding(cid, impl, "skipped", b.get("ms"), None,
                                        f"not measured ({c.get('error', 'skipped')}): run it again with more "
                                        "--time-budget-s, or none"))
            continue
        if c.get("status") != "ok":
            res.findings.append(Finding(cid, impl, "failed", b.get("ms"), None,
                                        f"status {c.get('status')!r}: {c.get('error', '')}"[:300]))
            continue
        res.compared += 1
        bm, cm = float(b["ms"]), float(c["ms"])
        limit = limit_ms(b, margin, slack_ms)
        host = None
        if b.get("host_us") and c.get("host_us"):
            host = float(c["host_us"]) / float(b["host_us"])
            res.host_ratios.append(host)
        if cm > limit:
            note = "" if host is None else f"; host probe {host:.2f}x the baseline's"
            res.findings.append(Finding(cid, impl, "slower", bm, cm, f"{cm:.4g} ms vs baseline {bm:.4g} ms "
                                        f"({cm / bm:.2f}x; limit {limit:.4g} ms{note})"))
        elif cm < bm * (1 - margin) - slack_ms:
            res.faster.append((cid, impl, cm / bm))
    return res
