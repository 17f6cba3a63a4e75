"""An alpha-beta-gamma cost model per topology tier, and the time it predicts for a schedule.

A message of ``b`` bytes over tier ``t`` takes ``alpha[t] + b * beta[t]`` seconds (alpha: latency,
beta: seconds per byte, 1/beta the bandwidth); reducing ``b`` bytes locally takes ``gamma * b``.
alpha and beta come from ping-pong round trips, gamma from timing ``np.add`` (``pycollect bench
fit``), and the terms below from the measured collective calls themselves (tools/costfit.py).

A schedule is priced rank by rank, walking its rounds in order. A round costs the slowest of its
messages (a rank's sends and receives in one round are in flight together) plus the reductions
it does plus ``overhead``, the executor's own cost of a round (Python, request handling), which a
ping-pong cannot see; a rank's time is the sum of its rounds, and the collective's time the
slowest rank's.

What a ping-pong cannot see either, each term 0 (or None) by default so that a model of alpha,
beta, gamma and overhead prices as it always did:
- bytes beyond a size cost more than the first ones: a link's ``beta_far`` past ``far_bytes``
  per message, and ``gamma_far``, ``copy_far`` past ``cache_bytes`` per reduced or copied operand
  (data that no longer sits in cache streams from memory);
- a round's messages are in flight together but not free: each tier's ``beta_shared`` charges the
  bytes of the others beside the slowest (a send and a receive both copied by the same cores, a
  loopback network's both directions through one kernel);
- a tier with a ``port`` (the presets' GPU links: a GPU's NVLink, its NIC) carries what a rank sends over it in
  one round as one message through one port, and what it receives as another: a linear gather's root takes its
  N-1 blocks at the port's bandwidth, not N-1 links' worth at once. Both directions drain together (full duplex),
  so a ring's round, one send and one receive, costs what it did;
- ``copy`` seconds per byte of a round's local copies (``Shape.copied``: block placement, the
  in-to-out copies of the executor's ``pre`` and ``post``; ``Shape.published``: what a window
  round copies into its window);
- ``fence`` seconds per shared-memory window round beyond ``overhead`` (the fence every rank meets);
- ``call_overhead`` seconds per call (argument checks, selection, building the execution);
- ``window_as_messages=False``: a window round's receives priced as what the executor does with
  them, one after another (a copy out of the peer's window, or a reduction straight from it), not
  as messages over the link;
- ``eager_sends=True``: a round that only sends (a tree passing a segment up or down) pays no link
  latency. Nothing comes back to it: its sends complete once MPI has taken their bytes (at once for a
  message under the eager limit), and the latency is what the receiver's round waits, which the receiver's
  time already holds; the sender pays the bytes and the round's overhead;
- ``dirty`` seconds per byte of what a peer fetches that the call itself wrote: what a round sends from any
  buffer but the caller's input (``Shape.written``: a block just reduced into ``out``, one received and
  forwarded, one copied there first) and what a window round reads (published that round). Those lines
  sit modified in the writer's cache, and the peer's copy pulls them from there: at 2 ranks a ring
  allreduce's second round, sending the block its first reduced, and a recursive-doubling allgather,
  sending its block from ``out`` where it copied it, run slower than a ring allgather's one round of the
  same size sending the caller's input;
- past ``memory_bytes`` of a node's working set (what its ranks' inputs and outputs of the call hold
  together, ``working_set``) the last level of cache no longer holds the call: a fraction
  ``1 - memory_bytes / working set`` of every byte reduced, copied or sent over a link with a
  ``beta_memory`` costs the memory rate (``gamma_memory``, ``copy_memory``, ``beta_memory``) instead of
  its near or far rate (``Model.at_call``). The far rates above are a message's or an operand's own
  size leaving the core's cache; this is the whole call leaving the shared one, which a message
  size alone cannot tell (the same 4 MiB message in a call whose buffers fit the shared cache and in
  one whose buffers do not).
The walk ignores waiting on late peers and segmenting: it is a model to rank algorithms and
explain a choice, not a simulator. No MPI here; everything but ``measure_gamma`` is pure.
"""
from __future__ import annotations

import time
from dataclasses import dataclass, field, replace
from functools import cached_property
from typing import Iterable, Mapping, Sequence

import numpy as np

from .algorithms import registry
from .algorithms.registry import all_summaries
from .engine.schedule import Round, Schedule
from .engine.shapes import even_problem, segment_elements
from .engine.summary import RankClasses, Shape, StandIns, Summary, distinct, of_schedule, shape_of
from .engine.topology import Topology


def per_byte(nbytes: float, near: float, far: float | None, limit: int | None) -> float:
    """Seconds for ``nbytes`` at ``near`` s/byte up to ``limit`` bytes and ``far`` s/byte beyond
    (one rate when ``far`` or ``limit`` is None)."""
    if far is None or limit is None or nbytes <= limit:
        return nbytes * near
    return limit * near + (nbytes - limit) * far


@dataclass(frozen=True)
class Link:
    """One tier: ``alpha`` seconds per message, ``beta`` seconds per byte (``beta_far`` past ``far_bytes``);
    ``beta_shared`` seconds per byte of a round's other messages over this tier, beside its slowest one; ``port``:
    what a rank sends over the tier in one round drains as one message, and what it receives as another."""

    alpha: float
    beta: float
    beta_far: float | None = None
    far_bytes: int | None = None
    beta_shared: float = 0.0
    beta_memory: float | None = None
    port: bool = False       # a rank's messages of a round over this tier go through one port a direction

    def time(self, nbytes: int) -> float:
        return self.alpha + per_byte(nbytes, self.beta, self.beta_far, self.far_bytes)

    @property
    def bandwidth(self) -> float:
        """Bytes per second (infinite when beta is 0)."""
        return 1.0 / self.beta if self.beta > 0 else float("inf")


@dataclass(frozen=True)
class Model:
    """``links[tier]`` for each tier measured (``"intra-node"``, ``"inter-node"``); ``gamma`` s/byte reduced."""

    links: Mapping[str, Link]
    gamma: float = 0.0
    samples: Mapping[str, int] = field(default_factory=dict, compare=False)
    overhead: float = 0.0  # seconds per communicating round, beyond the messages
    gamma_far: float | None = None     # s/byte reduced past cache_bytes (None: gamma)
    copy: float = 0.0                  # s/byte of a round's local copies
    copy_far: float | None = None      # s/byte copied past cache_bytes (None: copy)
    cache_bytes: int | None = None     # where gamma_far and copy_far start (None: nowhere)
    fence: float = 0.0                 # seconds per window round, beyond overhead
    call_overhead: float = 0.0         # seconds per call
    window_as_messages: bool = True    # False: a window round's reads priced as the copies they are
    eager_sends: bool = False          # True: a round that only sends pays no latency (the receiver's round does)
    memory_bytes: int | None = None    # a node's working set past which calls stream from memory (None: never)
    gamma_memory: float | None = None  # s/byte reduced from memory (None: gamma and gamma_far)
    copy_memory: float | None = None   # s/byte copied from memory (None: copy and copy_far)
    dirty: float = 0.0                 # s/byte the call wrote that a peer fetches (Shape.written)

    @cached_property
    def shares(self) -> bool:
        """Whether some tier charges the messages beside a round's slowest (read once per round priced)."""
        return any(k.beta_shared for k in self.links.values())

    @cached_property
    def ports(self) -> frozenset[str]:
        """The tiers whose messages of one round and direction go through one port (``Link.port``)."""
        return frozenset(t for t, k in self.links.items() if k.port)

    def reduce_time(self, nbytes: int) -> float:
        """Seconds to reduce one received operand of ``nbytes`` into place."""
        return per_byte(nbytes, self.gamma, self.gamma_far, self.cache_bytes)

    def copy_time(self, nbytes: int) -> float:
        return per_byte(nbytes, self.copy, self.copy_far, self.cache_bytes)

    def at_call(self, working_set_bytes: int) -> "Model":
        """The model a call sees whose node's working set is ``working_set_bytes``: ``self`` up to
        ``memory_bytes``, past it every near and far rate ``r`` of a term with a memory rate ``m`` priced
        ``(1 - x) * r + x * m``, ``x = 1 - memory_bytes / working set`` (every byte is near or far, so
        this is ``x`` of the bytes at ``m``)."""
        if self.memory_bytes is None or working_set_bytes <= self.memory_bytes:
            return self
        x = 1.0 - self.memory_bytes / working_set_bytes

        def mix(rate: float, memory: float | None) -> float:
            return rate if memory is None else (1.0 - x) * rate + x * memory

        def mix_far(rate: float | None, memory: float | None) -> float | None:   # no far regime stays none
            return None if rate is None else mix(rate, memory)
        links = {t: replace(k, beta=mix(k.beta, k.beta_memory), beta_far=mix_far(k.beta_far, k.beta_memory),
                            beta_memory=None) for t, k in self.links.items()}
        return replace(self, links=links, gamma=mix(self.gamma, self.gamma_memory),
                       gamma_far=mix_far(self.gamma_far, self.gamma_memory), copy=mix(self.copy, self.copy_memory),
                       copy_far=mix_far(self.copy_far, self.copy_memory), memory_bytes=None, gamma_memory=None,
                       copy_memory=None)

    def link(self, tier: str) -> Link:
        if tier not in self.links:
            raise ValueError(f"cost model: no measurement for tier {tier!r} (have {', '.join(self.links) or 'none'}); "
                             f"fit the model on a run that has pairs of that tier")
        return self.links[tier]

    def to_dict(self) -> dict:
        return {"gamma_s_per_byte": self.gamma, "overhead_s_per_round": self.overhead,
                "gamma_far_s_per_byte": self.gamma_far, "copy_s_per_byte": self.copy,
                "copy_far_s_per_byte": self.copy_far, "cache_bytes": self.cache_bytes,
                "fence_s_per_window_round": self.fence, "overhead_s_per_call": self.call_overhead,
                "window_as_messages": self.window_as_messages, "eager_sends": self.eager_sends,
                "memory_bytes": self.memory_bytes,
                "gamma_memory_s_per_byte": self.gamma_memory, "copy_memory_s_per_byte": self.copy_memory,
                "dirty_s_per_byte": self.dirty,
                "tiers": {t: {"alpha_s": k.alpha, "beta_s_per_byte": k.beta, "beta_far_s_per_byte": k.beta_far,
                              "far_bytes": k.far_bytes, "beta_shared_s_per_byte": k.beta_shared,
                              "beta_memory_s_per_byte": k.beta_memory, "port": k.port,
                              "samples": self.samples.get(t, 0)}
                          for t, k in self.links.items()}}

    @classmethod
    def from_dict(cls, data: dict) -> "Model":
        """The inverse of ``to_dict``; a file written before the far, copy, fence, call and memory terms
        loads with them at their defaults. ValueError names the first field that is missing or out of range
        (every rate, time and size a finite number >= 0, the switches true or false): a negative or NaN
        term would price calls at negative or NaN times that look like answers."""
        tiers = data.get("tiers")
        if not isinstance(tiers, dict) or not tiers:
            raise ValueError("fitted model: tiers must be an object of one entry a tier, got "
                             f"{type(tiers).__name__}")
        links, samples = {}, {}
        for t, v in tiers.items():
            where = f"tiers.{t}"
            if not isinstance(v, dict):
                raise ValueError(f"fitted model: {where} must be an object, got {type(v).__name__}")
            for key in ("alpha_s", "beta_s_per_byte"):
                if key not in v:
                    raise ValueError(f"fitted model: {where} lacks {key}")
            links[t] = Link(_term(v, "alpha_s", where), _term(v, "beta_s_per_byte", where),
                            _term(v, "beta_far_s_per_byte", where, None), _term(v, "far_bytes", where, None, int),
                            _term(v, "beta_shared_s_per_byte", where, 0.0), _term(v, "beta_memory_s_per_byte", where,
                                                                                  None),
                            _switch(v, "port", where, False))
            samples[t] = _term(v, "samples", where, 0, int)
        return cls(links, _term(data, "gamma_s_per_byte", default=0.0), samples,
                   _term(data, "overhead_s_per_round", default=0.0),
                   gamma_far=_term(data, "gamma_far_s_per_byte", default=None),
                   copy=_term(data, "copy_s_per_byte", default=0.0),
                   copy_far=_term(data, "copy_far_s_per_byte", default=None),
                   cache_bytes=_term(data, "cache_bytes", default=None, kind=int),
                   fence=_term(data, "fence_s_per_window_round", default=0.0),
                   call_overhead=_term(data, "overhead_s_per_call", default=0.0),
                   window_as_messages=_switch(data, "window_as_messages", "", True),
                   eager_sends=_switch(data, "eager_sends", "", False),
                   memory_bytes=_term(data, "memory_bytes", default=None, kind=int),
                   gamma_memory=_term(data, "gamma_memory_s_per_byte", default=None),
                   copy_memory=_term(data, "copy_memory_s_per_byte", default=None),
                   dirty=_term(data, "dirty_s_per_byte", default=0.0))


_REQUIRED = object()


def _term(data: dict, key: str, where: str = "", default=_REQUIRED, kind=float):
    """``data[key]``, a finite number >= 0 (an integer where ``kind`` is int), or ``default`` where it is absent
    or null (a term the file does not fit)."""
    value = data.get(key)
    if value is None and default is not _REQUIRED:
        return default
    whole = kind is int and isinstance(value, (int, float)) and float(value).is_integer()
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not 0 <= value < float("inf") \
            or (kind is int and not whole):
        what = "an integer >= 0" if kind is int else "a finite number >= 0"
        raise ValueError(f"fitted model: {where + '.' if where else ''}{key} must be {what}, got {value!r}")
    return int(value) if kind is int else float(value)


def _switch(data: dict, key: str, where: str, default: bool) -> bool:
    value = data.get(key, default)
    if not isinstance(value, bool):
        raise ValueError(f"fitted model: {where + '.' if where else ''}{key} must be true or false, got {value!r}")
    return value


# -- fitting --------------------------------------------------------------------------------------------
def fit_link(samples: Iterable[tuple[int, float]], round_trip: bool = True) -> Link:
    """Least-squares alpha and beta from ``(bytes, seconds)`` samples (round trips unless ``round_trip=False``).

    Each equation ``alpha + bytes * beta = t`` is divided by ``t``, so the fit minimises relative
    error: otherwise the large messages decide everything and alpha comes out as noise. A negative
    coefficient is pinned to 0 and the other refitted alone.
    """
    pts = np.array([(float(b), float(t)) for b, t in samples], dtype=np.float64).reshape(-1, 2)  # (S, 2)
    if len(pts) == 0:
        raise ValueError("fit_link: no samples")
    if np.any(pts[:, 0] < 0) or np.any(pts[:, 1] <= 0):
        raise ValueError("fit_link: sizes must be >= 0 bytes and times > 0 seconds")
    if len(np.unique(pts[:, 0])) < 2:
        raise ValueError(f"fit_link: samples at {len(np.unique(pts[:, 0]))} distinct size(s); "
                         "latency and bandwidth need at least two")
    nbytes, seconds = pts[:, 0], pts[:, 1] / (2.0 if round_trip else 1.0)   # one way: half the round trip
    a = np.stack([np.ones_like(nbytes), nbytes], axis=1) / seconds[:, None]  # (S, 2), rows scaled by 1/t
    alpha, beta = np.linalg.lstsq(a, np.ones_like(seconds), rcond=None)[0]
    if alpha < 0:
        alpha, beta = 0.0, _one_coefficient(nbytes, seconds)
    elif beta < 0:
        alpha, beta = _one_coefficient(np.ones_like(nbytes), seconds), 0.0
    return Link(float(alpha), float(beta))


def _one_coefficient(x: np.ndarray, t: np.ndarray) -> float:
    """The c of ``t = c * x`` in the same relative least squares (0 when x is all zero)."""
    col = (x / t)[:, None]
    return max(0.0, float(np.linalg.lstsq(col, np.ones_like(t), rcond=None)[0][0]))


def fit_model(samples_by_tier: Mapping[str, Sequence[tuple[int, float]]], gamma: float = 0.0,
              round_trip: bool = True) -> Model:
    """A Model from ping-pong samples ``{tier: [(bytes, seconds), ...]}`` and a measured gamma."""
    links = {t: fit_link(s, round_trip) for t, s in samples_by_tier.items() if len(s)}
    if not links:
        raise ValueError("fit_model: no samples in any tier")
    return Model(links, float(gamma), {t: len(s) for t, s in samples_by_tier.items() if len(s)})


def fit_overhead(points: Iterable[tuple[float, float, int]]) -> float:
    """Seconds per round the messages do not explain: the median of ``(measured - predicted) / rounds``.

    ``points`` are ``(measured s, predicted s without overhead, rounds on the critical path)`` of
    small calls, where the executor's own per-round cost dominates; negative residues count as 0.
    """
    per_round = [max(0.0, (m - p) / r) for m, p, r in points if r > 0]
    if not per_round:
        raise ValueError("fit_overhead: no measured call with a communicating round")
    return float(np.median(per_round))


def measure_gamma(nbytes: int = 4 << 20, dtype="float32", repeats: int = 5) -> float:
    """Seconds per byte of ``np.add(a, b, out=a)`` on ``nbytes`` (best of ``repeats``): the reduction cost."""
    n = max(1, nbytes // np.dtype(dtype).itemsize)
    a, b = np.ones(n, dtype), np.ones(n, dtype)
    np.add(a, b, out=a)                      # fault the pages in before timing
    best = float("inf")
    for _ in range(max(1, repeats)):
        t0 = time.perf_counter()
        np.add(a, b, out=a)
        best = min(best, time.perf_counter() - t0)
    return best / (n * np.dtype(dtype).itemsize)


# -- prediction -----------------------------------------------------------------------------------------
def round_time(model: Model, rnd: Round | Shape, rank: int, topology: Topology | StandIns, itemsize: int) -> float:
    """The slowest message of the round (sends and receives overlap) plus what it sends that the call wrote
    (``dirty``), its reductions and copies."""
    shape = shape_of(rnd) if isinstance(rnd, Round) else rnd
    if shape.window and not model.window_as_messages:
        return window_round_time(model, shape, itemsize)
    tiers = round_messages(model, [(topology.tier(rank, peer), n * itemsize) for peer, n in shape.sends],
                           [(topology.tier(rank, peer), n * itemsize) for peer, n, _ in shape.recvs])
    slowest, first = 0.0, None
    if tiers:
        first = slowest_message(model, tiers)
        tier, nbytes = tiers[first]
        link = model.link(tier)
        slowest = link.time(nbytes)
        if model.eager_sends and not shape.recvs:     # nothing to wait for: no latency (module doc)
            slowest -= link.alpha
    if model.shares:
        slowest += shared_time(model, tiers, first)
    if model.dirty and shape.written:
        slowest += dirty_time(model, shape, itemsize)
    local, fixed = _local_parts(model, shape, itemsize)
    return slowest + local + fixed          # summed in this order, as the model always has


def round_messages(model: Model, sends: Sequence[tuple[str, int]], recvs: Sequence[tuple[str, int]]) \
        -> list[tuple[str, int]]:
    """A round's messages ``(tier, bytes)`` as the model prices them: its ``sends`` then its ``recvs``, those over a
    tier with a port (``Model.ports``) merged into one message a direction (module doc)."""
    if not model.ports:
        return [*sends, *recvs]
    return [*through_ports(model.ports, sends), *through_ports(model.ports, recvs)]


def through_ports(ports: frozenset[str], messages: Sequence[tuple[str, int]]) -> list[tuple[str, int]]:
    """``messages`` ``(tier, size)`` of one direction, those over a tier in ``ports`` summed into one (after the
    others, in the order their tiers first come)."""
    merged: dict[str, int] = {}
    kept = []
    for tier, nbytes in messages:
        if tier in ports:
            merged[tier] = merged.get(tier, 0) + nbytes
        else:
            kept.append((tier, nbytes))
    return kept + list(merged.items())


def local_time(model: Model, shape: Shape, itemsize: int) -> float:
    """What a round costs beside its messages: reductions, copies, what it publishes, per-round overhead and fence
    (a round's peers do not enter here: the cluster simulator prices its messages itself and adds this)."""
    local, fixed = _local_parts(model, shape, itemsize)
    return local + fixed


def _local_parts(model: Model, shape: Shape, itemsize: int) -> tuple[float, float]:
    if model.gamma_far is None or model.cache_bytes is None:   # one rate: the sum, as the model always priced it
        reducing = model.gamma * (sum(n for _, n, reduces in shape.recvs if reduces) * itemsize)
    else:                                                      # each operand in or out of cache on its own
        reducing = sum(model.reduce_time(n * itemsize) for _, n, reduces in shape.recvs if reduces)
    local = reducing + (model.copy_time(shape.copied * itemsize) if shape.copied else 0.0) \
        + (model.copy_time(shape.published * itemsize) if shape.published else 0.0)
    fixed = (model.overhead + (model.fence if shape.window else 0.0)) if shape.communicates else 0.0
    return local, fixed


def dirty_time(model: Model, shape: Shape, itemsize: int) -> float:
    """``dirty`` on what a round sends that the call itself wrote (``Shape.written``): the peer's copy fetches it
    from the writer's cache (``dirty_bytes``)."""
    return model.dirty * dirty_bytes(model, shape.written * itemsize)


def dirty_bytes(model: Model, written: int) -> int:
    """The bytes of ``written`` that ``dirty`` prices: up to ``cache_bytes``, what the writer's cache holds modified;
    past it the lines were written back before the peer reads them and cost what any byte out of cache does."""
    return written if model.cache_bytes is None else min(written, model.cache_bytes)


def slowest_message(model: Model, messages: Sequence[tuple[str, int]]) -> int:
    """The index of the slowest of a round's messages ``(tier, bytes)`` (ties: the first listed), which the round
    waits for; the others share its time (``shared_time``)."""
    return max(range(len(messages)), key=lambda i: model.link(messages[i][0]).time(messages[i][1]))


def shared_time(model: Model, messages: Sequence[tuple[str, int]], slowest: int | None = None) -> float:
    """``beta_shared`` of each tier on the bytes of a round's messages ``(tier, bytes)`` other than its slowest
    (``slowest``: its index, where the caller found it already)."""
    if not messages:
        return 0.0
    first_slowest = slowest_message(model, messages) if slowest is None else slowest
    return sum(model.link(t).beta_shared * b for i, (t, b) in enumerate(messages) if i != first_slowest)


def window_round_time(model: Model, shape: Shape, itemsize: int) -> float:
    """A window round as the executor runs it: its copies, what it publishes, the fence, then each read in turn."""
    reads = sum(model.reduce_time(n * itemsize) if reduces else model.copy_time(n * itemsize)
                for _, n, reduces in shape.recvs)
    reads += model.dirty * dirty_bytes(model, sum(n for _, n, _ in shape.recvs) * itemsize)
    local = model.copy_time(shape.copied * itemsize) + model.copy_time(shape.published * itemsize)
    return reads + local + model.overhead + model.fence


def rank_times(model: Model, schedules: Sequence[Schedule], topology: Topology, itemsize: int) -> list[float]:
    """Each rank's predicted seconds: the sum of its rounds; ``schedules[r]`` is rank r's."""
    return summary_times(model, [of_schedule(s) for s in schedules], topology, itemsize)


def summary_times(model: Model, summaries: Sequence[Summary], topology: Topology, itemsize: int) -> list[float]:
    """Each rank's predicted seconds from its summary (engine/summary.py); ``summaries[r]`` is rank r's.

    Every rank pays ``call_overhead`` once, on top of its rounds, and a schedule with window rounds
    one more ``fence``: the executor closes it with a last fence before the window is reused. A counted form's
    ``RankClasses`` are priced once a class (its template's peers read as stand-ins of their tiers)."""
    if isinstance(summaries, RankClasses):
        stand_ins = StandIns()
        parts = summaries.fold(lambda summary, start: _rounds_time(model, summary, 0, stand_ins, itemsize, start))
        times = [model.call_overhead + rounds + (model.fence if window else 0.0) for rounds, window in parts]
        return [times[c] for c in summaries.class_of]
    return [_summary_time(model, summary, rank, topology, itemsize) for rank, summary in enumerate(summaries)]


def _summary_time(model: Model, summary: Summary, rank: int, topology: Topology | StandIns, itemsize: int) -> float:
    rounds, window = _rounds_time(model, summary, rank, topology, itemsize, None)
    return model.call_overhead + rounds + (model.fence if window else 0.0)


def _rounds_time(model: Model, summary: Summary, rank: int, topology: Topology | StandIns, itemsize: int,
                 start: tuple[float, bool] | None) -> tuple[float, bool]:
    """``(seconds of the rounds, whether one goes through a window)``, going on from ``start`` (RankClasses.fold)."""
    seconds, window = start or (0.0, False)
    seconds += sum(k * round_time(model, shape, rank, topology, itemsize) for k, shape in summary)
    return seconds, window or any(shape.window for _, shape in summary)


def working_set(collective: str, nbytes: int, topology: Topology) -> int:
    """Bytes the inputs and outputs of one call hold on its fullest node (``nbytes`` sized as in
    ``pc.traffic``; a rooted call's root counted as every rank): what the node's shared cache must hold
    for the call to run from it."""
    block = nbytes // max(1, topology.size)
    if collective in ("allgather", "gather", "reduce_scatter", "scatter"):
        per_rank = nbytes + block        # every block on one side, one block on the other
    else:
        per_rank = 2 * nbytes            # the whole vector in and out (alltoall: each rank's send length)
    return per_rank * topology.ranks_per_node


def predict(model: Model, collective: str, algorithm: str, topology: Topology, nbytes: int,
            itemsize: int = 4, tree_segment_bytes: int = 0) -> float:
    """Predicted seconds of one call of ``nbytes`` (sized as in ``pc.traffic``): the slowest rank's time."""
    from .traffic import check_call
    if algorithm not in registry.schedule_algorithms(collective):
        raise ValueError(f"predict: {collective} has no schedule {algorithm!r} to price; expected one of "
                         f"{', '.join(registry.schedule_algorithms(collective))}")
    check_call("predict", topology, nbytes, itemsize, 0, tree_segment_bytes)
    segment = segment_elements(tree_segment_bytes, itemsize)
    problem = even_problem(collective, 0, topology.size, topology, nbytes // itemsize, tree_segment=segment)
    at_call = model.at_call(working_set(collective, nbytes, topology))
    return max(summary_times(at_call, all_summaries(collective, algorithm, problem), topology, itemsize))


def critical_rounds(collective: str, algorithm: str, topology: Topology, nbytes: int, itemsize: int = 4,
                    tree_segment_bytes: int = 0) -> int:
    """Communicating rounds of the busiest rank for one call (what ``overhead`` is paid for)."""
    segment = segment_elements(tree_segment_bytes, itemsize)
    problem = even_problem(collective, 0, topology.size, topology, nbytes // itemsize, tree_segment=segment)
    return max(sum(k * shape.communicates for k, shape in s)
               for s in distinct(all_summaries(collective, algorithm, problem)))


def predict_all(model: Model, collective: str, topology: Topology, nbytes: int, itemsize: int = 4,
                tree_segment_bytes: int = 0, algorithms: Sequence[str] | None = None) -> dict[str, float]:
    """``{algorithm: predicted seconds}`` for every schedule of ``collective`` (or those named)."""
    names = registry.schedule_algorithms(collective) if algorithms is None else algorithms
    return {a: predict(model, collective, a, topology, nbytes, itemsize, tree_segment_bytes) for a in names}


def pick(predicted: Mapping[str, float]) -> str:
    """The algorithm of least predicted time (the first listed on a tie)."""
    if not predicted:
        raise ValueError("pick: no predictions")
    return min(predicted, key=predicted.__getitem__)
