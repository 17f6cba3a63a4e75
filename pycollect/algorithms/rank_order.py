"""Which schedules reduce in rank order, as a non-commutative op needs (MPI: ``x0 op x1 op ... op x(N-1)``).

Every reduction in a schedule stores ``op(acc, incoming)``. The order is kept when ``acc`` always holds a
contiguous run of ranks just below the incoming one's. The binomial trees do that when the tree's order
(``_binomial.tree_order``) is the ranks in order: root 0 and nodes that are blocks of consecutive ranks.
Recursive doubling's partners hold adjacent runs and put the lower one first. The rings, halving and pairwise
schedules, and the shared-memory ones, start each block's reduction at a different rank, so they reorder. The
scans (linear and recursive doubling) always put the run of lower ranks on the left of a rank's own. ``tests/test_rank_order.py`` holds this table equal to
what the simulator finds with an op that fails on any other order.
"""
from __future__ import annotations

from ..engine.topology import Topology
from . import _binomial

# (collective, schedule) that keep rank order when their tree does
_TREES = {("allreduce", "tree"), ("reduce", "binomial")}
# the butterfly whose partners double (1, 2, 4, ...) and reduce the lower ranks' operand first: its groups are runs
# of consecutive ranks at every size (the fold pairs neighbours) and on any topology
_BUTTERFLIES = {("allreduce", "recursive_doubling")}
# the prefix reductions: every schedule reduces the run of ranks just below onto a rank's own, on any topology
_PREFIXES = ("scan", "exscan")


def keeps_rank_order(collective: str, name: str, topology: Topology, root: int = 0) -> bool:
    """Whether schedule ``name`` of ``collective`` combines every rank's contribution in rank order."""
    if collective in _PREFIXES or (collective, name) in _BUTTERFLIES:
        return True
    if (collective, name) not in _TREES:
        return False
    return _binomial.tree_order(topology, root) == tuple(range(topology.size))


def in_rank_order(collective: str, names, topology: Topology, root: int = 0) -> list[str]:
    """The schedules among ``names`` that keep rank order here (for messages that name them)."""
    return [n for n in names if keeps_rank_order(collective, n, topology, root)]
