"""A rank's schedule as counted rounds: what the traffic walker and the cost model read, at any scale.

The traffic of a rank and its time in the cost model depend on each round only through the
sizes and peers of its messages, whether each receive reduces, and what it copies. A
``Summary`` keeps just that, with equal rounds in a row counted once: ``((repeat, shape), ...)``.
``of_schedule`` summarises any schedule (the reference); an algorithm module may also define
``summaries(problem)``, every rank's counts computed without building the rounds, so that a
ring of 16384 ranks is counted in O(N) rather than O(N^2) (``algorithms.registry.all_summaries`` uses
it where it exists, and tests/test_summary.py holds every such form equal to the walk of the
schedules). The walkers read a message's peer only for its tier, so a form may count rounds that
differ only in their peers as one kind, naming one peer of the same tiers (the pairwise form does).
"""
from __future__ import annotations

from collections import Counter
from dataclasses import dataclass

from .schedule import Round, Schedule


@dataclass(frozen=True, slots=True)
class Shape:
    """One round, as the walkers see it: ``sends`` ``(peer, elements)``, ``recvs`` ``(peer, elements, reduces)``,
    ``copied`` elements of its local copies, ``window`` whether it goes through shared-memory windows and
    ``published`` the elements it copies into its window (each range once, however many peers read it)."""

    sends: tuple[tuple[int, int], ...] = ()
    recvs: tuple[tuple[int, int, bool], ...] = ()
    copied: int = 0
    window: bool = False
    published: int = 0

    @property
    def communicates(self) -> bool:
        return bool(self.sends or self.recvs)


Summary = tuple[tuple[int, Shape], ...]


def shape_of(rnd: Round) -> Shape:
    published = sum(src.n for _, src in dict.fromkeys((s.at, s.src) for s in rnd.sends)) if rnd.window else 0
    return Shape(tuple((s.peer, s.src.n) for s in rnd.sends),
                 tuple((r.peer, r.dst.n, r.acc is not None) for r in rnd.recvs),
                 sum(c.src.n for c in rnd.pre + rnd.post), rnd.window, published)


def compress(shapes) -> Summary:
    """``shapes`` in order, equal neighbours counted once."""
    out: list[list] = []
    for shape in shapes:
        if out and out[-1][1] == shape:
            out[-1][0] += 1
        else:
            out.append([1, shape])
    return tuple((k, s) for k, s in out)


def join(*parts: Summary) -> Summary:
    """Summaries one after another, as one: equal rounds where two meet counted once, as ``compress`` does."""
    out: list[list] = []
    for part in parts:
        for k, shape in part:
            if out and out[-1][1] == shape:
                out[-1][0] += k
            else:
                out.append([k, shape])
    return tuple((k, s) for k, s in out)


def of_schedule(schedule: Schedule) -> Summary:
    return compress(shape_of(rnd) for rnd in schedule.rounds)


def ring_phases(lengths):
    """``except_block(j)``: one ring phase's (sent, received) sizes, counted by kind, when the phase visits every
    block i but j, sending block i and receiving block i-1 (indices mod the count). Each kind of excluded
    pair is counted once, so N ranks cost O(N), not O(N^2)."""
    n = len(lengths)
    every = Counter((lengths[j], lengths[j - 1]) for j in range(n))
    seen: dict = {}

    def except_block(j: int) -> tuple:
        pair = (lengths[j % n], lengths[(j - 1) % n])
        hit = seen.get(pair)
        if hit is None:
            left = Counter(every)
            left[pair] -= 1
            hit = seen[pair] = tuple(sorted((+left).items()))
        return hit
    return except_block
