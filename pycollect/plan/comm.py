"""The collectives one training step runs, counted by the schedules and priced by the cost model.

Each collective is walked with ``pc.traffic`` (bytes the busiest rank sends, per tier) and priced
with ``costmodel.predict`` (the alpha-beta links, round by round) on its group's real
topology: nothing here restates how many bytes a ring or a tree moves. Per step:

    tensor parallel (per layer, Megatron-LM)  forward: 2 allreduces of (b, s, h) activations, or
                                              with sequence parallelism 2 allgathers + 2 reduce-scatters;
                                              backward: the same again (twice with full recomputation,
                                              which reruns the forward's)
    pipeline (point to point)                 one (b, s, h) activation per micro-batch and chunk
                                              boundary forward, one gradient back (/t with sequence
                                              parallelism or Megatron-LM's scatter/gather); not a
                                              collective: priced as one message
    data parallel, P = the rank's parameters  ZeRO 0: allreduce of the gradients once a step;
                                              1: reduce-scatter of the gradients + allgather of the
                                              parameters once a step; 2: the reduce-scatter every
                                              micro-batch (only a shard of the gradients is kept);
                                              3: per micro-batch a reduce-scatter and two allgathers
                                              (forward and backward)
"""
from __future__ import annotations

import json
import math
from dataclasses import dataclass, replace
from functools import lru_cache

from ..algorithms import registry
from ..engine.topology import INTER, INTRA, Topology
from ..costmodel import Model, predict
from ..pipeline.schedules import vshaped
from ..traffic import traffic
from .config import ClusterSpec, ParallelConfig
from .model import ModelSpec, stage_params

__all__ = ["CommOp", "comm_ops", "tp_topology", "dp_topology", "pp_tier", "price", "nic_factor", "group_links",
           "TIERS"]

TIERS = (INTRA, INTER)
# when an op runs: once per forward/backward of each chunk (critical path), or for data parallelism
# once per step after backward (grad), once per step around the update (param), per micro-batch
PHASES = ("forward", "backward", "p2p", "step-grad", "step-param", "micro-grad", "micro-param")


@dataclass(frozen=True)
class CommOp:
    """One kind of call: ``calls`` per step on the busiest rank, ``nbytes`` each (as ``pc.traffic`` sizes it)."""

    where: str               # "tp", "pp", "dp"
    what: str
    collective: str          # allreduce, reduce_scatter, allgather, or p2p
    algorithm: str
    group: int
    nbytes: int
    calls: int
    phase: str
    sent: tuple              # ((tier, bytes the busiest rank sends per call), ...)
    seconds: float           # predicted per call

    @property
    def step_seconds(self) -> float:
        return self.calls * self.seconds

    def step_bytes(self) -> dict[str, int]:
        return {tier: self.calls * b for tier, b in self.sent}

    def to_dict(self) -> dict:
        return {"where": self.where, "what": self.what, "collective": self.collective, "algorithm": self.algorithm,
                "group": self.group, "bytes_per_call": self.nbytes, "calls_per_step": self.calls,
                "phase": self.phase, "sent_per_call_by_tier": dict(self.sent), "seconds_per_call": self.seconds,
                "sent_per_step_by_tier": self.step_bytes(), "seconds_per_step": self.step_seconds}


# -- groups on the machine ------------------------------------------------------------------------
def _nodes(ranks, cluster: ClusterSpec) -> Topology:
    return Topology.from_labels([cluster.node_of(r) for r in ranks])


def tp_topology(config: ParallelConfig, cluster: ClusterSpec) -> Topology:
    """The first tensor-parallel group: ranks 0 .. tp-1."""
    return _nodes(range(config.tp), cluster)


def dp_topology(config: ParallelConfig, cluster: ClusterSpec) -> Topology:
    """The first data-parallel group: ranks 0, tp, 2tp, ..."""
    return _nodes(range(0, config.tp * config.dp, config.tp), cluster)


def pp_tier(config: ParallelConfig, cluster: ClusterSpec) -> str:
    """The slowest tier between neighbouring stages (stage p-1 to 0 too when interleaved; zbv's V turns
    on stage p-1 and ends on stage 0: neighbours only)."""
    stride = config.tp * config.dp
    wraps = config.v > 1 and not vshaped(config.schedule)
    pairs = [(s, s + 1) for s in range(config.pp - 1)] + ([(config.pp - 1, 0)] if wraps else [])
    crosses = any(cluster.node_of(a * stride) != cluster.node_of(b * stride) for a, b in pairs)
    return INTER if crosses else INTRA


def nic_factor(cluster: ClusterSpec, topology: Topology) -> float:
    """How many ports' bandwidth a group's inter-node traffic gets: 1 with ``nics_per_node`` None.

    With n NICs per node of g GPUs, a group with k members on each node runs alongside g/k groups of
    its kind (every data-parallel group reduces at once), and the node's NICs are shared evenly:
    n k / g ports each, as NCCL spreads a ring's channels over the NICs near its members. With
    n = g = 8: a group of 8 members a node gets 8 ports (an eighth of the time on one), of 2 members
    2 ports, of 1 member 1 port; with fewer NICs than GPUs the factor falls below 1 (contention).
    """
    if cluster.nics_per_node is None or len(set(topology.node_of)) < 2:
        return 1.0
    k = topology.node_of.count(0)                                   # members on the first node
    return cluster.nics_per_node * k / min(cluster.gpus_per_node, cluster.gpus)


def group_links(cluster: ClusterSpec, topology: Topology) -> Model:
    """The cluster's links with the inter-node tier's bandwidth times ``nic_factor`` for this group."""
    factor = nic_factor(cluster, topology)
    links = cluster.links
    if factor == 1.0 or INTER not in links.links:
        return links
    tiers = dict(links.links)
    inter = tiers[INTER]
    tiers[INTER] = replace(inter, beta=inter.beta / factor, beta_shared=inter.beta_shared / factor,
                           beta_far=None if inter.beta_far is None else inter.beta_far / factor)
    return replace(links, links=tiers, samples={})


# -- pricing --------------------------------------------------------------------------------------
def _links_key(links: Model) -> str:
    """The whole model as text (its dict of links is not hashable): every term a fitted file carries prices the call."""
    return json.dumps(links.to_dict(), sort_keys=True)


@lru_cache(maxsize=4096)
def _walk(collective: str, algorithm: str, node_of: tuple, nbytes: int, dtype: str) -> tuple:
    counts = traffic(collective, algorithm, len(node_of), nbytes, Topology(node_of), dtype=dtype,
                     tree_segment_bytes=0)   # as costmodel.predict prices it (bytes, which the planner reads, alike)
    return tuple((tier, counts.max_sent_by_tier(tier)) for tier in TIERS)


@lru_cache(maxsize=4096)
def _seconds(collective: str, algorithm: str, node_of: tuple, nbytes: int, itemsize: int, key: str,
             simulate: bool = False) -> float:
    model = Model.from_dict(json.loads(key))
    if simulate:
        from ..clustersim import Cluster
        from ..clustersim import predict as simulated
        # one port a message: the group's links already carry nic_factor, the share of the NICs that the
        # groups running at once leave it; sharing them again inside the group would count it twice
        got = simulated(Cluster(model), collective, algorithm, Topology(node_of), nbytes, itemsize)
        if got.seconds is not None:          # else (no counted form, too many steps to walk) the alpha-beta price
            return got.seconds
    return predict(model, collective, algorithm, Topology(node_of), nbytes, itemsize)


def price(collective: str, algorithm: str, topology: Topology, nbytes: int, dtype: str,
          links: Model, simulate: bool = False) -> tuple[str, tuple, float]:
    """``(algorithm, sent per tier, seconds)`` of one call; ``auto`` takes the schedule predicted fastest.

    ``simulate``: seconds from the cluster simulator (clustersim.py: ranks waiting on late peers)
    where it answers, instead of each rank priced on its own (``ClusterSpec.simulate``, ``pycollect plan --simulate``).
    """
    itemsize = 2 if dtype == "float16" else 4
    # auto: every schedule a GPU's arrays can take; not "shm", whose windows are host shared memory (CuPy arrays
    # never use it, README) and whose window rounds the presets price as free copies
    names = tuple(a for a in registry.schedule_algorithms(collective) if a != "shm") if algorithm == "auto" \
        else (algorithm,)
    key = _links_key(links)
    timed = {a: _seconds(collective, a, topology.node_of, nbytes, itemsize, key, simulate) for a in names}
    best = min(timed, key=timed.__getitem__)
    return best, _walk(collective, best, topology.node_of, nbytes, dtype), timed[best]


def _op(where, what, collective, config, topology, count, dtype, calls, phase, links, simulate=False) -> CommOp:
    itemsize = 2 if dtype == "float16" else 4
    nbytes = int(round(count)) * itemsize                            # elements: a count scaled by a float
    algorithm, sent, seconds = price(collective, config.algorithm, topology, nbytes, dtype, links, simulate)
    return CommOp(where, what, collective, algorithm, topology.size, nbytes, calls, phase, sent, seconds)


# -- the step's operations ------------------------------------------------------------------------
def tp_ops(spec: ModelSpec, cluster: ClusterSpec, config: ParallelConfig) -> list[CommOp]:
    """Megatron-LM's: per layer and micro-batch 2 each way (allreduce, or allgather + reduce-scatter with SP)."""
    if config.tp == 1:
        return []
    m = spec.batch // (spec.micro * config.dp)
    dtype = "float16" if spec.precision == "mixed" else "float32"
    act = spec.seq * spec.micro * spec.hidden                        # (b, s, h) elements
    layers = spec.layers // config.pp                                # on this rank, over its chunks
    topo = tp_topology(config, cluster)
    links = group_links(cluster, topo)
    backward = 2 if config.recompute == "full" else 1                # the recomputed forward's again
    pairs = [("allgather", "allgather of the sequence"), ("reduce_scatter", "reduce-scatter to the sequence")] \
        if config.sequence_parallel else [("allreduce", "allreduce of the activations")]
    out = []
    for collective, what in pairs:
        out.append(_op("tp", f"forward: {what}, 2 per layer", collective, config, topo, act, dtype,
                       2 * layers * m, "forward", links, cluster.simulate))
        out.append(_op("tp", f"backward: {what}, {2 * backward} per layer", collective, config, topo, act, dtype,
                       2 * backward * layers * m, "backward", links, cluster.simulate))
    return out


def pp_ops(spec: ModelSpec, cluster: ClusterSpec, config: ParallelConfig) -> list[CommOp]:
    """Activations forward and gradients back at each chunk boundary, per micro-batch (busiest stage)."""
    p, v = config.pp, config.v
    if p == 1:
        return []
    m = spec.batch // (spec.micro * config.dp)
    itemsize = 2 if spec.precision == "mixed" else 4
    split = config.tp if (config.sequence_parallel or config.scatter_gather) else 1
    nbytes = int(math.ceil(spec.seq * spec.micro * spec.hidden / split)) * itemsize
    tier = pp_tier(config, cluster)
    # stage s sends activations from each chunk but the last model chunk, gradients from each but chunk 0;
    # under zbv each end stage sends one activation and one gradient (stage 0 holds both ends of the V,
    # stage p - 1 hands over to itself at its bottom), the others two of each
    ends = 2 if vshaped(config.schedule) else 1
    calls = max(m * (v - (s == p - 1) * ends) + m * (v - (s == 0) * ends) for s in range(p))
    seconds = cluster.links.link(tier).time(nbytes)
    if config.scatter_gather and not config.sequence_parallel and config.tp > 1:
        # the receiving stage's tensor-parallel ranks allgather the t slices over their node
        dtype = "float16" if itemsize == 2 else "float32"
        seconds += price("allgather", config.algorithm, tp_topology(config, cluster), nbytes * config.tp, dtype,
                         cluster.links, cluster.simulate)[2]
    return [CommOp("pp", "activations forward and gradients back, point to point", "p2p", "p2p", 2, nbytes, calls,
                   "p2p", ((tier, nbytes),), seconds)]


def dp_ops(spec: ModelSpec, cluster: ClusterSpec, config: ParallelConfig) -> list[CommOp]:
    """The gradient reduction and ZeRO's parameter gathers of the rank with the most parameters."""
    if config.dp == 1:
        return []
    m = spec.batch // (spec.micro * config.dp)
    dtype = "float16" if spec.precision == "mixed" else "float32"
    count = max(stage_params(spec, config.tp, config.pp, s, vshaped(config.schedule)) for s in {0, config.pp - 1})
    topo, z = dp_topology(config, cluster), config.zero
    links = group_links(cluster, topo)
    ops = []
    if z == 0:
        ops.append(("allreduce", "gradient allreduce", 1, "step-grad"))
    else:
        per_micro = z >= 2
        ops.append(("reduce_scatter", "gradient reduce-scatter" + (" per micro-batch" if per_micro else ""),
                    m if per_micro else 1, "micro-grad" if per_micro else "step-grad"))
        if z == 3:
            ops.append(("allgather", "parameter allgather, forward and backward of each micro-batch", 2 * m,
                        "micro-param"))
        else:
            ops.append(("allgather", "parameter allgather after the update", 1, "step-param"))
    return [_op("dp", what, collective, config, topo, count, dtype, calls, phase, links, cluster.simulate)
            for collective, what, calls, phase in ops]


def comm_ops(spec: ModelSpec, cluster: ClusterSpec, config: ParallelConfig) -> list[CommOp]:
    """Every kind of call one step makes: tensor, pipeline and data parallel."""
    return tp_ops(spec, cluster, config) + pp_ops(spec, cluster, config) + dp_ops(spec, cluster, config)


def bytes_by_tier(ops: list[CommOp]) -> dict[str, int]:
    """Bytes the busiest rank of each group sends per step, summed over the ops, per tier."""
    out = {t: 0 for t in TIERS}
    for op in ops:
        for tier, b in op.step_bytes().items():
            out[tier] += b
    return out
