"""Expert-parallel dispatch: rows grouped by expert, one all-to-all to the experts' ranks, one back.

Rank r of an expert-parallel group of p ranks holds experts r*E_l ... (r+1)*E_l - 1, E_l = E/p,
so rows sorted by expert are also sorted by destination rank. A step:

1. ``sort_by_expert``: this rank's kept assignments (t*k + j) in order of expert (stable, so in order
   of position within one expert), and how many go to each expert (E,).
2. ``make_plan`` (collective): the per-expert counts of every rank, one allgather of E int64 per
   rank (p, E); from them every rank knows the whole (p, p) matrix of rows each rank sends to each
   rank, and how many rows each source sends to each of its own experts (p, E_l); the rest of the
   plan is arithmetic on those counts (``local_layout``).
3. ``to_experts``: one all-to-all with uneven counts (rows per destination rank; MPI_Alltoallv's
   shape). The rows stay where they land, by source and then by local expert; each local expert
   computes its blocks in place (``plan.runs``), so no rows are copied to group them.
4. ``from_experts``: one all-to-all with the counts swapped (what came from each source goes back to
   it), landing in the order ``to_experts`` took them.

``to_experts`` and ``from_experts`` are a conjugate pair: each is a permutation of rows across the
group and the other is its inverse, so the backward of one is the forward of the other (the backward
of the dispatch runs the all-to-all with the counts swapped, and so does that of the combine).
Both hand pycollect's ``alltoall`` the whole matrix (``counts=`` of shape (p, p), the transpose on
the way back), so neither exchanges counts again: one small allgather and two all-to-alls forward,
two all-to-alls backward.
A group of None or of one rank
moves nothing: every step short-circuits (the rows sorted by expert are already the experts' rows).
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from ..nn._base import array_module

__all__ = ["Plan", "sort_by_expert", "local_layout", "make_plan", "plan_from_counts", "to_experts", "from_experts",
           "group_size", "group_rank"]


def group_size(group) -> int:
    return 1 if group is None else group.size


def group_rank(group) -> int:
    return 0 if group is None else group.rank


def to_host(a) -> np.ndarray:
    """A NumPy copy of a NumPy or CuPy array (counts must be host integers for the all-to-all)."""
    return a.get() if hasattr(a, "get") else np.asarray(a)


@dataclass(frozen=True)
class Plan:
    """Where this rank's rows go and what comes back, for one forward (and its backward).

    ``order`` (N,): the assignment t*k + j of each row sent, grouped by expert. ``counts`` (E,): rows
    for each expert. ``matrix`` (p, p): rows rank i sends to rank j, the same on every rank. ``send``
    (p,): rows sent to each rank (row ``rank``). ``recv_counts`` (p, E_l): rows each source sends to
    each local expert. ``recv`` (p,): rows from each source (column ``rank``; to it, on the way back).
    ``runs``: ``(l, lo, hi)`` blocks of the received rows (source-major, then local expert) that local
    expert l computes, adjacent blocks of one expert merged. ``expert_rows`` (E_l,): rows per local expert.
    """

    order: object
    counts: tuple
    matrix: tuple
    send: tuple
    recv_counts: np.ndarray
    recv: tuple
    runs: tuple
    expert_rows: tuple

    @property
    def rows_sent(self) -> int:
        return int(sum(self.send))

    @property
    def rows_received(self) -> int:
        return int(sum(self.recv))


def sort_by_expert(expert, keep, num_experts: int):
    """order (N,) int64: kept assignments t*k + j grouped by expert, in position order within one;
    counts (E,) host int64: rows for each expert."""
    xp = array_module(expert)
    e = expert.reshape(-1)  # (T*k,)
    kept = xp.nonzero(keep.reshape(-1))[0]  # (N,)
    order = kept[xp.argsort(e[kept], kind="stable")]  # (N,)
    counts = to_host(xp.bincount(e[kept], minlength=num_experts)).astype(np.int64)  # (E,)
    return order, counts


def local_layout(recv_counts: np.ndarray):
    """From rows per (source, local expert) (p, E_l): rows per source (p,), the runs ``(l, lo, hi)``
    of the received rows each local expert computes, and rows per local expert (E_l,).

    The rows stay where the all-to-all put them (source-major): an expert computes its block from
    each source in turn, and no rows are copied to group them (with one expert per rank, or empty
    blocks between, adjacent blocks merge into one).
    """
    recv_counts = np.asarray(recv_counts, np.int64)
    runs: list[tuple[int, int, int]] = []
    lo = 0
    for row in recv_counts:  # source s
        for l, n in enumerate(row):
            n = int(n)
            if n and runs and runs[-1][0] == l and runs[-1][2] == lo:
                runs[-1] = (l, runs[-1][1], lo + n)
            elif n:
                runs.append((l, lo, lo + n))
            lo += n
    return (tuple(int(c) for c in recv_counts.sum(axis=1)), tuple(runs),
            tuple(int(c) for c in recv_counts.sum(axis=0)))


def plan_from_counts(order, everyone: np.ndarray, rank: int) -> Plan:
    """The plan from every rank's counts per expert (p, E); no communication."""
    everyone = np.asarray(everyone, np.int64)  # (p, E)
    p, num_experts = everyone.shape
    e_local = num_experts // p
    matrix = everyone.reshape(p, p, e_local).sum(axis=2)  # (p, p): rows rank i sends to rank j
    recv_counts = everyone[:, rank * e_local:(rank + 1) * e_local]  # (p, E_l)
    recv, runs, expert_rows = local_layout(recv_counts)
    return Plan(order, tuple(int(c) for c in everyone[rank]), tuple(tuple(int(c) for c in r) for r in matrix),
                tuple(int(c) for c in matrix[rank]), recv_counts.copy(), recv, runs, expert_rows)


def exchange_counts(counts: np.ndarray, group) -> np.ndarray:
    """(p, E): every rank's rows per expert (collective: one allgather of E int64 per rank)."""
    p = group_size(group)
    counts = np.ascontiguousarray(counts, np.int64)  # (E,)
    if p == 1:
        return counts.reshape(1, -1).copy()
    return group.allgather(counts, counts=[counts.size] * p).reshape(p, counts.size)


def make_plan(expert, keep, num_experts: int, group) -> Plan:
    """Sort this rank's kept assignments by expert and exchange the counts (collective over ``group``)."""
    order, counts = sort_by_expert(expert, keep, num_experts)
    return plan_from_counts(order, exchange_counts(counts, group), group_rank(group))


def to_experts(rows, plan: Plan, group, algorithm: str = "auto"):
    """rows (N, C) in ``plan.order`` -> (R, C) for this rank's experts, source-major (``plan.runs``)."""
    if group_size(group) == 1:
        return rows
    return group.alltoall(rows, counts=plan.matrix, algorithm=algorithm)


def from_experts(rows, plan: Plan, group, algorithm: str = "auto"):
    """rows (R, C) as ``to_experts`` left them -> (N, C) back on the ranks they came from, in ``plan.order``."""
    if group_size(group) == 1:
        return rows
    return group.alltoall(rows, counts=tuple(zip(*plan.matrix)), algorithm=algorithm)  # the transpose
