"""Recursive-doubling scan (Hillis-Steele): ceil(log2 p) rounds; in round k rank r sends its partial prefix to
rank r + 2^k and reduces the one of rank r - 2^k onto its own.

After round k rank r holds the reduction of the 2^(k+1) ranks ending at r (fewer near rank 0), so the rounds
stop once that run reaches rank 0 everywhere. The incoming run lies just below the one held, and goes on the
left (a local ``Copy`` with ``acc``), so a non-commutative op is reduced in rank order. One message a round
suits short vectors; a rank sends the whole vector in every round where r + 2^k < p.

``exclusive`` (exscan_recursive_doubling): a first round hands each rank its lower neighbour's input, the run of
one rank just below it; the same doubling then grows runs that end at r - 1, for ceil(log2(p - 1)) more rounds
(ranks whose run already starts at rank 1 pass it on). Rank 0 only sends its input in that first round.
"""
from __future__ import annotations

from ..engine.schedule import EMPTY, Copy, Problem, Recv, Round, Schedule, Send, Slice
from ..engine.summary import RankClasses, all_written, written_after_first


def schedule(p: Problem) -> Schedule:
    return build(p, exclusive=False)


def build(p: Problem, exclusive: bool) -> Schedule:
    """Rank ``p.rank``'s rounds; ``exclusive``: ranks 0..r-1 without rank r's own (MPI_Exscan)."""
    if p.n == 0 or (exclusive and p.size == 1):
        return EMPTY
    r, size = p.rank, p.size
    src, out, tmp = Slice("in", 0, p.n), Slice("out", 0, p.n), Slice("tmp", 0, p.n)
    rounds = []
    if exclusive:   # the input of rank r - 1, through tmp: in and out may be one buffer, and in is being sent
        rounds.append(Round(sends=_to(r + 1, size, src), recvs=(Recv(r - 1, tmp),) if r >= 1 else (),
                            post=(Copy(tmp, out),) if r >= 1 else ()))
    lowest, reach = (1, size - 1) if exclusive else (0, size)   # exclusive runs end at r - 1: ranks >= 1 hold one
    d = 1
    while d < reach:   # a run of d ranks becomes one of 2d: the run of rank r - d goes below this one
        gets = r - d >= lowest
        rounds.append(Round(sends=_to(r + d, size, out) if r >= lowest else (),
                            recvs=(Recv(r - d, tmp),) if gets else (), post=(Copy(out, out, acc=tmp),) if gets else ()))
        d *= 2
    if not exclusive:   # rank r's own block starts its run (before it is first sent)
        rounds[:1] = [Round(rounds[0].sends, rounds[0].recvs, (Copy(src, out),), rounds[0].post)] if rounds \
            else [Round(pre=(Copy(src, out),))]
    kept = tuple(rnd for rnd in rounds if rnd.communicates or rnd.pre or rnd.post)
    return Schedule(kept, tmp=p.n if any(rnd.recvs for rnd in kept) else 0)


def _to(peer: int, size: int, what: Slice) -> tuple[Send, ...]:
    return (Send(peer, what),) if peer < size else ()


# -- counted form (engine/summary.py) ----------------------------------------------------------------------
def summaries(p: Problem):
    return counted(p, exclusive=False)


def counted(p: Problem, exclusive: bool):
    """Every rank's rounds counted without building them: a rank's class is, round by round, the tier of the rank
    it sends to and of the one it receives from (or none). Every rank's round t meets round t of its peers, and
    a rank that neither sends nor receives in a round does so in none after it, so the rounds need no idle ones.
    One rank, an empty vector: None (walked)."""
    if p.n == 0 or p.size == 1:
        return None
    classes, n, size = RankClasses(p.topology), p.n, p.size
    lowest, reach = (1, size - 1) if exclusive else (0, size)
    steps = []                                             # the doubling's distances
    d = 1
    while d < reach:
        steps.append(d)
        d *= 2
    for r in range(size):
        first = ((_tier(classes, r, r + 1, size), _tier(classes, r, r - 1, size)),) if exclusive else ()
        doubling = tuple((_tier(classes, r, r + d, size) if r >= lowest else None,
                          _tier(classes, r, r - d, size) if r - d >= lowest else None) for d in steps)
        classes.add(r, (exclusive, first + doubling), lambda key: _class_rounds(key, n))
    return classes


def _tier(classes, r: int, peer: int, size: int):
    return classes.where(r, peer) if 0 <= peer < size else None


def _class_rounds(key, n: int) -> list:
    """The rounds of a class: each ``(to, frm)`` a round sending n to a peer of tier ``to`` and receiving n from
    one of tier ``frm`` (None: no such message), each receive copied (into out, or reduced onto it); the inclusive
    scan's own block copied into out in its first round."""
    exclusive, pairs = key
    rounds = [(((to, n),) if to else (), ((frm, n, False),) if frm else (), n if frm else 0) for to, frm in pairs]
    if not exclusive:
        rounds[0] = rounds[0][:2] + (rounds[0][2] + n,)
    kept = [rnd for rnd in rounds if rnd[0] or rnd[1] or rnd[2]]
    # the inclusive scan sends from out, its block copied there first; the exclusive one sends its input first
    return written_after_first(kept) if exclusive else all_written(kept)
