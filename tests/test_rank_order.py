"""Ops without MPI: which schedules reduce in rank order (a non-commutative op needs it), the minloc and
maxloc pair reductions, and which dtypes each op takes.

Rank order is checked with an op that only combines adjacent runs of ranks: each element holds the run
``(lo, hi)`` as ``lo * K + hi``, and ``op(a, b)`` is the run ``(a.lo, b.hi)`` when ``b`` starts where ``a``
ends, else -1 for good. A schedule keeps rank order exactly when every result is the run ``(0, N-1)``.
"""
from __future__ import annotations

from dataclasses import replace

import ml_dtypes
import numpy as np
import pytest
import simharness as h

from pycollect.algorithms.rank_order import keeps_rank_order
from pycollect.algorithms.registry import all_schedules, schedule_algorithms
from pycollect.engine import locations, ops
from pycollect.engine.shapes import in_elems, out_elems
from pycollect.engine.simulate import simulate
from pycollect.engine.topology import Topology

K = 1000


def runs(a, b):
    """The run of ranks ``a`` then ``b``, or -1 when they are not adjacent in that order."""
    ok = (a >= 0) & (b >= 0) & (a % K + 1 == b // K)
    return np.where(ok, a // K * K + b % K, -1)


def topologies(size):
    """One node; two nodes of consecutive ranks; nodes dealt round robin; an uneven split."""
    return [Topology.single_node(size), Topology.from_labels([2 * r // size for r in range(size)]),
            Topology.from_labels([r % 2 for r in range(size)]), Topology.from_labels([min(r, 1) for r in range(size)])]


def in_order(collective, name, problem) -> bool:
    """Whether the simulated schedule leaves every result as the run of every rank in order (a scan's: the ranks up to
    its own; an exscan's: up to the one below)."""
    size = problem.size
    probs = [replace(problem, rank=r) for r in range(size)]
    inputs = [np.full(in_elems(collective, p), r * K + r, np.int64) for r, p in enumerate(probs)]
    outs = [None if out_elems(collective, p) is None else np.full(out_elems(collective, p), -2, np.int64)
            for p in probs]
    simulate(all_schedules(collective, name, problem), inputs, outs, runs)
    last = {"scan": range(size), "exscan": range(-1, size - 1)}.get(collective, [size - 1] * size)   # a prefix's end
    return all(o is None or bool((o == hi).all()) for o, hi in zip(outs, last))


@pytest.mark.parametrize("collective", ["allreduce", "reduce_scatter", "reduce", "scan", "exscan"])
def test_rank_order_table_matches_the_schedules(collective):
    """Where the table says a schedule keeps rank order, it does at every size, count, root and topology; where
    it says not, some case shows the schedule reordering (so the table refuses no schedule needlessly)."""
    for name in schedule_algorithms(collective):
        reorders_somewhere = False
        for size in range(1, 9):
            for topology in topologies(size) if size > 1 else [Topology.single_node(1)]:
                for root in ({0, size - 1} if collective == "reduce" else {0}):
                    for n in (1, size - 1, size + 1, 3 * size + 2):
                        problem = h.make_problem(collective, size, n=n, topology=topology, root=root, tree_segment=2)
                        kept = in_order(collective, name, problem)
                        claimed = keeps_rank_order(collective, name, topology, root)
                        assert kept or not claimed, f"{collective} {name} size {size} {topology} root {root} n={n}"
                        reorders_somewhere |= not kept
        assert reorders_somewhere or keeps_rank_order(collective, name, Topology.uniform(4, 2, by_block=False)), \
            f"{collective} {name} never reorders: the table should list it"


@pytest.mark.parametrize("op", ["minloc", "maxloc"])
@pytest.mark.parametrize("dtype", ["f8", "i1", "u2", ml_dtypes.bfloat16])
def test_minloc_maxloc_against_a_sequential_reference(op, dtype):
    """Pairs reduced in any grouping give the best value and, among equal ones, the lowest location."""
    rng = np.random.default_rng(3)
    ranks = 5
    values = [rng.integers(0, 3, 40).astype(dtype) for _ in range(ranks)]   # few values: many ties
    index = [rng.permutation(40).astype(np.int32) for _ in range(ranks)]
    pairs = [locations.pairs("t", (v, i), op, 0) for v, i in zip(values, index)]
    f = ops.ufunc(op)
    left = pairs[0].copy()
    for p in pairs[1:]:
        f(left, p, out=left)      # in place on the accumulator, as the executor reduces
    right = pairs[-1].copy()
    for p in reversed(pairs[:-1]):
        f(p, right, out=right)    # the other grouping, out aliasing the second operand
    stacked_v = np.stack([v.astype(np.float64) for v in values])
    best = (stacked_v.min if op == "minloc" else stacked_v.max)(axis=0)
    expected_loc = np.where(stacked_v == best, np.stack(index), np.iinfo(np.int32).max).min(axis=0)
    for got in (left, right):
        np.testing.assert_array_equal(got["value"].astype(np.float64), best)
        np.testing.assert_array_equal(got["location"], expected_loc)


@pytest.mark.parametrize("op, dtype, ok", [
    ("land", "?", True), ("lxor", "i8", True), ("lor", "u1", True), ("land", "f8", False), ("lor", "c8", False),
    ("sum", "?", False), ("max", "?", False), ("band", "?", False), ("sum", "g", True), ("prod", "G", True),
    ("max", "g", True), ("max", "G", False), ("minloc", "c16", False), ("maxloc", "g", True), ("sum", "M8[s]", False)])
def test_which_dtypes_each_op_takes(op, dtype, ok):
    try:
        ops.check_op(op, np.dtype(dtype), "allreduce")
    except (TypeError, ValueError) as e:
        assert not ok and "allreduce" in str(e) and repr(op) in str(e), str(e)
    else:
        assert ok


def test_user_ops_are_tried_before_anything_is_sent():
    """A ufunc that cannot produce the dtype, or one that is not binary, is refused naming the op and dtype."""
    ops.check_op(ops.user_op(np.hypot), np.dtype("f4"), "allreduce")
    ops.check_op(ops.user_op(np.gcd), np.dtype("i8"), "allreduce")
    with pytest.raises(ValueError, match="allreduce: op hypot cannot reduce dtype int32"):
        ops.check_op(ops.user_op(np.hypot), np.dtype("i4"), "allreduce")
    with pytest.raises(ValueError, match="op negative is a ufunc of 1 input"):
        ops.check_op(ops.user_op(np.negative), np.dtype("f8"), "allreduce")
    assert repr(ops.user_op(np.hypot)) == "Op(hypot, commute=True)" and ops.user_op(np.hypot) is ops.user_op(np.hypot)
