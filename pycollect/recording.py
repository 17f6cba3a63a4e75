"""What a block of code asked a communicator to move: one record per call, in call order.

``with comm.record() as log:`` attaches a recorder to this Communicator's runner for the duration
of the block, as any observer (engine/observe.py): every collective call, blocking or not, and every
point-to-point message is logged as it is handed to the runner, after its arguments passed their
checks. While a recording is open the lean paths are off (every call takes the observed path);
outside one nothing is attached and calls cost what they did. Records state what the caller
handed over -- the collective, its element count and dtype -- which is what model-parallel traffic
is counted in (Megatron's "2 allreduces of B*T*C per layer"); the bytes each rank then sends depend
on the algorithm (``pc.traffic``).

Recordings nest: an inner block gets its own log and the outer one sees those calls too.
"""
from __future__ import annotations

from collections import Counter
from contextlib import contextmanager
from typing import NamedTuple

import numpy as np

from .engine.observe import Observer

__all__ = ["CallRecord", "record", "summarize"]


class CallRecord(NamedTuple):
    """One call: ``elements`` and ``nbytes`` of the array handed in (for recv: the receive buffer; a barrier hands
    in none: 0 elements, dtype ``""``, shape ``()``)."""
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


class Recorder(Observer):
    """Logs each call the runner is handed (``before``): the collective as the caller made it."""

    def __init__(self) -> None:
        self.log: list[CallRecord] = []

    def before(self, call) -> None:
        self.log.append(_describe(call.collective, call.blocking, call.x))


@contextmanager
def record(observe):
    """Log every communication call made inside the block; yields the list of records. ``observe(observer)`` is
    the Communicator's: a context in which ``observer`` sees every call."""
    recorder = Recorder()
    with observe(recorder):
        yield recorder.log


def summarize(log) -> dict[tuple[str, int], int]:
    """``{(collective, elements): number of calls}`` of a log, for comparing with a formula."""
    return dict(Counter((r.collective, r.elements) for r in log))
