"""What a Communicator over a Cartesian grid of ranks adds: coordinates, neighbours, MPI-3 neighbourhood
collectives and halo exchange.

``comm.cartesian(dims, periods)`` (comm.py) makes a ``CartesianGrid``: a Communicator (every collective,
``split``, ``sub``, the settings of its parent) wrapping an ``MPI.Cartcomm``, with this class's methods.
Neighbours come in MPI's order, the order of the neighbourhood collectives' blocks: for each dimension
the neighbour below (``Shift(d, 1)``'s source), then the one above; ``None`` where a non-periodic
dimension ends. The neighbourhood collectives are MPI's own (``MPI_Neighbor_allgather`` and the
rest, on the library's duplicate of the Cartesian communicator); the halo exchange is engine/halo.py.
"""
from __future__ import annotations

import functools
import math
import zlib
from functools import cached_property
from typing import TYPE_CHECKING

import numpy as np
from mpi4py import MPI

from .engine import args, backend, halo
from .engine.abort import collective_failed
from .engine.errors import CollectiveMismatchError
from .engine.request import Request

if TYPE_CHECKING:
    from .runner import Runner


def grid_shape(size: int, dims, periods) -> tuple[tuple[int, ...], tuple[bool, ...]]:
    """``dims`` (ranks per dimension; a 0 lets ``MPI_Dims_create`` choose) checked against ``size`` ranks, and
    ``periods`` (one bool for every dimension, or one per dimension), as ``(dims, periods)``."""
    if isinstance(dims, (str, bytes)) or not hasattr(dims, "__iter__"):
        raise TypeError(f"cartesian: dims must be a sequence of ranks per dimension, got {type(dims).__name__}")
    dims = [args.integer("cartesian", "dims", d) for d in dims]
    if not dims or any(d < 0 for d in dims):
        raise ValueError(f"cartesian: dims must be one or more counts >= 0 (0: MPI chooses), got {tuple(dims)}")
    fixed = math.prod(d for d in dims if d)
    if (0 in dims and size % fixed) or (0 not in dims and fixed != size):
        raise ValueError(f"cartesian: dims {tuple(dims)} multiply to {fixed}, which "
                         f"{'does not divide' if 0 in dims else 'is not'} the communicator's size, {size}")
    if 0 in dims:
        dims = MPI.Compute_dims(size, dims)
    if _logical(periods):
        periods = [bool(periods)] * len(dims)
    elif not (not isinstance(periods, (str, bytes)) and hasattr(periods, "__len__") and len(periods) == len(dims)
              and all(_logical(p) for p in periods)):
        raise ValueError(f"cartesian: periods must be a bool or one bool per dimension ({len(dims)}), got {periods!r}")
    return tuple(dims), tuple(bool(p) for p in periods)


def _logical(value) -> bool:
    """Whether ``value`` is a truth value as MPI's logical arguments take them: a bool, or an integer 0 or 1."""
    return isinstance(value, (bool, np.bool_)) or (isinstance(value, (int, np.integer)) and value in (0, 1))


class Cartesian:
    """The Cartesian part of a ``CartesianGrid`` (comm.py), over the Communicator it is mixed into."""

    mpi: MPI.Intracomm
    rank: int
    size: int
    validate: bool
    _runner: "Runner"

    # -- the grid ---------------------------------------------------------------------------------------
    @cached_property
    def _cart(self) -> MPI.Cartcomm:
        if not isinstance(self.mpi, MPI.Cartcomm):
            raise TypeError(f"CartesianGrid: comm must be an MPI.Cartcomm, got {type(self.mpi).__name__}")
        return self.mpi

    @cached_property
    def dims(self) -> tuple[int, ...]:
        """Ranks along each dimension."""
        return tuple(self._cart.Get_topo()[0])

    @cached_property
    def periods(self) -> tuple[bool, ...]:
        return tuple(bool(p) for p in self._cart.Get_topo()[1])

    @cached_property
    def coords(self) -> tuple[int, ...]:
        """This rank's place on the grid (row-major: the last dimension varies fastest along ranks)."""
        return tuple(self._cart.Get_coords(self.rank))

    @cached_property
    def neighbors(self) -> tuple[tuple[int | None, int | None], ...]:
        """``(below, above)`` per dimension, None at the end of a non-periodic one."""
        return tuple(self.shift(d) for d in range(len(self.dims)))

    def shift(self, dim: int, disp: int = 1) -> tuple[int | None, int | None]:
        """``(source, dest)`` of a shift by ``disp`` along ``dim``, as ``MPI_Cart_shift`` (None for MPI_PROC_NULL)."""
        dim = args.integer("shift", "dim", dim)
        if not 0 <= dim < len(self.dims):
            raise ValueError(f"shift: dim must be in 0..{len(self.dims) - 1}, got {dim}")
        source, dest = self._cart.Shift(dim, args.integer("shift", "disp", disp))
        return (None if source == MPI.PROC_NULL else source), (None if dest == MPI.PROC_NULL else dest)

    def coords_of(self, rank: int) -> tuple[int, ...]:
        return tuple(self._cart.Get_coords(args.rank("coords_of", "rank", rank, self.size)))

    def rank_of(self, coords) -> int:
        """The rank at ``coords`` (wrapped along periodic dimensions, as ``MPI_Cart_rank``)."""
        if isinstance(coords, (str, bytes)) or not hasattr(coords, "__iter__"):
            raise TypeError(f"rank_of: coords must be a sequence of one coordinate per dimension ({len(self.dims)}), "
                            f"got {type(coords).__name__}")
        coords = [args.integer("rank_of", "coords", c) for c in coords]
        bad = len(coords) != len(self.dims) or any(not p and not 0 <= c < n
                                                   for c, n, p in zip(coords, self.dims, self.periods))
        if bad:
            raise ValueError(f"rank_of: coords {tuple(coords)} lie off the grid {self.dims} (periods {self.periods})")
        return self._cart.Get_cart_rank(coords)

    @property
    def _flat_neighbors(self) -> list[int | None]:
        return [r for pair in self.neighbors for r in pair]

    # -- neighbourhood collectives (MPI's own) ------------------------------------------------------------
    def neighbor_allgather(self, x, out=None):
        """Every neighbour's ``x`` as ``(2 * ndim, *x.shape)``, block ``k`` from neighbour ``k`` (MPI's order);
        a missing neighbour's block stays as it was in ``out`` (zeros in a new array). Neighbours pass ``x`` of
        one shape and dtype (compared in validation mode)."""
        where, seq = "neighbor_allgather", self._runner.begin()
        shape = (2 * len(self.dims), *np.shape(x))

        def check():
            xp = args.array(where, "x", x)
            args.out(where, out, shape, x.dtype, xp)
            return xp, None
        (xp,) = self._neighbors_checked(where, seq, x, check)
        return self._even(where, seq, x, xp, shape, out)

    def neighbor_alltoall(self, x, out=None):
        """Block ``k`` of ``x`` (``(2 * ndim, ...)``) to neighbour ``k``; block ``k`` of the result from it
        (a missing neighbour's block stays as it was in ``out``, zeros in a new array; ``out`` may be ``x``: in
        place, ``x`` copied first). Neighbours pass ``x`` of one shape and dtype (compared in validation mode)."""
        where, seq, k = "neighbor_alltoall", self._runner.begin(), 2 * len(self.dims)

        def check():
            xp = args.array(where, "x", x)
            if np.ndim(x) == 0 or np.shape(x)[0] != k:
                raise ValueError(f"{where}: x must have one block per neighbour along axis 0 ({k}), got shape "
                                 f"{np.shape(x)}")
            args.out(where, out, np.shape(x), x.dtype, xp)
            return xp, None
        (xp,) = self._neighbors_checked(where, seq, x, check)
        return self._even(where, seq, x, xp, np.shape(x), out)

    def neighbor_allgatherv(self, x, counts=None):
        """Every neighbour's rows of ``x`` (axis 0), concatenated in MPI's order; ``counts`` the rows each
        neighbour sends (exchanged when None; a missing neighbour counts 0, and a count given for it is
        refused). Given ``counts`` must be the neighbours' rows: validation mode compares them, and rows of one
        shape and dtype; without it a count above what the neighbour sends leaves rows unwritten."""
        where, seq = "neighbor_allgatherv", self._runner.begin()

        def check():
            xp = args.array(where, "x", x)
            args.rows(where, x)
            given = None if counts is None else self._given_counts(where, counts)
            return xp, given, given
        xp, given = self._neighbors_checked(where, seq, x, check)
        got = given if given is not None else self._neighbor_counts(where, seq, [x.shape[0]], "Neighbor_allgather")
        return self._vector(where, seq, x, xp, [x.shape[0]] * len(got), got)

    def neighbor_alltoallv(self, x, counts):
        """Rows of ``x`` (axis 0) to each neighbour, ``counts[k]`` of them to neighbour ``k`` in order; returns
        the rows received, concatenated in MPI's order (a missing neighbour sends none; rows for it are dropped,
        as MPI drops them). Neighbours pass rows of one shape and dtype (compared in validation mode)."""
        where, seq = "neighbor_alltoallv", self._runner.begin()

        def check():
            xp = args.array(where, "x", x)
            args.rows(where, x)
            return xp, args.counts(where, counts, x.shape[0], 2 * len(self.dims)), None   # to a missing one: dropped
        xp, sent = self._neighbors_checked(where, seq, x, check)
        got = self._neighbor_counts(where, seq, sent, "Neighbor_alltoall")
        return self._vector(where, seq, x, xp, list(sent), got)

    def _given_counts(self, where: str, counts) -> list[int]:
        """allgatherv's ``counts`` (rows from each neighbour, in MPI's order) checked: none from a neighbour the grid
        does not have (the end of a non-periodic dimension), where MPI would move nothing and leave rows unwritten."""
        given = list(args.counts(where, counts, None, 2 * len(self.dims)))
        absent = [k for k, (c, r) in enumerate(zip(given, self._flat_neighbors)) if c and r is None]
        if absent:
            raise ValueError(f"{where}: counts name rows for neighbour(s) {absent}, which this rank does not have "
                             f"(the end of a non-periodic dimension; neighbours {self._flat_neighbors}): give 0")
        return given

    def _neighbors_checked(self, where: str, seq: int, x, check) -> tuple:
        """``check()`` (this rank's argument checks): what the call needs, then the given counts to compare (checked:
        a list, not the caller's iterable, which the check consumed) or None; the former returned. In validation
        mode every rank's arguments are first compared with its neighbours' in one Allgather, so that an error on
        one rank raises on every rank, and x's that do not fit between neighbours raise CollectiveMismatchError
        (MPI's neighbourhood calls pair bytes, not shapes: the rows would be cut or left unwritten)."""
        err, made, counts = None, (), None
        try:
            *made, counts = check()
        except (TypeError, ValueError) as e:
            err = e
        if self.validate:
            self._neighbors_agreed(where, seq, x, counts, err)
        elif err is not None:
            self._runner.refused(seq)   # its next neighbourhood call (MPI's, paired by order) meets the others first
            raise err
        return tuple(made)

    def _neighbors_agreed(self, where: str, seq: int, x, counts, err) -> None:
        """Validation mode: every rank's x fingerprint, neighbours and given counts in one Allgather; each pair of
        neighbours checked (start_halo's _halo_agreed does the same for faces)."""
        k = 2 * len(self.dims)
        mine = np.full(_FIELDS + 2 * k, -1, np.int64)   # see _fingerprint; then neighbours (k), counts (k)
        mine[0] = 0                                      # not ok until this rank's checks passed
        if err is None:
            mine[:_FIELDS] = _fingerprint(x)
            mine[_FIELDS:_FIELDS + k] = [-1 if r is None else r for r in self._flat_neighbors]
            if counts is not None:
                mine[_FIELDS + k:] = list(counts)
        every = self._every_rank(where, seq, mine, err)      # (ranks, fields + 2k)
        rows_only = where.endswith("v")     # the v-forms: rows may differ, the row's shape and dtype may not
        same = [1, 3, 5] if rows_only else [1, 3, 4]
        for a in range(self.size):
            for j in range(k):
                b = int(every[a, _FIELDS + j])
                if b < 0:
                    continue
                if list(every[a, same]) != list(every[b, same]):
                    raise CollectiveMismatchError(
                        f"{where} #{seq}: ranks {a} and {b} (its neighbour {j}) pass x that do not fit: rank {a} "
                        f"{_x_text(every[a])}, rank {b} {_x_text(every[b])} (they need one dtype and "
                        f"{'rows of one shape' if rows_only else 'one shape'})")
                given = int(every[a, _FIELDS + k + j])
                if given >= 0 and given != every[b, 6]:
                    raise CollectiveMismatchError(
                        f"{where} #{seq}: rank {a} gives counts[{j}] = {given} for its neighbour {j}, rank {b}, "
                        f"which sends {int(every[b, 6])} rows")

    def _neighbor_counts(self, where: str, seq: int, mine, exchange: str) -> list[int]:
        """The rows each neighbour sends here, exchanged with MPI's ``exchange`` of ``mine``: this rank's rows
        (allgatherv) or its counts to each neighbour (alltoallv); a missing neighbour's stays 0."""
        k = 2 * len(self.dims)
        send = np.array(mine, np.int64)   # (1,) or (k,)
        got = np.zeros(k, np.int64)
        self._mpi(where, seq, exchange, [send, MPI.INT64_T], [got, MPI.INT64_T])
        return [int(c) for c in got]

    # -- running MPI's own call ---------------------------------------------------------------------------
    def _even(self, where: str, seq: int, x, xp, shape: tuple, out):
        """A neighbourhood collective of equal blocks (arguments checked), moved as bytes (any dtype)."""
        staged, private = self._runner.staging(xp), self._runner.private
        # a copy of a strided out, not zeros: a missing neighbour's block must stay as it was in out; with abort off
        # a copy always (runner.py: a call that times out leaves MPI pycollect's arrays, never the caller's)
        result = xp.zeros(shape, x.dtype) if out is None else (
            out if out.flags.c_contiguous and not private else xp.array(out, order="C"))
        host = np.array(xp.asnumpy(result)) if staged else result   # (2*ndim, ...) or x's shape
        send = xp.asnumpy(x) if staged else backend.flat(x)
        if not staged and (private or backend.overlap(send, host)):   # out over x (in place): MPI's neighbourhood
            send = send.copy()                  # calls take no MPI_IN_PLACE and would read blocks they already overwrote
        backend.sync(xp)
        name = "Neighbor_allgather" if where == "neighbor_allgather" else "Neighbor_alltoall"
        self._mpi(where, seq, name, [_bytes(send), MPI.BYTE], [_bytes(host), MPI.BYTE])
        if staged:
            result[...] = xp.asarray(host)
        if out is not None and result is not out:
            out[...] = result
        return result if out is None else out

    def _vector(self, where: str, seq: int, x, xp, sent: list[int], got: list[int]):
        """A v-form: rows ``sent[k]`` of ``x`` to neighbour ``k`` (all of ``x`` for allgatherv), ``got[k]`` from it."""
        row = math.prod(x.shape[1:]) * x.dtype.itemsize          # bytes per row
        staged = self._runner.staging(xp)
        src = np.ascontiguousarray(xp.asnumpy(x)) if staged else xp.array(x, order="C") if self._runner.private \
            else xp.ascontiguousarray(x)   # with abort off a copy always (as _even's)
        out = (np if staged else xp).empty((sum(got), *x.shape[1:]), x.dtype)   # (sum(got), ...)
        recv = [_bytes(out), ([c * row for c in got], _starts([c * row for c in got])), MPI.BYTE]
        if where == "neighbor_allgatherv":
            send = [_bytes(src), MPI.BYTE]
        else:
            send = [_bytes(src), ([c * row for c in sent], _starts([c * row for c in sent])), MPI.BYTE]
        backend.sync(xp)
        self._mpi(where, seq, "Neighbor_allgatherv" if where == "neighbor_allgatherv" else "Neighbor_alltoallv",
                  send, recv)
        return xp.asarray(out) if staged else out

    def _mpi(self, where: str, seq: int, name: str, send, recv) -> None:
        """MPI's ``name`` on the library's Cartesian communicator; under the watchdog its non-blocking twin, polled
        to the deadline. MPI failing inside it ends the job naming the call."""
        lib, watch = self._runner.lib, self._runner.watch
        self._runner.meet_after_refusal(seq)
        try:
            if watch is None or (name.startswith("Neighbor") and self._swaps_nonblocking):
                getattr(lib, name)(send, recv)
                return
            request = getattr(lib, "I" + name[0].lower() + name[1:])(send, recv)
            watch.call(where, seq, "mpi", 0, None).finish([request])
        except MPI.Exception as e:
            collective_failed(f"{where} #{seq} (mpi)", self.rank, e)
        except BaseException:   # timed out (abort off) or interrupted: MPI may still use the buffers
            self._runner.left_in_flight((send, recv), f"{where} #{seq} (mpi)")
            raise

    @cached_property
    def _swaps_nonblocking(self) -> bool:
        """Whether Open MPI's non-blocking neighbourhood calls would swap two blocks here: along a periodic dimension
        of 1 or 2 ranks both neighbours are one rank, and Open MPI 5.0's MPI_Ineighbor_alltoall (its v-forms too)
        delivers their blocks crossed (open-mpi/ompi#14430), where the blocking call, and MPICH's, do not. Such a
        grid runs the blocking call under the watchdog too (which then does not time it)."""
        return (any(p and n <= 2 for n, p in zip(self.dims, self.periods))
                and MPI.Get_library_version().startswith("Open MPI"))

    # -- halo exchange ----------------------------------------------------------------------------------------
    def start_halo(self, u, width=1, corners: bool = True) -> Request:
        """Start filling ``u``'s ghost layers from the neighbours; ``wait()`` on the Request returns ``u``.

        ``u`` is this rank's block with ``width`` ghost layers (an int, or one per dimension) on both sides of
        each dimension, C-contiguous and written in place. Faces go as MPI subarray datatypes, without packing
        copies. With ``corners`` dimensions go one after another (the later ones carry the ghosts received
        in the earlier ones to the diagonal neighbours); ``test()`` posts the next once one has landed.
        Ghosts at the ends of non-periodic dimensions receive nothing along them (boundary values); with
        corners a later dimension carries the neighbour's ghosts of the earlier ones, its boundary values
        included, into the corner ghosts (as a dimension-by-dimension exchange by hand does). Between start
        and ``wait()`` the faces may be read but not written, the ghosts neither.
        """
        seq = self._runner.begin()
        err, xp, the_plan, diagonal = None, None, None, False
        try:
            xp = args.array("start_halo", "u", u)
            if not u.flags.c_contiguous:
                raise ValueError("start_halo: u must be C-contiguous (its ghosts are written in place)")
            args.writable("start_halo", "u", u)
            if not isinstance(corners, (bool, np.bool_)):
                raise TypeError(f"start_halo: corners must be True or False, got {corners!r}")
            diagonal = bool(corners)
            width, the_plan = self._halo_plan(u, width, diagonal)
        except (TypeError, ValueError) as e:
            err = e
        if self.validate:      # the neighbours' arguments compared first: an error raises on them too
            self._halo_agreed(seq, u, width, diagonal, err)
        elif err is not None:
            raise err
        assert the_plan is not None, "an error above was raised"
        if not the_plan.phases:
            return Request.completed(u)
        runner = self._runner
        label = f"halo #{seq} (subarray)"
        watch = None if runner.watch is None else runner.watch.call("halo", seq, "subarray", u.nbytes, u.dtype,
                                                                    len(the_plan.phases))
        # with abort off the exchange fills a copy of u, copied into u once it completes (runner.py: a call that
        # times out leaves MPI pycollect's arrays, never the caller's)
        filled = u.copy() if runner.private else u
        run = halo.start(runner.lib, filled, xp, runner.staging(xp), the_plan, self.neighbors, runner.live.of(seq),
                         watch, label, self.rank, runner.live)
        return Request(run, (lambda: u) if filled is u else functools.partial(_filled, u, filled), runner.dropped,
                       label)

    def _halo_plan(self, u, width, corners: bool) -> tuple:
        """``(width, plan)`` of a halo call on ``u``: the width checked against u's shape and the plan found once per
        (shape, dtype, width as given, corners), then kept on the grid, so a call that repeats them only looks
        them up (``u``'s own checks, array, C order, writable, run every call: they can change between calls).
        A width that is not hashable, or fails its check, is never kept."""
        try:
            key = (u.shape, u.dtype, width if type(width) is int else tuple(width), corners)
            hit = self._halo_plans.get(key)
        except TypeError:        # a width that is no int nor a sequence: checked (and refused) below
            key, hit = None, None
        if hit is not None and not hit[1].freed:   # a plan the module dropped (halo.KEEP) is found again
            return hit
        checked = halo.check("start_halo", tuple(u.shape), width, len(self.dims))
        hit = (checked, halo.plan(tuple(u.shape), u.dtype, checked, corners))
        if key is not None:
            if len(self._halo_plans) >= halo.KEEP:
                self._halo_plans.clear()
            self._halo_plans[key] = hit
        return hit

    @cached_property
    def _halo_plans(self) -> dict:
        return {}

    def _halo_agreed(self, seq: int, u, width, corners: bool, err: Exception | None) -> None:
        """Validation mode: every rank's halo arguments in one Allgather, before anything is sent. Raises ``err``
        here and an error naming the ranks that failed on the others; faces that would not fit between two
        neighbours (another dtype, width or corners, or another extent along a dimension the face spans) raise
        CollectiveMismatchError on every rank (no rank is left waiting for a neighbour that raised)."""
        k = len(self.dims)
        mine = np.zeros(4 + 2 * k, np.int64)               # (ok, itemsize, corners, dtype, shape (k), width (k))
        if err is None:
            mine[:] = [1, u.itemsize, corners, _dtype_code(u.dtype), *u.shape, *width]
        every = self._every_rank("start_halo", seq, mine, err)  # (ranks, 4 + 2 * ndim)
        for a, d, b in self._pairs():
            spans = [4 + e for e in range(k) if e != d]     # the extents a face along d spans
            keep = [1, 2, 3, *spans, *range(4 + k, 4 + 2 * k)]
            if list(every[a, keep]) != list(every[b, keep]):
                raise CollectiveMismatchError(
                    f"start_halo #{seq}: the faces of ranks {a} and {b} do not fit along dimension {d}: rank {a} "
                    f"{_halo_text(every[a], k)}, rank {b} {_halo_text(every[b], k)} (they need equal widths, dtypes, "
                    f"corners and extents in the other dimensions)")

    def _every_rank(self, where: str, seq: int, mine, err):
        """Every rank's row of validation fields (its first 0 where the rank's checks failed) in one Allgather,
        ``(ranks, fields)``: raises ``err`` here, and on the other ranks an error naming the ranks that failed."""
        every = np.zeros((self.size, mine.size), np.int64)
        self._mpi(where, seq, "Allgather", [mine, MPI.INT64_T], [every, MPI.INT64_T])
        if err is not None:
            raise err
        failed = [r for r in range(self.size) if not every[r, 0]]
        if failed:
            raise ValueError(f"{where} #{seq}: rank(s) {', '.join(map(str, failed))} passed bad arguments; "
                             f"nothing was sent")
        return every

    def _pairs(self) -> list[tuple[int, int, int]]:
        """Every pair of neighbours on the grid, once: ``(rank, dim, its neighbour above along dim)``."""
        pairs = []
        for a in range(self.size):
            c = list(self._cart.Get_coords(a))
            for d, (n, p) in enumerate(zip(self.dims, self.periods)):
                if c[d] + 1 < n or (p and n > 1):
                    pairs.append((a, d, self._cart.Get_cart_rank(c[:d] + [(c[d] + 1) % n] + c[d + 1:])))
        return pairs

    def halo(self, u, width=1, corners: bool = True):
        """``start_halo(u, width, corners).wait()``: ``u`` with its ghost layers filled."""
        return self.start_halo(u, width, corners).wait()


def _bytes(a):
    """The bytes of a C-contiguous array (any dtype, NumPy or CuPy), flat."""
    return a.reshape(-1).view("u1")


def _halo_text(row, k: int) -> str:
    return (f"has u of shape {tuple(int(v) for v in row[4:4 + k])} ({_dtype_text(int(row[3]))} of {row[1]} "
            f"bytes), width {tuple(int(v) for v in row[4 + k:])}, corners {bool(row[2])}")


_KNOWN = ("bool", "int8", "uint8", "int16", "uint16", "int32", "uint32", "int64", "uint64", "float16", "float32",
          "float64", "longdouble", "complex64", "complex128", "clongdouble")


def _dtype_text(code: int) -> str:
    """The dtype a ``_dtype_code`` stands for, by name where it is one of NumPy's numbers (or bfloat16), else
    ``dtype #NNNN`` (its code's last four digits)."""
    names = {_dtype_code(np.dtype(n)): np.dtype(n).name for n in _KNOWN}
    try:
        import ml_dtypes
        names[_dtype_code(np.dtype(ml_dtypes.bfloat16))] = "bfloat16"
    except ImportError:   # pragma: no cover (a dependency)
        pass
    return names.get(code, f"dtype #{code % 10000:04d}")


def _dtype_code(dtype) -> int:
    """A dtype as one number (the CRC-32 of its name and layout), shown as ``#`` and its last four digits."""
    return zlib.crc32(f"{dtype.name}{dtype.str}".encode())


_FIELDS = 15   # a fingerprint's: ok, dtype (CRC-32 of its name and str), itemsize, ndim, shape's CRC-32, the
               # row's (shape[1:]) CRC-32, rows, shape (up to 8 dims, -1 beyond)


def _fingerprint(x) -> list[int]:
    shape = tuple(int(d) for d in np.shape(x))
    crc = lambda s: zlib.crc32(s.encode())   # noqa: E731
    dims = list(shape[:8]) + [-1] * (8 - min(len(shape), 8))
    return [1, _dtype_code(x.dtype), x.dtype.itemsize, len(shape), crc(repr(shape)),
            crc(repr(shape[1:])), shape[0] if shape else -1, *dims]


def _x_text(row) -> str:
    shape = tuple(int(d) for d in row[7:7 + min(int(row[3]), 8)])
    return f"x of shape {shape}{'...' if row[3] > 8 else ''}, {_dtype_text(int(row[1]))} of {int(row[2])} bytes"


def _starts(counts: list[int]) -> list[int]:
    return [sum(counts[:i]) for i in range(len(counts))]


def _filled(u, filled):
    """A halo's result where it filled a copy of ``u`` (abort off): ``u`` with the copy's ghosts, and faces as they were."""
    u[...] = filled
    return u
