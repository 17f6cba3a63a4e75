"""The one path every checked collective call takes: MPI's own call or a schedule, observed in one place.

A Communicator owns one Runner: the library's private communicator, the call numbers, the buffer
pool, the shared-memory windows, and the observers a call may have (the watchdog under
``PYCOLLECT_TIMEOUT``, the tracer under ``PYCOLLECT_TRACE``; validation runs before, in the
Communicator's checks). ``run(call)`` takes a ``CollectiveCall`` (engine/call.py) and returns the
result, or a ``Request`` when the call is non-blocking; it never blocks a non-blocking call.

What the engine reads of a Runner is public: ``lib``, ``rank``, ``size``, ``seq``, ``watch`` and
``staging(xp)`` (engine/mpi_native.py, engine/trace.py).
"""
from __future__ import annotations

import dataclasses
import functools
from functools import lru_cache
from typing import Callable, cast

import numpy as np
from mpi4py import MPI

from .algorithms import registry
from .engine import backend, mpi_native, ops, trace
from .engine.abort import end_job
from .engine.backend import BufferPool, flat
from .engine.call import CollectiveCall
from .engine.executor import Execution, ObservedExecution
from .engine.observe import Observer, Observers, joined
from .engine.pairing import CallId, do_not_pair
from .engine.request import Request
from .engine.schedule import Problem
from .engine.shapes import segment_elements
from .engine.topology import Topology
from .engine.validate import ranks_by_value, ranks_text
from .engine.watchdog import Watchdog, allgather as watched_allgather
from .engine.window import NodeWindows, fingerprint

# The schedule a rank runs depends only on its Problem: build it once per shape.
_schedule = lru_cache(maxsize=512)(lambda collective, name, problem: registry.get_schedule(collective, name)(problem))


class Runner:
    """Runs a Communicator's checked calls on its private communicator ``lib`` (a duplicate: library traffic
    never matches the caller's messages)."""

    def __init__(self, lib: MPI.Intracomm, topology: Topology, *, segment_bytes: int, tree_segment_bytes: int,
                 overlap: bool, timeout: float | None, abort_on_timeout: bool):
        self.lib, self.topology = lib, topology
        self.rank, self.size = lib.Get_rank(), lib.Get_size()
        self.segment_bytes, self.tree_segment_bytes = segment_bytes, tree_segment_bytes
        self.overlap = overlap          # land segments one by one: only when every rank has a core
        self.seq = 0                    # every collective call takes the next number as it starts
        self.live: set[int] = set()     # tags of this rank's schedules in flight (engine/pairing.py)
        self.pool = BufferPool()
        self.windows: NodeWindows | None = None   # opened by the first call that asks (a "shm" call, shared_empty)
        self.windows_asked = False      # asked: windows stays None where the ranks of a node cannot share memory
        self._cuda_aware: bool | None = None
        self.watch = None if timeout is None else Watchdog(timeout, abort_on_timeout, self.rank, self.size)
        self.tracer = trace.from_env(self)   # collective when PYCOLLECT_TRACE is set (the clock alignment)
        # every observer of this runner's calls (engine/observe.py), attached here and by attach(); None: none
        self._attached: tuple[Observer, ...] = tuple(o for o in (self.watch, self.tracer) if o is not None)
        self.observers: Observers | None = joined(self._attached)

    @property
    def observed(self) -> bool:
        """Whether an observer follows every call (then no call may bypass the runner)."""
        return self.observers is not None

    def attach(self, observer: Observer) -> None:
        """Tell ``observer`` of every call from now on (a recording: Communicator.record)."""
        self._attached += (observer,)
        self.observers = joined(self._attached)

    def detach(self, observer: Observer) -> None:
        self._attached = tuple(o for o in self._attached if o is not observer)
        self.observers = joined(self._attached)

    def begin(self) -> int:
        """A collective call starts: it takes the next number, even if its arguments then fail, so that its tag
        never serves another call (engine/pairing.py)."""
        self.seq += 1
        return self.seq

    def staging(self, xp) -> bool:
        """Whether device arrays go through host memory (an MPI that is not CUDA-aware)."""
        if xp is np:
            return False
        if self._cuda_aware is None:
            self._cuda_aware = backend.cuda_aware(MPI)
        return not self._cuda_aware

    def free(self) -> None:
        if self.windows is not None:
            self.windows.free()
        self.windows, self.windows_asked = None, True   # freed: never opened again
        if self.tracer is not None:  # PYCOLLECT_TRACE: write this rank's file now
            self.tracer.flush()

    # -- running --------------------------------------------------------------------------------------
    def run(self, call: CollectiveCall):
        """The result of ``call`` (blocking), or a Request that returns it."""
        if self.observers is not None:   # the one check a call makes for its observers
            self.observers.before(call)
        if call.accumulate is not None:   # reduced in float32, stored back in x's dtype
            wide = call._replace(x=call.x.astype(call.accumulate), out=None, accumulate=None)
            result = self._run(wide)
            if call.blocking:
                return _store(result, call.out, call.dtype)
            return result.then(lambda reduced: _store(reduced, call.out, call.dtype))
        return self._run(call)

    def _run(self, call: CollectiveCall):
        if call.name == "mpi":
            if self.observers is None:
                return getattr(mpi_native, call.collective)(self, call)
            return self._observed_native(call)
        return self._schedule_run(call)

    def _observed_native(self, call: CollectiveCall):
        """MPI's own collective, its start and end told to the observers."""
        observers = self.observers
        assert observers is not None, "only an observed runner comes here"
        observers.start(call, None)
        result = getattr(mpi_native, call.collective)(self, call)
        if call.blocking:
            observers.after(call)
            return result
        return result.then(functools.partial(_told, observers, call))

    def _schedule_run(self, call: CollectiveCall):
        x, xp, name = call.x, call.xp, call.name
        assert name is not None, "a call reaches the runner resolved (engine/call.py)"
        xf = flat(x)
        bufs, finish = {"in": xf}, _nothing
        of = None
        if call.shape is not None:   # a result here (not a reduce off its root)
            target, of = _target(call.out, call.shape, x.dtype, xp, x)
            bufs["out"] = of
            finish = _finisher(target, call.out, of, call.op, self.size, xp)
        problem = self._problem(call, xf, of)
        if name == "shm":   # shared-memory windows where the ranks can have them, else the messages
            problem = self._window_problem(call, problem)
        sched = _schedule(call.collective, name, problem)
        start: Callable = Execution
        observers, watch = self.observers, None
        if observers is not None:   # an Execution that tells of its rounds; finish tells of the end
            observers.start(call, len(sched.rounds))
            start, finish = functools.partial(ObservedExecution, observers, call), _telling(observers, call, finish)
            watch = None if self.watch is None else self.watch.of(call)
        run = start(self.lib, sched, bufs, ops.ufunc(call.op, xp) if call.op else None, xp, self.pool,
                    self._segment(x.itemsize), self.staging(xp), self.overlap, watch,
                    call=CallId(call.collective, call.seq, name, self.rank), live=self.live, windows=self.windows)
        if call.blocking:
            run.wait()
            return finish()
        return Request(run, finish)

    def _problem(self, call: CollectiveCall, xf, of) -> Problem:
        """This rank's Problem: what the schedule of ``call`` depends on (Problem's defaults where a collective
        has no such field, so that equal calls share one cached schedule)."""
        collective = call.collective
        if collective == "alltoall":
            return Problem(self.rank, self.size, self.topology, n=xf.size, matrix=call.matrix or (),
                           aliased=bool(call.xp.may_share_memory(xf, of)))
        if collective == "allgather":
            return Problem(self.rank, self.size, self.topology, n=sum(call.counts or ()), counts=call.counts or ())
        segment = segment_elements(self.tree_segment_bytes, xf.itemsize)
        if collective == "reduce_scatter":
            return Problem(self.rank, self.size, self.topology, n=xf.size, counts=call.counts or (), tree_segment=segment)
        if collective == "allreduce":
            return Problem(self.rank, self.size, self.topology, n=xf.size, tree_segment=segment)
        return Problem(self.rank, self.size, self.topology, n=xf.size, root=call.root or 0, tree_segment=segment)

    def _segment(self, itemsize: int) -> int:
        return segment_elements(self.segment_bytes, itemsize)

    # -- shared-memory windows ------------------------------------------------------------------------
    def _window_problem(self, call: CollectiveCall, problem: Problem) -> Problem:
        """``problem`` with ``windows`` set where this call can use shared-memory windows: host arrays, every rank
        on one node (the windows are opened by the first call that asks: every rank asks at the same call), room
        for them; the ranks agree on it, and learn whose input lies in shared memory (engine/window.py)."""
        windows = self.node_windows(call.collective) if call.xp is np else None
        if windows is None:
            return problem
        windowed = dataclasses.replace(problem, windows=True)
        sched = _schedule(call.collective, "shm", windowed)
        if not any(rnd.window for rnd in sched.rounds):   # the same on every rank: no window, no agreement
            return problem
        x = call.x
        source = windows.locate(x) if sched.lends else (-1, 0)   # where peers may read x itself
        key = fingerprint(call.collective, problem, x.dtype)
        ident = CallId(call.collective, call.seq, "shm", self.rank)
        agreed = windows.agree(ident, key, sched.win * x.itemsize, self.watch, source)
        return windowed if agreed else problem

    def node_windows(self, collective: str) -> NodeWindows | None:
        """The windows on this rank's node, opened at the first call that needs them (every rank calls alike), or
        None where the ranks of a node (as the topology has them) cannot share memory."""
        if not self.windows_asked:
            # every rank at this call first (watched under a timeout): opening the windows blocks in MPI
            self.exchange((), collective, None)
            self.windows = NodeWindows.open(self.lib, self.topology.nodes[self.topology.node_of[self.rank]])
            self.windows_asked = True
        return self.windows

    # -- the small exchanges -------------------------------------------------------------------------
    def exchange(self, values, collective: str, out) -> tuple[list[list[int]], list[int]]:
        """Every rank's ``values`` (counts), column by column (``columns[j][i]``: rank i's ``values[j]``), and every
        rank's ``out`` rows (-1: none), as Python ints, in one small Allgather of the library's own; watched under a
        timeout. The call's number travels along: ranks whose calls do not pair up are found here, whatever
        algorithm follows (engine/pairing.py)."""
        send = np.array((self.seq, -1 if out is None else out.shape[0], *values), np.int64)
        table = np.empty((self.size, send.size), np.int64)   # (size, 2 + len(values))
        watched_allgather(self.lib, self.watch, send, table, collective, self.seq, "exchange of counts")
        seqs, out_rows, *columns = table.T.tolist()
        if seqs.count(self.seq) != self.size:
            end_job(do_not_pair(CallId(collective, self.seq, "exchange of counts", self.rank),
                                f"the ranks exchanged the counts of calls {_numbers(seqs)}"))
        return columns, out_rows


def _numbers(seqs: list[int]) -> str:
    """``#4 (ranks 0-2), #3 (rank 3)``: which ranks were at which call."""
    groups = sorted(((cast(int, seq), ranks) for seq, ranks in ranks_by_value(seqs)), key=lambda group: -group[0])
    return ", ".join(f"#{seq} ({ranks_text(ranks)})" for seq, ranks in groups)


def _nothing():
    return None


def _told(observers: Observer, call: CollectiveCall, result):
    """``result``, once the observers were told that ``call`` ended."""
    observers.after(call)
    return result


def _telling(observers: Observer, call: CollectiveCall, finish):
    """``finish``, then the observers told that ``call`` ended."""
    def told():
        result = finish()
        observers.after(call)
        return result
    return told


def _store(result, out, dtype):
    if out is None:
        return result.astype(dtype)
    out[...] = result
    return out


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
