"""Accelerated MACE: mace-torch's models built from equikernels ops.

``from_mace(model)`` converts a mace-torch model object, ``load(path)`` reads a mace-torch
``.model`` file or our own format, ``save(model, path)`` writes our format (loads without
mace-torch), ``select_head(model, head)`` one head of a multi-head model as a model of its own.
``atoms_to_data`` / ``atoms_list_to_data`` turn ASE Atoms into the data dict that
``MACE.forward`` (and mace-torch's models) take; ``pair_edges(data)`` orders its edges in pairs
(edge and reverse) so that the radial MLPs run once per pair. ``model.set_precision("bf16-mixed")`` (or
``load(..., precision=...)``) runs node features and per-edge weights in bfloat16 with float32
parameters, geometry and energies (``benchmarks/mixed_accuracy.py`` measures its accuracy).
"""
from .data import atoms_list_to_data, atoms_to_data, pair_edges
from .graphed import GraphedModel
from .io import UnconvertibleMaceModel, build, config_from_mace, from_mace, load, save
from .mace import MACE, PRECISIONS, ScaleShiftMACE, resolve_precision, trusted_inputs
from .select_head import select_head
from .symmetric_contraction import SymmetricContraction, contraction_table

__all__ = ["MACE", "ScaleShiftMACE", "from_mace", "load", "save", "build", "config_from_mace", "atoms_to_data",
           "atoms_list_to_data", "SymmetricContraction", "contraction_table", "GraphedModel", "trusted_inputs",
           "PRECISIONS", "resolve_precision", "pair_edges", "UnconvertibleMaceModel", "select_head"]
