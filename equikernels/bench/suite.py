"""The side-by-side suite of ``equikernels bench``: what it measures and the loop that measures it.

Groups (each cell is one implementation of one measurement, all in one process):

* ``tp``: the batched product, fwd / bwd / dbwd at 50,000 rows and dbwd at 20,000 rows, float32,
  on the standard problems of ``equikernels.catalog`` (nequip-revmd17-benzene only with
  ``--problems all``: its kernels take minutes to compile cold), and fwd / bwd / dbwd at 50,000 rows
  in float64 for ``F64_PROBLEMS``;
* ``conv``: the graph convolution at 10,192 Cu atoms (795,010 edges), fwd / bwd / dbwd, float32;
* ``mace``: MACE-MP-medium-shaped E+F and E+F+S at 1,008 and 10,192 atoms, float32 and float64;
  each cell timed in ``mace_rounds`` rounds, the implementations taking turns, the fastest counting;
* ``md``: ASE Langevin MD through each library's calculator, MACE-MP-medium shape, float32, at
  1,008 and 10,192 atoms (``bench.md``), ms per step; rounds as the ``mace`` group;
* ``train``: the MACE training step (E+F and E/F/S losses, backward into the parameters, Adam) at
  1,008 and 10,192 atoms, float32 for every library and bf16-mixed for equikernels (``bench.train``);
* ``model``: the user's ``--model`` file (equikernels only), E+F and E+F+S at 1,008 atoms.

``quick`` keeps three problems at 20,000 rows, the convolution at 1,008 atoms and float32 MACE at
1,008 atoms. Every result is checked against e3nn in float64; absent libraries are reported as
absent; a failing cell is reported with its error and never stops the run.
"""
from __future__ import annotations

import os
import time
from dataclasses import dataclass, field
from typing import Callable, Dict, List, Optional, Sequence, Tuple

import torch

from ..catalog import standard_problems
from . import conv as CV
from . import mace as MC
from . import md as MD
from . import train as TR
from . import timing as T
from . import tp as TP
from .compare import SCHEMA
from .environment import env_info, gpu_kind

FULL_PROBLEMS = ("mace-mp-medium-L2", "mace-large", "mace-medium", "nequip-water", "nequip-lips", "diffdock-L2",
                 "tetris-poly-1")
QUICK_PROBLEMS = ("mace-mp-medium-L2", "nequip-water", "tetris-poly-1")
# batched-product problems also timed in float64 (fwd / bwd / dbwd at the run's rows): the MACE-MP
# shape, whose float64 builds MD and relaxations run
F64_PROBLEMS = ("mace-mp-medium-L2",)
SYSTEMS = tuple(sorted(MC.SYSTEMS))  # atom counts of the mace, md and train groups; the neighbour count is the first's
TOL = {"float32": 1e-4, "float64": 1e-9}  # relative error against e3nn in float64
MACE_TOL = {"float32": 1e-4, "float64": 1e-8}
BF16_TOL = 5e-2  # bf16-mixed MACE forces against float64 (relative; bf16 keeps 8 mantissa bits)
DTYPES = {"float32": torch.float32, "float64": torch.float64}
ALL_IMPLS = ("equikernels", "e3nn", "cuequivariance", "openequivariance")
# the suite's implementation names for the MACE group
MACE_NAMES = {"equikernels": "equikernels", "e3nn": "mace-e3nn", "cuequivariance": "mace-cueq",
              "openequivariance": "mace-oeq"}


@dataclass
class Options:
    quick: bool = False
    problems: Sequence[str] = FULL_PROBLEMS
    impls: Sequence[str] = ALL_IMPLS
    groups: Sequence[str] = ("conv", "mace", "md", "tp", "train")
    model: Optional[str] = None
    target_ms: float = 200.0
    # MACE cells are timed this many times, the implementations taking turns; the fastest round
    # counts (a 1k-atom step is bound by host work, whose speed drifts between minutes)
    mace_rounds: int = 2
    # the --check baseline's limits {(cell id, impl): ms}: a rounded cell over its limit is timed again,
    # up to confirm_rounds more rounds, before the guard judges it
    limits: Optional[Dict[Tuple[str, str], float]] = None
    confirm_rounds: int = 3
    time_budget_s: Optional[float] = None
    tp_rows: Optional[int] = None  # overrides the row counts (small runs of the harness itself)
    conv_atoms: Optional[int] = None  # overrides the convolution's graph size (one of conv.REPEATS)
    systems: Optional[Sequence[int]] = None  # overrides the atom counts of the mace, md and train groups
    check_rows: int = 1000  # rows of the float64 check of the batched product
    log: Callable[[str], None] = print
    started: float = field(default_factory=time.perf_counter)

    def atom_counts(self) -> Tuple[int, ...]:
        """System sizes of the mace, md and train groups."""
        if self.systems is not None:
            return tuple(self.systems)
        return SYSTEMS[:1] if self.quick else SYSTEMS

    def out_of_time(self) -> bool:
        return self.time_budget_s is not None and time.perf_counter() - self.started > self.time_budget_s


def _cell(cid: str, group: str, impl: str, status: str, **kw) -> dict:
    return {"id": cid, "group": group, "impl": impl, "status": status, **kw}


def _timed(call, device, target_ms: float, nbytes: Optional[int] = None, gpu_time: bool = False) -> dict:
    T.free_memory(device)
    T.reset_peak(device)
    t = T.time_calls(call, device, target_ms=target_ms, min_reps=5, warmup=3)
    out = {"ms": t["ms_median"], "ms_p20": t["ms_p20"], "ms_p80": t["ms_p80"], "n": t["n"],
           "peak_gib": T.peak_gib(device)}
    if gpu_time:
        q = T.queued_gpu_times(call, device, t["est_ms"])
        if q.get("gpu_queued"):
            out["gpu_ms"] = q["gpu_ms_median"]
    if nbytes:
        out["bytes_min"] = nbytes
        out["gbps"] = nbytes / (out["ms"] * 1e-3) / 1e9
    return out


def _failed(exc: BaseException) -> dict:
    if isinstance(exc, TP.Absent):
        return {"status": "absent", "error": str(exc)}
    return {"status": "oom" if T.is_oom(exc) else "error", "error": T.describe_exception(exc)}


def _reference(opts: Options, group: str, model64, atoms, label: int, device, stress: bool) -> Optional[dict]:
    """Energy, forces (and stress) of mace-torch's float64 model on ``atoms``; None, logged, where it
    cannot run (it runs out of memory at 10k atoms on an 80 GB GPU)."""
    try:
        out = MC.step(model64, MC.graph(atoms, 6.0, MC.Z_ALL, torch.float64, device), stress)
        return {k: v.detach() for k, v in out.items() if k in ("energy", "forces", "stress") and v is not None}
    except Exception as exc:
        opts.log(f"{group} reference at {label} atoms failed: {T.describe_exception(exc, 160)}")
        return None
    finally:
        T.free_memory(device)


def _mp_model():
    """The float64 mace-torch model of the MACE and training groups, its average neighbour count that
    of the Cu crystal of ``SYSTEMS[0]`` atoms, whichever sizes run."""
    first = MC.cu_atoms(SYSTEMS[0])
    return MC.mace_model(MC.graph(first, 6.0, MC.Z_ALL, torch.float64, "cpu")["edge_index"].shape[1] / len(first))


def _rounds(opts: Options, group: str, jobs: Dict[Tuple[str, str], object], run_job) -> List[dict]:
    """The cells of ``jobs`` ({(cell id, impl): job, or a failure's cell fields}), each job timed once
    per round for ``opts.mace_rounds`` rounds, the jobs taking turns (host speed drifts between
    minutes). ``run_job(job)`` gives (timing fields with ``ms``, the cell's other fields); a cell keeps
    its fastest round and every round's ``ms``, a job that fails once keeps its failure.

    With ``opts.limits`` (the ``--check`` baseline's), a cell whose fastest round is over its limit is
    timed again, up to ``opts.confirm_rounds`` more rounds, every implementation of that measurement
    taking turns as before, until its fastest round is under the limit: host work slows whole rounds
    by up to half on some machines, and a slowdown that one more round does not reproduce is not the code's."""
    done: Dict[Tuple[str, str], dict] = {}

    def once(key, job) -> None:
        cid, impl = key
        prev = done.get(key)
        if isinstance(job, dict):
            done[key] = _cell(cid, group, impl, **job)
            return
        if prev is not None and prev["status"] != "ok":
            return
        if opts.out_of_time():
            if prev is None:
                done[key] = _cell(cid, group, impl, "skipped", error="time budget spent")
            return
        try:
            t, extra = run_job(job)
            rounds = (prev["ms_rounds"] if prev is not None else []) + [t["ms"]]
            if prev is not None and prev["ms"] <= t["ms"]:
                t = {k: prev[k] for k in t}
            done[key] = _cell(cid, group, impl, "ok", **t, **extra, ms_rounds=rounds)
        except Exception as exc:
            done[key] = _cell(cid, group, impl, **_failed(exc))

    def over() -> List[Tuple[str, str]]:
        return sorted(k for k, c in done.items() if opts.limits and k in opts.limits
                      and c["status"] == "ok" and c["ms"] > opts.limits[k])

    for _ in range(opts.mace_rounds):
        for key, job in jobs.items():
            once(key, job)
    for extra_round in range(opts.confirm_rounds):
        suspects = over()
        if not suspects or opts.out_of_time():
            break
        for key in suspects:
            opts.log(f"{key[0]} {key[1]}: {T.fmt_ms(done[key]['ms'])} ms, over the baseline's limit of "
                     f"{T.fmt_ms(opts.limits[key])} ms; timing it again ({extra_round + 1} of {opts.confirm_rounds})")
        again = {cid for cid, _ in suspects}
        for key, job in jobs.items():
            if key[0] in again:
                once(key, job)
    for c in done.values():
        opts.log(_line(c))
    return list(done.values())


def run_tp(opts: Options, device, cells: List[dict]) -> None:
    kws = standard_problems()
    rows = opts.tp_rows or (20000 if opts.quick else 50000)
    directions = [("fwd", rows), ("bwd", rows), ("dbwd", rows)]
    plan32 = directions + ([] if opts.quick or opts.tp_rows else [("dbwd", 20000)])
    for name in opts.problems:
        spec = TP.Spec.create(name, kws[name])
        inp, ref = TP.reference(spec, opts.check_rows, device)
        f64 = name in F64_PROBLEMS and not opts.quick
        for dname, plan in [("float32", plan32)] + ([("float64", directions)] if f64 else []):
            _run_tp_dtype(opts, device, cells, spec, inp, ref, dname, plan)


def _run_tp_dtype(opts: Options, device, cells: List[dict], spec, inp, ref, dname: str, plan) -> None:
    """The cells of one problem in one dtype: every implementation, each (direction, rows) of ``plan``."""
    name, dtype = spec.name, DTYPES[dname]
    for impl in [i for i in TP.IMPLS if i in opts.impls]:
        ids = [f"tp/{name}/{dname}/{r}/{d}" for d, r in plan]
        if opts.out_of_time():
            cells += [_cell(i, "tp", impl, "skipped", error="time budget spent") for i in ids]
            continue
        try:
            built = TP.build(impl, spec, dtype, device)
            errs = TP.errors(spec, built, dtype, inp, ref)
        except Exception as exc:
            fail = _failed(exc)
            cells += [_cell(i, "tp", impl, **fail) for i in ids]
            opts.log(f"tp {name:<20} {dname:<8} {impl:<17} {fail['status']}: {fail['error'][:120]}")
            continue
        for (d, r), cid in zip(plan, ids):
            try:
                call, _, nbytes = TP.make_call(spec, built, d, r, dtype, device)
                c = _cell(cid, "tp", impl, "ok", **_timed(call, device, opts.target_ms, nbytes, gpu_time=True),
                          err=TP.direction_error(errs, d), tol=TOL[dname])
                del call
            except Exception as exc:
                c = _cell(cid, "tp", impl, **_failed(exc))
            cells.append(c)
            opts.log(_line(c))
        del built
        T.free_memory(device)


def _conv_bytes(spec, n: int, e: int, direction: str, itemsize: int) -> int:
    """Minimal traffic of one convolution call: node rows once, edge rows once per pass."""
    k = {"fwd": 1, "bwd": 2, "dbwd": 3}[direction]
    kd3 = {"fwd": 1, "bwd": 1, "dbwd": 2}[direction]
    return itemsize * (k * (n * spec.d1 + e * (spec.d2 + spec.nw)) + kd3 * n * spec.d3)


def run_conv(opts: Options, device, cells: List[dict]) -> None:
    name = "mace-mp-medium-L2"
    spec = TP.Spec.create(name, standard_problems()[name])
    atoms = opts.conv_atoms or (1008 if opts.quick else 10192)
    dname, dtype = "float32", torch.float32
    s_src, s_dst, s_n = CV.cu_graph(256, device)
    inp, ref = CV.reference(spec, s_src, s_dst, s_n, device)
    src, dst, n = CV.cu_graph(atoms, device)
    e = len(src)
    for impl in [i for i in CV.IMPLS if i in opts.impls]:
        ids = {d: f"conv/{name}/{dname}/{atoms}atoms/{d}" for d in ("fwd", "bwd", "dbwd")}
        if opts.out_of_time():
            cells += [_cell(i, "conv", impl, "skipped", error="time budget spent") for i in ids.values()]
            continue
        try:
            fn = CV.build(impl, spec, s_src, s_dst, s_n, dtype, device)[0]
            errs = CV.errors(fn, dtype, inp, ref)
            _, raw, w_from = CV.build(impl, spec, src, dst, n, dtype, device)
            calls = CV.directions(raw, spec, e, n, w_from, dtype, device)
        except Exception as exc:
            fail = _failed(exc)
            cells += [_cell(i, "conv", impl, **fail) for i in ids.values()]
            opts.log(f"conv {impl:<17} {fail['status']}: {fail['error'][:120]}")
            continue
        for d, cid in ids.items():
            try:
                t = _timed(calls[d], device, opts.target_ms, _conv_bytes(spec, n, e, d, 4))
                c = _cell(cid, "conv", impl, "ok", edges=e, **t, err=TP.direction_error(errs, d), tol=TOL[dname])
            except Exception as exc:
                c = _cell(cid, "conv", impl, **_failed(exc))
            cells.append(c)
            opts.log(_line(c))
        del calls
        T.free_memory(device)


def run_mace(opts: Options, device, cells: List[dict]) -> None:
    systems = opts.atom_counts()
    dtypes = ("float32",) if opts.quick else ("float32", "float64")
    modes = (("E+F", False),) if opts.quick else (("E+F", False), ("E+F+S", True))
    impls = [MACE_NAMES[i] for i in ALL_IMPLS if i in opts.impls]
    ids = lambda dn, a: [f"mace/{dn}/{a}atoms/{m}" for m, _ in modes]  # noqa: E731
    try:
        ref64 = _mp_model()
    except Exception as exc:
        fail = _failed(exc)
        for dn in dtypes:
            for a in systems:
                cells += [_cell(i, "mace", impl, **fail) for i in ids(dn, a) for impl in impls]
        opts.log(f"mace: {fail['status']}: {fail['error'][:160]}")
        return
    ref_dev = None
    for dn in dtypes:
        dtype = DTYPES[dn]
        models: Dict[str, object] = {}
        for impl in impls:
            try:
                models[impl] = MC.build(impl, ref64, dtype, device)
            except Exception as exc:
                models[impl] = _failed(exc)
                opts.log(f"mace {dn} {impl:<12} {models[impl]['status']}: {models[impl]['error'][:120]}")
        for a in systems:
            atoms = MC.cu_atoms(a)
            data = MC.graph(atoms, 6.0, MC.Z_ALL, dtype, device)
            if ref_dev is None:
                ref_dev = MC.build("mace-e3nn", ref64, torch.float64, device)
            ref = _reference(opts, "mace", ref_dev, atoms, a, device, True)
            jobs: Dict[Tuple[str, str], object] = {}
            for impl, model in models.items():
                for (mode, stress), cid in zip(modes, ids(dn, a)):
                    if isinstance(model, dict):
                        jobs[(cid, impl)] = model
                        continue
                    try:  # the error once, before the rounds
                        err = (None if ref is None else
                               max(MC.errors(MC.step(model, data, stress), ref, stress).values()))
                        jobs[(cid, impl)] = (model, stress, err)
                    except Exception as exc:
                        jobs[(cid, impl)] = _failed(exc)

            def run_job(job, a=a, data=data, dn=dn):
                model, stress, err = job
                return (_timed(MC.step_call(model, data, stress), device, opts.target_ms),
                        dict(atoms=a, edges=int(data["edge_index"].shape[1]), err=err, tol=MACE_TOL[dn]))
            cells.extend(_rounds(opts, "mace", jobs, run_job))
            del data
            T.free_memory(device)
        del models
        T.free_memory(device)


def run_md(opts: Options, device, cells: List[dict]) -> None:
    systems = opts.atom_counts()
    dn = "float32"
    impls = [MACE_NAMES[i] for i in ALL_IMPLS if i in opts.impls and MACE_NAMES[i] in MD.CALCULATORS]
    ids = {a: f"md/{dn}/{a}atoms/step" for a in systems}
    try:
        ref64 = MD.md_model(torch.float64)
        model64 = MC.build("mace-e3nn", ref64, torch.float64, device)
    except Exception as exc:
        fail = _failed(exc)
        cells += [_cell(ids[a], "md", impl, **fail) for a in systems for impl in impls]
        opts.log(f"md: {fail['status']}: {fail['error'][:160]}")
        return
    for a in systems:
        atoms = MC.cu_atoms(a)
        ref = _reference(opts, "md", model64, atoms, a, device, False)
        jobs: Dict[Tuple[str, str], object] = {}
        for impl in impls:
            try:
                calc = MD.calculator(impl, ref64, dn, device)
                err = None if ref is None else MD.force_error(calc, atoms, ref["forces"].cpu().numpy())
                jobs[(ids[a], impl)] = (MD.step_runner(calc, atoms), err)
            except Exception as exc:
                jobs[(ids[a], impl)] = _failed(exc)

        def run_job(job, a=a):
            T.reset_peak(device)
            t = job[0](10 * opts.target_ms)
            return dict(t, peak_gib=T.peak_gib(device)), dict(atoms=a, err=job[1], tol=MACE_TOL[dn])
        cells.extend(_rounds(opts, "md", jobs, run_job))
        del jobs
        T.free_memory(device)


def run_train(opts: Options, device, cells: List[dict]) -> None:
    systems = opts.atom_counts()
    modes = (("E+F", False),) if opts.quick else (("E+F", False), ("E+F+S", True))
    variants = [("fp32", MACE_NAMES[i]) for i in ALL_IMPLS if i in opts.impls]
    if "equikernels" in opts.impls:
        variants.append(("bf16-mixed", "equikernels"))
    ids = lambda p, a: [f"train/{p}/{a}atoms/{m}" for m, _ in modes]  # noqa: E731
    try:
        ref64 = _mp_model()
        ref_dev = MC.build("mace-e3nn", ref64, torch.float64, device)
    except Exception as exc:
        fail = _failed(exc)
        cells += [_cell(i, "train", impl, **fail) for a in systems for p, impl in variants for i in ids(p, a)]
        opts.log(f"train: {fail['status']}: {fail['error'][:160]}")
        return
    for a in systems:
        atoms = MC.cu_atoms(a)
        data = MC.graph(atoms, 6.0, MC.Z_ALL, torch.float32, device)
        ref = _reference(opts, "train", ref_dev, atoms, a, device, len(modes) > 1)
        jobs: Dict[Tuple[str, str], object] = {}
        for prec, impl in variants:
            try:  # one model for both losses: the step's work does not depend on the weights' values
                model = TR.train_model(impl, ref64, prec, device)
            except Exception as exc:
                model = _failed(exc)
            tol = MACE_TOL["float32"] if prec == "fp32" else BF16_TOL
            for (mode, stress), cid in zip(modes, ids(prec, a)):
                if isinstance(model, dict):
                    jobs[(cid, impl)] = model
                    continue
                try:
                    err = (None if ref is None else
                           max(MC.errors(TR.forward(model, data, stress), ref, stress).values()))
                    jobs[(cid, impl)] = (TR.step_call(model, data, stress), err, tol)
                except Exception as exc:
                    jobs[(cid, impl)] = _failed(exc)

        def run_job(job, a=a, edges=int(data["edge_index"].shape[1])):
            t = _timed(job[0], device, opts.target_ms)
            T.free_memory(device)
            return t, dict(atoms=a, edges=edges, err=job[1], tol=job[2])
        cells.extend(_rounds(opts, "train", jobs, run_job))
        del jobs, data
        T.free_memory(device)


def run_model(opts: Options, device, cells: List[dict]) -> None:
    base = os.path.basename(opts.model)
    for dn in ("float32", "float64"):
        ids = [f"model/{base}/{dn}/1008atoms/{m}" for m in ("E+F", "E+F+S")]
        try:
            model = MC.model_file(opts.model, DTYPES[dn], device)
            z = [int(v) for v in model.atomic_numbers.tolist()]
            atoms = MC.cu_atoms(1008, element=29 if 29 in z else z[0])
            data = MC.graph(atoms, float(model.r_max), z, DTYPES[dn], device)
        except Exception as exc:
            fail = _failed(exc)
            cells += [_cell(i, "model", "equikernels", **fail) for i in ids]
            opts.log(f"model {base} {dn}: {fail['status']}: {fail['error'][:160]}")
            continue
        for cid, stress in zip(ids, (False, True)):
            try:
                c = _cell(cid, "model", "equikernels", "ok", **_timed(MC.step_call(model, data, stress), device,
                                                                       opts.target_ms))
            except Exception as exc:
                c = _cell(cid, "model", "equikernels", **_failed(exc))
            cells.append(c)
            opts.log(_line(c))


def _line(c: dict) -> str:
    if c["status"] != "ok":
        return f"{c['id']:<46} {c['impl']:<17} {c['status']}: {str(c.get('error', ''))[:100]}"
    err = "" if c.get("err") is None else f"  err {c['err']:.1e}"
    return f"{c['id']:<46} {c['impl']:<17} {T.fmt_ms(c['ms']):>9} ms{err}"


def run_suite(opts: Options, device: torch.device) -> dict:
    """Run the suite on ``device`` and return the result document (what ``--out`` receives as JSON).
    Interrupted (KeyboardInterrupt), it returns the cells finished so far with ``interrupted`` set
    (the cells of a group still running are lost, those of finished groups and systems kept)."""
    opts.started = time.perf_counter()
    data = {"schema": SCHEMA, "gpu_kind": gpu_kind(device), "quick": opts.quick, "env": env_info(device),
            "copy": T.copy_bandwidth(device), "host_probe": T.host_probe(device), "cells": [],
            "scope": {"groups": list(opts.groups) + (["model"] if opts.model else []), "problems": list(opts.problems),
                      "atoms": list(opts.atom_counts())}}
    opts.log(f"{data['env'].get('gpu')}: device-to-device copy {data['copy']['gbps_median']:.0f} GB/s")
    runners = {"tp": run_tp, "conv": run_conv, "mace": run_mace, "md": run_md, "train": run_train}
    try:
        for g in opts.groups:
            runners[g](opts, device, data["cells"])
        if opts.model:
            run_model(opts, device, data["cells"])
    except KeyboardInterrupt:  # Ctrl-C or the CLI's SIGTERM: the cells measured so far are kept
        data["interrupted"] = {"after_s": round(time.perf_counter() - opts.started, 1)}
        opts.log(f"interrupted after {data['interrupted']['after_s']} s: keeping the {len(data['cells'])} cells "
                 "measured so far")
    for c in data["cells"]:  # each cell keeps its run's host speed, through merges too
        c.setdefault("host_us", round(data["host_probe"]["us_per_op"], 3))
    data["wall_s"] = round(time.perf_counter() - opts.started, 1)
    return data
