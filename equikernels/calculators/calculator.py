"""ASE calculator for MACE models (ours or mace-torch's): energy, forces, stress, per-atom energies.

Per step the host does little: positions go to the device once, the neighbour list is reused
while no atom moved more than half the skin (vesin runs on the model's device when it is rebuilt),
the one-hot element table, batch vector and cell stay on the device until they change, and all
results come back in one transfer.

With ``cuda_graph`` (equikernels MACE models on CUDA), energy + forces (+ stress) run as one CUDA
graph replay per step (``equikernels.models.graphed``): the unfiltered Verlet candidate list (pairs
within cutoff + skin; MACE's envelope makes the extra pairs contribute exact zeros) is padded to a
bucket, so shapes only change at a neighbour-list rebuild that leaves the bucket, which re-captures.
"""
from __future__ import annotations

import os
import warnings
from typing import Dict, List, Optional, Sequence, Union

import numpy as np
import torch
from ase import Atoms
from ase.calculators.calculator import Calculator, PropertyNotImplementedError, all_changes
from ase.stress import full_3x3_to_voigt_6_stress

from .. import settings
from .._compat import pyg_data, quiet_mace
from ..models.graphed import GraphedModel
from ..models.data import PAIRED_KEY, pair_edges
from ..models.mace import MACE, trusted_inputs
from .checks import MIN_VOLUME, check_finite, check_stress_cell, check_structure
from .committee import committee_properties, committee_results, member_properties
from .descriptors import descriptor_columns, layer_irreps
from .graph import AtomicNumbers, ElementTable, single_graph
from .loading import model_heads, resolve_device, resolve_dtype, resolve_head, resolve_model
from .mace_args import NAMES as MACE_TORCH_NAMES
from .mace_args import class_name, model_files, take_mace_torch_arguments
from .model_kinds import model_outputs
from .neighbors import DEFAULT_SKIN, SkinNeighborList, pbc_tensor, vesin_pairs
from .state import changes
from .threads import apply_threads
# cuda_graph=None reads EQUIKERNELS_CUDA_GRAPH (an on/off word or auto), else this. On: H200, MACE-MP-medium
# shape, 1,008 atoms, E+F 4.8 ms as one graph replay vs 11.5 ms eager
CUDA_GRAPH_DEFAULT = "auto"
CUDA_GRAPH_MAX_ATOMS = 16384  # "auto": graphs up to this size (no host syncs or launches; bigger steps fill the GPU)


ATOMIC_PROPERTIES = ["stresses", "virials"]  # with compute_atomic_stresses=True
PER_ATOM_ENERGIES = ("energies", "node_energy")
ASE_KEYWORDS = frozenset({"restart", "ignore_bad_restart_file", "label", "atoms", "directory"})


def _models_from_paths(model, model_paths, models=None) -> list:
    """``[model]`` (None: the bundled default), or the files of mace-torch's ``model_paths``, or the
    modules of its ``models``; each may be one or a list (``model`` is ``model_paths`` where
    mace-torch's calculator takes it first), and more than one make a committee."""
    given = [(name, v) for name, v in (("model", model), ("model_paths", model_paths), ("models", models))
             if v is not None]
    if len(given) > 1:
        raise ValueError(f"{' and '.join(n for n, _ in given)}: give one of them")
    if not given:
        return [None]
    name, value = given[0]
    items = list(value) if isinstance(value, (list, tuple)) else [value]
    if not items:
        raise ValueError(f"{name}: expected at least one model, got none")
    return items


class MACECalculator(Calculator):
    """ASE calculator running a MACE model on the device.

    Args:
        model: a ``torch.nn.Module`` with mace-torch's call interface, a model file (our format
            through ``equikernels.models.load``, or a mace-torch ``.model`` file), or None for the
            bundled default model.
        device: torch device; default CUDA when available, else CPU.
        default_dtype: "float64" or "float32"; None keeps the model's dtype. The model is
            converted in place (as mace-torch's calculator does), and its parameters frozen.
        head: which head of a multi-head model; default the only head or the one called 'default'.
        skin: Verlet skin in Angstrom (0 rebuilds the neighbour list every step).
        cuda_graph: True, False or "auto" (CUDA graphs up to ``CUDA_GRAPH_MAX_ATOMS`` atoms); None
            reads ``EQUIKERNELS_CUDA_GRAPH`` (default "auto"). Only for equikernels MACE models on CUDA;
            elsewhere, or if capture fails, evaluation is eager (with a warning when asked for).
        precision: None (the dtype above), or "fp64", "fp32", "bf16-mixed", "fp16-mixed" (equikernels
            MACE models; ``MACE.set_precision``). A mixed precision keeps float32 parameters,
            positions, energies and forces, so it excludes default_dtype="float64".
        model_paths: mace-torch's name for ``model``: a model file, a wildcard pattern or a list of
            them (``model`` takes them too); ``models`` (a module or a list of them) and mace-torch's
            other arguments (``mace_args``) are taken as its calculator takes them: ``info_keys``,
            ``arrays_keys`` and ``charges_key`` name the atoms keys of the total charge, spin and
            per-atom charges that a model with such inputs reads (``mace_args.StructureInputs``).
            Several models make a committee (``committee.py``): mean results, and per model
            (``energy_comm``, ...) and their variance (``energy_var``, ...). ``model_type``
            (``model_kinds``): what the model predicts, None from its class; mace-torch's dipole
            models give ``dipole`` (with energies for ``EnergyDipolesMACE``, alone for
            ``AtomicDipolesMACE``).
        compute_atomic_stresses: mace-torch's argument: every evaluation also gives per-atom virials
            (``virials`` [N, 3, 3], eV; they sum to the cell's virial) and, for a structure with a 3-D
            cell, per-atom stresses (``stresses`` [N, 6], Voigt, eV/A^3: the virials over the
            cell's volume, ``atoms.get_stresses()``); evaluation is then eager (no CUDA graphs).
        num_threads: torch CPU threads (``torch.set_num_threads``, process-wide) when the device is
            the CPU; None chooses ``threads.default_threads()`` unless ``OMP_NUM_THREADS`` is set
            (a count set earlier with ``torch.set_num_threads`` is replaced: pass it here to keep
            it); ignored on other devices.

    ``energies`` are per-atom energies (including the isolated-atom reference energies E0),
    ``stress`` is Voigt (xx, yy, zz, yz, xz, xy) in eV/A^3. Stress is computed when asked for, and
    from then on with every energy and forces evaluation of a structure with a 3-D cell (NPT and
    cell relaxation ask for forces and stress at each step: one model call serves both). Stress of a
    structure without a 3-D cell raises ASE's ``PropertyNotImplementedError`` (``checks.NoCellError``,
    also a ``ValueError``), as ASE's calculators do. A NaN or infinite result raises
    ``checks.NonFiniteError`` naming the cause (e.g. coincident atoms).
    """

    implemented_properties = ["energy", "free_energy", "energies", "node_energy", "forces", "stress"]

    def __init__(self, model: Union[None, str, os.PathLike, torch.nn.Module] = None, device=None,
                 default_dtype: Optional[str] = None, head: Optional[str] = None, skin: float = DEFAULT_SKIN,
                 cuda_graph: Union[None, bool, str] = None, precision: Union[None, str, torch.dtype] = None,
                 num_threads: Optional[int] = None, model_paths=None, **kwargs):
        mace_torch = take_mace_torch_arguments(kwargs)
        unknown = sorted(set(kwargs) - ASE_KEYWORDS)
        if unknown:
            raise TypeError(f"MACECalculator: unexpected keyword argument {unknown[0]!r} (expected model, device, "
                            "default_dtype, head, skin, cuda_graph, precision, num_threads, mace-torch's "
                            f"{', '.join(n for n in MACE_TORCH_NAMES if n != 'model_path')} or ASE's "
                            f"{', '.join(sorted(ASE_KEYWORDS))})")
        model_paths = model_files(model_paths, mace_torch["model_path"])
        model = model_files(model, name="model")  # a wildcard pattern, as mace-torch's first argument takes it
        models = _models_from_paths(model, model_paths, mace_torch["models"])
        default_dtype = default_dtype or None  # mace-torch's "": the model's own
        Calculator.__init__(self, **kwargs)
        self.members: List["MACECalculator"] = []
        self.compute_atomic_stresses = mace_torch["compute_atomic_stresses"]
        if len(models) > 1:  # a committee: one calculator per model, results combined in calculate
            inputs = mace_torch["inputs"]
            self.members = [MACECalculator(m, device=device, default_dtype=default_dtype, head=head, skin=skin,
                                           cuda_graph=cuda_graph, precision=precision, num_threads=num_threads,
                                           compute_atomic_stresses=self.compute_atomic_stresses,
                                           info_keys=inputs.info_keys, arrays_keys=inputs.arrays_keys,
                                           charges_key=inputs.arrays_keys["charges"],
                                           model_type=mace_torch["model_type"])
                            for m in models]
            first = self.members[0]
            self.device, self.num_threads = first.device, first.num_threads
            self.dtype, self.model = first.dtype, first.model
            self.r_max, self.heads, self.head, self.elements, self._e0 = (first.r_max, first.heads, first.head,
                                                                        first.elements, first._e0)
            self._outputs = first._outputs
            if any(m._outputs != first._outputs for m in self.members):
                raise ValueError("models: a committee's models must predict the same quantities (energies, "
                                 "dipoles or both)")
            self.implemented_properties = committee_properties(first.implemented_properties)
            return
        model = models[0]
        self.device = resolve_device(device)
        self.num_threads = apply_threads(self.device, num_threads)
        self._threads_asked, self._pid = num_threads, os.getpid()  # applied again when unpickled in another process
        model = resolve_model(model, self.device)
        self._outputs = model_outputs(model, mace_torch["model_type"])
        self.implemented_properties = ([p for p in MACECalculator.implemented_properties
                                        if self._outputs.per_atom_energies or p not in PER_ATOM_ENERGIES]
                                       + (ATOMIC_PROPERTIES if self.compute_atomic_stresses else [])
                                       if self._outputs.energy else []) + (["dipole"] if self._outputs.dipole else [])
        if self.compute_atomic_stresses and not self._outputs.energy:
            raise ValueError(f"compute_atomic_stresses: {class_name(model)} predicts no energy, so no stresses")
        # the charges, spins and embeddings mace-torch's calculator gives a model that reads them (ours reads none)
        inputs = None if isinstance(model, MACE) else mace_torch["inputs"].for_model(model)
        self._inputs = inputs if inputs is not None and (inputs.graph or inputs.atom) else None
        if precision is not None:
            from ..models.mace import PRECISIONS, resolve_precision  # noqa: PLC0415
            precision = resolve_precision(precision)
            if not isinstance(model, MACE):
                raise TypeError(f"precision: needs an equikernels MACE model, got {type(model).__name__} "
                                "(load it with equikernels.models)")
            want = PRECISIONS[precision][0]
            if default_dtype is not None and resolve_dtype(default_dtype, model) != want:
                raise ValueError(f"default_dtype={default_dtype!r} and precision={precision!r} disagree "
                                 f"(that precision runs in {want}); give one of them")
            default_dtype = want
        self.dtype = resolve_dtype(default_dtype, model)
        model = model.to(device=self.device, dtype=self.dtype)
        if precision is not None:
            model.set_precision(precision)
        model.eval()
        for param in model.parameters():
            param.requires_grad_(False)
        self.model = model
        self._model_state = _model_state(model)
        self.r_max = float(model.r_max)
        self.heads = model_heads(model)
        self.head = self.heads[resolve_head(head, self.heads)]
        self._head = torch.tensor([self.heads.index(self.head)], dtype=torch.int64, device=self.device)
        self.elements = ElementTable([int(z) for z in model.atomic_numbers], self.device)
        self._e0 = _head_e0(model, self.heads.index(self.head))
        # equikernels MACE runs its radial MLPs once per pair on paired edges (an edge and its reverse)
        self.neighbors = SkinNeighborList(self.r_max, skin, paired=isinstance(model, MACE))
        self._graphed = None
        self.cuda_graph = self._resolve_cuda_graph(cuda_graph)
        self._numbers: Optional[np.ndarray] = None   # cached per-structure device state
        self._atom_e0: Optional[np.ndarray] = None
        self._stress_wanted = False  # stress was asked for: compute it with every evaluation
        self._cell_np: Optional[np.ndarray] = None
        self._pbc_np: Optional[np.ndarray] = None

    @property
    def head(self) -> str:
        """The head the calculator evaluates. Setting it switches heads for the next calculation, as
        mace-torch's calculator reads its ``head`` at every call; a name it lacks is refused."""
        return self._head_name

    @head.setter
    def head(self, value: str) -> None:
        name = self.heads[resolve_head(value, self.heads)]
        if name == self.__dict__.get("_head_name"):
            return
        self._head_name = name
        for member in self.members:
            member.head = name
        if self.members:
            self._e0 = self.members[0]._e0
        elif "_head" in self.__dict__:  # built already: the head index, its E0s and the results follow
            index = self.heads.index(name)
            self._head.fill_(index)
            self._e0 = _head_e0(self.model, index)
            self._numbers = self._graphed = None
        self.reset()

    def __getstate__(self) -> dict:
        """A pickled or copied calculator (``copy.deepcopy``, multiprocessing) leaves out its padded
        evaluation and captured CUDA graphs, which cannot be copied: the copy makes its own when used."""
        state = self.__dict__.copy()
        state["_graphed"] = None
        return state

    def __setstate__(self, state: dict) -> None:
        """Unpickled in another process (a spawned multiprocessing worker), the calculator sets that
        process's torch CPU threads as its constructor did (``num_threads``)."""
        self.__dict__.update(state)
        pid = state.get("_pid")
        if pid is not None and pid != os.getpid():
            self.num_threads = apply_threads(self.device, state.get("_threads_asked"))
            self._pid = os.getpid()

    def _resolve_cuda_graph(self, value) -> Union[bool, str]:
        if value is None:
            value = settings.get().cuda_graph
        if isinstance(value, str):  # the words EQUIKERNELS_CUDA_GRAPH takes
            try:
                value = settings.FLAG_OR_AUTO(value)
            except ValueError:
                raise ValueError(f"cuda_graph: expected True, False or a word EQUIKERNELS_CUDA_GRAPH takes "
                                 f"({settings.FLAG_OR_AUTO.WORDS}), got {value!r}") from None
        elif isinstance(value, (bool, np.bool_)):
            value = bool(value)
        else:  # the checks below test `is False`: an integer 0 would take graphs
            raise ValueError(f"cuda_graph: expected True, False or 'auto', got {value!r}")
        if value is False:
            return False
        why = None
        if self.device.type != "cuda":
            why = "the device is not CUDA"
        elif not isinstance(self.model, MACE):
            why = "the model is not an equikernels MACE (load it with equikernels.models)"
        if why is not None:
            if value is True:
                warnings.warn(f"cuda_graph: not used ({why}); evaluating eagerly", RuntimeWarning)
            return False
        return value

    def _enable_graphs(self, capture: Optional[bool] = None) -> None:
        """Start the padded fixed-shape evaluation (``capture=False``: eager, any device; tests)."""
        self._graphed = GraphedModel(self.model, capture=capture, pairs=self.neighbors.paired)
        self.cuda_graph = True

    def _use_graphs(self, num_atoms: int) -> bool:
        if self.compute_atomic_stresses:  # edge forces are not among the graphed step's outputs
            return False
        if self.cuda_graph is False or (self.cuda_graph == "auto" and num_atoms > CUDA_GRAPH_MAX_ATOMS):
            return False
        if self._graphed is None:
            self._enable_graphs()
        return self._graphed.disabled_reason is None or self._graphed.capture is False

    # ---- per-structure state, refreshed only when it changes -------------------------------
    def _sync_structure(self, atoms: Atoms) -> None:
        numbers = atoms.numbers
        if self._numbers is None or not np.array_equal(numbers, self._numbers):
            self.elements.check(numbers)
            self._node_attrs = self.elements.one_hot(numbers, self.dtype)
            n = len(numbers)
            self._batch = torch.zeros(n, dtype=torch.int64, device=self.device)
            self._ptr = torch.tensor([0, n], dtype=torch.int64, device=self.device)
            self._numbers = numbers.copy()
            self._atom_e0 = self._node_e0(numbers)
            self.neighbors.reset()
        cell = atoms.cell.array
        if self._cell_np is None or not np.array_equal(cell, self._cell_np):
            self._cell = torch.as_tensor(cell, dtype=self.dtype).to(self.device)
            self._cell_np = cell.copy()
        pbc = atoms.pbc
        if self._pbc_np is None or not np.array_equal(pbc, self._pbc_np):
            self._pbc = pbc_tensor(pbc, self.device)
            self._pbc_np = pbc.copy()

    def graph(self, atoms: Atoms) -> Dict[str, torch.Tensor]:
        """The model input for ``atoms`` (updates the cached neighbour list; a committee's first model's)."""
        if self.members:
            return self.members[0].graph(atoms)
        check_structure(atoms)
        return self._graph(atoms)

    def _graph(self, atoms: Atoms) -> Dict[str, torch.Tensor]:
        self._sync_structure(atoms)
        positions = torch.as_tensor(atoms.positions, dtype=self.dtype).to(self.device)
        edges = self.neighbors.update(positions, self._cell, self._pbc, host=atoms.positions)
        data = single_graph(positions, self._node_attrs, edges, self._cell, self._head, self._batch, self._ptr)
        if self.neighbors.paired:
            data[PAIRED_KEY] = True
        if self._inputs is not None:
            data.update(self._inputs.tensors([atoms], self.dtype, self.device))
        return data

    # ---- mace-torch's calculator attributes, for scripts written for it --------------------
    @property
    def models(self) -> List[torch.nn.Module]:
        """The models evaluated, one per committee member (``[self.model]`` for one), as mace-torch's
        calculator lists them."""
        return [m.model for m in self.members] if self.members else [self.model]

    @property
    def num_models(self) -> int:
        return len(self.models)

    @property
    def available_heads(self) -> List[str]:
        """The model's heads (mace-torch's name of ``heads``)."""
        return list(self.heads)

    @property
    def z_table(self):
        """The model's atomic numbers in one-hot order: mace-torch's ``AtomicNumberTable`` where
        mace-torch is installed, else an object with the same ``zs``, ``z_to_index`` and ``index_to_z``."""
        zs = list(self.elements.atomic_numbers)
        quiet_mace()
        try:
            from mace.tools.utils import AtomicNumberTable  # noqa: PLC0415
        except ImportError:
            return AtomicNumbers(zs)
        return AtomicNumberTable(zs)

    @property
    def default_dtype(self) -> str:
        """The evaluation dtype as mace-torch's calculator names it (``"float64"`` or ``"float32"``)."""
        return str(self.dtype).replace("torch.", "")

    # ---- ASE interface ---------------------------------------------------------------------
    def get_property(self, name, atoms=None, allow_calculation=True):
        """ASE's, with per-atom stresses and virials asked of a calculator made without them refused
        saying how to get them (ASE's own message calls them not implemented)."""
        if name in ATOMIC_PROPERTIES and name not in self.implemented_properties:
            raise PropertyNotImplementedError(f"{name}: per-atom stresses and virials need "
                                              "MACECalculator(..., compute_atomic_stresses=True)")
        if name in PER_ATOM_ENERGIES and self._outputs.energy and not self._outputs.per_atom_energies:
            raise PropertyNotImplementedError(f"{name}: the model's per-atom energies are not its energy's terms "
                                              "(mace-torch's EnergyDipolesMACE returns only the isolated-atom "
                                              "energies there), so none are given")
        return Calculator.get_property(self, name, atoms, allow_calculation)

    def check_state(self, atoms, tol=1e-15):
        """ASE's check, its tolerance test run only on the properties that are not exactly equal (the
        repeated asks within one MD step need exact comparisons only)."""
        found = changes(self.atoms, atoms, tol, excluded=getattr(self, "ignored_changes", ()))
        inputs = self.members[0]._inputs if self.members else getattr(self, "_inputs", None)
        if not found and inputs is not None and inputs.changed(self.atoms, atoms):
            found.append("inputs")  # a charge, spin or per-atom charges the model reads
        return found

    def calculate(self, atoms=None, properties=None, system_changes=all_changes):
        properties = list(properties) if properties else ["energy"]
        if system_changes:  # another structure's results must not outlive a failed calculation of this one
            self.results = {}
        Calculator.calculate(self, atoms, properties, system_changes)
        atoms = self.atoms
        if atoms is None:
            raise ValueError("atoms: no structure to calculate (pass atoms, or attach this calculator to an Atoms)")
        if self.members:
            base = member_properties(properties, self.members[0].implemented_properties)
            for member in self.members:
                member.calculate(atoms, base, system_changes)
            self.results = committee_results([m.results for m in self.members], self._node_e0(atoms.numbers))
            return
        self._follow_model()
        check_structure(atoms, cell=self._cell_np is None or not np.array_equal(atoms.cell.array, self._cell_np)
                        or not np.array_equal(atoms.pbc, self._pbc_np))  # the cell only when it changed
        if "stress" in properties:
            check_stress_cell(atoms)
            self._stress_wanted = True
        if "stresses" in properties:
            check_stress_cell(atoms, prop="per-atom stress ('stresses')")
        # asked for: always; once asked for, with every later evaluation of a 3-D cell (slabs too)
        compute_stress = "stress" in properties or (self._stress_wanted and abs(atoms.cell.volume) >= MIN_VOLUME)
        if self._outputs.energy and self._use_graphs(len(atoms)):
            self._sync_structure(atoms)
            positions = torch.as_tensor(atoms.positions, dtype=self.dtype).to(self.device)
            # fixed between rebuilds
            edges = self.neighbors.candidates(positions, self._cell, self._pbc, host=atoms.positions)
            data = single_graph(positions, self._node_attrs, edges, self._cell, self._head, self._batch, self._ptr)
            results = _split(self._graphed.to_host(data, compute_stress=compute_stress), [len(atoms)])[0]
        else:
            data = self._graph(atoms)
            with trusted_inputs(node_feats=False):  # edges valid by construction: no index-check sync
                out = self._predict(data, compute_stress)
            results = _results(out, [len(atoms)], self._outputs, compute_stress, self.compute_atomic_stresses)[0]
        check_finite(results, atoms)
        _drop_volumeless_stresses(results, atoms)
        if self._atom_e0 is not None and "energies" in results:
            results["node_energy"] = results["energies"] - self._atom_e0
        self.results = results

    def _follow_model(self) -> None:
        """Follow a model whose dtype was changed since this calculator was made (another calculator
        on the same model object converts it in place, as mace-torch's does): inputs are then made in
        the new dtype. A changed precision (mixed or not) is refused: its numbers would differ silently."""
        now = _model_state(self.model)
        if now == self._model_state:
            return
        if now[1] != self._model_state[1]:
            raise RuntimeError(f"model: its precision was changed to {_precision_name(now)} after this calculator "
                               f"was made with {_precision_name(self._model_state)} (another MACECalculator with "
                               "another precision on the same model object?); give each calculator its own copy "
                               "(copy.deepcopy(model))")
        warnings.warn(f"model: its dtype was changed to {now[0]} after this calculator was made in "
                      f"{self._model_state[0]} (another MACECalculator on the same model object?); evaluating in "
                      f"{now[0]}", RuntimeWarning, stacklevel=3)
        self.dtype, self._model_state = now[0], now
        self._numbers = self._cell_np = self._pbc_np = self._graphed = None
        self.neighbors.reset()

    def _predict(self, data: Dict[str, torch.Tensor], compute_stress: bool) -> Dict[str, torch.Tensor]:
        """The model's outputs with forces (and stress); a dipole-only model's without (its forward
        refuses the force and stress switches)."""
        if not self._outputs.energy:
            return self._evaluate(data, training=False)
        return self._evaluate(data, compute_force=True, compute_stress=compute_stress, training=False,
                              **self._atomic_kwargs())

    def _evaluate(self, data: Dict[str, torch.Tensor], **kwargs) -> Dict[str, torch.Tensor]:
        """The model's outputs; an input it reads that this calculator does not give is named."""
        try:
            return self.model(data, **kwargs)
        except KeyError as exc:
            key = exc.args[0] if len(exc.args) == 1 else None
            if not isinstance(key, str) or key in data:
                raise
            raise ValueError(f"model: {class_name(self.model)} reads the input {key!r}, which MACECalculator does "
                             "not give; evaluate this model with mace-torch's MACECalculator") from exc

    def _atomic_kwargs(self) -> Dict[str, bool]:
        """The model arguments of per-atom stresses and virials (none unless asked for: a model
        without them still runs)."""
        return {"compute_edge_forces": True, "compute_atomic_stresses": True} if self.compute_atomic_stresses else {}

    def _node_e0(self, numbers: np.ndarray) -> Optional[np.ndarray]:
        """Each atom's isolated-atom energy E0 (the calculator's head), which ``node_energy`` leaves
        out of its energy as mace-torch's calculator does; None for a model without E0s."""
        return None if self._e0 is None else self._e0[self.elements.index(numbers)]

    def get_hessian(self, atoms: Optional[Atoms] = None) -> np.ndarray:
        """The Hessian of the energy with respect to the positions, as mace-torch's calculator gives it:
        [3N, N, 3] in eV/A^2, row k the gradient of -forces.flat[k] (reshape to [3N, 3N] for a
        matrix). One backward pass per row: for vibrations of molecules and small cells. ``atoms``:
        default the last structure calculated."""
        atoms = self.atoms if atoms is None else atoms
        if atoms is None:
            raise ValueError("atoms: no structure for the Hessian (pass atoms, or calculate one first)")
        self._refuse_for_dipole_models("get_hessian")
        if self.members:  # a committee: one per model, as mace-torch's calculator gives them
            return [m.get_hessian(atoms) for m in self.members]
        self._follow_model()
        check_structure(atoms)
        with trusted_inputs(node_feats=False):
            out = self._evaluate(self._graph(atoms), compute_force=True, compute_hessian=True, training=False)
        hessian = out["hessian"].detach().to(self.dtype).cpu().numpy()
        check_finite({"hessian": hessian}, atoms)
        return hessian

    def get_descriptors(self, atoms: Optional[Atoms] = None, invariants_only: bool = True,
                        num_layers: int = -1) -> np.ndarray:
        """Per-atom descriptors [num_atoms, features], as mace-torch's calculator gives them: the node
        features of the first ``num_layers`` interaction layers (-1: all) in mace-torch's layout,
        only their invariant (0e) channels with ``invariants_only``. ``atoms``: default the last
        structure calculated."""
        atoms = self.atoms if atoms is None else atoms
        if atoms is None:
            raise ValueError("atoms: no structure to describe (pass atoms, or calculate one first)")
        self._refuse_for_dipole_models("get_descriptors")
        if self.members:  # a committee: one per model, as mace-torch's calculator gives them
            return [m.get_descriptors(atoms, invariants_only, num_layers) for m in self.members]
        cols = descriptor_columns(layer_irreps(self.model), invariants_only, num_layers)
        self._follow_model()
        check_structure(atoms)
        with trusted_inputs():
            out = self._evaluate(self._graph(atoms), compute_force=False, training=False)
        feats = out["node_feats"].detach()
        descriptors = feats[:, cols.to(feats.device)].to(self.dtype).cpu().numpy()
        check_finite({"descriptors": descriptors}, atoms)
        return descriptors

    def _refuse_for_dipole_models(self, what: str) -> None:
        if self._outputs.dipole:  # mace-torch's dipole models return neither a Hessian nor node features
            name = class_name(self.members[0].model if self.members else self.model)
            raise PropertyNotImplementedError(f"{what}: not available for {name} models (as in mace-torch's "
                                              "calculator, only for energy models)")

    # ---- many structures in one model call -------------------------------------------------
    def batch_evaluate(self, atoms_list: Sequence[Atoms], properties: Optional[Sequence[str]] = None,
                       max_atoms_per_batch: Optional[int] = None) -> List[Dict[str, np.ndarray]]:
        """Evaluate many structures with as few model calls as possible (torch-geometric batching:
        nodes concatenated, edge indices offset, one graph index per atom). Returns one results
        dict per structure (the keys of ``self.results``). ``properties``: default energy and forces
        (the dipole of a dipole-only model). ``max_atoms_per_batch`` bounds the atoms per model call
        (device memory); by default everything goes in one call."""
        if properties is None:
            properties = ("energy", "forces") if self._outputs.energy else ("dipole",)
        Batch, Data = pyg_data()

        if isinstance(atoms_list, Atoms):  # iterating it would give its Atom objects
            raise TypeError("atoms_list must be a sequence of ase.Atoms, got one Atoms (pass [atoms])")
        atoms_list = list(atoms_list)
        if not atoms_list:
            return []
        unknown = set(properties) - set(self.implemented_properties)
        if unknown:
            raise ValueError(f"unknown properties {sorted(unknown)}; available: {self.implemented_properties}")
        if self.members:
            base = member_properties(properties, self.members[0].implemented_properties)
            each = [m.batch_evaluate(atoms_list, base, max_atoms_per_batch) for m in self.members]
            return [committee_results([e[k] for e in each], self._node_e0(atoms.numbers))
                    for k, atoms in enumerate(atoms_list)]
        if max_atoms_per_batch is not None and max_atoms_per_batch < 1:
            raise ValueError(f"max_atoms_per_batch must be a positive integer or None, got {max_atoms_per_batch!r}")
        self._follow_model()
        compute_stress = "stress" in properties
        for k, atoms in enumerate(atoms_list):
            check_structure(atoms, f"atoms_list[{k}]")
            self.elements.check(atoms.numbers)
            if compute_stress:
                check_stress_cell(atoms, f"atoms_list[{k}]")
            if "stresses" in properties:
                check_stress_cell(atoms, f"atoms_list[{k}]", "per-atom stress ('stresses')")

        results: List[Dict[str, np.ndarray]] = []
        for chunk in _chunks(atoms_list, max_atoms_per_batch):
            graphs = []
            for atoms in chunk:
                positions = torch.as_tensor(atoms.positions, dtype=self.dtype).to(self.device)
                cell = torch.as_tensor(atoms.cell.array, dtype=self.dtype).to(self.device)
                i, j, unit_shifts = vesin_pairs(positions, cell, pbc_tensor(atoms.pbc, self.device), self.r_max)
                graphs.append(Data(num_nodes=len(atoms), positions=positions,
                                   node_attrs=self.elements.one_hot(atoms.numbers, self.dtype),
                                   edge_index=torch.stack((i, j)), unit_shifts=unit_shifts,
                                   shifts=unit_shifts @ cell, cell=cell, head=self._head[0]))
            batch = Batch.from_data_list(graphs)
            data = {key: batch[key] for key in ("positions", "node_attrs", "edge_index", "shifts", "unit_shifts",
                                                "cell", "batch", "ptr", "head")}
            if self.neighbors.paired:  # the radial MLPs once per pair, as in ``calculate``
                data = pair_edges(data)
            if self._inputs is not None:
                data.update(self._inputs.tensors(chunk, self.dtype, self.device))
            out = self._predict(data, compute_stress)
            results.extend(_results(out, [len(a) for a in chunk], self._outputs, compute_stress,
                                    self.compute_atomic_stresses))
        for k, (atoms, res) in enumerate(zip(atoms_list, results)):
            check_finite(res, atoms, f"atoms_list[{k}]")
            _drop_volumeless_stresses(res, atoms)
            e0 = self._node_e0(atoms.numbers)
            if e0 is not None and "energies" in res:
                res["node_energy"] = res["energies"] - e0
        return results


def _model_state(model: torch.nn.Module) -> tuple:
    """(dtype of the model's parameters, its mixed-precision compute dtype or None)."""
    param = next(model.parameters(), None)
    return (param.dtype if param is not None else None), getattr(model, "compute_dtype", None)


def _precision_name(state: tuple) -> str:
    return str(state[0]).replace("torch.", "") + (f" with {state[1]} compute" if state[1] is not None else "")


def _head_e0(model: torch.nn.Module, head: int) -> Optional[np.ndarray]:
    """The model's isolated-atom energies E0 per element for head ``head`` (float64, host); None for
    a model that holds none where ours and mace-torch's do."""
    e0 = getattr(model, "atomic_energies", None)
    if e0 is None:
        e0 = getattr(getattr(model, "atomic_energies_fn", None), "atomic_energies", None)
    if not isinstance(e0, torch.Tensor):
        return None
    e0 = e0.detach().to("cpu", torch.float64)
    # a copy, not a view of the model's buffer (multiprocessing moves that into shared memory)
    return (e0[head] if e0.dim() == 2 else e0).numpy().copy()


def _drop_volumeless_stresses(results: Dict[str, object], atoms: Atoms) -> None:
    """Per-atom stresses are virials over the cell's volume: none without one (the virials stay)."""
    if "stresses" in results and abs(atoms.cell.volume) < MIN_VOLUME:
        del results["stresses"]


def _chunks(atoms_list: List[Atoms], max_atoms: Optional[int]):
    if max_atoms is None:
        yield atoms_list
        return
    chunk, count = [], 0
    for atoms in atoms_list:
        if chunk and count + len(atoms) > max_atoms:
            yield chunk
            chunk, count = [], 0
        chunk.append(atoms)
        count += len(atoms)
    yield chunk


def _results(out: Dict[str, torch.Tensor], sizes: List[int], outputs, compute_stress: bool,
             atomic: bool = False) -> List[Dict[str, np.ndarray]]:
    """Split a (batched) model output into per-structure ASE results, with one device->host copy;
    ``outputs``: the model's ``model_kinds.Outputs``; ``atomic``: with per-atom stresses and virials."""
    g, n = len(sizes), sum(sizes)
    wanted = []  # (output key, host key, shape)
    if outputs.energy:
        wanted += [("energy", "energy", (g,)), ("forces", "forces", (n, 3))]
        if outputs.per_atom_energies:
            wanted.append(("node_energy", "node_energy", (n,)))
        if compute_stress:
            wanted.append(("stress", "stress", (g, 3, 3)))
        if atomic:
            wanted += [("atomic_stresses", "stresses", (n, 3, 3)), ("atomic_virials", "virials", (n, 3, 3))]
    if outputs.dipole:
        wanted.append(("dipole", "dipole", (g, 3)))
    flat = torch.cat([out[key].detach().reshape(-1).to(torch.float64) for key, _, _ in wanted]).cpu().numpy()
    host, start = {}, 0
    for _, name, shape in wanted:
        size = int(np.prod(shape))
        host[name], start = flat[start:start + size].reshape(shape), start + size
    return _split(host, sizes)


def _split(host: Dict[str, np.ndarray], sizes: List[int]) -> List[Dict[str, np.ndarray]]:
    """Per-structure ASE results from host arrays of G graphs, those present of: energy [G],
    node_energy [N] (given as ``energies``), forces [N, 3], stress [G, 3, 3], per-atom stresses and
    virials [N, 3, 3] (``stresses`` in Voigt form [n, 6], ``virials`` [n, 3, 3], as mace-torch's
    calculator gives them) and dipole [G, 3]."""
    results, start = [], 0
    for g, n in enumerate(sizes):
        res: Dict[str, object] = {}
        if "energy" in host:
            res.update(energy=float(host["energy"][g]), free_energy=float(host["energy"][g]),
                       forces=host["forces"][start:start + n].copy())
        if "node_energy" in host:
            res["energies"] = host["node_energy"][start:start + n].copy()
        if "stress" in host:
            res["stress"] = full_3x3_to_voigt_6_stress(host["stress"][g])
        if "stresses" in host:
            res["stresses"] = full_3x3_to_voigt_6_stress(host["stresses"][start:start + n])  # [n, 6]
            res["virials"] = host["virials"][start:start + n].copy()
        if "dipole" in host:
            res["dipole"] = host["dipole"][g].copy()
        results.append(res)
        start += n
    return results
