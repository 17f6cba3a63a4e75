"""Run the schedules of all ranks in one process, on NumPy arrays, without MPI.

Messages flow through per-pair FIFO queues; a rank leaves a round when all its receives
are matched and all its sends were taken, as under the MPI executor. A schedule that
would deadlock, mismatch sizes, or write a range it sends in the same round raises
``ScheduleError``. Used by the tests of every algorithm at every world size, and as
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
    return same_memory(a.buf, b.buf) and a.start < b.stop and b.start < a.stop and a.n and b.n


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


def simulate(schedules: list[Schedule], inputs: list[np.ndarray], outs: list, op) -> list:
    """Run ``schedules[r]`` for every rank r; ``outs[r]`` (or None) is filled in place and returned.

    ``op(a, b)`` combines two arrays. When ``outs[r] is inputs[r]`` the call is in place.
    """
    size = len(schedules)
    bufs = []
    for r in range(size):
        b = {"in": inputs[r], "tmp": np.zeros(schedules[r].tmp, inputs[r].dtype)}
        if outs[r] is not None:
            b["out"] = outs[r]
        bufs.append(b)
    aliased = [outs[r] is not None and np.shares_memory(outs[r], inputs[r]) for r in range(size)]
    queues: dict[tuple[int, int], deque] = defaultdict(deque)
    pos = [0] * size          # round index of each rank
    started = [False] * size
    pending_recv: list[list] = [[] for _ in range(size)]
    unsent: list[list] = [[] for _ in range(size)]  # send tickets not yet taken

    def same_memory_for(r):
        return lambda a, b: a == b or (aliased[r] and {a, b} == {"in", "out"})

    def start(r):
        rnd = schedules[r].rounds[pos[r]]
        check_hazards(r, rnd, same_memory_for(r))
        for c in rnd.pre:
            _view(bufs[r], c.dst, r)[...] = _view(bufs[r], c.src, r).copy()
        tickets = []
        for s in rnd.sends:
            if not 0 <= s.peer < size or s.peer == r:
                raise ScheduleError(f"rank {r}: send to invalid peer {s.peer}")
            ticket = [False]
            queues[(r, s.peer)].append((_view(bufs[r], s.src, r).copy(), ticket))
            tickets.append(ticket)
        unsent[r] = tickets
        for rv in rnd.recvs:
            if not 0 <= rv.peer < size or rv.peer == r:
                raise ScheduleError(f"rank {r}: receive from invalid peer {rv.peer}")
        pending_recv[r] = list(rnd.recvs)
        started[r] = True

    progress = True
    while progress:
        progress = False
        for r in range(size):
            if pos[r] >= len(schedules[r].rounds):
                continue
            if not started[r]:
                start(r)
                progress = True
            left = []
            blocked_peers = set()
            for rv in pending_recv[r]:
                q = queues[(rv.peer, r)]
                if rv.peer in blocked_peers or not q:
                    blocked_peers.add(rv.peer)
                    left.append(rv)
                    continue
                data, ticket = q.popleft()
                if data.size != rv.dst.n:
                    raise ScheduleError(f"rank {r}: receive of {rv.dst.n} elements from {rv.peer} matched a send of {data.size}")
                dst = _view(bufs[r], rv.dst, r)
                dst[...] = data if rv.acc is None else op(_view(bufs[r], rv.acc, r), data)
                ticket[0] = True
                progress = True
            pending_recv[r] = left
            if not left and all(t[0] for t in unsent[r]):
                for c in schedules[r].rounds[pos[r]].post:
                    _view(bufs[r], c.dst, r)[...] = _view(bufs[r], c.src, r).copy()
                pos[r] += 1
                started[r] = False
                progress = True
    stuck = [r for r in range(size) if pos[r] < len(schedules[r].rounds)]
    if stuck:
        lines = [f"rank {r} round {pos[r]}: waits for {[(v.peer, v.dst.n) for v in pending_recv[r]]}"
                 f" and {sum(not t[0] for t in unsent[r])} unsent" for r in stuck]
        raise ScheduleError("deadlock:\n" + "\n".join(lines))
    left = {k: len(v) for k, v in queues.items() if v}
    if left:
        raise ScheduleError(f"messages never received (src, dst): {left}")
    return outs
