"""Whole-layer acceleration of existing models (``equikernels.accelerate`` runs these adapters).

Per model family one adapter: ``mace`` (mace-torch interaction blocks and symmetric contraction),
``sevenn`` (SevenNet's ``IrrepsConvolution``), ``e3nn_graph`` (a generic detector for e3nn
gather -> tensor product -> scatter-sum layers, NequIP-style). ``registry.register`` adds one.
"""
from .accelerate import AccelerateReport, accelerate
from .graph_cache import GraphCache, shared_graph
from .registry import ADAPTERS, Adapter, NotFused, accelerate_layers, register

__all__ = ["AccelerateReport", "accelerate", "ADAPTERS", "Adapter", "NotFused", "accelerate_layers", "register", "GraphCache", "shared_graph"]
