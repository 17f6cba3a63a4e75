"""What a block of code asked a communicator to move: one record per call, in call order.

``with comm.record() as log:`` wraps this Communicator's public communication methods for the
duration of the block (on this instance only; nothing else changes and nothing is added to calls
outside a recording). Each call appends a ``CallRecord`` before it runs, so a call that then fails
is still logged. Records state what the caller handed over -- the collective, its element count
and dtype -- which is what model-parallel traffic is counted in (Megatron's "2 allreduces of
B*T*C per layer"); the bytes each rank then sends depend on the algorithm (``pc.traffic``).

Recordings nest: an inner block gets its own log and the outer one sees those calls too.
"""
from __future__ import annotations

from collections import Counter
from contextlib import contextmanager
from typing import NamedTuple

import numpy as np

__all__ = ["CallRecord", "record", "summarize", "RECORDED"]

# method -> (collective it counts as, blocking)
RECORDED = {
    "allreduce": ("allreduce", True), "iallreduce": ("allreduce", False),
    "reduce_scatter": ("reduce_scatter", True), "ireduce_scatter": ("reduce_scatter", False),
    "allgather": ("allgather", True), "iallgather": ("allgather", False),
    "alltoall": ("alltoall", True), "ialltoall": ("alltoall", False),
    "broadcast": ("broadcast", True), "reduce": ("reduce", True),
    "send": ("send", True), "isend": ("send", False), "recv": ("recv", True), "irecv": ("recv", False),
}


class CallRecord(NamedTuple):
    """One call: ``elements`` and ``nbytes`` of the array handed in (for recv: the receive buffer)."""
    collective: str
    blocking: bool
    elements: int
    dtype: str
    nbytes: int
    shape: tuple


def _describe(collective: str, blocking: bool, x) -> CallRecord:
    shape = tuple(getattr(x, "shape", ()))
    dtype = getattr(x, "dtype", None)
    size = int(np.prod(shape, dtype=np.int64)) if shape else (1 if dtype is not None else 0)
    nbytes = int(getattr(x, "nbytes", 0))
    return CallRecord(collective, blocking, size, "" if dtype is None else str(dtype), nbytes, shape)


@contextmanager
def record(comm):
    """Log every communication call made on ``comm`` inside the block; yields the list of records."""
    log: list[CallRecord] = []
    saved = {}
    for method, (collective, blocking) in RECORDED.items():
        if method in vars(comm):  # an enclosing recording: chain to it
            saved[method] = vars(comm)[method]
        inner = getattr(comm, method)

        def logged(x, *args, _inner=inner, _c=collective, _b=blocking, **kwargs):
            log.append(_describe(_c, _b, x))
            return _inner(x, *args, **kwargs)

        setattr(comm, method, logged)
    try:
        yield log
    finally:
        for method in RECORDED:
            if method in saved:
                setattr(comm, method, saved[method])
            else:
                delattr(comm, method)


def summarize(log) -> dict[tuple[str, int], int]:
    """``{(collective, elements): number of calls}`` of a log, for comparing with a formula."""
    return dict(Counter((r.collective, r.elements) for r in log))
