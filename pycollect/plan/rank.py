"""Every configuration of a search space, each predicted and ranked or rejected with its reason.

The space: every (dp, tp, pp) with dp * tp * pp = GPUs (or those fixed), ZeRO stages 0-3 (only 0
when dp = 1: nothing to shard), for pp > 1 each schedule (interleaved with each v), and each
recomputation. A configuration is rejected, with the first reason that holds, when its sizes do
not divide, its tensor-parallel groups cross nodes, its bubble (the formula) exceeds the limit, or
its fullest rank needs more memory than a GPU has. The others are ranked by predicted step time;
times equal to four significant digits put the simpler first (lower ZeRO stage, less recomputation,
smaller tp, then smaller pp, then the larger micro-batch). ``SearchSpace.micro`` adds the micro-batch
size to the space (larger micro-batches run larger GEMMs, faster per FLOP with ``compute="shapes"``,
but make fewer micro-batches: more bubble, more activations).
"""
from __future__ import annotations

from dataclasses import dataclass, field, replace

from ..pipeline.schedules import SCHEDULES, ZERO_BUBBLE
from .checks import bubble_problem, placement_problem, size_problem
from .config import RECOMPUTE, ClusterSpec, ParallelConfig
from .memory import memory
from .model import ModelSpec
from .steptime import Prediction, predict

__all__ = ["SearchSpace", "Plan", "candidates", "plan", "divisors"]

GB = 1e9


def divisors(n: int) -> list[int]:
    return [d for d in range(1, n + 1) if n % d == 0]


@dataclass(frozen=True)
class SearchSpace:
    """What to try; ``None`` for a size tries every divisor. ``max_bubble`` a fraction."""

    dp: tuple | None = None
    tp: tuple | None = None
    pp: tuple | None = None
    zero: tuple = (0, 1, 2, 3)
    schedules: tuple = SCHEDULES + ZERO_BUBBLE
    virtual: tuple = (2,)
    recompute: tuple = RECOMPUTE
    sp: bool = True
    overlap: bool = False
    algorithm: str = "ring"
    max_bubble: float = 0.25
    overlap_p2p: bool = False
    scatter_gather: bool = False
    micro: tuple | None = None       # sequences per micro-batch to try; None: the model's own

    def __post_init__(self):
        """Sizes of at least 1 and a bubble limit in [0, 1]: a dp of 0 planned nothing, silently, and a NaN
        limit let every bubble through."""
        for name in ("dp", "tp", "pp", "micro", "virtual"):
            sizes = getattr(self, name)
            if sizes is not None and (isinstance(sizes, (str, bytes)) or not hasattr(sizes, "__iter__") or not all(
                    type(v) is int and v >= 1 for v in sizes)):
                raise ValueError(f"SearchSpace: {name} must be None or integers of at least 1, got {sizes!r}")
        if isinstance(self.zero, (str, bytes)) or not all(type(z) is int and 0 <= z <= 3 for z in self.zero):
            raise ValueError(f"SearchSpace: zero must hold ZeRO stages 0-3, got {self.zero!r}")
        if isinstance(self.max_bubble, bool) or not isinstance(self.max_bubble, (int, float)) \
                or not 0 <= self.max_bubble <= 1:
            raise ValueError(f"SearchSpace: max_bubble must be a fraction in [0, 1], got {self.max_bubble!r}")


@dataclass
class Plan:
    """``ranked``: predictions that fit, best first; ``rejected``: (config, reason, prediction or None)."""

    ranked: list = field(default_factory=list)
    rejected: list = field(default_factory=list)

    @property
    def best(self) -> Prediction | None:
        return self.ranked[0] if self.ranked else None


def _pipelines(pp: int, space: SearchSpace) -> list[tuple[str, int]]:
    if pp == 1:
        return [("1f1b", 1)]
    out: list[tuple[str, int]] = []
    for schedule in space.schedules:
        out += [(schedule, v) for v in space.virtual] if schedule == "interleaved" else \
            [(schedule, 2 if schedule == "zbv" else 1)]
    return out


def candidates(cluster: ClusterSpec, space: SearchSpace) -> list[ParallelConfig]:
    """Every configuration of ``space`` on ``cluster`` (sizes that multiply to the GPU count)."""
    n, out = cluster.gpus, []
    for tp in space.tp or divisors(n):
        for pp in space.pp or divisors(n):
            if n % (tp * pp):
                continue
            dp = n // (tp * pp)
            if space.dp and dp not in space.dp:
                continue
            for zero in (space.zero if dp > 1 else (0,)):
                for schedule, v in _pipelines(pp, space):
                    for recompute in space.recompute:
                        out.append(ParallelConfig(dp, tp, pp, zero, schedule, v, recompute, space.sp,
                                                  space.overlap, space.algorithm, space.overlap_p2p,
                                                  space.scatter_gather))
    return out


def _order(p: Prediction) -> tuple:
    c = p.config
    return (float(f"{p.step_time:.4g}"), c.zero, RECOMPUTE.index(c.recompute), c.tp, c.pp,
            (SCHEDULES + ZERO_BUBBLE).index(c.schedule), c.v, -p.micro)


def _does_not_fit(spec: ModelSpec, cluster: ClusterSpec, config: ParallelConfig) -> str | None:
    need = memory(spec, config)
    if need["total"] <= cluster.memory:
        return None
    parts = ", ".join(f"{k} {need[k] / GB:.1f}" for k in ("parameters", "gradients", "optimizer", "activations")
                      if need[k] > 0.05 * need["total"])
    return f"does not fit: {need['total'] / GB:.1f} GB of {cluster.memory / GB:.1f} GB ({parts})"


def plan(model: ModelSpec, cluster: ClusterSpec, space: SearchSpace = SearchSpace()) -> Plan:
    """Predict every configuration that can run and fits; rank them; give each other one its reason.

    With ``space.micro`` each micro-batch size is a dimension of the search (a rejection's reason then
    starts with it: ``micro 4: ...``); ``Prediction.micro`` says which a ranked one uses."""
    out = Plan()
    micros = space.micro or (model.micro,)   # checked where the space was made
    for b in micros:
        spec = model if b == model.micro else replace(model, micro=b)
        for config in candidates(cluster, space):
            reason = (size_problem(spec, cluster, config) or placement_problem(cluster, config)
                      or bubble_problem(spec, config, space.max_bubble) or _does_not_fit(spec, cluster, config))
            if reason:
                out.rejected.append((config, reason if len(micros) == 1 else f"micro {b}: {reason}"))
            else:
                out.ranked.append(predict(spec, cluster, config))
    out.ranked.sort(key=_order)
    return out
