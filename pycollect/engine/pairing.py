"""Whether the ranks' calls pair up: the per-call tag as a check, not only as a label.

Every collective call of a Communicator takes the next sequence number when it starts (even one
whose arguments fail their checks), and a schedule's messages carry ``seq & TAG_MASK`` as their
tag. A rank's messages therefore only ever match the same call on the other ranks; when the
ranks' calls do not pair up (a rank skipped a call, or caught its own argument error and went
on), the messages of one call cannot complete another. Two checks turn that into an error
instead of a hang:

- a message that arrives with fewer bytes than the schedule expects (``Execution._land``), and
- while a wait lasts, a message from a peer of the round whose tag belongs to a call that has
  already ended on this rank (``stray_call``): the peer is still in a call this rank left or
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

TAG_MASK = 0x7FFF            # MPI guarantees tags up to 32767
_HALF = (TAG_MASK + 1) // 2  # a tag this far behind the current call is a past call's; further, a later call's


@dataclass(frozen=True, slots=True)
class CallId:
    """One collective call as the messages about it name it: ``allreduce #3 (ring)`` on ``rank``."""

    collective: str
    seq: int
    algorithm: str
    rank: int

    @property
    def tag(self) -> int:
        return self.seq & TAG_MASK

    def __str__(self) -> str:
        return f"{self.collective} #{self.seq} ({self.algorithm})"


def stray_call(tag: int, seq: int, live) -> int | None:
    """The sequence number of the ended call of this rank that a message with ``tag`` belongs to, else None.

    ``seq`` is the call waiting (tags at or before it are past calls), ``live`` the tags of this
    rank's calls still in flight. A tag ahead of ``seq`` is a later call's: a peer may run ahead.
    """
    if tag in live:
        return None
    back = (seq - tag) & TAG_MASK
    return None if back >= _HALF else seq - back


def do_not_pair(call: CallId, what: str) -> str:
    """The message of a call whose messages do not pair up with the other ranks'."""
    return (f"rank {call.rank}: {call}: {what}: the ranks' calls do not pair up (a rank skipped a call or caught "
            f"an error and went on, or the ranks passed different shapes, dtypes, counts or algorithms; "
            f"PYCOLLECT_DEBUG=1 names the difference before anything is sent); aborting the job")
