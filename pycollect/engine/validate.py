"""Validation mode (``PYCOLLECT_DEBUG=1`` or ``Communicator(validate=True)``): every rank's arguments compared.

Before a collective starts, each rank puts a fixed record of int64 (:data:`FIELDS`: its
argument checks passed or not, the call's sequence number, collective, algorithm as passed
and as resolved, op, dtype, shape, counts, root, rows) into one ``MPI_Allgather`` on the
library's private communicator. Names and shapes travel as CRC-32 ids, so the record has
the same size whatever the call. When every rank's checks passed and the records agree,
that is all. Otherwise every rank sees the same table, so all of them take the error path
together: they exchange a JSON description of their call (``Allgatherv`` of bytes; data
only, never pickle) and raise :class:`CollectiveMismatchError` naming what differs and which
ranks passed what. A rank whose own checks failed raises its own error instead.

Every rank of a communicator must use the same mode: a validated call's first MPI call is
the fingerprint ``Allgather``, which an unvalidated call never makes.
"""
from __future__ import annotations

import json
import zlib
from collections.abc import Sequence
from dataclasses import dataclass
from functools import lru_cache
from typing import Any

import numpy as np

from . import watchdog
from .errors import CollectiveMismatchError

FIELDS = ("ok", "seq", "collective", "blocking", "algorithm", "resolved", "op", "dtype", "accumulate", "shape",
          "counts", "root", "rows", "out_rows")
(OK, SEQ, COLLECTIVE, BLOCKING, ALGORITHM, RESOLVED, OP, DTYPE, ACCUMULATE, SHAPE, COUNTS, ROOT, ROWS,
 OUT_ROWS) = range(len(FIELDS))
_AGREE = ROOT + 1      # columns ok..root must be the same on every rank (ok: 1); rows and out_rows are data
_NONE = -1


@dataclass(slots=True)
class Call:
    """One rank's view of a collective call, as passed (any argument may be malformed when ``error`` is set).

    ``rows_free``: blocks along axis 0 may differ between ranks (allgather, alltoall with
    counts), so only ``shape[1:]`` must agree. ``counts_each``: counts differ between ranks
    by design (alltoall), so only whether they were given must agree.
    """

    collective: str
    seq: int
    x: object = None
    algorithm: object = None
    op: object = None
    accumulate: object = None
    counts: object = None
    root: object = None
    out: object = None
    resolved: str | None = None
    rows_free: bool = False
    counts_each: bool = False
    error: BaseException | None = None
    blocking: bool = True


# -- the record ------------------------------------------------------------------------------------------
_NAME_COLUMNS = [COLLECTIVE, ALGORITHM, RESOLVED, OP, DTYPE, ACCUMULATE, ROOT]


def record(call: Call) -> np.ndarray:
    """This rank's fixed-size fingerprint of ``call`` (``FIELDS``, int64)."""
    shape = _shape(call.x)
    out = _shape(call.out) if call.out is not None else None
    names = (call.collective, call.algorithm, call.resolved, call.op, getattr(call.x, "dtype", None),
             call.accumulate, _number(call.root))
    rec = _names(names).copy()
    rec[OK], rec[SEQ], rec[BLOCKING] = call.error is None, call.seq, call.blocking
    rec[SHAPE] = _crc(_shape_key(shape, call.rows_free))   # shapes and counts vary too much to cache
    rec[COUNTS] = _crc(_counts(call))
    rec[ROWS] = shape[0] if shape else _NONE
    rec[OUT_ROWS] = out[0] if out else _NONE
    return rec


def _crc(value) -> int:
    """A stable id, the same on every rank and run (-1 for None)."""
    return _NONE if value is None else zlib.crc32(repr(value).encode())


def _names(names: tuple) -> np.ndarray:
    try:
        return _template(names)
    except TypeError:  # an unhashable argument (say, a list as op): its repr stands in
        return _template(tuple(v if _hashable(v) else repr(v) for v in names))


@lru_cache(maxsize=256)
def _template(names: tuple) -> np.ndarray:
    """A record with the ids of ``names`` filled in: one lookup per kind of call, not one per field."""
    rec = np.full(len(FIELDS), _NONE, np.int64)
    rec[_NAME_COLUMNS] = [_crc(v) for v in names]
    return rec


def _hashable(value) -> bool:
    try:
        hash(value)
    except TypeError:
        return False
    return True


def _number(value):
    """An integer argument as a plain int (``np.int64(0)`` and ``0`` must give one id)."""
    return int(value) if isinstance(value, (int, np.integer)) and not isinstance(value, bool) else value


def _shape(a) -> tuple | None:
    try:
        shape = a.shape
    except AttributeError:
        return None
    if type(shape) is tuple:
        return shape
    try:
        return tuple(int(d) for d in shape)
    except (TypeError, ValueError):
        return None


def _dtype(a) -> str | None:
    """The dtype's name, with its byte order when it is not this machine's (``float64 (big-endian)``)."""
    try:
        dtype = a.dtype
    except AttributeError:
        return None
    if dtype.isnative:
        return dtype.name
    return f"{dtype.name} ({'big' if dtype.byteorder == '>' else 'little'}-endian)"


def _counts(call: Call):
    """What of ``counts`` every rank must share: the list itself, or for alltoall whether it was given."""
    if call.counts is None:
        return None
    if call.counts_each:
        return "given"
    try:
        return tuple(_ints(call.counts))
    except (TypeError, ValueError):
        return repr(call.counts)


def _shape_key(shape: tuple | None, rows_free: bool):
    if shape is None or not rows_free:
        return shape
    return ("*",) + shape[1:] if shape else shape


def describe(call: Call) -> dict:
    """The call as JSON data, for the messages (sent only when something differs)."""
    shape = _shape(call.x)
    counts = _counts(call)
    return {"collective": call.collective, "seq": call.seq, "algorithm": _text(call.algorithm),
            "resolved": call.resolved, "op": _text(call.op), "dtype": _dtype(call.x),
            "accumulate": _text(call.accumulate),
            "shape": _format_shape(_shape_key(shape, call.rows_free)), "counts": _format_counts(call),
            "counts_key": None if counts is None else repr(counts), "root": _text(_number(call.root)),
            "rows_free": call.rows_free,
            "error": None if call.error is None else str(call.error)}


def _text(value):
    return value if value is None or isinstance(value, str) else repr(value)


def _format_shape(shape) -> str | None:
    if shape is None:
        return None
    return "(" + ", ".join(str(d) for d in shape) + ("," if len(shape) == 1 else "") + ")"


def _ints(values: Any) -> list[int]:
    """``values`` (counts as the caller passed them: anything) as ints; TypeError or ValueError when they
    are not a collection of integers."""
    return [int(c) for c in values]


def _format_counts(call: Call) -> str:
    try:
        return str(_ints(call.counts)) if call.counts is not None else "None"
    except (TypeError, ValueError):
        return repr(call.counts)


def _agreed(rows: list[list[int]]) -> bool:
    """Every rank's checks passed and its record agrees with rank 0's (lists: cheaper than NumPy at this size)."""
    first = rows[0][:_AGREE]
    return first[OK] == 1 and all(r[:_AGREE] == first for r in rows)


# -- the exchange ------------------------------------------------------------------------------------------
class Validator:
    """A Communicator's validation: the fingerprint exchange and the messages."""

    def __init__(self, lib, rank: int, size: int, dog=None):
        self.lib, self.rank, self.size, self.dog = lib, rank, size, dog

    def agree(self, call: Call) -> np.ndarray:
        """Compare ``call`` with every rank's; the table of records when they agree, else raise on every rank.

        A rank whose ``call.error`` is set raises that error once every rank knows of it.
        """
        steps = self.agreeing(call, self.lib)
        try:
            step = next(steps)
            while True:
                request, what = step
                watchdog.wait_for(request, self.dog, call.collective, call.seq, what)
                step = next(steps)
        except StopIteration as done:
            return done.value

    def agreeing(self, call: Call, comm):
        """``agree`` as steps (pycollect/runner.py, Runner.prepared): yields ``(request, what)`` to wait for, returns
        the table. The fingerprints' exchange starts on ``lib`` before the first yield; what follows (the error
        path's exchanges) on ``comm``."""
        table = np.empty((self.size, len(FIELDS)), np.int64)
        yield self.lib.Iallgather(record(call), table), "validation fingerprint"
        if _agreed(table.tolist()):
            return table
        if len(set(table[:, BLOCKING].tolist())) > 1:   # the details' exchange would go on two communicators
            text = forms_differ(table)
        else:
            calls = yield from self._describing(call, comm)
            text = mismatch(calls, [FIELDS[i] for i in range(SEQ, _AGREE) if len(set(table[:, i].tolist())) > 1])
        if call.error is not None:
            raise call.error
        raise CollectiveMismatchError(f"{call.collective} #{call.seq}: {text}")

    def out_rows(self, collective: str, seq: int, table: np.ndarray, expected, trailing: tuple) -> None:
        """After the exchange: every rank's ``out`` rows (axis 0) against ``expected[rank]``; raise on every rank.

        For the shapes that only the exchange decides (allgather without counts, alltoall with
        counts): every rank judges every rank's ``out`` from the table, so all raise together.
        """
        check_out_rows(collective, seq, table[:, OUT_ROWS], expected, trailing, self.rank)

    def _describing(self, call: Call, comm):
        """Every rank's ``describe(call)`` (two more exchanges on ``comm``, only on the error path), as steps."""
        mine = np.frombuffer(json.dumps(describe(call)).encode(), np.uint8)
        sizes = np.empty(self.size, np.int64)
        yield comm.Iallgather(np.array([mine.size], np.int64), sizes), "validation details"
        blob = np.empty(int(sizes.sum()), np.uint8)
        starts = np.concatenate(([0], np.cumsum(sizes)[:-1]))
        yield comm.Iallgatherv(mine, [blob, (sizes.tolist(), starts.tolist())]), "validation details"
        return [json.loads(blob[a:a + n].tobytes()) for a, n in zip(starts, sizes)]


def forms_differ(table: np.ndarray) -> str:
    """The message for ranks whose calls differ in form, from the fingerprints alone (the details' exchange runs on
    the blocking calls' communicator on some ranks and the non-blocking calls' on others, so it cannot run)."""
    forms = ranks_by_value(["blocking" if b else "non-blocking" for b in table[:, BLOCKING].tolist()])
    text = ", ".join(f"{ranks_text(ranks)} {'called it ' if i == 0 else ''}{form}"
                     for i, (form, ranks) in enumerate(forms))
    also = [FIELDS[i] for i in range(COLLECTIVE, _AGREE)   # resolved follows from the rest
            if i not in (BLOCKING, RESOLVED) and len(set(table[:, i].tolist())) > 1]
    failed = [r for r, ok in enumerate(table[:, OK].tolist()) if ok != 1]
    return (f"{text} (every rank makes a call in the same form: MPI's own do not match a blocking collective with a "
            f"non-blocking one)" + (f"; their calls differ in {', '.join(also)} too" if also else "")
            + (f"; {ranks_text(failed)} failed {'its' if len(failed) == 1 else 'their'} argument checks"
               if failed else ""))


def check_out_rows(collective: str, seq: int, got, expected, trailing: tuple, rank: int) -> None:
    """Every rank's ``out`` rows (``got``, -1 for no ``out``) against ``expected``, as every rank sees them after an
    exchange: the rank whose ``out`` is wrong raises ValueError, the others CollectiveMismatchError quoting it."""
    bad = {r: f"{collective}: out has shape {_format_shape((int(g),) + trailing)}, "
              f"expected {_format_shape((int(e),) + trailing)}"
           for r, (g, e) in enumerate(zip(got, expected)) if g != _NONE and g != e}
    if not bad:
        return
    if rank in bad:
        raise ValueError(bad[rank])
    raise CollectiveMismatchError(f"{collective} #{seq}: {failures(bad)}")


# -- the messages -----------------------------------------------------------------------------------------
# field: (what the first group did, what the next groups did), "{v}" the value
_PHRASES = {
    "collective": ("called {v}", "called {v}"),
    "seq": ("{are} at call #{v}", "at #{v}"),
    "algorithm": ("passed algorithm {v}", "passed {v}"),
    "op": ("passed op {v}", "passed {v}"),
    "dtype": ("passed dtype {v}", "passed {v}"),
    "accumulate": ("passed accumulate {v}", "passed {v}"),
    "shape": ("passed shape {v}", "passed {v}"),
    "counts": ("passed counts {v}", "passed {v}"),
    "root": ("passed root {v}", "passed {v}"),
}


def mismatch(calls: list[dict], differ: Sequence[str] = ()) -> str:
    """What differs between the ranks' calls, grouped by rank.

    Failed argument checks first; then the collective and sequence number; then the
    arguments; the algorithm ``auto`` resolved to only when nothing else differs (it follows
    from the rest). Shapes are not compared where counts differ in kind (with and without).
    """
    failed = {r: c["error"] for r, c in enumerate(calls) if c["error"] is not None}
    if failed:
        return failures(failed)
    fields = ["collective", "seq"]
    if _same(calls, "collective"):
        fields += ["algorithm", "op", "dtype", "accumulate", "counts", "root"]
        fields += ["shape"] if _same(calls, "rows_free") else []
    parts = [_field(calls, f) for f in fields if not _same(calls, "counts_key" if f == "counts" else f)]
    if not parts and not _same(calls, "resolved"):
        parts.append(_resolved(calls))
    return "; ".join(parts) or f"the ranks' fingerprints differ in {', '.join(differ) or 'ok'}"


def _same(calls: list[dict], key: str) -> bool:
    return all(c[key] == calls[0][key] for c in calls)


def _field(calls: list[dict], field: str) -> str:
    first, rest = _PHRASES[field]
    parts = []
    for i, (value, ranks) in enumerate(ranks_by_value([c[field] for c in calls])):
        phrase = (first if i == 0 else rest).format(v=value, are="is" if len(ranks) == 1 else "are")
        parts.append(f"{ranks_text(ranks)} {phrase}")
    return ", ".join(parts)


def _resolved(calls: list[dict]) -> str:
    groups = ranks_by_value([c["resolved"] for c in calls])
    algorithm = calls[0]["algorithm"]
    return ", ".join(f"{ranks_text(ranks)} resolved {algorithm} to {value}" if i == 0
                     else f"{ranks_text(ranks)} to {value}" for i, (value, ranks) in enumerate(groups))


def failures(failed: dict, checks: str = "argument checks") -> str:
    """``rank 1 failed its argument checks: ...`` for ``{rank: message}``, ranks with one message together."""
    groups = _groups_of(failed)
    return "; ".join(f"{ranks_text(ranks)} failed {'its' if len(ranks) == 1 else 'their'} {checks}: {message}"
                     for message, ranks in groups)


def ranks_by_value(values: list) -> list[tuple[object, list[int]]]:
    """``[(value, ranks)]`` of every rank's ``values``, the smallest group first, ties by lowest rank."""
    return _groups_of(dict(enumerate(values)))


def _groups_of(by_rank: dict) -> list[tuple[object, list[int]]]:
    """``[(value, ranks)]``, the smallest group first (the odd one out), ties by lowest rank."""
    groups: dict = {}
    for rank, value in by_rank.items():
        groups.setdefault(value, []).append(rank)
    return sorted(groups.items(), key=lambda g: (len(g[1]), g[1][0]))


def ranks_text(ranks: list[int]) -> str:
    """``rank 3``, ``ranks 0-2``, ``ranks 0, 2-3`` (``ranks`` ascending)."""
    spans = [[ranks[0], ranks[0]]]
    for r in ranks[1:]:
        if r == spans[-1][1] + 1:
            spans[-1][1] = r
        else:
            spans.append([r, r])
    text = ", ".join(str(a) if a == b else f"{a}-{b}" for a, b in spans)
    return ("rank " if len(ranks) == 1 else "ranks ") + text
