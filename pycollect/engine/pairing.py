"""Whether the ranks' calls pair up: the per-call tag as a check, not only as a label.

Every collective call of a Communicator takes the next sequence number when it starts (even one
whose arguments fail their checks), and a schedule's messages carry it, masked to the tag space
(``LiveTags``), as their tag. A rank's messages therefore only ever match the same call on the
other ranks; when the ranks' calls do not pair up (a rank skipped a call, or caught its own
argument error and went on), the messages of one call cannot complete another. Two checks turn
that into an error instead of a hang:

- a message that arrives with fewer bytes than the schedule expects (``Execution._land``), and
- while a wait lasts, a message from a peer of the round whose tag belongs to a call that has
  already ended on this rank (``stray_message``): the peer is still in a call this rank left or
  never ran.

The exchange of counts before an allgather without counts or an alltoall with a row of them
carries the sequence number too (``Communicator._exchange``), which finds a skipped call there
whatever algorithm follows. Each ends the job (engine/abort.py) naming the calls. What cannot be
seen: MPI's own collectives (``algorithm="mpi"``) pair by order inside MPI, and calls that differ without
changing any message's size (another op, a float32 against an int32 of the same length).
Validation mode (``PYCOLLECT_DEBUG=1``) compares those before anything is sent.
"""
from __future__ import annotations

from dataclasses import dataclass

from mpi4py.MPI import ANY_TAG, Status

from .abort import end_job

MPI_LEAST_TAG_UB = 32767     # MPI guarantees tags up to this


class LiveTags(set):
    """The tags of a rank's calls in flight on one Communicator (a set of ints), and the tag space they come from.

    A call's tag is its number modulo the largest power of two within MPI's ``TAG_UB`` (one value on every
    process, MPI says): 2**29 under MPICH, 2**15 at MPI's guaranteed least. Two rules keep a tag naming one call,
    each checked as a call starts (``admit``): no earlier call with its tag may still be in flight on this rank
    (MPI pairs messages of one tag first come, first served: the two calls' rounds would take each other's
    blocks, a wrong answer without an error), and fewer than half the tag space of calls may be in flight
    (``stray_call`` tells a past call's tag from a later one's by that half).
    """

    def __init__(self, tag_ub: int = MPI_LEAST_TAG_UB):
        super().__init__()
        self.mask = (1 << ((tag_ub + 1).bit_length() - 1)) - 1

    @property
    def half(self) -> int:
        """A tag this far behind the waiting call is a past call's; further, a later call's."""
        return (self.mask + 1) // 2

    def of(self, seq: int) -> int:
        """The tag of call number ``seq``."""
        return seq & self.mask

    def admit(self, seq: int) -> None:
        """Raise RuntimeError, naming what to wait for, when call ``seq`` may not start on this rank."""
        space = f"this MPI's TAG_UB gives pycollect {self.mask + 1} tags, taken in turn by the calls"
        if self.of(seq) in self:
            raise RuntimeError(f"call #{seq} cannot start on this rank: an earlier call with the same tag "
                               f"(#{seq - self.mask - 1}, or one a multiple of {self.mask + 1} calls before it) is "
                               f"still in flight here, and MPI would pair the two calls' messages first come, first "
                               f"served ({space}): wait() for its Request first")
        if len(self) >= self.half:
            raise RuntimeError(f"call #{seq} cannot start on this rank: {len(self)} calls are in flight here, half "
                               f"the tag space ({space}); beyond it a later call's message could not be told from "
                               f"a past call's: wait() for some of their Requests first")


@dataclass(frozen=True, slots=True)
class CallId:
    """One collective call as the messages about it name it: ``allreduce #3 (ring)`` on ``rank``."""

    collective: str
    seq: int
    algorithm: str
    rank: int

    def __str__(self) -> str:
        return f"{self.collective} #{self.seq} ({self.algorithm})"


def stray_call(tag: int, seq: int, live: LiveTags) -> int | None:
    """The sequence number of the ended call of this rank that a message with ``tag`` belongs to, else None.

    ``seq`` is the call waiting (tags at or before it are past calls), ``live`` the tags of this
    rank's calls still in flight. A tag ahead of ``seq`` is a later call's: a peer may run ahead.
    """
    if tag in live:
        return None
    back = live.of(seq - tag)
    return None if back >= live.half else seq - back


def stray_message(comm, peer: int, seq: int, live: LiveTags, status) -> int | None:
    """The number of the ended call whose message from ``peer`` waits unreceived on ``comm`` (``status`` filled by
    the probe), else None; ``seq`` is the call waiting.

    The probe and the look at ``live`` are two steps, and another thread may receive that very message between
    them and end its call, whose tag then leaves ``live`` (a Request waited in a thread of its own). A message of
    a call that ended here is never received, so only one still there on a second look is a stray.
    """
    if not comm.Iprobe(peer, ANY_TAG, status):
        return None
    tag = status.Get_tag()
    ended = stray_call(tag, seq, live)
    return ended if ended is not None and comm.Iprobe(peer, tag) else None


def end_job_on_a_stray(comm, peers, call: CallId, live: LiveTags, waiting: str = "while it waits") -> None:
    """End the job where one of ``peers`` sent ``call`` a message of a call that ended on this rank
    (``stray_message``): a look while a wait lasts (a schedule's round, a refused call's recheck)."""
    status = Status()
    for peer in peers:
        ended = stray_message(comm, peer, call.seq, live, status)
        if ended is not None:
            end_job(do_not_pair(call, f"{waiting}, rank {peer} sent a message of call #{ended}, which has ended "
                                      f"on this rank"))


def do_not_pair(call: CallId, what: str) -> str:
    """The message of a call whose messages do not pair up with the other ranks'."""
    return (f"rank {call.rank}: {call}: {what}: the ranks' calls do not pair up (a rank skipped a call or caught "
            f"an error and went on, or the ranks passed different shapes, dtypes, counts or algorithms; "
            f"PYCOLLECT_DEBUG=1 names the difference before anything is sent); aborting the job")
