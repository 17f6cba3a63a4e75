"""A rank's schedule as counted rounds: what the traffic walker and the cost model read, at any scale.

The traffic of a rank and its time in the cost model depend on each round only through the
sizes and peers of its messages, whether each receive reduces, and what it copies. A
``Summary`` keeps just that, with equal rounds in a row counted once: ``((repeat, shape), ...)``.
``of_schedule`` summarises any schedule (the reference); an algorithm module may also define
``summaries(problem)``, every rank's counts computed without building the rounds, so that a
ring of 16384 ranks is counted in O(N) rather than O(N^2) (``algorithms.registry.all_summaries`` uses
it where it exists, and tests/test_summary.py holds every such form equal to the walk of the
schedules). The walkers read a message's peer only for its tier, so a form may count rounds that
differ only in their peers as one kind, with a stand-in peer of the same tier. Every form answers with
``RankClasses``: ranks whose rounds are alike up to their peers' names form a class, whose rounds are kept once
with stand-ins (``MATE``, ``AWAY``), and the traffic, the cost model, the cluster simulator and ``explain`` work
once a class (a rank's summary with its peers named is built only when asked). A form keeps its ranks in step: where the
schedule leaves a rank without a round while the others exchange (a binomial tree's leaves), the form says
``IDLE`` (nothing to count, no time in the cost model), so that ``finish`` and the cluster simulator's
lockstep see every rank's round t at the same step; where a rank drops a round with nothing to move and runs
ahead, the rounds it then waits for a peer are its IDLE ones (``waits``), so that it finishes where its schedule
does. Where every class runs one long phase but a round of its own (a ring with every block its own size), the
phase is a base the classes share (``RankClasses.add_based``) and what reads each class's rounds reads a base once
(``RankClasses.fold``): O(N) in all, not O(N) a class. Where every block its own size gives every rank rounds of its
own (the pairwise forms: N x distinct sizes of them), a class's rounds are a ``Deferred``, built only where they are
read (the cost model, the simulator), its traffic and finishing round in closed form.
"""
from __future__ import annotations

from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass, replace
from functools import lru_cache

import numpy as np

from .schedule import Round, Schedule
from .topology import INTER, INTRA


@dataclass(frozen=True, slots=True)
class Shape:
    """One round, as the walkers see it: ``sends`` ``(peer, elements)``, ``recvs`` ``(peer, elements, reduces)``,
    ``copied`` elements of its local copies, ``window`` whether it goes through shared-memory windows and
    ``published`` the elements it copies into its window (each range once, however many peers read it); ``idle``
    (in a counted form only) a round the rank waits through while the others exchange; ``written`` the elements of
    its sends that the call itself wrote: sent from any buffer but the caller's ``in`` (a block reduced into ``out``,
    one received and forwarded, scratch), or published into a window (the cost model's ``dirty``)."""

    sends: tuple[tuple[int, int], ...] = ()
    recvs: tuple[tuple[int, int, bool], ...] = ()
    copied: int = 0
    window: bool = False
    published: int = 0
    idle: bool = False
    written: int = 0

    @property
    def communicates(self) -> bool:
        return bool(self.sends or self.recvs)


Summary = tuple[tuple[int, Shape], ...]

IDLE = Shape(idle=True)   # in a counted form: a round the rank waits through, in step with the others (a tree's leaf)


def finish(summary: Summary) -> int:
    """The round a rank of a counted form finishes in, its ranks keeping in step (what ``explain`` and the cluster
    simulator assume of a form): its communicating and idle rounds up to its last communicating one. A round that
    only copies takes no round, as in ``explain``'s critical path."""
    return finish_from(summary, None)[1]


def finish_from(summary: Summary, start: tuple[int, int] | None) -> tuple[int, int]:
    """``finish`` going on from ``start``: ``(rounds so far, the last communicating one's end)`` of the rounds before
    (None: none), as ``RankClasses.fold`` takes it; a negative repeat takes back rounds counted before."""
    if isinstance(summary, Deferred) and summary.finished is not None:   # a form's closed form: rounds not built
        return summary.finished(start)
    at, end = start or (0, 0)
    for k, shape in summary:
        if shape.communicates:
            at += k
            end = at
        elif shape.idle:
            at += k
    return at, end


def waits(sent: np.ndarray, got: np.ndarray, senders: Sequence[np.ndarray]) -> np.ndarray:
    """``(rounds, N)``: the rounds each rank waits before its round k for its sender to post, on the critical path
    of rounds as a schedule compacts them (a round that moves nothing dropped, or copying only: no time; each message
    one round; what ``explain.critical_path`` walks), for forms whose ranks send and receive at most one message a
    round: ``sent``, ``got`` ``(rounds, N)`` elements, ``senders[k][r]`` the rank that r receives from in round k
    (whose round k sends it as much). A rank whose peers' rounds moved nothing runs ahead; these are its IDLE
    rounds, which keep its ``finish`` where the compacted rounds end. O(rounds x N)."""
    time = np.zeros(sent.shape[1], dtype=np.int64)   # each rank's round count so far: when it posts the next
    out = np.zeros_like(time, shape=sent.shape)
    for k in range(len(sent)):
        start = np.maximum(time, np.where(got[k] > 0, time[senders[k]], 0))
        out[k] = start - time
        time = start + ((sent[k] > 0) | (got[k] > 0))
    return out


def shape_of(rnd: Round) -> Shape:
    published = sum(src.n for _, src in dict.fromkeys((s.at, s.src) for s in rnd.sends)) if rnd.window else 0
    sends, written = [], 0
    for s in rnd.sends:
        src = s.src
        n = src.stop - src.start
        sends.append((s.peer, n))
        if rnd.window or src.buf != "in":     # what a window round publishes is the call's copy
            written += n
    return Shape(tuple(sends), tuple((r.peer, r.dst.n, r.acc is not None) for r in rnd.recvs),
                 sum(c.src.n for c in rnd.pre + rnd.post), rnd.window, published, False, written)


@lru_cache(maxsize=1 << 12)   # a form's rounds repeat across its classes: each kind built once
def _as_shape(rnd) -> Shape:
    return rnd if isinstance(rnd, Shape) else Shape(*rnd)


@lru_cache(maxsize=1 << 12)
def sent_written(rnd) -> Shape:
    """A form's round (a Shape or ``(sends, recvs, copied)``) whose sends all carry what the call wrote."""
    if isinstance(rnd, Shape):
        return replace(rnd, written=sum(n for _, n in rnd.sends))
    sends, recvs, copied = rnd
    return Shape(sends, recvs, copied, written=sum(n for _, n in sends))


def all_written(rounds) -> list[Shape]:
    """A form's rounds in order, every send from a buffer the call wrote (``Shape.written``)."""
    return [sent_written(rnd) for rnd in rounds]


def written_after_first(rounds) -> list[Shape]:
    """A form's rounds in order, where the first communicating one sends the caller's input and every later one
    what the call wrote (a block reduced or received before): most schedules that reduce or forward."""
    out, seen = [], False
    for rnd in rounds:
        shape = _as_shape(rnd)
        out.append(sent_written(shape) if seen else shape)
        seen = seen or shape.communicates
    return out


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


def distinct(summaries) -> Sequence[Summary]:
    """Every rank's summary up to its peers' names (for what does not read peers: rounds, windows): a counted
    form's classes' rounds (``RankClasses.whole``), or the summaries themselves."""
    if isinstance(summaries, RankClasses):
        return [summaries.whole(c) for c in range(len(summaries.templates))]
    return summaries


class Deferred(Sequence):
    """A class's rounds, or a base's (``RankClasses.add_based``), built when first read, their traffic counted
    without them: for a form whose classes hold more distinct rounds than the traffic should walk (the pairwise
    reduce-scatter with every block its own size: a base for each size of a rank's own block, a round for each size
    of block it sends). ``rounds()`` builds the Summary, which the cost model and the simulator read;
    ``counted(itemsize, start)`` is what ``engine.traffic`` counts of it (a RankTraffic going on from ``start``'s,
    None: from nothing), in closed form; or, for a class whose count is whole (its base's in it), the class's count
    and its base's None. ``finished(start)``, where given, is ``finish_from`` of it, likewise."""

    def __init__(self, rounds, counted, finished=None) -> None:
        self._build, self.counted, self.finished = rounds, counted, finished
        self._rounds: Summary | None = None

    def rounds(self) -> Summary:
        if self._rounds is None:
            self._rounds = self._build()
        return self._rounds

    def __getitem__(self, i):
        return self.rounds()[i]

    def __len__(self) -> int:
        return len(self.rounds())

    def __iter__(self):
        return iter(self.rounds())


class StandIns:
    """The topology a class's template is read against (``tier`` as ``Topology.tier``): a ``MATE`` peer is on the
    rank's node, an ``AWAY`` one on another."""

    @staticmethod
    def tier(rank: int, code: int) -> str:
        return INTRA if code == MATE else INTER


class RankClasses(Sequence):
    """Every rank's summary, held by class: a form ``add``s each rank with a ``key`` (what its rounds depend on:
    their sizes and the tier of each peer, ``where``), the rounds of a class are summarised once, with ``MATE`` and
    ``AWAY`` for its peers (its template), and the form returns the RankClasses itself. The walkers read a peer
    only for its tier, so the counts of a class are its template's, once for all its ranks (``classes``): a form of
    16384 ranks costs a key a rank, not a Shape per round of every rank. ``classes[r]`` is rank r's summary with
    its peers named, built when asked (the lockstep and the tests read them): stand-ins of the right tier, the
    first other rank of its node (``MATE``), the first rank of node 0 (``AWAY``; of node 1 from node 0)."""

    def __init__(self, topology) -> None:
        self.topology = topology
        self.class_of = [0] * topology.size     # rank -> its class's number
        self._number: dict = {}                 # key -> class number
        self.templates: list[Summary] = []      # class number -> its rounds, peers as MATE/AWAY
        self.bases: list[Summary | None] = []   # class number -> the shared rounds its template adds to, or None
        self._runs: dict = {}                   # class number -> (k, shape number, uses MATE, uses AWAY) a run
        self._wholes: dict = {}                 # class number -> its rounds with its base's merged in
        self._shapes: list[Shape] = []          # the templates' rounds, by number
        self._named: dict = {}                  # (class, MATE, AWAY) -> the class's summary so named
        self._named_shapes: dict = {}           # (shape number, MATE, AWAY) -> the round so named
        self._peers: tuple[list[int], list[int]] | None = None
        self._made: dict = {}                   # (sends, recvs, copied) -> its Shape
        self._numbers: dict = {}                # id of a Shape in _shapes -> (its number, uses MATE, uses AWAY)

    def where(self, r: int, q: int) -> int:
        """Peer q of rank r as a class sees it: ``MATE`` or ``AWAY`` (a schedule never sends to itself)."""
        node_of = self.topology.node_of
        return MATE if node_of[q] == node_of[r] else AWAY

    def add(self, r: int, key, rounds, counted: bool = False) -> None:
        """Rank r is of class ``key``; ``rounds(key)``, the rounds of the class as ``(sends, recvs, copied)`` (or
        Shapes) with ``MATE``/``AWAY`` for peers, is called once a class (``counted``: a Summary of such Shapes,
        rounds with their repeats)."""
        number = self._number.get(key)
        if number is None:
            built = rounds(key)
            self.add_class(r, key, join(built) if counted else self._compressed(built))
        else:
            self.class_of[r] = number

    def _shape(self, rnd) -> Shape:
        """A class's round as a Shape, one object for equal rounds of all classes (a form of N classes, each rank's
        sizes its own, builds its few kinds of round once; a Shape given is kept as the one of its value)."""
        hit = self._made.get(rnd)
        if hit is None:
            hit = self._made[rnd] = rnd if isinstance(rnd, Shape) else Shape(*rnd)
        return hit

    def _compressed(self, built) -> Summary:
        """``compress`` of a class's rounds as Shapes: equal rounds are one object (``_shape``), so neighbours are
        compared by identity."""
        out: list[tuple[int, Shape]] = []
        for rnd in built:
            shape = self._shape(rnd)
            if out and out[-1][1] is shape:
                out[-1] = (out[-1][0] + 1, shape)
            else:
                out.append((1, shape))
        return tuple(out)

    def add_class(self, r: int, key, template: Summary, base: Summary | None = None) -> None:
        """Rank r is of class ``key``, whose rounds are ``template`` (peers as MATE/AWAY), given by the form; with a
        ``base``, the base's rounds and the template's (``add_based``)."""
        number = self._number.get(key)
        if number is None:
            number = self._number[key] = len(self.templates)
            self.templates.append(template)
            self.bases.append(base)
        self.class_of[r] = number

    def add_based(self, r: int, key, build) -> None:
        """Rank r is of class ``key``, whose rounds are a ``base`` that many classes share (one Summary object: a
        ring phase that every rank runs but for one round) and its own: ``build(key)`` gives ``(base, own)``, the
        own rounds counted, a negative repeat taking back rounds of the base the class does not run (the rounds
        with a positive one come before the base's in ``whole``). What reads a class's rounds once for all its ranks
        reads a base once (``fold``), so N classes of an N-round base cost O(N), not O(N^2) in time and memory."""
        if key not in self._number:
            base, own = build(key)
            self.add_class(r, key, own, base)
        else:
            self.class_of[r] = self._number[key]

    def add_deferred(self, r: int, key, build) -> None:
        """Rank r is of class ``key``, whose rounds ``build(key)`` gives as they are, called once a class: a
        ``Deferred`` (built when read, its traffic in closed form), where a form's classes are many and their rounds
        each their own."""
        self.add_based(r, key, lambda k: (None, build(k)))

    def fold(self, value) -> list:
        """``value(summary, start)`` of every class's rounds, in class order, for a ``value`` that runs over a
        summary's runs one after another from ``start`` (None: from nothing; what the rounds before gave), as the
        traffic counts, the cost model's sum and ``finish`` do: a class with a base goes on from its base's value,
        worked out once a base, over its own rounds (negative repeats: taken back)."""
        done: dict = {}
        out = []
        for template, base in zip(self.templates, self.bases):
            start = None
            if base is not None:
                start = done.get(id(base))           # bases stays alive meanwhile: no id is reused
                if start is None:
                    start = done[id(base)] = value(base, None)
            out.append(value(template, start))
        return out

    def finishes(self) -> list[int]:
        """``finish`` of every class, in class order."""
        return [end for _, end in self.fold(finish_from)]

    def whole(self, c: int) -> Summary:
        """Class c's rounds as one summary (its own rounds of positive repeat, then its base's less those taken
        back): O(the base), for what reads rounds in order (the lockstep, a rank's named summary)."""
        base = self.bases[c]
        if base is None:
            return self.templates[c]
        hit = self._wholes.get(c)
        if hit is None:
            less: Counter = Counter()
            for k, shape in self.templates[c]:
                if k < 0:
                    less[shape] -= k
            rest = []
            for k, shape in base:
                taken = min(k, less[shape])
                less[shape] -= taken
                if k > taken:
                    rest.append((k - taken, shape))
            hit = self._wholes[c] = join(tuple((k, s) for k, s in self.templates[c] if k > 0), tuple(rest))
        return hit

    def classes(self) -> list[tuple[int, int, int]]:
        """``(class number, ranks of the class, its first rank)`` of every class that has a rank."""
        ranks: Counter = Counter(self.class_of)
        first: dict[int, int] = {}
        for r, c in enumerate(self.class_of):
            first.setdefault(c, r)
        return [(c, ranks[c], first[c]) for c in sorted(first)]

    def __len__(self) -> int:
        return len(self.class_of)

    def __getitem__(self, r):
        if isinstance(r, slice):
            return [self[i] for i in range(*r.indices(len(self)))]
        if r < 0:
            r += len(self)
        mates, aways = self._stand_ins()
        mate, away = mates[r], aways[r]
        names = (self.class_of[r], mate, away)
        hit = self._named.get(names)
        if hit is None:
            runs = self._runs.get(names[0])
            if runs is None:
                runs = self._runs[names[0]] = tuple(self._numbered(k, shape) for k, shape in self.whole(names[0]))
            hit = self._named[names] = tuple((k, self._name(number, mate if m else None, away if a else None))
                                             for k, number, m, a in runs)
        return hit

    def _stand_ins(self) -> tuple[list[int], list[int]]:
        """Each rank's MATE and AWAY, worked out the first time a rank's summary is named."""
        if self._peers is None:
            nodes, size = self.topology.nodes, self.topology.size
            mates, aways = [0] * size, [0] * size
            for i, group in enumerate(nodes):
                away = nodes[1 if i == 0 and len(nodes) > 1 else 0][0]
                for r in group:
                    mates[r] = group[0] if group[0] != r else group[-1]
                    aways[r] = away
            self._peers = mates, aways
        return self._peers

    def _numbered(self, k: int, shape: Shape) -> tuple:
        """``(k, number, uses MATE, uses AWAY)``: numbered, so that naming looks up small tuples of ints."""
        hit = self._numbers.get(id(shape))          # _shapes holds every numbered Shape: no id is reused
        if hit is None:
            codes = [m[0] for m in shape.sends] + [m[0] for m in shape.recvs]
            self._shapes.append(shape)
            hit = self._numbers[id(shape)] = (len(self._shapes) - 1, MATE in codes, AWAY in codes)
        return (k, *hit)

    def _name(self, number: int, mate: int | None, away: int | None) -> Shape:
        """Round ``number`` with its peers named; one object for every node whose names it uses are the same
        (None: a peer the round does not use)."""
        key = (number, mate, away)
        hit = self._named_shapes.get(key)
        if hit is None:
            shape, peers = self._shapes[number], (None, mate, away)

            def peer(code: int) -> int:
                named = peers[code]
                assert named is not None, "a template's peers are named for every code it uses"
                return named
            hit = self._named_shapes[key] = Shape(tuple((peer(q), n) for q, n in shape.sends),
                                                  tuple((peer(q), n, red) for q, n, red in shape.recvs),
                                                  shape.copied, shape.window, shape.published, shape.idle,
                                                  shape.written)
        return hit
