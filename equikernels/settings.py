"""Every environment variable equikernels reads, parsed once into one frozen ``Settings`` object.

``get()`` returns the settings in force: the environment as last read, with any ``override()``
blocks on top. The environment is read on the first ``get()`` after import or after ``reload()``;
later calls return the same object (a global lookup: safe on every launch). A bad value raises
``SettingsError`` naming the variable and what it expects, at that first ``get()``. An empty
variable counts as unset (except where its table row says otherwise).

    from equikernels import settings
    settings.get().autotune                  # False unless EQUIKERNELS_AUTOTUNE=1
    with settings.override(autotune=True):   # in code and tests, validated like the variable
        ...
    settings.reload()                         # re-read the environment after changing os.environ

A few values are read once when the module that uses them is imported (their table rows say so).
The C++ backward node also reads ``EQUIKERNELS_AUTOTUNE`` and ``EQUIKERNELS_POISON`` from the
process environment; with either on (variable or override) the Python node is used instead.
``equikernels settings`` lists the values in force; with ``--markdown`` the table of docs/configuration.md.
"""
from __future__ import annotations

import contextlib
import dataclasses
import os
import threading
from typing import Any, Callable, Dict, Iterator, List, Optional, Tuple, Union

PREFIX = "EQUIKERNELS_"
KINDS = ("fwd", "bwd", "dbwd")  # the directions of a per-direction setting (<NAME>_<KIND>)


class SettingsError(ValueError):
    """A variable or override that does not parse."""


# --- parsers: str -> value, each with the text the table shows ------------------------------------
class _Flag:
    text = "0 or 1"
    _ON, _OFF = ("1", "true", "yes", "on"), ("0", "false", "no", "off")
    WORDS = "0 or 1 (or true/false, yes/no, on/off)"  # every word taken, for error messages

    def __call__(self, s: str) -> bool:
        v = s.strip().lower()
        if v in self._ON or v in self._OFF:
            return v in self._ON
        raise ValueError(f"expected {self.WORDS}, got {s!r}")


class _FlagOrAuto(_Flag):
    """'auto', or an on/off word as the 0-or-1 settings take it (True / False)."""
    text = "0 or 1, or auto"
    WORDS = "one of auto, 0/1, true/false, yes/no, on/off"

    def __call__(self, s: str) -> Union[str, bool]:
        if s.strip().lower() == "auto":
            return "auto"
        return super().__call__(s)


class _Int:
    def __init__(self, lo: int = 0):
        self.lo, self.text = lo, f"integer >= {lo}"

    def __call__(self, s: str) -> int:
        try:
            v = int(s.strip())
        except ValueError:
            v = None
        if v is None or v < self.lo:
            raise ValueError(f"expected an integer >= {self.lo}, got {s!r}")
        return v


class _PowerOfTwo(_Int):
    """An integer power of two >= ``lo`` (a Triton block size: tl.arange takes powers of two only)."""

    def __init__(self, lo: int):
        super().__init__(lo)
        self.text = f"power of two >= {lo}"

    def __call__(self, s: str) -> int:
        try:
            v = super().__call__(s)
        except ValueError:
            v = None
        if v is None or v & (v - 1):
            raise ValueError(f"expected a {self.text}, got {s!r}")
        return v


class _Float:
    text = "number >= 0"

    def __call__(self, s: str) -> float:
        try:
            v = float(s.strip())
        except ValueError:
            v = -1.0
        if not v >= 0:
            raise ValueError(f"expected a number >= 0, got {s!r}")
        return v


class _Choice:
    def __init__(self, *values: str, lower: bool = False):
        self.values, self.lower = values, lower
        self.text = ", ".join(v if v else "'' (empty)" for v in values)

    def __call__(self, s: str) -> str:
        v = s.strip().lower() if self.lower else s.strip()
        if v not in self.values:
            raise ValueError(f"expected one of {', '.join(repr(x) for x in self.values)}, got {s!r}")
        return v


class _Text:
    def __init__(self, text: str):
        self.text = text

    def __call__(self, s: str) -> str:
        return s


class _AutoOrInt:
    """'auto' or an integer >= 0 (kept as a string 'auto' or an int)."""
    text = "auto or integer >= 0"

    def __init__(self, expected: str):
        self.expected = expected

    def __call__(self, s: str) -> Union[str, int]:
        v = s.strip().lower()
        if v == "auto":
            return "auto"
        if v.isdigit():
            return int(v)
        raise ValueError(f"expected {self.expected}, got {s!r}")


class _L2:
    """'off', 'row' or a load distance >= 0."""
    text = "off, row or integer >= 0"

    def __call__(self, s: str) -> Union[str, int]:
        v = s.strip().lower()
        if v in ("off", "row"):
            return v
        if v.isdigit():
            return int(v)
        raise ValueError(f"expected 'off', 'row' or an integer >= 0, got {s!r}")


def _var(default: Any, parse: Callable[[str], Any], doc: str, env: Optional[str] = None,
         empty: bool = False, at_import: bool = False) -> Any:
    """A setting: ``env`` (default: EQUIKERNELS_<FIELD NAME>) parsed by ``parse``; ``empty``: an
    empty value is a value, not unset; ``at_import``: read once when its module is imported."""
    return dataclasses.field(default=default, metadata=dict(parse=parse, doc=doc, env=env, empty=empty,
                                                            at_import=at_import))


_FLAG = _Flag()
FLAG_OR_AUTO = _FlagOrAuto()  # also parses the calculator's cuda_graph= strings


@dataclasses.dataclass(frozen=True)
class Settings:
    """The parsed settings (field ``name`` <- variable ``EQUIKERNELS_<NAME>`` unless its ``env`` says
    otherwise). ``None``: unset, the code's own choice applies."""

    # --- what runs ---------------------------------------------------------------------------------
    backend: str = _var("auto", _Choice("auto", "triton", "reference", "cpu"),
                        "Default backend of every op: triton on CUDA when Triton is importable, cpu (dense "
                        "contractions) on CPU (auto), or always the given one; a backend= argument wins")
    autotune: bool = _var(False, _FLAG, "Time candidate launch shapes / dataflows on first use and cache the "
                                        "fastest (equikernels.tune); also needed to use the choices "
                                        "`equikernels tune` stored")
    native: str = _var("auto", _Choice("auto", "0", "1"),
                       "The C++ autograd node of the eager double backward: auto (CUDA tensors), 1 (every "
                       "device), 0 (off)", at_import=True)
    fast_bwd: bool = _var(True, _FLAG, "Cached launch recipes for the eager backward and double backward "
                                       "(0: every call plans through TPKernels)", at_import=True)
    fast_launch: Optional[bool] = _var(None, _FLAG, "Launch Triton kernels through the cached fast path "
                                                    "(default: on for Triton 3.6.x, off otherwise)",
                                       at_import=True)
    ptxas_rescue: bool = _var(True, _FLAG, "Rebuild a kernel at ptxas -O1 when the default build collapses to a few "
                                           "registers and kilobytes of stack per thread")
    cuda_graph: Union[str, bool] = _var("auto", FLAG_OR_AUTO, "Default of the ASE calculator's cuda_graph argument")
    edge_chunk: Union[str, int] = _var("auto", _AutoOrInt("'auto' or a non-negative integer (edges per chunk, "
                                                          "0 = never chunk)"),
                                       "MACE interaction edges per chunk: auto (chunk when the per-edge "
                                       "weights would not fit in memory), N edges, 0 never")
    pair_edges: str = _var("auto", _Choice("auto", "0", "1"),
                           "MACE models pair a full edge list themselves (each edge with its reverse, the radial "
                           "MLPs once per pair): auto (CUDA, from 150,000 edges, not in training), 1 (any size, "
                           "device and mode), 0 (never); a list that is not symmetric stays unpaired")
    conv_dataflow: Optional[str] = _var(None, _Choice("auto", "atomic", "deterministic", "unfused"),
                                        "Dataflow of dataflow='auto' convolutions (default: atomic, or "
                                        "deterministic under deterministic algorithms)")
    radial_conv: str = _var("0", _Choice("auto", "0", "1"),
                            "Experimental: fuse the radial MLP's last layer into the convolution: 0 (never), "
                            "1 (whenever the kernels take the call), auto (the autotuner's choice, else "
                            "unfused)")
    fused_mlp: bool = _var(False, _FLAG, "Experimental: run the radial MLP as fused Triton kernels under "
                                         "backend auto (float32 on CUDA)")
    mlp_precision: Optional[str] = _var(None, _Choice("ieee", "tf32x3", "tf32"),
                                        "Matmul precision of the fused radial MLP kernels (default tf32x3; "
                                        "float64 always ieee)")
    tf32: bool = _var(False, _FLAG, "Let tensor-product and convolution kernels use TF32 dot products")
    debug: bool = _var(False, _FLAG, "The command line prints tracebacks instead of one-line errors")
    poison: bool = _var(False, _FLAG, "Fill output buffers with NaN instead of leaving them uninitialised "
                                      "(tests: any element not written shows)")

    # --- where things are kept ---------------------------------------------------------------------
    cache_dir: Optional[str] = _var(None, _Text("path"), "Generated kernels, tuning file and the C++ node "
                                                         "(default: $XDG_CACHE_HOME/equikernels or "
                                                         "~/.cache/equikernels; ~ is expanded, a relative path "
                                                         "is taken from the working directory at first use)")
    tune_file: Optional[str] = _var(None, _Text("path"), "The autotuner's cache (default: "
                                                         "<cache_dir>/tuning.json; ~ and relative paths as cache_dir)")

    # --- autotuner ---------------------------------------------------------------------------------
    tune_threads: Optional[int] = _var(None, _Int(1), "Threads that compile candidates in parallel (1: "
                                                      "none; default: CPU count, 1 under the interpreter)")
    tune_rounds: int = _var(3, _Int(1), "Interleaved timing rounds per candidate")
    tune_margin: float = _var(0.03, _Float(), "Relative gain a candidate needs over the default")
    tune_min_gain_ms: float = _var(0.02, _Float(), "Absolute gain (ms) a candidate needs over the default")
    tune_max_candidates: Optional[int] = _var(None, _Int(1), "At most this many candidates, the default "
                                                             "included")

    # --- batched tensor product: launch shape (per direction: _FWD, _BWD, _DBWD) --------------------
    rows: Optional[int] = _var(None, _PowerOfTwo(1), "Rows per program of every tensor-product kernel")
    rows_fwd: Optional[int] = _var(None, _PowerOfTwo(1), "Rows per program; forward only (overrides rows)")
    rows_bwd: Optional[int] = _var(None, _PowerOfTwo(1), "Rows per program; backward only (overrides rows)")
    rows_dbwd: Optional[int] = _var(None, _PowerOfTwo(1), "Rows per program; double backward only (overrides rows)")
    warps: Optional[int] = _var(None, _PowerOfTwo(1), "Warps per program of every tensor-product kernel")
    warps_fwd: Optional[int] = _var(None, _PowerOfTwo(1), "Warps per program; forward only (overrides warps)")
    warps_bwd: Optional[int] = _var(None, _PowerOfTwo(1), "Warps per program; backward only (overrides warps)")
    warps_dbwd: Optional[int] = _var(None, _PowerOfTwo(1), "Warps per program; double backward only (overrides warps)")
    prefetch: Optional[int] = _var(None, _Int(0), "Loads issued this many loads early (0: none)")
    prefetch_fwd: Optional[int] = _var(None, _Int(0), "Load prefetch distance; forward only (overrides prefetch)")
    prefetch_bwd: Optional[int] = _var(None, _Int(0), "Load prefetch distance; backward only (overrides prefetch)")
    prefetch_dbwd: Optional[int] = _var(None, _Int(0), "Load prefetch distance; double backward only "
                                                       "(overrides prefetch)")
    l2_prefetch: Optional[Union[str, int]] = _var(None, _L2(), "Half-precision row operands asked into L2: "
                                                               "off, row (all at the top of the row) or N "
                                                               "loads ahead")
    l2_prefetch_fwd: Optional[Union[str, int]] = _var(None, _L2(), "L2 prefetch; forward only (overrides "
                                                                   "l2_prefetch)")
    l2_prefetch_bwd: Optional[Union[str, int]] = _var(None, _L2(), "L2 prefetch; backward only (overrides "
                                                                   "l2_prefetch)")
    l2_prefetch_dbwd: Optional[Union[str, int]] = _var(None, _L2(), "L2 prefetch; double backward only "
                                                                    "(overrides l2_prefetch)")
    reg_cap: Optional[str] = _var(None, _Choice("0", "all"), "Register cap of generated kernels: 0 (off), all "
                                                             "(float32 kernels too; default: half precision "
                                                             "and the kernels that ask)")

    # --- batched tensor product: kernel structure ---------------------------------------------------
    max_paths: int = _var(40, _Int(1), "Forward paths per generated kernel (larger problems are split; a "
                                       "float64 forward split anyway runs parts of at most 12); also the "
                                       "symmetric contraction's")
    visit: Optional[str] = _var(None, _Choice("out", "in1"), "Path order of generated kernels: by output or by "
                                                             "first-input segment")
    partial_sum: Optional[bool] = _var(None, _FLAG, "Per-thread partial channel sums in gradient kernels")
    split_gw: bool = _var(True, _FLAG, "The weight gradient of weight-dominated problems in a kernel of its own")
    dbwd_one: Optional[bool] = _var(None, _FLAG, "One double-backward kernel for channel-wise per-row products")
    dbwd_paths: Optional[int] = _var(None, _Int(0), "Paths per part of a double backward split by first-input "
                                                    "segment (0: no split)")
    dbwd_channel_parts: Optional[int] = _var(None, _Int(1), "Channel parts of a channel-wise double backward run as "
                                             "one kernel per part (all four gradients over a slice of the "
                                             "channels; default in float32: 64 channels a part from 128 "
                                             "channels and more than 12 paths, else 1; float64 halves a part "
                                             "that computes all four gradients, down to 32 channels)")
    dbwd_merge: bool = _var(True, _FLAG, "Double backward: terms that differ only in one factor and the per-row "
                                         "weight evaluated once, over their weighted sum")
    uvw_rows: bool = _var(True, _FLAG, "Per-row uvw weights (DiffDock) use the uvw_rows kernels")
    uvw_fuse: Optional[bool] = _var(None, _FLAG, "uvw_rows: weight gradient in the same kernel as the rest")
    uvw_ub: int = _var(16, _PowerOfTwo(1), "uvw_rows: u (weight-block rows) per chunk")
    uvw_wb: int = _var(16, _PowerOfTwo(1), "uvw_rows: w (contiguous) per chunk")
    uvw_exact: bool = _var(False, _FLAG, "uvw_rows: split channel remainders into powers of two instead of "
                                         "padding")
    uvw_lazy_h: bool = _var(False, _FLAG, "uvw_rows: keep H un-reduced over the chunks of w")
    rows_contraction: int = _var(1, _PowerOfTwo(1), "Rows per program of the symmetric contraction's kernels")

    # --- convolution (node-parallel kernels; per direction: _FWD, _BWD, _DBWD) ---------------------
    conv_rows: Optional[int] = _var(None, _PowerOfTwo(1), "Rows (edges) per program of convolution kernels")
    conv_warps: Optional[int] = _var(None, _PowerOfTwo(1), "Warps per program of convolution kernels")
    conv_grad_loops: Optional[str] = _var(None, _Choice("one", "in1all"),
                                          "Gradient kernels: one edge loop, or one per first-input segment "
                                          "(in1all, default)")
    conv_prefetch: Optional[str] = _var(None, _Choice("", "idx", "all"),
                                        "Edge-loop pipelining: '' (none), idx, all (default: '' in staged loops and "
                                        "float64, all otherwise); empty is a value here", empty=True)
    conv_prefetch_fwd: Optional[str] = _var(None, _Choice("", "idx", "all"),
                                            "Edge-loop pipelining; forward only", empty=True)
    conv_prefetch_bwd: Optional[str] = _var(None, _Choice("", "idx", "all"),
                                            "Edge-loop pipelining; backward only", empty=True)
    conv_prefetch_dbwd: Optional[str] = _var(None, _Choice("", "idx", "all"),
                                             "Edge-loop pipelining; double backward only", empty=True)
    conv_stages: Optional[int] = _var(None, _Int(0), "Edge-loop stages of Triton's pipeliner in node-parallel "
                                      "kernels: loads copied into shared memory ahead of use (0: none)")
    conv_stages_fwd: Optional[int] = _var(None, _Int(0), "Pipeliner stages; forward only")
    conv_stages_bwd: Optional[int] = _var(None, _Int(0), "Pipeliner stages; backward only")
    conv_stages_dbwd: Optional[int] = _var(None, _Int(0), "Pipeliner stages; double backward only")
    conv_atomic: Optional[str] = _var(None, _Choice("nodes", "edges"),
                                      "Atomic dataflow: walk destinations (nodes, default) or scatter per edge")
    conv_atomic_fwd: Optional[str] = _var(None, _Choice("nodes", "edges"), "Atomic arrangement; forward only")
    conv_atomic_bwd: Optional[str] = _var(None, _Choice("nodes", "edges"), "Atomic arrangement; backward only")
    conv_atomic_dbwd: Optional[str] = _var(None, _Choice("nodes", "edges"),
                                           "Atomic arrangement; double backward only")
    conv_hoist: Optional[bool] = _var(None, _FLAG, "Load a node's own operands once before its edge loop "
                                                   "(default: not in the double backward); forces every "
                                                   "direction")
    conv_hoist_fwd: Optional[bool] = _var(None, _FLAG, "Hoisting; forward only")
    conv_hoist_bwd: Optional[bool] = _var(None, _FLAG, "Hoisting; backward only")
    conv_hoist_dbwd: Optional[bool] = _var(None, _FLAG, "Hoisting; double backward only")
    conv_in1outer: Optional[bool] = _var(None, _FLAG, "Share inner sums between gx/dx and the weight gradient")
    conv_in1outer_fwd: Optional[bool] = _var(None, _FLAG, "Shared inner sums; forward only")
    conv_in1outer_bwd: Optional[bool] = _var(None, _FLAG, "Shared inner sums; backward only")
    conv_in1outer_dbwd: Optional[bool] = _var(None, _FLAG, "Shared inner sums; double backward only")
    conv_layout: str = _var("auto", _Choice("auto", "asked", "ir_mul"),
                            "Layout of the convolution kernels for mul_ir channel-wise products: auto (ir_mul, "
                            "node tensors permuted around them, from 400,000 edges; the asked layout below), "
                            "asked (the layout the call asks for) or ir_mul (at every size)")
    conv_channel_parts: Optional[int] = _var(None, _Int(1), "Channel parts of node-parallel gradient kernels of "
                                             "channel-wise products (default: float64 backward 64 channels a part)")
    conv_channel_parts_fwd: Optional[int] = _var(None, _Int(1), "Channel parts; forward only")
    conv_channel_parts_bwd: Optional[int] = _var(None, _Int(1), "Channel parts; backward only")
    conv_channel_parts_dbwd: Optional[int] = _var(None, _Int(1), "Channel parts; double backward only")
    conv_dbwd_dg: Optional[str] = _var(None, _Choice("apart", "fused"),
                                       "Double backward: dg in a kernel of its own (apart) or carried per node "
                                       "in the edge loops of dx, dy, dw (fused)")
    conv_maxnreg: Optional[int] = _var(None, _Int(0), "Register cap of node-parallel kernels (0: none)")
    conv_maxnreg_fwd: Optional[int] = _var(None, _Int(0), "Register cap; forward only")
    conv_maxnreg_bwd: Optional[int] = _var(None, _Int(0), "Register cap; backward only")
    conv_maxnreg_dbwd: Optional[int] = _var(None, _Int(0), "Register cap; double backward only")

    # --- fused radial convolution ---------------------------------------------------------------------
    rconv_block: int = _var(16, _PowerOfTwo(16), "Edges per block")
    rconv_warps: int = _var(4, _PowerOfTwo(1), "Warps per program")
    rconv_precision: str = _var("tf32x3", _Choice("ieee", "tf32x3", "tf32"), "Matmul precision (float64: ieee)")
    rconv_stages: Optional[int] = _var(None, _Int(1), "Software-pipelining stages (default: 3, transposed "
                                                      "kernels 1)")
    rconv_group: int = _var(8, _Int(1), "Nodes per program of the transposed kernels")
    rconv_edge_split: bool = _var(True, _FLAG, "Edge-attribute and hidden gradients in two passes")

    # --- variables of other tools -----------------------------------------------------------------------
    triton_interpret: bool = _var(False, _FLAG, "Triton runs kernels in its interpreter (CPU): no L2 hints, "
                                                "no parallel tuning compiles", env="TRITON_INTERPRET")
    cxx: str = _var("g++", _Text("command"), "C++ compiler of the C++ autograd node", env="CXX")
    xdg_cache_home: Optional[str] = _var(None, _Text("path"), "Base of the default cache_dir (absolute paths only)",
                                         env="XDG_CACHE_HOME")
    world_size: int = _var(1, _Int(1), "Processes of a distributed training run (set by torchrun)",
                           env="WORLD_SIZE")
    local_rank: int = _var(0, _Int(0), "This process's GPU index on its host (set by torchrun)", env="LOCAL_RANK")
    rank: int = _var(0, _Int(0), "This process's rank in a distributed training run (set by torchrun)", env="RANK")
    omp_num_threads: Optional[str] = _var(None, _Text("OpenMP thread count"),
                                          "When set, the calculator leaves torch's CPU thread count alone",
                                          env="OMP_NUM_THREADS")

    def per_kind(self, name: str, kind: str) -> Any:
        """Setting ``name`` for direction ``kind`` (fwd / bwd / dbwd): ``<name>_<kind>`` if set, else
        ``name``."""
        v = getattr(self, f"{name}_{kind}")
        return getattr(self, name) if v is None else v


def env_name(field: dataclasses.Field) -> str:
    return field.metadata["env"] or PREFIX + field.name.upper()


FIELDS: Tuple[dataclasses.Field, ...] = dataclasses.fields(Settings)
_BY_NAME = {f.name: f for f in FIELDS}


def _parse(field: dataclasses.Field, raw: str, source: str) -> Any:
    try:
        return field.metadata["parse"](raw)
    except ValueError as exc:
        raise SettingsError(f"{source}: {exc}") from None


def from_environ(environ: Optional[Dict[str, str]] = None) -> Settings:
    """Settings parsed from ``environ`` (default: the process environment)."""
    env = os.environ if environ is None else environ
    values = {}
    for f in FIELDS:
        name = env_name(f)
        raw = env.get(name)
        if raw is None or (raw == "" and not f.metadata["empty"]):
            continue
        values[f.name] = _parse(f, raw, name)
    return Settings(**values)


def _checked(changes: Dict[str, Any]) -> Dict[str, Any]:
    """Override values validated like the variables (None: unset)."""
    out = {}
    for name, value in changes.items():
        f = _BY_NAME.get(name)
        if f is None:
            raise SettingsError(f"override: unknown setting {name!r} (see equikernels.settings.Settings)")
        if value is None:
            out[name] = f.default
        elif isinstance(value, bool) and isinstance(f.metadata["parse"], _Flag):
            out[name] = value
        else:
            text = ("1" if value else "0") if isinstance(value, bool) else str(value)
            out[name] = _parse(f, text, f"override({name}=...)")
    return out


_lock = threading.Lock()  # serialises override() and reload(); get() takes no lock (traced code calls it)
_from_env: Optional[Settings] = None
_overrides: List[Dict[str, Any]] = []
_current: Optional[Settings] = None


def get() -> Settings:
    """The settings in force (the environment as last read, with the active overrides on top)."""
    s = _current
    return s if s is not None else _refresh()


def at_import() -> Settings:
    """The settings for module-level constants: as ``get()``, but with a malformed variable the
    defaults (the next ``get()`` raises it; the command line reports it in one line)."""
    try:
        return get()
    except SettingsError:
        return Settings()


def _refresh() -> Settings:
    """Parse what is missing and publish the result (idempotent: concurrent calls agree)."""
    global _from_env, _current
    if _from_env is None:
        _from_env = from_environ()
    s = _from_env
    for o in list(_overrides):
        s = dataclasses.replace(s, **o)
    _current = s
    return s


def _republish() -> None:
    """Recompute now, so that compiled code never parses; a bad value waits for the next get()."""
    global _current
    _current = None
    try:
        _refresh()
    except SettingsError:
        pass


def reload() -> None:
    """Read the environment again (a bad value raises at the next ``get()``)."""
    global _from_env
    with _lock:
        _from_env = None
        _republish()


@contextlib.contextmanager
def override(**changes: Any) -> Iterator[Settings]:
    """Settings ``changes`` (field names, values as the variables take them or their parsed type;
    None: back to the default) in force inside the block, for every thread."""
    checked = _checked(changes)
    with _lock:
        _overrides.append(checked)
        _republish()
    try:
        yield get()
    finally:
        with _lock:
            _overrides.remove(checked)
            _republish()


def environ_items(prefixes: Tuple[str, ...]) -> Dict[str, str]:
    """The process environment's variables whose names start with one of ``prefixes`` (for records
    of a run, not for behaviour)."""
    return {k: v for k, v in os.environ.items() if k.startswith(prefixes)}


def in_environment(field: dataclasses.Field) -> bool:
    """Whether the variable of ``field`` sets it: present in the process environment, and not empty
    unless empty is one of its values (an empty variable counts as unset)."""
    raw = os.environ.get(env_name(field))
    return raw is not None and (raw != "" or field.metadata["empty"])


def table() -> str:
    """The Markdown table of every setting (docs/configuration.md holds this text)."""
    rows = ["| Variable | Setting | Values | Default | Meaning |", "|---|---|---|---|---|"]
    for f in FIELDS:
        default = "unset" if f.default is None else repr(f.default) if isinstance(f.default, str) else str(f.default)
        doc = f.metadata["doc"] + (" (read when its module is imported)" if f.metadata["at_import"] else "")
        rows.append(f"| `{env_name(f)}` | `{f.name}` | {f.metadata['parse'].text} | {default} | {doc} |")
    return "\n".join(rows) + "\n"
