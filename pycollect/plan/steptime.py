"""The step-time model and ``predict``: memory, communication, bubble, step time and MFU of one configuration.

With N = dp * tp * pp GPUs, m = batch / (micro * dp) micro-batches and v chunks per stage:

    model FLOPs            6 * P * tokens (MFU's numerator); full recomputation adds one forward
                           (2 * P * tokens), selective the attention scores' forward (4 b s^2 h per layer
                           and micro-batch, over t)
    one chunk, forward     F = 2 P tokens / N / (m v) / (peak * efficiency) + its tensor-parallel calls
    one chunk, backward    B = (4 P tokens / N + recomputation) / (m v) / rate + its tensor-parallel calls
    pipeline               the schedule walked by ``pycollect.pipeline.simulate`` with these F and B and
                           each point-to-point message's time as its latency (p > 1); m * (F + B) at p = 1
                           (closed forms where they equal the walk, long walks extended from two short
                           ones: see ``pipeline_time``).
                           With free messages the walk gives (m v + p - 1)(F + B): (m + p - 1)/m of the
                           work for GPipe and 1F1B, (m v + p - 1)/(m v) interleaved
    data parallel          each call's predicted time, all of it exposed after the pipeline drains;
                           with ``overlap``, only what exceeds its window: one micro-batch's backward on
                           the stage for the gradient reduction, its forward for a parameter gather
    step                   pipeline + exposed data-parallel time (the optimizer's update is not counted)
    MFU                    6 P tokens / (step * N * peak)
"""
from __future__ import annotations

from dataclasses import dataclass
from functools import lru_cache

from ..pipeline.schedules import ZERO_BUBBLE
from ..pipeline.simulate import bubble_formula
from .checks import size_problem
from .comm import CommOp, bytes_by_tier, comm_ops
from .compute import micro_batch_seconds, step_flops
from .config import ClusterSpec, ParallelConfig
from .memory import memory
from .model import ModelSpec, train_flops
from .pipewalk import makespan

__all__ = ["Prediction", "predict", "compute_flops", "pipeline_time", "schedule_bubbles", "SIMULATE_LIMIT"]

SIMULATE_LIMIT = 1 << 16   # p x m x v above which a walk is extended from two shorter ones


@dataclass(frozen=True)
class Prediction:
    """What ``predict`` finds for one configuration; seconds and bytes per step, memory per rank."""

    config: ParallelConfig
    micro_batches: int
    memory: dict            # categories (memory.CATEGORIES), total, stage: the fullest stage's rank
    memory_limit: float
    comm: tuple             # CommOp per kind of call
    times: dict             # seconds: compute, tp, pp, dp, dp_exposed, pipeline, step
    bubble: dict            # formula, predicted (fractions), model (how the pipeline was timed)
    flops: float            # model FLOPs of the step (6 P tokens)
    chunk: dict             # seconds of one chunk's forward and backward (with their tp calls), one message
    step_time: float
    mfu: float
    flops_charged: float = 0.0   # FLOPs the step runs as modelled (6PT + recomputation, or every GEMM by shape)
    micro: int = 1               # sequences per micro-batch (the model's; the search may vary it)

    @property
    def achieved_flops(self) -> float:
        """FLOP/s per GPU of the charged FLOPs (Narayanan et al.'s "achieved teraFLOP/s per GPU")."""
        return self.flops_charged / (self.step_time * self.config.gpus)

    @property
    def fits(self) -> bool:
        return self.memory["total"] <= self.memory_limit

    @property
    def comm_bytes(self) -> dict[str, int]:
        return bytes_by_tier(list(self.comm))

    @property
    def comm_time(self) -> float:
        return self.times["tp"] + self.times["pp"] + self.times["dp"]

    @property
    def comm_to_compute(self) -> float:
        return self.comm_time / self.times["compute"] if self.times["compute"] > 0 else float("inf")

    def to_dict(self) -> dict:
        return {**self.config.to_dict(), "micro": self.micro, "micro_batches": self.micro_batches, "fits": self.fits,
                "memory_bytes": dict(self.memory), "memory_limit_bytes": self.memory_limit,
                "comm_bytes_by_tier": self.comm_bytes, "comm": [op.to_dict() for op in self.comm],
                "times_s": dict(self.times), "bubble": dict(self.bubble), "flops": self.flops,
                "chunk_s": dict(self.chunk),
                "step_time_s": self.step_time, "mfu": self.mfu, "comm_to_compute": self.comm_to_compute,
                "flops_charged": self.flops_charged, "achieved_flops_per_gpu": self.achieved_flops}


def compute_flops(spec: ModelSpec, config: ParallelConfig) -> tuple[float, float, float]:
    """(forward, backward, recomputation) FLOPs of one rank per step."""
    n = config.gpus
    base = train_flops(spec) / n
    if config.recompute == "full":
        extra = base / 3
    elif config.recompute == "selective":
        m = spec.batch // (spec.micro * config.dp)
        extra = 4.0 * spec.micro * spec.seq ** 2 * spec.hidden * (spec.layers / config.pp) * m / config.tp
    else:
        extra = 0.0
    return base / 3, 2 * base / 3, extra


@lru_cache(maxsize=8192)
def _walk(schedule: str, p: int, m: int, v: int, backward: float, comm: float) -> float:
    """Makespan of the schedule with F = 1 (the walk scales with F). A zero-bubble schedule's W is half
    the backward: the weight gradients' products, as many as the input gradients'."""
    return makespan(schedule, p, m, v, 1.0, backward, backward / 2, comm)


def pipeline_time(schedule: str, p: int, m: int, v: int, forward: float, backward: float,
                  message: float) -> tuple[float, float, str]:
    """(seconds, bubble fraction, how) of the pipeline with per-chunk F, B and message time c.

    The walk of ``pycollect.pipeline.simulate`` (``pipewalk.makespan``, its makespan alone), or what
    equals it without walking (its ``bubble_formula`` docstring): (m v + p - 1)(F + B) + 2(p v - 1)c
    for GPipe (v = 1, any c), for 1F1B with m <= 2, and interleaved when c <= min(F, B) or m = p. A
    zero-bubble schedule's W is half the backward. A walk longer than ``SIMULATE_LIMIT`` (p m v) is two
    short ones extended along their line: for 1F1B at m' = 2p + r and 3p + r (r = m mod p), which the
    steady state makes exact; for zb-h1, zb-h2 and zbv at 2p and 3p (exact for zb-h2; within 1.5%
    for zb-h1 and 0.1% for zbv on p <= 16); interleaved at 4p and 6p (within 0.5%).
    """
    work = m * v * (forward + backward)
    if p == 1:
        return work, 0.0, "none"
    if forward <= 0 or backward <= 0:
        raise ValueError("pipeline_time: a chunk's forward and backward must take some time")
    closed = (schedule == "gpipe" or (schedule == "1f1b" and m <= 2)
              or (schedule == "interleaved" and (message <= min(forward, backward) or m == p)))
    if closed:
        span = (m * v + p - 1) * (forward + backward) + 2 * (p * v - 1) * message
        return span, 1 - work / span, "formula (equal to the walk)"
    ratios = (round(backward / forward, 9), round(message / forward, 9))
    lo, step = (2 * p + m % p, p) if schedule == "1f1b" else (2 * p, p) if schedule in ZERO_BUBBLE else (4 * p, 2 * p)
    if p * m * v <= SIMULATE_LIMIT or m <= lo + step:
        span, how = _walk(schedule, p, m, v, *ratios), "simulated"
    else:
        a, b = _walk(schedule, p, lo, v, *ratios), _walk(schedule, p, lo + step, v, *ratios)
        span, how = a + (m - lo) * (b - a) / step, f"simulated at m={lo}, {lo + step} and extended"
    span *= forward
    return span, 1 - work / span, how


def _exposed(op: CommOp, overlap: bool, forward: float, backward: float) -> float:
    """Seconds of a data-parallel op the step waits for: all of it, or what outlasts its window."""
    if not overlap:
        return op.step_seconds
    window = backward if op.phase.endswith("grad") else forward
    return op.calls * max(0.0, op.seconds - window)


def predict(model: ModelSpec, cluster: ClusterSpec, config: ParallelConfig) -> Prediction:
    """Memory by category, communication per tier, bubble, step time and MFU of ``config``.

    ValueError when the sizes do not divide (``checks.size_problem``); a configuration that does
    not fit in memory is predicted all the same (``Prediction.fits``).
    """
    problem = size_problem(model, cluster, config)
    if problem:
        raise ValueError(f"predict: {problem}")
    m, v, p = model.batch // (model.micro * config.dp), config.v, config.pp
    ops = comm_ops(model, cluster, config)
    chunks = m * v
    tp_fwd = sum(op.step_seconds for op in ops if op.phase == "forward")
    tp_bwd = sum(op.step_seconds for op in ops if op.phase == "backward")
    if cluster.compute == "shapes":
        mb_fwd, mb_bwd = micro_batch_seconds(model, cluster, config)
        compute = m * (mb_fwd + mb_bwd)
        charged = step_flops(model.micro, model.seq, model.hidden, model.heads, model.ffn_size, model.vocab,
                             model.layers, model.batch, config.recompute)
    else:
        fwd, bwd, extra = compute_flops(model, config)
        mb_fwd, mb_bwd = fwd / m / cluster.rate, (bwd + extra) / m / cluster.rate
        compute, charged = (fwd + bwd + extra) / cluster.rate, (fwd + bwd + extra) * config.gpus
    f = mb_fwd / v + tp_fwd / chunks
    b = mb_bwd / v + tp_bwd / chunks
    pp_op = next((op for op in ops if op.where == "pp"), None)
    message = pp_op.seconds if pp_op is not None and not config.overlap_p2p else 0.0
    span, bubble, how = pipeline_time(config.schedule, p, m, v, f, b, message)
    dp = [op for op in ops if op.where == "dp"]
    exposed = sum(_exposed(op, config.overlap, v * f, v * b) for op in dp)
    times = {"compute": compute, "tp": tp_fwd + tp_bwd,
             "pp": sum(op.step_seconds for op in ops if op.where == "pp"),
             "dp": sum(op.step_seconds for op in dp), "dp_exposed": exposed, "pipeline": span}
    times["step"] = step = span + exposed
    flops = train_flops(model)
    formula = bubble_formula(config.schedule, p, m, v) if p > 1 else 0.0
    return Prediction(config=config, micro_batches=m, memory=memory(model, config), memory_limit=cluster.memory,
                      comm=tuple(ops), times=times, bubble={"formula": formula, "predicted": bubble, "model": how},
                      flops=flops, chunk={"forward": f, "backward": b, "message": message}, step_time=step,
                      mfu=flops / (step * cluster.gpus * cluster.peak_flops), flops_charged=charged, micro=model.micro)


def schedule_bubbles(prediction: Prediction, virtual=(2,)) -> list[dict]:
    """The bubble of every schedule at this prediction's p and m: by formula and as predicted.

    A chunk of v chunks per stage does 1/v of a stage's work (its forward and backward, tensor-parallel
    calls included, scale by v_config / v); messages keep their time.
    """
    c, m = prediction.config, prediction.micro_batches
    if c.pp == 1:
        return []
    out = []
    for schedule, v in [("gpipe", 1), ("1f1b", 1)] + [("interleaved", v) for v in virtual] + \
            [("zb-h1", 1), ("zb-h2", 1), ("zbv", 2)]:
        if schedule.startswith("zb") and m < c.pp:
            out.append({"schedule": schedule, "v": v, "formula": None, "predicted": None,
                        "note": f"m = {m} is fewer than p = {c.pp}"})
            continue
        if schedule == "interleaved" and v > 1 and m % c.pp:
            out.append({"schedule": schedule, "v": v, "formula": None, "predicted": None,
                        "note": f"m = {m} is not a multiple of p = {c.pp}"})
            continue
        f, b = (prediction.chunk[k] * c.v / v for k in ("forward", "backward"))
        span, bubble, how = pipeline_time(schedule, c.pp, m, v, f, b, prediction.chunk["message"])
        out.append({"schedule": schedule, "v": v, "formula": bubble_formula(schedule, c.pp, m, v),
                    "predicted": bubble, "pipeline_s": span, "model": how})
    return out
