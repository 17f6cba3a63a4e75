"""One-round schedules at two ranks, run straight on MPI: the lean paths of allreduce, reduce-scatter and allgather
for mid sizes.

At two ranks the schedule (algorithms/allreduce_recursive_doubling.py) is one round: each rank sends its whole
vector to the other, receives the other's and reduces the two, the lower rank's first. Run through the executor
that round costs 10-14 us of Python; here it is one ``MPI_Sendrecv`` on the runner's communicator with the call's
tag (the messages, their tag and the reduction's order are the schedule's, so what ``pc.traffic`` counts and the
bits every rank holds are the same either way) and one ufunc call. From a few KiB it beats ``MPI_Allreduce`` at
two ranks here (bench/README.md); the selector says where ``auto`` takes it.

The ring reduce-scatter at two ranks is one round too: each rank sends the block the other keeps and reduces the
one it receives into its own (its own block first, as the schedule has it); ``reduce_scatter`` runs it the same
way, for blocks of one message, neither empty. So does the ring allgather: each rank sends its ``x`` and receives
the other's straight into its block of ``out``, and copies its own into place as the schedule does.

Only where nothing else is in flight on this rank's runner (no other call's tag to share), on host arrays that
the lean paths have checked; anything else takes the general path, which runs the same schedule.
"""
from __future__ import annotations

import numpy as np
from mpi4py import MPI

from . import counts, ops
from .abort import collective_failed, end_job
from .pairing import CallId, do_not_pair
from .shapes import segment_elements

ALGORITHM = "recursive_doubling"


def allreduce_table(mpi_table: dict, selector, size: int, segment_bytes: int) -> dict:
    """The allreduce's lean table: ``{(dtype, op, algorithm): (MPI op, largest nbytes for MPI's own call, nbytes
    above which and up to which the exchange runs, combine)}``: ``mpi_native.lean_table``'s ``(MPI op, largest
    nbytes)`` and ``exchange_table``'s entries in one lookup for the hot path (the exchange's range empty where it
    has none; MPI's part -1 where auto never runs MPI's own, and for ``"recursive_doubling"``)."""
    exchanges = exchange_table(mpi_table, selector, size, segment_bytes, "allreduce", ALGORITHM)
    table = {key: (mpi_op, most, 0, 0, None) for key, (mpi_op, most) in mpi_table.items()}
    for key, (combine, above, upto, block) in exchanges.items():
        mpi_op, most = mpi_table.get(key, (None, -1))
        table[key] = (mpi_op, most, above, min(upto, block), combine)
    return table


def exchange_table(mpi_table: dict, selector, size: int, segment_bytes: int, collective: str, name: str) -> dict:
    """``{(dtype, op, algorithm): (combine, nbytes of x above which, and up to which, it runs, largest block)}`` for
    ``collective``'s one-round schedule ``name`` at two ranks run as an exchange: ``name`` itself (every size), and
    ``"auto"`` where the selector picks it over the sizes right after MPI's own call; each block one message
    (``one_message``). Empty at other sizes."""
    if size != 2:
        return {}
    mpi_top = selector.mpi_limit(collective)
    auto_top = selector.run_of(collective, name, mpi_top)
    table: dict[tuple, tuple] = {}
    for (dtype, op, algorithm) in mpi_table:
        if algorithm == "mpi":
            block = one_message(segment_bytes, dtype.itemsize)
            combine = None if op is None else ops.ufunc(op)   # allgather and alltoall reduce nothing
            table[(dtype, op, name)] = (combine, 0, float("inf"), block)
            if auto_top > mpi_top:
                table[(dtype, op, "auto")] = (combine, mpi_top, auto_top, block)
    return table


def one_message(segment_bytes: int, itemsize: int) -> float:
    """The most bytes the executor sends as one message (whole elements of a segment; MPI's count limit in bytes)."""
    segment = segment_elements(segment_bytes, itemsize)
    most = float("inf") if segment == 0 else segment * itemsize
    return most if counts.LIMIT is None else min(most, counts.LIMIT)


def _exchange(runner, call: str, algorithm: str, send: np.ndarray, into: np.ndarray, status: MPI.Status,
              seq: int | None = None) -> None:
    """The next call's one round with the other rank (call ``seq``'s where it has begun already): ``send`` out,
    ``into`` filled, with the call's tag; MPI raising, or a message of another size (a longer one MPI refuses itself:
    truncation), ends the job naming the call."""
    if seq is None:
        seq = runner.seq = runner.seq + 1
    peer = 1 - runner.rank
    tag = runner.live.of(seq)
    try:
        runner.lib.Sendrecv(send, peer, tag, into, peer, tag, status)
    except MPI.Exception as e:
        collective_failed(f"{call} #{seq} ({algorithm})", runner.rank, e)
    if status.Get_count(MPI.BYTE) != into.nbytes:
        end_job(do_not_pair(CallId(call, seq, algorithm, runner.rank),
                            f"received {status.Get_count(MPI.BYTE)} bytes from rank {peer}, expected {into.nbytes}"))


def allreduce(runner, x: np.ndarray, out: np.ndarray, combine, status: MPI.Status) -> np.ndarray:
    """``out`` = the sum (``combine``) of the two ranks' ``x``, lower rank first; ``out`` may be ``x``. ``status``:
    one to fill (the Communicator's own: a new one costs more than the rest of the Python here)."""
    got = np.empty_like(x)
    _exchange(runner, "allreduce", ALGORITHM, x, got, status)
    if runner.rank == 0:
        combine(x, got, out=out)
    else:
        combine(got, x, out=out)
    return out


def reduce_scatter(runner, x: np.ndarray, out: np.ndarray, first: int, combine, status: MPI.Status) -> np.ndarray:
    """``out`` = this rank's block of ``x`` (rank 0's the first ``first`` rows, rank 1's the rest) reduced with the
    other rank's copy of it, this rank's first (the ring's round); ``out`` may be that block of ``x`` (in place)."""
    mine, theirs = (x[:first], x[first:]) if runner.rank == 0 else (x[first:], x[:first])
    got = np.empty_like(mine)
    _exchange(runner, "reduce_scatter", "ring", theirs, got, status)
    combine(mine, got, out=out)
    return out


def allgather(runner, x: np.ndarray, out: np.ndarray, status: MPI.Status, seq: int | None = None) -> np.ndarray:
    """``out`` = the two ranks' ``x`` in rank order (out's rows twice x's, apart from x): the other rank's block
    received straight into its place, this rank's copied, as the ring's round and its copy have it. ``seq``: the
    call's number where it has begun (its rows exchanged first)."""
    rows, rank = x.shape[0], runner.rank
    peer = 1 - rank
    _exchange(runner, "allgather", "ring", x, out[peer * rows:(peer + 1) * rows], status, seq)
    out[rank * rows:(rank + 1) * rows] = x
    return out
