"""A collective simulator for clusters: a schedule's rounds run for N ranks, with waiting, NIC sharing and costs.

Where ``costmodel.predict`` prices each rank's rounds on their own, this runs them together:

- Each rank's clock advances round by round. A round posts its messages once its ``pre`` copies are done;
  a message starts when both its sender and its receiver have posted the rounds holding it (a late peer
  delays its partner: rendezvous) and takes ``alpha + bytes * beta / share`` of its tier's link. The round
  ends when all its messages have, plus ``gamma`` per byte reduced, the copy cost per byte copied after
  it and the model's ``overhead`` (communicating rounds only). Messages between a pair match in the order
  posted, as MPI's do. The call's time is the last rank's finish plus the model's per-call cost.
- NIC sharing: a node has ``nics_per_node`` ports of the inter-node link's bandwidth. The k inter-node
  messages that leave a node in a round share them: each gets ``min(1, nics / k)`` of a port, and likewise
  for the messages entering a node; a message takes the smaller share of its two ends. None: every message
  has a port of its own (no sharing), as the planner assumes by default.

The approximations, stated: messages "in overlapping time" are those of the same round index of their
ranks' schedules (exact while ranks keep in step, as rings and the hierarchical phases do; a rank running
ahead is still charged the sharing of its round index), and a shared port is split evenly for the whole
message (no speed-up when a shorter neighbour finishes). A window round (shared memory) is priced as
its messages over the intra-node link, without its fence.

Two ways to run it:

- ``walk``: every rank's schedule, event by event (exact under the rules above). O(rounds, messages and
  copies of all ranks), which is O(N^2) for a ring or an all-to-all: used up to ``step_limit`` such
  steps (rank 0's times N, estimated before the other ranks' schedules are built).
- ``lockstep``: at scale, from the algorithm's counted form (engine/summary.py). Ranks whose rounds have
  the same tiers and sizes behave alike, so the ranks are grouped into such classes and nodes into kinds
  by the classes they hold; round index by round index, every class on every kind of node is priced
  with the contention of its node kind, and the round costs the slowest. Every rank waits for the
  slowest rank of each round: an upper bound of the walk where ranks keep in step, equal to it where the
  slowest rank of a round is on the critical path (a ring: every rank waits on its neighbours, each round).
  Not where they do not: the walk charges NIC sharing by round index, so messages of one index that cannot
  overlap in time are still charged as sharing a port (broadcast scatter_allgather at 64 MiB on one NIC per
  node: the root's scatter send and a later ring send; the walk 1.37-1.50x the lockstep from 8 to 128 ranks,
  equal without a NIC limit). The counted forms
  may list a phase's rounds by size rather than in order, which matters only for uneven blocks.
  Its cost is O(ranks x entries of a summary) to form the classes, then, at each round index where some
  class's round changes, the node kinds holding those classes priced again (the slowest kind kept in a
  heap): 16384 ranks in 0.02-1 s (bench/scale.py), the linear scan's chain of 16384 classes too.

``predict`` chooses: the counted form above ``FORM_ABOVE`` ranks where the algorithm has one, else the walk
up to ``step_limit`` steps; beyond that it says so (``method`` "none") rather than walk for minutes or
fill the memory with schedules (a ring of 1024 ranks would be six million steps; the recursive algorithms
at 16384 ranks are one to two million, walked in 5-15 seconds; Bruck's all-to-all copies half its blocks
a round, declined).
"""
from __future__ import annotations

import heapq
from collections import Counter, defaultdict, deque
from dataclasses import dataclass, replace
from typing import Sequence

from .algorithms import registry
from .algorithms.registry import all_schedules, counted_summaries
from .costmodel import Model, dirty_time, local_time, shared_time, window_round_time, working_set
from .engine.schedule import Schedule
from .engine.shapes import bus_factor, even_problem, segment_elements
from .engine.summary import RankClasses, Shape, StandIns, Summary, distinct, shape_of
from .engine.topology import INTER, SELF, Topology

__all__ = ["Cluster", "Prediction", "walk", "lockstep", "predict", "predict_all", "STEP_LIMIT", "FORM_ABOVE"]

STEP_LIMIT = 4_000_000  # steps walked at most (a round, a message or a copy), all ranks together
FORM_ABOVE = 64         # above this many ranks "auto" takes a counted form (the walk of a ring grows as N^2)
METHODS = ("auto", "walk", "lockstep")


@dataclass(frozen=True)
class Cluster:
    """What the simulator prices with: the links per tier (``model``), the NICs a node's ranks share.

    Copies, reductions and the per-call cost are priced as the model prices them (``Model.copy_time``,
    ``reduce_time``, ``call_overhead``: 0 unless fitted).
    """

    model: Model
    nics_per_node: int | None = None

    def __post_init__(self):
        n = self.nics_per_node
        if n is not None and (isinstance(n, bool) or not isinstance(n, int) or n < 1):
            raise ValueError(f"Cluster: nics_per_node must be a positive integer or None, got {n!r}")

    @property
    def per_call(self) -> float:
        return self.model.call_overhead

    def reads(self, shape: Shape) -> bool:
        """Whether a round is priced as the copies a window round is (its messages then cost nothing but meeting)."""
        return shape.window and not self.model.window_as_messages

    def local(self, shape: Shape, messages, itemsize: int) -> float:
        """What a round costs beside waiting for its ``messages`` (``(tier, bytes)`` each), as the cost model prices
        it: the other messages' shared bytes, reductions, copies, overhead, fence (a window round priced as its
        copies: all of it), and what it sends that the call wrote (``Shape.written``, the model's ``dirty``).
        The walk and the lockstep price every round through here."""
        model = self.model
        if self.reads(shape):
            return window_round_time(model, shape, itemsize)
        return (shared_time(model, messages) if model.shares else 0.0) + local_time(model, shape, itemsize) \
            + (dirty_time(model, shape, itemsize) if model.dirty else 0.0)

    def share(self, k: int) -> float:
        """The fraction of a port each of ``k`` messages crossing one node's NICs at once gets."""
        return 1.0 if self.nics_per_node is None or k <= self.nics_per_node else self.nics_per_node / k

    def message(self, tier: str, nbytes: int, share: float = 1.0) -> float:
        """Seconds of one message; a message to oneself costs a copy."""
        if tier == SELF and SELF not in self.model.links:
            return self.model.copy_time(nbytes)
        link = self.model.link(tier)
        return link.alpha + (link.time(nbytes) - link.alpha) / share   # the shared port slows the bytes only


# -- the walk: every rank's schedule, event by event -------------------------------------------------------
def crossings(schedules: Sequence[Schedule], topology: Topology) -> tuple[Counter, Counter]:
    """``(out, in)``: inter-node messages leaving and entering each ``(node, round index)``."""
    out: Counter[tuple[int, int]] = Counter()
    inn: Counter[tuple[int, int]] = Counter()
    for r, sched in enumerate(schedules):
        node = topology.node_of[r]
        for i, rnd in enumerate(sched.rounds):
            out[node, i] += sum(topology.tier(r, s.peer) == INTER for s in rnd.sends)
            inn[node, i] += sum(topology.tier(r, v.peer) == INTER for v in rnd.recvs)
    return out, inn


def walk(schedules: Sequence[Schedule], topology: Topology, cluster: Cluster, itemsize: int,
         start: Sequence[float] | None = None) -> list[float]:
    """Each rank's finish time (seconds) running ``schedules`` (``schedules[r]`` rank r's) together.

    ``start[r]``: when rank r enters the call (default all 0). RuntimeError names a rank left waiting.
    """
    size = len(schedules)
    if topology.size != size:
        raise ValueError(f"walk: {size} schedules for a topology of {topology.size} ranks")
    out, inn = crossings(schedules, topology)
    clock = [0.0] * size if start is None else [float(t) for t in start]
    if len(clock) != size:
        raise ValueError(f"walk: start has {len(clock)} times for {size} ranks")
    at = [0] * size
    posted: list[float | None] = [None] * size
    sends: dict = defaultdict(list)      # (src, dst) -> [(post time, round index)] in posting order
    recvs: dict = defaultdict(list)      # (src, dst) -> [(post time, round index)]
    taken: dict = {}                     # (src, dst, "s" | "r") -> messages of the pair this rank has finished
    ready, queued = deque(range(size)), [True] * size     # ranks that may move: posting wakes the peers

    def wake(peer: int) -> None:
        if not queued[peer]:
            queued[peer] = True
            ready.append(peer)
    while ready:
        r = ready.popleft()
        queued[r] = False
        sched = schedules[r]
        while at[r] < len(sched.rounds):
            rnd = sched.rounds[at[r]]
            if posted[r] is None:   # copies are priced with the round's other local work, at its end
                posted[r] = clock[r]
                for s in rnd.sends:
                    sends[r, s.peer].append((posted[r], at[r]))
                    wake(s.peer)
                for v in rnd.recvs:
                    recvs[v.peer, r].append((posted[r], at[r]))
                    wake(v.peer)
            end = _round_end(r, rnd, posted[r], sends, recvs, taken, topology, cluster, itemsize, out, inn)
            if end is None:
                break
            clock[r], at[r], posted[r] = end, at[r] + 1, None
    for r, sched in enumerate(schedules):
        if at[r] < len(sched.rounds):
            raise RuntimeError(f"walk: the schedules cannot finish: rank {r} waits in its round {at[r]}")
    return _closing_fences(schedules, topology, cluster, clock)


def _closing_fences(schedules, topology: Topology, cluster: Cluster, clock: list[float]) -> list[float]:
    """A schedule with window rounds ends at one more fence (the executor's): every rank of its node is done."""
    for group in topology.nodes:
        if any(rnd.window for r in group for rnd in schedules[r].rounds):
            done = max(clock[r] for r in group) + cluster.model.fence
            for r in group:
                clock[r] = done
    return clock


def _round_end(r, rnd, post, sends, recvs, taken, topology, cluster, itemsize, out, inn) -> float | None:
    """When rank r's round ends, or None while a peer has not posted its side of a message yet."""
    node_of, latest = topology.node_of, post
    mine: dict[tuple[int, int, str], int] = {}
    shape = shape_of(rnd)
    reads = cluster.reads(shape)                                     # a window round as its copies: meet, then read
    msgs = [(r, s.peer, s.src.n, "s") for s in rnd.sends] + [(v.peer, r, v.dst.n, "r") for v in rnd.recvs]
    for src, dst, n, side in msgs:
        key = (src, dst, side)
        k = taken.get(key, 0) + mine.get(key, 0)                 # this message's place in the pair's order
        mine[key] = mine.get(key, 0) + 1
        if len(sends[src, dst]) <= k or len(recvs[src, dst]) <= k:
            return None
        (ts, i_s), (tr, i_r) = sends[src, dst][k], recvs[src, dst][k]
        tier = topology.tier(src, dst)
        share = min(cluster.share(out[node_of[src], i_s]), cluster.share(inn[node_of[dst], i_r])) \
            if tier == INTER else 1.0
        latest = max(latest, max(ts, tr) + (0.0 if reads else cluster.message(tier, n * itemsize, share)))
    for key, k in mine.items():
        taken[key] = taken.get(key, 0) + k
    messages = [(topology.tier(r, p), n * itemsize) for p, n in shape.sends] + \
        [(topology.tier(r, p), n * itemsize) for p, n, _ in shape.recvs]
    return latest + cluster.local(shape, messages, itemsize)


# -- lockstep: classes of ranks from the counted forms ------------------------------------------------------
def _tiered(rank: int, shape: Shape, topology: Topology | StandIns) -> tuple:
    """A round as its cost sees it: peers replaced by their tiers (and the shape for its local costs, peerless)."""
    sends = tuple(sorted((topology.tier(rank, p), n) for p, n in shape.sends))
    recvs = tuple(sorted((topology.tier(rank, p), n, red) for p, n, red in shape.recvs))
    peerless = Shape(tuple((-1, n) for _, n in sends), tuple((-1, n, red) for _, n, red in recvs), shape.copied,
                     shape.window, shape.published, written=shape.written)
    return sends, recvs, peerless


def lockstep(summaries: Sequence[Summary], topology: Topology, cluster: Cluster, itemsize: int) -> tuple[float, int]:
    """``(seconds, classes)``: the call's time with every round waiting for its slowest rank (module doc)."""
    runs, class_of = _classes(summaries, topology)                # runs[c]: class c's ((repeat, round), ...)
    kinds = list(Counter(tuple(sorted(Counter(class_of[r] for r in group).items())) for group in topology.nodes))
    stretches = [_stretches(run) for run in runs]                  # per class: (start, stop, round) in order
    starts: dict[int, list[int]] = defaultdict(list)               # round index -> classes whose round changes there
    for c, spans in enumerate(stretches):
        for start, _, _ in spans:
            starts[start].append(c)
        starts[spans[-1][1] if spans else 0].append(c)             # past its last round: none
    bounds = sorted({0, *starts})
    kinds_of: list[list[int]] = [[] for _ in runs]
    for k, kind in enumerate(kinds):
        for c, _ in kind:
            kinds_of[c].append(k)
    now: list = [None] * len(runs)                                 # each class's round in the stretch at hand
    at = [0] * len(runs)                                           # and the index of that stretch
    slowest_of = [0.0] * len(kinds)                                # each kind's slowest class, at its node's sharing
    heap: list[tuple[float, int]] = []                             # (-slowest, kind), stale entries skipped
    cost = _memo(cluster, itemsize)
    total = 0.0
    for a, b in zip(bounds, bounds[1:]):
        changed = set()
        for c in starts.get(a, ()):                                # only the classes whose round changes here
            spans = stretches[c]
            while at[c] < len(spans) and spans[at[c]][1] <= a:
                at[c] += 1
            now[c] = spans[at[c]][2] if at[c] < len(spans) and spans[at[c]][0] <= a else None
            changed.update(kinds_of[c])
        for k in changed:
            slowest_of[k] = _kind_slowest(kinds[k], now, cost)
            heapq.heappush(heap, (-slowest_of[k], k))
        while heap and -heap[0][0] != slowest_of[heap[0][1]]:      # an entry from before the kind's last change
            heapq.heappop(heap)
        total += (b - a) * (-heap[0][0] if heap else 0.0)
    return total, len(runs)


def _classes(summaries, topology: Topology) -> tuple[list, list[int]]:
    """The distinct runs of rounds (peers read as their tiers) and each rank's class among them."""
    classes: dict = {}
    if isinstance(summaries, RankClasses):    # a form's classes, their peers read as stand-ins of their tiers
        number = [classes.setdefault(tuple((k, _tiered(0, shape, StandIns())) for k, shape in summaries.whole(c)),
                                     len(classes)) for c in range(len(summaries.templates))]
        class_of = [number[c] for c in summaries.class_of]
    else:
        class_of = [classes.setdefault(tuple((k, _tiered(r, shape, topology)) for k, shape in summary), len(classes))
                    for r, summary in enumerate(summaries)]
    return list(classes), class_of


def _stretches(run) -> list[tuple[int, int, tuple]]:
    """A class's runs of equal rounds as ``(start, stop, round)`` round indices."""
    out, at = [], 0
    for k, rnd in run:
        if k:
            out.append((at, at + k, rnd))
        at += k
    return out


def _memo(cluster: Cluster, itemsize: int):
    """``cost(round, out, inn)``: ``_round_cost`` at the sharing of ``out`` and ``inn`` inter-node messages, kept."""
    seen: dict = {}

    def cost(rnd, out: int, inn: int) -> float:
        key = (rnd, out, inn)
        if key not in seen:
            seen[key] = _round_cost(rnd, cluster.share(out), cluster.share(inn), cluster, itemsize)
        return seen[key]
    return cost


def _kind_slowest(kind, now, cost) -> float:
    """The slowest class of a kind of node (``(class, ranks)`` pairs) in its present rounds, priced with the
    node's inter-node messages out and in."""
    out = sum(m * sum(t == INTER for t, _ in now[c][0]) for c, m in kind if now[c] is not None)
    inn = sum(m * sum(t == INTER for t, _, _ in now[c][1]) for c, m in kind if now[c] is not None)
    return max((cost(now[c], out, inn) for c, _ in kind if now[c] is not None), default=0.0)


def _round_cost(rnd: tuple, send_share: float, recv_share: float, cluster: Cluster, itemsize: int) -> float:
    sends, recvs, shape = rnd
    slowest = 0.0
    for tier, n in sends if not cluster.reads(shape) else ():
        slowest = max(slowest, cluster.message(tier, n * itemsize, send_share if tier == INTER else 1.0))
    for tier, n, _ in recvs if not cluster.reads(shape) else ():
        slowest = max(slowest, cluster.message(tier, n * itemsize, recv_share if tier == INTER else 1.0))
    messages = [(t, n * itemsize) for t, n in sends] + [(t, n * itemsize) for t, n, _ in recvs]
    return slowest + cluster.local(shape, messages, itemsize)


# -- one call ---------------------------------------------------------------------------------------------
@dataclass(frozen=True)
class Prediction:
    """One algorithm's simulated call: ``seconds`` (None when not simulated, ``note`` says why), how."""

    collective: str
    algorithm: str
    size: int
    nodes: int
    nbytes: int
    seconds: float | None
    method: str              # "walk", "lockstep" (counted form) or "none"
    note: str = ""

    @property
    def algbw(self) -> float | None:
        """Bytes per second of the call's size (nccl-tests' algbw)."""
        return None if not self.seconds else self.nbytes / self.seconds

    @property
    def busbw(self) -> float | None:
        """algbw times nccl-tests' bus factor (2(N-1)/N for allreduce, (N-1)/N for the gathers and scatters)."""
        return None if self.algbw is None else self.algbw * bus_factor(self.collective, self.size)

    def to_dict(self) -> dict:
        return {"collective": self.collective, "algorithm": self.algorithm, "size": self.size, "nodes": self.nodes,
                "nbytes": self.nbytes, "seconds": self.seconds, "algbw_GBps": _giga(self.algbw),
                "busbw_GBps": _giga(self.busbw), "method": self.method, "note": self.note}


def _giga(value: float | None) -> float | None:
    return None if value is None else value / 1e9


def predict(cluster: Cluster, collective: str, algorithm: str, topology: Topology, nbytes: int, itemsize: int = 4,
            tree_segment_bytes: int = 0, step_limit: int = STEP_LIMIT, method: str = "auto") -> Prediction:
    """One call of ``nbytes`` (sized as in ``pc.traffic``) simulated, by ``method``: "walk", "lockstep" or "auto"
    (the counted form above ``FORM_ABOVE`` ranks where the algorithm has one, else the walk up to
    ``step_limit`` steps, else nothing: ``method`` "none" and a note)."""
    if algorithm not in registry.schedule_algorithms(collective):
        raise ValueError(f"simulate: {collective} has no schedule {algorithm!r}; expected one of "
                         f"{', '.join(registry.schedule_algorithms(collective))}")
    if method not in METHODS:
        raise ValueError(f"simulate: method must be one of {', '.join(METHODS)}, got {method!r}")
    cluster = replace(cluster, model=cluster.model.at_call(working_set(collective, nbytes, topology)))  # its memory share
    segment = segment_elements(tree_segment_bytes, itemsize)
    problem = even_problem(collective, 0, topology.size, topology, nbytes // itemsize, tree_segment=segment)
    none = Prediction(collective, algorithm, topology.size, topology.num_nodes, nbytes, None, "none")
    if method == "lockstep" or (method == "auto" and topology.size > FORM_ABOVE):
        counted = counted_summaries(collective, algorithm, problem)
        if counted is not None:
            seconds, classes = lockstep(counted, topology, cluster, itemsize)
            if any(shape.window for summary in distinct(counted) for _, shape in summary):   # the last fence
                seconds += cluster.model.fence
            return replace(none, seconds=seconds + cluster.per_call, method="lockstep",
                           note=f"counted form, {classes} class(es) of ranks")
        if method == "lockstep":
            return replace(none, note="no counted form for this call")
    steps = _steps(registry.get_schedule(collective, algorithm)(problem)) * topology.size     # rank 0's, N times
    if steps > step_limit:
        return replace(none, note=f"no counted form; walking about {steps} steps is over the limit of {step_limit}")
    seconds = max(walk(all_schedules(collective, algorithm, problem), topology, cluster, itemsize), default=0.0)
    return replace(none, seconds=seconds + cluster.per_call, method="walk")


def _steps(schedule: Schedule) -> int:
    """What walking one rank costs: its rounds, messages and copies."""
    return sum(1 + len(r.sends) + len(r.recvs) + len(r.pre) + len(r.post) for r in schedule.rounds)


def predict_all(cluster: Cluster, collective: str, topology: Topology, nbytes: int, itemsize: int = 4,
                tree_segment_bytes: int = 0, algorithms: Sequence[str] | None = None,
                step_limit: int = STEP_LIMIT) -> list[Prediction]:
    """Every schedule of ``collective`` (or those named) simulated, in registry order."""
    names = registry.schedule_algorithms(collective) if algorithms is None else algorithms
    return [predict(cluster, collective, a, topology, nbytes, itemsize, tree_segment_bytes, step_limit) for a in names]
