"""Mixture of experts with expert parallelism: ``MoELayer`` and its single-process reference.

``router`` (top-k choices, gates, capacity, dropping, balancing loss; pure), ``dispatch`` (rows
grouped by expert, the all-to-alls there and back; a conjugate pair), ``experts`` (the local
experts' MLPs), ``layer`` (``MoELayer``), ``reference`` (``reference_moe``, token by token).
"""
from . import dispatch, router
from .block import MoEBranch
from .layer import MoELayer, Routing, init_full
from .reference import reference_moe
from .router import capacity

__all__ = ["MoELayer", "MoEBranch", "Routing", "init_full", "reference_moe", "capacity", "dispatch", "router"]
