"""Weighted-factor sums: the double backward's terms that differ in one factor and the weight.

The double backward's tables are sums of terms such as ``T(a, y, w) + T(x, b, w) + T(x, y, c)``
(ir.double_backward_tables). Two paths of one output with the same coefficients, labels and
factors except one factor and the per-row weight (``a, w`` against ``x, c``) are one path whose
factor is ``a * w + x * c``: the coefficients are contracted once instead of once per term, and the
sum is shared by every output that reads it (``dg`` and ``dy`` both read ``a * w + x * c``).

``Combo`` stands for such a sum in a path's factor list (the emitter loads each term and adds);
its addressing fields are its first term's, and every term has the same layout.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Dict, FrozenSet, List, Optional, Sequence, Tuple

from ..ir import Factor, Path


@dataclass(frozen=True)
class Combo:
    """sum over ``terms`` of factor * weight (weight None: the factor alone), per component."""
    terms: Tuple[Tuple[Factor, Optional[Factor]], ...]

    @property
    def operand(self) -> str:
        return self.terms[0][0].operand

    @property
    def segment(self) -> int:
        return self.terms[0][0].segment

    @property
    def base(self) -> int:
        return self.terms[0][0].base

    @property
    def strides(self):
        return self.terms[0][0].strides


def _big(f: Factor, sizes: Dict[str, int]) -> FrozenSet[str]:
    return frozenset(l for l, _ in f.strides if sizes[l] > 1)


def _comps(p: Path, n: int) -> int:
    return len({comps[n] for comps, _, _ in p.entries})


def _outs(p: Path) -> int:
    return len({k for _, k, _ in p.entries})


def _foldable(p: Path, n: int, rows: FrozenSet[str]) -> bool:
    """Whether ``p``'s weight can multiply its factor ``n`` component-wise: both per row and the
    weight's channels a subset of the factor's (the product has the factor's block shape)."""
    f, w = p.factors[n], p.weight
    if w is None or f.operand not in rows or w.operand not in rows:
        return False
    sizes = p.label_sizes
    return _big(w, sizes) <= _big(f, sizes)


def merge(items: Sequence[tuple], rows: FrozenSet[str]) -> List[tuple]:
    """``items`` (group index, path, bounds) with paths merged into Combo factors where that saves
    arithmetic: paths of one group and bounds that differ only in factor ``n`` and the weight are
    merged when the factor has at most as many components as the output, or when a merge of the
    same factor terms is made anyway (its sum is then shared). A merged path takes the place of its
    first member. A lone path keeps its weight (folded into a factor it saves few products and
    holds more registers)."""
    cands: Dict[tuple, List[int]] = {}
    for i, (gi, p, bounds) in enumerate(items):
        for n in range(len(p.factors)):
            if _foldable(p, n, rows):
                rest = p.factors[:n] + p.factors[n + 1:]
                key = (gi, tuple(sorted(bounds.items())), n, rest, p.output, p.labels, p.entries)
                cands.setdefault(key, []).append(i)
    done: Dict[int, Path] = {}
    gone = set()
    made = set()  # the (factor, weight) term sets merged so far

    def terms_of(members, n):
        return tuple((items[i][1].factors[n], items[i][1].weight) for i in members)

    def take(key, members):
        n = key[2]
        first = items[members[0]][1]
        combo = Combo(terms_of(members, n))
        done[members[0]] = Path(first.factors[:n] + (combo,) + first.factors[n + 1:], None, first.output,
                                first.labels, first.entries)
        gone.update(members[1:])
        made.add(frozenset(combo.terms))

    # cheap merges first (a factor of few components), then those sharing a sum already made
    ordered = sorted(cands.items(), key=lambda kv: (_comps(items[kv[1][0]][1], kv[0][2]), kv[1][0]))
    for key, members in ordered:
        free = [i for i in members if i not in gone and i not in done]
        if len(free) > 1 and _comps(items[free[0]][1], key[2]) <= _outs(items[free[0]][1]):
            take(key, free)
    for key, members in ordered:
        free = [i for i in members if i not in gone and i not in done]
        if len(free) > 1 and frozenset(terms_of(free, key[2])) in made:
            take(key, free)
    res = []
    for i, (gi, p, bounds) in enumerate(items):
        if i in gone:
            continue
        res.append((gi, done.get(i, p), bounds))
    return res
