"""A rank's schedule as counted rounds: what the traffic walker and the cost model read, at any scale.

The traffic of a rank and its time in the cost model depend on each round only through the
sizes and peers of its messages, whether each receive reduces, and what it copies. A
``Summary`` keeps just that, with equal rounds in a row counted once: ``((repeat, shape), ...)``.
``of_schedule`` summarises any schedule (the reference); an algorithm module may also define
``summaries(problem)``, every rank's counts computed without building the rounds, so that a
ring of 16384 ranks is counted in O(N) rather than O(N^2) (``algorithms.registry.all_summaries`` uses
it where it exists, and tests/test_summary.py holds every such form equal to the walk of the
schedules). The walkers read a message's peer only for its tier, so a form may count rounds that
differ only in their peers as one kind, naming one peer of the same tiers (the pairwise form does;
``RankClasses`` names such peers for whole classes of ranks). A form keeps its ranks in step: where the
schedule leaves a rank without a round while the others exchange (a binomial tree's leaves), the form says
``IDLE`` (nothing to count, no time in the cost model), so that ``finish`` and the cluster simulator's
lockstep see every rank's round t at the same step.
"""
from __future__ import annotations

from collections import Counter
from dataclasses import dataclass

from .schedule import Round, Schedule


@dataclass(frozen=True, slots=True)
class Shape:
    """One round, as the walkers see it: ``sends`` ``(peer, elements)``, ``recvs`` ``(peer, elements, reduces)``,
    ``copied`` elements of its local copies, ``window`` whether it goes through shared-memory windows and
    ``published`` the elements it copies into its window (each range once, however many peers read it); ``idle``
    (in a counted form only) a round the rank waits through while the others exchange."""

    sends: tuple[tuple[int, int], ...] = ()
    recvs: tuple[tuple[int, int, bool], ...] = ()
    copied: int = 0
    window: bool = False
    published: int = 0
    idle: bool = False

    @property
    def communicates(self) -> bool:
        return bool(self.sends or self.recvs)


Summary = tuple[tuple[int, Shape], ...]

IDLE = Shape(idle=True)   # in a counted form: a round the rank waits through, in step with the others (a tree's leaf)


def finish(summary: Summary) -> int:
    """The round a rank of a counted form finishes in, its ranks keeping in step (what ``explain`` and the cluster
    simulator assume of a form): its communicating and idle rounds up to its last communicating one. A round that
    only copies takes no round, as in ``explain``'s critical path."""
    at = end = 0
    for k, shape in summary:
        if shape.communicates:
            at += k
            end = at
        elif shape.idle:
            at += k
    return end


def shape_of(rnd: Round) -> Shape:
    published = sum(src.n for _, src in dict.fromkeys((s.at, s.src) for s in rnd.sends)) if rnd.window else 0
    return Shape(tuple((s.peer, s.src.n) for s in rnd.sends),
                 tuple((r.peer, r.dst.n, r.acc is not None) for r in rnd.recvs),
                 sum(c.src.n for c in rnd.pre + rnd.post), rnd.window, published)


def compress(shapes) -> Summary:
    """``shapes`` in order, equal neighbours counted once."""
    return join(tuple((1, shape) for shape in shapes))


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


MATE, AWAY = 1, 2   # a class's peers, by tier: a rank of its own node, a rank of another node


class RankClasses:
    """Ranks counted by class: a form gives each rank a ``key`` (what its rounds depend on: their sizes and the tier
    of each peer, ``where``), the rounds of a class are summarised once, and each rank's summary names stand-ins
    for its peers (the walkers read a peer only for its tier): the first other rank of its node (``MATE``), the
    first rank of node 0 (``AWAY``; of node 1 from node 0). Ranks of one node share a summary but the node's first
    rank, and a round with no peer on the node is built once for all nodes, so a form costs O(N) lookups, not a
    Shape per round of every rank."""

    def __init__(self, topology):
        nodes, self.node_of = topology.nodes, topology.node_of
        self.mate, self.away = [0] * topology.size, [0] * topology.size
        for i, group in enumerate(nodes):
            away = nodes[1 if i == 0 and len(nodes) > 1 else 0][0]
            for r in group:
                self.mate[r] = group[0] if group[0] != r else group[-1]
                self.away[r] = away
        self._runs: dict = {}
        self._named: dict = {}
        self._templates: list[Shape] = []       # a class's rounds with MATE/AWAY peers, by number
        self._shapes: dict = {}

    def where(self, r: int, q: int) -> int:
        """Peer q of rank r as a class sees it: ``MATE`` or ``AWAY`` (a schedule never sends to itself)."""
        return MATE if self.node_of[q] == self.node_of[r] else AWAY

    def summary(self, r: int, key, rounds, counted: bool = False) -> Summary:
        """Rank r's summary: ``rounds(key)``, the rounds of class ``key`` as ``(sends, recvs, copied)`` (or Shapes)
        with ``MATE``/``AWAY`` for peers, is called once a class (``counted``: a Summary of such Shapes, rounds with
        their repeats); its entries are then named for r's node."""
        runs = self._runs.get(key)
        if runs is None:
            built = rounds(key)
            summary = join(built) if counted else compress(rnd if isinstance(rnd, Shape) else Shape(*rnd)
                                                           for rnd in built)
            runs = self._runs[key] = tuple(self._template(k, shape) for k, shape in summary)
        mate, away = self.mate[r], self.away[r]
        names = (key, mate, away)
        hit = self._named.get(names)
        if hit is None:
            hit = self._named[names] = tuple((k, self._name(t, mate if m else None, away if a else None))
                                             for k, t, m, a in runs)
        return hit

    def _template(self, k: int, shape: Shape) -> tuple:
        """``(k, number, uses MATE, uses AWAY)``: numbered, so that naming looks up small tuples of ints."""
        codes = {q for q, *_ in shape.sends + shape.recvs}
        self._templates.append(shape)
        return k, len(self._templates) - 1, MATE in codes, AWAY in codes

    def _name(self, number: int, mate: int | None, away: int | None) -> Shape:
        """Template ``number`` with its peers named; one object for every node whose names it uses are the same
        (None: a peer the template does not use)."""
        key = (number, mate, away)
        hit = self._shapes.get(key)
        if hit is None:
            shape, peers = self._templates[number], (None, mate, away)

            def peer(code: int) -> int:
                named = peers[code]
                assert named is not None, "a template's peers are named for every code it uses"
                return named
            hit = self._shapes[key] = Shape(tuple((peer(q), n) for q, n in shape.sends),
                                            tuple((peer(q), n, red) for q, n, red in shape.recvs),
                                            shape.copied, shape.window, shape.published, shape.idle)
        return hit
