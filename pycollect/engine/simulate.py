"""Run the schedules of all ranks in one process, on NumPy arrays, without MPI.

Messages flow through per-pair FIFO queues; a rank leaves a round when all its receives
are matched and all its sends were taken, as under the MPI executor. Window rounds meet at a
fence: a rank reads once every rank has published its j-th window round, and each read must
find the range its peer published for it in that round. A schedule that would deadlock,
mismatch sizes, write a range it sends in the same round, or publish over what its peers may
still be reading raises ``ScheduleError``. Used by the tests of every algorithm at every world size, and as
the reference the MPI executor is checked against.
"""
from __future__ import annotations

from collections import defaultdict, deque

import numpy as np

from .schedule import Round, Schedule, Slice


class ScheduleError(RuntimeError):
    """A schedule that cannot run: deadlock, size mismatch, bad range or hazard."""


def _view(bufs: dict, s: Slice, rank: int) -> np.ndarray:
    buf = bufs.get(s.buf)
    if buf is None:
        raise ScheduleError(f"rank {rank}: slice {s} names buffer {s.buf!r}, which this rank does not have")
    if not 0 <= s.start <= s.stop <= buf.size:
        raise ScheduleError(f"rank {rank}: slice {s} is outside buffer {s.buf!r} of {buf.size} elements")
    return buf[s.start:s.stop]


def _overlap(a: Slice, b: Slice, same_memory) -> bool:
    return bool(same_memory(a.buf, b.buf) and a.start < b.stop and b.start < a.stop and a.n and b.n)


def check_hazards(rank: int, rnd: Round, same_memory=lambda a, b: a == b) -> None:
    """A receive may not write what a send of the same round reads, nor what another receive writes."""
    for r in rnd.recvs:
        for s in rnd.sends:
            if _overlap(r.dst, s.src, same_memory):
                raise ScheduleError(f"rank {rank}: receive into {r.dst} overlaps send of {s.src} in one round")
    for i, r in enumerate(rnd.recvs):
        if r.acc is not None and r.acc.n != r.dst.n:
            raise ScheduleError(f"rank {rank}: receive into {r.dst} accumulates onto {r.acc} of another length")
        for q in rnd.recvs[i + 1:]:
            if _overlap(r.dst, q.dst, same_memory):
                raise ScheduleError(f"rank {rank}: receives into {r.dst} and {q.dst} overlap in one round")
        for q in rnd.recvs:
            if q is not r and q.acc is not None and _overlap(r.dst, q.acc, same_memory):
                raise ScheduleError(f"rank {rank}: receive into {r.dst} overlaps {q.acc}, read by another receive of the round")


class _Windows:
    """What each rank published in each of its window rounds, and the fences every rank has reached."""

    def __init__(self, schedules: list[Schedule]):
        self.size = len(schedules)
        self.win = [s.win for s in schedules]
        self.reached = [0] * self.size                 # window rounds published, per rank
        self.published: list[list[dict]] = [[] for _ in range(self.size)]
        self.last_ranges: list[list[tuple[int, int]]] = [[] for _ in range(self.size)]
        self.lends = [s.lends for s in schedules]
        self.direct: list[list] = [[] for _ in range(self.size)]   # (slice, data) peers may read from "in" itself
        self.from_input: list[list[bool]] = [[] for _ in range(self.size)]   # per rank, per window round

    def check_direct(self, r: int, bufs: dict) -> None:
        """At rank r's next fence: the input ranges its last ``from_input`` round published are untouched, since
        a rank whose input lies in shared memory is read there by its peers until that fence."""
        for src, data in self.direct[r]:
            if not np.array_equal(_view(bufs, src, r), data, equal_nan=data.dtype.kind in "fc"):
                raise ScheduleError(f"rank {r}: writes over its input {src}, which peers read directly "
                                    f"(a from_input window round), before the next fence")
        self.direct[r] = []

    def publish(self, r: int, rnd: Round, bufs: dict) -> None:
        if any(s.at is None for s in rnd.sends) or any(v.at is None for v in rnd.recvs):
            raise ScheduleError(f"rank {r}: a round mixes window messages with MPI messages")
        self.check_direct(r, bufs)
        if rnd.from_input and any(s.src.buf != "in" or s.at != s.src.start for s in rnd.sends):
            raise ScheduleError(f"rank {r}: a from_input round publishes what is not its input at its own offset")
        if len(set(self.win)) != 1:
            raise ScheduleError(f"ranks size their windows differently: {self.win}")
        ranges, data = [], {}
        for s in rnd.sends:
            if not 0 <= s.peer < self.size or s.peer == r:
                raise ScheduleError(f"rank {r}: window send to invalid peer {s.peer}")
            if s.at is None:
                raise ScheduleError(f"rank {r}: a window round's send to {s.peer} has no window offset")
            at = s.at
            if not 0 <= at <= at + s.src.n <= self.win[r]:
                raise ScheduleError(f"rank {r}: publishes [{at}, {at + s.src.n}) outside its window of {self.win[r]}")
            for a, b in self.last_ranges[r]:
                if at < b and a < at + s.src.n and s.src.n:
                    raise ScheduleError(f"rank {r}: publishes [{at}, {at + s.src.n}) over [{a}, {b}), which its "
                                        f"peers may still read from the window round before")
            data[(s.peer, at, s.src.n)] = _view(bufs, s.src, r).copy()
            if rnd.from_input and self.lends[r]:
                self.direct[r].append((s.src, data[(s.peer, at, s.src.n)]))
            ranges.append((at, at + s.src.n))
        self.published[r].append(data)
        self.from_input[r].append(rnd.from_input)
        self.last_ranges[r] = ranges
        self.reached[r] += 1

    def readable(self, j: int) -> bool:
        """Every rank has published its window round ``j`` (0-based)."""
        return min(self.reached) > j

    def read(self, r: int, j: int, rv, rnd: Round) -> np.ndarray:
        if self.from_input[rv.peer][j] != rnd.from_input:
            raise ScheduleError(f"rank {r}: window round {j} is{'' if rnd.from_input else ' not'} from_input, "
                                f"rank {rv.peer}'s is{'' if self.from_input[rv.peer][j] else ' not'}")
        data = self.published[rv.peer][j].get((r, rv.at, rv.dst.n))
        if data is None:
            raise ScheduleError(f"rank {r}: reads {rv.dst.n} elements at {rv.at} of rank {rv.peer}'s window, which "
                                f"rank {rv.peer} did not publish for it in window round {j}")
        return data


def simulate(schedules: list[Schedule], inputs: list[np.ndarray], outs: list, op) -> list:
    """Run ``schedules[r]`` for every rank r; ``outs[r]`` (or None) is filled in place and returned.

    ``op(a, b)`` combines two arrays. When ``outs[r] is inputs[r]`` the call is in place.
    """
    run = _Simulation(schedules, inputs, outs, op)
    progress = True
    while progress:
        progress = False
        for r in range(run.size):
            progress |= run.step(r)
    run.finish()
    return outs


class _Simulation:
    """Every rank's buffers, round and messages in flight; ``step(r)`` moves rank r on as far as it can."""

    def __init__(self, schedules: list[Schedule], inputs: list[np.ndarray], outs: list, op):
        self.schedules, self.op, self.size = schedules, op, len(schedules)
        self.bufs = []
        for r in range(self.size):
            b = {"in": inputs[r], "tmp": np.zeros(schedules[r].tmp, inputs[r].dtype)}
            if outs[r] is not None:
                b["out"] = outs[r]
            self.bufs.append(b)
        self.aliased = [outs[r] is not None and np.shares_memory(outs[r], inputs[r]) for r in range(self.size)]
        self.queues: dict[tuple[int, int], deque] = defaultdict(deque)
        self.pos = [0] * self.size          # round index of each rank
        self.started = [False] * self.size
        self.pending_recv: list[list] = [[] for _ in range(self.size)]
        self.unsent: list[list] = [[] for _ in range(self.size)]  # send tickets not yet taken
        self.windows = _Windows(schedules)
        self.window_round = [0] * self.size   # window rounds each rank has finished

    def _same_memory_for(self, r):
        return lambda a, b: a == b or (self.aliased[r] and {a, b} == {"in", "out"})

    def _copy(self, r, copies) -> None:
        for c in copies:
            src = _view(self.bufs[r], c.src, r).copy()
            if c.acc is not None:   # a local reduction: op(acc, src)
                if c.acc.n != c.src.n or c.dst.n != c.src.n:
                    raise ScheduleError(f"rank {r}: copy of {c.src} reduces onto {c.acc} into {c.dst} of other lengths")
                src = self.op(_view(self.bufs[r], c.acc, r), src)
            _view(self.bufs[r], c.dst, r)[...] = src

    def _land(self, r, rv, data) -> None:
        dst = _view(self.bufs[r], rv.dst, r)
        if rv.acc is None:
            dst[...] = data
        else:
            acc = _view(self.bufs[r], rv.acc, r)
            dst[...] = self.op(data, acc) if rv.incoming_first else self.op(acc, data)

    def _next(self, r) -> None:
        self.pos[r] += 1
        self.started[r] = False

    def start(self, r) -> None:
        """Rank r's round: pre copies, then its window published or its sends queued and receives posted."""
        rnd = self.schedules[r].rounds[self.pos[r]]
        if not rnd.window:
            if any(s.at is not None for s in rnd.sends) or any(v.at is not None for v in rnd.recvs):
                raise ScheduleError(f"rank {r}: round {self.pos[r]} has window messages but is not a window round")
            check_hazards(r, rnd, self._same_memory_for(r))
        self._copy(r, rnd.pre)
        self.started[r] = True
        if rnd.window:
            self.windows.publish(r, rnd, self.bufs[r])
            self.unsent[r], self.pending_recv[r] = [], []
            return
        tickets = []
        for s in rnd.sends:
            if not 0 <= s.peer < self.size or s.peer == r:
                raise ScheduleError(f"rank {r}: send to invalid peer {s.peer}")
            ticket = [False]
            self.queues[(r, s.peer)].append((_view(self.bufs[r], s.src, r).copy(), ticket))
            tickets.append(ticket)
        self.unsent[r] = tickets
        for rv in rnd.recvs:
            if not 0 <= rv.peer < self.size or rv.peer == r:
                raise ScheduleError(f"rank {r}: receive from invalid peer {rv.peer}")
        self.pending_recv[r] = list(rnd.recvs)

    def step(self, r) -> bool:
        """Move rank r on; whether anything happened."""
        if self.pos[r] >= len(self.schedules[r].rounds):
            return False
        progress = False
        if not self.started[r]:
            self.start(r)
            progress = True
        rnd = self.schedules[r].rounds[self.pos[r]]
        if rnd.window:
            return self._window_step(r, rnd) or progress
        return self._message_step(r, rnd) or progress

    def _window_step(self, r, rnd) -> bool:
        j = self.window_round[r]
        if not self.windows.readable(j):
            return False
        for rv in rnd.recvs:   # in the order listed, each onto what the ones before wrote
            self._land(r, rv, self.windows.read(r, j, rv, rnd))
        self._copy(r, rnd.post)
        self.window_round[r] += 1
        self._next(r)
        return True

    def _message_step(self, r, rnd) -> bool:
        progress = False
        left = []
        blocked_peers = set()
        for rv in self.pending_recv[r]:
            q = self.queues[(rv.peer, r)]
            if rv.peer in blocked_peers or not q:
                blocked_peers.add(rv.peer)
                left.append(rv)
                continue
            data, ticket = q.popleft()
            if data.size != rv.dst.n:
                raise ScheduleError(f"rank {r}: receive of {rv.dst.n} elements from {rv.peer} matched a send of {data.size}")
            self._land(r, rv, data)
            ticket[0] = True
            progress = True
        self.pending_recv[r] = left
        if not left and all(t[0] for t in self.unsent[r]):
            self._copy(r, rnd.post)
            self._next(r)
            progress = True
        return progress

    def finish(self) -> None:
        """Every rank at its end: the last fence's checks; else the deadlock, or messages never received."""
        stuck = [r for r in range(self.size) if self.pos[r] < len(self.schedules[r].rounds)]
        for r in range(self.size):
            if r not in stuck:      # the executor's last fence
                self.windows.check_direct(r, self.bufs[r])
        if stuck:
            lines = [f"rank {r} round {self.pos[r]}: waits for {[(v.peer, v.dst.n) for v in self.pending_recv[r]]}"
                     f" and {sum(not t[0] for t in self.unsent[r])} unsent"
                     + (f" (at window fence {self.window_round[r]})" if self.schedules[r].rounds[self.pos[r]].window
                        else "")
                     for r in stuck]
            raise ScheduleError("deadlock:\n" + "\n".join(lines))
        left = {k: len(v) for k, v in self.queues.items() if v}
        if left:
            raise ScheduleError(f"messages never received (src, dst): {left}")
