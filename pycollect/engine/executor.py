"""Run a schedule over MPI: non-blocking sends and receives inside a round, reductions as segments land.

An ``Execution`` advances one round at a time, so a blocking call runs it to the end and a
non-blocking call advances it from ``Request.test()``. Messages longer than ``segment``
elements go as several messages (both ends split the same way), so that, when every rank
has a core of its own, each piece is reduced while the next is still arriving.
"""
from __future__ import annotations

import threading
import weakref
from typing import NamedTuple, cast

import numpy as np
from mpi4py import MPI

from .abort import collective_failed, end_job
from .backend import BufferPool, byte_view, same_buffer, sync
from .errors import CollectiveError, describe_pending
from .layout import pieces as segments   # a message's pieces: at least one, at most MAX_PIECES
from .pairing import CallId, LiveTags, do_not_pair, end_job_on_a_stray
from .progress import NAP_S, poll, reported
from .schedule import Round, Schedule, Slice
from .window import Fence, Slot


_LANDED = (None, None, None, None, None, False)
# The last fence of a schedule with window rounds: no rank publishes into its window for the next
# call on this slot before every peer has read this call's data.
_CLOSE = Round(window=True)
# A puts round reduces and writes its block this much at a time: each chunk written into the peers' ``out`` while it
# is in cache (2 ranks, 64 MiB: 256 KiB and 1 MiB chunks alike reached the copy's bandwidth, a one-off prototype).
_PUT_CHUNK_BYTES = 256 << 10

# The non-blocking schedule calls in flight in this process that any wait may move on (``Execution.movable``): MPI
# moves every call in flight in any of its waits, so ranks may wait for their requests in different orders; a
# schedule's next round is posted by Python, which runs only where the rank waits.
_MOVABLE: "weakref.WeakSet[Execution]" = weakref.WeakSet()
_MOVABLE_LOCK = threading.Lock()   # the sets are read in one thread while another adds to them
# What holds calls back that a wait may start (``held_back``): a Runner whose deferred calls' steps may have ended
# (runner.py: a call whose counts are exchanged first starts from a wait, in call order); ``move_held()`` starts them.
_HOLDERS: weakref.WeakSet = weakref.WeakSet()


class RoundPlan(NamedTuple):
    """One round's messages as ``Execution`` posts them, cut into segments, offsets counted from the buffers' starts.

    ``recvs``: ``(dst buffer, start, stop, acc buffer or None, acc start, scratch start, peer, incoming first)``
    per segment (a receive that reduces lands in scratch, then ``dst = op(acc, landed)``, or ``op(landed, acc)``
    when the message holds the lower ranks, ``Recv.incoming_first``); ``scratch``: the scratch elements those
    take, None when none reduces; ``sends``: ``(src buffer, start, stop, peer)`` per segment.
    """
    recvs: tuple[tuple[str, int, int, str | None, int, int, int, bool], ...]
    scratch: int | None
    sends: tuple[tuple[str, int, int, int], ...]


class Plan(NamedTuple):
    """A schedule's rounds as ``Execution`` runs them (``plan``): made once per schedule and segment size, so that a
    call does not cut its messages again."""
    rounds: tuple[RoundPlan, ...]
    window: bool   # some round is a window round (the schedule then ends at a last fence)


def plan(schedule: Schedule, segment: int) -> Plan:
    """The ``Plan`` of ``schedule`` with messages of at most ``segment`` elements (0: whole)."""
    return Plan(tuple(_round_plan(rnd, segment) for rnd in schedule.rounds), any(r.window for r in schedule.rounds))


def _round_plan(rnd: Round, segment: int) -> RoundPlan:
    recvs: list[tuple[str, int, int, str | None, int, int, int, bool]] = []
    used, reduces = 0, False
    for r in rnd.recvs:
        d, acc = r.dst, r.acc
        for a, b in segments(d.n, segment):
            if acc is None:
                recvs.append((d.buf, d.start + a, d.start + b, None, 0, 0, r.peer, False))
            else:
                recvs.append((d.buf, d.start + a, d.start + b, acc.buf, acc.start + a, used + a, r.peer,
                              r.incoming_first))
        if acc is not None:
            used, reduces = used + d.n, True
    sends = tuple((s.src.buf, s.src.start + a, s.src.start + b, s.peer)
                  for s in rnd.sends for a, b in segments(s.src.n, segment))
    return RoundPlan(tuple(recvs), used if reduces else None, sends)


class Execution:
    """One schedule in flight on one rank.

    ``ObservedExecution`` (below) overrides ``_next_round`` and ``_end_round``, the round
    boundaries; keep them the only places a round starts and ends. ``watch`` (a
    ``watchdog.Watch``, only under PYCOLLECT_TIMEOUT) makes ``wait()`` poll to a deadline.

    ``call`` names the call (its tag is ``live.of(call.seq)``); ``live`` holds the tags of the
    Communicator's calls in flight on this rank. A wait polls and, while it lasts, looks for a
    message of a call that ended here (engine/pairing.py); a message of the wrong size, such a
    message, or any exception once the first message is posted ends the job naming the call,
    so that no rank is left waiting and nothing half-done is handed back.

    Window rounds (``Round.window``; ``slot`` is the window slot the call settled on, engine/window.py)
    publish their sends into this call's shared window, wait at a fence for every rank, then
    read; a last fence ends the schedule.
    """

    def __init__(self, comm: MPI.Comm, schedule: Schedule, bufs: dict, combine, xp,
                 pool: BufferPool, segment: int, staging: bool = False, overlap: bool = False, watch=None, *,
                 call: CallId, live: LiveTags, slot: Slot | None = None, nap: float = NAP_S, planned: Plan | None = None):
        self.comm, self.call, self.tag, self.xp, self.pool = comm, call, live.of(call.seq), xp, pool
        self.nap = nap                    # progress.poll's pause between tests after a while (0: none)
        self.live = live
        self.watch = watch
        self.rounds = schedule.rounds
        self.plan = planned if planned is not None else plan(schedule, segment)   # the rounds' messages, segmented
        self.dtype = next(iter(bufs.values())).dtype
        self.slot: Slot | None = None     # this call's window slot, when it has window rounds
        self._fence: Fence | None = None  # the fence of the window round in flight
        if self.plan.window:
            assert slot is not None, "a schedule with window rounds runs in the slot its call settled on"
            self.rounds += (_CLOSE,)
            # the slot's holder stays the run that settled it (runner._WindowedRun, seated as holder): made holder
            # here, a half-built Execution was waited by a later call's seat, past the run's lock
            self.slot = slot
        self.bufs = bufs
        self.combine = combine            # combine(a, b, out=dst)
        self.segment = segment
        self.staging = staging            # device buffers through host memory
        self.overlap = overlap            # land segments one by one (only when every rank has a core)
        self.index = -1                   # round in flight
        self._held: list = []             # pool arrays this call keeps to its end (tmp)
        self._scratch = None              # the round in flight's landing buffer, back to the pool as it ends
        bufs["tmp"] = self._take(schedule.tmp) if schedule.tmp else xp.empty(0, self.dtype)
        self._moving = threading.Lock()   # held by the thread moving it on: its wait, a test, another call's wait
        live.add(self.tag)

    def movable(self) -> None:
        """Let every wait of this process move this call on (a non-blocking call's: ``move_others``)."""
        with _MOVABLE_LOCK:
            _MOVABLE.add(self)

    def begin(self) -> "Execution":
        """Post the first round; apart from ``__init__`` so that an interrupt while it posts leaves this object, which
        holds what was posted, to its maker (Runner.execution keeps it from being freed under MPI)."""
        try:
            self._next_round()
        except Exception as e:
            collective_failed(str(self.call), self.call.rank, e)
        return self

    def _take(self, n):
        arr = self.pool.take(self.xp, self.dtype, n)
        self._held.append(arr)
        return arr

    def _view(self, s):
        return self.bufs[s.buf][s.start:s.stop]

    def _copy(self, c) -> None:
        src, dst = self._view(c.src), self._view(c.dst)
        if c.acc is not None:   # a local reduction (the prefix schedules): dst = op(acc, src)
            self.combine(self._view(c.acc), src, out=dst)
            return
        if same_buffer(src, dst):   # an in-place allgather placing its own block: already there
            return
        if self.xp is not np and self.xp.may_share_memory(src, dst):
            src = src.copy()  # a device copy between overlapping ranges is undefined; NumPy's is not
        dst[...] = src

    def _send_buf(self, arr):
        if self.staging:  # the request keeps the host copy alive until the send completes
            return byte_view(self.xp.asnumpy(arr), np)
        return byte_view(arr, self.xp)

    # -- one round ------------------------------------------------------------------------------
    def _next_round(self) -> None:
        self.index += 1
        if self.index == len(self.rounds):
            self._release()
            return
        rnd = self.rounds[self.index]
        for c in rnd.pre:
            self._copy(c)
        if rnd.window:
            self._publish(rnd)
            return
        xp, bufs, comm, tag, staging = self.xp, self.bufs, self.comm, self.tag, self.staging
        if xp is not np:
            sync(xp)  # reductions and copies queued on the device land before MPI reads them
        rp = self.plan.rounds[self.index]
        # one landing buffer a round, given back when the round ends: a call of many rounds (a pipelined tree)
        # holding one each would take more than the pool keeps and allocate the rest afresh on every call
        scratch = self._scratch = self.pool.take(xp, self.dtype, rp.scratch) if rp.scratch is not None else None
        # per receive (segment): (destination, accumulator or None, landing buffer, host staging or None, peer,
        # whether the landed message goes first in the reduction)
        recvs: list[tuple] = []
        reqs: list[MPI.Request] = []
        self._recvs, self._reqs = recvs, reqs   # filled as they are posted: an interrupt midway leaves them held
        for buf, start, stop, acc_buf, acc_start, at, peer, first in rp.recvs:
            dst = bufs[buf][start:stop]
            if acc_buf is None:
                target, acc = dst, None
            else:
                assert scratch is not None  # taken above: this receive reduces
                target, acc = scratch[at:at + stop - start], bufs[acc_buf][acc_start:acc_start + stop - start]
            host = np.empty(target.nbytes, np.uint8) if staging else None
            reqs.append(comm.Irecv(host if staging else byte_view(target, xp), peer, tag))
            recvs.append((dst, acc, target, host, peer, first))
        for buf, start, stop, peer in rp.sends:
            reqs.append(comm.Isend(self._send_buf(bufs[buf][start:stop]), peer, tag))
        self._statuses = [MPI.Status() for _ in reqs]

    # -- window rounds ----------------------------------------------------------------------------
    def _publish(self, rnd: Round) -> None:
        """Copy the round's sends into this rank's window (each range once), then enter the fence."""
        slot = self.slot
        assert slot is not None, "a schedule with window rounds takes a slot in __init__"
        published: set[tuple[int, Slice]] = set()
        direct = rnd.from_input and slot.lends(self.call.rank)
        # the round after a puts round publishes only what a peer whose out lies elsewhere reads
        sends = rnd.sends if not rnd.puts or rnd.from_input else [s for s in rnd.sends if not slot.puts_to(s.peer)]
        for s in sends if not direct else ():   # an input in shared memory is read where it is
            at = s.at
            assert at is not None, "every message of a window round has its offset"
            if (at, s.src) not in published:
                published.add((at, s.src))
                slot.region(self.call.rank, self.dtype, at, at + s.src.n)[...] = self._view(s.src)
        slot.sync()
        where = "at the end" if rnd is _CLOSE else f"in round {self.index}"
        self._fence = Fence(slot, self.call, where)
        self._recvs, self._reqs = [], [self._fence.request]
        self._statuses = [MPI.Status()]

    def _read(self, rnd: Round) -> None:
        """Past the fence: each receive copied (or reduced) from the peer's window, in the order listed."""
        slot = self.slot
        assert self._fence is not None and slot is not None, "only a window round (which has both) reads"
        self._fence.check()
        self._fence = None
        slot.sync()
        if rnd.puts and rnd.from_input:
            self._read_put(rnd, slot)
            return
        if rnd.puts and slot.puts_to(self.call.rank):   # the owners wrote every block into this rank's out
            return
        for r in rnd.recvs:
            at = r.at
            assert at is not None, "every message of a window round has its offset"
            src = slot.region(r.peer, self.dtype, at, at + r.dst.n, rnd.from_input)
            if r.acc is None:
                self._view(r.dst)[...] = src
            elif r.incoming_first:
                self.combine(src, self._view(r.acc), out=self._view(r.dst))
            else:
                self.combine(self._view(r.acc), src, out=self._view(r.dst))

    def _read_put(self, rnd: Round, slot: Slot) -> None:
        """A ``puts`` round's reads: the reduction of this rank's block, a chunk at a time, each chunk then written
        into the ``out`` of every peer whose ``out`` lies in shared memory while it is still in cache."""
        if not rnd.recvs:
            return
        dst = rnd.recvs[0].dst
        assert all(r.dst == dst and r.acc is not None for r in rnd.recvs), "a puts round reduces into one block"
        out, combine = self._view(dst), self.combine
        terms = [(self._view(cast(Slice, r.acc)), slot.region(r.peer, self.dtype, cast(int, r.at),
                                                              cast(int, r.at) + dst.n, True)) for r in rnd.recvs]
        sinks = [cast(np.ndarray, slot.output(r.peer, self.dtype, dst.start, dst.stop))
                 for r in rnd.recvs if slot.puts_to(r.peer)]
        step = max(1, _PUT_CHUNK_BYTES // self.dtype.itemsize)
        for a in range(0, dst.n, step):
            b = min(a + step, dst.n)
            mine = out[a:b]
            for acc, src in terms:
                combine(acc[a:b], src[a:b], out=mine)
            for sink in sinks:
                sink[a:b] = mine

    def _land(self, i: int) -> None:
        """Receive ``i`` arrived: check its size, copy it from host staging and reduce it into place."""
        dst, acc, target, host, peer, first = self._recvs[i]
        if dst is None:  # already landed while waiting segment by segment
            return
        expected = (host if host is not None else target).nbytes
        got = self._statuses[i].Get_count(MPI.BYTE)
        if got != expected:  # a longer one MPI refuses itself (truncation): both end the job
            end_job(do_not_pair(self.call, f"round {self.index} received {got} bytes from rank {peer}, "
                                           f"expected {expected}"))
        if host is not None:
            target[...] = self.xp.asarray(host.view(target.dtype))
        if acc is not None:
            self.combine(*((target, acc) if first else (acc, target)), out=dst)

    def _end_round(self) -> None:
        if self._fence is not None:
            self._read(self.rounds[self.index])
        for i in range(len(self._recvs)):
            self._land(i)
        if self._scratch is not None:
            self.pool.give(self._scratch)
            self._scratch = None
        for c in self.rounds[self.index].post:
            self._copy(c)
        self._next_round()

    # -- driving ----------------------------------------------------------------------------------
    @property
    def done(self) -> bool:
        return self.index >= len(self.rounds)

    def wait(self) -> None:
        """Run every remaining round to the end."""
        with self._moving:
            try:
                self._wait()
            except BaseException:   # interrupted (or timed out, abort off): left as it is, never moved on again
                _immovable(self)
                raise

    def _wait(self) -> None:
        try:
            if self.watch is not None:
                self._wait_watched()
                return
            while not self.done:
                if self.overlap and len(self._recvs) > 1:
                    # Reduce each segment as it lands, while the next ones are still arriving.
                    for i in range(len(self._recvs)):
                        poll([self._reqs[i]], None, [self._statuses[i]], self._look, self.nap)
                        self._land(i)
                        self._recvs[i] = _LANDED
                # One wait for the whole round (requests landed above are null by now): when ranks
                # outnumber cores, waiting on requests one by one costs milliseconds per round.
                poll(self._reqs, None, self._statuses, self._look, self.nap)
                self._end_round()
        except CollectiveError:
            raise  # the watchdog's, with PYCOLLECT_TIMEOUT_ABORT=0: the caller asked for the exception
        except Exception as e:
            self._failed(e)

    def _failed(self, error: Exception):
        """An exception once messages are posted: end the job naming the call (and, for MPI's, the peers)."""
        if isinstance(error, MPI.Exception):
            codes = [st.Get_error() for st in self._statuses]
            bad = [c not in (MPI.SUCCESS, MPI.ERR_PENDING) for c in codes]
            who = describe_pending(self._pending(bad)) if any(bad) else "a request"
            text = f"round {self.index}: MPI failed {who}: {reported(self._statuses, error)}"
            if any(MPI.Get_error_class(c) == MPI.ERR_TRUNCATE for c, b in zip(codes, bad) if b):
                end_job(do_not_pair(self.call, text + " (a message longer than this rank expects)"))
            collective_failed(str(self.call), self.call.rank, text)
        collective_failed(str(self.call), self.call.rank, error)

    def _wait_watched(self) -> None:
        """``wait()`` under the watchdog: each round's requests polled to a deadline (no overlap)."""
        while not self.done:
            self.watch.wait(self._reqs, self.index, self._pending, self._statuses, self._look)
            self._end_round()

    def _look(self) -> None:
        """While a wait lasts: a message from a peer of this round whose tag is a call that ended here; then the
        process's other schedule calls in flight moved on (a peer may be waiting for one of them first)."""
        rnd = self.rounds[self.index]
        end_job_on_a_stray(self.comm, dict.fromkeys([r.peer for r in rnd.recvs] + [s.peer for s in rnd.sends]),
                           self.call, self.live, f"while it waits in round {self.index}")
        move_others(self)

    def _pending(self, flags) -> list[tuple[str, int]]:
        """``(kind, peer)`` of this round's requests flagged in ``flags`` (in the order they were posted)."""
        rnd = self.rounds[self.index]
        if self._fence is not None:  # one request, MPI's own over the node's ranks: it does not say which it waits for
            return []
        who = [("recv", r.peer) for r in rnd.recvs for _ in segments(r.dst.n, self.segment)]
        who += [("send", s.peer) for s in rnd.sends for _ in segments(s.src.n, self.segment)]
        return list(dict.fromkeys(w for w, flag in zip(who, flags) if flag))

    def test(self) -> bool:
        """Make what progress is possible without blocking; True when finished (False while another thread moves
        it on)."""
        if not self._moving.acquire(blocking=False):
            return False
        try:
            while not self.done:
                if not MPI.Request.Testall(self._reqs, self._statuses):
                    return False
                self._end_round()
        except Exception as e:
            self._failed(e)
        except BaseException:   # interrupted: as in wait()
            _immovable(self)
            raise
        finally:
            self._moving.release()
        return True

    def _release(self) -> None:
        for arr in self._held:
            self.pool.give(arr)
        self._held = []
        assert self._scratch is None, "every round gives its landing buffer back as it ends"
        self.bufs.pop("tmp", None)
        self.live.discard(self.tag)
        _immovable(self)   # done: nothing left to move, and movable_in_flight() no longer counts it


class ObservedExecution(Execution):
    """An Execution that tells ``observer`` (engine/observe.py) of each round as it ends, with its times.

    Hooks the round boundaries only: ``_next_round`` ends the round before and opens the next,
    ``_end_round`` runs once the round's requests completed (after the wait or a successful test;
    with ``overlap`` the wait also covers the segments reduced as they land).
    """

    def __init__(self, observer, observed, *args, **kw):
        self._observer, self._observed = observer, observed   # the observer and the CollectiveCall it is told of
        self._t_start = self._t_posted = self._t_done = 0.0
        super().__init__(*args, **kw)

    def _next_round(self) -> None:
        now = MPI.Wtime()
        if 0 <= self.index < len(self.rounds):
            self._observer.round(self._observed, self.index, self.rounds[self.index],
                                 (self._t_start, self._t_posted, self._t_done, now))
        self._t_start = now
        super()._next_round()
        self._t_posted = MPI.Wtime()

    def _end_round(self) -> None:
        self._t_done = MPI.Wtime()
        super()._end_round()


def _immovable(run: Execution) -> None:
    with _MOVABLE_LOCK:
        _MOVABLE.discard(run)


def held_back(holder) -> None:
    """``holder`` holds calls back that other waits may start (its ``move_held()``), until ``let_go(holder)``."""
    with _MOVABLE_LOCK:
        _HOLDERS.add(holder)


def let_go(holder, empty) -> None:
    """``holder`` holds nothing back any longer where ``empty()`` says so (asked under the lock: a call held back in
    the meantime keeps it)."""
    with _MOVABLE_LOCK:
        if empty():
            _HOLDERS.discard(holder)


def forget_runs(live: LiveTags) -> None:
    """The movable runs of the Communicator whose tags ``live`` holds move in their own waits alone from now (it broke
    off: runner.Runner.break_off)."""
    with _MOVABLE_LOCK:
        for run in [run for run in _MOVABLE if run.live is live]:
            _MOVABLE.discard(run)


def movable_in_flight() -> bool:
    """Whether a call that other waits move (or start) is in flight in this process: a blocking call that sits inside
    MPI (the two ranks' exchanges, engine/lean_exchange.py) would move none of them meanwhile."""
    return bool(_MOVABLE) or bool(_HOLDERS)


def move_others(waiting: Execution | None = None) -> None:
    """Start the calls held back whose steps have ended, then move on, without blocking, every movable call in flight
    in this process but ``waiting`` (in call order), so that a rank waiting on one call still takes its part in the
    others: a peer may wait for those first."""
    with _MOVABLE_LOCK:
        holders = list(_HOLDERS)
    for holder in holders:   # first: a call started now is moved on below
        holder.move_held()
    with _MOVABLE_LOCK:
        others = [run for run in _MOVABLE if run is not waiting and not run.done]
    for run in sorted(others, key=lambda run: run.call.seq):
        run.test()
