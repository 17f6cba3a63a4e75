"""Walk schedules without MPI and count what each rank sends and receives, by tier."""
from __future__ import annotations

from dataclasses import dataclass, field

from .schedule import Schedule
from .topology import INTER, INTRA, TIERS, Topology


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
    out = []
    for rank, sched in enumerate(schedules):
        t = RankTraffic(rank)
        for rnd in sched.rounds:
            t.rounds += rnd.communicates
            for s in rnd.sends:
                nbytes = s.src.n * itemsize
                tier = topology.tier(rank, s.peer)
                t.bytes_sent += nbytes
                t.messages_sent += 1
                t.sent_by_tier[tier] += nbytes
                t.messages_by_tier[tier] += 1
            for r in rnd.recvs:
                t.bytes_recv += r.dst.n * itemsize
                t.messages_recv += 1
            t.bytes_copied += sum(c.src.n for c in rnd.pre + rnd.post) * itemsize
        out.append(t)
    return out


__all__ = ["RankTraffic", "Traffic", "count", "INTRA", "INTER"]
