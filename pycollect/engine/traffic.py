"""Walk schedules without MPI and count what each rank sends and receives, by tier."""
from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

from .schedule import Schedule
from .summary import Deferred, RankClasses, StandIns, Summary, of_schedule
from .topology import INTER, INTRA, SELF, TIERS, Topology


@dataclass
class RankTraffic:
    rank: int
    bytes_sent: int = 0
    bytes_recv: int = 0
    messages_sent: int = 0
    messages_recv: int = 0
    rounds: int = 0
    bytes_copied: int = 0
    sent_by_tier: dict = field(default_factory=lambda: {t: 0 for t in TIERS})
    messages_by_tier: dict = field(default_factory=lambda: {t: 0 for t in TIERS})


@dataclass
class Traffic:
    """Per-rank counts for one collective call, and the totals and maxima tools price."""

    collective: str
    algorithm: str
    size: int
    itemsize: int
    per_rank: list

    @property
    def total_bytes(self) -> int:
        return sum(t.bytes_sent for t in self.per_rank)

    @property
    def max_bytes_sent(self) -> int:
        return max(t.bytes_sent for t in self.per_rank)

    @property
    def rounds(self) -> int:
        """Communicating rounds of the busiest rank (the critical path in rounds)."""
        return max(t.rounds for t in self.per_rank)

    def bytes_by_tier(self) -> dict:
        out = {t: 0 for t in TIERS}
        for t in self.per_rank:
            for tier, b in t.sent_by_tier.items():
                out[tier] += b
        return out

    def max_sent_by_tier(self, tier: str) -> int:
        return max(t.sent_by_tier[tier] for t in self.per_rank)

    def summary(self) -> dict:
        return {"collective": self.collective, "algorithm": self.algorithm, "size": self.size,
                "total_bytes": self.total_bytes, "max_bytes_sent": self.max_bytes_sent,
                "rounds": self.rounds, "bytes_by_tier": self.bytes_by_tier()}


def count(schedules: list[Schedule], topology: Topology, itemsize: int) -> list[RankTraffic]:
    """Counts of every rank's schedule; ``schedules[r]`` belongs to rank r."""
    return count_summaries([of_schedule(s) for s in schedules], topology, itemsize)


def count_summaries(summaries: Sequence[Summary], topology: Topology, itemsize: int) -> list[RankTraffic]:
    """Counts of every rank's summary (engine/summary.py); ``summaries[r]`` belongs to rank r.

    A counted form's ``RankClasses`` are counted once a class (``count_classes``); any other list one summary at a
    time, except that ranks of one node that share one summary object count the same, unless the rank is one of
    its peers: counted once a node.
    """
    if isinstance(summaries, RankClasses):
        counted = summaries.fold(_class_count(itemsize))
        return [_renamed(counted[c], r) for r, c in enumerate(summaries.class_of)]
    out: list[RankTraffic] = []
    seen: dict[tuple[int, int], tuple[RankTraffic, set[int]]] = {}   # (summary id, node): its count, its peers
    node_of = topology.node_of
    for rank, summary in enumerate(summaries):
        key = (id(summary), node_of[rank])      # the list holds every summary, so no id is reused meanwhile
        hit = seen.get(key)
        if hit is not None and rank not in hit[1]:
            out.append(_renamed(hit[0], rank))
            continue
        t = _count(rank, summary, topology.tier, itemsize)
        if hit is None:
            seen[key] = (t, {peer for _, shape in summary for peer, *_ in shape.sends + shape.recvs})
        out.append(t)
    return out


def count_classes(classes: RankClasses, itemsize: int) -> list[tuple[RankTraffic, int, int]]:
    """``(counts, ranks, class number)`` of every class of ``classes`` that has a rank, in class order, each counted
    once from its rounds (a ``MATE`` peer is on the rank's node, an ``AWAY`` one on another; a shared base once for
    all its classes: ``RankClasses.fold``), its ``rank`` the first of its ranks."""
    counted = classes.fold(_class_count(itemsize))
    for c, _, first in classes.classes():
        counted[c].rank = first                 # fold counts each class into an object of its own
    return [(counted[c], ranks, c) for c, ranks, _ in classes.classes()]


def _class_count(itemsize: int) -> Callable[[Summary, RankTraffic | None], RankTraffic]:
    """What ``RankClasses.fold`` counts a class's rounds with: a template's peers read as stand-ins of their tiers; a
    base or class that counts itself (``summary.Deferred``) is not walked."""
    def value(summary: Summary, start: RankTraffic | None) -> RankTraffic:
        if isinstance(summary, Deferred):
            return summary.counted(itemsize, start)
        return _count(0, summary, StandIns.tier, itemsize, start)
    return value


def _count(rank: int, summary: Summary, tier_of: Callable[[int, int], str], itemsize: int,
           start: RankTraffic | None = None) -> RankTraffic:
    """Rank ``rank``'s counts; ``tier_of(rank, peer)`` the tier of each message; going on from ``start``'s (left as
    it is) where given."""
    t = RankTraffic(rank) if start is None else _renamed(start, rank)
    for k, shape in summary:
        t.rounds += k * shape.communicates
        for peer, n in shape.sends:
            nbytes = k * n * itemsize
            tier = tier_of(rank, peer)
            t.bytes_sent += nbytes
            t.messages_sent += k
            t.sent_by_tier[tier] += nbytes
            t.messages_by_tier[tier] += k
        for _, n, _ in shape.recvs:
            t.bytes_recv += k * n * itemsize
            t.messages_recv += k
        t.bytes_copied += k * shape.copied * itemsize
    return t


def tallied(row, itemsize: int) -> RankTraffic:
    """A rank's counts from a form's closed form in elements: ``(sent, messages sent, sent on its node, messages
    on its node, received, messages received, rounds, copied)`` (one row of a ``summary.Deferred``'s NumPy table)."""
    sent, messages, near, near_messages, got, got_messages, rounds, copied = (int(v) for v in row)
    return RankTraffic(0, sent * itemsize, got * itemsize, messages, got_messages, rounds, copied * itemsize,
                       {SELF: 0, INTRA: near * itemsize, INTER: (sent - near) * itemsize},
                       {SELF: 0, INTRA: near_messages, INTER: messages - near_messages})


def _renamed(t: RankTraffic, rank: int) -> RankTraffic:
    return RankTraffic(rank, t.bytes_sent, t.bytes_recv, t.messages_sent, t.messages_recv, t.rounds, t.bytes_copied,
                       dict(t.sent_by_tier), dict(t.messages_by_tier))

__all__ = ["RankTraffic", "Traffic", "count", "INTRA", "INTER"]
