"""Shared-memory windows on one node: where the window schedules publish and read.

A ``NodeWindows`` belongs to one Communicator and holds its windows on this rank's node (over
the Communicator's ranks there; on several nodes each node has its own, and every call's
agreement also runs over every rank, so that every node decides alike). It holds a few slots,
each an MPI-3 shared window (``MPI_Win_allocate_shared``) in which every rank owns a region its
peers can read directly: a rank copies a block in once and each peer copies (or reduces) it out
once, where MPI's shared-memory transport copies through its cells twice. The ``shared_empty``
windows hold callers' arrays that peers read in place (no copy in at all).

Slots are taken in call order (call k takes slot k mod ``SLOTS``), never by what has completed,
so every rank picks the same slot for the same call even when non-blocking calls finish in
different orders on different ranks. A call enters (``enter``) as it starts: its agreement, a small
non-blocking allgather, starts then, in call order, and nothing waits. It settles (``settle``) when
it runs -- at once for a blocking call, from ``test()``/``wait()`` for a non-blocking one -- and the
calls settle in the order they entered: each reads its agreement and takes its slot, once the
earlier call holding that slot has finished on this rank (started by every rank before this one,
so it can finish). A slot grows (collectively, freed and allocated again) when a call needs more
than it has: every rank settles the same calls in the same order, so all grow together.

A fence (``Fence``) is a non-blocking allreduce of the call's sequence number over the
slot's own communicator: it waits until every rank has published and, as the tags do for
messages, it ends the job when the ranks' calls do not pair up. MPI matches collectives on a
communicator in the order they are posted, and calls in flight post their fences in whatever
order each rank advances them; within one slot the calls run one after another, so each slot
has a communicator of its own and its fences are posted in the same order on every rank.
"""
from __future__ import annotations

import os
import threading
import weakref
import zlib
from collections import deque
from typing import Any

import numpy as np
from mpi4py import MPI

from .abort import collective_failed, end_job
from .pairing import CallId, do_not_pair
from .watchdog import wait_for

SLOTS = 4
_PAGE = 4096
_SHM = "/dev/shm"            # where MPICH and Open MPI place shared segments on Linux
_SHM_SPARE = 64 << 20        # left free for MPI's own shared memory


def _pages(nbytes: int) -> int:
    return -(-max(nbytes, 1) // _PAGE) * _PAGE


def shm_free() -> int | None:
    """Bytes free where shared segments live, or None where that cannot be told."""
    try:
        st = os.statvfs(_SHM)
    except OSError:
        return None
    return st.f_bavail * st.f_frsize


def _elements(base: np.ndarray, dtype, start: int, stop: int) -> np.ndarray:
    """Elements ``[start, stop)`` of the bytes ``base``, as ``dtype``."""
    item = np.dtype(dtype).itemsize
    return base[start * item:stop * item].view(dtype)


class Slot:
    """One shared window over ``comm`` (the slot's own, one node's ranks): views of every rank's region, by the rank
    each has in the Communicator (``members[i]`` is window rank i's)."""

    def __init__(self, comm: MPI.Intracomm, nbytes: int, members: list[int]):
        self.comm = comm
        nbytes = _pages(nbytes)
        info = MPI.Info.Create()
        info.Set("alloc_shared_noncontig", "true")   # each region on its owner's memory
        try:
            self.win = MPI.Win.Allocate_shared(nbytes, 1, info, comm=comm)
        finally:
            info.Free()
        self.win.Lock_all(MPI.MODE_NOCHECK)   # one passive epoch for the window's life; Sync orders memory
        self.nbytes = nbytes
        # each rank's region as long as that rank asked for (shared_empty's regions differ)
        # mpi4py's buffer has the buffer protocol; its stub declares it (__buffer__) only for Python 3.12 on
        self.regions = {rank: np.frombuffer(self.win.Shared_query(i)[0], np.uint8)  # type: ignore[call-overload]
                        for i, rank in enumerate(members)}
        # Written through now: shared memory takes room only where a page is first written, so a slot left unwritten
        # would hide from the free room the next growth checks (this Communicator's or another's), and a later call
        # writing into it could take room no check saw (a process touching a page past the room dies of SIGBUS).
        self.regions[members[comm.Get_rank()]].fill(0)
        self.holder: Any = None               # what runs the call that last took this slot (done, test(), wait())
        # the holding call's inputs that lie in shared memory, per rank (None: in no window), and their windows
        self.inputs: dict[int, np.ndarray | None] | None = None
        # likewise its results (``out``) where the schedule puts (engine/schedule.py); None: no rank's lies there
        self.outputs: dict[int, np.ndarray | None] | None = None
        self.input_windows: list[Slot] = []   # the windows of both

    def region(self, rank: int, dtype, start: int, stop: int, from_input: bool = False) -> np.ndarray:
        """Elements ``[start, stop)`` of ``rank``'s region, as ``dtype``; ``from_input`` (a round publishing inputs
        at their own offsets): of its input itself where ``rank`` lends it (``lends``)."""
        base = self.regions[rank]
        if from_input and self.inputs is not None:
            lent = self.inputs[rank]
            if lent is not None:   # ``lends(rank)``
                base = lent
        return _elements(base, dtype, start, stop)

    def lends(self, rank: int) -> bool:
        """Whether the holding call reads ``rank``'s input where it lies (in a ``shared_empty`` window)."""
        return self.inputs is not None and self.inputs[rank] is not None

    def puts_to(self, rank: int) -> bool:
        """Whether ``rank``'s ``out`` lies in a ``shared_empty`` window, where a schedule that ``puts`` writes."""
        return self.outputs is not None and self.outputs[rank] is not None

    def output(self, rank: int, dtype, start: int, stop: int) -> np.ndarray | None:
        """Elements ``[start, stop)`` of ``rank``'s ``out`` where it lies in a ``shared_empty`` window, else None."""
        base = None if self.outputs is None else self.outputs[rank]
        return None if base is None else _elements(base, dtype, start, stop)

    def finish_holder(self) -> None:
        """Finish the call holding this slot, if it is still in flight on this rank (every rank started it)."""
        if self.holder is not None and not self.holder.done:
            self.holder.wait()

    def sync(self) -> None:
        """Order this rank's loads and stores of the window (and of the shared inputs read) against its peers'."""
        self.win.Sync()
        for other in self.input_windows:
            other.win.Sync()

    def free(self) -> None:
        """Free the window (collective); the slot's communicator stays for the window that replaces it."""
        self.regions = {}
        self.win.Unlock_all()
        self.win.Free()


class _Region:
    """This rank's region of a ``shared_empty`` window, as the base of every array made from it: NumPy makes this
    object (not an array) the base of each view, so a weak reference to it says whether any array still uses it."""

    def __init__(self, region: np.ndarray):
        self.__array_interface__ = {"data": (region.ctypes.data, False), "shape": region.shape,
                                    "typestr": "|u1", "version": 3}


class NodeWindows:
    """The shared windows of one Communicator on this rank's node: over ``node`` (the Communicator's ranks that share
    memory with this one, ``members`` their ranks in the Communicator); every window call is a call of those ranks."""

    def __init__(self, node: MPI.Intracomm, members: list[int], lib: MPI.Intracomm):
        self.node, self.members = node, members
        # the agreements (enter) over every rank where the Communicator spans several nodes, else None
        self.world = lib.Dup() if len(members) < lib.Get_size() else None
        self.rank = members[node.Get_rank()]
        self.control = node.Dup()             # the agreements (enter) and allocate(): in call order
        self.comms = [node.Dup() for _ in range(SLOTS)]   # one per slot: see the module's docstring
        self.slots: list[Slot | None] = [None] * SLOTS
        self.calls = 0                        # window calls entered: call k takes slot k mod SLOTS
        self.pending = 0                      # bytes of the node's shared memory growths may take, not yet taken
        self.queue: deque[Ticket] = deque()   # entered and not yet settled, in call order
        self.shared: list[tuple[Slot | None, weakref.ref]] = []   # shared_empty's windows in the order made (None: freed)
        # held while a thread enters or settles window calls, or frees: the queue of tickets and the slots are
        # shared by the thread making calls and those testing Requests (a ticket's agreement tested in two threads
        # at once is one MPI request completed twice: erroneous in MPI)
        self.lock = threading.RLock()

    def allocate(self, nbytes: int) -> np.ndarray:
        """``nbytes`` (this rank's; they may differ) of a new shared window, as bytes in this rank's region
        (collective). The window lives while any array made from these bytes does (``free``)."""
        self._release_unused()
        slot = Slot(self.control, nbytes, self.members)
        keeper = _Region(slot.regions[self.rank])
        self.shared.append((slot, weakref.ref(keeper)))
        return np.asarray(keeper)[:nbytes]

    def _release_unused(self) -> None:
        """Free the ``shared_empty`` windows no rank's arrays use any more (collective: every rank alike).
        Those still listed keep their places: a window's number is its index in ``shared``."""
        if not any(slot is not None for slot, _ in self.shared):
            return
        unused = np.array([slot is not None and ref() is None for slot, ref in self.shared], np.int32)
        self.control.Allreduce(MPI.IN_PLACE, unused, op=MPI.MIN)   # over the node: every node frees alike
        for i, free in enumerate(unused):
            if free:
                slot = self.shared[i][0]
                assert slot is not None   # only a window not yet freed counts as unused
                slot.free()
                self.shared[i] = (None, self.shared[i][1])

    def locate(self, arr: np.ndarray) -> tuple[int, int]:
        """``(window, byte offset)`` of a contiguous host array lying in this rank's region of a shared window,
        else ``(-1, 0)``."""
        if not self.shared or type(arr) is not np.ndarray or not arr.flags.c_contiguous:
            return -1, 0
        start = arr.__array_interface__["data"][0]
        for i, (slot, _) in enumerate(self.shared):
            if slot is None:
                continue
            region = slot.regions[self.rank]
            base = region.__array_interface__["data"][0]
            if base <= start and start + arr.nbytes <= base + region.nbytes:
                return i, start - base
        return -1, 0

    @classmethod
    def open(cls, lib: MPI.Intracomm, group) -> "NodeWindows | None":
        """Windows over the ranks of ``lib`` that share memory with this one, or None on every rank when they cannot
        be had. ``group``: the ranks the Communicator's topology puts on this rank's node, which the schedules
        read from; they must share memory with it (collective over ``lib``)."""
        node = lib.Split_type(MPI.COMM_TYPE_SHARED)
        assert isinstance(node, MPI.Intracomm)  # mpi4py splits an Intracomm into Intracomms (its stub says Comm)
        ranks = np.empty(node.Get_size(), np.int64)
        node.Allgather(np.array([lib.Get_rank()], np.int64), ranks)   # a buffer, never a pickle
        members = ranks.tolist()
        ok = np.array([set(group) <= set(members)], np.int32)
        lib.Allreduce(MPI.IN_PLACE, ok, op=MPI.MIN)  # one rank's verdict is every rank's
        if not ok[0]:
            node.Free()
            return None
        windows = cls(node, members, lib)
        try:  # a node that refuses shared windows (no /dev/shm, limits): messages instead
            windows.slots[0] = Slot(windows.comms[0], _PAGE, members)
            ok[0] = 1
        except MPI.Exception:
            ok[0] = 0
        lib.Allreduce(MPI.IN_PLACE, ok, op=MPI.MIN)
        if not ok[0]:   # the windows some ranks may hold are left as they are: freeing them is collective
            windows.slots = [None] * SLOTS
            windows.free()
            return None
        # a page for each slot: small non-blocking calls, which never grow a slot, use them from the start
        windows.slots[1:] = [Slot(comm, _PAGE, members) for comm in windows.comms[1:]]
        return windows

    def enter(self, call: CallId, key: int, nbytes: int, source: tuple[int, int] = (-1, 0),
              grows: bool = True, sink: tuple[int, int] = (-1, 0), room: bool = True) -> "Ticket":
        """A window call starts, in call order: its agreement starts (nothing waits here); ``settle`` ends it.

        ``key`` (``fingerprint``) stands for the call's shape: ranks whose calls differ would read
        what their peers never published, so the job ends naming the call, as for messages of the
        wrong size. Growing needs every rank's share of the node's shared memory (a container's
        /dev/shm may be 64 MiB, and a page touched past its end kills the process): when any rank
        sees too little free, every rank's call runs its message schedule. Checked here against the most a growth
        can take (``nbytes`` a rank: the slot then doubles or takes ``nbytes``, from less than ``nbytes``) and every
        growth checked and not yet made (``pending``); made in ``settle``, where every rank's slot is as large.
        A call that may not grow its slot (``grows`` False: a non-blocking call, whose ``test()`` must not wait
        for the other ranks, as a growth does) runs its message schedule where the slot is too small.
        One small non-blocking allgather on a communicator of its own, which only these calls use (on several nodes,
        a second over every rank of the Communicator, so that every node decides alike). It also tells every rank
        where each rank's input lies when it is in a ``shared_empty`` window (``source``, from ``locate``), so that
        peers read it there, and its ``out`` (``sink``), so that a schedule that ``puts`` writes results there.
        ``room``: this call needs room in its slot because of this rank (it publishes something whatever its peers'
        arrays, or it takes a ``puts`` schedule's result from the slot); where no rank does, the call publishes
        nothing, takes its slot as it is and needs no free shared memory, which a rank without ``room`` therefore
        does not check.
        """
        with self.lock:
            return self._enter(call, key, nbytes, source, grows, sink, room)

    def _enter(self, call: CallId, key: int, nbytes: int, source: tuple[int, int], grows: bool,
               sink: tuple[int, int], room: bool) -> "Ticket":
        index = self.calls % SLOTS
        self.calls += 1
        slot, ok, more = self.slots[index], 1, 0
        if grows and room and (slot is None or slot.nbytes < nbytes):   # it may grow (unless calls before grow it)
            more = _pages(nbytes) * len(self.members)
            free = shm_free()
            ok = int(free is None or free >= more + self.pending + _SHM_SPARE)
        reserved = more if ok else 0
        self.pending += reserved
        mine = np.array([call.seq, key, ok, *source, *sink, room], np.int64)
        ticket = Ticket(call, index, nbytes, grows, reserved, mine, len(self.members))
        ticket.requests.append(self.control.Iallgather(ticket.mine, ticket.table))
        if self.world is not None:   # several nodes: their schedules meet in messages, so every node decides alike
            ticket.world_table = np.empty((self.world.Get_size(), 3), np.int64)
            ticket.requests.append(self.world.Iallgather(ticket.mine[:3], ticket.world_table))
        self.queue.append(ticket)
        return ticket

    def settle(self, ticket: "Ticket", block: bool, watch=None) -> bool:
        """Settle the window calls in call order up to ``ticket``: each one's agreement read, and its slot taken when
        the ranks agreed on windows (``ticket.slot``; None: its message schedule). False when something it waits for
        is not there yet (``block`` False), or another thread is at it; ``block``: waits (``watch``: under
        PYCOLLECT_TIMEOUT)."""
        if ticket.settled:
            return True
        if not self.lock.acquire(blocking=block):
            return False
        try:
            return self._settle(ticket, block, watch)
        finally:
            self.lock.release()

    def _settle(self, ticket: "Ticket", block: bool, watch) -> bool:
        while not ticket.settled:
            head = self.queue[0]
            if not head.agreed and not self._agree(head, block, watch):
                return False
            if head.ok and not self._seat(head, block, watch):
                return False
            head.settled = True
            self.queue.popleft()
        return True

    def _agree(self, ticket: "Ticket", block: bool, watch) -> bool:
        """Read ``ticket``'s agreement once its allgathers completed; the job ends when the calls do not pair up."""
        call = ticket.call
        if block:
            for request in ticket.requests:
                wait_for(request, watch, call.collective, call.seq, "window agreement")
        elif not MPI.Request.Testall(ticket.requests):
            return False
        seqs, keys, oks, windows, offsets, sink_windows, sink_offsets, rooms = ticket.table.T.tolist()
        ticket.sources = dict(zip(self.members, zip(windows, offsets)))
        ticket.sinks = dict(zip(self.members, zip(sink_windows, sink_offsets)))
        if not any(rooms):   # nothing published: any slot will do
            ticket.nbytes = 0
        if ticket.world_table is not None:
            seqs, keys, oks = ticket.world_table.T.tolist()
        if min(seqs) != max(seqs):
            end_job(do_not_pair(call, f"at its start, the ranks were at calls #{min(seqs)} to #{max(seqs)} "
                                      f"of this communicator"))
        if min(keys) != max(keys):
            end_job(do_not_pair(call, "at its start, the ranks' calls differ in shape, counts, root, dtype or op"))
        ticket.agreed, ticket.ok = True, bool(min(oks))
        if not ticket.ok:
            self._unreserve(ticket)
        return True

    @staticmethod
    def _grown(slot: "Slot | None", nbytes: int) -> int:
        return max(nbytes, 2 * slot.nbytes if slot is not None else 0)

    def _unreserve(self, ticket: "Ticket") -> None:
        self.pending -= ticket.reserved
        ticket.reserved = 0

    def _seat(self, ticket: "Ticket", block: bool, watch=None) -> bool:
        """Take ``ticket``'s slot, once the call before it on that slot ended on this rank (every rank started
        it, so it can end), grown when the call needs more; False when that call is still running (``block``
        False). Every rank settles the same calls in the same order: their slots are alike here, and so is the
        growth."""
        slot = self.slots[ticket.index]
        if not ticket.grows and (slot is None or slot.nbytes < ticket.nbytes):
            ticket.ok = False   # its messages: the slot would have to grow
            return True
        if slot is not None and slot.holder is not None and not slot.holder.done:
            if not block and not slot.holder.test():
                return False
            slot.finish_holder()
        if slot is None or slot.nbytes < ticket.nbytes:
            grown = self._grown(slot, ticket.nbytes)
            if watch is not None:   # MPI's window calls wait unwatched: every rank meets first, to the deadline (a
                # peer that timed out in this call's agreement and went on to free() left the others there for ever)
                wait_for(self.comms[ticket.index].Ibarrier(), watch, ticket.call.collective, ticket.call.seq,
                         "growth of its window slot")
            try:   # growing is collective: a rank that fails in it must not leave the others there
                if slot is not None:
                    slot.free()
                slot = self.slots[ticket.index] = Slot(self.comms[ticket.index], grown, self.members)
            except Exception as e:
                collective_failed(str(ticket.call), ticket.call.rank, e)
        self._unreserve(ticket)
        slot.holder, ticket.slot = ticket.holder, slot
        slot.inputs, lent = self._lying(ticket.sources or {})
        slot.outputs, put = self._lying(ticket.sinks or {})
        slot.input_windows = list({id(s): s for s in lent + put}.values())
        return True

    def _lying(self, where: dict[int, tuple[int, int]]) -> tuple[dict[int, np.ndarray | None] | None, list[Slot]]:
        """Each rank's bytes from where its array starts in a ``shared_empty`` window (``(window, offset)``, from the
        agreement; None: in none), or None when no rank's lies in one; and those windows."""
        used = {r: self.shared[w][0] if w >= 0 else None for r, (w, _) in where.items()}
        windows = [s for s in used.values() if s is not None]
        if not windows:
            return None, []
        return {r: None if s is None else s.regions[r][where[r][1]:] for r, s in used.items()}, windows

    def free(self) -> None:
        """Finish every call still holding a slot, then free the windows (collective, like MPI_Comm_free).

        A ``shared_empty`` window that an array still uses on some rank is left allocated (until the process
        ends): freeing it would leave that array pointing at unmapped memory."""
        with self.lock:
            self._free()

    def _free(self) -> None:
        for slot in self.slots:
            if slot is not None:
                slot.finish_holder()
        for slot in self.slots:
            if slot is not None:
                slot.free()
        self.slots = [None] * SLOTS
        self._release_unused()
        self.shared = []
        for comm in self.comms + [self.control, self.node] + ([self.world] if self.world is not None else []):
            comm.Free()
        self.comms = []


def fingerprint(collective: str, problem, dtype, op=None, accumulate: str | None = None) -> int:
    """A number every rank computes alike from a call's shape and reduction, from what is the same on every rank (an
    all-to-all's ``n`` is this rank's own) and ints only (their hashes are the same in every process, a string's is
    not: the op and accumulate enter as CRC-32s of their reprs, a user Op's carrying its code's)."""
    from .shapes import COLLECTIVES
    n = -1 if collective == "alltoall" else problem.n
    parts = (COLLECTIVES.index(collective), n, problem.counts, problem.matrix, problem.root,
             ord(np.dtype(dtype).kind), np.dtype(dtype).itemsize, zlib.crc32(repr((op, accumulate)).encode()))
    return hash(parts) & ((1 << 62) - 1)


class Fence:
    """Every rank of the window has reached this point of call ``call``: a non-blocking allreduce of its number."""

    def __init__(self, slot: Slot, call: CallId, where: str):
        self.call, self.where = call, where
        self.numbers = np.array([call.seq, -call.seq], np.int64)
        self.lowest = np.empty(2, np.int64)
        self.request = slot.comm.Iallreduce(self.numbers, self.lowest, op=MPI.MIN)

    def check(self) -> None:
        """After the request completed: the ranks were all at this call, or the job ends naming the calls."""
        first, last = int(self.lowest[0]), int(-self.lowest[1])
        if first != last:
            end_job(do_not_pair(self.call, f"{self.where}, the ranks were at calls #{first} to #{last} "
                                           f"of this communicator"))


class Ticket:
    """One window call from ``NodeWindows.enter`` to ``settle``: its agreement in flight and, once settled, its slot (None: the ranks did not agree on windows, its message schedule runs)."""

    def __init__(self, call: CallId, index: int, nbytes: int, grows: bool, reserved: int, mine: np.ndarray,
                 members: int):
        self.call, self.index, self.nbytes, self.grows = call, index, nbytes, grows
        self.reserved = reserved                           # bytes counted in NodeWindows.pending for its growth
        self.mine = mine                                   # [seq, key, ok, window, offset, out's window, offset, room]
        self.table = np.empty((members, mine.size), np.int64)
        self.world_table: np.ndarray | None = None
        self.requests: list[MPI.Request] = []
        self.agreed = self.ok = self.settled = False
        self.sources: dict[int, tuple[int, int]] | None = None
        self.sinks: dict[int, tuple[int, int]] | None = None
        self.slot: Slot | None = None
        self.holder: Any = None   # what runs the call (done, test(), wait()): the slot's holder once seated
