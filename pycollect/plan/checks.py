"""Why a configuration cannot run, or should not: one line each, or None (pure)."""
from __future__ import annotations

from ..pipeline.schedules import ZERO_BUBBLE
from ..pipeline.simulate import bubble_formula
from .config import ClusterSpec, ParallelConfig
from .model import ModelSpec

__all__ = ["size_problem", "placement_problem", "bubble_problem"]


def size_problem(spec: ModelSpec, cluster: ClusterSpec, config: ParallelConfig) -> str | None:
    """Sizes that do not divide: the mesh into the GPUs, the batch into micro-batches, the model into shards."""
    if config.gpus != cluster.gpus:
        return f"dp x tp x pp = {config.dp} x {config.tp} x {config.pp} = {config.gpus}, not the {cluster.gpus} GPUs"
    if spec.batch % (spec.micro * config.dp):
        return (f"batch {spec.batch} does not divide into micro-batches of {spec.micro} on {config.dp} "
                f"data-parallel ranks (micro x dp = {spec.micro * config.dp})")
    bad = [f"{name} {value}" for name, value in (("heads", spec.heads), ("ffn", spec.ffn_size))
           if value % config.tp]
    if bad:
        return f"tp = {config.tp} does not divide {' and '.join(bad)}"
    chunks = config.pp * config.v
    if spec.layers % chunks:
        what = f"pp x v = {config.pp} x {config.v}" if config.v > 1 else f"pp = {config.pp}"
        return f"{spec.layers} layers do not divide into {what} chunks"
    m = spec.batch // (spec.micro * config.dp)
    if config.pp > 1 and config.schedule == "interleaved" and config.v > 1 and m % config.pp:
        # the schedule runs any m >= pp; the planner's step-time model is held to the walk at multiples of pp
        return f"interleaved: m = {m} micro-batches is not a multiple of pp = {config.pp} (the planner prices only those)"
    if config.pp > 1 and config.schedule in ZERO_BUBBLE and m < config.pp:
        return (f"{config.schedule}: m = {m} micro-batches is fewer than pp = {config.pp} "
                f"(the deferred W fill a cool-down of pp - 1 steps)")
    return None


def placement_problem(cluster: ClusterSpec, config: ParallelConfig) -> str | None:
    """Tensor parallelism across nodes: its per-layer collectives would cross the slow tier."""
    per_node = min(cluster.gpus_per_node, cluster.gpus)
    if config.tp > per_node or per_node % config.tp:
        return f"TP across nodes: tp = {config.tp} groups do not fit in nodes of {per_node} GPUs"
    return None


def bubble_problem(spec: ModelSpec, config: ParallelConfig, limit: float) -> str | None:
    """The schedule's bubble (the literature's formula) above ``limit``."""
    if config.pp == 1:
        return None
    m = spec.batch // (spec.micro * config.dp)
    bubble = bubble_formula(config.schedule, config.pp, m, config.v)
    if bubble > limit:
        return f"bubble {100 * bubble:.1f}% (p={config.pp}, m={m}, v={config.v}) above the limit {100 * limit:.0f}%"
    return None
