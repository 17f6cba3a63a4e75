"""Soak: blocking and non-blocking collectives back to back on random sizes, several in flight at once.

Every rank seeds the same generator, so all ranks plan the same calls in the same order: which
collective, dtype, op, algorithm, size and counts, when to start a non-blocking call (up to four
in flight) and which one to complete next, by spinning on ``test()`` or by ``wait()``. Rank r's
input to call k is ``integer_valued(..., seed=k * 64 + r)``, so each rank computes every result
with NumPy from the inputs of all ranks, without MPI.

Checked: every result; each call takes exactly one tag and no two calls in flight share one;
traced memory and RSS flat between the end of the second and the last quarter (the bounded
caches that legitimately fill up are left out: the schedule cache, at most 512 entries, the windowed
plans' and the runner's made schedules and plans, and MPI's own calls' count vectors (256 shapes each) are
emptied before each sample, and the scratch pool's bytes
are subtracted); the scratch pool holds at most
``keep`` buffers per dtype; no request left (each finished schedule's MPI requests are null, and after a final barrier
no message is pending on the library's communicators).

``PYCOLLECT_SOAK=10000`` sets the number of calls (default 1000, fewer above four ranks, where
ranks outnumber the cores of a CI machine and each call costs more: 600 at 5, 375 at 8).
"""
from __future__ import annotations

import functools
import gc
import os
import resource
import time
import tracemalloc

import numpy as np
from mpi4py import MPI

import pycollect as pc
from helpers import agree, avg_of, integer_valued, same
from simharness import UFUNCS
from pycollect.runner import _planned, _schedule
from pycollect.engine import mpi_native, ops
from pycollect.engine.layout import split_even
from pycollect.engine.mpi_native import supports as mpi_supports

_SIZE = MPI.COMM_WORLD.Get_size()
CALLS = int(os.environ.get("PYCOLLECT_SOAK", 0)) or min(1000, (4000 if _SIZE <= 4 else 3000) // _SIZE)
MAX_IN_FLIGHT = 4
SEED = 20240611
DTYPES = [np.dtype(t) for t in ("i4", "i8", "u2", "f2", "f4", "f8", "c16")]
OPS = {"i": ("sum", "max", "min", "avg", "prod", "bxor"), "u": ("sum", "max", "bor", "avg"),
       "f": ("sum", "max", "min", "avg", "prod"), "c": ("sum", "prod", "avg")}
BLOCKING = ("allreduce", "reduce_scatter", "allgather", "alltoall", "broadcast", "reduce")
NONBLOCKING = ("allreduce", "reduce_scatter", "allgather", "alltoall")
# Flat between quarters: traced memory less the scratch pool (bounded, but its buffers grow to the largest
# message seen) and with the schedule cache emptied (bounded at 512 entries, but filling).
# A leak of 32 bytes a call shows at 10,000 calls; one of 200 at the default 1000.
TRACED_GROWTH_BYTES = 64 << 10
TRACED_GROWTH_PER_CALL = 32
RSS_GROWTH_BYTES = 16 << 20


class Call:
    """One planned collective: what to run and what each rank must get back."""

    def __init__(self, k, collective, blocking, dtype, op, algorithm, args, x, expected):
        self.k, self.collective, self.blocking = k, collective, blocking
        self.dtype, self.op, self.algorithm = dtype, op, algorithm
        self.args, self.x, self.expected = args, x, expected
        self.request = self.tag = None

    def __repr__(self):
        return (f"call {self.k}: {'' if self.blocking else 'i'}{self.collective} {self.algorithm} {self.dtype} "
                f"{self.op} x{self.x.shape}")


def rank_input(k, r, shape, dtype, op):
    return integer_valued(shape, dtype, op, k * 64 + r)


def reduced(arrays, op, size):
    """The reduction in rank order with NumPy's own ufuncs, the average apart from the library (helpers.avg_of)."""
    total = functools.reduce(UFUNCS["sum" if op == "avg" else op], arrays)
    return avg_of(total, size) if op == "avg" else total


def plan(rng, k, size, rank) -> Call:
    """The same call on every rank (``rng`` is seeded alike), with this rank's input and expected result."""
    collective = BLOCKING[rng.integers(len(BLOCKING))]
    blocking = collective not in NONBLOCKING or rng.random() < 0.5
    dtype = DTYPES[rng.integers(len(DTYPES))]
    kind_ops = OPS[ops.dtype_kind(dtype)]
    op = kind_ops[rng.integers(len(kind_ops))] if collective in ("allreduce", "reduce_scatter", "reduce") else "sum"
    names = [a for a in pc.algorithms(collective) if a != "mpi" or mpi_supports(dtype)]
    algorithm = names[rng.integers(len(names))]
    width = int(rng.integers(1, 4))
    rows = int(2 ** rng.uniform(0, 10)) - 1                      # 0 .. 1022 rows, mostly small
    inputs = lambda shapes: [rank_input(k, r, (n, width), dtype, op) for r, n in enumerate(shapes)]  # noqa: E731
    if collective in ("allreduce", "broadcast", "reduce"):
        xs = inputs([rows] * size)
        root = int(rng.integers(size))
        expected = {"allreduce": lambda: reduced(xs, op, size), "broadcast": lambda: xs[root],
                    "reduce": lambda: reduced(xs, op, size) if rank == root else None}[collective]()
        args = {} if collective == "allreduce" else {"root": root}
    elif collective == "reduce_scatter":
        counts = tuple(int(c) for c in rng.multinomial(rows, [1 / size] * size))
        xs = inputs([rows] * size)
        start = sum(counts[:rank])
        expected = reduced(xs, op, size)[start:start + counts[rank]]
        args = {"counts": counts if rng.random() < 0.7 else None}
        if args["counts"] is None:
            expected = reduced(xs, op, size)[_even_slice(rows, size, rank)]
    elif collective == "allgather":
        lengths = [int(n) for n in rng.integers(0, rows + 1, size)]
        xs = inputs(lengths)
        expected = np.concatenate(xs)
        args = {"counts": lengths if rng.random() < 0.5 else None}
    else:
        even = rng.random() < 0.3                  # MPI_Alltoall's even split, else alltoallv counts
        matrix = (np.array([split_even(rows, size)] * size) if even
                  else rng.integers(0, rows // size + 2, (size, size)))
        xs = inputs([int(row.sum()) for row in matrix])
        expected = np.concatenate([xs[r][int(sum(matrix[r][:rank])):][:matrix[r][rank]] for r in range(size)])
        args = {"counts": None if even else [int(c) for c in matrix[rank]]}
    if collective in ("allreduce", "reduce_scatter", "reduce"):
        args["op"] = op
    return Call(k, collective, blocking, dtype, op, algorithm, args, xs[rank], expected)


def _even_slice(rows, size, rank):
    counts = split_even(rows, size)
    start = sum(counts[:rank])
    return slice(start, start + counts[rank])


def pool_bytes(c) -> int:
    """Bytes held by the Communicator's scratch pool (at most ``keep`` buffers per dtype, the largest seen)."""
    return sum(b.nbytes for bufs in c._runner.pool._free.values() for b in bufs)


def rss_bytes() -> int:
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * resource.getpagesize()


def test_soak(comm):
    c = pc.Communicator(segment_bytes=16 << 10)    # messages over 16 KiB go in several pieces
    size, rank = c.size, c.rank
    rng = np.random.default_rng(SEED)               # the same plan on every rank
    tracing = not tracemalloc.is_tracing()
    if tracing:
        tracemalloc.start()
    wrong, tag_errors, leftover = [], [], []
    in_flight: list[Call] = []
    samples = {}
    t0 = time.perf_counter()

    def start(call: Call) -> None:
        before = c._runner.seq
        fn = getattr(c, call.collective if call.blocking else "i" + call.collective)
        out = fn(call.x, algorithm=call.algorithm, **call.args)
        if c._runner.seq != before + 1:
            tag_errors.append(f"{call} took {c._runner.seq - before} sequence numbers")
        call.tag = c._runner.seq & 0x7FFF
        if call.tag in {f.tag for f in in_flight}:
            tag_errors.append(f"{call} shares tag {call.tag} with a call in flight")
        if call.blocking:
            check(call, out)
            return
        call.request = out
        run = getattr(out, "_run", None)     # a schedule's Execution knows its tag; MPI's own requests do not
        if getattr(run, "tag", call.tag) != call.tag:
            tag_errors.append(f"{call} runs on tag {run.tag}, its sequence says {call.tag}")
        in_flight.append(call)

    def check(call: Call, got) -> None:
        if not same(got, call.expected):   # equal values (a product's zero may come out as -0.0)
            wrong.append(repr(call))

    def finish(j: int, spin: bool) -> None:
        call = in_flight.pop(j)
        run = call.request._run
        if spin:
            while not call.request.test():
                pass
        check(call, call.request.wait())
        if run is not None and any(r != MPI.REQUEST_NULL for r in getattr(run, "_reqs", ())):
            leftover.append(f"{call}: MPI requests still active")

    def drain() -> None:
        while in_flight:
            finish(int(rng.integers(len(in_flight))), rng.random() < 0.5)

    quarter = {CALLS * q // 4: q for q in (1, 2, 3, 4)}
    for k in range(CALLS):
        while in_flight and (len(in_flight) == MAX_IN_FLIGHT or rng.random() < 0.35):
            finish(int(rng.integers(len(in_flight))), rng.random() < 0.5)
        start(plan(rng, k, size, rank))
        for call in in_flight:   # progress on whatever is in flight; this rank's timing decides what finishes
            call.request.test()
        if k + 1 in quarter:
            drain()
            cached = _schedule.cache_info().currsize
            _schedule.cache_clear()   # bounded (512 schedules) but filling: it would read as growth
            _planned.cache_clear()    # likewise the windowed calls' plans (64),
            c._runner._made.clear()   # and the runner's made schedules and plans (512 shapes of call)
            for counted in (mpi_native._vector, mpi_native._rooted_vector, mpi_native._alltoall_vectors):
                counted.cache_clear()   # MPI's own calls' count vectors (256 shapes each; 7 ranks fill them slowly)
            gc.collect()
            pooled = pool_bytes(c)
            samples[quarter[k + 1]] = (tracemalloc.get_traced_memory()[0] - pooled, rss_bytes(), cached, pooled)
    drain()
    elapsed = time.perf_counter() - t0
    peak = tracemalloc.get_traced_memory()[1]
    if tracing:
        tracemalloc.stop()

    c.barrier()
    pending = [name for name, m in (("collectives", c._lib), ("send/recv", c._p2p))
               if m.Iprobe(MPI.ANY_SOURCE, MPI.ANY_TAG)]
    pool = {key: len(bufs) for key, bufs in c._runner.pool._free.items()}
    traced_growth = samples[4][0] - samples[2][0]
    rss_growth = samples[4][1] - samples[2][1]
    c.barrier()
    c.free()

    if rank == 0:
        print(f"\nsoak: {CALLS} calls on {size} ranks in {elapsed:.2f} s ({CALLS / elapsed:.0f} calls/s); "
              f"traced memory less the pool at quarters {[f'{samples[q][0] / 2**20:.2f}' for q in (1, 2, 3, 4)]} MiB "
              f"(growth Q2->Q4 {traced_growth / 2**10:+.1f} KiB, peak {peak / 2**20:.2f} MiB); "
              f"RSS {[f'{samples[q][1] / 2**20:.1f}' for q in (1, 2, 3, 4)]} MiB "
              f"(growth {rss_growth / 2**20:+.2f} MiB); "
              f"pool {[f'{samples[q][3] / 2**10:.0f}' for q in (1, 2, 3, 4)]} KiB, {sum(pool.values())} buffers; "
              f"schedule cache at quarters {[samples[q][2] for q in (1, 2, 3, 4)]} entries", flush=True)
    agree(c, not wrong, f"{len(wrong)} wrong results, first: {wrong[:3]}")
    agree(c, not tag_errors, f"tags: {tag_errors[:3]}")
    agree(c, not leftover and not pending, f"requests left: {leftover[:3]}, messages pending on {pending}")
    agree(c, all(n <= c._runner.pool._keep for n in pool.values()), f"buffer pool grew: {pool}")
    agree(c, traced_growth <= TRACED_GROWTH_BYTES + TRACED_GROWTH_PER_CALL * (CALLS // 2),
          f"traced memory grew {traced_growth} bytes between the second and the last quarter")
    agree(c, rss_growth <= RSS_GROWTH_BYTES, f"RSS grew {rss_growth} bytes between the second and the last quarter")
