"""The shared-memory window schedules ("shm") under MPI: calls in flight finished in any order, more calls
than slots, too little shared memory, and windows freed with their Communicator."""
import numpy as np

import pycollect as pc
from helpers import agree, integer_valued, mpi_allgather, mpi_allreduce, mpi_alltoall, mpi_reduce_scatter, same
from pycollect.engine import window
from pycollect.engine.layout import split_even


def _fresh(comm):
    return pc.Communicator(comm.mpi)


def test_calls_in_flight_finish_in_any_order(comm):
    """More calls in flight than slots, completed last first, some ranks spinning on test(), others in wait().

    A request advances only in its own test() and wait(), so every rank completes them in the same order
    (README); a call whose slot is held by an earlier one finishes that one first."""
    p, r = comm.size, comm.rank
    c = _fresh(comm)
    try:
        calls = []
        for k in range(2 * window.SLOTS + 1):
            x = integer_valued((7 * p + k,), np.dtype("f8"), "sum", 100 * k + r)
            kind = k % 4
            if kind == 0:
                calls.append((c.iallreduce(x, algorithm="shm"), mpi_allreduce(comm.mpi, x, "sum")))
            elif kind == 1:
                calls.append((c.iallgather(x, algorithm="shm"), mpi_allgather(comm.mpi, x)))
            elif kind == 2:
                rows = split_even(x.shape[0], p)
                calls.append((c.ireduce_scatter(x, algorithm="shm"), mpi_reduce_scatter(comm.mpi, x, "sum", rows)))
            else:
                y = x[:p * (x.shape[0] // p)]
                calls.append((c.ialltoall(y, algorithm="shm"), mpi_alltoall(comm.mpi, y, split_even(y.shape[0], p))))
        order = [len(calls) - 1, *range(len(calls) - 1)]   # the last first, then the rest in order
        ok = True
        for i in order:
            req, expected = calls[i]
            if r % 3 == 1:
                while not req.test():
                    pass
            ok &= same(req.wait(), expected)
        blocking = c.allreduce(np.full(5, r + 1.0), algorithm="shm")
        agree(comm, ok and same(blocking, np.full(5, p * (p + 1) / 2)), "shm calls in flight")
    finally:
        c.free()


def test_too_little_shared_memory_on_one_rank_runs_the_messages(comm, monkeypatch):
    """One rank sees /dev/shm nearly full: every rank runs the message schedule, and no window grows."""
    c = _fresh(comm)
    try:
        if comm.rank == 0:
            monkeypatch.setattr(window, "shm_free", lambda: 1 << 20)
        x = integer_valued((1 << 18,), np.dtype("f4"), "sum", comm.rank)   # 1 MiB
        got = c.allreduce(x, algorithm="shm")
        slots = c._windows.slots if c._windows else [None]
        grown = [s.nbytes for s in slots if s is not None and s.nbytes > 4096]
        agree(comm, same(got, mpi_allreduce(comm.mpi, x, "sum")) and not grown,
              f"shm with no room: windows grown to {grown}")
        monkeypatch.undo()
        again = c.allreduce(x, algorithm="shm")      # room again: the window grows and is used
        grown = [s.nbytes for s in c._windows.slots if s is not None and s.nbytes > 4096] if c._windows else []
        agree(comm, same(again, mpi_allreduce(comm.mpi, x, "sum")) and (bool(grown) or comm.size == 1
                                                                         or c._windows is None),
              f"shm with room: windows {grown}")
    finally:
        c.free()


def test_free_releases_the_windows(comm):
    c = _fresh(comm)
    c.broadcast(np.arange(10.0), algorithm="shm")
    opened = c._windows
    c.free()
    agree(comm, c._windows is None and (opened is None or opened.slots == [None] * window.SLOTS),
          "windows left after free()")
    d = _fresh(comm)
    try:
        got = d.broadcast(np.arange(10.0) * (comm.rank == 0), algorithm="shm")
        agree(comm, same(got, np.arange(10.0)), "shm broadcast after another Communicator's free")
    finally:
        d.free()
