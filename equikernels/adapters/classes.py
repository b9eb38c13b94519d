"""Subclasses that keep a layer's class name: an adapter swaps an instance's ``__class__`` for a
subclass overriding a few methods, so ``type(layer).__name__``, parameters, ``state_dict`` keys
and the call signature stay the original's.

The subclasses are importable from this module by a generated name, so models holding them
pickle (``torch.save(model)``) and unpickle; private state (attributes starting with ``_ek_``)
is not pickled and is rebuilt on the next call, or on unpickling where the overrides give an
``_ek_restore(module)`` function.

TorchScript: the private state is hidden from ``torch.jit.script``, and every subclass has the
original class's forward as the method ``_ek_script_forward``, so an overriding forward starting
with ``if torch.jit.is_scripting(): return self._ek_script_forward(...)`` scripts as the original.
"""
from __future__ import annotations

import ast
import importlib
import inspect
import itertools
import linecache
import textwrap
import types
from typing import Callable, Dict, Optional, Tuple

import torch

# adapter name -> function(original class) -> dict of overriding methods
_OVERRIDES: Dict[str, Callable[[type], dict]] = {}
_MADE: Dict[Tuple[str, type], type] = {}


def register_overrides(adapter: str, make: Callable[[type], dict]) -> None:
    _OVERRIDES[adapter] = make


def _name(adapter: str, cls: type) -> str:
    return f"{adapter}|{cls.__module__.replace('.', '/')}|{cls.__qualname__.replace('.', '/')}"


def _getstate(self):
    state = self.__dict__.copy()
    for k in [k for k in state if k.startswith("_ek_")]:
        del state[k]
    return state


def _setstate_with(cls: type, restore: Callable):
    def __setstate__(self, state):
        cls.__setstate__(self, state)
        restore(self)
    return __setstate__


def _script_copy(fn):
    """``fn`` under the name ``_ek_script_forward`` (TorchScript names a compiled method after its function);
    a decorated ``fn`` (``functools.wraps``) is copied undecorated: TorchScript compiles the function's own code."""
    fn = inspect.unwrap(fn)
    out = types.FunctionType(fn.__code__, fn.__globals__, "_ek_script_forward", fn.__defaults__, fn.__closure__)
    out.__kwdefaults__, out.__annotations__ = fn.__kwdefaults__, dict(getattr(fn, "__annotations__", {}))
    out.__qualname__, out.__module__ = fn.__qualname__, fn.__module__
    return out


def _jit_ignored(base: type):
    listed = list(getattr(base, "__jit_ignored_attributes__", []))
    # private state (dicts keyed by device and dtype, plans) has no TorchScript type
    return property(lambda self: listed + [k for k in self.__dict__ if k.startswith("_ek_")])


_SOURCES = itertools.count()


class _Text(str):
    """An annotation's source text, shown as written in a generated signature."""

    def __repr__(self) -> str:
        return str(self)


def _written_annotations(orig: Callable) -> Tuple[Dict[str, str], Optional[str]]:
    """The annotations of ``orig``'s parameters and return value as its source writes them, or none
    where the source cannot be read or an annotation does not resolve in ``orig``'s module."""
    try:
        tree = ast.parse(textwrap.dedent(inspect.getsource(orig)))
    except (OSError, TypeError, SyntaxError, IndentationError):
        return {}, None
    fn = tree.body[0] if tree.body else None
    if not isinstance(fn, (ast.FunctionDef, ast.AsyncFunctionDef)):
        return {}, None
    a = fn.args
    every = a.posonlyargs + a.args + a.kwonlyargs + [x for x in (a.vararg, a.kwarg) if x is not None]
    written = {x.arg: ast.unparse(x.annotation) for x in every if x.annotation is not None}
    returns = ast.unparse(fn.returns) if fn.returns is not None else None
    for text in list(written.values()) + [returns or "None"]:
        try:  # names local to where ``orig`` was defined do not resolve in its module
            eval(text, dict(orig.__globals__))  # noqa: S307 (the original's own annotation)
        except Exception:  # noqa: BLE001
            return {}, None
    return written, returns


def forward_like(orig: Callable, call: Callable) -> Callable:
    """A function with ``orig``'s parameters (names, kinds, defaults, annotations, globals) that calls
    ``call(self, ...)``, and under TorchScript ``self._ek_script_forward(...)`` (the layer's own
    forward): TorchScript compiles a method from its source and signature, which a ``*args, **kwargs``
    wrapper does not give. The source carries ``orig``'s annotations as its source writes them:
    TorchScript reads parameter types there (a ``Dict[str, Tensor]`` argument is no ``Tensor``)."""
    sig = inspect.signature(orig)
    params = list(sig.parameters.values())
    plain = sig.replace(parameters=[p.replace(annotation=p.empty, default=p.empty) for p in params],
                        return_annotation=sig.empty)
    written, returns = _written_annotations(orig)
    if written.keys() == {p.name for p in params if p.annotation is not p.empty}:
        plain = sig.replace(parameters=[p.replace(annotation=_Text(written[p.name]) if p.name in written else p.empty,
                                                  default=p.empty) for p in params],
                            return_annotation=_Text(returns) if returns else sig.empty)
    me = params[0].name
    args = ", ".join(p.name if p.kind != p.KEYWORD_ONLY else f"{p.name}={p.name}" for p in params[1:])
    src = (f"from __future__ import annotations\n"
           f"def _ek_make(torch, _ek_call):\n"
           f"    def forward{plain}:\n"
           f"        if torch.jit.is_scripting():\n"
           f"            return {me}._ek_script_forward({args})\n"
           f"        return _ek_call({', '.join([me] + ([args] if args else []))})\n"
           f"    return forward\n")
    filename = f"<equikernels accelerated {orig.__qualname__} {next(_SOURCES)}>"
    linecache.cache[filename] = (len(src), None, src.splitlines(True), filename)  # for TorchScript's getsource
    namespace: dict = {}
    exec(compile(src, filename, "exec"), namespace)  # noqa: S102
    inner = namespace["_ek_make"](torch, call)
    # the original's globals: TorchScript resolves the names of its annotations there
    fn = types.FunctionType(inner.__code__, orig.__globals__, "forward", orig.__defaults__, inner.__closure__)
    fn.__kwdefaults__ = orig.__kwdefaults__
    fn.__annotations__ = dict(getattr(orig, "__annotations__", {}))
    fn.__doc__, fn.__module__, fn.__qualname__ = orig.__doc__, orig.__module__, orig.__qualname__
    return fn


def accelerated_class(adapter: str, cls: type) -> type:
    """The subclass of ``cls`` with ``adapter``'s overrides (one per adapter and class)."""
    if getattr(cls, "_ek_adapter", None) is not None:
        return cls
    key = (adapter, cls)
    if key not in _MADE:
        ns = dict(_OVERRIDES[adapter](cls))
        restore = ns.pop("_ek_restore", None)
        if restore is not None:
            ns["__setstate__"] = _setstate_with(cls, restore)
        if isinstance(getattr(cls, "forward", None), types.FunctionType):
            ns["_ek_script_forward"] = _script_copy(cls.forward)
        unused = list(getattr(cls, "__jit_unused_properties__", []))
        ns.update(_ek_adapter=adapter, _ek_base=cls, __getstate__=_getstate, __module__=__name__,
                  __qualname__=_name(adapter, cls), __doc__=cls.__doc__,
                  __jit_ignored_attributes__=_jit_ignored(cls),
                  __jit_unused_properties__=unused + ["__jit_ignored_attributes__"])
        _MADE[key] = type(cls.__name__, (cls,), ns)
    return _MADE[key]


def original_class(module) -> type:
    """The class ``module`` had before acceleration."""
    return getattr(type(module), "_ek_base", type(module))


def __getattr__(name: str):
    """Unpickling: rebuild the subclass named by ``_name``."""
    parts = name.split("|")
    if len(parts) == 3 and parts[0] not in _OVERRIDES:  # adapters register when their modules are imported
        importlib.import_module(f"{__package__}.registry")._load()
    if len(parts) != 3 or parts[0] not in _OVERRIDES:
        raise AttributeError(name)
    obj = importlib.import_module(parts[1].replace("/", "."))
    for attr in parts[2].split("/"):
        obj = getattr(obj, attr)
    return accelerated_class(parts[0], obj)
