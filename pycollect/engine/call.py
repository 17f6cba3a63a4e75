"""One collective call after its arguments passed their checks: everything a path after the checks reads.

The Communicator's methods check what the caller handed in and describe the call once, here; the
runner (pycollect/runner.py) takes it to MPI's own collective (engine/mpi_native.py) or to a schedule
(engine/executor.py), and the watchdog and the tracer name the call from it. Nothing after the checks
looks at the caller's arguments again.
"""
from __future__ import annotations

from typing import Any, NamedTuple


class CollectiveCall(NamedTuple):
    """A checked call on one rank. ``counts`` and ``matrix`` are in elements, not rows.

    ``name`` None: not resolved yet, because the ranks' rows must be exchanged first (an allgather, gather or
    scatter without ``counts``, an alltoall with counts; ``counts`` then holds this rank's row of rows).
    The Communicator completes such a call before the runner sees it.

    A NamedTuple, not a frozen dataclass: immutable either way, and made on every call, where a frozen
    dataclass's ``__init__`` costs about five times as much (2.3 against 0.5 us for these fields).
    """

    collective: str                # "allreduce", "reduce_scatter", "allgather", "alltoall", "broadcast", "reduce",
                                   # "gather", "scatter", "scan", "exscan"
    seq: int                       # the Communicator's call number: its tag (engine/pairing.py)
    x: Any                         # the caller's input, as given
    xp: Any                        # numpy or cupy
    shape: tuple | None            # this rank's result (None: no result here, a reduce off its root)
    out: Any = None                # the caller's out=, or None
    algorithm: str = "auto"        # as asked
    name: str | None = "mpi"       # as resolved: "mpi" or a schedule
    op: str | None = None          # canonical name (engine/args.op); None for collectives without one
    root: int | None = None        # broadcast, reduce, gather, scatter
    counts: tuple | None = None    # reduce_scatter, allgather, gather, scatter: every rank's block, (size,)
    matrix: tuple | None = None    # alltoall: matrix[i][j] rank i sends rank j, (size, size)
    displs: tuple | None = None    # gather, scatter: every block's offset in the root's buffer; allgather, alltoall:
                                   # where each rank's block starts in out (elements, (size,); None: packed)
    accumulate: str | None = None  # allreduce, reduce_scatter, reduce of float16/bfloat16 reduced in this dtype
    blocking: bool = True
    late: bool = False             # started from a Request's progress after an exchange: MPI's own runs on the
                                   # runner's ``later`` communicator, "shm" without windows (Runner.prepared)
    send_displs: tuple | None = None   # alltoall: where the block for each rank starts in x (elements), (size,)

    @property
    def dtype(self):
        return self.x.dtype

    @property
    def label(self) -> str:
        """How messages name the call: ``allreduce #7 (ring)``."""
        return f"{self.collective} #{self.seq} ({self.name})"
