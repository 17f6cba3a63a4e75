"""Gather and scatter schedules (binomial, linear) run for all ranks in one process against a NumPy reference, and
their traffic against the closed forms, without MPI."""
import random

import numpy as np
import pytest

import pycollect as pc
from pycollect.algorithms.registry import all_schedules
from pycollect.engine.layout import split_even
from pycollect.engine.schedule import Problem
from pycollect.engine.simulate import simulate
from pycollect.engine.topology import Topology
from pycollect.engine.traffic import count

ALGORITHMS = [(c, a) for c in ("gather", "scatter") for a in ("binomial", "linear")]


def topologies(size):
    yield Topology.single_node(size)
    yield Topology.uniform(size, 2, by_block=True) if size % 2 == 0 else Topology.from_labels([r % 3 for r in range(size)])
    yield Topology.uniform(size, 2, by_block=False) if size % 2 == 0 else Topology.from_labels([r // 2 for r in range(size)])


def layouts(size, rng):
    """(counts, displs): even, uneven with zeros, fewer elements than ranks, displacements with gaps and out of rank
    order (displs empty: packed in rank order)."""
    yield split_even(5 * size, size), ()
    yield tuple(rng.randrange(4) for _ in range(size)), ()
    yield split_even(max(size - 2, 0), size), ()
    counts = tuple(rng.randrange(4) for _ in range(size))
    order, at, displs = rng.sample(range(size), size), 1, [0] * size
    for r in order:   # blocks in a shuffled order, a gap of 0-2 elements before each
        displs[r] = at
        at += counts[r] + rng.randrange(3)
    yield counts, tuple(displs)


def problem(size, topo, counts, displs, root):
    n = max((d + c for d, c in zip(displs, counts)), default=0) if displs else sum(counts)
    return Problem(0, size, topo, n=n, counts=counts, displs=displs, root=root)


def starts(p):
    return p.displs or tuple(np.cumsum((0,) + p.counts[:-1]).tolist())


def run_gather(algorithm, p, rng):
    """Every rank's block gathered on the root; the root's other elements keep their marker."""
    blocks = [np.array(rng.integers(0, 1000, p.counts[r])) for r in range(p.size)]
    outs = [np.full(p.n, -1, np.int64) if r == p.root else None for r in range(p.size)]
    simulate(all_schedules("gather", algorithm, p), [b.copy() for b in blocks], outs, np.add)
    expected = np.full(p.n, -1, np.int64)
    for r, d in enumerate(starts(p)):
        expected[d:d + p.counts[r]] = blocks[r]
    return outs, expected


def run_scatter(algorithm, p, rng):
    whole = np.array(rng.integers(0, 1000, p.n))
    inputs = [whole.copy() if r == p.root else np.zeros(0, np.int64) for r in range(p.size)]
    outs = [np.full(p.counts[r], -1, np.int64) for r in range(p.size)]
    simulate(all_schedules("scatter", algorithm, p), inputs, outs, np.add)
    expected = [whole[d:d + c] for d, c in zip(starts(p), p.counts)]
    return outs, expected, inputs[p.root], whole


@pytest.mark.parametrize("collective, algorithm", ALGORITHMS)
def test_every_rank_holds_its_blocks(collective, algorithm):
    """Sizes 1-17 and 32 on one node and on two and three, every layout, roots 0, the last and one between."""
    rng = random.Random(3)
    nrng = np.random.default_rng(3)
    for size in [*range(1, 18), 32]:
        for topo in topologies(size):
            for counts, displs in layouts(size, rng):
                for root in sorted({0, size - 1, size // 2}):
                    p = problem(size, topo, counts, displs, root)
                    where = f"{collective}/{algorithm} N={size} root={root} counts={counts} displs={displs}"
                    if collective == "gather":
                        outs, expected = run_gather(algorithm, p, nrng)
                        np.testing.assert_array_equal(outs[root], expected, err_msg=where)
                    else:
                        outs, expected, x, original = run_scatter(algorithm, p, nrng)
                        for r in range(size):
                            np.testing.assert_array_equal(outs[r], expected[r], err_msg=f"{where} rank {r}")
                        np.testing.assert_array_equal(x, original, err_msg=f"{where}: the root's input was written")


def subtree_elements(p, r):
    """Elements of the blocks in rank r's binomial subtree (relative ranks [v, v + 2^k), on one node in rank order
    from the root)."""
    size = p.size
    v = (r - p.root) % size
    k = (v & -v).bit_length() - 1 if v else size.bit_length()
    return sum(p.counts[(p.root + u) % size] for u in range(v, min(v + (1 << k), size)))


@pytest.mark.parametrize("collective", ["gather", "scatter"])
def test_traffic_is_the_closed_form(collective):
    """Bytes each rank sends and receives, walked from the schedules: linear, the root receives (sends) every other
    rank's block and each of them sends (receives) its own; binomial, each non-root sends (receives) its whole
    subtree's blocks once, the root receives (sends) the sum of the others'. With displacements too (the root
    packs or unpacks, which moves nothing more)."""
    rng = random.Random(5)
    for size in [*range(1, 12), 16, 23]:
        topo = Topology.single_node(size)
        for counts, displs in layouts(size, rng):
            for root in sorted({0, size - 1}):
                p = problem(size, topo, counts, displs, root)
                others = sum(counts) - counts[root]
                for algorithm in ("linear", "binomial"):
                    per_rank = count(all_schedules(collective, algorithm, p), topo, 8)
                    for r, t in enumerate(per_rank):
                        own = counts[r] if algorithm == "linear" else subtree_elements(p, r)
                        up, down = (t.bytes_sent, t.bytes_recv) if collective == "gather" else (t.bytes_recv,
                                                                                                t.bytes_sent)
                        if r == root:
                            assert (up, down) == (0, 8 * others), (collective, algorithm, size, r)
                        else:
                            # what a non-root passes on: its subtree less its own block (linear: nothing)
                            assert (up, down) == (8 * own, 8 * (own - counts[r])), (collective, algorithm, size, r)


def test_traffic_counts_the_gather_with_pc_traffic():
    """``pc.traffic`` on the even problem: 1 MiB gathered over 8 ranks moves 7/8 of it into the root, in 3 rounds
    (binomial) or 1 (linear)."""
    for collective in ("gather", "scatter"):
        binomial = pc.traffic(collective, "binomial", 8, 1 << 20)
        linear = pc.traffic(collective, "linear", 8, 1 << 20)
        root = binomial.per_rank[0]
        moved = root.bytes_recv if collective == "gather" else root.bytes_sent
        assert moved == (1 << 20) * 7 // 8 == linear.total_bytes == sum(t.bytes_sent for t in linear.per_rank)
        assert (binomial.rounds, linear.rounds) == (3, 1)
        assert binomial.total_bytes == (1 << 20) // 8 * 12   # subtrees of 4, 2, 1, 2, 1, 1, 1 blocks
