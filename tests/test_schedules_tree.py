"""Binomial-tree schedules: reduce, broadcast (binomial, scatter-allgather) and tree allreduce.

Every result is simulated for all ranks and compared with a NumPy reference; the traffic
tests check closed-form counts derived from the tree shape, not recorded numbers.
"""
from __future__ import annotations

import numpy as np
import pytest
import simharness as h

from pycollect.algorithms import _binomial
from pycollect.algorithms.registry import all_schedules
from pycollect.engine.schedule import EMPTY, Schedule, Slice
from pycollect.engine.simulate import simulate
from pycollect.engine.topology import INTER, Topology
from pycollect.engine.traffic import count

SIZES = [*range(1, 13), 16]
COUNTS = [0, 1, 2, 3, 7, 13, 100, 1000]
PIPELINES = [0, 1, 7, 64]
ALGS = [("reduce", "binomial"), ("broadcast", "binomial"),
        ("broadcast", "scatter_allgather"), ("allreduce", "tree")]
PIPELINED = {("reduce", "binomial"), ("broadcast", "binomial"), ("allreduce", "tree")}
ITEM = 8


def topologies(size):
    return [Topology.single_node(size), Topology.uniform(size, 2, by_block=False)]


def log2c(n):
    """ceil(log2 n), written out rather than taken from the engine."""
    levels = 0
    while (1 << levels) < n:
        levels += 1
    return levels


def nsegs(n, pipeline):
    return 1 if pipeline == 0 else -(-n // pipeline)


def traffic(coll, alg, size, n, root=0, pipeline=0, topology=None):
    topology = topology or Topology.single_node(size)
    prob = h.make_problem(coll, size, n=n, root=root, topology=topology, tree_segment=pipeline)
    return count(all_schedules(coll, alg, prob), topology, ITEM)


# ---- results against the reference ------------------------------------------------------

@pytest.mark.parametrize("size", SIZES)
@pytest.mark.parametrize("coll,alg", ALGS)
def test_matches_reference(coll, alg, size):
    """Every count x pipeline x topology x (in place or not); the root moves with the count."""
    pipelines = PIPELINES if (coll, alg) in PIPELINED else [0]
    inplaces = [False] if coll == "reduce" else [False, True]
    for i, n in enumerate(COUNTS):
        root = (3 * i + 1) % size if coll in ("reduce", "broadcast") else 0
        for pipeline in pipelines:
            if pipeline == 1 and n == 1000:
                continue  # 1000 one-element segments: slow to simulate, nothing new to see
            for topo in topologies(size):
                for inplace in inplaces:
                    prob = h.make_problem(coll, size, n=n, root=root, topology=topo, tree_segment=pipeline)
                    h.check(coll, alg, prob, op="sum", inplace=inplace)


@pytest.mark.parametrize("op,dtype", [("max", np.int64), ("bxor", np.int32), ("sum", np.float64)])
@pytest.mark.parametrize("coll,alg", ALGS)
def test_ops(coll, alg, op, dtype):
    for size in SIZES:
        for n in (7, 100):
            for pipeline in (0, 7):
                for topo in topologies(size):
                    prob = h.make_problem(coll, size, n=n, root=size // 2, topology=topo, tree_segment=pipeline)
                    h.check(coll, alg, prob, op=op, inplace=coll != "reduce" and n == 7, dtype=dtype)


@pytest.mark.parametrize("size", [2, 3, 5, 6, 8, 11, 16])
@pytest.mark.parametrize("coll,alg", [a for a in ALGS if a[0] != "allreduce"])
def test_every_root(coll, alg, size):
    for root in range(size):
        for n, pipeline in ((3, 0), (13, 0), (100, 7)):
            for topo in topologies(size):
                prob = h.make_problem(coll, size, n=n, root=root, topology=topo, tree_segment=pipeline)
                h.check(coll, alg, prob, op="bxor" if root % 2 else "sum", inplace=coll == "broadcast" and n == 13)


# ---- the pieces on their own ------------------------------------------------------------

def test_segments_cover_in_order():
    for n in (0, 1, 7, 100):
        for seg in (0, 1, 3, 7, 100, 1000):
            segs = _binomial.segments(n, seg)
            assert len(segs) == (0 if n == 0 else 1 if seg <= 0 else -(-n // seg))
            bounds = [0, *(b for _, b in segs)]
            assert [a for a, _ in segs] == bounds[:-1] and bounds[-1] == n
            assert all(0 < b - a <= (seg if seg > 0 else n) for a, b in segs)


def test_tree_order():
    for size in SIZES:
        for root in range(size):
            assert _binomial.tree_order(Topology.single_node(size), root) == tuple((root + i) % size for i in range(size))
    # nodes stay contiguous, root's node first, from the root on
    topo = Topology.uniform(8, 2, by_block=False)  # nodes (0,4) (1,5) (2,6) (3,7)
    assert _binomial.tree_order(topo, 5) == (5, 1, 2, 6, 3, 7, 0, 4)


@pytest.mark.parametrize("pipeline", [0, 3])
def test_pieces_on_a_subgroup(pipeline):
    """Reduce then broadcast over group (5, 1, 3, 0) of a world of 7, rooted at rank 3; the rest idle."""
    group, root, size, n = (5, 1, 3, 0), 2, 7, 10
    segs = _binomial.segments(n, pipeline)
    rng = np.random.default_rng(1)
    inputs = [rng.integers(0, 100, n) for _ in range(size)]
    outs = [np.full(n, -1, np.int64) for _ in range(size)]
    scheds = []
    for r in range(size):
        if r not in group:
            scheds.append(EMPTY)
            continue
        pos = group.index(r)
        # the root reduces into out, the others into tmp; the broadcast then fills every out
        work = Slice("out" if pos == root else "tmp", 0, n)
        up = _binomial.reduce(group, pos, root, Slice("in", 0, n), work, segs)
        down = _binomial.broadcast(group, pos, root, Slice("out", 0, n), segs)
        scheds.append(Schedule(tuple(_binomial.compact(up) + _binomial.compact(down)), tmp=n))
    simulate(scheds, inputs, outs, np.add)
    total = sum(inputs[r] for r in group)
    for r in range(size):
        if r in group:
            np.testing.assert_array_equal(outs[r], total, err_msg=f"rank {r}")
        else:
            assert (outs[r] == -1).all(), f"rank {r} is not in the group but was written"


def test_scatter_on_a_subgroup():
    group, root, n = (4, 0, 2, 5, 1), 3, 11
    ranges = [(0, 3), (3, 3), (3, 7), (7, 8), (8, 11)]  # uneven, one empty, relative order
    inputs = [np.arange(n) * (r + 1) for r in range(6)]
    outs = [np.full(n, -1, np.int64) for _ in range(6)]
    scheds = [EMPTY if r not in group else
              Schedule(tuple(_binomial.compact(_binomial.scatter(
                  group, group.index(r), root, Slice("in", 0, n), Slice("out", 0, n), ranges))))
              for r in range(6)]
    simulate(scheds, inputs, outs, np.add)
    src = inputs[group[root]]
    for pos, r in enumerate(group):
        a, b = ranges[(pos - root) % len(group)]
        if pos != root:
            np.testing.assert_array_equal(outs[r][a:b], src[a:b], err_msg=f"rank {r}")


# ---- traffic: closed forms from the tree shape ------------------------------------------

@pytest.mark.parametrize("size", [*range(1, 17)])
def test_binomial_unpipelined_traffic(size):
    """Each non-root receives (broadcast) / sends (reduce) the vector exactly once; L rounds."""
    levels = log2c(size)
    for root in range(size):
        for n in (1, 13, 1000):
            bc = traffic("broadcast", "binomial", size, n, root)
            rd = traffic("reduce", "binomial", size, n, root)
            for r in range(size):
                if r == root:
                    assert (bc[r].bytes_recv, rd[r].bytes_sent) == (0, 0)
                    # the root sends (broadcast) / receives (reduce) once per level
                    assert bc[r].messages_sent == rd[r].messages_recv == levels
                    assert bc[r].bytes_sent == rd[r].bytes_recv == levels * n * ITEM
                else:
                    assert (bc[r].bytes_recv, bc[r].messages_recv) == (n * ITEM, 1)
                    assert (rd[r].bytes_sent, rd[r].messages_sent) == (n * ITEM, 1)
            for t in (bc, rd):
                assert sum(x.bytes_sent for x in t) == (size - 1) * n * ITEM
                assert max(x.rounds for x in t) == levels


@pytest.mark.parametrize("size", [2, 3, 5, 8, 12, 16])
def test_pipelined_rounds(size):
    """S segments: S + L - 1 rounds per phase; the tree allreduce overlaps its phases in S + 2L - 1."""
    levels = log2c(size)
    for n, pipeline in ((1000, 64), (100, 7), (13, 1), (7, 64), (100, 0)):
        s = nsegs(n, pipeline)
        for coll in ("reduce", "broadcast"):
            t = traffic(coll, "binomial", size, n, root=size - 1, pipeline=pipeline)
            assert max(x.rounds for x in t) == s + levels - 1
            moved = [x.messages_sent if coll == "reduce" else x.messages_recv for x in t]
            assert moved == [0 if r == size - 1 else s for r in range(size)]
            assert sum(x.bytes_sent for x in t) == (size - 1) * n * ITEM
        t = traffic("allreduce", "tree", size, n, pipeline=pipeline)
        assert max(x.rounds for x in t) == s + 2 * levels - 1
        assert sum(x.bytes_sent for x in t) == 2 * (size - 1) * n * ITEM
        # rank 0 only receives in the reduce and only sends in the broadcast
        assert t[0].bytes_recv == t[0].bytes_sent == levels * n * ITEM


@pytest.mark.parametrize("size", [*range(2, 17)])
def test_scatter_allgather_traffic(size):
    """Per rank, with blocks b_v of relative rank v = (rank - root) mod N and k the lowest set bit of v:

    scatter: v receives its subtree b_v + ... + b_{v+2^k-1} and forwards all but b_v;
    ring allgather: v receives the n - b_v it lacks and sends every block but its successor's.
    """
    levels = log2c(size)
    for root in (0, size - 1):
        for n in (1, 5, 16, 97, 1000):
            blocks = [n // size + (v < n % size) for v in range(size)]
            t = traffic("broadcast", "scatter_allgather", size, n, root)
            for r in range(size):
                v = (r - root) % size
                sub = n if v == 0 else sum(blocks[v:v + (v & -v)])
                assert t[r].bytes_recv == ((sub if v else 0) + n - blocks[v]) * ITEM, f"rank {r}"
                assert t[r].bytes_sent == (sub - blocks[v] + n - blocks[(v + 1) % size]) * ITEM, f"rank {r}"
            if n >= size:  # every block non-empty: L scatter rounds on the root, N-1 ring rounds
                assert max(x.rounds for x in t) == levels + size - 1
            if size == 1 << levels and n % size == 0:
                # root: (N-1)/N n in the scatter and again in the ring; total n L/2 + (N-1) n
                assert t[root].bytes_sent == 2 * (size - 1) * n // size * ITEM
                assert sum(x.bytes_sent for x in t) == (n * levels // 2 + (size - 1) * n) * ITEM


@pytest.mark.parametrize("size,per_node,by_block", [(8, 4, True), (8, 2, False), (16, 4, False), (12, 4, True)])
def test_trees_cross_each_node_once(size, per_node, by_block):
    """Nodes of 2^a ranks: one message of n per node (but the root's) crosses, whatever the root."""
    topo = Topology.uniform(size, per_node, by_block=by_block)
    others = topo.num_nodes - 1
    n = 100
    for root in range(size):
        for coll in ("reduce", "broadcast"):
            t = traffic(coll, "binomial", size, n, root, topology=topo)
            assert sum(x.sent_by_tier[INTER] for x in t) == others * n * ITEM, (coll, root)
    t = traffic("allreduce", "tree", size, n, pipeline=16, topology=topo)
    assert sum(x.sent_by_tier[INTER] for x in t) == 2 * others * n * ITEM
