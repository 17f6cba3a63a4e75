"""Recursive halving and doubling pieces shared by the butterfly algorithms.

Any world size folds to a power of two (as in MPICH and Rabenseifner's paper): with
p' the largest power of two <= N and r = N - p', each even rank below 2r hands its
data to rank+1 and sits out; the others take new ranks 0..p'-1 (rank//2 below 2r,
rank-r above) and run the power-of-two algorithm; results are handed back at the end.

New rank j carries the original blocks ``first_block(j) .. first_block(j+1)-1``
(2j and 2j+1 below r, else j+r), so each new block is a contiguous element range.
"""
from __future__ import annotations

from dataclasses import dataclass

from ..engine.layout import offsets, per_call, pow2_floor
from ..engine.schedule import Copy, Problem, Recv, Round, Schedule, Send, Slice
from ..engine.summary import AWAY, IDLE, MATE, RankClasses, written_after_first


@dataclass(frozen=True)
class Fold:
    """The power-of-two core of ``size`` ranks and who stands in for whom."""

    size: int

    @property
    def p2(self) -> int:
        return pow2_floor(self.size)

    @property
    def extra(self) -> int:
        return self.size - self.p2

    def sits_out(self, rank: int) -> bool:
        """Even ranks below 2r: hand their data to rank+1 and wait for the result."""
        return rank < 2 * self.extra and rank % 2 == 0

    def absorbs(self, rank: int) -> bool:
        """Odd ranks below 2r: take in rank-1's data and hand it the result at the end."""
        return rank < 2 * self.extra and rank % 2 == 1

    def newrank(self, rank: int) -> int | None:
        if self.sits_out(rank):
            return None
        return rank // 2 if rank < 2 * self.extra else rank - self.extra

    def rank_of(self, newrank: int) -> int:
        return 2 * newrank + 1 if newrank < self.extra else newrank + self.extra

    def first_block(self, newrank: int) -> int:
        """First original block that ``newrank`` carries; ``first_block(p2) == size``."""
        return 2 * newrank if newrank < self.extra else newrank + self.extra


@per_call
def block_bounds(counts: tuple, size: int) -> tuple[tuple[int, ...], tuple[int, ...]]:
    """``(offs, bounds)``: where each rank's block starts (N+1), and where each block of the power-of-two core
    starts (p'+1: a folded pair's two blocks make one)."""
    offs = offsets(counts)
    fold = Fold(size)
    return offs, tuple(offs[fold.first_block(j)] for j in range(fold.p2 + 1))


def distances(p2: int, descending: bool = True) -> list[int]:
    """Partner distances 2^k of the halving steps: p2/2 .. 1, or 1 .. p2/2."""
    ds = [1 << k for k in range(p2.bit_length() - 1)]
    return ds[::-1] if descending else ds


@dataclass(frozen=True)
class Step:
    """One halving step: ``peer`` (world rank) and the new-block ranges ``[lo, hi)`` kept and given."""

    peer: int
    keep: tuple[int, int]
    give: tuple[int, int]


def halving_steps(fold: Fold, me: int, dists) -> list[Step]:
    """Split blocks ``[0, p2)`` in halves once per distance d; the half a rank keeps follows bit d of ``me``.

    Partners ``me`` and ``me ^ d`` agree on the range being split (their earlier choices
    used other bits) and keep opposite halves. With descending distances new rank j ends
    with block j; with ascending ones, with block bitreverse(j).
    """
    lo, hi = 0, fold.p2
    steps = []
    for d in dists:
        mid = (lo + hi) // 2
        keep, give = ((mid, hi), (lo, mid)) if me & d else ((lo, mid), (mid, hi))
        steps.append(Step(fold.rank_of(me ^ d), keep, give))
        lo, hi = keep
    return steps


def _elems(buf: str, bounds, blocks: tuple[int, int]) -> Slice:
    return Slice(buf, bounds[blocks[0]], bounds[blocks[1]])


def reduce_scatter_rounds(steps, bounds, first: str, work: str, last: Slice | None = None) -> list[Round]:
    """Recursive halving: send the partner's half, reduce the kept half with what comes back.

    ``bounds[j]`` is where new block j starts (p2+1 entries). Step 0 reads ``first``,
    later steps ``work``; the kept half goes to ``work`` at the same coordinates, or on
    the last step to ``last``. Kept and given halves are disjoint, so ``work`` may be
    ``out`` aliasing ``first == "in"``.
    """
    rounds, src = [], first
    for i, s in enumerate(steps):
        dst = last if (last is not None and i == len(steps) - 1) else _elems(work, bounds, s.keep)
        rounds.append(Round(sends=(Send(s.peer, _elems(src, bounds, s.give)),),
                            recvs=(Recv(s.peer, dst, acc=_elems(src, bounds, s.keep)),)))
        src = work
    return rounds


def allgather_rounds(steps, bounds, buf: str) -> list[Round]:
    """Recursive doubling, the halving steps undone in reverse: send what is held, receive the partner's half."""
    return [Round(sends=(Send(s.peer, _elems(buf, bounds, s.keep)),),
                  recvs=(Recv(s.peer, _elems(buf, bounds, s.give)),)) for s in reversed(steps)]


def folded_allreduce(p: Problem, core) -> Schedule:
    """The frame the recursive allreduces share: trivial cases, fold in, ``core``, fold out.

    ``core(fold, first)`` gives ``(rounds, tmp)`` for the p' ranks left, reading this rank's
    contribution from buffer ``first`` ("out" where a neighbour's data was folded in) and
    leaving the sum in "out".
    """
    whole = {b: Slice(b, 0, p.n) for b in ("in", "out")}
    if p.size == 1 or p.n == 0:
        return Schedule((Round(pre=(Copy(whole["in"], whole["out"]),)),))
    fold = Fold(p.size)
    if fold.sits_out(p.rank):
        # Hand the vector to rank+1, which reduces it for both, and take the result back.
        return Schedule((Round(sends=(Send(p.rank + 1, whole["in"]),)),
                         Round(recvs=(Recv(p.rank + 1, whole["out"]),))))
    rounds, first = [], "in"
    if fold.absorbs(p.rank):
        rounds.append(Round(recvs=(Recv(p.rank - 1, whole["out"], acc=whole["in"], incoming_first=True),)))
        first = "out"
    inner, tmp = core(fold, first)
    rounds += inner
    if fold.absorbs(p.rank):
        rounds.append(Round(sends=(Send(p.rank - 1, whole["out"]),)))
    return Schedule(tuple(rounds), tmp=tmp)


def halving_sizes(p2: int, me: int, dists, bounds) -> tuple[tuple[int, int], ...]:
    """``halving_steps`` on a power of two as numbers, for the counted forms (engine/summary.py): per step the
    elements kept and given, where ``bounds[j]`` is where block j starts (p2+1 entries); the partner is me ^ d."""
    lo, hi, out = 0, p2, []
    for d in dists:
        mid = (lo + hi) // 2
        (a, b), (c, e) = ((mid, hi), (lo, mid)) if me & d else ((lo, mid), (mid, hi))
        out.append((bounds[b] - bounds[a], bounds[e] - bounds[c]))
        lo, hi = a, b
    return tuple(out)


def butterfly(p: Problem) -> bool:
    """Whether the counted forms cover a recursive schedule of ``p``: more than one rank (one rank copies, walked)."""
    return p.size > 1


def counted(p: Problem, bounds, descending: bool, rounds, own=lambda r: 0, edges=None,
            written=lambda kind, rounds: written_after_first(rounds)) -> RankClasses:
    """Every rank's summary of a butterfly (engine/summary.py), folded where N is not a power of two.

    A core rank's class is the tier of each partner, the sizes its steps keep and give (the same for every rank on
    equal blocks; none without ``bounds``, the p'+1 starts of the core's blocks) and ``own(r)``; ``rounds(tiers,
    sizes, own)`` gives a class's rounds, as ``RankClasses.add`` takes them. A fold (``Fold``) adds the
    rounds ``edges(r, tier)`` gives, ``(before, after)`` with ``tier`` the peer of the pair: an absorbing rank
    runs them around its core, a rank that sits out runs them around the core's rounds idle, and every other
    rank idles through the fold-in round. Ranks stay in step: the absorbing ranks start the core one round late
    and every core rank's last step waits on all of them, so each core rank ends one round after p' ranks would.
    ``written(kind, rounds)`` marks what a class's rounds send that the call wrote (``Shape.written``; ``kind`` "out"
    for a rank that sits out, "core" for the others); by default every round after the first communicating one.
    """
    fold, classes, node_of = Fold(p.size), RankClasses(p.topology), p.topology.node_of
    p2, extra = fold.p2, fold.extra              # Fold's rank_of inline below: called N log N times
    dists = distances(p2, descending)
    even = bounds is None or len({bounds[j + 1] - bounds[j] for j in range(p2)}) == 1
    shared = () if bounds is None else halving_sizes(p2, 0, dists, bounds)
    late = (IDLE,) if extra else ()       # the fold-in round, which the plain core ranks wait through
    some = shared if even else halving_sizes(p2, 0, dists, bounds)
    idle_core = (IDLE,) * len(rounds(tuple(AWAY for _ in dists), some, 0))   # what a rank that sits out waits through
    build = _framed(rounds, written)
    for r in range(p.size):
        home = node_of[r]
        folded = r < 2 * extra                   # fold.sits_out(r) (even r) or fold.absorbs(r) (odd r)
        if folded and r % 2 == 0:
            before, after = edges(r, MATE if node_of[r + 1] == home else AWAY)
            key: tuple = ("out", before, idle_core, after)   # a class: its rounds before, in and after the core
        else:
            me = r // 2 if folded else r - extra   # fold.newrank(r)
            tiers = tuple(MATE if node_of[2 * (me ^ d) + 1 if me ^ d < extra else (me ^ d) + extra] == home else AWAY
                          for d in dists)   # classes.where of each partner, fold.rank_of(me ^ d)
            sizes = shared if even else halving_sizes(p2, me, dists, bounds)
            before, after = edges(r, MATE if node_of[r - 1] == home else AWAY) if folded else (late, ())
            key = ("core", before, (tiers, sizes, own(r)), after)
        classes.add(r, key, build)
    return classes


def _framed(rounds, written):
    """A class's rounds from its key ``(kind, before, core, after)``: ``core`` holds the arguments of the core's
    ``rounds``, or (kind "out", a rank that sits out) the idle rounds it waits through."""
    def build(key):
        kind, before, core, after = key
        return written(kind, [*before, *(core if kind == "out" else rounds(*core)), *after])
    return build


def allreduce_edges(p: Problem):
    """``folded_allreduce``'s fold as ``counted`` takes it: the rank that sits out sends its whole vector and
    takes the sum back; its partner reduces the vector in and sends the sum out."""
    fold, n = Fold(p.size), p.n

    def edges(r: int, q: int):
        if fold.sits_out(r):
            return ((((q, n),), (), 0),), (((), ((q, n, False),), 0),)
        return (((), ((q, n, True),), 0),), ((((q, n),), (), 0),)
    return edges
