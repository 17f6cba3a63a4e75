"""Linear (pipelined) scan: rank r receives the prefix of ranks 0..r-1 from rank r-1, reduces its own block onto
it and sends the result on to rank r+1.

Every rank but the last sends the vector once. The prefix crosses p - 1 hops one after another, so the vector
goes in segments (``Problem.tree_segment``, 0: one): rank r forwards segment j while it receives segment j + 1,
and S segments reach the last rank after S + p - 2 rounds rather than S(p - 1). Every reduction puts the lower
ranks on the left (a local ``Copy`` with ``acc`` after the receive), so a non-commutative op is reduced in rank
order. ``exclusive`` (exscan_linear): rank r's result is the prefix as received, and rank 0 has none.
"""
from __future__ import annotations

from ..engine.schedule import EMPTY, Copy, Problem, Recv, Round, Schedule, Send, Slice
from ..engine.summary import IDLE, RankClasses, Shape
from ._binomial import segments


def schedule(p: Problem) -> Schedule:
    return build(p, exclusive=False)


def build(p: Problem, exclusive: bool) -> Schedule:
    """Rank ``p.rank``'s part of the pipeline; ``exclusive``: ranks 0..r-1 without rank r's own block (MPI_Exscan)."""
    if p.n == 0 or (exclusive and p.size == 1):
        return EMPTY
    whole = Slice("in", 0, p.n)
    if p.size == 1:
        return Schedule((Round(pre=(Copy(whole, Slice("out", 0, p.n)),)),))
    segs = segments(p.n, p.tree_segment)
    if p.rank == 0:   # the head of the pipeline: its input is the first prefix (all segments posted at once)
        sends = tuple(Send(1, whole.sub(a, b)) for a, b in segs)
        pre = () if exclusive else (Copy(whole, Slice("out", 0, p.n)),)
        return Schedule((Round(sends=sends, pre=pre),))
    seg = segs[0][1]   # the longest segment: scratch for one arriving and one leaving
    last = p.rank == p.size - 1
    rounds: list[Round] = []
    leaving: Slice | None = None   # the slice forwarded in the next round
    post: tuple[Copy, ...]
    for a, b in segs:
        sends = (Send(p.rank + 1, leaving),) if leaving is not None else ()
        arriving = Slice("tmp", 0, b - a)           # the prefix of ranks 0..r-1 for this segment
        mine, out = whole.sub(a, b), Slice("out", a, b)
        if not exclusive:   # out = prefix op mine, forwarded as it is
            post, onward = (Copy(mine, out, acc=arriving),), out
        elif last:          # the prefix is the result; nothing goes on
            post, onward = (Copy(arriving, out),), out
        else:               # the prefix is the result; prefix op mine goes on (computed before out may alias in)
            onward = Slice("tmp", seg, seg + b - a)
            post = (Copy(mine, onward, acc=arriving), Copy(arriving, out))
        rounds.append(Round(sends=sends, recvs=(Recv(p.rank - 1, arriving),), post=post))
        leaving = None if last else onward
    if leaving is not None:   # the last segment goes on (every rank but the last)
        rounds.append(Round(sends=(Send(p.rank + 1, leaving),)))
    return Schedule(tuple(rounds), tmp=2 * seg if exclusive and not last else seg)


# -- counted form (engine/summary.py) ----------------------------------------------------------------------
def summaries(p: Problem):
    return counted(p, exclusive=False)


def counted(p: Problem, exclusive: bool):
    """Every rank's rounds counted without building them. Segment j reaches rank r in round r - 1 + j: rank r
    idles r - 1 rounds (its predecessor forwards segment j a round after receiving it), then receives one segment
    a round and forwards the one before, and the middle rounds, alike, are counted as one run. A rank's class:
    its idle rounds and the tiers of its two neighbours. One rank, an empty vector: None (walked)."""
    if p.n == 0 or p.size == 1:
        return None
    sizes = [b - a for a, b in segments(p.n, p.tree_segment)]
    classes, size = RankClasses(p.topology), p.size
    head = Shape(tuple((classes.where(0, 1), n) for n in sizes), (), 0 if exclusive else p.n)
    classes.add_class(0, ("head", exclusive), ((1, head),))
    busy: dict = {}                                         # (from, to) tiers -> the rounds after the idle ones
    for r in range(1, size):
        ends = (classes.where(r, r - 1), classes.where(r, r + 1) if r + 1 < size else None)
        if ends not in busy:
            busy[ends] = _busy_rounds(*ends, sizes, exclusive)
        classes.add(r, (r - 1, ends), lambda key: ((key[0], IDLE),) * (key[0] > 0) + busy[key[1]], counted=True)
    return classes


def _busy_rounds(frm, to, sizes: list[int], exclusive: bool) -> tuple:
    """Round j receiving segment j (reduced into out, or kept and, where the prefix goes on, also reduced into tmp)
    and forwarding segment j - 1, the middle rounds alike as one run, then the last segment forwarded (not by the
    last rank, whose ``to`` is None)."""
    def step(j: int) -> Shape:   # what it forwards it received (rank 0 alone sends its input)
        sends = ((to, sizes[j - 1]),) if j and to else ()
        return Shape(sends, ((frm, sizes[j], False),), sizes[j] * (2 if exclusive and to else 1),
                     written=sizes[j - 1] if sends else 0)
    s = len(sizes)
    runs = [(1, step(0))] + ([(s - 2, step(1))] if s > 2 else []) + ([(1, step(s - 1))] if s > 1 else [])
    return tuple(runs) + (((1, Shape(((to, sizes[-1]),), written=sizes[-1])),) if to else ())
