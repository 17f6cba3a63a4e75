"""The one path every checked collective call takes: MPI's own call or a schedule, observed in one place.

A Communicator owns one Runner: the library's private communicator, the call numbers, the buffer
pool, the shared-memory windows, and the observers of its calls (engine/observe.py: the watchdog
under ``PYCOLLECT_TIMEOUT``, the tracer under ``PYCOLLECT_TRACE``, a recording while it lasts;
validation runs before, in the Communicator's checks). ``run(call)`` takes a ``CollectiveCall``
(engine/call.py) and returns the result, or a ``Request`` when the call is non-blocking;
``prepared`` runs a call that waits on small exchanges first, without blocking a non-blocking one;
``barrier(seq)`` is a barrier told to the observers (without any, the Communicator calls MPI itself).

A non-blocking call moves data only when a Request of its Communicator is tested or waited on
(a schedule's later rounds, a deferred call's steps), as before: ranks that wait on their Requests
in different orders should test them in a loop.

What the engine reads of a Runner is public: ``lib``, ``later``, ``rank``, ``size``, ``seq``,
``watch`` and ``staging(xp)`` (engine/mpi_native.py).
"""
from __future__ import annotations

import dataclasses
import functools
import itertools
import math
import threading
import warnings
import weakref
from collections import deque
from functools import lru_cache
from typing import Callable, NamedTuple, cast

import numpy as np
from mpi4py import MPI

from .algorithms import registry
from .engine import backend, counts, executor, mpi_native, ops, trace
from .engine.abort import end_job
from .engine.backend import BufferPool, flat
from .engine.call import CollectiveCall
from .engine.layout import extent
from .engine.executor import Execution, ObservedExecution, Plan, plan
from .engine.observe import Observer, Observers, joined
from .engine.errors import CollectiveError
from .engine.pairing import MPI_LEAST_TAG_UB, CallId, LiveTags, do_not_pair, end_job_on_a_stray
from .engine.progress import NAP_S, poll
from .engine.request import Request
from .engine.schedule import Problem, Schedule
from .engine.shapes import segment_elements
from .engine.topology import Topology
from .engine.validate import ranks_by_value, ranks_text
from .engine.watchdog import Watch, Watchdog, allgather as watched_allgather, wait_for
from .engine.window import NodeWindows, Slot, Ticket, fingerprint

# Collectives whose schedules run packed blocks, displacements placed around them (gather's and scatter's take them)
_PACKED = ("allgather", "alltoall")


class _NoData(NamedTuple):
    """The ``x`` of a call that hands in no data (a barrier), read as the observers read an array's."""
    shape: tuple = ()
    dtype: None = None
    nbytes: int = 0


NO_DATA = _NoData()

# The schedule a rank runs depends only on its Problem: build it once per shape.
_schedule = lru_cache(maxsize=512)(lambda collective, name, problem: registry.get_schedule(collective, name)(problem))
# A schedule's Plan (executor.py) for a segment size: the windowed calls' (a Runner keeps its others, _prepared).
_planned = lru_cache(maxsize=64)(lambda collective, name, problem, segment: (
    _schedule(collective, name, problem), plan(_schedule(collective, name, problem), segment)))
_MADE_KEPT = 512   # shapes of call a Runner keeps made (then it starts again)


class Runner:
    """Runs a Communicator's checked calls on its private communicator ``lib`` (a duplicate: library traffic
    never matches the caller's messages)."""

    def __init__(self, lib: MPI.Intracomm, topology: Topology, *, segment_bytes: int, tree_segment_bytes: int,
                 overlap: bool, timeout: float | None, abort_on_timeout: bool):
        self.lib, self.topology = lib, topology
        self.rank, self.size = lib.Get_rank(), lib.Get_size()
        self.segment_bytes, self.tree_segment_bytes = segment_bytes, tree_segment_bytes
        self.overlap = overlap          # land segments one by one: only when every rank has a core
        # Waits pause between tests once they last (ranks may outnumber cores), but not across nodes: MPI moves
        # bytes over TCP only while it is called, and a 4 MiB exchange between two nodes took 3-6x longer with the
        # pauses (bench/tcp_exchange.py).
        self.nap = 0.0 if topology.num_nodes > 1 else NAP_S
        self.seq = 0                    # every collective call takes the next number as it starts
        self.live = LiveTags(lib.Get_attr(MPI.TAG_UB) or MPI_LEAST_TAG_UB)   # tags of calls in flight (pairing.py)
        self.dropped: list[Request] = []   # Requests dropped in flight (engine/request.py): moved by begin(), free()
        self.native: weakref.WeakSet = weakref.WeakSet()   # MPI's own non-blocking calls in flight (their runs)
        self.failed: list = []   # what raised in flight (dropped Requests, interrupted calls, a watched wait's
        # requests): kept, never freed
        # both lists outlive a Communicator collected without free(): MPI may still write into their calls' buffers
        # (a dropped call's receives), which Python would free and hand to other arrays
        self._held = next(_HELD_KEYS)
        _HELD[self._held] = (self.dropped, self.failed)
        self.broken: str | None = None   # a call that ended in flight on this rank: every later call refused (break_off)
        self.ever_refused = False        # a call refused on this rank since the Communicator was made (refused)
        self.on_break: Callable[[], None] = _nothing   # the Communicator's: its lean paths off (they skip begin())
        # a call that raised on this rank before it sent anything (its arguments), not yet rechecked: the next call
        # first meets the other ranks on ``recheck`` (refused); the Communicator's lean paths wait for it (on_refusal)
        self.refusal: int | None = None
        self.recheck: MPI.Intracomm | None = None   # the Communicator's point-to-point one: no collective else uses it
        self.on_refusal: Callable[[], None] = _nothing
        self.on_rechecked: Callable[[], None] = _nothing
        # the rechecks non-blocking calls started since (a new one where this rank refused again after the last one
        # started: ``uncovered``), until a blocking call ends the refusal
        self.rechecks: list[_Recheck] = []
        self.uncovered: int | None = None
        # abort off: a timed-out call is left to MPI, which may still read and write its buffers when a late peer
        # comes, so every call hands MPI copies of the caller's arrays (_privately)
        self.private = timeout is not None and not abort_on_timeout
        self.pool = BufferPool()
        self._made: dict[tuple, tuple] = {}   # per shape of call: its Problem, schedule and Plan (_prepared)
        # the deferred steps of non-blocking calls, in call order, and the communicator of what they start (prepared)
        self.deferred: deque[_Deferred] = deque()
        # a thread runs the deferred steps at a time (advance: ``_advancing`` True); the others wait on the condition,
        # told as each call starts
        self._advancing = False
        self._advanced = threading.Condition()
        try:   # collective when PYCOLLECT_TRACE is set (every rank's directory checked, the clock alignment)
            self.tracer = trace.from_env(self)
        except OSError:   # a rank cannot write its trace directory: raised on every rank, none waits
            lib.Free()        # handed to this runner: the Communicator never gets it
            raise
        self.later = lib.Dup()
        # the exchanges of counts, started at their call: on a communicator of their own, where nothing but another
        # exchange (whose call number they compare) can pair with them. On ``lib`` a rank that refused a call then
        # exchanged with the others' pending MPI call (non-blocking, or watched: MPI matched the two) and they
        # returned its row as their data
        self.exchanges = lib.Dup()
        self.windows: NodeWindows | None = None   # opened by the first call that asks (a "shm" call, shared_empty)
        self.windows_asked = False      # asked: windows stays None where the ranks of a node cannot share memory
        self._cuda_aware: bool | None = None
        self.watch = None if timeout is None else Watchdog(timeout, abort_on_timeout, self.rank, self.size,
                                                           self.live, self.failed, self.break_off)
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
        never serves another call (engine/pairing.py). Calls whose Requests were dropped in flight move on first."""
        if self.dropped:
            self.settle_dropped(block=False)
        self.seq += 1
        if self.live:   # a call may not take a tag still in flight (engine/pairing.py)
            self.live.admit(self.seq)
        return self.seq

    def refused(self, seq: int) -> None:
        """Call #``seq`` raised on this rank before it sent anything (its arguments, checked here alone): the other
        ranks may have passed theirs and wait in it. MPI pairs its own collectives by order, so this rank's next call
        to one would pair with it: silently wrong results where the sizes match (a schedule's tags, the windows' and
        the exchanges' call numbers find it; MPI's own calls carry none). Its next blocking call to MPI's own first
        meets every rank of the Communicator in one small allgather of call numbers (``meet_after_refusal``): where
        every rank refused the same call they meet and go on; where the others wait in it, this rank waits too (to
        PYCOLLECT_TIMEOUT where set) instead of taking their data. The lean paths, which go to MPI straight, wait
        for it."""
        self.ever_refused = True   # its peers' messages for it may still come: free() keeps the context (comm.py)
        if self.broken is None and self.recheck is not None:
            if self.refusal is None:
                self.refusal = seq
                self.on_refusal()
            if self.uncovered is None:
                self.uncovered = seq

    def meet_after_refusal(self, seq: int) -> None:
        """Before blocking call #``seq`` goes to MPI's own collective (its data, a barrier, a neighbourhood call, a
        split, the windows' opening): the recheck, where this rank refused a call since the last one. A non-blocking
        call's start does not wait for it (MPI's rule: a rank may start one, then serve a peer's message the peer sends
        before starting its own; a helper's program hung there): it starts the recheck and goes behind it
        (``_behind_recheck``). Not before an exchange of counts, whose call number finds a refused call the others are
        exchanging for (the job ends naming both), where a recheck would wait for them in vain."""
        if self.refusal is not None:
            self._recheck(seq)

    def _recheck(self, seq: int) -> None:
        """Before blocking call #``seq`` goes to MPI's own collective after a refused call (``refused``): every rank
        at it (the recheck a non-blocking call started, where one did). The refusal ends here, at a blocking call,
        and so at the same call on every rank that refused alike: ended by the recheck's completion, which differs
        by rank, a later non-blocking call would go behind it on one rank and straight to MPI on another."""
        for recheck in self._rechecked(seq):
            recheck.wait()
        self.refusal, self.rechecks = None, []
        self.on_rechecked()

    def _rechecked(self, seq: int) -> list["_Recheck"]:
        """The rechecks in flight, one started now by call #``seq`` where this rank refused a call since the last one
        started: a rank that refused a call alone after the recheck of an earlier one (which every rank passed)
        would otherwise go on as if rechecked, its next call paired with the others' pending one."""
        if self.uncovered is not None:
            self.rechecks.append(_Recheck(self, seq, self.uncovered))
            self.uncovered = None
        return list(self.rechecks)

    def _behind_recheck(self, call: CollectiveCall) -> Request:
        """Non-blocking ``call`` to MPI's own after a refused call, started once the recheck has met every rank (from
        its Request's ``test()``/``wait()``, in call order with the other deferred calls, on ``later``): started at
        once, MPI would pair it by order with the others' pending call (under PYCOLLECT_TIMEOUT, where a watched MPI
        call is non-blocking inside, both returned the other's data without an error)."""
        rechecks = self._rechecked(call.seq)

        def steps():
            for recheck in rechecks:
                yield recheck, recheck.what
            return call
        deferred = _Deferred(self, call.collective, call.seq, steps())
        self._defer(deferred)
        self.live.add(self.live.of(call.seq))   # as prepared's; out again as it starts (MPI's own carries no tag)
        return Request(deferred, deferred.result, self.dropped, f"{call.collective} #{call.seq}")

    def break_off(self, why: str) -> None:
        """A call ended in flight on this rank (``why``: a timeout with abort off, an interrupt): MPI still holds its
        messages, and a late peer's next call would pair with them (MPI pairs its own collectives by order; a
        schedule's tags by call number, which a rank that skipped the call reaches one call later), so every later
        call on this rank is refused, collective or point-to-point (Communicator._live); free() goes ahead."""
        if self.broken is None:
            self.broken = why
            self.begin = functools.partial(_refuse_broken, why)  # type: ignore[method-assign]
            executor.let_go(self, lambda: True)   # its deferred calls start from their own Requests alone
            executor.forget_runs(self.live)        # and its calls in flight move in their own waits alone
            self.on_break()

    def left_in_flight(self, kept, label: str) -> None:
        """A wait of call ``label`` raised (an interrupt; a timeout with abort off, which broke the Communicator off
        already): ``kept`` holds what MPI may still read and write, never freed, and the Communicator takes no more
        calls (break_off)."""
        self.failed.append(kept)
        self.break_off(f"{label} was interrupted in flight")

    def settle_dropped(self, block: bool) -> None:
        """Test the calls whose Requests were dropped in flight, each once (``block``: wait for every one); each
        leaves the list as it completes. Only a call through the runner moves them: the lean paths go straight to
        MPI, which completes its own calls without help. One whose completion raises (validation's mismatch, a
        timeout with abort off) is told in a RuntimeWarning, not raised into the call that moved it, and kept alive,
        never moved again (``failed``: MPI may still hold its buffers), as is one dropped after its own ``test()``
        or ``wait()`` raised. An interrupt (KeyboardInterrupt) is raised. They go in call order, as the ranks start
        their calls: the list holds them in the order they were dropped, which a list of Requests
        deleted at once reverses (one rank then waited on its second call while the others moved their first)."""
        pending = sorted(self.dropped, key=lambda r: r.made)
        # emptied, never replaced: every Request made holds this list for its __del__ (a new one orphaned the Requests
        # made before it: dropped later, they landed on the old list, never completed, and free() refused them)
        self.dropped.clear()
        for i, request in enumerate(pending):
            if request.raised:   # its error was told when it raised; kept as it was
                self.failed.append(request)
                continue
            try:
                if block:
                    request.wait()
                done = block or request.test()
            except Exception as e:  # noqa: BLE001 (the dropped call's own error: nobody holds its Request)
                self.failed.append(request)
                warnings.warn(f"pycollect: {request.label or 'a call'}, whose Request was dropped, raised "
                              f"{type(e).__name__}: {e}", RuntimeWarning, stacklevel=2)
                continue
            except BaseException:
                self.failed.append(request)
                self.dropped[:0] = pending[i + 1:]
                raise
            if not done:
                self.dropped.append(request)
        if block and self.dropped:   # dropped while these completed
            self.settle_dropped(block)

    def staging(self, xp) -> bool:
        """Whether device arrays go through host memory (an MPI that is not CUDA-aware)."""
        if xp is np:
            return False
        if self._cuda_aware is None:
            self._cuda_aware = backend.cuda_aware(MPI)
        return not self._cuda_aware

    def free(self, keep: bool = False) -> None:
        """``keep``: the communicators that carry messages are kept, not freed (``Communicator.free``)."""
        # every later call fails here, before MPI: begin() replaced, so the calls before pay no check for it
        self.begin = _refuse_freed  # type: ignore[method-assign]
        self.complete_native()
        for comm in (self.later, self.exchanges):
            kept_or_free(comm, keep)
        if self.windows is not None:
            self.windows.free()
        self.windows, self.windows_asked = None, True   # freed: never opened again
        if not self.dropped and not self.failed:   # the dropped calls completed (Communicator.free); failed: kept
            _HELD.pop(self._held, None)
        if self.tracer is not None:  # PYCOLLECT_TRACE: write this rank's file now
            self.tracer.flush()

    def complete_native(self) -> None:
        """Wait for MPI's own non-blocking calls still in flight, before their communicators are freed: MPI says they
        complete after MPI_Comm_free, but Open MPI 5.0 crashed in the later wait. Every rank started them (they are
        collectives), so each wait returns; their Requests' own wait() then finds them done."""
        for run in list(self.native):
            if not getattr(run, "lost", False):   # one whose wait timed out (abort off) would time out again here
                run.wait()

    # -- running --------------------------------------------------------------------------------------
    def barrier(self, seq: int) -> None:
        """Barrier ``seq`` with observers (the Communicator's lean path calls MPI itself): MPI's own, told to them as a
        call that hands in nothing (no elements, no dtype), under the watchdog polled to its deadline."""
        observers = self.observers
        assert observers is not None, "only an observed runner comes here"
        self.meet_after_refusal(seq)
        call = CollectiveCall("barrier", seq, NO_DATA, np, None)
        observers.before(call)
        observers.start(call, None)
        if self.watch is not None:
            self.watch.of(call).finish([self.lib.Ibarrier()])
        else:
            self.lib.Barrier()
        observers.after(call)

    def run(self, call: CollectiveCall):
        """The result of ``call`` (blocking), or a Request that returns it."""
        if self.observers is not None:   # the one check a call makes for its observers
            self.observers.before(call)
        return self._start(call)

    def _start(self, call: CollectiveCall):
        if self.refusal is not None and call.name == "mpi" and not call.blocking and not call.late:
            return self._behind_recheck(call)   # a late call's exchange compared the call numbers
        if self.private:
            return self._privately(call)
        return self._started(call)

    def _privately(self, call: CollectiveCall):
        """``call`` run on copies of its ``x`` and ``out`` (one copy where they are one array: in place stays in place),
        the result then copied into ``out``: a call that times out leaves MPI pycollect's copies (kept in ``failed``),
        never the caller's arrays, so nothing is written into them after the exception, and a late peer receives
        what they held at the call."""
        copies: dict[int, object] = {}

        def own(a):
            if a is None:
                return None
            if id(a) not in copies:
                copies[id(a)] = a.copy()
            return copies[id(a)]
        x = own(call.x)
        # an out that is a block of x (reduce_scatter in place) stays one of x's copy: the schedule keeps its in-place
        # operand order (a copy apart ran out of place: complex products differed in the last bit)
        out = _block_of_copy(call.x, x, call.out) if call.out is not None and call.out is not call.x else own(call.out)
        started = self._started(call._replace(x=x, out=out))
        back = functools.partial(_handed_back, call.out)
        return back(started) if call.blocking else started.then(back)

    def _started(self, call: CollectiveCall):
        if call.accumulate is not None:   # reduced in float32, stored back in x's dtype
            wide = call._replace(x=call.x.astype(call.accumulate), out=None, accumulate=None)
            result = self._run(wide)
            if call.blocking:
                return _store(result, call.out, call.dtype)
            return result.then(lambda reduced: _store(reduced, call.out, call.dtype))
        if call.name != "mpi" and call.collective in _PACKED and (call.displs is not None or call.send_displs is not None):
            return self._displaced(call)
        return self._run(call)

    def _displaced(self, call: CollectiveCall):
        """A schedule's call with displacements (MPI's own takes them as they are): alltoall's blocks of ``x`` packed
        first, in rank order; the blocks received packed, then placed at ``displs``."""
        x, matrix = call.x, call.matrix or ()   # alltoall's matrix; allgather's blocks are its counts
        if call.send_displs is not None:
            xf = flat(x)
            x = call.xp.concatenate([xf[d:d + n] for n, d in zip(matrix[self.rank], call.send_displs)])   # (sum sent,)
        if call.displs is None:
            return self._run(call._replace(x=x, send_displs=None))
        received = call.counts or () if call.collective == "allgather" else tuple(r[self.rank] for r in matrix)
        packed = self._run(call._replace(x=x, shape=(sum(received),), out=None, displs=None, send_displs=None))
        place = functools.partial(_place, call, received)
        return place(packed) if call.blocking else packed.then(place)

    def _run(self, call: CollectiveCall):
        if call.name == "mpi":
            if self.refusal is not None and call.blocking and not call.late:   # a late call's exchange compared them
                self._recheck(call.seq)
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
            target, of = _target(call.out, call.shape, x.dtype, xp, x, _uncovered(call), self._block_in_place(call))
            bufs["out"] = of
            finish = _finisher(target, call.out, of, call.op, self.size, xp)
        if self.observers is not None:   # finish tells of the end
            finish = _telling(self.observers, call, finish)
        problem, made = self._prepared(call, xf, of)
        run: Execution | _WindowedRun | None = None
        if name == "shm" and not call.late:   # shared-memory windows where the ranks can have them, else the messages
            # (a deferred call's agreement on them would come out of call order: its messages then)
            run = self._windowed(call, problem, bufs)
        if run is None:
            run = self.execution(call, problem, bufs, None, made)
        if call.blocking:
            try:
                run.wait()
            except BaseException:   # interrupted, or the watchdog's timeout with abort off: the call is over here
                self.live.discard(self.live.of(call.seq))
                self.left_in_flight(run, f"{call.collective} #{call.seq} ({name})")
                raise
            return finish()
        if type(run) is Execution and run.watch is None and run.slot is None:
            run.movable()   # other waits move it on (executor.move_others): not a windowed, watched or observed run
        return Request(run, finish, self.dropped, f"{call.collective} #{call.seq} ({name})")

    def execution(self, call: CollectiveCall, problem: Problem, bufs: dict, slot: Slot | None,
                  made: tuple[Schedule, Plan] | None = None) -> Execution:
        """``call``'s schedule for ``problem`` started (in ``slot`` when it has window rounds), its observers told;
        ``made``: that schedule and its Plan when the caller has them (``_prepared``)."""
        sched, planned = made if made is not None else _planned(call.collective, call.name, problem,
                                                                 self._segment(call.x.itemsize))
        start: Callable = Execution
        observers, watch = self.observers, None
        if observers is not None:   # an Execution that tells of its rounds
            observers.start(call, len(sched.rounds))
            start = functools.partial(ObservedExecution, observers, call)
            watch = None if self.watch is None else self.watch.of(call)
        xp = call.xp
        run = start(self.lib, sched, bufs, ops.ufunc(call.op, xp) if call.op else None, xp, self.pool,
                    self._segment(call.x.itemsize), self.staging(xp), self.overlap, watch,
                    call=CallId(call.collective, call.seq, cast(str, call.name), self.rank), live=self.live, slot=slot,
                    nap=self.nap, planned=planned)
        try:
            return run.begin()
        except BaseException:   # interrupted while it posted its first round (an error there ends the job)
            self.live.discard(run.tag)
            self.left_in_flight(run, f"{call.collective} #{call.seq} ({call.name})")
            raise

    def _prepared(self, call: CollectiveCall, xf, of) -> tuple[Problem, tuple[Schedule, Plan]]:
        """This rank's Problem for ``call`` (what its schedule depends on), and the schedule with its Plan: made once
        per shape of call (collective, algorithm, element size and the Problem's fields), then looked up, so that a
        repeated call builds none of them."""
        key = (call.collective, call.name, xf.itemsize, self._problem_fields(call, xf, of))
        made = self._made.get(key)
        if made is None:
            if len(self._made) >= _MADE_KEPT:
                self._made.clear()
            problem = Problem(self.rank, self.size, self.topology, *key[3])
            sched = _schedule(call.collective, call.name, problem)
            made = self._made[key] = (problem, (sched, plan(sched, self._segment(xf.itemsize))))
        return made

    def _block_in_place(self, call: CollectiveCall) -> bool:
        """Whether ``call`` is in place by blocks: an allgather (a gather on its root) whose ``x`` is exactly its
        ``out``'s block ``rank`` (``root``), or a reduce-scatter (a scatter on its root) whose ``out`` is exactly
        its ``x``'s block ``rank`` (``root``): nccl-tests' and MPI_IN_PLACE's forms. Their schedules honour it: a
        gathering one writes over its own block only with its own elements, a scattering one writes ``out`` only
        by copying its own block there, and a reduce-scatter writes ``out`` only where it reads the same elements
        of ``x`` for the last time (its last reduction, or a copy after its last round)."""
        x, out, counts, collective = call.x, call.out, call.counts, call.collective
        if out is None or call.displs is not None or not counts:
            return False
        rank = call.root if collective in ("gather", "scatter") else self.rank
        if collective in ("allgather", "gather") and rank == self.rank:
            return backend.lies_at(x, out, sum(counts[:rank]) * x.itemsize)
        if collective in ("reduce_scatter", "scatter") and rank == self.rank:
            return backend.lies_at(out, x, sum(counts[:rank]) * x.itemsize)
        return False

    def _problem_fields(self, call: CollectiveCall, xf, of) -> tuple:
        """The fields of this rank's Problem after its topology: ``(n, counts, displs, matrix, root, tree_segment,
        aliased)``, Problem's defaults where a collective has no such field, so that equal calls share one schedule."""
        collective = call.collective
        if collective == "alltoall":
            return xf.size, (), (), call.matrix or (), 0, 0, bool(call.xp.may_share_memory(xf, of))
        if collective == "allgather":
            counts = call.counts or ()
            return sum(counts), counts, (), (), 0, 0, True
        if collective in ("gather", "scatter"):   # n: the extent of the blocks in the root's buffer, on every rank
            counts, displs = call.counts or (), call.displs or ()
            n = extent(counts, displs or None)
            return n, counts, displs, (), call.root or 0, 0, True
        segment = segment_elements(self.tree_segment_bytes, xf.itemsize)
        if collective == "reduce_scatter":
            return xf.size, call.counts or (), (), (), 0, segment, True
        if collective == "allreduce":
            return xf.size, (), (), (), 0, segment, True
        return xf.size, (), (), (), call.root or 0, segment, True

    def _segment(self, itemsize: int) -> int:
        return counts.capped(segment_elements(self.segment_bytes, itemsize), itemsize)

    # -- shared-memory windows ------------------------------------------------------------------------
    def _windowed(self, call: CollectiveCall, problem: Problem, bufs: dict) -> "_WindowedRun | None":
        """The run of a ``shm`` call through shared-memory windows where it can have them: host arrays, every rank
        on one node (the windows are opened by the first blocking call that asks: every rank asks at the same call;
        a non-blocking one never opens them, which would wait), a schedule with window rounds; None: messages. Its
        agreement starts now, in call order, and settles when the call runs (engine/window.py)."""
        if call.xp is not np or not (call.blocking or self.windows_asked):
            return None
        windows = self.node_windows(call.collective)
        if windows is None:
            return None
        windowed = dataclasses.replace(problem, windows=True)
        sched = _schedule(call.collective, "shm", windowed)
        if not any(rnd.window for rnd in sched.rounds):   # the same on every rank: no window, no agreement
            return None
        x = call.x
        source = windows.locate(x) if sched.lends else (-1, 0)   # where peers may read x itself
        puts = any(rnd.puts for rnd in sched.rounds)
        out = bufs.get("out")   # where owners may write the result (a schedule that puts, engine/schedule.py)
        sink = windows.locate(out) if out is not None and puts else (-1, 0)
        key = fingerprint(call.collective, problem, x.dtype, call.op, call.accumulate)
        ticket = windows.enter(CallId(call.collective, call.seq, "shm", self.rank), key, sched.win * x.itemsize, source,
                               grows=call.blocking, sink=sink,
                               room=_publishes(sched, source[0] >= 0) or (puts and sink[0] < 0))
        return _WindowedRun(self, call, problem, windowed, bufs, ticket)

    def node_windows(self, collective: str) -> NodeWindows | None:
        """The windows on this rank's node, opened at the first call that needs them (every rank calls alike), or
        None where the ranks of a node (as the topology has them) cannot share memory."""
        if not self.windows_asked:
            # every rank at this call first (watched under a timeout): opening the windows blocks in MPI
            self.exchange((), collective, None)
            self.meet_after_refusal(self.seq)   # MPI's own collectives next, on lib: as a blocking call's
            if self.watch is not None:
                # ... and once more: a late rank's exchange pairs with the one its peers timed out in and left to MPI
                # (the call numbers agree), then it waited in MPI_Comm_split_type for ever; here it times out
                wait_for(self.lib.Ibarrier(), self.watch, collective, self.seq, "opening of the shared-memory windows")
            self.windows = NodeWindows.open(self.lib, self.topology.nodes[self.topology.node_of[self.rank]])
            self.windows_asked = True
        return self.windows

    # -- calls whose start waits on small exchanges ------------------------------------------------------
    def prepared(self, collective: str, seq: int, call: CollectiveCall | None, steps, blocking: bool):
        """Run the call that ``steps`` completes: a generator that yields ``(MPI request, what it is)`` pairs to wait
        for (a count exchange, validation's agreement) and returns the checked CollectiveCall. ``call`` is the call as
        far as the checks know it (observers' ``before``; None when this rank's checks failed).

        Blocking: the steps are waited for now. Non-blocking: the steps run up to their first yield now -- what they
        start there (on ``lib``, or ``exchanges``) starts in call order on every rank -- and this returns a Request at
        once; the rest runs from the Request's ``test()``/``wait()``, after the rest of every earlier such call, so it
        starts in call order too: what it starts goes on ``later``, which nothing else uses (engine/mpi_native.py), and
        its schedule on the call's tag. MPI's rule that collectives on one communicator start in the same order on every
        rank holds on both, whichever order the Requests are waited in.
        """
        if self.observers is not None and call is not None:
            self.observers.before(call)
        if blocking:
            try:
                ready = self._drive(collective, seq, steps)
            except TakesPartThenRaises as verdict:   # this rank's own argument, judged after the exchange
                self._start(verdict.call)
                raise verdict.error from None
            return self._start(ready)
        deferred = _Deferred(self, collective, seq, steps)
        if deferred.call is not None:   # no wait was needed after all: it starts now, in call order
            started = self._start(deferred.call)
            if deferred.error_after is not None:   # TakesPartThenRaises: the error once the call ended
                return started.then(functools.partial(_raise, deferred.error_after))
            return started
        self._defer(deferred)
        self.live.add(self.live.of(seq))   # its peers' messages may come before it starts: not a past call's
        return Request(deferred, deferred.result, self.dropped, f"{collective} #{seq}")

    def _defer(self, deferred: "_Deferred") -> None:
        """Queue a call whose steps wait: it starts from its Request, a later deferred call's, or any wait of the
        process (``move_held``), in call order."""
        self.deferred.append(deferred)
        executor.held_back(self)

    def move_held(self) -> None:
        """From another call's wait (executor.move_others): start, without blocking, the deferred calls whose steps have
        ended, in call order, so that a peer already waiting in one of them is met (not once broken off)."""
        if self.broken is not None:
            return
        try:
            last = self.deferred[-1]
        except IndexError:
            return
        self.advance(last, block=False)

    def _drive(self, collective: str, seq: int, steps) -> CollectiveCall:
        """The steps of a blocking call, each request waited for (watched under a timeout)."""
        try:
            step = next(steps)
            while True:
                try:
                    self.wait_step(step, collective, seq)
                except BaseException:   # interrupted, or timed out with abort off: the step's request kept
                    self.left_in_flight(steps, f"{collective} #{seq}")
                    raise
                step = next(steps)
        except StopIteration as done:
            return done.value

    def wait_step(self, step, collective: str, seq: int) -> None:
        """Wait for one ``(request, what)`` of a call's steps; under a timeout to the deadline, naming ``what``."""
        if isinstance(step[0], _Recheck):   # watched, and looking for a peer's message of the refused call
            step[0].wait()
        else:
            wait_for(step[0], self.watch, collective, seq, step[1])

    def advance(self, target: "_Deferred", block: bool) -> bool:
        """Run the deferred steps in call order up to and including ``target``'s; False when a step is still waiting
        (``block`` False), or another thread is running them. One thread at a time: two Requests waited in two
        threads at once each took the queue's head, waited on one MPI request together and popped twice (MPI's
        internal error, then a hang); now the second waits for the first (its steps run in call order anyway).
        It waits until its own call starts, not until the first thread is done: that thread may go on into a later
        call's step (validation's agreement, then an exchange of counts) that the peers reach only once this call
        moves on here; waiting for the whole of it hung (found by a helper's fuzzing)."""
        with self._advanced:
            while not self._taken_up(target):
                if not self._advancing:
                    self._advancing = True
                    break
                if not block:
                    return False
                self._advanced.wait()
            else:
                return True
        try:
            while target.call is None and target.error is None:
                head = self.deferred[0]
                if not head.advance(block):
                    return False
                self.deferred.popleft()
                executor.let_go(self, lambda: not self.deferred)
                self._start_deferred(head)
                with self._advanced:   # its waiter goes on
                    self._advanced.notify_all()
            return True
        finally:
            with self._advanced:
                self._advancing = False
                self._advanced.notify_all()

    @staticmethod
    def _taken_up(target: "_Deferred") -> bool:
        """Whether ``target``'s steps ended and it started (or failed): nothing left for ``advance`` to do."""
        return target.request is not None or target.error is not None

    def _start_deferred(self, head: "_Deferred") -> None:
        """Start a deferred call whose steps ended. Its tag, in ``live`` since the call was made, stays there while a
        schedule's run takes it over (its Execution holds it until it ends): taken out first, a thread waiting on a
        later call in the meantime read this call's early messages as a past call's and ended the job (a race once
        Requests could be waited in several threads at once). Out once nothing holds it: an error, or MPI's own call."""
        tag = self.live.of(head.seq)
        if head.call is None:
            self.live.discard(tag)
            return
        try:
            head.request = self._start(head.call._replace(late=True))
        except BaseException:
            self.live.discard(tag)
            raise
        if head.call.name == "mpi":   # MPI pairs its own calls without tags
            self.live.discard(tag)

    # -- the small exchanges -------------------------------------------------------------------------
    def exchange(self, values, collective: str, out) -> tuple[list[list[int]], list[int]]:
        """Every rank's ``values`` (counts), column by column (``columns[j][i]``: rank i's ``values[j]``), and every
        rank's ``out`` rows (-1: none), as Python ints, in one small Allgather of the library's own; watched under a
        timeout (``start_exchange``). Made here, not through an ``_Exchange``: the blocking allgather without counts
        pays it on every call."""
        send = _exchange_row(self.seq, values, out)
        table = np.empty((self.size, send.size), np.int64)   # (size, 2 + len(values))
        watched_allgather(self.exchanges, self.watch, send, table, collective, self.seq, "exchange of counts")
        return exchanged(table, self.seq, collective, self.rank)

    def start_exchange(self, values, collective: str, out, comm: MPI.Intracomm, seq: int,
                       blocking: bool = False) -> "_Exchange":
        """Start the exchange ``exchange`` describes for call ``seq`` on ``comm`` (``exchanges``, or ``later`` for a
        deferred step: validation's agreement before it); ``blocking``: done on return (its ``step`` None). The call's
        number travels along: ranks whose calls do not pair up are found here, whatever algorithm follows
        (engine/pairing.py)."""
        return _Exchange(comm, seq, self.size, self.rank, values, collective, out, blocking, self.watch)


class _Exchange:
    """One small exchange of counts in flight: ``step`` is its (request, what), ``read()`` its result once done."""

    def __init__(self, comm: MPI.Intracomm, seq: int, size: int, rank: int, values, collective: str, out,
                 blocking: bool, watch: Watchdog | None):
        self.seq, self.rank, self.collective = seq, rank, collective
        self.send = _exchange_row(seq, values, out)
        self.table = np.empty((size, self.send.size), np.int64)   # (size, 2 + len(values))
        self.step: tuple | None = None
        if blocking:   # watched when the watchdog is on: MPI's Allgather, a few microseconds below Iallgather + Wait
            watched_allgather(comm, watch, self.send, self.table, collective, seq, "exchange of counts")
        else:   # the step to wait for
            self.step = (comm.Iallgather(self.send, self.table), "exchange of counts")

    def read(self) -> tuple[list[list[int]], list[int]]:
        return exchanged(self.table, self.seq, self.collective, self.rank)


def _exchange_row(seq: int, values, out) -> np.ndarray:
    """What a rank sends in an exchange of counts: the call's number, ``out``'s rows (-1: none), ``values``."""
    return np.array((seq, -1 if out is None else out.shape[0], *values), np.int64)


def exchanged(table: np.ndarray, seq: int, collective: str, rank: int) -> tuple[list[list[int]], list[int]]:
    """An exchange's table read as ``(columns, out_rows)``; ranks at another call end the job naming them."""
    seqs, out_rows, *columns = table.T.tolist()
    if seqs.count(seq) != len(seqs):
        end_job(do_not_pair(CallId(collective, seq, "exchange of counts", rank),
                            f"the ranks exchanged the counts of calls {_numbers(seqs)}"))
    return columns, out_rows


def _publishes(sched: Schedule, lent: bool) -> bool:
    """Whether this rank copies anything into its slot whatever its peers' arrays (``lent``: its input lies in
    shared memory): a window round with sends that are not its lent input's nor those a puts round spares."""
    return any(rnd.window and rnd.sends and not (rnd.from_input and lent) and not (rnd.puts and not rnd.from_input)
               for rnd in sched.rounds)


class _WindowedRun:
    """A ``shm`` call's run: its window agreement in flight, then the Execution of the schedule it settled on (the
    windows in its slot, or the messages). Holds its slot from the time it is seated (``NodeWindows.settle``)."""

    def __init__(self, runner: Runner, call: CollectiveCall, problem: Problem, windowed: Problem, bufs: dict,
                 ticket: Ticket):
        self.runner, self.call, self.problem, self.windowed, self.bufs = runner, call, problem, windowed, bufs
        self.ticket, ticket.holder = ticket, self
        self.execution: Execution | None = None
        # one thread at a time moves it on: its Request's thread, or a later call's seat finishing the slot's holder
        # (two threads testing one MPI request at once is erroneous in MPI)
        self._lock = threading.RLock()
        self.tag = runner.live.of(call.seq)
        runner.live.add(self.tag)   # its peers' messages may come before its Execution starts: not a past call's

    def _started(self, block: bool) -> bool:
        if self.execution is None:
            windows = self.runner.windows
            assert windows is not None, "a windowed run was entered in the runner's windows"
            if not windows.settle(self.ticket, block, self.runner.watch):
                return False
            slot = self.ticket.slot   # held by this run since its seat: finished through it (its lock)
            self.execution = self.runner.execution(self.call, self.windowed if slot else self.problem, self.bufs, slot)
        return True

    @property
    def done(self) -> bool:
        return self.execution is not None and self.execution.done

    def test(self) -> bool:
        if not self._lock.acquire(blocking=False):   # another thread is moving it on (a later call's seat)
            return False
        try:
            if self._started(False) and cast(Execution, self.execution).test():
                self._let_go()
                return True
            return False
        finally:
            self._lock.release()

    def wait(self) -> None:
        # settled first, outside its lock: the windows' lock is taken before a run's, never inside one (a later
        # call's seat holds the windows' lock and waits for this run's to finish it; a thread that held this run's
        # lock and waited for the windows' one hung with it, found by a helper's fuzzing)
        windows = self.runner.windows
        if self.execution is None and windows is not None:
            windows.settle(self.ticket, True, self.runner.watch)
        with self._lock:
            self._started(True)   # settled: no windows' lock taken here
            cast(Execution, self.execution).wait()
            self._let_go()

    def _let_go(self) -> None:
        """Done: its slot no longer held, nor its buffers from the slot (a ``shared_empty`` input among them, whose
        window free() and the next shared_empty release once no array uses it: held, it stayed to the end)."""
        slot = self.ticket.slot
        if slot is not None and slot.holder is self:
            slot.holder = None
        self.ticket.holder = None


class TakesPartThenRaises(Exception):
    """A call's steps found this rank's own argument wrong only once an exchange told them enough (alltoall's
    ``recv_displs`` and ``out``, judged against the rows every rank sends here): the rank takes part in ``call``
    (the same messages, its result into a scratch array) so that no peer waits for it, then raises ``error``;
    nothing is written into its arrays."""

    def __init__(self, call: CollectiveCall, error: Exception):
        super().__init__(str(error))
        self.call, self.error = call, error


class _Recheck:
    """The meeting after a refused call (Runner.refused), started by the first call to MPI's own after it: every
    rank's call number and that of the first call it refused since the last recheck started, in one small
    Iallgather on ``recheck``. ``wait()`` (one thread at a time; ``Test()`` from the others says not yet) checks
    the table once it is complete: ranks at other calls, or past other refused calls, end the job naming them."""

    def __init__(self, runner: Runner, seq: int, refused: int):
        self.runner, self.seq = runner, seq
        self.what = f"recheck after call #{refused} raised here"
        self.call = CallId("call", seq, self.what, runner.rank)
        self.mine = np.array([seq, refused], np.int64)   # held until the request completes
        self.table = np.empty((runner.size, 2), np.int64)
        self.request = cast(MPI.Intracomm, runner.recheck).Iallgather(self.mine, self.table)
        self.done = False
        self._lock = threading.Lock()

    def Test(self) -> bool:
        if not self._lock.acquire(blocking=False):   # another thread waits for it
            return False
        try:
            if not self.done and self.request.Test():
                self._check()
            return self.done
        finally:
            self._lock.release()

    def wait(self) -> None:
        with self._lock:
            if self.done:
                return
            runner = self.runner
            # a peer still in the refused call, where it is a schedule's: its messages say so
            peers = [q for q in range(runner.size) if q != runner.rank]
            look = functools.partial(end_job_on_a_stray, runner.lib, peers, self.call, runner.live)
            if runner.watch is None:
                poll([self.request], look=look, nap=runner.nap)
            else:
                Watch(runner.watch, "call", self.seq, self.call.algorithm, 0, None).wait([self.request], look=look)
            self._check()

    def _check(self) -> None:
        table = self.table
        if table[:, 0].min() != table[:, 0].max() or table[:, 1].min() != table[:, 1].max():
            # the same call, and the same refused one: a rank that refused a call the others ended without it (a
            # broadcast's leaf) and then refused one with them would pass on the numbers alone, MPI's message of
            # the call it refused still waiting for its next call of that kind
            seqs = ", ".join(f"#{q} after #{f} (rank {r})" for r, (q, f) in enumerate(table.tolist()))
            end_job(do_not_pair(self.call, f"the ranks that raised came to calls {seqs}, the calls they refused first"))
        self.done = True


class _Deferred:
    """A non-blocking call's steps after their first wait (Runner.prepared): the run of its Request until the call
    starts, then its Request's. An error of the steps (a mismatch, a wrong ``out``) is raised by ``test()`` and
    ``wait()``; nothing was written into the caller's arrays."""

    def __init__(self, runner: Runner, collective: str, seq: int, steps):
        self.runner, self.collective, self.seq, self.steps = runner, collective, seq, steps
        self.call: CollectiveCall | None = None   # once the steps returned it
        self.request: Request | None = None       # the call's, once started
        self.error: Exception | None = None
        self.error_after: Exception | None = None   # raised once the call (a scratch one: TakesPartThenRaises) ended
        self.step: tuple = (MPI.REQUEST_NULL, "")   # the (request, what) the steps wait for
        try:
            self.step = next(steps)                # up to the first yield: now, in call order (on lib)
        except StopIteration as done:
            self.call = done.value
        except TakesPartThenRaises as verdict:
            self.call, self.error_after = verdict.call, verdict.error

    def advance(self, block: bool) -> bool:
        """Run the steps while their requests complete (waiting when ``block``); True once they ended."""
        try:
            while True:
                if block:
                    self.runner.wait_step(self.step, self.collective, self.seq)
                elif not self.step[0].Test():
                    return False
                self.step = next(self.steps)
        except StopIteration as done:
            self.call = done.value
        except TakesPartThenRaises as verdict:
            self.call, self.error_after = verdict.call, verdict.error
        except CollectiveError:
            raise   # the watchdog's (PYCOLLECT_TIMEOUT_ABORT=0)
        except Exception as e:  # noqa: BLE001 (the call's error: raised from its Request)
            self.error = e
        return True

    def test(self) -> bool:
        if not self.runner.advance(self, block=False):
            return False
        return self._started().test()

    def wait(self) -> None:
        self.runner.advance(self, block=True)
        self._started().wait()

    def _started(self) -> Request:
        if self.error is not None:
            raise self.error
        assert self.request is not None, "Runner.advance starts the call once its steps ended"
        return self.request

    def result(self):
        got = self._started().wait()
        if self.error_after is not None:
            raise self.error_after
        return got


def _numbers(seqs: list[int]) -> str:
    """``#4 (ranks 0-2), #3 (rank 3)``: which ranks were at which call."""
    groups = sorted(((cast(int, seq), ranks) for seq, ranks in ranks_by_value(seqs)), key=lambda group: -group[0])
    return ", ".join(f"#{seq} ({ranks_text(ranks)})" for seq, ranks in groups)


def _nothing():
    return None


def _raise(error: Exception, _result):
    raise error


def _told(observers: Observer, call: CollectiveCall, result):
    """``result``, once the observers were told that ``call`` ended."""
    observers.after(call)
    return result


def _telling(observers: Observer, call: CollectiveCall, finish):
    """``finish``, then the observers told that ``call`` ended."""
    return lambda: _told(observers, call, finish())


def _block_of_copy(x, copy, out):
    """``out``'s copy for a private call: where ``out`` is a contiguous stretch of a C-contiguous NumPy ``x``, the same
    stretch of ``copy`` (x's copy); else a copy of its own."""
    if type(x) is not np.ndarray or type(out) is not np.ndarray or not (x.flags.c_contiguous and out.flags.c_contiguous):
        return out.copy()
    at = out.__array_interface__["data"][0] - x.__array_interface__["data"][0]
    if out.dtype != x.dtype or at < 0 or at + out.nbytes > x.nbytes or at % x.itemsize:
        return out.copy()
    start = at // x.itemsize
    return copy.reshape(-1)[start:start + out.size].reshape(out.shape)


def _handed_back(out, result):
    """A private call's ``result`` (Runner._privately) as the caller's: copied into ``out`` when given (None, no
    result here: ``out`` untouched)."""
    if out is None or result is None:
        return result
    out[...] = result
    return out


def _store(result, out, dtype):
    if result is None:   # a reduce off its root
        return None
    if out is None:
        return result.astype(dtype)
    out[...] = result
    return out


def _place(call: CollectiveCall, received: tuple, packed):
    """The blocks received one after another in ``packed`` (flat; ``received`` elements from each rank) at their
    displacements: in ``out``, or a new result with zeros between them."""
    assert call.shape is not None and call.displs is not None, "a call with displacements has a result here"
    target = call.out if call.out is not None else call.xp.zeros(call.shape, call.dtype)
    trailing = call.shape[1:]
    row, at = math.prod(trailing), 0
    for n, d in zip(received, call.displs):
        if n:   # rows, not a flat view: a strided out is written where it lies
            target[d // row:(d + n) // row] = packed[at:at + n].reshape((n // row,) + trailing)
        at += n
    return target


def _target(out, shape, dtype, xp, x, uncovered: bool = False, by_blocks: bool = False):
    """(array the schedule fills, its flat view).

    ``out`` itself when it is contiguous and either apart from ``x``, or exactly ``x``'s memory, or in place
    ``by_blocks`` (Runner._block_in_place): in place, which the schedules honour. A strided ``out``, or one
    overlapping ``x`` otherwise, is filled by copy from a temporary afterwards. Where the schedule leaves elements
    ``uncovered`` (a gather with gaps between its blocks) the temporary starts as a copy of ``out``, or zeros: those
    keep what they held.
    """
    if out is not None and out.flags.c_contiguous and (
            out is x or not xp.may_share_memory(out, x) or backend.same_buffer(out, x) or by_blocks):
        return out, out.reshape(-1)
    if uncovered:
        result = xp.zeros(shape, dtype) if out is None else xp.array(out, order="C")
    else:
        result = xp.empty(shape, dtype)
    return result, result.reshape(-1)


def _uncovered(call: CollectiveCall) -> bool:
    """Whether the schedule of ``call`` writes only part of its result: a gather's blocks with gaps between them."""
    return call.collective == "gather" and sum(call.counts or ()) != math.prod(call.shape or ())


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


def freed_error() -> RuntimeError:
    """What a call on a freed Communicator raises (it would reach MPI with a null communicator)."""
    return RuntimeError("pycollect: this Communicator was freed (free(), or the end of its with block); "
                        "make a new one to call collectives or send messages")


def broken_error(why: str) -> RuntimeError:
    """What a call on a Communicator whose earlier call ended in flight raises (Runner.break_off)."""
    return RuntimeError(f"pycollect: this Communicator takes no more calls on this rank: {why}. MPI still holds "
                        f"that call's messages, and a "
                        f"late peer's next call would pair with them, not with this one: free() this Communicator "
                        f"and make a new one on every rank")


def kept_or_free(comm, keep: bool) -> None:
    """``comm`` freed, or (``keep``) held for the rest of the process: MPI reuses a freed communicator's context, and
    a message for it still on its way then reaches a communicator made later (found by a helper: a recv on a new
    Communicator returned a freed one's message, even after a barrier between two nodes). Held, its context stays
    taken on this rank, so no communicator made later shares it: such a message lands where nothing receives."""
    if keep:
        KEPT.append(comm)
    elif comm != MPI.COMM_NULL:
        comm.Free()


KEPT: list = []   # communicators held after a refusal or a break (kept_or_free): never freed

# the dropped and failed lists of every runner not freed (or freed with something failed in flight), by a key of
# their own (an id could be reused once a runner is collected): kept alive for the process, as MPI may use them
_HELD: dict[int, tuple[list, list]] = {}
_HELD_KEYS = itertools.count()


def _refuse_broken(why: str) -> int:
    """``Runner.begin`` once a call ended in flight (Runner.break_off)."""
    raise broken_error(why)


def _refuse_freed() -> int:
    """``Runner.begin`` once the runner is freed."""
    raise freed_error()
