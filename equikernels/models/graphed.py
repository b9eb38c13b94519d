"""Energy + forces (+ stress) of a MACE model at fixed, padded shapes, replayed as a CUDA graph.

A small system's step is bound by the host (hundreds of launches, the autograd engine); a CUDA
graph replays the whole forward and force backward as one launch. Graphs need fixed shapes, so
atoms and edges are padded up to buckets and the graph is re-captured only when a bucket changes:

* padding atoms form one extra graph of the batch (their energy is dropped), element 0, at the
  origin; they have no edges to real atoms, so nothing of theirs reaches the real graphs;
* padding edges are self-edges of the first padding atom shifted by one vector of a padding cell
  of side ``PAD_LENGTH_FACTOR * r_max``, i.e. length beyond the cutoff: the envelope is exactly
  zero there, so their messages, radial weights and gradients are exact zeros.

The same holds for real edges beyond the cutoff, so callers may pass a Verlet candidate list
(cutoff + skin) unfiltered: it is then constant between neighbour-list rebuilds. Inside the graph
the candidates are partitioned (within the cutoff first, in their order; a stable sort of a mask)
and the model sees only the first ``capacity`` of them: the edges within the cutoff plus a few
percent of headroom, instead of every candidate (a skin of 0.5 A at a 6 A cutoff adds 27 % of
edges, all computed to give zeros). The number within is read back after each call; should it
exceed the capacity, the capacity grows and the call is re-captured and repeated.

Everything inside the captured region is free of host syncs: the model runs under
``trusted_inputs`` (no index checks) after eager warm-up calls that build every per-structure and
per-weight cache (element groups, scaled weights), and the stress volume is a triple product.
``GraphedModel(model, capture=False)`` runs the same padded evaluation eagerly (any device; the
tests use it to show that padding changes nothing).

With ``pairs=True`` the candidates hold each pair once (a half neighbour list): the model sees the
first ``capacity`` pairs within the cutoff followed by the same edges reversed (``PAIRED_KEY``), so
that its radial MLPs run once per pair; capacity and count are then numbers of pairs.

``to_host`` is the calculator's call: the graph also packs energies, forces (stress) and the count of
edges within the cutoff into one float64 buffer, so that everything reaches the host in one copy,
which is also the call's only synchronisation.
"""
from __future__ import annotations

import math
import warnings
from typing import Dict, Optional

import numpy as np
import torch

from ..nn.frozen import version
from .data import PAIRED_KEY, with_reverses
from .mace import trusted_inputs

PAD_DEGREE = 128  # most padding edges per padding atom (about a real atom's degree)
PAD_LENGTH_FACTOR = 3.0  # padding edges are this many r_max long (and at least 10 A: beyond ZBL's reach)
CAPACITY_STEP = 32  # the model's edge count is rounded up to a multiple of this
MAX_HEADROOM = 0.16  # the most spare edges re-captures grow the model's view to
BUCKET_HEADROOM = 0.05  # spare candidate slots of a new bucket (memory only: the model sees ``capacity``)
KEYS = ("positions", "node_attrs", "edge_index", "shifts", "unit_shifts", "cell", "batch", "head")


def bucket(n: int, minimum: int = 64, steps_per_octave: int = 8) -> int:
    """n rounded up to a multiple of 2^floor(log2 n) / steps_per_octave (<= 12.5 % padding), at least
    ``minimum``."""
    n = max(int(n), 1)
    q = max(1, 2 ** max(0, int(math.log2(n)) - int(math.log2(steps_per_octave))))
    return max(minimum, -(-n // q) * q)


class GraphedModel:
    """``GraphedModel(model)(data, compute_stress=False)`` -> {"energy" [G], "node_energy" [N],
    "forces" [N, 3], ("stress" [G, 3, 3])} for a mace-torch-style data dict of G graphs.

    ``capture``: None = CUDA graphs on CUDA devices, eager elsewhere; False = padded eager
    evaluation. Returned tensors are views of static buffers, overwritten by the next call.
    ``edge_headroom``: extra fraction of edges the model sees beyond those within the cutoff, so
    that a slowly changing edge count (MD) rarely re-captures; a count beyond it re-captures with
    twice the headroom (up to ``MAX_HEADROOM``), so a drifting count settles after a few captures.
    ``pairs``: the data's edges hold each pair once (see the module docstring).
    """

    def __init__(self, model: torch.nn.Module, capture: Optional[bool] = None, edge_headroom: float = 0.02,
                 warmup: int = 2, pairs: bool = False) -> None:
        self.model = model
        self.pairs = bool(pairs)
        self.capture = capture
        self.edge_headroom = float(edge_headroom)
        self._headroom = self.edge_headroom  # doubles at each re-capture for a grown count
        self.warmup = int(warmup)
        self.r_max = float(model.r_max)
        self.num_captures = 0  # graphs captured so far (tests and logs)
        self.num_shapes = 0  # padded shapes (buckets) allocated so far
        self.disabled_reason: Optional[str] = None  # set when capture failed: eager from then on
        self._shape = None
        self._graph = None
        self._static: Dict[str, torch.Tensor] = {}
        self._out: Dict[str, torch.Tensor] = {}
        self._seen: Dict[str, tuple] = {}
        self._capacity: Optional[int] = None  # edges the model sees (the first after the partition)
        self._count: Optional[torch.Tensor] = None  # candidates within the cutoff, at the last call
        self._host: Optional[torch.Tensor] = None  # pinned copy of the packed results

    # --- shapes and buffers ------------------------------------------------------------------
    def _fits(self, n: int, e: int, key) -> bool:
        if self._shape is None or self._shape[2:] != key:
            return False
        nb, eb = self._shape[:2]
        # keep the bucket while it fits and is not much too large (a shrinking system re-buckets)
        # (the atom bound uses the most padding edges the edge bucket can hold, so that edge-count
        # fluctuations within the bucket never re-capture; a shrinking system still re-buckets)
        deg = self._pad_degree()
        return (n + 1 <= nb and e <= eb and eb - e <= (nb - n) * deg
                and bucket(n + 1 + -(-eb // deg)) >= nb and eb <= max(2 * e, 256))

    def _pad_degree(self) -> int:
        """Most padding candidates per padding atom (a pair's reverse doubles its edges)."""
        return PAD_DEGREE // 2 if self.pairs else PAD_DEGREE

    def _allocate(self, data, nb: int, eb: int, g: int, stress: bool) -> None:
        pos = data["positions"]
        dev, dt = pos.device, pos.dtype
        pad = max(PAD_LENGTH_FACTOR * self.r_max, 10.0)
        s = {
            "positions": torch.zeros(nb, 3, dtype=dt, device=dev),
            "node_attrs": torch.zeros(nb, data["node_attrs"].shape[1], dtype=data["node_attrs"].dtype, device=dev),
            "edge_index": torch.zeros(2, eb, dtype=torch.int64, device=dev),
            "shifts": torch.zeros(eb, 3, dtype=dt, device=dev),
            "unit_shifts": torch.zeros(eb, 3, dtype=dt, device=dev),
            "cell": torch.zeros(3 * (g + 1), 3, dtype=dt, device=dev),
            "batch": torch.full((nb,), g, dtype=torch.int64, device=dev),
            "ptr": torch.zeros(g + 2, dtype=torch.int64, device=dev),  # only its length is read
            "head": torch.zeros(g + 1, dtype=torch.int64, device=dev),
        }
        s["positions"].requires_grad_(True)
        s["cell"][3 * g:] = pad * torch.eye(3, dtype=dt, device=dev)
        self._pad = pad
        self._static = s
        self._seen = {}
        self._capacity = None
        self._headroom = self.edge_headroom
        self._count = torch.zeros((), dtype=torch.int64, device=dev)

    def _pad_edges(self, e: int, n: int) -> None:
        s = self._static
        # spread over the padding atoms: the node-parallel convolution walks one node's edges in
        # one program, so thousands of edges on one atom serialise (120 ms instead of 12 ms)
        nb = s["positions"].shape[0]
        s["edge_index"][:, e:] = n + torch.arange(s["edge_index"].shape[1] - e, device=s["edge_index"].device) % (nb - n)
        s["unit_shifts"][e:] = 0.0
        s["unit_shifts"][e:, 0] = 1.0
        s["shifts"][e:] = 0.0
        s["shifts"][e:, 0] = self._pad

    def _load(self, data, n: int, e: int, g: int) -> bool:
        """Copies changed inputs into the static buffers; returns whether the atoms' identity (elements,
        graphs, heads) changed, which needs a new capture (element groups are baked into it)."""
        s = self._static
        atoms_changed = False
        with torch.no_grad():
            for k in KEYS:
                src = data.get(k)
                if k in ("unit_shifts", "cell", "head") and src is None:
                    continue
                ident = (src, version(src), n, e)
                old = self._seen.get(k)
                if old is not None and old[0] is src and old[1:] == ident[1:]:
                    continue  # the same tensor, unmodified: nothing to copy
                if k == "positions":
                    s[k][:n].copy_(src)
                elif k == "edge_index":
                    s[k][:, :e].copy_(src)
                    self._pad_edges(e, n)
                elif k in ("shifts", "unit_shifts"):
                    s[k][:e].copy_(src)
                    self._pad_edges(e, n)
                elif k == "cell":
                    s[k][:3 * g].copy_(src.reshape(3 * g, 3))
                else:  # node_attrs, batch, head: the structure
                    dst = s[k][:g] if k == "head" else s[k][:n]
                    src_ = src.reshape(-1).expand(g) if k == "head" else src
                    # another atom count reloads too: the earlier system's last atoms become padding
                    if not (old is not None and old[2] == n and torch.equal(dst, src_.to(dst.dtype))):
                        atoms_changed = atoms_changed or old is not None
                        dst.copy_(src_)
                        if k == "node_attrs":
                            s[k][n:] = 0
                            s[k][n:, 0] = 1  # padding atoms: the first element
                        elif k == "batch":
                            s[k][n:] = g
                self._seen[k] = ident
            if "unit_shifts" not in data or data.get("unit_shifts") is None:
                s["unit_shifts"][:e] = 0.0
        return atoms_changed

    def _set_capacity(self, count: int) -> None:
        eb = self._static["edge_index"].shape[1]
        self._capacity = min(eb, -(-int(count * (1 + self._headroom) + 1) // CAPACITY_STEP) * CAPACITY_STEP)

    # --- evaluation ---------------------------------------------------------------------------
    def _within(self) -> torch.Tensor:
        """Mask of the candidate edges within the cutoff, their lengths computed as the model does."""
        s = self._static
        pos, ei = s["positions"].detach(), s["edge_index"]
        vec = pos.index_select(0, ei[1]) - pos.index_select(0, ei[0]) + s["shifts"]
        return torch.linalg.norm(vec, dim=-1) < self.r_max

    def _edges(self) -> Dict[str, torch.Tensor]:
        """The model's input: the first ``capacity`` candidates after the partition (no host sync)."""
        s = self._static
        with torch.no_grad():
            within = self._within()
            self._count.copy_(within.sum())
            order = torch.sort(torch.logical_not(within), stable=True).indices[:self._capacity]
            ei, shifts = s["edge_index"].index_select(1, order), s["shifts"].index_select(0, order)
            unit = s["unit_shifts"].index_select(0, order)
            if not self.pairs:
                return dict(s, edge_index=ei, shifts=shifts, unit_shifts=unit)
            ei, shifts, unit = with_reverses(ei, shifts, unit)
            return dict(s, edge_index=ei, shifts=shifts, unit_shifts=unit, **{PAIRED_KEY: True})

    def _run(self, g: int, stress: bool) -> Dict[str, torch.Tensor]:
        s = self._static
        data = self._edges()
        with trusted_inputs(node_feats=False):
            out = self.model(data, compute_force=True, compute_virials=stress, compute_stress=False, training=False)
        res = {"energy": out["energy"][:g], "node_energy": out["node_energy"], "forces": out["forces"]}
        if stress:
            cell = s["cell"].view(-1, 3, 3)[:g]
            volume = (cell[:, 0] * torch.linalg.cross(cell[:, 1], cell[:, 2])).sum(-1).abs()  # no solver
            st = -out["virials"][:g] / volume.view(-1, 1, 1)
            res["stress"] = torch.where(torch.abs(st) < 1e10, st, torch.zeros_like(st))  # as the model
        # everything the host reads, in one buffer: count, energies (stress), node energies, forces
        pieces = [self._count.reshape(1), res["energy"].reshape(-1)] + (
            [res["stress"].reshape(-1)] if stress else []) + [res["node_energy"].reshape(-1), res["forces"].reshape(-1)]
        res["packed"] = torch.cat([p.detach().to(torch.float64) for p in pieces])
        return res

    def _capture(self, g: int, stress: bool) -> None:
        self._graph = None
        use = self.capture if self.capture is not None else self._static["positions"].device.type == "cuda"
        if not use or self.disabled_reason is not None:
            return
        try:
            side = torch.cuda.Stream()
            side.wait_stream(torch.cuda.current_stream())
            with torch.cuda.stream(side):
                for _ in range(self.warmup):  # compiles kernels and fills every cache outside the capture
                    self._run(g, stress)
            torch.cuda.current_stream().wait_stream(side)
            graph = torch.cuda.CUDAGraph()
            with torch.cuda.graph(graph):
                out = self._run(g, stress)
            self._graph, self._out = graph, out
            self.num_captures += 1
        except Exception as exc:  # e.g. an op that syncs: stay correct, evaluate eagerly from now on
            self._graph = None
            self.disabled_reason = f"{type(exc).__name__}: {exc}"
            warnings.warn(f"equikernels: CUDA graph capture failed ({self.disabled_reason}); evaluating eagerly",
                          RuntimeWarning)

    def _call(self, g: int, stress: bool) -> Dict[str, torch.Tensor]:
        if self._graph is not None:
            self._graph.replay()
            return self._out
        return self._run(g, stress)

    def _evaluate(self, data: Dict[str, torch.Tensor], compute_stress: bool) -> tuple:
        """(static outputs, atoms, graphs) after one evaluation, the capacity not yet checked."""
        pos, ei = data["positions"], data["edge_index"]
        n, e = pos.shape[0], ei.shape[1]
        g = int(data["ptr"].numel() - 1)
        if compute_stress and (data.get("cell") is None or data.get("unit_shifts") is None):
            raise KeyError("data: 'unit_shifts' and 'cell' are required for stress")
        key = (g, bool(compute_stress), pos.dtype, pos.device, data["node_attrs"].shape[1])
        new_shape = not self._fits(n, e, key)
        if new_shape:
            eb = bucket(int(e * (1 + BUCKET_HEADROOM)) + 1)
            # enough padding atoms that none holds more than PAD_DEGREE padding edges
            nb = bucket(n + 1 + -(-(eb - e) // self._pad_degree()))
            self._graph = None
            self._allocate(data, nb, eb, g, compute_stress)
            self._shape = (nb, eb) + key
            self.num_shapes += 1
        changed = self._load(data, n, e, g)
        if self._capacity is None:
            with torch.no_grad():
                self._set_capacity(int(self._within().sum()))
            changed = True
        if new_shape or changed:
            self._capture(g, compute_stress)
        return self._call(g, compute_stress), n, g

    def _regrow(self, count: int, g: int, stress: bool) -> Optional[Dict[str, torch.Tensor]]:
        """None if the model saw every edge within the cutoff; else a new capacity, re-captured and
        evaluated again."""
        if count <= self._capacity:
            return None
        self._headroom = min(max(2 * self._headroom, self.edge_headroom), MAX_HEADROOM)
        self._set_capacity(count)
        self._capture(g, stress)
        return self._call(g, stress)

    def __call__(self, data: Dict[str, torch.Tensor], compute_stress: bool = False) -> Dict[str, torch.Tensor]:
        out, n, g = self._evaluate(data, compute_stress)
        again = self._regrow(int(self._count), g, compute_stress)
        out = out if again is None else again
        res = {"energy": out["energy"], "node_energy": out["node_energy"][:n], "forces": out["forces"][:n]}
        if compute_stress:
            res["stress"] = out["stress"]
        return res

    def to_host(self, data: Dict[str, torch.Tensor], compute_stress: bool = False) -> Dict[str, np.ndarray]:
        """As calling it, with NumPy float64 results (arrays of their own): one device->host copy."""
        out, n, g = self._evaluate(data, compute_stress)
        flat = self._fetch(out["packed"])
        again = self._regrow(int(flat[0]), g, compute_stress)
        if again is not None:
            flat = self._fetch(again["packed"])
        k = 1 + g
        res = {"energy": flat[1:k].copy()}
        if compute_stress:
            res["stress"] = flat[k:k + 9 * g].reshape(g, 3, 3).copy()
            k += 9 * g
        nb = (flat.shape[0] - k) // 4
        res["node_energy"] = flat[k:k + n].copy()
        res["forces"] = flat[k + nb:k + nb + 3 * n].reshape(n, 3).copy()
        return res

    def _fetch(self, packed: torch.Tensor) -> np.ndarray:
        if packed.device.type != "cuda":
            return packed.cpu().numpy()
        if self._host is None or self._host.shape != packed.shape:
            self._host = torch.empty(packed.shape, dtype=packed.dtype, pin_memory=True)
        self._host.copy_(packed)  # synchronous: the results are needed now
        return self._host.numpy()
