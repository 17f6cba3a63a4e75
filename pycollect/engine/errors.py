"""The exceptions pycollect raises beyond ValueError and TypeError."""
from __future__ import annotations


class CollectiveError(RuntimeError):
    """A collective could not complete."""


class CollectiveMismatchError(ValueError):
    """Validation mode: the ranks called a collective with arguments that do not fit together.

    Raised on every rank of the call, before anything is sent; the message names what
    differs and which ranks passed what.
    """


class CollectiveTimeout(CollectiveError):
    """The watchdog (``PYCOLLECT_TIMEOUT``): a blocking wait passed its deadline.

    ``collective`` and ``seq`` name the call (``seq`` is None for point-to-point),
    ``algorithm`` what ran it, ``round`` the 0-based index of the round it waited in out of
    ``rounds``, ``pending`` the ``(kind, peer)`` of its messages still incomplete (kind
    ``"recv"`` or ``"send"``; empty when MPI's own collective does not say), ``peers`` their
    ranks, ``waited`` the seconds waited, ``timeout`` the limit, ``rank`` the waiting rank.
    """

    def __init__(self, *, collective: str, seq: int | None, algorithm: str, round: int, rounds: int,
                 pending: list, waited: float, timeout: float, rank: int):
        self.collective, self.seq, self.algorithm = collective, seq, algorithm
        self.round, self.rounds, self.timeout, self.rank = round, rounds, timeout, rank
        self.pending = [(kind, int(peer)) for kind, peer in pending]
        self.peers = sorted({peer for _, peer in self.pending})
        self.waited = waited
        super().__init__(self._message())

    def _message(self) -> str:
        call = self.collective if self.seq is None else f"{self.collective} #{self.seq}"
        return (f"rank {self.rank}: {call} ({self.algorithm}) timed out after {self.waited:.2f} s "
                f"(timeout {self.timeout:g} s) in round {self.round} of {self.rounds} (0-based); "
                f"still pending: {describe_pending(self.pending)}")


def describe_pending(pending) -> str:
    """``receive from rank 3, send to rank 1`` for ``[("recv", 3), ("send", 1)]``."""
    if not pending:
        return "MPI's own collective (it does not say which ranks it waits for)"
    return ", ".join(f"{'receive from' if kind == 'recv' else 'send to'} rank {peer}" for kind, peer in pending)
