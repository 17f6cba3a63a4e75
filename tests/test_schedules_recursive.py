"""Recursive halving/doubling schedules: simulated against NumPy at every world size, and their traffic."""
from __future__ import annotations

import numpy as np
import pytest
from simharness import check, make_problem

from pycollect.algorithms._recursive import Fold, distances, halving_steps
from pycollect.engine.layout import split_even
from pycollect.algorithms.registry import all_schedules
from pycollect.engine.topology import Topology
from pycollect.engine.traffic import count

ALGOS = [("allreduce", "recursive_doubling"), ("allreduce", "rabenseifner"),
         ("reduce_scatter", "recursive_halving"), ("allgather", "recursive_doubling")]
SIZES = [*range(1, 13), 16]
NS = [0, 1, 2, 3, 7, 13, 100]
OPS = ["sum", "max", "bxor"]
ITEMSIZE = 4


def topologies(size):
    return [Topology.single_node(size), Topology.uniform(size, 2, by_block=False)]


def uneven_counts(size, seed):
    """Random block lengths with about a third of them zero."""
    rng = np.random.default_rng(seed)
    counts = rng.integers(1, 12, size)
    counts[rng.random(size) < 0.35] = 0
    return tuple(int(c) for c in counts)


def log2(n):
    return n.bit_length() - 1


# ---- the fold and the halving steps, without data ----

@pytest.mark.parametrize("size", range(1, 34))
def test_fold_maps_core_ranks_onto_a_power_of_two(size):
    f = Fold(size)
    assert f.p2 & (f.p2 - 1) == 0 and f.p2 <= size < 2 * f.p2
    core = [r for r in range(size) if not f.sits_out(r)]
    assert sorted(f.newrank(r) for r in core) == list(range(f.p2))
    assert all(f.rank_of(f.newrank(r)) == r for r in core)
    assert sum(f.sits_out(r) for r in range(size)) == sum(f.absorbs(r) for r in range(size)) == size - f.p2
    assert all(f.sits_out(r - 1) for r in range(size) if f.absorbs(r))
    # New blocks tile the original ones in order, one or two each, and include the carrier's own.
    firsts = [f.first_block(j) for j in range(f.p2 + 1)]
    assert firsts[0] == 0 and firsts[-1] == size
    for j in range(f.p2):
        assert firsts[j + 1] - firsts[j] in (1, 2)
        assert firsts[j] <= f.rank_of(j) < firsts[j + 1]


@pytest.mark.parametrize("p2", [1, 2, 4, 8, 16])
@pytest.mark.parametrize("descending", [True, False])
def test_halving_steps_partners_agree_and_end_on_one_block(p2, descending):
    f = Fold(p2)
    steps = {me: halving_steps(f, me, distances(p2, descending)) for me in range(p2)}
    for me, ss in steps.items():
        assert len(ss) == log2(p2)
        for i, s in enumerate(ss):
            other = steps[f.newrank(s.peer)][i]
            assert f.newrank(other.peer) == me and other.keep == s.give and other.give == s.keep
        end = ss[-1].keep if ss else (0, 1)
        want = me if descending else int(format(me, f"0{log2(p2)}b")[::-1] or "0", 2)
        assert end == (want, want + 1)


# ---- results against the NumPy reference ----

@pytest.mark.parametrize("size", SIZES)
@pytest.mark.parametrize("collective,algorithm", ALGOS)
def test_matches_reference(collective, algorithm, size):
    for topo in topologies(size):
        for n in NS:
            for op in OPS:
                problem = make_problem(collective, size, n=n, topology=topo)
                check(collective, algorithm, problem, op=op)
                if collective == "allreduce":
                    check(collective, algorithm, problem, op=op, inplace=True)


@pytest.mark.parametrize("size", SIZES)
@pytest.mark.parametrize("collective,algorithm", ALGOS[2:])
def test_uneven_counts(collective, algorithm, size):
    for seed in range(3):
        counts = uneven_counts(size, seed * 100 + size)
        for topo in topologies(size):
            for op in OPS:
                check(collective, algorithm, make_problem(collective, size, counts=counts, topology=topo), op=op)
    # Only one rank has data: the harness then runs that rank's allgather in place.
    for holder in {0, size - 1, size // 2}:
        counts = tuple(5 if r == holder else 0 for r in range(size))
        check(collective, algorithm, make_problem(collective, size, counts=counts), inplace=True)


def test_counts_must_name_every_rank():
    for collective, algorithm in ALGOS[2:]:
        problem = make_problem(collective, 4, counts=(1, 2, 3))
        with pytest.raises(ValueError, match="3 entries, expected 4"):
            all_schedules(collective, algorithm, problem)


# ---- traffic ----

def traffic(collective, algorithm, size, n=0, counts=None):
    topo = Topology.single_node(size)
    problem = make_problem(collective, size, n=n, counts=counts, topology=topo)
    return count(all_schedules(collective, algorithm, problem), topo, ITEMSIZE)


@pytest.mark.parametrize("size", [2, 4, 8, 16])
def test_traffic_power_of_two(size):
    steps = log2(size)
    n = 6 * size  # divisible by size, so every block is the same length
    for t in traffic("allreduce", "recursive_doubling", size, n=n):
        assert (t.rounds, t.bytes_sent, t.bytes_recv) == (steps, steps * n * ITEMSIZE, steps * n * ITEMSIZE)
    for t in traffic("allreduce", "rabenseifner", size, n=n):
        assert (t.rounds, t.bytes_sent, t.bytes_recv) == (2 * steps, 2 * (size - 1) * (n // size) * ITEMSIZE,
                                                          2 * (size - 1) * (n // size) * ITEMSIZE)
    for t in traffic("reduce_scatter", "recursive_halving", size, n=n):
        assert (t.rounds, t.bytes_sent) == (steps, (size - 1) * (n // size) * ITEMSIZE)
    for t in traffic("allgather", "recursive_doubling", size, n=n):
        assert (t.rounds, t.bytes_sent) == (steps, (size - 1) * (n // size) * ITEMSIZE)
    # Uneven blocks: every rank still receives each other block exactly once.
    counts = uneven_counts(size, size)
    for t in traffic("allgather", "recursive_doubling", size, counts=counts):
        assert t.bytes_recv == (sum(counts) - counts[t.rank]) * ITEMSIZE


@pytest.mark.parametrize("size", [3, 5, 6, 7, 9, 10, 11, 12, 13])
def test_traffic_folded(size):
    f = Fold(size)
    steps, r, p2 = log2(f.p2), f.extra, f.p2
    out_ranks = [x for x in range(size) if f.sits_out(x)]

    def rounds_by_rank(ts, core):
        return [t.rounds for t in ts] == [2 if f.sits_out(x) else core + 2 * f.absorbs(x) for x in range(size)]

    def balanced(ts):
        return sum(t.bytes_sent for t in ts) == sum(t.bytes_recv for t in ts)

    n = 6 * p2
    ts = traffic("allreduce", "recursive_doubling", size, n=n)
    assert rounds_by_rank(ts, steps) and max(t.rounds for t in ts) == steps + 2 and balanced(ts)
    # Fold in and out move the vector once each per pair; the core exchanges it every step.
    assert sum(t.bytes_sent for t in ts) == (2 * r + p2 * steps) * n * ITEMSIZE

    ts = traffic("allreduce", "rabenseifner", size, n=n)
    assert rounds_by_rank(ts, 2 * steps) and max(t.rounds for t in ts) == 2 * steps + 2 and balanced(ts)
    assert sum(t.bytes_sent for t in ts) == (2 * r * n + 2 * (p2 - 1) * n) * ITEMSIZE

    for counts in (split_even(7 * size, size), uneven_counts(size, size)):
        total = sum(counts)
        folded = sum(counts[x] for x in out_ranks)  # blocks of the ranks that sit out
        # Halving: each new block is given away by p2/2 + p2/4 + ... + 1 = p2-1 ranks.
        ts = traffic("reduce_scatter", "recursive_halving", size, counts=counts)
        assert rounds_by_rank(ts, steps) and max(t.rounds for t in ts) == steps + 2 and balanced(ts)
        assert sum(t.bytes_sent for t in ts) == (r * total + (p2 - 1) * total + folded) * ITEMSIZE
        # Doubling: each core rank receives all but its own new block; fold-out sends everything back.
        ts = traffic("allgather", "recursive_doubling", size, counts=counts)
        assert rounds_by_rank(ts, steps) and max(t.rounds for t in ts) == steps + 2 and balanced(ts)
        assert sum(t.bytes_sent for t in ts) == (folded + (p2 - 1) * total + r * total) * ITEMSIZE
