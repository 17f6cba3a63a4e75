"""Ring pieces shared by the ring algorithms and the hierarchical one.

A ring is a list of ranks; ``pos`` is this rank's place in it. ``ranges[i]`` is the
``(start, stop)`` of block i, owned by ``ring[i]`` at the end of a reduce-scatter.
"""
from __future__ import annotations

from collections import Counter

from ..engine.schedule import Recv, Round, Send, Slice
from ..engine.summary import Shape


def reduce_scatter(pos: int, ring, ranges, inp: str, work: str, final: Slice | None = None) -> list[Round]:
    """N-1 rounds; block ``pos`` ends fully reduced in ``work`` (or in ``final`` if given).

    Round k sends block pos-1-k and receives block pos-2-k, added to this rank's own
    ``inp`` copy of it; partial sums live in ``work`` at the same coordinates as ``inp``.
    """
    n = len(ring)
    right, left = ring[(pos + 1) % n], ring[(pos - 1) % n]
    rounds = []
    for k in range(n - 1):
        sb, rb = (pos - 1 - k) % n, (pos - 2 - k) % n
        src = Slice(inp if k == 0 else work, *ranges[sb])
        dst = final if (k == n - 2 and final is not None) else Slice(work, *ranges[rb])
        rounds.append(Round(sends=(Send(right, src),), recvs=(Recv(left, dst, acc=Slice(inp, *ranges[rb])),)))
    return rounds


def allgather(pos: int, ring, ranges, buf: str, own: Slice | None = None) -> list[Round]:
    """N-1 rounds; every block ends in ``buf``. Round k sends block pos-k and receives block pos-k-1.

    ``own``: where this rank's block is at the start if not already in ``buf`` (sent from there
    in round 0 and copied into place after it).
    """
    n = len(ring)
    right, left = ring[(pos + 1) % n], ring[(pos - 1) % n]
    rounds = []
    for k in range(n - 1):
        sb, rb = (pos - k) % n, (pos - k - 1) % n
        src = own if (k == 0 and own is not None) else Slice(buf, *ranges[sb])
        rounds.append(Round(sends=(Send(right, src),), recvs=(Recv(left, Slice(buf, *ranges[rb])),)))
    return rounds


def counted(pairs: tuple, right: int, left: int, reduces: bool) -> tuple:
    """One ring phase as summary entries: ``((sent, received), rounds)`` of each size, to ``right``, from ``left``
    (the forms of the ring algorithms: engine/summary.py), every round sending what the call wrote (a block reduced
    or received before: ``Shape.written``; ``from_input`` turns the one round that sends the caller's input)."""
    return tuple((k, _round(pair, right, left, reduces)) for pair, k in pairs)


def _round(pair: tuple[int, int], right: int, left: int, reduces: bool, written: bool = True) -> Shape:
    a, b = pair
    return Shape(((right, a),), ((left, b, reduces),), written=a if written else 0)


def from_input(pair: tuple[int, int], right: int, left: int, reduces: bool) -> tuple:
    """Entries for a class's own rounds (``RankClasses.add_based``) that make one round of a base of ``counted``, of
    ``pair``, the ring's first, which sends the caller's input: that round, and the base's written one taken back."""
    return ((1, _round(pair, right, left, reduces, False)), (-1, _round(pair, right, left, reduces)))


def counted_from(first: tuple[int, int], pairs: tuple, right: int, left: int, reduces: bool) -> tuple:
    """``counted`` of a phase whose first round, of ``first`` (one of ``pairs``), sends the caller's input: that
    round, then the others."""
    rest = tuple((pair, k - (pair == first)) for pair, k in pairs if k - (pair == first))
    return ((1, _round(first, right, left, reduces, False)),) + counted(rest, right, left, reduces)


class Phase:
    """One ring phase that sends block i and receives block i-1 for every i but one, counted for
    ``RankClasses.add_based``: the rounds of every i, counted by (sent, received) sizes, as a base shared by every
    class whose two peers are on the same tiers, less the round of the block left out. O(N) for any counts, where
    ``summary.ring_phases`` keeps a class's kinds whole (O(N) a class of N distinct sizes)."""

    def __init__(self, lengths, reduces: bool) -> None:
        n = len(lengths)
        self.every = tuple(sorted(Counter((lengths[j], lengths[j - 1]) for j in range(n)).items()))
        self.reduces = reduces
        self._bases: dict = {}

    def less(self, pair: tuple[int, int], right: int, left: int, first: tuple[int, int]) -> tuple:
        """``(base, own)``: every round of the phase to ``right``, from ``left``, the one of ``pair`` taken back, and
        the round of ``first``, the phase's first, sending the caller's input (``from_input``)."""
        base = self._bases.get((right, left))
        if base is None:
            base = self._bases[(right, left)] = counted(self.every, right, left, self.reduces)
        return base, from_input(first, right, left, self.reduces) + ((-1, _round(pair, right, left, self.reduces)),)
