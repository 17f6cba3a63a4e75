"""The scan and exscan schedules without MPI: every rank's result against a sequential prefix at every world size
(segmented, in place), and every rank's traffic against the closed forms. Rank order (a non-commutative op):
tests/test_rank_order.py."""
from __future__ import annotations

import numpy as np
import pytest

import pycollect as pc
from pycollect.algorithms.registry import all_schedules
from pycollect.engine.schedule import Problem
from pycollect.engine.simulate import simulate
from pycollect.engine.topology import Topology
from pycollect.engine.traffic import count

SIZES = [*range(1, 10), 16]
ITEM = 8
FORMS = [(c, a) for c in ("scan", "exscan") for a in ("linear", "recursive_doubling")]


def log2c(n):
    """ceil(log2 n), written out rather than taken from the engine."""
    levels = 0
    while (1 << levels) < n:
        levels += 1
    return levels


def problem(size, n, segment=0):
    return Problem(0, size, Topology.single_node(size), n=n, tree_segment=segment)


@pytest.mark.parametrize("collective, algorithm", FORMS)
def test_every_rank_holds_its_prefix(collective, algorithm):
    """Rank r holds the sum of ranks 0..r (scan) or 0..r-1 (exscan; rank 0 nothing), in and out apart or one array."""
    exclusive = collective == "exscan"
    for size in SIZES:
        for n in (0, 1, 5, 13):
            for segment in (0, 1, 4):
                for in_place in (False, True):
                    rng = np.random.default_rng(size * 100 + n)
                    inputs = [rng.integers(-50, 50, n) for _ in range(size)]
                    running = np.cumsum(np.stack(inputs), axis=0) if n else np.zeros((size, 0), np.int64)
                    expected = [None if exclusive and r == 0 else running[r - exclusive] for r in range(size)]
                    given = [x.copy() for x in inputs]
                    outs = [None if e is None else x if in_place else np.full(n, -7) for e, x in zip(expected, given)]
                    simulate(all_schedules(collective, algorithm, problem(size, n, segment)), given, outs, np.add)
                    case = f"{collective} {algorithm} size {size} n={n} segment {segment} in place {in_place}"
                    assert all((o is None) == (e is None) for o, e in zip(outs, expected)), case
                    assert all(np.array_equal(o, e) for o, e in zip(outs, expected) if e is not None), case
                    if not in_place:
                        assert all(np.array_equal(g, x) for g, x in zip(given, inputs)), f"{case}: input written"


@pytest.mark.parametrize("collective", ["scan", "exscan"])
def test_linear_traffic(collective):
    """Every rank but the last sends the vector once, every rank but the first receives it once, in one message per
    segment."""
    for size in SIZES:
        for n, segment in ((13, 0), (13, 4), (12, 4)):
            got = count(all_schedules(collective, "linear", problem(size, n, segment)), Topology.single_node(size), ITEM)
            pieces = -(-n // segment) if segment else 1
            for r, t in enumerate(got):
                sends, recvs = size > 1 and r < size - 1, r > 0
                assert (t.bytes_sent, t.messages_sent) == ((n * ITEM, pieces) if sends else (0, 0)), (size, r)
                assert (t.bytes_recv, t.messages_recv) == ((n * ITEM, pieces) if recvs else (0, 0)), (size, r)


def test_recursive_doubling_traffic():
    """Scan: ceil(log2 p) rounds, rank r sending the vector in round k when r + 2^k < p. Exscan: one more round
    handing each rank its neighbour's input, then ceil(log2(p - 1)) rounds of distances 2^k in which ranks >= 1
    send when r + 2^k < p."""
    n = 7
    for size in SIZES:
        for collective in ("scan", "exscan"):
            got = count(all_schedules(collective, "recursive_doubling", problem(size, n)), Topology.single_node(size),
                        ITEM)
            if collective == "scan":
                rounds = log2c(size)
                sent = [sum(r + (1 << k) < size for k in range(rounds)) for r in range(size)]
                received = [sum(r - (1 << k) >= 0 for k in range(rounds)) for r in range(size)]
            else:
                rounds = 1 + log2c(size - 1) if size > 1 else 0
                sent = [(r + 1 < size) + sum(r >= 1 and r + (1 << k) < size for k in range(rounds - 1))
                        for r in range(size)]
                received = [(r >= 1) + sum(r - (1 << k) >= 1 for k in range(rounds - 1)) for r in range(size)]
            assert max(t.rounds for t in got) == rounds, (collective, size)
            assert [t.bytes_sent for t in got] == [k * n * ITEM for k in sent], (collective, size)
            assert [t.bytes_recv for t in got] == [k * n * ITEM for k in received], (collective, size)


def test_pc_traffic_counts_the_scans():
    """The public walker takes the new collectives: the linear pipeline's total is (p - 1) vectors."""
    t = pc.traffic("scan", "linear", 8, 1 << 20, dtype="float64")
    assert t.total_bytes == 7 << 20 and t.per_rank[-1].bytes_sent == 0
    assert pc.traffic("exscan", "recursive_doubling", 8, 800).rounds == 1 + log2c(7)
