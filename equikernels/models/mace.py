"""``MACE`` and ``ScaleShiftMACE``: mace-torch's models (0.3.16 conventions) built
from equikernels components, with mace-torch's call interface.

``forward(data, training=False, compute_force=True, compute_virials=False, compute_stress=False,
compute_displacement=False, ...)`` takes the same data dict (positions, node_attrs, edge_index,
shifts, unit_shifts, cell, batch, ptr, optional head) and returns the same keys, so calculators
and training loops written for mace-torch models run unchanged.

The structure comes from a JSON-able config (``from_mace`` writes it from a mace-torch model);
numbers (weights, U tensors, E0, scale/shift) live in the state dict.
"""
from __future__ import annotations

import contextlib
import copy
import re
import threading
from dataclasses import dataclass, field
from typing import Callable, Dict, List, Optional, Tuple

import torch
from torch import nn

from ..nn.frozen import mode, outside_inference_mode, state_without, version
from ..nn.linear import Linear
from ..nn.spherical_harmonics import SphericalHarmonics, ir_mul_permutation
from ..ops.conv import ConvGraph
from .data import PAIRED_KEY
from .pairing import EdgePairing
from .blocks import InteractionBlock, LinearReadout, NonLinearReadout, ProductBlock
from .mace_keys import mace_key_names
from .element_linear import ElementGroups
from .radial import RadialEmbedding, ZBLRepulsion

CONFIG_VERSION = 1

# precision name -> (parameter / geometry / energy dtype, node-feature dtype or None)
PRECISIONS = {"fp64": (torch.float64, None), "fp32": (torch.float32, None),
              "bf16-mixed": (torch.float32, torch.bfloat16), "fp16-mixed": (torch.float32, torch.float16)}
_PRECISION_ALIASES = {"float64": "fp64", "double": "fp64", torch.float64: "fp64",
                      "float32": "fp32", "float": "fp32", torch.float32: "fp32",
                      "bf16": "bf16-mixed", "bfloat16": "bf16-mixed", torch.bfloat16: "bf16-mixed",
                      "fp16": "fp16-mixed", "float16": "fp16-mixed", "half": "fp16-mixed", "16-mixed": "fp16-mixed",
                      torch.float16: "fp16-mixed"}


def resolve_precision(precision) -> str:
    """A precision name ("fp64", "fp32", "bf16-mixed", "fp16-mixed"), from it, an alias or a torch dtype."""
    key = precision.lower() if isinstance(precision, str) else precision
    if key in PRECISIONS:
        return key
    try:
        return _PRECISION_ALIASES[key]
    except (KeyError, TypeError):
        raise ValueError(f"precision: expected one of {tuple(PRECISIONS)} (or torch.float64/float32/bfloat16/"
                         f"float16), got {precision!r}") from None
REQUIRED_KEYS = ("positions", "node_attrs", "edge_index", "shifts", "batch", "ptr")
# per-system values of the last call (graph, edge pairing, checks): not pickled, copied or saved with the model
SYSTEM_CACHES = ("_pairing", "_conv_graph", "_ctx", "_checked_ei")
# a mace-torch state dict's key for E0 (``load_state_dict`` translates such dicts to our names)
_MACE_E0_KEY = "atomic_energies_fn.atomic_energies"
# mace-torch state entries without a counterpart here: fixed by the structure (masks, constants, flags)
_MACE_DERIVED = re.compile(r"(\.output_mask|\._w3j_[0-9_]+|\.weights_[0-9]+_zeroed|\.weights_max_zeroed"
                           r"|\.conv_tp\.weight|^radial_embedding\.bessel_fn\.r_max)$")

_TRUSTED = threading.local()


@contextlib.contextmanager
def trusted_inputs(node_feats: bool = True):
    """Within this context the models skip the edge-index bounds check (a device->host sync per
    call) and, with ``node_feats=False``, the "node_feats" output (returned as None). For callers
    whose graphs are valid by construction (the calculator's neighbour lists, CUDA-graph capture,
    where a sync is not allowed)."""
    old = getattr(_TRUSTED, "value", None)
    _TRUSTED.value = (node_feats,)
    try:
        yield
    finally:
        _TRUSTED.value = old


def _trusted() -> Optional[Tuple[bool]]:
    return getattr(_TRUSTED, "value", None)


@dataclass
class _NodeContext:
    """What depends only on the atoms (not on positions or parameters): element of each node and the
    element groups (one host sync to build), heads, E0 per node and per graph, scale/shift per
    node. Kept between calls on the same data tensors, so an MD step rebuilds none of it."""
    key: tuple
    element: torch.Tensor
    prod_element: torch.Tensor
    groups: ElementGroups
    node_z: torch.Tensor
    node_heads: torch.Tensor
    node_e0: torch.Tensor
    e0: torch.Tensor
    scale: Optional[torch.Tensor] = None
    shift: Optional[torch.Tensor] = None
    # element groups of the first num_out nodes, by num_out (``_interactions`` with ``num_out``)
    out_groups: Dict[int, ElementGroups] = field(default_factory=dict)

    def groups_of_first(self, num_out: int, num_elements: int) -> ElementGroups:
        g = self.out_groups.get(num_out)
        if g is None:
            g = self.out_groups[num_out] = ElementGroups.build(self.element[:num_out], num_elements)
        return g


class MACE(nn.Module):
    """MACE with E = sum E0[z] (+ ZBL) + sum of readouts; see ``ScaleShiftMACE`` for the scaled kind.

    ``config``: the structure (see ``equikernels.models.io.config_from_mace``); ``u_matrices``:
    per product block, per output irrep, per degree nu the U tensors (default: taken from the
    state dict loaded afterwards, as ``load`` and ``from_mace`` do).
    """

    def __init__(self, config: dict, u_matrices: Optional[list] = None) -> None:
        super().__init__()
        config = copy.deepcopy(config)
        if config.get("version", CONFIG_VERSION) != CONFIG_VERSION:
            raise ValueError(f"config: version {config.get('version')} is not supported (expected {CONFIG_VERSION})")
        self.config = config
        layout = config.get("layout", "ir_mul")
        if layout not in ("ir_mul", "mul_ir"):
            raise ValueError(f"config['layout']: expected 'ir_mul' or 'mul_ir', got {layout!r}")
        self.layout = layout
        self.heads: List[str] = list(config["heads"])
        self.num_elements = int(config["num_elements"])
        self.register_buffer("atomic_numbers", torch.tensor(config["atomic_numbers"], dtype=torch.int64))
        self.register_buffer("r_max", torch.tensor(float(config["r_max"])))
        self.register_buffer("num_interactions", torch.tensor(len(config["interactions"]), dtype=torch.int64))
        self.register_buffer("atomic_energies", torch.zeros(config["atomic_energies_shape"]))
        self.node_embedding = Linear(f"{self.num_elements}x0e", config["node_feats_irreps"], layout=layout)
        self.radial_embedding = RadialEmbedding(config["r_max"], config["num_bessel"], config["num_polynomial_cutoff"],
                                                config.get("radial_type", "bessel"),
                                                config.get("distance_transform", "None"),
                                                config.get("apply_cutoff", True))
        self.pair_repulsion = ZBLRepulsion(config["num_polynomial_cutoff"]) if config.get("pair_repulsion") else None
        self.spherical_harmonics = SphericalHarmonics(config["sh_irreps"], normalize=True, normalization="component",
                                                      layout=layout)
        self.interactions = nn.ModuleList(
            InteractionBlock(c, self.num_elements, config["sh_irreps"], self.radial_embedding.out_dim, layout)
            for c in config["interactions"])
        self.products = nn.ModuleList(
            ProductBlock(c, layout, None if u_matrices is None else u_matrices[i])
            for i, c in enumerate(config["products"]))
        self._u_ready = u_matrices is not None
        self.readouts = nn.ModuleList(
            (LinearReadout if c["type"] == "linear" else NonLinearReadout)(c, layout) for c in config["readouts"])
        self.use_agnostic_product = bool(config.get("use_agnostic_product", False))
        # mul_ir <-> ir_mul of each product's output, for the "node_feats" output (mace's layout)
        for i, c in enumerate(config["products"]):
            perm = None if layout == "mul_ir" else _inverse(ir_mul_permutation(c["hidden_irreps"]))
            self.register_buffer(f"_to_mul_ir_{i}", perm, persistent=False)

    # --- precision -------------------------------------------------------------------------------
    def set_precision(self, precision) -> "MACE":
        """Convert in place and return the model. "fp64" / "fp32": every parameter, buffer and
        intermediate in that dtype (``.double()`` / ``.float()``). "bf16-mixed" / "fp16-mixed":
        parameters stay float32 (masters for training; converted to float32 if they are not), as do
        positions, edge vectors, radial features, spherical harmonics, readouts, energies and forces;
        node features, the convolution's node operand and per-edge weights (radial MLP), the
        symmetric contraction's input and output, and the linear/skip layers run in the half type
        (every sum over edges, channels or paths is accumulated in float32 and rounded once)."""
        name = resolve_precision(precision)
        dtype, compute = PRECISIONS[name]
        self.to(dtype)
        self.__dict__["_compute_dtype"] = compute
        return self

    def to_mixed_precision(self, dtype: torch.dtype = torch.bfloat16) -> "MACE":
        """``set_precision("bf16-mixed")`` (or "fp16-mixed" for ``torch.float16``)."""
        if dtype not in (torch.bfloat16, torch.float16):
            raise ValueError(f"dtype: expected torch.bfloat16 or torch.float16, got {dtype!r}")
        return self.set_precision(dtype)

    @property
    def compute_dtype(self) -> Optional[torch.dtype]:
        """The node-feature dtype of a mixed-precision model; None for plain fp32/fp64."""
        return self.__dict__.get("_compute_dtype")

    @property
    def precision(self) -> str:
        """"fp64", "fp32", "bf16-mixed" or "fp16-mixed"; "fp16" / "bf16" for a model converted whole
        to a half type (``.half()``, ``.to(torch.bfloat16)``)."""
        compute = self.compute_dtype
        if compute is not None:
            return {torch.bfloat16: "bf16-mixed", torch.float16: "fp16-mixed"}[compute]
        dtype = self.atomic_energies.dtype
        return {torch.float64: "fp64", torch.float16: "fp16", torch.bfloat16: "bf16"}.get(dtype, "fp32")

    def _feature_dtype(self) -> Optional[torch.dtype]:
        compute = self.compute_dtype
        if compute is not None and self.atomic_energies.dtype != torch.float32:
            raise TypeError(f"precision {self.precision!r}: needs float32 parameters, the model is in "
                            f"{self.atomic_energies.dtype} (converted after set_precision?); call "
                            "set_precision again")
        return compute

    # --- loading ---------------------------------------------------------------------------------
    def __getstate__(self):
        return state_without(self, SYSTEM_CACHES)

    def load_state_dict(self, state_dict, strict: bool = True, assign: bool = False):
        """``nn.Module.load_state_dict``; also takes the state dict of a mace-torch model of the same
        structure (mace-torch's key names, e.g. from a mace-torch training checkpoint), translated to
        ours. Its entries fixed by the structure (output masks, e3nn constants) are not read."""
        if isinstance(state_dict, dict) and _MACE_E0_KEY in state_dict and "atomic_energies" not in state_dict:
            state_dict = self._from_mace_names(state_dict, strict)
        return super().load_state_dict(state_dict, strict=strict, assign=assign)

    def _from_mace_names(self, state_dict, strict: bool) -> dict:
        names = mace_key_names(self.config)
        ours_of = {theirs: ours for ours, theirs in names.items()}
        if strict:
            missing = [theirs for theirs in names.values() if theirs not in state_dict]
            unknown = [k for k in state_dict if k not in ours_of and not _MACE_DERIVED.search(k)]
            if missing or unknown:
                raise RuntimeError(f"state_dict: a mace-torch state dict of another structure than this "
                                   f"{type(self).__name__}: missing {missing[:4]}, unexpected {unknown[:4]}")
        return {ours_of[k]: v for k, v in state_dict.items() if k in ours_of}

    def _load_from_state_dict(self, *args, **kwargs):
        super()._load_from_state_dict(*args, **kwargs)
        self._u_ready = True  # the product blocks rebuild their tables from the loaded U buffers

    # --- graph preparation -----------------------------------------------------------------------
    def _check_data(self, data: Dict[str, torch.Tensor]) -> None:
        if not isinstance(data, dict):
            raise TypeError(f"data: expected a dict of tensors (mace-torch's batch format), got {type(data).__name__}")
        missing = [k for k in REQUIRED_KEYS if k not in data]
        if missing:
            raise KeyError(f"data: missing keys {missing} (expected {list(REQUIRED_KEYS)} and, for stress, "
                           "'unit_shifts' and 'cell')")
        dtype = self.atomic_energies.dtype
        pos, attrs, ei = data["positions"], data["node_attrs"], data["edge_index"]
        n = pos.shape[0]
        if pos.dim() != 2 or pos.shape[1] != 3:
            raise ValueError(f"data['positions']: expected shape [num_atoms, 3], got {tuple(pos.shape)}")
        if pos.dtype != dtype:
            raise TypeError(f"data['positions']: dtype {pos.dtype} does not match the model's {dtype} "
                            f"(convert the model with .to({pos.dtype}) or the data)")
        if attrs.shape != (n, self.num_elements):
            raise ValueError(f"data['node_attrs']: expected one-hot [num_atoms={n}, num_elements="
                             f"{self.num_elements}], got {tuple(attrs.shape)}")
        if ei.dim() != 2 or ei.shape[0] != 2 or ei.dtype not in (torch.int64, torch.int32):
            raise ValueError(f"data['edge_index']: expected an integer tensor [2, num_edges], got "
                             f"{tuple(ei.shape)} {ei.dtype}")
        if data["shifts"].shape != (ei.shape[1], 3):
            raise ValueError(f"data['shifts']: expected shape [num_edges={ei.shape[1]}, 3], got "
                             f"{tuple(data['shifts'].shape)}")
        if data["batch"].shape != (n,):
            raise ValueError(f"data['batch']: expected shape [num_atoms={n}], got {tuple(data['batch'].shape)}")
        if _paired(data):
            _check_paired(data)
        checked = self.__dict__.get("_checked_ei")
        if _trusted() is None and not (checked is not None and checked[0] is ei and checked[1] == (version(ei), n)):
            lo, hi = (torch.stack([ei.min(), ei.max()]).tolist() if ei.numel() else (0, 0))  # one host sync
            if lo < 0 or (ei.numel() and hi >= n):
                raise IndexError(f"data['edge_index']: node indices must lie in [0, {n})")
            self.__dict__["_checked_ei"] = (ei, (version(ei), n))  # held: its id cannot be reused
        for k in ("positions", "node_attrs", "edge_index", "shifts", "batch"):
            if data[k].device != self.atomic_energies.device:
                raise ValueError(f"data[{k!r}]: on {data[k].device}, the model is on {self.atomic_energies.device}")
        if not self._u_ready:
            raise RuntimeError("this MACE has no U tensors yet: build it with equikernels.models.from_mace or load(), "
                               "or pass u_matrices")

    # --- forward ---------------------------------------------------------------------------------
    def _context(self, data) -> _NodeContext:
        attrs, batch, ptr, head = data["node_attrs"], data["batch"], data["ptr"], data.get("head")
        tensors = (attrs, batch, ptr, head, self.atomic_energies, getattr(self, "scale", None),
                   getattr(self, "shift", None))
        key = (mode(),) + tuple((version(t), t.dtype, t.device) if t is not None else None for t in tensors)
        ctx = self.__dict__.get("_ctx")
        if (ctx is not None and ctx.key[1] == key and all(a is b for a, b in zip(ctx.key[0], tensors))
                and not torch.compiler.is_compiling()):
            return ctx
        num_graphs = int(ptr.numel() - 1)
        element = torch.argmax(attrs, dim=1)  # one-hot -> element index
        groups = ElementGroups.build(element, self.num_elements)
        node_heads = (head[batch] if head is not None else torch.zeros_like(batch)).to(torch.int64)
        e0_table = torch.atleast_2d(self.atomic_energies).T.to(dtype=attrs.dtype)
        n = attrs.shape[0]
        node_e0 = (attrs @ e0_table)[torch.arange(n, device=node_heads.device), node_heads]
        ctx = _NodeContext((tensors, key), element, torch.zeros_like(element) if self.use_agnostic_product else element,
                           groups, self.atomic_numbers[element].unsqueeze(-1), node_heads, node_e0,
                           _scatter(node_e0, batch, num_graphs))
        if hasattr(self, "scale"):
            ctx.scale = torch.atleast_1d(self.scale)[node_heads]
            ctx.shift = torch.atleast_1d(self.shift)[node_heads]
        self.__dict__["_ctx"] = ctx  # holds the tensors of its key, so their ids cannot be reused
        return ctx

    def _graph_of(self, edge_index: torch.Tensor, n: int, paired: bool = False) -> ConvGraph:
        """The ``ConvGraph`` of ``edge_index``, kept while the same tensor comes back unchanged (MD
        steps between neighbour-list rebuilds, a repeated batch): two sorts and a dozen launches less."""
        sender, receiver = edge_index[0], edge_index[1]
        if torch.compiler.is_compiling() or (edge_index.is_cuda and torch.cuda.is_current_stream_capturing()):
            return ConvGraph.build(sender, receiver, n, validate=False, paired=paired)
        key = (version(edge_index), n, edge_index.device, paired, mode())
        cached = self.__dict__.get("_conv_graph")
        if cached is not None and cached[0] is edge_index and cached[1] == key:
            return cached[2]
        graph = ConvGraph.build(sender, receiver, n, validate=False, paired=paired)
        self.__dict__["_conv_graph"] = (edge_index, key, graph)  # holds the tensor, so its id cannot be reused
        return graph

    def _features(self, data, ctx, compute_virials, compute_stress, compute_displacement):
        positions = data["positions"]
        if positions.is_leaf and not positions.requires_grad:
            positions.requires_grad_(True)
        batch, ptr, edge_index = data["batch"], data["ptr"], data["edge_index"]
        num_graphs = int(ptr.numel() - 1)
        sender, receiver = edge_index[0], edge_index[1]
        node_heads = ctx.node_heads
        displacement = torch.zeros((num_graphs, 3, 3), dtype=positions.dtype, device=positions.device)
        cell = data.get("cell")
        if compute_virials or compute_stress or compute_displacement:
            if "unit_shifts" not in data or cell is None:
                raise KeyError("data: 'unit_shifts' and 'cell' are required for virials/stress/displacement")
            displacement = data.get("displacement")
            if displacement is None:
                displacement = torch.zeros((num_graphs, 3, 3), dtype=positions.dtype, device=positions.device)
                # in the autograd graph (for a gradient), per structure: a NaN one's 0 * NaN stays out of the others
                zero = (positions.sum() * 0.0).view(1, 1, 1) if num_graphs == 1 else \
                    _scatter(positions.sum(dim=1) * 0.0, batch, num_graphs).view(-1, 1, 1)
                displacement = displacement + zero
            sym = 0.5 * (displacement + displacement.transpose(-1, -2))
            # mace-torch strains positions and cell: pos (1 + S), shifts = unit_shifts cell (1 + S). Every
            # edge vector is then vec0 (1 + S) with vec0 the unstrained vector, so the strain is applied
            # to edge vectors directly: the same values, and the stress gradient is one reduction
            # instead of the backward of per-node and per-edge gathers of S (slow with repeats)
            shifts = torch.einsum("be,bec->bc", data["unit_shifts"], cell.view(-1, 3, 3)[batch[sender]])
            vec0 = positions.index_select(0, receiver) - positions.index_select(0, sender) + shifts
            vectors = vec0 + _strain(vec0, sym, batch, sender, num_graphs)
        else:
            # index_select: its backward is an index_add, not the sort-based backward of pos[idx]
            vectors = positions.index_select(0, receiver) - positions.index_select(0, sender) + data["shifts"]
        lengths = torch.linalg.norm(vectors, dim=-1, keepdim=True)
        return positions, vectors, lengths, displacement, cell, node_heads, num_graphs

    def _interactions(self, data, ctx, vectors, lengths, node_heads, num_out: Optional[int] = None,
                      between_layers: Optional[Callable[[torch.Tensor], torch.Tensor]] = None,
                      graph: Optional[ConvGraph] = None):
        """Runs every layer; returns per-node readout energies [per readout] and node features.
        ``num_out``: only the first ``num_out`` nodes receive messages; each layer's node update and
        the readouts run on those rows only, and ``between_layers`` (required then, for a model of
        several layers) maps their features [num_out, ...] to the next layer's input [n, ...].
        ``graph``: the ``ConvGraph`` of ``data["edge_index"]`` (built here if None)."""
        node_attrs = data["node_attrs"]
        n = node_attrs.shape[0]
        sender, receiver = data["edge_index"][0], data["edge_index"][1]
        groups, node_z = ctx.groups, ctx.node_z
        paired = _paired(data)
        if graph is None:
            graph = self._graph_of(data["edge_index"], n, paired)  # one graph, reused by every layer
        elif graph.num_nodes != n or graph.num_edges != sender.shape[0]:
            raise ValueError(f"graph: built for {graph.num_nodes} nodes and {graph.num_edges} edges, the data has "
                             f"{n} and {sender.shape[0]}")
        half = self._feature_dtype()
        node_feats = self.node_embedding(node_attrs)
        if half is not None:  # the blocks follow the node features' dtype (per-edge weights included)
            node_feats = node_feats.to(half)
        edge_attrs = self.spherical_harmonics(vectors)
        if paired:  # an edge and its reverse have one length: radial features of the first half
            h = sender.shape[0] // 2
            edge_feats, cutoff = self.radial_embedding(lengths[:h], node_z, sender[:h], receiver[:h])
        else:
            edge_feats, cutoff = self.radial_embedding(lengths, node_z, sender, receiver)
        pair = None
        if self.pair_repulsion is not None:
            pair = self.pair_repulsion(lengths, node_z, sender, receiver, n)
        prod_element, out_groups = ctx.prod_element, None
        if num_out is not None:
            prod_element, node_heads = prod_element[:num_out], node_heads[:num_out]
            pair = None if pair is None else pair[:num_out]
            out_groups = ctx.groups_of_first(num_out, self.num_elements)
        feats = []
        for k, (interaction, product) in enumerate(zip(self.interactions, self.products)):
            if k and between_layers is not None:
                node_feats = between_layers(node_feats)
            elif k and num_out is not None and node_feats.shape[0] != n:
                raise ValueError("num_out: a model of several layers needs between_layers to refill the other rows")
            # with num_out, rows past it receive no messages: their update is never computed
            node_feats, sc = interaction(node_feats, groups, edge_attrs, edge_feats, cutoff, graph, num_out, out_groups,
                                         paired)
            node_feats = product(node_feats, sc, prod_element)
            feats.append(node_feats)
        node_es = []
        for i, readout in enumerate(self.readouts):
            x = feats[-1] if len(self.readouts) == 1 else feats[i]
            e = readout(x if half is None else x.to(vectors.dtype), node_heads)  # energies: full precision
            # one head: its column (a view); several: each node's head
            node_es.append(e[:, 0] if e.shape[1] == 1 else e.gather(1, node_heads[:, None]).squeeze(1))
        trusted = _trusted()
        if trusted is not None and not trusted[0]:
            return node_es, pair, None
        perms = [getattr(self, f"_to_mul_ir_{i}") for i in range(len(feats))]
        mul_ir = [f if p is None else f.index_select(1, p) for f, p in zip(feats, perms)]
        out = torch.cat(mul_ir, dim=-1)
        return node_es, pair, out if half is None else out.to(vectors.dtype)

    def _pair(self, data, per_edge_outputs: bool, training: bool):
        """``data`` with paired edges where ``models.pairing`` pairs them (the pairing state is kept
        on the instance, not saved)."""
        pairing = self.__dict__.get("_pairing")
        if pairing is None:
            pairing = self.__dict__["_pairing"] = EdgePairing()
        return pairing(data, per_edge_outputs, training)

    def _common(self, data, compute_virials, compute_stress, compute_displacement, lammps_mliap,
                per_edge_outputs=False, training=False):
        """What both energy models share: checks, pairing, geometry, E0 and the interaction layers;
        the data evaluated comes last."""
        if lammps_mliap:
            raise NotImplementedError("lammps_mliap: the LAMMPS ML-IAP interface is not supported")
        if not isinstance(data, dict) and callable(getattr(data, "to_dict", None)):
            data = data.to_dict()  # a torch_geometric Batch, as mace-torch's data loaders give
        self._check_data(data)
        data = self._pair(data, per_edge_outputs, training)
        ctx = self._context(data)
        positions, vectors, lengths, displacement, cell, node_heads, num_graphs = self._features(
            data, ctx, compute_virials, compute_stress, compute_displacement)
        batch = data["batch"]
        node_e0, e0 = ctx.node_e0, ctx.e0.to(vectors.dtype)
        node_es, pair, node_feats = self._interactions(data, ctx, vectors, lengths, node_heads)
        return (positions, vectors, displacement, cell, node_heads, num_graphs, batch, node_e0, e0, node_es, pair,
                node_feats, ctx, data)

    def edge_node_energies(self, node_attrs: torch.Tensor, edge_index: torch.Tensor, vectors: torch.Tensor,
                           head: Optional[torch.Tensor] = None, num_out: Optional[int] = None,
                           between_layers: Optional[Callable[[torch.Tensor], torch.Tensor]] = None,
                           graph: Optional[ConvGraph] = None) -> torch.Tensor:
        """Per-node energies (E0 included, as ``node_energy``) of one graph given by its edge vectors
        (``vectors[e]`` = x[receiver] - x[sender], ``edge_index`` = [sender, receiver]; no positions,
        cell or shifts): differentiate them with respect to ``vectors`` for per-edge forces.
        ``num_out`` / ``between_layers`` / ``graph`` (the ``ConvGraph`` of ``edge_index``, trusted to
        be its edges): see ``_interactions``; the result has ``num_out`` rows then. Passing the same
        ``node_attrs`` and ``head`` tensors again reuses what depends only on the atoms."""
        n = node_attrs.shape[0]
        if vectors.dim() != 2 or vectors.shape[1] != 3 or edge_index.shape != (2, vectors.shape[0]):
            raise ValueError(f"vectors / edge_index: expected [E, 3] and [2, E], got {tuple(vectors.shape)} and "
                             f"{tuple(edge_index.shape)}")
        if not self._u_ready:
            raise RuntimeError("this MACE has no U tensors yet: build it with equikernels.models.from_mace or load()")
        cached = self.__dict__.get("_one_graph")  # batch / ptr of one graph of n nodes, kept for _context's key
        if cached is None or cached[0] != (n, node_attrs.device):
            cached = self.__dict__["_one_graph"] = (
                (n, node_attrs.device), torch.zeros(n, dtype=torch.int64, device=node_attrs.device),
                torch.tensor([0, n], dtype=torch.int64, device=node_attrs.device))
        data = {"node_attrs": node_attrs, "edge_index": edge_index, "batch": cached[1], "ptr": cached[2], "head": head}
        ctx = self._context(data)
        lengths = torch.linalg.norm(vectors, dim=-1, keepdim=True)
        with trusted_inputs(node_feats=False):
            node_es, pair, _ = self._interactions(data, ctx, vectors, lengths, ctx.node_heads, num_out, between_layers,
                                                  graph)
        rows = n if num_out is None else num_out
        return self._node_energy(ctx, ctx.node_e0[:rows], pair, node_es)

    def _node_energy(self, ctx, node_e0, pair, node_es) -> torch.Tensor:
        total = node_e0 if pair is None else node_e0 + pair
        for es in node_es:
            total = total + es
        return total

    @outside_inference_mode
    def forward(self, data: Dict[str, torch.Tensor], training: bool = False, compute_force: bool = True,
                compute_virials: bool = False, compute_stress: bool = False, compute_displacement: bool = False,
                compute_hessian: bool = False, compute_edge_forces: bool = False,
                compute_atomic_stresses: bool = False, lammps_mliap: bool = False) -> Dict[str, Optional[torch.Tensor]]:
        (positions, vectors, displacement, cell, node_heads, num_graphs, batch, node_e0, e0, node_es, pair,
         node_feats, ctx, data) = self._common(data, compute_virials, compute_stress, compute_displacement,
                                               lammps_mliap, compute_edge_forces or compute_atomic_stresses, training)
        pair_node = pair if pair is not None else torch.zeros_like(node_e0)
        energies = [e0, _scatter(pair_node, batch, num_graphs) if pair is not None else torch.zeros_like(e0)]
        node_energies = [node_e0, pair_node]
        for es in node_es:
            energies.append(_scatter(es, batch, num_graphs))
            node_energies.append(es)
        contributions = torch.stack(energies, dim=-1)
        total = torch.sum(contributions, dim=-1)
        node_energy = torch.sum(torch.stack(node_energies, dim=-1), dim=-1)
        out = _outputs(total, positions, displacement, vectors, cell, data, training, compute_force,
                       compute_virials, compute_stress, compute_hessian, compute_edge_forces, compute_atomic_stresses)
        return {"energy": total, "node_energy": node_energy, "contributions": contributions, **out,
                "displacement": displacement, "node_feats": node_feats}


class ScaleShiftMACE(MACE):
    """MACE with E = sum E0[z] + sum_i (scale[head] * (ZBL_i + sum readouts_i) + shift[head])."""

    def __init__(self, config: dict, u_matrices: Optional[list] = None) -> None:
        super().__init__(config, u_matrices)
        shape = config.get("scale_shift_shape", [])
        self.register_buffer("scale", torch.ones(shape))
        self.register_buffer("shift", torch.zeros(shape))

    def _node_energy(self, ctx, node_e0, pair, node_es) -> torch.Tensor:
        terms = ([pair] if pair is not None else []) + node_es
        inter = terms[0]
        for t in terms[1:]:
            inter = inter + t
        rows = node_e0.shape[0]
        return node_e0 + (ctx.scale[:rows] * inter + ctx.shift[:rows])

    @outside_inference_mode
    def forward(self, data: Dict[str, torch.Tensor], training: bool = False, compute_force: bool = True,
                compute_virials: bool = False, compute_stress: bool = False, compute_displacement: bool = False,
                compute_hessian: bool = False, compute_edge_forces: bool = False,
                compute_atomic_stresses: bool = False, lammps_mliap: bool = False) -> Dict[str, Optional[torch.Tensor]]:
        (positions, vectors, displacement, cell, node_heads, num_graphs, batch, node_e0, e0, node_es, pair,
         node_feats, ctx, data) = self._common(data, compute_virials, compute_stress, compute_displacement,
                                               lammps_mliap, compute_edge_forces or compute_atomic_stresses, training)
        # sum of (ZBL, readouts) in mace-torch's order; a missing ZBL term adds an exact zero
        terms = ([pair] if pair is not None else []) + node_es
        node_inter = terms[0]
        for t in terms[1:]:
            node_inter = node_inter + t
        node_inter = ctx.scale * node_inter + ctx.shift
        inter_e = _scatter(node_inter, batch, num_graphs)
        total = e0 + inter_e
        node_energy = node_e0.double() + node_inter.double()  # float64, as mace-torch (a new tensor)
        out = _outputs(inter_e, positions, displacement, vectors, cell, data, training, compute_force,
                       compute_virials, compute_stress, compute_hessian, compute_edge_forces,
                       compute_atomic_stresses)
        return {"energy": total, "node_energy": node_energy, "interaction_energy": inter_e, **out,
                "displacement": displacement, "node_feats": node_feats}


def _strain(vec0: torch.Tensor, sym: torch.Tensor, batch: torch.Tensor, sender: torch.Tensor, num_graphs: int
            ) -> torch.Tensor:
    """vec0 @ S[graph of each edge]."""
    if num_graphs == 1:
        return vec0 @ sym[0]
    s_edge = sym.index_select(0, batch.index_select(0, sender))  # backward: index_add, not a sort
    return torch.einsum("ei,eij->ej", vec0, s_edge)


def _inverse(perm: Optional[torch.Tensor]) -> Optional[torch.Tensor]:
    if perm is None:
        return None
    inv = torch.empty_like(perm)
    inv[perm] = torch.arange(perm.numel())
    return inv


def _paired(data) -> bool:
    """Whether ``data`` declares its edges paired (``PAIRED_KEY``); a device tensor is refused (it
    would cost a sync per call)."""
    flag = data.get(PAIRED_KEY)
    if flag is None:
        return False
    if isinstance(flag, torch.Tensor):
        if flag.device.type != "cpu" or flag.numel() != 1:
            raise ValueError(f"data[{PAIRED_KEY!r}]: expected a bool or a one-element CPU tensor, got "
                             f"{tuple(flag.shape)} on {flag.device}")
        return bool(flag)
    if not isinstance(flag, bool):
        raise TypeError(f"data[{PAIRED_KEY!r}]: expected a bool, got {type(flag).__name__}")
    return flag


def _check_paired(data) -> None:
    """Edges E/2 + p must be edges p reversed (skipped under ``trusted_inputs``: one host sync)."""
    ei, shifts = data["edge_index"], data["shifts"]
    e = ei.shape[1]
    if e % 2:
        raise ValueError(f"data[{PAIRED_KEY!r}]: paired edges need an even number of edges, got {e}")
    if _trusted() is not None:
        return
    h = e // 2
    if not bool((ei[:, h:] == ei[:, :h].flip(0)).all() & (shifts[h:] == -shifts[:h]).all()):  # one sync
        raise ValueError(f"data[{PAIRED_KEY!r}]: edge E/2 + p must be edge p reversed (sender and receiver "
                         "swapped, shift negated)")


def _scatter(src: torch.Tensor, index: torch.Tensor, size: int) -> torch.Tensor:
    return src.new_zeros((size,) + src.shape[1:]).index_add(0, index, src)


def _grad(outputs, inputs, create: bool):
    return torch.autograd.grad([outputs], inputs, grad_outputs=[torch.ones_like(outputs)], retain_graph=create,
                               create_graph=create, allow_unused=True)


def _outputs(energy, positions, displacement, vectors, cell, data, training, compute_force, compute_virials,
             compute_stress, compute_hessian, compute_edge_forces, compute_atomic_stresses) -> dict:
    """forces = -dE/dpos; virials = -dE/d(strain); stress = dE/d(strain) / volume (mace-torch's signs)."""
    keep = training or compute_hessian or compute_edge_forces or compute_atomic_stresses
    forces = virials = stress = hessian = edge_forces = atomic_virials = atomic_stresses = None
    if compute_virials or compute_stress:
        f, v = _grad(energy, [positions, displacement], keep)
        stress = torch.zeros_like(displacement)
        if compute_stress and v is not None:
            stress = _per_volume(v, _volumes(cell))
        forces = -1 * (f if f is not None else torch.zeros_like(positions))
        virials = -1 * (v if v is not None else torch.zeros((1, 3, 3)))
    elif compute_force:
        (f,) = _grad(energy, [positions], keep)
        forces = -1 * (f if f is not None else torch.zeros_like(positions))
    if compute_hessian:
        if forces is None:
            raise ValueError("compute_hessian: needs compute_force=True")
        rows = []
        flat = forces.reshape(-1)
        for k in range(flat.numel()):
            (g,) = torch.autograd.grad(-flat[k], positions, retain_graph=True, allow_unused=True)
            rows.append(torch.zeros_like(positions) if g is None else g.detach())
        hessian = torch.stack(rows) if rows else positions.new_zeros(0, *positions.shape)
    if compute_edge_forces or compute_atomic_stresses:
        (g,) = _grad(energy, [vectors], training or compute_hessian)
        edge_forces = g if g is not None else torch.zeros_like(vectors)  # +dE/dvec (LAMMPS sign, as mace-torch)
        if compute_atomic_stresses:
            atomic_virials, atomic_stresses = _atomic_virials(edge_forces, data, vectors, positions.shape[0], cell)
    return {"forces": forces, "edge_forces": edge_forces, "virials": virials, "stress": stress,
            "atomic_virials": atomic_virials, "atomic_stresses": atomic_stresses, "hessian": hessian}


def _atomic_virials(edge_forces, data, vectors, num_atoms, cell):
    ei = data["edge_index"]
    ev = torch.einsum("zi,zj->zij", edge_forces, vectors)
    v = (_scatter(ev, ei[0], num_atoms) + _scatter(ev, ei[1], num_atoms)) / 2
    v = (v + v.transpose(-1, -2)) / 2
    return -1 * v, _per_volume(v, _volumes(cell)[data["batch"]])


def _volumes(cell: torch.Tensor) -> torch.Tensor:
    """|det| of each 3x3 cell, in float32 at least: half dtypes have no determinant and overflow at
    volumes above 65,504 A^3 (float16)."""
    c = cell.view(-1, 3, 3)
    return torch.linalg.det(c.to(torch.promote_types(c.dtype, torch.float32))).abs()


def _per_volume(v: torch.Tensor, volume: torch.Tensor) -> torch.Tensor:
    """``v`` [n, 3, 3] divided by ``volume`` [n], in the volume's dtype; zero where no cell
    (volume 0), in ``v``'s dtype."""
    s = v.to(volume.dtype) / volume.view(-1, 1, 1)
    return torch.where(torch.abs(s) < 1e10, s, torch.zeros_like(s)).to(v.dtype)
