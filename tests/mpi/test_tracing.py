"""PYCOLLECT_TRACE and comm.record() under mpiexec: tracing agreed by every rank, and what a span says of a call.

Each check is first made on its own rank (a rank that fails ends the job: tests/mpi/conftest.py), so a rank
that went on where another waits ends the test instead of hanging it.
"""
import atexit
import json
import os
import shutil
import tempfile

import numpy as np
import pytest

import pycollect as pc
from pycollect.engine import trace
from pycollect.engine.trace_files import FILE
from pycollect.recording import CallRecord

from helpers import agree


@pytest.fixture
def trace_dirs(comm):
    """(this rank's own trace directory, one all ranks share), under a base rank 0 makes; the files traced there
    are forgotten afterwards (not written again at exit) and the base removed."""
    base = comm.mpi.bcast(tempfile.mkdtemp(prefix="pycollect-trace-") if comm.rank == 0 else None, root=0)
    yield os.path.join(base, f"rank{comm.rank}"), os.path.join(base, "shared")
    for directory in [d for d in trace._files if d.startswith(base + os.sep)]:
        atexit.unregister(trace._files.pop(directory).flush)
    comm.mpi.Barrier()
    if comm.rank == 0:
        shutil.rmtree(base, ignore_errors=True)


def _error_of(make):
    """What ``make()`` raised (None: it built a Communicator, freed here)."""
    try:
        made = make()
    except Exception as e:  # noqa: BLE001 (the type is what the test checks)
        return e
    made.free()
    return None


def _spans(directory: str, rank: int) -> list[tuple]:
    """(seq, collective, dtype, bytes, accumulate) of each collective span in ``rank``'s file, in call order."""
    with open(os.path.join(directory, FILE.format(rank=rank))) as f:
        events = json.load(f)["traceEvents"]
    spans = [e["args"] for e in events if e.get("cat") == "collective"]
    return sorted((a["seq"], a["collective"], a["dtype"], a["bytes"], a.get("accumulate", "no field")) for a in spans)


def test_trace_on_some_ranks_only_raises_on_every_rank(comm, trace_dirs, monkeypatch):
    if comm.size < 2:
        pytest.skip("needs two ranks")
    if comm.rank == 1:
        monkeypatch.setenv("PYCOLLECT_TRACE", trace_dirs[0])
    else:
        monkeypatch.delenv("PYCOLLECT_TRACE", raising=False)
    err = _error_of(lambda: pc.Communicator(comm.mpi))
    last = "" if comm.size == 3 else f"-{comm.size - 1}"
    others = "rank 0 has off" if comm.size == 2 else f"ranks 0, 2{last} have off"
    words = ["every rank must use the same settings", "trace differs", "rank 1 has on", others, "PYCOLLECT_TRACE"]
    assert isinstance(err, ValueError) and all(w in str(err) for w in words), f"rank {comm.rank}: {err!r}"
    agree(comm, True, "every rank raised")


def test_an_unwritable_trace_directory_on_one_rank_raises_on_every_rank(comm, trace_dirs, monkeypatch):
    if comm.size < 2:
        pytest.skip("needs two ranks")
    mine, _ = trace_dirs
    os.makedirs(mine)
    blocker = os.path.join(mine, "a-file")
    open(blocker, "w").close()
    bad = os.path.join(blocker, "trace")   # under a file: no directory can be made there
    monkeypatch.setenv("PYCOLLECT_TRACE", bad if comm.rank == 1 else mine)
    err = _error_of(lambda: pc.Communicator(comm.mpi))
    bad_of_1 = bad.replace(f"{os.sep}rank{comm.rank}{os.sep}", f"{os.sep}rank1{os.sep}")
    words = ["PYCOLLECT_TRACE", "rank 1 failed its trace directory check", repr(bad_of_1), "NotADirectoryError"]
    assert isinstance(err, OSError) and all(w in str(err) for w in words), f"rank {comm.rank}: {err!r}"
    assert sorted(os.listdir(mine)) == ["a-file"], os.listdir(mine)   # nothing left by the ranks that could write
    # every rank in step afterwards: tracing on everywhere, each rank in its own directory, builds and runs
    monkeypatch.setenv("PYCOLLECT_TRACE", mine)
    traced = pc.Communicator(comm.mpi)
    total = traced.allreduce(np.ones(4), algorithm="ring")
    traced.free()
    assert (total == comm.size).all() and [s[:2] for s in _spans(mine, comm.rank)] == [(1, "allreduce")]


def test_barrier_is_recorded_as_a_call_of_no_elements(comm):
    with comm.record() as log:
        comm.barrier()
        comm.allreduce(np.ones(3, np.float32), algorithm="ring")
        comm.barrier()
    none = CallRecord("barrier", True, 0, "", 0, ())
    assert log == [none, CallRecord("allreduce", True, 3, "float32", 12, (3,)), none], log
    comm.barrier()   # the lean path again once the recording ended


@pytest.mark.parametrize("timeout", [None, 60])
def test_barrier_is_traced_and_takes_its_number(comm, trace_dirs, monkeypatch, timeout):
    """Every call number has its span; under the watchdog (timeout) too, which watches the barrier as before."""
    mine, _ = trace_dirs
    monkeypatch.setenv("PYCOLLECT_TRACE", mine)
    traced = pc.Communicator(comm.mpi, timeout=timeout)
    with traced.record() as log:
        traced.allreduce(np.ones(8, np.float32), algorithm="ring")
        traced.barrier()
        traced.allreduce(np.ones(8, np.float32))
    traced.barrier()   # outside the recording: traced all the same
    traced.free()
    spans = [s[:4] for s in _spans(mine, comm.rank)]
    assert spans == [(1, "allreduce", "float32", 32), (2, "barrier", None, 0), (3, "allreduce", "float32", 32),
                     (4, "barrier", None, 0)], spans
    assert [r.collective for r in log] == ["allreduce", "barrier", "allreduce"], log


@pytest.mark.parametrize("algorithm", ["ring", "mpi"])
def test_an_accumulated_allreduce_is_traced_as_handed_in(comm, trace_dirs, monkeypatch, algorithm):
    """float16 reduced in float32: the span says float16 and its bytes, as the record does, and the accumulation
    dtype beside them; a non-blocking one too."""
    _, shared = trace_dirs   # one directory for every rank: each writes its own file there
    monkeypatch.setenv("PYCOLLECT_TRACE", shared)
    traced = pc.Communicator(comm.mpi)
    x = np.ones(8, np.float16)
    with traced.record() as log:
        got = traced.allreduce(x, accumulate="float32", algorithm=algorithm)
        waited = traced.iallreduce(x, accumulate="float32", algorithm=algorithm).wait()
        plain = traced.allreduce(np.ones(8, np.float32), algorithm=algorithm)
    traced.free()
    assert got.dtype == waited.dtype == np.float16 and (got == comm.size).all() and (plain == comm.size).all()
    assert [(r.dtype, r.nbytes) for r in log] == [("float16", 16)] * 2 + [("float32", 32)], log
    spans = _spans(shared, comm.rank)
    assert spans == [(1, "allreduce", "float16", 16, "float32"), (2, "allreduce", "float16", 16, "float32"),
                     (3, "allreduce", "float32", 32, None)], spans
