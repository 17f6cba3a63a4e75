"""Rooted data movement: ``gather`` (gatherv) to a root and ``scatter`` (scatterv) from it, mixed into the Communicator.

Each method checks its arguments into one CollectiveCall and hands it to the Communicator's one path
(``_checked``: validation, the watchdog, tracing and recordings as for every collective). Blocks are rows
along axis 0; ``counts`` and ``displs`` are in rows here and in elements from the CollectiveCall on. Where
the rows of every rank are not given, the ranks exchange them first (as allgather without ``counts``
does): a non-blocking call returns before that exchange completes.
"""
from __future__ import annotations

import math
import operator
from functools import lru_cache
from typing import TYPE_CHECKING, Any

import numpy as np

from .algorithms import registry
from .engine import args
from .engine.call import CollectiveCall
from .engine.layout import extent, split_even
from .engine.mpi_native import even_counts, lean_out
from .engine.request import Request
from .engine.validate import OUT_ROWS, ROWS, check_out_rows

if TYPE_CHECKING:
    from .engine.validate import Validator
    from .runner import Runner

_names = lru_cache(maxsize=None)(registry.algorithms)


class Rooted:
    """``gather``, ``igather``, ``scatter``, ``iscatter`` of the Communicator (comm.py) they are mixed into."""

    rank: int
    size: int
    _runner: "Runner"
    _check: "Validator | None"
    _lib: Any

    _lean_of: dict

    if TYPE_CHECKING:
        def _lean_entry(self, table: dict, key: tuple, collective: str, nbytes: int): ...

        def _direct(self, collective: str, run, *args) -> None: ...

        def _checked(self, collective: str, x, describe, blocking: bool, complete=None, **asked): ...

        def _resolve(self, collective: str, algorithm: str, nbytes: int, dtype, op=None, root: int = 0) -> str: ...

    # -- gather -------------------------------------------------------------------------------------
    def gather(self, x, root: int = 0, algorithm: str = "auto", out=None, counts=None, displs=None):
        """Every rank's ``x`` on ``root``, concatenated along axis 0 in rank order; None on the other ranks.

        Ranks may hold different numbers of rows: without ``counts`` (rows of every rank, the same list on every
        rank) the ranks exchange them first. ``displs`` (with ``counts``) places rank i's rows at row
        ``displs[i]`` of the result (MPI_Gatherv): blocks must not overlap; the result has
        ``max(displs[i] + counts[i])`` rows over the non-empty blocks (an empty block's displacement is not read,
        as MPI's), or ``out``'s, and rows no block covers are zero in a new result and
        left as they were in ``out``. ``out`` is read on the root only.
        """
        # Lean path: every rank's rows given and all equal, a host array, MPI_Gather straight (as allgather's).
        if counts is not None and displs is None and type(x) is np.ndarray and x.ndim and x.flags.c_contiguous \
                and type(root) is int and 0 <= root < self.size and even_counts(counts, x.shape[0], self.size) \
                and self._lean_entry(self._lean_of["gather"], (x.dtype, None, algorithm), "gather",
                                     x.nbytes * self.size) is not None:
            if root != self.rank:
                self._direct("gather", self._lib.Gather, x, None, root)
                return None
            shape = (x.shape[0] * self.size,) + x.shape[1:]
            if out is None:
                out = np.empty(shape, x.dtype)
            elif out is x or not lean_out(out, shape, x):   # in place, or anything the general path must judge
                return self._gather(x, root, algorithm, out, counts, displs, True)
            self._direct("gather", self._lib.Gather, x, out, root)
            return out
        return self._gather(x, root, algorithm, out, counts, displs, True)

    def igather(self, x, root: int = 0, algorithm: str = "auto", out=None, counts=None, displs=None) -> Request:
        """Start a gather; ``Request.wait()`` returns the result on ``root`` and None elsewhere. Without ``counts``
        the ranks' rows are exchanged first, without waiting here."""
        return self._gather(x, root, algorithm, out, counts, displs, False)

    def _gather(self, x, root, algorithm, out, counts, displs, blocking):
        here = _is(root, self.rank)

        def describe(seq):
            xp = args.array("gather", "x", x)
            args.rows("gather", x)
            r = args.rank("gather", "root", root, self.size)
            rows = None if counts is None else _own_rows("gather", counts, x.shape[0], self.size, self.rank)
            starts = None if displs is None else args.displacements("gather", displs, rows, self.size)
            if r == self.rank:
                _root_out(out, x, xp, rows, starts)
            return self._gather_call(seq, x, xp, rows, starts, r, algorithm, out if r == self.rank else None, blocking)
        return self._checked("gather", x, describe, blocking, self._gather_complete, algorithm=algorithm, root=root,
                             counts=_given(counts, displs), out=out if here else None, rows_free=True)

    def _gather_complete(self, call: CollectiveCall, table, comm):
        """Steps (Runner.prepared): the gather once every rank's rows are known -- from validation's fingerprints,
        else exchanged on ``comm`` -- the root's ``out`` rows travelling along, judged on every rank."""
        x = call.x
        if table is not None:
            rows, got = tuple(int(r) for r in table[:, ROWS]), table[:, OUT_ROWS]
        else:
            exchange = self._runner.start_exchange((x.shape[0],), "gather", call.out, comm, call.seq, call.blocking)
            if exchange.step is not None:
                yield exchange.step
            (counted,), got = exchange.read()
            rows = tuple(counted)
        check_out_rows("gather", call.seq, got, [sum(rows)] * self.size, x.shape[1:], self.rank)
        return self._gather_call(call.seq, x, call.xp, rows, None, call.root, call.algorithm, call.out, call.blocking)

    def _gather_call(self, seq, x, xp, rows, starts, root, algorithm, out, blocking) -> CollectiveCall:
        """The checked gather once every rank's ``rows`` are known (None: not yet, no algorithm resolved)."""
        if rows is None:
            args.algorithm("gather", algorithm, _names("gather"))
            return CollectiveCall("gather", seq, x, xp, None, out, algorithm, None, root=root, blocking=blocking)
        shape = None
        if self.rank == root:   # the result: to the last block's end, or out's rows
            shape = (out.shape[0] if out is not None else extent(rows, starts),) + x.shape[1:]
            if out is None and starts is not None:
                args.displaced_result("gather", "displs", shape[0], shape, x.dtype)
        row = math.prod(x.shape[1:])
        name = self._resolve("gather", algorithm, sum(rows) * row * x.itemsize, x.dtype)
        return CollectiveCall("gather", seq, x, xp, shape, out, algorithm, name, root=root,
                              counts=tuple(c * row for c in rows), displs=_elements(starts, row), blocking=blocking)

    # -- scatter ------------------------------------------------------------------------------------
    def scatter(self, x, root: int = 0, algorithm: str = "auto", out=None, counts=None, displs=None):
        """Block ``rank`` of the root's ``x`` (split along axis 0) on every rank.

        Without ``counts`` the root's rows split evenly (they must divide by the size; the ranks learn them in a
        small exchange first); ``counts`` (rows of every rank's block, the same list on every rank) may be uneven,
        and ``displs`` (with ``counts``) takes rank i's block from row ``displs[i]`` of the root's ``x``
        (MPI_Scatterv; blocks must not overlap). Off the root, ``x`` is not read: pass ``out=`` (this rank's block,
        which gives its shape and dtype), or ``x`` whose dtype and ``shape[1:]`` describe the rows (then a new
        array is returned), or both.
        """
        # Lean path: every rank's rows given and all equal, a host array that describes the rows on every rank and
        # holds all of them on the root, MPI_Scatter straight into the result (as gather's).
        if counts is not None and displs is None and type(x) is np.ndarray and x.ndim and x.flags.c_contiguous \
                and type(root) is int and 0 <= root < self.size and type(counts) is list and counts \
                and type(rows := counts[0]) is int and rows >= 0 and even_counts(counts, rows, self.size) \
                and (root != self.rank or x.shape[0] == rows * self.size):
            shape = (rows,) + x.shape[1:]
            lean = self._lean_entry(self._lean_of["scatter"], (x.dtype, None, algorithm), "scatter",
                                    math.prod(shape) * self.size * x.itemsize)
            if lean is not None and (out is None or (out is not x and lean_out(out, shape, x))):
                if out is None:
                    out = np.empty(shape, x.dtype)
                self._direct("scatter", self._lib.Scatter, x if root == self.rank else None, out, root)
                return out
        return self._scatter(x, root, algorithm, out, counts, displs, True)

    def iscatter(self, x, root: int = 0, algorithm: str = "auto", out=None, counts=None, displs=None) -> Request:
        """Start a scatter; ``Request.wait()`` returns this rank's block. Without ``counts`` the root's rows are
        exchanged first, without waiting here."""
        return self._scatter(x, root, algorithm, out, counts, displs, False)

    def _scatter(self, x, root, algorithm, out, counts, displs, blocking):
        def describe(seq):
            r = args.rank("scatter", "root", root, self.size)
            like, xp = _rows_like(x, out, r == self.rank)
            rows = None if counts is None else args.counts(
                "scatter", counts, x.shape[0] if r == self.rank and displs is None else None, self.size)
            starts = None if displs is None else args.displacements("scatter", displs, rows, self.size)
            if starts is not None and r == self.rank and x.shape[0] < extent(rows, starts):
                raise ValueError(f"scatter: x has {x.shape[0]} rows, but counts and displs take rows up to "
                                 f"{extent(rows, starts)}")
            args.out("scatter", out, (None if rows is None else rows[self.rank],) + like.shape[1:], like.dtype, xp)
            sent = x if r == self.rank else xp.empty((0,) + like.shape[1:], like.dtype)   # off the root: rows, dtype
            return self._scatter_call(seq, sent, xp, rows, starts, r, algorithm, out, blocking)
        return self._checked("scatter", x if x is not None else out, describe, blocking, self._scatter_complete,
                             algorithm=algorithm, root=root, counts=_given(counts, displs), out=out, rows_free=True)

    def _scatter_complete(self, call: CollectiveCall, table, comm):
        """Steps (Runner.prepared): the scatter once the root's rows are known -- from validation's fingerprints,
        else exchanged on ``comm`` -- and found to split evenly; every rank's ``out`` rows judged on every rank."""
        x, root = call.x, call.root
        assert root is not None, "a scatter's call names its root"
        if table is not None:
            total, got = int(table[root, ROWS]), table[:, OUT_ROWS]
        else:
            mine = x.shape[0] if self.rank == root else -1
            exchange = self._runner.start_exchange((mine,), "scatter", call.out, comm, call.seq, call.blocking)
            if exchange.step is not None:
                yield exchange.step
            (counted,), got = exchange.read()
            total = counted[root]
        if total % self.size:
            raise ValueError(f"scatter: x has {total} rows on the root (rank {root}), which do not split evenly over "
                             f"{self.size} ranks; pass counts")
        rows = split_even(total, self.size)
        check_out_rows("scatter", call.seq, got, rows, x.shape[1:], self.rank)
        return self._scatter_call(call.seq, x, call.xp, rows, None, root, call.algorithm, call.out, call.blocking)

    def _scatter_call(self, seq, x, xp, rows, starts, root, algorithm, out, blocking) -> CollectiveCall:
        """The checked scatter once every rank's ``rows`` are known (None: not yet, no algorithm resolved)."""
        if rows is None:
            args.algorithm("scatter", algorithm, _names("scatter"))
            return CollectiveCall("scatter", seq, x, xp, None, out, algorithm, None, root=root, blocking=blocking)
        row = math.prod(x.shape[1:])
        name = self._resolve("scatter", algorithm, sum(rows) * row * x.itemsize, x.dtype)
        return CollectiveCall("scatter", seq, x, xp, (rows[self.rank],) + x.shape[1:], out, algorithm, name, root=root,
                              counts=tuple(c * row for c in rows), displs=_elements(starts, row), blocking=blocking)


# -- argument checks ------------------------------------------------------------------------------------------
def _is(root, rank: int) -> bool:
    """Whether ``root`` (as passed, perhaps malformed) names this rank."""
    try:
        return not isinstance(root, (bool, np.bool_)) and operator.index(root) == rank
    except TypeError:
        return False


def _given(counts, displs):
    """What validation compares of ``counts`` and ``displs``: counts alone, or both (every rank passes the same)."""
    return counts if displs is None else _WithDispls((counts, displs))


class _WithDispls(tuple):
    """Counts and displacements as validation compares and names them: ``[1, 1] with displs [2, 0]``."""

    def __repr__(self) -> str:
        return " with displs ".join(_listed(v) for v in self)


def _listed(values) -> str:
    try:
        return str([int(v) for v in values])
    except (TypeError, ValueError):
        return repr(values)


def _own_rows(where: str, counts, rows: int, size: int, rank: int) -> tuple[int, ...]:
    """``counts`` checked, this rank's entry against the rows of its ``x``."""
    given = args.counts(where, counts, None, size)
    if given[rank] != rows:
        raise ValueError(f"{where}: counts[{rank}] is {given[rank]} but x has {rows} rows")
    return given


def _root_out(out, x, xp, rows, starts) -> None:
    """The root's ``out``: the gathered rows (not known yet without ``counts``), at least to the last block's end
    with ``displs``."""
    trailing = x.shape[1:]
    if starts is None:
        args.out("gather", out, (None if rows is None else sum(rows),) + trailing, x.dtype, xp)
        return
    args.out("gather", out, (None,) + trailing, x.dtype, xp)
    if out is not None and out.shape[0] < extent(rows, starts):
        raise ValueError(f"gather: out has {out.shape[0]} rows, but counts and displs place rows up to "
                         f"{extent(rows, starts)}")


def _rows_like(x, out, here: bool):
    """(the array whose dtype and ``shape[1:]`` the rows have, its module): the root's ``x``; elsewhere ``x`` if
    given, else ``out``."""
    if here or x is not None:
        xp = args.array("scatter", "x", x)
        args.rows("scatter", x)
        return x, xp
    if out is None:
        raise ValueError("scatter: off the root pass out= (this rank's block) or x (an array whose dtype and "
                         "shape[1:] describe the rows); got neither")
    xp = args.array("scatter", "out", out)
    if out.ndim == 0:
        raise ValueError("scatter: out must have at least one dimension (blocks are split along axis 0)")
    return out, xp


def _elements(starts, row: int):
    return None if starts is None else tuple(d * row for d in starts)
