"""The Communicator: thin methods that check arguments, pick an algorithm and hand a schedule to the engine."""
from __future__ import annotations

import dataclasses
import math
import operator
import os
import weakref
from functools import lru_cache

import numpy as np
from mpi4py import MPI

from .algorithms import registry
from . import recording, settings
from .engine import args, backend, mpi_native, ops, trace
from .engine.abort import collective_failed, end_job
from .engine.backend import BufferPool, flat
from .engine.executor import Execution
from .engine.pairing import CallId, do_not_pair
from .engine.request import Request
from .engine.schedule import Problem
from .engine.shapes import REDUCING
from .engine.topology import Topology
from .engine.validate import ROWS, Call, Validator, check_out_rows, ranks_by_value, ranks_text
from .engine.watchdog import Watchdog, allgather as watched_allgather
from .engine.window import NodeWindows, fingerprint
from .select import Selector

# The schedule a rank runs depends only on its Problem: build it once per shape.
_schedule = lru_cache(maxsize=512)(lambda collective, name, problem: registry.get_schedule(collective, name)(problem))

# The names each collective accepts (the registry is fixed once imported).
_algorithm_names = lru_cache(maxsize=None)(registry.algorithms)

# A schedule for dtypes MPI cannot reduce (float16, bfloat16) when the table says "mpi".
_FALLBACK = {"allreduce": "ring", "reduce_scatter": "ring", "allgather": "ring",
             "alltoall": "pairwise", "broadcast": "binomial", "reduce": "binomial"}


def detect_topology(comm: MPI.Intracomm) -> Topology:
    """Nodes from ``MPI_Comm_split_type(SHARED)``, labelled by their lowest rank (never by host name)."""
    local = comm.Split_type(MPI.COMM_TYPE_SHARED)
    leader = np.array([comm.Get_rank()], np.int64)
    try:
        local.Allreduce(MPI.IN_PLACE, leader, op=MPI.MIN)
    finally:
        local.Free()
    labels = np.empty(comm.Get_size(), np.int64)
    comm.Allgather(leader, labels)
    return Topology.from_labels([int(v) for v in labels])


class Communicator:
    """Collectives over an MPI intracommunicator, on NumPy or CuPy arrays.

    Library traffic runs on a private duplicate of ``comm``, one tag per collective call,
    so it never matches the caller's messages or another collective in flight.
    ``topology`` replaces the detected one (every rank must pass the same), for example
    ``Topology.single_node(size)`` to measure topology-blind schedules.

    ``validate`` (default ``PYCOLLECT_DEBUG``, 0 or 1) compares every collective's arguments
    across ranks before it starts and raises ``CollectiveMismatchError`` on every rank when they
    differ (engine/validate.py). ``timeout`` (default ``PYCOLLECT_TIMEOUT``, seconds) bounds
    every blocking wait; past it a rank writes its flight recorder and, as
    ``abort_on_timeout`` (default ``PYCOLLECT_TIMEOUT_ABORT``, 1) says, aborts the job or raises
    ``CollectiveTimeout`` (engine/watchdog.py). Every rank must use the same settings: they are
    compared in one Allgather when the Communicator is built, and differing or bad ones raise on
    every rank (settings.py).
    """

    def __init__(self, comm: MPI.Comm | None = None, *, tuning: str | None = None,
                 segment_bytes: int | None = None, pipeline_bytes: int | None = None,
                 topology: Topology | None = None, validate: bool | None = None,
                 timeout: float | None = None, abort_on_timeout: bool | None = None):
        comm = MPI.COMM_WORLD if comm is None else comm
        if not isinstance(comm, MPI.Comm) or comm == MPI.COMM_NULL:
            raise TypeError(f"Communicator: comm must be an MPI intracommunicator, got {comm!r}")
        if comm.Is_inter():
            raise TypeError("Communicator: comm is an intercommunicator; pass an intracommunicator")
        self.mpi = comm
        self.rank, self.size = comm.Get_rank(), comm.Get_size()
        self._tuning_path = tuning      # what split() and sub() hand their groups
        self._groups: list[Communicator] = []   # made by split() and sub(): freed with this one
        self._owned: MPI.Comm | None = None     # the split communicator a group wraps (freed with it)
        self._freed = False
        # Settings are read, then agreed in one Allgather, before anything else: a bad setting on
        # one rank, or settings that differ, raise on every rank (settings.py).
        error = given = None
        try:
            given = settings.read(tuning=tuning, segment_bytes=segment_bytes, pipeline_bytes=pipeline_bytes,
                                  topology=topology, validate=validate, timeout=timeout,
                                  abort_on_timeout=abort_on_timeout)
            if given.topology is not None and given.topology.size != self.size:
                raise ValueError(f"Communicator: topology has {given.topology.size} ranks, the communicator {self.size}")
        except Exception as e:  # noqa: BLE001 (whatever it is, every rank must hear of it)
            error, given = e, None
        settings.agree(comm, given, error)
        self.validate, self.timeout, self.abort_on_timeout = given.validate, given.timeout, given.abort_on_timeout
        self.segment_bytes, self.pipeline_bytes = given.segment_bytes, given.pipeline_bytes
        # ``topology`` overrides detection, e.g. Topology.single_node(size) for a flat baseline
        self.topology = detect_topology(comm) if given.topology is None else given.topology
        self._selector = Selector(given.tuning, size=self.size, multi_node=self.topology.num_nodes > 1,
                                  forced=given.forced)
        self._lib = comm.Dup()          # collectives
        self._p2p = comm.Dup()          # send/recv of this API
        self._tag_ub = self._p2p.Get_attr(MPI.TAG_UB)
        self._seq = 0                   # every collective call takes the next number as it starts
        self._live: set[int] = set()    # tags of this rank's schedules in flight (engine/pairing.py)
        self._pool = BufferPool()
        self._windows = _UNOPENED          # engine/window.NodeWindows, opened by the first "shm" call
        self._cuda_aware: bool | None = None
        # Waiting on one segment at a time overlaps reduction with arrival, but only pays when
        # no two ranks share a core (bench/README.md). The node's cores, not this rank's affinity: a
        # launcher that binds each rank to one core leaves every rank a core of its own.
        on_node = self.topology.node_sizes[self.topology.node_of[self.rank]]
        self._overlap = on_node <= (os.cpu_count() or 1)
        self._observers()

    def _observers(self) -> None:
        """Validation, the watchdog and tracing, decided once here (off, each is None and no call changes), and
        the lean paths' tables, which any of them turns off (their calls take the general path)."""
        self._lean = mpi_native.lean_table(self._selector)
        self._lean_rs = mpi_native.lean_table(self._selector, "reduce_scatter")
        self._lean_a2a = mpi_native.lean_table(self._selector, "alltoall")
        self._lean_ag = mpi_native.lean_table(self._selector, "allgather")
        # allreduce's lean path: the last lookup (dtype, op, algorithm, entry) and the last (x, out) pair that
        # passed _lean_out, as weak references (nothing is kept alive; a freed array's id cannot match)
        self._lean_last = (None, None, None, None)
        self._lean_x_ref = self._lean_out_ref = _dead
        self._watch = None if self.timeout is None else Watchdog(self.timeout, self.abort_on_timeout,
                                                                   self.rank, self.size)
        self._check = Validator(self._lib, self.rank, self.size, self._watch) if self.validate else None
        # PYCOLLECT_TRACE (engine/trace.py): off, the "mpi" calls go to the mpi_native module itself
        self._tracer = trace.from_env(self)
        self._native = mpi_native if self._tracer is None else self._tracer.native
        if self._watch is not None or self._check is not None or self._tracer is not None:
            # every call takes the general path: fingerprint first, MPI's waits polled, spans traced
            self._lean = self._lean_rs = self._lean_a2a = self._lean_ag = {}

    def __repr__(self) -> str:
        return f"Communicator(rank={self.rank}, size={self.size}, {self.topology.describe()})"

    def free(self) -> None:
        """Release the private communicators and the groups made by ``split``/``sub`` (collective; the wrapped
        communicator stays the caller's; a second call does nothing)."""
        if self._freed:
            return
        self._freed = True
        while self._groups:
            self._groups.pop().free()
        if self._windows not in (_UNOPENED, None):
            self._windows.free()
            self._windows = None
        for c in (self._lib, self._p2p, self._owned):
            if c is not None and c != MPI.COMM_NULL:
                c.Free()
        self._owned = None
        if self._tracer is not None:  # PYCOLLECT_TRACE: write this rank's file now
            self._tracer.flush()

    def __enter__(self) -> "Communicator":
        return self

    def __exit__(self, *exc) -> None:
        self.free()

    # -- groups -------------------------------------------------------------------------------------
    def split(self, color, key=None) -> "Communicator | None":
        """The ranks of equal ``color`` as one Communicator, ordered by ``key`` (default: their rank here); color
        None joins none and gets None (collective, like ``MPI_Comm_split``).

        The group inherits this Communicator's settings (validation, timeout, segment and pipeline sizes,
        tuning) and its topology restricted to the group's ranks (no second detection), and is freed with it,
        or earlier by its own ``free()`` or a ``with`` block. ``group.parent_ranks`` are its ranks here.
        """
        self._begin()   # a collective of its own: every rank's arguments are checked before any splits
        err = None
        try:
            color = MPI.UNDEFINED if color is None else args.integer("split", "color", color)
            key = self.rank if key is None else args.integer("split", "key", key)
            if color != MPI.UNDEFINED and color < 0:
                raise ValueError(f"split: color must be None or >= 0, got {color}")
        except (TypeError, ValueError) as e:
            err = e
        self._arguments_agreed("split", err)
        return self._group(self._lib.Split(color, key))

    def sub(self, ranks) -> "Communicator | None":
        """The Communicator of ``ranks`` (ranks here, in the order given; every rank passes the same list), or
        None on the ranks left out. Collective over this Communicator; a ``split`` underneath."""
        self._begin()
        err, members = None, []
        try:
            if isinstance(ranks, (str, bytes)) or not hasattr(ranks, "__iter__"):
                raise TypeError(f"sub: ranks must be a sequence of ranks, got {type(ranks).__name__}")
            members = [args.integer("sub", "ranks", r) for r in ranks]
            bad = [r for r in members if not 0 <= r < self.size]
            if bad or len(set(members)) != len(members) or not members:
                raise ValueError(f"sub: ranks must be distinct ranks in 0..{self.size - 1}, at least one, got "
                                 f"{members}")
        except (TypeError, ValueError) as e:
            err = e
        self._arguments_agreed("sub", err)
        mine = self.rank in members
        return self._group(self._lib.Split(0 if mine else MPI.UNDEFINED, members.index(self.rank) if mine else 0))

    def _group(self, split: MPI.Comm) -> "Communicator | None":
        """A Communicator over ``split`` (which it owns), with this one's settings and topology, kept for free()."""
        if split == MPI.COMM_NULL:
            return None
        mine = np.array([self.rank], np.int64)
        ranks = np.empty(split.Get_size(), np.int64)
        split.Allgather(mine, ranks)                  # a buffer: the library never pickles
        parent_ranks = ranks.tolist()
        topology = Topology.from_labels([self.topology.node_of[r] for r in parent_ranks])
        group = Communicator(split, tuning=self._tuning_path, topology=topology, validate=self.validate,
                             timeout=self.timeout, abort_on_timeout=self.abort_on_timeout,
                             segment_bytes=self.segment_bytes, pipeline_bytes=self.pipeline_bytes)
        group._owned, group.parent_ranks = split, parent_ranks
        self._groups.append(group)
        return group

    def _arguments_agreed(self, where: str, err: Exception | None) -> None:
        """Every rank's argument check exchanged before anything collective: ``err`` raised here, and on every
        other rank an error naming the ranks whose arguments failed (no rank goes on alone)."""
        (ok,), _ = self._exchange((err is None,), where, None)
        if err is not None:
            raise err
        if not all(ok):
            bad = [r for r, good in enumerate(ok) if not good]
            raise ValueError(f"{where}: rank(s) {', '.join(map(str, bad))} passed bad arguments; no rank went on")

    def shared_empty(self, shape, dtype=np.float64) -> np.ndarray:
        """A NumPy array like ``np.empty(shape, dtype)`` in memory the ranks of the node share (collective; each
        rank may ask its own shape).

        Handed as the input of an ``algorithm="shm"`` call, it is read by the peers where it lies, without the
        copy into a window each such call otherwise makes. Where windows cannot be had (ranks on several
        nodes) it is a plain ``np.empty`` array, and every call works as with any array. The memory lives
        while any array made from it does; ``free()`` releases what no rank still uses.
        """
        self._begin()   # a collective of its own: every rank's arguments are checked before any allocates
        err = None
        try:
            dtype = np.dtype(dtype)
            shape = tuple(operator.index(s) for s in shape) if np.ndim(shape) else (operator.index(shape),)
            if any(s < 0 for s in shape):
                raise ValueError(f"shared_empty: shape must not be negative, got {shape}")
        except (TypeError, ValueError) as e:
            err = e if "shared_empty" in str(e) else type(e)(f"shared_empty: bad shape {shape!r} or dtype "
                                                              f"{dtype!r}: {e}")
        self._arguments_agreed("shared_empty", err)
        windows = self._node_windows("shared_empty")
        if windows is None:
            return np.empty(shape, dtype)
        nbytes = int(np.prod(shape, dtype=np.int64)) * dtype.itemsize
        return windows.allocate(nbytes).view(dtype).reshape(shape)

    def record(self):
        """``with comm.record() as log:`` -- every call on this communicator in the block, as
        ``CallRecord``s (collective, elements, dtype, bytes handed in); see ``pycollect.recording``."""
        return recording.record(self)

    # -- helpers ------------------------------------------------------------------------------------
    def _begin(self) -> None:
        """A collective call starts: it takes the next sequence number, even if its arguments then fail,
        so that its tag never serves another call (engine/pairing.py)."""
        self._seq += 1

    def _lean_entry(self, table: dict, key: tuple, collective: str, nbytes: int):
        """The lean table's ``(MPI op, limit)`` for ``key`` when a call of ``nbytes`` goes to MPI's own, else None.

        Beyond the first rows of the table, ``auto`` asks the selector (a tuning table may give MPI
        windows further on). Allreduce, the hottest path, keeps this inline.
        """
        try:
            lean = table.get(key)
        except TypeError:  # an unhashable op or algorithm: the general path says what is wrong
            return None
        if lean is None or (nbytes > lean[1] and self._selector.choose(collective, nbytes) != "mpi"):
            return None
        return lean

    def _direct(self, collective: str, run, *args) -> None:
        """A lean path's call straight to MPI, ``run(*args)``, as the call's sequence number; MPI raising inside
        it ends the job naming the call."""
        self._seq += 1
        try:
            run(*args)
        except MPI.Exception as e:
            collective_failed(f"{collective} #{self._seq} (mpi)", self.rank, e)

    def _call_id(self, collective: str, algorithm: str) -> CallId:
        return CallId(collective, self._seq, algorithm, self.rank)

    def _staging(self, xp) -> bool:
        if xp is np:
            return False
        if self._cuda_aware is None:
            self._cuda_aware = backend.cuda_aware(MPI)
        return not self._cuda_aware

    def auto_algorithm(self, collective: str, nbytes: int, dtype="float32") -> str:
        """The algorithm ``algorithm="auto"`` runs for a message of ``nbytes`` of ``dtype``."""
        return self._resolve(collective, "auto", nbytes, np.dtype(dtype))

    def _resolve(self, collective: str, algorithm: str, nbytes: int, dtype) -> str:
        args.algorithm(collective, algorithm, _algorithm_names(collective))
        if algorithm == "auto":
            name = self._selector.choose(collective, nbytes)
            if name == "mpi" and not mpi_native.supports(dtype):
                name = _FALLBACK[collective]
            return name
        if algorithm == "mpi":
            if not mpi_native.supports(dtype):
                raise ValueError(f"{collective}: algorithm 'mpi' cannot {'reduce' if collective in REDUCING else 'move'} "
                                 f"dtype {np.dtype(dtype)} (MPI has no such type); choose one of "
                                 f"{', '.join(registry.schedule_algorithms(collective))}")
            return algorithm
        return algorithm

    def _segment(self, itemsize: int) -> int:
        return max(1, self.segment_bytes // itemsize) if self.segment_bytes else 0

    def _pipeline(self, itemsize: int) -> int:
        return max(1, self.pipeline_bytes // itemsize) if self.pipeline_bytes else 0

    def _execute(self, collective, name, problem, bufs, op, xp, blocking, finish):
        """Run (or start) a schedule; ``finish()`` turns the filled buffers into the result."""
        call = self._call_id(collective, name)
        if name == "shm":  # shared-memory windows where the ranks can have them, else the schedule's messages
            problem = self._window_problem(collective, problem, call, bufs["in"], xp)
        sched = _schedule(collective, name, problem)
        combine = ops.ufunc(op, xp) if op else None
        start = Execution
        if self._tracer is not None:  # PYCOLLECT_TRACE: an Execution that records its rounds; finish ends the span
            start, finish = self._tracer.schedule(collective, name, op, self._seq, bufs["in"], sched, blocking, finish)
        watch = None
        if self._watch is not None:  # PYCOLLECT_TIMEOUT: the flight recorder's entry; waits poll to a deadline
            x = bufs["in"]
            watch = self._watch.call(collective, self._seq, name, x.nbytes, x.dtype, len(sched.rounds))
        run = start(self._lib, sched, bufs, combine, xp, self._pool, self._segment(bufs["in"].itemsize),
                    self._staging(xp), self._overlap, watch, call=call, live=self._live,
                    windows=None if self._windows is _UNOPENED else self._windows)
        if blocking:
            run.wait()
            return finish()
        return Request(run, finish)

    def _window_problem(self, collective: str, problem: Problem, call: CallId, x, xp) -> Problem:
        """``problem`` with ``windows`` set where this call can use shared-memory windows: host arrays, every rank
        on one node (the windows are opened by the first call that asks: every rank asks at the same call), room
        for them; the ranks agree on it, and learn whose input ``x`` lies in shared memory (engine/window.py)."""
        if xp is not np or self._node_windows(collective) is None:
            return problem
        windowed = dataclasses.replace(problem, windows=True)
        sched = _schedule(collective, "shm", windowed)
        if not any(rnd.window for rnd in sched.rounds):   # the same on every rank: no window, no agreement
            return problem
        source = self._windows.locate(x) if sched.lends else (-1, 0)   # where peers may read x itself
        key = fingerprint(collective, problem, x.dtype)
        agreed = self._windows.agree(call, key, sched.win * x.itemsize, self._watch, source)
        return windowed if agreed else problem

    def _node_windows(self, collective: str) -> NodeWindows | None:
        """This Communicator's windows on this rank's node, opened at the first call that needs them (every rank
        calls alike), or None where the ranks of a node (as the topology has them) cannot share memory."""
        if self._windows is _UNOPENED:
            # every rank at this call first (watched under a timeout): opening the windows blocks in MPI
            self._exchange((), collective, None)
            self._windows = NodeWindows.open(self._lib, self.topology.nodes[self.topology.node_of[self.rank]])
        return self._windows

    def _problem(self, **kw) -> Problem:
        return Problem(self.rank, self.size, self.topology, **kw)

    def _agree(self, err, collective: str, x, **fields):
        """Validation mode: this call against every rank's, before anything is sent.

        Returns the table of fingerprints; raises ``err`` (this rank's failed argument check)
        here and ``CollectiveMismatchError`` on the other ranks, or that error on every rank
        when the calls differ.
        """
        return self._check.agree(Call(collective, self._seq, x, error=err, **fields))

    def _exchange(self, values, collective: str, out) -> tuple[list[list[int]], list[int]]:
        """Every rank's ``values`` (counts), column by column (``columns[j][i]``: rank i's ``values[j]``), and every
        rank's ``out`` rows (-1: none), as Python ints, in one small Allgather of the library's own; watched under a
        timeout. The call's sequence number travels along: ranks whose calls do not pair up are found here,
        whatever algorithm follows (engine/pairing.py)."""
        send = np.array((self._seq, -1 if out is None else out.shape[0], *values), np.int64)
        table = np.empty((self.size, send.size), np.int64)   # (size, 2 + len(values))
        watched_allgather(self._lib, self._watch, send, table, collective, self._seq, "exchange of counts")
        seqs, out_rows, *columns = table.T.tolist()
        if seqs.count(self._seq) != self.size:
            end_job(do_not_pair(self._call_id(collective, "exchange of counts"),
                                f"the ranks exchanged the counts of calls {_numbers(seqs)}"))
        return columns, out_rows

    # -- allreduce ----------------------------------------------------------------------------------
    def allreduce(self, x, op: str = "sum", algorithm: str = "auto", out=None, accumulate: str | None = None):
        """Reduce ``x`` over all ranks; every rank gets the result (a new array unless ``out`` is given)."""
        # Lean path for small host messages that go to MPI's own allreduce: a few checks, so pycollect
        # costs next to nothing over a bare MPI_Allreduce. The lean table's entry of the last call's
        # (dtype, op, algorithm), and the last (x, out) pair that passed _lean_out, are remembered: a
        # call that repeats them re-checks only what a caller can change on the same two arrays.
        if type(x) is _ndarray and accumulate is None:
            last = self._lean_last
            if (dtype := x.dtype) is last[0] and op is last[1] and algorithm is last[2]:
                lean = last[3]
            else:
                lean = self._lean_lookup(dtype, op, algorithm)
            if lean is not None and x.nbytes <= lean[1] and x.flags.c_contiguous:
                if out is None:
                    out = _empty(x.shape, dtype)
                # The remembered pair: checked again is only what a caller may change in place on the same two
                # arrays (flags.writeable; shape, dtype, strides by assignment). Whether they overlap cannot
                # change: data pointers are fixed, a C-contiguous array of unchanged shape and dtype spans the
                # same bytes (x's are checked above), and resize() moves an array to memory of its own.
                elif not (self._lean_out_ref() is out and self._lean_x_ref() is x and (flags := out.flags).writeable
                          and flags.c_contiguous and out.dtype == dtype and out.shape == x.shape):
                    if not _lean_out(out, x.shape, x):
                        return self._allreduce(x, op, algorithm, out, accumulate, True)
                    self._lean_x_ref, self._lean_out_ref = weakref.ref(x), weakref.ref(out)
                self._seq += 1
                try:
                    self._lib.Allreduce(_IN_PLACE if out is x else x, out, lean[0])
                except MPI.Exception as e:
                    collective_failed(f"allreduce #{self._seq} (mpi)", self.rank, e)
                return out
        return self._allreduce(x, op, algorithm, out, accumulate, True)

    def _lean_lookup(self, dtype, op, algorithm):
        """The lean table's ``(MPI op, limit)`` for a dtype, op and algorithm, or None; remembered for the next
        call when op and algorithm are plain str (compared by identity there, a miss only costs this lookup)."""
        try:
            lean = self._lean.get((dtype, op, algorithm))
        except TypeError:  # an unhashable op or algorithm: the general path says what is wrong
            return None
        if type(op) is str and type(algorithm) is str:
            self._lean_last = (dtype, op, algorithm, lean)
        return lean

    def iallreduce(self, x, op: str = "sum", algorithm: str = "auto", out=None, accumulate: str | None = None) -> Request:
        """Start an allreduce; ``Request.wait()`` returns the result."""
        return self._allreduce(x, op, algorithm, out, accumulate, False)

    def _allreduce(self, x, op, algorithm, out, accumulate, blocking):
        self._begin()
        err = name = wide = None
        try:
            xp = args.array("allreduce", "x", x)
            op = args.op("allreduce", op, x.dtype)
            args.out("allreduce", out, x.shape, x.dtype, xp)
            wide = args.accumulate("allreduce", accumulate, x.dtype)
            dtype = np.dtype(accumulate) if wide else x.dtype
            name = self._resolve("allreduce", algorithm, x.size * dtype.itemsize, dtype)
        except Exception as e:
            if self._check is None:
                raise
            err = e
        if self._check is not None:
            self._agree(err, "allreduce", x, algorithm=algorithm, op=op, accumulate=accumulate if wide else None,
                        resolved=name)
        if wide:  # reduced in float32, stored back in x's dtype
            result = self._allreduce_run(x.astype(accumulate), op, name, None, xp, True)
            return _done(_store(result, out, x.dtype), blocking)
        return self._allreduce_run(x, op, name, out, xp, blocking)

    def _allreduce_run(self, x, op, name, out, xp, blocking):
        if name == "mpi":
            return self._native.allreduce(self, x, op, out, xp, blocking)
        xf = flat(x)
        target, of = _target(out, x.shape, x.dtype, xp, x)
        bufs = {"in": xf, "out": of}
        problem = self._problem(n=xf.size, pipeline=self._pipeline(x.itemsize))
        return self._execute("allreduce", name, problem, bufs, op, xp, blocking,
                             _finisher(target, out, of, op, self.size, xp))

    # -- reduce_scatter -----------------------------------------------------------------------------
    def reduce_scatter(self, x, op: str = "sum", counts=None, algorithm: str = "auto", out=None):
        """Reduce ``x`` and keep block ``rank`` of it (blocks along axis 0, ``counts`` rows each)."""
        # Lean path, as allreduce's: even blocks of a host array that go to MPI_Reduce_scatter_block.
        if counts is None and type(x) is np.ndarray and x.ndim and x.shape[0] % self.size == 0 \
                and x.flags.c_contiguous:
            lean = self._lean_entry(self._lean_rs, (x.dtype, op, algorithm), "reduce_scatter", x.nbytes)
            if lean is not None:
                shape = (x.shape[0] // self.size,) + x.shape[1:]
                if out is None:
                    out = np.empty(shape, x.dtype)
                elif out is x or not _lean_out(out, shape, x):   # MPI forbids x as out here (one rank)
                    return self._reduce_scatter(x, op, counts, algorithm, out, True)
                self._direct("reduce_scatter", self._lib.Reduce_scatter_block, x, out, lean[0])
                return out
        return self._reduce_scatter(x, op, counts, algorithm, out, True)

    def ireduce_scatter(self, x, op: str = "sum", counts=None, algorithm: str = "auto", out=None) -> Request:
        return self._reduce_scatter(x, op, counts, algorithm, out, False)

    def _reduce_scatter(self, x, op, counts, algorithm, out, blocking):
        self._begin()
        err = name = None
        try:
            xp = args.array("reduce_scatter", "x", x)
            args.rows("reduce_scatter", x)
            op = args.op("reduce_scatter", op, x.dtype)
            rows = args.counts("reduce_scatter", counts, x.shape[0], self.size)
            shape = (rows[self.rank],) + x.shape[1:]
            args.out("reduce_scatter", out, shape, x.dtype, xp)
            name = self._resolve("reduce_scatter", algorithm, x.nbytes, x.dtype)
        except Exception as e:
            if self._check is None:
                raise
            err = e
        if self._check is not None:
            self._agree(err, "reduce_scatter", x, algorithm=algorithm, op=op, counts=counts, resolved=name)
        row = _row_elems(x)
        elems = tuple(c * row for c in rows)
        if name == "mpi":
            return self._native.reduce_scatter(self, x, op, elems, shape, out, xp, blocking)
        target, of = _target(out, shape, x.dtype, xp, x)
        bufs = {"in": flat(x), "out": of}
        problem = self._problem(n=x.size, counts=elems, pipeline=self._pipeline(x.itemsize))
        return self._execute("reduce_scatter", name, problem, bufs, op, xp, blocking,
                             _finisher(target, out, of, op, self.size, xp))

    # -- allgather ----------------------------------------------------------------------------------
    def allgather(self, x, algorithm: str = "auto", out=None, counts=None):
        """Concatenate every rank's ``x`` along axis 0; lengths may differ (``counts`` skips their exchange)."""
        # Lean path: every rank's rows given and all equal, a host array that goes to MPI_Allgather.
        if counts is not None and type(x) is np.ndarray and x.ndim and x.flags.c_contiguous \
                and _even(counts, x.shape[0], self.size):
            lean = self._lean_entry(self._lean_ag, (x.dtype, None, algorithm), "allgather", x.nbytes * self.size)
            if lean is not None:
                shape = (x.shape[0] * self.size,) + x.shape[1:]
                if out is None:
                    out = np.empty(shape, x.dtype)
                elif out is x or not _lean_out(out, shape, x):
                    return self._allgather(x, algorithm, out, counts, True)
                self._direct("allgather", self._lib.Allgather, x, out)
                return out
        return self._allgather(x, algorithm, out, counts, True)

    def iallgather(self, x, algorithm: str = "auto", out=None, counts=None) -> Request:
        return self._allgather(x, algorithm, out, counts, False)

    def _allgather(self, x, algorithm, out, counts, blocking):
        self._begin()
        err = rows = name = None
        try:
            xp = args.array("allgather", "x", x)
            args.rows("allgather", x)
            trailing = x.shape[1:]
            if out is not None:   # its rows: once every rank's are known
                args.out("allgather", out, (None,) + trailing, x.dtype, xp)
            rows = self._allgather_rows(x, counts, out)   # None: validation mode takes them from the fingerprints
            shape, elems, total = _gathered(rows or (), trailing)
            if out is not None:
                args.out("allgather", out, (None if rows is None else shape[0],) + trailing, x.dtype, xp)
            name = self._resolve("allgather", algorithm, total * x.itemsize, x.dtype)
        except Exception as e:
            if self._check is None:
                raise
            err = e
        if self._check is not None:
            table = self._agree(err, "allgather", x, algorithm=algorithm, counts=counts, out=out, rows_free=True,
                                resolved=None if rows is None else name)
            if rows is None:
                rows = tuple(int(r) for r in table[:, ROWS])
                self._check.out_rows("allgather", self._seq, table, [sum(rows)] * self.size, x.shape[1:])
                shape, elems, total = _gathered(rows, x.shape[1:])
                name = self._resolve("allgather", algorithm, total * x.itemsize, x.dtype)
        if name == "mpi":
            return self._native.allgather(self, x, elems, shape, out, xp, blocking)
        target, of = _target(out, shape, x.dtype, xp, x)
        problem = self._problem(n=total, counts=elems)
        return self._execute("allgather", name, problem, {"in": flat(x), "out": of}, None, xp, blocking,
                             _finisher(target, out, of, None, self.size, xp))

    def _allgather_rows(self, x, counts, out) -> tuple[int, ...] | None:
        """Rows of every rank: ``counts`` checked, else gathered (validation mode: None, the fingerprints have them).

        Gathered, every rank's ``out`` rows travel along and are checked on every rank, so a wrong ``out``
        raises everywhere rather than on one rank after the others have moved on.
        """
        if counts is None:
            if self._check is not None:
                return None
            (rows,), out_rows = self._exchange((x.shape[0],), "allgather", out)
            total = sum(rows)
            if out_rows.count(-1) + out_rows.count(total) != self.size:   # some rank's out is wrong: say which
                check_out_rows("allgather", self._seq, out_rows, [total] * self.size, x.shape[1:], self.rank)
            return tuple(rows)
        rows = args.counts("allgather", counts, None, self.size)
        if rows[self.rank] != x.shape[0]:
            raise ValueError(f"allgather: counts[{self.rank}] is {rows[self.rank]} but x has {x.shape[0]} rows")
        return rows

    # -- alltoall -----------------------------------------------------------------------------------
    def alltoall(self, x, counts=None, algorithm: str = "auto", out=None):
        """Block i of ``x`` (axis 0) goes to rank i; the result holds the blocks from each rank in rank order.

        Without ``counts`` every rank splits the same number of rows evenly (as MPI_Alltoall);
        with ``counts`` (rows per destination) blocks may be uneven (MPI_Alltoallv), and the ranks
        exchange their counts first. ``counts`` may instead be the whole (size, size) matrix, row i the
        rows rank i sends to each rank, the same on every rank: then nothing is exchanged.
        """
        # Lean path: even blocks of a host array that go to MPI_Alltoall.
        if counts is None and type(x) is np.ndarray and x.ndim and x.shape[0] % self.size == 0 \
                and x.flags.c_contiguous:
            lean = self._lean_entry(self._lean_a2a, (x.dtype, None, algorithm), "alltoall", x.nbytes)
            if lean is not None:
                if out is None:
                    out = np.empty_like(x)
                elif not _lean_out(out, x.shape, x):
                    return self._alltoall(x, counts, algorithm, out, True)
                self._direct("alltoall", self._lib.Alltoall, MPI.IN_PLACE if out is x else x, out)
                return out
        return self._alltoall(x, counts, algorithm, out, True)

    def ialltoall(self, x, counts=None, algorithm: str = "auto", out=None) -> Request:
        return self._alltoall(x, counts, algorithm, out, False)

    def _alltoall(self, x, counts, algorithm, out, blocking):
        self._begin()
        err = name = known = None
        try:
            xp = args.array("alltoall", "x", x)
            args.rows("alltoall", x)
            known = args.count_matrix("alltoall", counts, x.shape[0], self.size, self.rank)
            rows = known[self.rank] if known else args.counts("alltoall", counts, x.shape[0], self.size)
            own = (self.size * rows[self.rank] if counts is None   # with a row of counts: known after the exchange
                   else sum(r[self.rank] for r in known) if known else None)
            args.out("alltoall", out, (own,) + x.shape[1:], x.dtype, xp)
            name = self._resolve("alltoall", algorithm, x.nbytes, x.dtype)
        except Exception as e:
            if self._check is None:
                raise
            err = e
        if self._check is not None:
            whole = args.is_matrix(counts)   # every rank must pass the same matrix, but a row of its own
            table = self._agree(err, "alltoall", x, algorithm=algorithm,
                                counts=np.ravel(counts).tolist() if whole else counts, out=out,
                                resolved=name if counts is None else None, rows_free=counts is not None,
                                counts_each=not whole)
        rows_matrix = (rows,) * self.size if counts is None else known or self._rows_matrix(rows, out, x.shape[1:])
        shape = (sum(r[self.rank] for r in rows_matrix),) + x.shape[1:]
        if counts is not None:
            if self._check is not None:
                each = [sum(r[j] for r in rows_matrix) for j in range(self.size)]
                self._check.out_rows("alltoall", self._seq, table, each, x.shape[1:])
            args.out("alltoall", out, shape, x.dtype, xp)
            # every rank resolves from the same figure: the bytes an average rank sends
            name = self._resolve("alltoall", algorithm, sum(map(sum, rows_matrix)) * x.itemsize * _row_elems(x)
                                 // self.size, x.dtype)
        row = _row_elems(x)
        matrix = tuple(tuple(c * row for c in r) for r in rows_matrix)
        if name == "mpi":
            return self._native.alltoall(self, x, matrix, shape, out, xp, blocking)
        target, of = _target(out, shape, x.dtype, xp, x)
        xf = flat(x)
        problem = self._problem(n=x.size, matrix=matrix, aliased=bool(xp.may_share_memory(xf, of)))
        return self._execute("alltoall", name, problem, {"in": xf, "out": of}, None, xp, blocking,
                             _finisher(target, out, of, None, self.size, xp))

    def _rows_matrix(self, rows, out, trailing) -> tuple[tuple[int, ...], ...]:
        """``matrix[i][j]``: rows rank i sends to rank j (every rank's counts, exchanged; every rank's ``out`` rows
        checked on every rank against what it will receive)."""
        columns, out_rows = self._exchange(rows, "alltoall", out)
        matrix = tuple(zip(*columns))
        received = [sum(r[j] for r in matrix) for j in range(self.size)]
        check_out_rows("alltoall", self._seq, out_rows, received, trailing, self.rank)
        return matrix

    # -- broadcast and reduce -----------------------------------------------------------------------
    def broadcast(self, x, root: int = 0, algorithm: str = "auto", out=None):
        """Root's ``x`` on every rank (elsewhere ``x`` gives shape and dtype); ``out=x`` fills ``x`` in place."""
        self._begin()
        err = name = None
        try:
            xp = args.array("broadcast", "x", x)
            args.rank("broadcast", "root", root, self.size)
            args.out("broadcast", out, x.shape, x.dtype, xp)
            name = self._resolve("broadcast", algorithm, x.nbytes, x.dtype)
        except Exception as e:
            if self._check is None:
                raise
            err = e
        if self._check is not None:
            self._agree(err, "broadcast", x, algorithm=algorithm, root=root, resolved=name)
        if name == "mpi":
            return self._native.broadcast(self, x, root, out, xp)
        xf = flat(x)
        target, of = _target(out, x.shape, x.dtype, xp, x)
        problem = self._problem(n=xf.size, root=root, pipeline=self._pipeline(x.itemsize))
        return self._execute("broadcast", name, problem, {"in": xf, "out": of}, None, xp, True,
                             _finisher(target, out, of, None, self.size, xp))

    def reduce(self, x, root: int = 0, op: str = "sum", algorithm: str = "auto", out=None):
        """Reduce ``x`` onto ``root``; returns the result there and None elsewhere."""
        self._begin()
        err = name = None
        try:
            xp = args.array("reduce", "x", x)
            args.rank("reduce", "root", root, self.size)
            op = args.op("reduce", op, x.dtype)
            if self.rank == root:
                args.out("reduce", out, x.shape, x.dtype, xp)
            name = self._resolve("reduce", algorithm, x.nbytes, x.dtype)
        except Exception as e:
            if self._check is None:
                raise
            err = e
        if self._check is not None:
            self._agree(err, "reduce", x, algorithm=algorithm, op=op, root=root, resolved=name)
        if name == "mpi":
            return self._native.reduce(self, x, root, op, out, xp)
        xf = flat(x)
        bufs = {"in": xf}
        finish = lambda: None  # noqa: E731 (no result off the root)
        if self.rank == root:
            target, of = _target(out, x.shape, x.dtype, xp, x)
            bufs["out"] = of
            finish = _finisher(target, out, of, op, self.size, xp)
        problem = self._problem(n=xf.size, root=root, pipeline=self._pipeline(x.itemsize))
        return self._execute("reduce", name, problem, bufs, op, xp, True, finish)

    def barrier(self) -> None:
        """Wait until every rank has called ``barrier`` (a collective of its own: it takes a sequence number)."""
        self._begin()
        if self._check is not None:
            self._agree(None, "barrier", None)
        if self._watch is not None:
            self._watch.call("barrier", self._seq, "mpi", 0, None).finish([self._lib.Ibarrier()])
            return
        try:
            self._lib.Barrier()
        except MPI.Exception as e:
            collective_failed(f"barrier #{self._seq} (mpi)", self.rank, e)

    # -- point to point -----------------------------------------------------------------------------
    def send(self, x, dest: int, tag: int = 0) -> None:
        """Send ``x`` to ``dest``; the receiver passes an array of the same shape and dtype to ``recv``."""
        self.isend(x, dest, tag).wait()

    def recv(self, out, source: int, tag: int = 0):
        """Receive into ``out`` from ``source`` and return it."""
        return self.irecv(out, source, tag).wait()

    def isend(self, x, dest: int, tag: int = 0) -> Request:
        xp = args.array("isend", "x", x)
        dest = args.rank("isend", "dest", dest, self.size)
        tag = args.tag("isend", tag, self._tag_ub)
        xf = flat(x)
        backend.sync(xp)
        buf = backend.byte_view(xp.asnumpy(xf) if self._staging(xp) else xf, np if self._staging(xp) else xp)
        watch = None if self._watch is None else self._watch.message("send", dest, tag, xf.nbytes)
        return Request.of_mpi(self._p2p.Isend(buf, dest, tag), lambda: None, watch,
                              f"send to rank {dest}, tag {tag}", self.rank)

    def irecv(self, out, source: int, tag: int = 0) -> Request:
        xp = args.receive_buffer("irecv", out)
        source = args.rank("irecv", "source", source, self.size)
        tag = args.tag("irecv", tag, self._tag_ub)
        of = out.reshape(-1)
        staging = self._staging(xp)
        backend.sync(xp)  # a queued kernel writing `out` must not land on top of the message
        buf = np.empty(of.nbytes, np.uint8) if staging else backend.byte_view(of, xp)

        def finish():
            if staging:
                of[...] = xp.asarray(buf.view(of.dtype))
            return out
        watch = None if self._watch is None else self._watch.message("recv", source, tag, of.nbytes)
        return Request.of_mpi(self._p2p.Irecv(buf, source, tag), finish, watch,
                              f"receive from rank {source}, tag {tag}", self.rank)


# -- argument checks and result plumbing shared by the methods ------------------------------------------
_ndarray, _empty, _IN_PLACE = np.ndarray, np.empty, MPI.IN_PLACE   # the lean path's names, one global lookup each


def _lean_out(out, shape, x) -> bool:
    """Whether MPI may write ``out`` directly: the expected host array, contiguous, writable, and either ``x``
    itself (in place) or apart from it. Anything else takes the general path, which says what is wrong."""
    if type(out) is not np.ndarray or out.shape != shape or out.dtype != x.dtype:
        return False
    flags = out.flags
    if not (flags.c_contiguous and flags.writeable):
        return False
    # Two arrays that each allocated their own memory are apart: the common case, at a fraction of
    # np.may_share_memory's cost (views, and memory NumPy did not allocate, take the full test).
    return out is x or (flags.owndata and x.flags.owndata) or not np.may_share_memory(out, x)


def _dead():
    """A weak reference that has died: matches no array."""
    return None


def _even(counts, rows: int, size: int) -> bool:
    """``counts`` is a list of ``size`` Python ints, each ``rows`` (anything else: the general path checks it)."""
    return type(counts) is list and len(counts) == size and all(type(c) is int and c == rows for c in counts)


def _numbers(seqs: list[int]) -> str:
    """``#4 (ranks 0-2), #3 (rank 3)``: which ranks were at which call."""
    groups = sorted(ranks_by_value(seqs), key=lambda group: -group[0])
    return ", ".join(f"#{seq} ({ranks_text(ranks)})" for seq, ranks in groups)


def _gathered(rows: tuple[int, ...], trailing: tuple[int, ...]) -> tuple[tuple[int, ...], tuple[int, ...], int]:
    """Allgather of every rank's ``rows`` of shape ``trailing``: the result's shape, every rank's elements, their sum."""
    total = sum(rows)
    if not trailing:   # rows are elements
        return (total,), rows, total
    row = math.prod(trailing)
    return (total,) + trailing, tuple(c * row for c in rows), total * row


def _row_elems(x) -> int:
    return math.prod(x.shape[1:])


def _store(result, out, dtype):
    if out is None:
        return result.astype(dtype)
    out[...] = result
    return out


def _done(value, blocking):
    return value if blocking else Request.completed(value)


_UNOPENED = object()


def _target(out, shape, dtype, xp, x):
    """(array the schedule fills, its flat view).

    ``out`` itself when it is contiguous and either apart from ``x`` or exactly ``x``'s memory (in
    place, which the schedules honour); a strided ``out``, or one overlapping only part of ``x``, is
    filled by copy from a temporary afterwards.
    """
    if out is not None and out.flags.c_contiguous and (
            out is x or not xp.may_share_memory(out, x) or backend.same_buffer(out, x)):
        return out, out.reshape(-1)
    result = xp.empty(shape, dtype)
    return result, result.reshape(-1)


def _finisher(target, out, of, op, size, xp):
    """After the schedule: average if asked, copy into a strided ``out``, return the result."""
    def finish():
        if op == "avg":
            ops.finish_avg(of, size, xp)
        if out is not None and target is not out:
            out[...] = target
            return out
        return target
    return finish
