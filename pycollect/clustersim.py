"""A collective simulator for clusters: a schedule's rounds run for N ranks, with waiting, NIC sharing and costs.

Where ``costmodel.predict`` prices each rank's rounds on their own, this runs them together:

- Each rank's clock advances round by round. A round posts its messages once its ``pre`` copies are done;
  a message starts when both its sender and its receiver have posted the rounds holding it (a late peer
  delays its partner: rendezvous) and takes ``alpha + bytes * beta / share`` of its tier's link. The round
  ends when all its messages have, plus ``gamma`` per byte reduced, the copy cost per byte copied after
  it and the model's ``overhead`` (communicating rounds only). Messages between a pair match in the order
  posted, as MPI's do. The call's time is the last rank's finish plus the model's per-call cost.
- NIC sharing: a node has ``nics_per_node`` ports of the inter-node link's bandwidth. The inter-node messages
  leaving a node at one moment share them: while k drain, each gets ``min(1, nics / k)`` of a port, and likewise
  for the messages entering a node; a message takes the smaller share of its two ends, and its latency follows
  its last byte. A message starting or ending changes the shares of the others at its two nodes from then on
  (a shorter neighbour's end speeds up the rest). None: every message has a port of its own (no sharing), as
  the planner assumes by default.
- Port sharing: over a tier whose link has a port (``Link.port``: the presets' NVLink and NIC of a GPU) a rank's
  messages out share its one port, and its messages in another, in the same way (``min(1, 1 / k)`` each); a
  message's share is the smallest of its ports and NICs. In lockstep a round's messages over such a tier are
  merged into one a direction, as the cost model prices them (``costmodel.round_messages``).

The approximations, stated: a share a message cannot use (its other end is busier) is not handed to the others
at its node (no max-min fairness), and a window round (shared memory) is priced as its messages over the
intra-node link, without its fence.

Two ways to run it:

- ``walk``: every rank's schedule, event by event in the order of time (exact under the rules above).
  O(rounds, messages and copies of all ranks) heap steps, and under a NIC limit each start or end of an
  inter-node message reprices those draining at its two nodes; O(N^2) for a ring or an all-to-all: used up to
  ``step_limit`` such steps (rank 0's times N, estimated before the other ranks' schedules are built).
- ``lockstep``: at scale, from the algorithm's counted form (engine/summary.py). Ranks whose rounds have
  the same tiers and sizes behave alike, so the ranks are grouped into such classes and nodes into kinds
  by the classes they hold; round index by round index, every class on every kind of node is priced
  with the contention of its node kind, and the round costs the slowest. Every rank waits for the
  slowest rank of each round, and the messages of one round index share the NICs whether or not they would
  overlap in time: equal to the walk where ranks keep in step (a ring, the hierarchical phases, the
  butterflies, the trees, scatter_allgather: every rank waits on its neighbours each round), above it where ranks
  run apart: the pairwise forms count their rounds by kind, not in order, so under a NIC limit their sharing
  lands on other round indices (all-to-all pairwise on two nodes of 4 to 32 ranks, one NIC: 1.37-1.50x the
  walk, which stays within 2% of the port's bound, the node's crossing bytes over its bandwidth). It can also come
  out a little below the walk: where ranks drift a round apart under a NIC or port limit, messages of neighbouring
  round indices that overlap in time share a port in the walk only (the Rabenseifner allreduce and the tree off
  powers of two on uneven nodes: up to 0.4% below in 3000 random cases of 2-10 ranks; the rings never). The counted
  forms may list a phase's rounds by size rather than in order, which matters only for uneven blocks.
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
from .costmodel import (Model, dirty_time, local_time, round_messages, shared_time, through_ports, window_round_time,
                        working_set)
from .engine.schedule import Schedule
from .engine.shapes import bus_factor, even_problem, segment_elements
from .engine.summary import RankClasses, Shape, StandIns, Summary, distinct, shape_of
from .engine.topology import INTER, SELF, Topology
from .traffic import check_call

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
        return 1.0 if self.nics_per_node is None else _share(k, self.nics_per_node)

    def message(self, tier: str, nbytes: int, share: float = 1.0) -> float:
        """Seconds of one message; a message to oneself costs a copy."""
        if tier == SELF and SELF not in self.model.links:
            return self.model.copy_time(nbytes)
        link = self.model.link(tier)
        return link.alpha + (link.time(nbytes) - link.alpha) / share   # the shared port slows the bytes only


# -- the walk: every rank's schedule, in the order of time ---------------------------------------------------
def walk(schedules: Sequence[Schedule], topology: Topology, cluster: Cluster, itemsize: int,
         start: Sequence[float] | None = None) -> list[float]:
    """Each rank's finish time (seconds) running ``schedules`` (``schedules[r]`` rank r's) together.

    ``start[r]``: when rank r enters the call (default all 0). RuntimeError names a rank left waiting.
    """
    size = len(schedules)
    if topology.size != size:
        raise ValueError(f"walk: {size} schedules for a topology of {topology.size} ranks")
    clock = [0.0] * size if start is None else [float(t) for t in start]
    if len(clock) != size:
        raise ValueError(f"walk: start has {len(clock)} times for {size} ranks")
    run = _Walk(schedules, topology, cluster, itemsize, clock)
    run.run()
    for r, sched in enumerate(schedules):
        if run.at[r] < len(sched.rounds):
            raise RuntimeError(f"walk: the schedules cannot finish: rank {r} waits in its round {run.at[r]}")
    return _closing_fences(schedules, topology, cluster, run.clock)


class _Walk:
    """The walk's state: events (a rank posting its next round, a shared message draining) taken in time order.

    A message starts when the later of its two ends posts. Its time is known then unless it crosses nodes under a
    NIC limit: such a message drains its bytes (``link.time - alpha`` seconds of a whole port) at the share of a
    port its two nodes give it now, ``min(1, nics / k)`` with k the messages leaving (entering) the node at this
    moment, the smaller of its two ends, and every start or end of a crossing message changes the shares of the
    others at its two nodes. It ends ``alpha`` after its last byte. A round ends when all its messages have,
    plus its local costs, and the rank posts its next round then.
    """

    def __init__(self, schedules, topology: Topology, cluster: Cluster, itemsize: int, clock: list[float]):
        self.schedules, self.topology, self.cluster, self.itemsize = schedules, topology, cluster, itemsize
        self.clock = clock                                  # each rank's post time, then its finish
        self.at = [0] * len(schedules)                      # each rank's round index
        self.left = [0] * len(schedules)                    # messages of its round not ended yet
        self.latest = [0.0] * len(schedules)                # the last of them to end so far
        self.local = [0.0] * len(schedules)                 # its round's cost beside its messages
        self.reads = [False] * len(schedules)               # its round priced as copies: messages only meet
        self.waiting: dict = defaultdict(deque)             # (src, dst, "s" | "r") -> posted sides not yet matched
        self.events: list = [(t, r, r, 0) for r, t in enumerate(clock)]    # (time, order, rank or _Flow, version)
        heapq.heapify(self.events)
        self.order = len(clock)
        self.members: dict[tuple, set] = defaultdict(set)   # a port (Walk.ports) -> the messages draining through it
        self.changed: set[tuple] = set()                    # ports whose messages changed at this moment

    def push(self, time: float, what, version: int = 0) -> None:
        self.order += 1
        heapq.heappush(self.events, (time, self.order, what, version))

    def run(self) -> None:
        events = self.events
        while events:
            now, _, what, version = heapq.heappop(events)
            if isinstance(what, int):
                self.post(what, now)
            elif what.version == version:                   # a message drained (entries from before a reshare skipped)
                self.drained(what, now)
            if self.changed and (not events or events[0][0] > now):
                self.reshare(now)                           # once for all that started or ended at this moment

    def post(self, r: int, now: float) -> None:
        """Rank r posts its next round at ``now`` (or finishes): each message whose other end is posted starts."""
        self.clock[r] = now
        rounds = self.schedules[r].rounds
        if self.at[r] >= len(rounds):
            return
        rnd = rounds[self.at[r]]
        shape = shape_of(rnd)
        size = self.itemsize
        messages = round_messages(self.cluster.model, [(self.topology.tier(r, p), n * size) for p, n in shape.sends],
                                  [(self.topology.tier(r, p), n * size) for p, n, _ in shape.recvs])
        self.local[r], self.reads[r] = self.cluster.local(shape, messages, size), self.cluster.reads(shape)
        self.left[r], self.latest[r] = len(rnd.sends) + len(rnd.recvs), now
        for src, dst, n, side, other in [(r, s.peer, s.src.n, "s", "r") for s in rnd.sends] + \
                                        [(v.peer, r, v.dst.n, "r", "s") for v in rnd.recvs]:
            matched = self.waiting[src, dst, other]
            if matched:
                self.begin(src, dst, n * size, now)
                matched.popleft()
            else:
                self.waiting[src, dst, side].append(None)
        if not rnd.sends and not rnd.recvs:
            self.round_over(r)

    def begin(self, src: int, dst: int, nbytes: int, now: float) -> None:
        """A message of ``nbytes`` from ``src`` to ``dst`` starts at ``now``: its time known then if it shares no
        port, else draining at its share of the ports it goes through (``ports``), which ``reshare`` sets."""
        cluster, tier = self.cluster, self.topology.tier(src, dst)
        ports = self.ports(src, dst, tier)
        if not ports:
            took = cluster.message(tier, nbytes)
            for r in (src, dst):
                self.ended(r, now if self.reads[r] else now + took)
            return
        link = cluster.model.link(tier)
        flow = _Flow(src, dst, link.time(nbytes) - link.alpha, link.alpha, now, ports)
        for key, _ in ports:
            self.members[key].add(flow)
        self.changed.update(key for key, _ in ports)

    def ports(self, src: int, dst: int, tier: str) -> tuple:
        """The ports a message shares, ``(key, ports behind it)`` each: its two nodes' NICs under a NIC limit, its
        two ranks' ports over a tier with one (``Link.port``); none for a message with a link of its own."""
        ports: tuple = ()
        if tier == INTER and self.cluster.nics_per_node is not None:
            a, b = self.topology.node_of[src], self.topology.node_of[dst]
            ports = ((("node out", a), self.cluster.nics_per_node), (("node in", b), self.cluster.nics_per_node))
        if tier in self.cluster.model.ports and not (self.reads[src] or self.reads[dst]):
            ports += ((("rank out", src, tier), 1), (("rank in", dst, tier), 1))
        return ports

    def drained(self, flow: _Flow, now: float) -> None:
        for key, _ in flow.ports:
            self.members[key].discard(flow)
        self.changed.update(key for key, _ in flow.ports)
        for r in (flow.src, flow.dst):
            self.ended(r, now + flow.alpha)

    def reshare(self, now: float) -> None:
        """The shared messages at the ports whose messages changed, at their shares from now: the smallest of
        ``min(1, ports / k)`` over the ports each goes through, k the messages through that port now."""
        flows = set().union(*(self.members[key] for key in self.changed))
        self.changed.clear()
        for flow in flows:
            rate = min(_share(len(self.members[key]), ports) for key, ports in flow.ports)
            if rate != flow.rate:
                flow.left -= flow.rate * (now - flow.since)
                flow.since, flow.rate = now, rate
                flow.version += 1
                self.push(now + max(flow.left, 0.0) / rate, flow, flow.version)

    def ended(self, r: int, when: float) -> None:
        self.latest[r] = max(self.latest[r], when)
        self.left[r] -= 1
        if not self.left[r]:
            self.round_over(r)

    def round_over(self, r: int) -> None:
        self.at[r] += 1
        self.push(self.latest[r] + self.local[r], r)


class _Flow:
    """A message through shared ``ports``: ``left`` seconds of a whole port's time, draining at ``rate``."""

    __slots__ = ("src", "dst", "left", "alpha", "since", "rate", "version", "ports")

    def __init__(self, src: int, dst: int, work: float, alpha: float, now: float, ports: tuple):
        self.src, self.dst, self.left, self.alpha, self.since, self.ports = src, dst, work, alpha, now, ports
        self.rate, self.version = 0.0, 0          # no share yet: the reshare at its start gives it one


def _share(k: int, ports: int) -> float:
    """The fraction of a port each of ``k`` messages through ``ports`` ports at once gets."""
    return 1.0 if k <= ports else ports / k


def _closing_fences(schedules, topology: Topology, cluster: Cluster, clock: list[float]) -> list[float]:
    """A schedule with window rounds ends at one more fence (the executor's): every rank of its node is done."""
    for group in topology.nodes:
        if any(rnd.window for r in group for rnd in schedules[r].rounds):
            done = max(clock[r] for r in group) + cluster.model.fence
            for r in group:
                clock[r] = done
    return clock


# -- lockstep: classes of ranks from the counted forms ------------------------------------------------------
def _tiered(rank: int, shape: Shape, topology: Topology | StandIns, ports: frozenset[str]) -> tuple:
    """A round as its cost sees it: peers replaced by their tiers, the messages over a tier with a port merged into
    one a direction (``costmodel.round_messages``), and the shape for its local costs, peerless."""
    sends = sorted((topology.tier(rank, p), n) for p, n in shape.sends)
    recvs = sorted((topology.tier(rank, p), n, red) for p, n, red in shape.recvs)
    peerless = Shape(tuple((-1, n) for _, n in sends), tuple((-1, n, red) for _, n, red in recvs), shape.copied,
                     shape.window, shape.published, written=shape.written)
    return (tuple(through_ports(ports, sends)), tuple(through_ports(ports, [(t, n) for t, n, _ in recvs])),
            peerless)


def lockstep(summaries: Sequence[Summary], topology: Topology, cluster: Cluster, itemsize: int) -> tuple[float, int]:
    """``(seconds, classes)``: the call's time with every round waiting for its slowest rank (module doc)."""
    runs, class_of = _classes(summaries, topology, cluster.model.ports)   # runs[c]: class c's ((repeat, round), ...)
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


def _classes(summaries, topology: Topology, ports: frozenset[str] = frozenset()) -> tuple[list, list[int]]:
    """The distinct runs of rounds (peers read as their tiers) and each rank's class among them."""
    classes: dict = {}
    if isinstance(summaries, RankClasses):    # a form's classes, their peers read as stand-ins of their tiers
        stand_ins = StandIns()
        number = [classes.setdefault(tuple((k, _tiered(0, shape, stand_ins, ports)) for k, shape in summaries.whole(c)),
                                     len(classes)) for c in range(len(summaries.templates))]
        class_of = [number[c] for c in summaries.class_of]
    else:
        class_of = [classes.setdefault(tuple((k, _tiered(r, shape, topology, ports)) for k, shape in summary),
                                       len(classes)) for r, summary in enumerate(summaries)]
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
    inn = sum(m * sum(t == INTER for t, _ in now[c][1]) for c, m in kind if now[c] is not None)
    return max((cost(now[c], out, inn) for c, _ in kind if now[c] is not None), default=0.0)


def _round_cost(rnd: tuple, send_share: float, recv_share: float, cluster: Cluster, itemsize: int) -> float:
    sends, recvs, shape = rnd
    slowest = 0.0
    for tier, n in sends if not cluster.reads(shape) else ():
        slowest = max(slowest, cluster.message(tier, n * itemsize, send_share if tier == INTER else 1.0))
    for tier, n in recvs if not cluster.reads(shape) else ():
        slowest = max(slowest, cluster.message(tier, n * itemsize, recv_share if tier == INTER else 1.0))
    messages = [(t, n * itemsize) for t, n in sends] + [(t, n * itemsize) for t, n in recvs]
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
            tree_segment_bytes: int = 0, step_limit: int = STEP_LIMIT, method: str = "auto",
            root: int = 0) -> Prediction:
    """One call of ``nbytes`` (sized as in ``pc.traffic``) simulated, by ``method``: "walk", "lockstep" or "auto"
    (the counted form above ``FORM_ABOVE`` ranks where the algorithm has one, else the walk up to
    ``step_limit`` steps, else nothing: ``method`` "none" and a note). ``root``: of the rooted collectives."""
    if algorithm not in registry.schedule_algorithms(collective):
        raise ValueError(f"simulate: {collective} has no schedule {algorithm!r}; expected one of "
                         f"{', '.join(registry.schedule_algorithms(collective))}")
    if method not in METHODS:
        raise ValueError(f"simulate: method must be one of {', '.join(METHODS)}, got {method!r}")
    check_call("simulate", topology, nbytes, itemsize, root, tree_segment_bytes)
    cluster = replace(cluster, model=cluster.model.at_call(working_set(collective, nbytes, topology)))  # its memory share
    segment = segment_elements(tree_segment_bytes, itemsize)
    problem = even_problem(collective, 0, topology.size, topology, nbytes // itemsize, root=root, tree_segment=segment)
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
