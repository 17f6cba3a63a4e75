"""Hierarchical allreduce: results on every topology kind, and traffic per tier against the formulas."""
from __future__ import annotations

import pytest

import simharness
from pycollect.algorithms.registry import all_schedules
from pycollect.engine.topology import INTER, INTRA, Topology
from pycollect.engine.traffic import count

NS = (0, 1, 2, 3, 7, 13, 100)
OPS = ("sum", "max", "bxor")


def _non_uniform(size: int) -> list[Topology]:
    """Node sizes that differ: a lone rank beside the rest, nodes of 2 and 1, round-robin of 3."""
    if size < 3:
        return []
    tops = [Topology.from_labels([0] + [1] * (size - 1)),       # (1, size-1)
            Topology.from_labels([r // 2 for r in range(size)]),  # (2, 2, ..., 1) when size is odd
            Topology.from_labels([r % 3 for r in range(size)]),   # round robin on 3 nodes
            Topology.from_labels([min(r, 2) for r in range(size)])]  # (1, 1, size-2)
    return [t for t in tops if not t.is_uniform]


def _topologies(size: int) -> list[Topology]:
    tops = [Topology.single_node(size), Topology.uniform(size, 1), Topology.uniform(size, 2, by_block=True),
            Topology.uniform(size, 2, by_block=False), Topology.uniform(size, 3)]
    return tops + _non_uniform(size)


def _check_all(top: Topology) -> None:
    for n in NS:
        for op in OPS:
            for inplace in (False, True):
                prob = simharness.make_problem("allreduce", top.size, n=n, topology=top)
                simharness.check("allreduce", "hierarchical", prob, op=op, inplace=inplace)


@pytest.mark.parametrize("size", range(1, 13))
def test_every_topology(size):
    for top in _topologies(size):
        _check_all(top)


@pytest.mark.parametrize("node_of", [(0, 0, 0, 1, 1), (0, 1, 0, 1, 1), (0, 1, 1, 2, 2, 2, 2), (0, 0, 1, 2, 1, 2, 2, 2)])
def test_named_non_uniform(node_of):
    top = Topology(node_of)
    assert not top.is_uniform
    _check_all(top)


@pytest.mark.parametrize("size", range(13, 17))
def test_large_worlds(size):
    for top in (Topology.uniform(size, 4), Topology.uniform(size, 4, by_block=False), *_non_uniform(size)):
        for n in (1, size - 1, 3 * size + 1):
            prob = simharness.make_problem("allreduce", size, n=n, topology=top)
            simharness.check("allreduce", "hierarchical", prob, op="sum", inplace=n % 2 == 1)


def _traffic(algorithm: str, top: Topology, n: int, itemsize: int):
    prob = simharness.make_problem("allreduce", top.size, n=n, topology=top)
    return count(all_schedules("allreduce", algorithm, prob), top, itemsize)


@pytest.mark.parametrize("nodes,per_node", [(2, 2), (2, 3), (3, 2), (3, 4), (4, 3), (2, 6), (4, 4)])
@pytest.mark.parametrize("by_block", [True, False])
def test_traffic_per_tier(nodes, per_node, by_block):
    size, itemsize = nodes * per_node, 4
    top = Topology.uniform(size, per_node, by_block=by_block)
    assert top.num_nodes == nodes and top.is_uniform
    n = 5 * size  # divisible by N, so every block is whole
    for t in _traffic("hierarchical", top, n, itemsize):
        # inter: 2(M-1)/M * n/L; intra: 2(L-1)/L * n (elements, times itemsize)
        assert t.sent_by_tier[INTER] == 2 * (nodes - 1) * n * itemsize // (nodes * per_node), t.rank
        assert t.sent_by_tier[INTRA] == 2 * (per_node - 1) * n * itemsize // per_node, t.rank


@pytest.mark.parametrize("nodes,per_node", [(2, 2), (2, 3), (3, 2), (3, 4), (4, 3), (2, 6)])
def test_less_inter_node_than_ring(nodes, per_node):
    size, itemsize = nodes * per_node, 8
    top = Topology.uniform(size, per_node, by_block=False)
    n = 7 * size
    hier = sum(t.sent_by_tier[INTER] for t in _traffic("hierarchical", top, n, itemsize))
    ring = sum(t.sent_by_tier[INTER] for t in _traffic("ring", top, n, itemsize))
    assert 0 < hier < ring, (hier, ring)


@pytest.mark.parametrize("size", [2, 3, 5, 8])
@pytest.mark.parametrize("one_per_node", [False, True])
def test_degenerates_to_ring(size, one_per_node):
    """One node, or nodes of one rank: the same traffic and rounds as the flat ring, rank by rank."""
    top = Topology.uniform(size, 1) if one_per_node else Topology.single_node(size)
    for n in (1, size, 10 * size + 3):
        hier, ring = _traffic("hierarchical", top, n, 4), _traffic("ring", top, n, 4)
        assert [(t.sent_by_tier, t.rounds) for t in hier] == [(t.sent_by_tier, t.rounds) for t in ring]


def test_leaders_only_leaders_cross_nodes():
    """Nodes of different sizes: inter-node bytes come from each node's lowest rank only."""
    top = Topology.from_labels([0, 0, 0, 1, 1, 2])
    n, itemsize = 60, 4
    leaders = {g[0] for g in top.nodes}
    for t in _traffic("hierarchical", top, n, itemsize):
        want = 2 * (top.num_nodes - 1) * n * itemsize // top.num_nodes if t.rank in leaders else 0
        assert t.sent_by_tier[INTER] == want, t.rank
