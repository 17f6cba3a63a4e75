"""Pairwise and Bruck schedules: simulated results against NumPy, aliasing, and traffic."""
from __future__ import annotations

from dataclasses import replace

import numpy as np
import pytest
from simharness import UFUNCS, check, make_problem, reference

from pycollect.engine.layout import ceil_log2, split_even
from pycollect.algorithms.registry import all_schedules
from pycollect.engine.shapes import in_elems, out_elems
from pycollect.engine.simulate import simulate
from pycollect.engine.topology import Topology
from pycollect.engine.traffic import count

SIZES = [*range(1, 13), 16]
COUNTS = [0, 1, 2, 3, 7, 13, 100]
TOPOLOGIES = {"single": Topology.single_node, "round_robin": lambda n: Topology.uniform(n, 2, by_block=False)}
ALGORITHMS = [("reduce_scatter", "pairwise"), ("allgather", "bruck"), ("alltoall", "pairwise"), ("alltoall", "bruck")]
ITEM = 4


def _uneven_counts(rng, size):
    """Random block lengths with about a third of them zero."""
    counts = rng.integers(0, 9, size)
    counts[rng.random(size) < 0.3] = 0
    return counts.tolist()


def _uneven_matrix(rng, size):
    m = rng.integers(0, 9, (size, size))
    m[rng.random((size, size)) < 0.3] = 0
    return m.tolist()


def _problem(collective, size, topo, n=0, counts=None, matrix=None):
    return make_problem(collective, size, n=n, counts=counts, matrix=matrix, topology=TOPOLOGIES[topo](size))


def check_prefix_aliased(collective, algorithm, problem, op="sum", seed=0):
    """Run with ``in`` and ``out`` starting at the same address (MPI_IN_PLACE), any lengths."""
    rng = np.random.default_rng(seed)
    inputs, outs = [], []
    for r in range(problem.size):
        p = replace(problem, rank=r)
        n_in, n_out = in_elems(collective, p), out_elems(collective, p)
        buf = np.full(max(n_in, n_out), -1, np.int64)
        buf[:n_in] = rng.integers(0, 100, n_in)
        inputs.append(buf[:n_in])
        outs.append(buf[:n_out])
    expected = reference(collective, problem, [x.copy() for x in inputs], op)
    simulate(all_schedules(collective, algorithm, problem), inputs, outs, UFUNCS[op])
    for r in range(problem.size):
        np.testing.assert_array_equal(outs[r], expected[r],
                                      err_msg=f"{collective}/{algorithm} rank {r} of {problem.size}")


# ---- results -------------------------------------------------------------------------

@pytest.mark.parametrize("topo", TOPOLOGIES)
@pytest.mark.parametrize("size", SIZES)
@pytest.mark.parametrize("op", ["sum", "max", "bxor"])
def test_reduce_scatter_pairwise_even(size, op, topo):
    for n in COUNTS:
        check("reduce_scatter", "pairwise", _problem("reduce_scatter", size, topo, n=n), op=op)


@pytest.mark.parametrize("topo", TOPOLOGIES)
@pytest.mark.parametrize("size", SIZES)
@pytest.mark.parametrize("collective,algorithm", ALGORITHMS[1:])
def test_even(collective, algorithm, size, topo):
    for n in COUNTS:
        check(collective, algorithm, _problem(collective, size, topo, n=n))


@pytest.mark.parametrize("topo", TOPOLOGIES)
@pytest.mark.parametrize("size", SIZES)
@pytest.mark.parametrize("collective,algorithm", ALGORITHMS)
def test_uneven(collective, algorithm, size, topo):
    rng = np.random.default_rng(1000 + size)
    for _ in range(4):
        if collective == "alltoall":
            problem = _problem(collective, size, topo, matrix=_uneven_matrix(rng, size))
        else:
            problem = _problem(collective, size, topo, counts=_uneven_counts(rng, size))
        for op in (["sum", "max", "bxor"] if collective == "reduce_scatter" else ["sum"]):
            check(collective, algorithm, problem, op=op)


@pytest.mark.parametrize("algorithm", ["pairwise", "bruck"])
@pytest.mark.parametrize("size", SIZES)
def test_alltoall_one_heavy_pair(algorithm, size):
    # All data between two ranks and nothing else: slot capacities must follow the matrix.
    matrix = [[0] * size for _ in range(size)]
    matrix[0][size - 1] = 11
    matrix[size - 1][0] = 5 if size > 1 else 11
    check("alltoall", algorithm, _problem("alltoall", size, "single", matrix=matrix))


# ---- in place ----------------------------------------------------------------------------

@pytest.mark.parametrize("algorithm", ["pairwise", "bruck"])
@pytest.mark.parametrize("size", SIZES)
def test_alltoall_in_place(algorithm, size):
    # Same-length in and out: even blocks, and symmetric uneven matrices.
    rng = np.random.default_rng(size)
    for n in (1, 7, 100):
        check("alltoall", algorithm, _problem("alltoall", size, "single", n=n), inplace=True)
    for _ in range(3):
        m = np.array(_uneven_matrix(rng, size))
        check("alltoall", algorithm, _problem("alltoall", size, "single", matrix=(m + m.T).tolist()), inplace=True)


@pytest.mark.parametrize("size", SIZES)
@pytest.mark.parametrize("collective,algorithm", ALGORITHMS)
def test_prefix_aliased(collective, algorithm, size):
    # in and out share their start but differ in length, as MPI_IN_PLACE calls do.
    rng = np.random.default_rng(2000 + size)
    for _ in range(4):
        if collective == "alltoall":
            problem = _problem(collective, size, "single", matrix=_uneven_matrix(rng, size))
        else:
            problem = _problem(collective, size, "single", counts=_uneven_counts(rng, size))
        check_prefix_aliased(collective, algorithm, problem)


# ---- traffic -----------------------------------------------------------------------------

def _traffic(collective, algorithm, problem):
    return count(all_schedules(collective, algorithm, problem), problem.topology, ITEM)


@pytest.mark.parametrize("topo", TOPOLOGIES)
@pytest.mark.parametrize("size", SIZES)
def test_traffic_alltoall_bruck(size, topo):
    block = 3
    problem = _problem("alltoall", size, topo, n=block * size)
    # Each slot j travels once per set bit of j.
    hops = sum(bin(j).count("1") for j in range(size))
    for t in _traffic("alltoall", "bruck", problem):
        assert t.rounds == ceil_log2(size)
        assert t.messages_sent == t.messages_recv == ceil_log2(size)
        assert t.bytes_sent == hops * block * ITEM


@pytest.mark.parametrize("size", SIZES)
def test_traffic_alltoall_bruck_one_message_per_round_uneven(size):
    rng = np.random.default_rng(3000 + size)
    problem = _problem("alltoall", size, "single", matrix=_uneven_matrix(rng, size))
    for sched in all_schedules("alltoall", "bruck", problem):
        assert sum(rnd.communicates for rnd in sched.rounds) <= ceil_log2(size)
        assert all(len(rnd.sends) <= 1 and len(rnd.recvs) <= 1 for rnd in sched.rounds)


@pytest.mark.parametrize("topo", TOPOLOGIES)
@pytest.mark.parametrize("size", SIZES)
def test_traffic_alltoall_pairwise(size, topo):
    rng = np.random.default_rng(4000 + size)
    even = _problem("alltoall", size, topo, n=5 * size)
    for t in _traffic("alltoall", "pairwise", even):
        assert t.rounds == t.messages_sent == size - 1
        assert t.bytes_sent * size == (size - 1) * 5 * size * ITEM
    uneven = _problem("alltoall", size, topo, matrix=_uneven_matrix(rng, size))
    for r, t in enumerate(_traffic("alltoall", "pairwise", uneven)):
        row = uneven.matrix[r]
        assert t.bytes_sent == (sum(row) - row[r]) * ITEM  # every foreign block exactly once
        assert t.messages_sent == sum(1 for j, x in enumerate(row) if x and j != r)


@pytest.mark.parametrize("topo", TOPOLOGIES)
@pytest.mark.parametrize("size", SIZES)
def test_traffic_allgather_bruck(size, topo):
    total = 6 * size
    problem = _problem("allgather", size, topo, counts=split_even(total, size))
    for t in _traffic("allgather", "bruck", problem):
        assert t.rounds == t.messages_sent == ceil_log2(size)
        assert t.bytes_sent * size == (size - 1) * total * ITEM
        assert t.bytes_recv == t.bytes_sent


@pytest.mark.parametrize("topo", TOPOLOGIES)
@pytest.mark.parametrize("size", SIZES)
def test_traffic_reduce_scatter_pairwise(size, topo):
    n = 7 * size
    for t in _traffic("reduce_scatter", "pairwise", _problem("reduce_scatter", size, topo, n=n)):
        assert t.rounds == t.messages_sent == size - 1
        assert t.bytes_sent * size == (size - 1) * n * ITEM
    rng = np.random.default_rng(5000 + size)
    uneven = _problem("reduce_scatter", size, topo, counts=_uneven_counts(rng, size))
    for r, t in enumerate(_traffic("reduce_scatter", "pairwise", uneven)):
        assert t.bytes_sent == (sum(uneven.counts) - uneven.counts[r]) * ITEM


def test_pairwise_in_place_stages_what_a_test_against_every_later_read_stages():
    """The rounds whose received block waits in tmp (it lands on an ``in`` range still to be read) found in
    O(N log N), as the test of each round against every later range found them in O(N^2) (26 s for one rank at
    16384): random ranges, empty and overlapping ones among them (MPI lets send blocks overlap)."""
    from random import Random

    from pycollect.algorithms.alltoall_pairwise import _staged_rounds

    def overlaps(a, b):
        return a[0] < b[1] and b[0] < a[1] and a[0] < a[1] and b[0] < b[1]

    rng = Random(7)
    for _ in range(3000):
        size = rng.randint(2, 9)
        spans = [(a, a + rng.choice([0, 0, 1, 2, 3, 5])) for a in (rng.randint(0, 30) for _ in range(2 * size + 1))]
        read_at, recv, r = spans[:size + 1], spans[size + 1:], rng.randrange(size)
        walked = {s for s in range(1, size) if any(overlaps(recv[(r - s) % size], later) for later in read_at[s:])}
        assert _staged_rounds(read_at, recv, r, size) == walked, (read_at, recv, r)
