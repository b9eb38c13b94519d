"""The C++ autograd node of the eager backward (``csrc/tp_node.cpp``): build, load, recipes.

Under create_graph (force training) the backward of a tensor product is itself recorded, and its
node's backward is the fused double backward. As a Python node (``ops.chain``'s eager backward
Function) that costs the GIL on the autograd engine's device thread plus Triton's Python launch: ~40 us more host
time per call than OpenEquivariance's C++ node, which decided nequip-water's host-bound cell.
The C++ node launches the kernels of the launcher's pinned double-backward recipes
(``codegen.recipe.DbwdRecipe``), which this module hands it, and calls back into Python for anything else.

The extension is compiled once per machine (g++ against the installed torch, ~30 s), cached under
``codegen.cache.cache_dir()/native`` by a hash of its source, torch and Python; no ninja needed.
``EQUIKERNELS_NATIVE``: ``auto`` (default: CUDA tensors), ``1`` (every device: the CPU tests, where
every call takes the Python fallback), ``0`` (off). A failed build warns once and leaves the Python
node in use. Triton's launch hooks (proton) do not see the C++ node's launches (CUDA profilers do):
profile Triton-side with EQUIKERNELS_NATIVE=0.
"""
from __future__ import annotations

import hashlib
import importlib.util
import logging
import os
import re
import subprocess
import sys
import sysconfig
import tempfile
import warnings
from pathlib import Path
from typing import Optional

import torch

from .. import settings

log = logging.getLogger(__name__)

MODE = settings.at_import().native
NAME = "_ek_tp_node"
SOURCE = Path(__file__).resolve().parent.parent / "csrc" / "tp_node.cpp"
_ext = None
_failed: Optional[str] = None
_SENT: set = set()  # (entry id, have, need) whose plan the extension has


def cxx_standard(torch_version: str) -> str:
    """The C++ standard to compile against torch ``torch_version``'s headers: C++20 from torch 2.14 on
    (its headers refuse older ones), C++17 before."""
    major, minor = (int(re.match(r"\d+", part).group()) for part in torch_version.split(".")[:2])
    return "c++20" if (major, minor) >= (2, 14) else "c++17"


def build_command(src: Path, out: Path) -> list:
    """The g++ command line: torch's and Python's headers, linked against torch's libraries."""
    tdir = Path(torch.__file__).resolve().parent
    abi = int(torch.compiled_with_cxx11_abi())
    return [settings.get().cxx, "-O2", "-shared", "-fPIC", f"-std={cxx_standard(torch.__version__)}", "-w",
            f"-D_GLIBCXX_USE_CXX11_ABI={abi}", f"-DTORCH_EXTENSION_NAME={NAME}",
            f"-I{tdir / 'include'}", f"-I{tdir / 'include' / 'torch' / 'csrc' / 'api' / 'include'}",
            "-I" + sysconfig.get_paths()["include"], str(src), f"-L{tdir / 'lib'}", "-lc10", "-ltorch",
            "-ltorch_cpu", "-ltorch_python", "-ldl", f"-Wl,-rpath,{tdir / 'lib'}", "-o", str(out)]


def library_path() -> Path:
    from ..codegen.cache import subdir  # noqa: PLC0415 (the private fallback when the cache dir is unusable)
    h = hashlib.sha256()
    for part in (SOURCE.read_bytes(), torch.__version__.encode(), sys.version.encode(),
                 str(torch.compiled_with_cxx11_abi()).encode(), settings.get().cxx.encode()):
        h.update(part)
    return subdir("native") / h.hexdigest()[:20] / (NAME + sysconfig.get_config_var("EXT_SUFFIX"))


def compiler_error(stderr: str) -> str:
    """One line of a failed compile's output that says why: its first error, else its last line."""
    lines = [ln.strip() for ln in stderr.splitlines() if ln.strip()]
    errors = [ln for ln in lines if "error" in ln.lower()]
    return (errors[0] if errors else lines[-1] if lines else "no output")[:500]


def _build(path: Path) -> None:
    """Compile the node into ``path`` (atomically: a concurrent process sees no half-written library)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(suffix=".so", dir=path.parent)
    os.close(fd)
    try:
        log.info("equikernels: compiling the native autograd node (once per machine, ~30 s)")
        r = subprocess.run(build_command(SOURCE, Path(tmp)), capture_output=True, text=True, timeout=900)
        if r.returncode != 0:
            raise RuntimeError(f"g++ exited with {r.returncode}: {compiler_error(r.stderr)}")
        os.replace(tmp, path)
    finally:  # a failed or timed-out build leaves no temporary file
        if os.path.exists(tmp):
            os.unlink(tmp)


def _import(path: Path):
    spec = importlib.util.spec_from_file_location(NAME, path)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def load():
    """The extension module (built first if needed; a cached library that does not load, e.g. one
    truncated on disk, is rebuilt once), or None where it cannot be built (warned once)."""
    global _ext, _failed
    if _ext is not None or _failed is not None:
        return _ext
    try:
        path = library_path()
        built = not path.exists()
        if built:
            _build(path)
        try:
            mod = _import(path)
        except (ImportError, OSError):
            if built:
                raise
            _build(path)
            mod = _import(path)
        from ..codegen import launch  # noqa: PLC0415
        mod.set_enabled(launch.ENABLED)
        launch.LISTENERS.append(mod.set_enabled)
        _ext = mod
    except Exception as e:  # noqa: BLE001 - any failure leaves the Python node in use
        _failed = f"{type(e).__name__}: {e}"
        warnings.warn(f"equikernels: the native autograd node could not be built ({_failed}); the Python "
                      "node is used instead (set EQUIKERNELS_NATIVE=0 to skip the attempt)", RuntimeWarning,
                      stacklevel=2)
    return _ext


def wanted(x: torch.Tensor) -> bool:
    """Use the C++ node for this call (builds it the first time). Not while autotuning or poisoning
    is on: both need the Python launcher (the node also reads those two variables itself)."""
    if MODE == "0" or _failed is not None or not (x.is_cuda or MODE == "1"):
        return False
    s = settings.get()
    if s.autotune or s.poison:
        return False
    return _ext is not None or load() is not None


def set_enabled(on: bool) -> None:
    """Native launches on or off (launch.set_enabled calls this: off means Triton's own launch path)."""
    if _ext is not None:
        _ext.set_enabled(bool(on))


def counts():
    """(double backwards launched natively, fallbacks to Python) since the last reset_counts."""
    return tuple(_ext.counts()) if _ext is not None else (0, 0)


def reset_counts() -> None:
    if _ext is not None:
        _ext.reset_counts()


def kernel_kinds(fn, compiled) -> Optional[str]:
    """The launch ABI of a compiled Triton kernel, one letter per parameter of ``fn``: 'p' pointer,
    'i' int32, 'l' int64, 'c' constexpr (not passed). None where the C++ launch cannot do it (scratch
    memory, clusters, programmatic launch, other parameter types)."""
    md = compiled.metadata
    if (getattr(md, "global_scratch_size", 0) or getattr(md, "profile_scratch_size", 0)
            or getattr(md, "launch_pdl", False) or getattr(md, "launch_cooperative_grid", False)
            or getattr(md, "num_ctas", 1) != 1):
        return None
    sig = getattr(compiled.src, "signature", None)
    if not isinstance(sig, dict):
        return None
    kinds = []
    for name in fn.arg_names:
        ty = sig.get(name)
        if ty == "constexpr":
            kinds.append("c")
        elif isinstance(ty, str) and ty.startswith("*"):
            kinds.append("p")
        elif ty in ("i32", "i64"):
            kinds.append("i" if ty == "i32" else "l")
        else:
            return None
    return "".join(kinds)


def register(entry, have: int, need: int, plan, rows_n: int) -> None:
    """Hands the C++ node ``plan`` (a codegen.recipe.DbwdRecipe that just ran for (have, need) on
    ``rows_n`` rows: its ``launches`` and ``res``, the recipe's stable interface), with every kernel
    Triton has compiled for this row count's int classes."""
    from ..codegen import launch  # noqa: PLC0415
    dev = launch.bound_device()
    if not launch.ENABLED or dev is None:  # Triton's own path: no compiled kernels kept
        return
    ext = _ext
    res = [r if r >= 0 else -1 for r in plan.res]
    sent = (id(entry), have, need)  # entries live as long as the process: ids are not reused
    if sent not in _SENT:
        ext.add_plan(entry, have, need, [(rows, list(args), [(int(i), bool(z)) for i, z in allocs])
                                         for _, rows, args, allocs in plan.launches], res)
        _SENT.add(sent)
    for k, (pinned, rows, _, _) in enumerate(plan.launches):
        nblk = (rows_n + rows - 1) // rows
        key = launch.int_class(rows_n) | (launch.int_class(nblk) << 4) | (dev << 8)  # as tp_node.cpp's run_native
        if ext.has_variant(entry, have, need, k, key):
            continue
        hit = pinned.compiled_for((rows_n, nblk))
        if hit is None:
            continue
        function, meta, compiled = hit
        kinds = kernel_kinds(pinned.launcher.fn, compiled)
        if kinds is None:
            continue
        ext.add_variant(entry, have, need, k, key, int(function), int(meta[0]), int(meta[2]), kinds)
