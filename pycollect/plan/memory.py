"""Memory per rank by category: parameters, gradients, optimizer state (ZeRO), activations (pure).

Model states (Rajbhandari et al., "ZeRO: Memory Optimizations Toward Training Trillion Parameter
Models", SC'20, section 3 and Table 1), for P parameters on a rank, N data-parallel ranks, and
per parameter w bytes of weights, g of gradients, K of optimizer state::

    stage 0 (plain data parallelism)   (w + g + K) P
    stage 1 (optimizer state sharded)  (w + g) P + K P / N
    stage 2 (+ gradients)              w P + (g + K) P / N
    stage 3 (+ parameters)             (w + g + K) P / N

Mixed precision with Adam: w = g = 2, K = 12 (float32 master weights and two moments), 16 P at
stage 0. ``pycollect.zero.ZeroAdamW.expected_memory`` counts the same for its layout.

Activations per layer and micro-batch (Korthikanti et al., "Reducing Activation Recomputation in
Large Transformer Models", MLSys 2023, Table 2), in bytes for 16-bit activations with 1-byte
dropout masks; s sequence, b micro-batch, h hidden, a heads, t tensor-parallel size::

    no recomputation                        sbh (10 + 24/t + 5as/(ht))
      with sequence parallelism             sbh (34/t + 5as/(ht))
    selective recomputation                 sbh (10 + 24/t)
      with sequence parallelism             sbh (34/t)
    full recomputation (the layer's input)  2sbh          (2sbh/t with sequence parallelism)

At t = 1 the first two are the paper's sbh(34 + 5as/h). With full recomputation one layer's
activations without recomputation are live again while its backward runs; they are added once.
A stage holds the activations of as many (micro-batch, chunk) pairs as its schedule keeps in
flight (``pycollect.pipeline.simulate.peak_memory`` on the schedule's own order), each chunk
L/(p*v) layers: on the first stage p micro-batches for 1F1B (L layers' worth, whatever p), m for
GPipe, 2(p-1) + (v-1)p + 1 chunks interleaved (L(1 + (p-1)/(pv)) layers, the paper's section 4.2.3). Around the layers
(section 4.3): the embedding's dropout mask sbh (/t with sequence parallelism) per micro-batch in
flight on the first stage; on the last, the final norm's and the head's inputs 4sbh (/t) and the
float32 logits of cross-entropy 4sbV/t, for one micro-batch. float32 training doubles the 16-bit terms.
"""
from __future__ import annotations

import math
import numbers
from functools import lru_cache

from ..pipeline.schedules import compute_order, vshaped
from ..pipeline.simulate import peak_memory
from .config import ParallelConfig
from .model import ModelSpec, sizes, stage_params

__all__ = ["STATE_BYTES", "WEIGHT_BYTES", "zero_memory", "activation_bytes_per_layer", "in_flight",
           "stage_memory", "memory", "CATEGORIES"]

WEIGHT_BYTES = {"mixed": 2, "fp32": 4}                 # per parameter, and per gradient element
STATE_BYTES = {("adam", "mixed"): 12, ("adam", "fp32"): 8, ("momentum", "mixed"): 8, ("momentum", "fp32"): 4,
               ("sgd", "mixed"): 4, ("sgd", "fp32"): 0}
CATEGORIES = ("parameters", "gradients", "optimizer", "activations", "activations_io")


def zero_memory(params: float, n: int, stage: int, weight_bytes: float = 2, grad_bytes: float = 2,
                state_bytes: float = 12) -> dict[str, float]:
    """Bytes of each model state on one of ``n`` data-parallel ranks holding ``params`` at ZeRO ``stage``."""
    if stage not in (0, 1, 2, 3):
        raise ValueError(f"zero_memory: stage must be 0..3, got {stage!r}")
    sizes("zero_memory", n=n)
    for name, value in (("params", params), ("weight_bytes", weight_bytes), ("grad_bytes", grad_bytes),
                        ("state_bytes", state_bytes)):
        if isinstance(value, bool) or not isinstance(value, numbers.Real) or not 0 <= value < math.inf:
            raise ValueError(f"zero_memory: {name} must be a finite number >= 0, got {value!r}")
    shard = params / n
    return {"parameters": weight_bytes * (shard if stage >= 3 else params),
            "gradients": grad_bytes * (shard if stage >= 2 else params),
            "optimizer": state_bytes * (shard if stage >= 1 else params)}


def activation_bytes_per_layer(s: int, b: int, h: int, a: int, t: int = 1, sp: bool = False,
                               recompute: str = "none") -> float:
    """Korthikanti et al.'s bytes of one layer's stored activations for one micro-batch (16-bit)."""
    sizes("activation_bytes_per_layer", s=s, b=b, h=h, a=a, t=t)
    sbh = s * b * h
    sp = sp and t > 1
    if recompute == "full":
        return 2 * sbh / (t if sp else 1)
    attention = 0.0 if recompute == "selective" else 5 * a * s / (h * t)
    if recompute not in ("none", "selective"):
        raise ValueError(f"activation_bytes_per_layer: recompute must be none, selective or full, got {recompute!r}")
    return sbh * ((34 / t if sp else 10 + 24 / t) + attention)


@lru_cache(maxsize=4096)
def in_flight(schedule: str, p: int, m: int, v: int, stage: int) -> tuple[int, int]:
    """(micro-batches, (micro-batch, chunk) pairs) ``stage`` holds activations of at its peak."""
    if p == 1:
        return 1, v
    return peak_memory(compute_order(schedule, p, m, v, stage))


def _activations(spec: ModelSpec, config: ParallelConfig, stage: int, recompute: str, sp: bool) -> tuple[float, float]:
    """(layer activations, activations around the layers) of ``stage``, in bytes."""
    p, v, t = config.pp, config.v, config.tp
    m = spec.batch // (spec.micro * config.dp)
    micros, pairs = in_flight(config.schedule, p, m, v, stage)
    s, b, h, a = spec.seq, spec.micro, spec.hidden, spec.heads
    scale = 2 if spec.precision == "fp32" else 1
    per_layer = activation_bytes_per_layer(s, b, h, a, t, sp, recompute)
    layers = pairs * spec.layers / (p * v)
    act = layers * per_layer
    if recompute == "full":
        act += activation_bytes_per_layer(s, b, h, a, t, sp, "none")
    split = t if sp and t > 1 else 1
    io = 0.0
    if stage == 0:
        io += micros * s * b * h / split
    if stage == (0 if vshaped(config.schedule) else p - 1):  # zbv: the head sits at the top of the V
        io += 4 * s * b * h / split + 4 * s * b * spec.vocab / t / scale
    return act * scale, io * scale


def stage_memory(spec: ModelSpec, config: ParallelConfig, stage: int, recompute: str | None = None,
                 sp: bool | None = None) -> dict[str, float]:
    """Bytes per rank of pipeline stage ``stage`` by category (``CATEGORIES``), and ``total``.

    ``recompute`` and ``sp`` default to the config's.
    """
    recompute = config.recompute if recompute is None else recompute
    sp = config.sequence_parallel if sp is None else sp
    w = WEIGHT_BYTES[spec.precision]
    states = zero_memory(stage_params(spec, config.tp, config.pp, stage, vshaped(config.schedule)), config.dp,
                         config.zero, w, w,
                         STATE_BYTES[(spec.optimizer, spec.precision)])
    act, io = _activations(spec, config, stage, recompute, sp)
    out = {**states, "activations": act, "activations_io": io}
    out["total"] = sum(out[c] for c in CATEGORIES)
    return out


def memory(spec: ModelSpec, config: ParallelConfig, recompute: str | None = None,
           sp: bool | None = None) -> dict:
    """The stage that needs the most (the first or the last: the others hold no more): its
    categories, ``total`` and ``stage``."""
    stages = sorted({0, config.pp - 1})
    worst = max(((stage_memory(spec, config, s, recompute, sp), s) for s in stages), key=lambda x: x[0]["total"])
    return {**worst[0], "stage": worst[1]}
