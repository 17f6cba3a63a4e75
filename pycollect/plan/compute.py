"""Compute time of a layer from its shapes: each GEMM at the efficiency its size reaches, and the
memory-bound element-wise work at the GPU's memory bandwidth (pure; ``ClusterSpec(compute="shapes")``).

One transformer layer on one tensor-parallel rank, forward, one micro-batch of b sequences of s
tokens, H hidden, A heads, t = tp (Megatron-LM's split; Narayanan et al., SC'21, section 3.5)::

    GEMM                   (m, n, k)              batched   FLOPs 2 m n k x batch
    qkv projection         (b s, 3H/t, H)         1         6 b s H^2 / t
    scores Q K^T           (s, s, H/A)            b A/t     2 b s^2 H / t
    scores x V             (s, H/A, s)            b A/t     2 b s^2 H / t
    output projection      (b s, H, H/t)          1         2 b s H^2 / t
    MLP up                 (b s, F/t, H)          1         2 b s H F / t
    MLP down               (b s, H, F/t)          1         2 b s H F / t
    head (the model's)     (b s, V/t, H)          1         2 b s H V / t

so 24 b s H^2 (1 + s/(6H)) / t a layer at F = 4H, and the step's total with full recomputation
(forward, the recomputed forward, backward twice the forward; the head not recomputed) is the
paper's eq. 3, 96 B s L H^2 (1 + s/(6H) + V/(16 L H)): ``step_flops`` (test_plan checks it).

Element-wise work (LayerNorms, softmax, dropout, bias-GeLU, bias-dropout-residual, the
cross-entropy) moves bytes, not FLOPs; ``layer_bytes`` counts what Megatron-LM's fused kernels
read and write (16-bit tensors, 1-byte dropout masks), priced at the memory bandwidth.
"""
from __future__ import annotations

__all__ = ["gemm_efficiency", "layer_gemms", "head_gemm", "layer_bytes", "head_bytes", "step_flops", "layer_seconds",
           "GEMM_CEILING", "GEMM_HALF_WORK_H100", "H100_PEAK", "A100_PEAK", "A100_MAMF", "A100_CEILING",
           "A100_MEGATRON_CEILING"]

# Fitted to the bf16 column of OpenXLA's default matmul table for sm_90 (H100 SXM, 989 TFLOP/s dense)
# (xla/service/gpu/model/matmul_interpolator_data.h, "kDefaultMatmulPTable", 2025): 21 measured
# single-batch GEMMs, m, n, k from 256 to 4096, fitted in log space to e = c W / (W + W0), W = m n k:
# c = 0.824, W0 = 3.05e9 (root-mean-square error 8%; e.g. 4096^3 measured 783 TFLOP/s = 0.79,
# the curve 0.79; 2048^3 measured 632 = 0.64, the curve 0.61; (4096, 4096, 256) 392 = 0.40, the curve 0.46).
GEMM_CEILING = 0.824
GEMM_HALF_WORK_H100 = 3.05e9
H100_PEAK = 989e12

# The A100's own ceiling, measured: S. Bekman, "Machine Learning Engineering" (github.com/stas00/ml-engineering,
# compute/accelerator/README.md, "Maximum Achievable Matmul FLOPS comparison table": mamf-finder.py, bf16
# matmuls over a grid of shapes, the best kept, CUDA 12.1): A100 SXM 267.9 of 312 TFLOP/s = 0.859 (at
# 6912 x 16384 x 2048). The same table's H100 SXM, 792.1 of 989 = 0.801, is within 3% of the OpenXLA fit's 0.824.
A100_PEAK = 312e12
A100_MAMF = 267.9e12
A100_CEILING = A100_MAMF / A100_PEAK

# The A100 as Megatron-LM ran it: the ceiling that makes this module's shapes (with the planner's
# communication and pipeline) reproduce Korthikanti et al.'s measured iteration times ("Reducing
# Activation Recomputation in Large Transformer Models", MLSys 2023, Table 5, the full-recompute
# column: 22B to 1T on Selene's A100s), fitted by bench/korthikanti_tables.py (largest error 6%).
# 0.72 where the best matmul reaches 0.859: whole layers of kernels, run for minutes, in the
# software of that time. With it bench/narayanan_table1.py predicts Narayanan et al.'s Table 1
# (SC'21, the same cluster) within 12.3% on every row.
A100_MEGATRON_CEILING = 0.7199


def gemm_efficiency(m: float, n: float, k: float, peak_flops: float = H100_PEAK, ceiling: float = GEMM_CEILING) -> float:
    """Fraction of ``peak_flops`` a (m, n, k) GEMM reaches: 0.824 W / (W + W0), W = m n k.

    Source: a fit to a published measurement, OpenXLA's matmul table for H100 SXM in bf16 (see
    ``GEMM_CEILING``). The form is a GEMM that runs at c x peak after a fixed cost t0 (launch, the
    first and last waves of tiles): t = 2W / (c peak) + t0, so W0 = c peak t0 / 2 (t0 = 7.5 us on
    the H100). On another GPU t0 is kept and W0 scales with its peak (the A100's 312 TFLOP/s:
    W0 = 0.96e9): an assumption, not an A100 measurement. ``ceiling`` replaces c (a GPU and library
    measured elsewhere). Monotone: larger GEMMs are never slower per FLOP.
    """
    if min(m, n, k) <= 0:
        raise ValueError(f"gemm_efficiency: sizes must be positive, got ({m}, {n}, {k})")
    w = float(m) * float(n) * float(k)
    w0 = GEMM_HALF_WORK_H100 * peak_flops / H100_PEAK
    return ceiling * w / (w + w0)


def layer_gemms(b: int, s: int, h: int, a: int, f: int, t: int) -> list[tuple[int, int, int, int]]:
    """One layer's forward GEMMs on one tensor-parallel rank: (m, n, k, batch) each (module docstring)."""
    d = h // a                                                      # head size
    heads = b * a // t                                              # the rank's (sequence, head) pairs
    return [(b * s, 3 * h // t, h, 1),      # (b s, H) x (H, 3H/t)
            (s, s, d, heads),               # Q (s, d) x K^T (d, s) per head
            (s, d, s, heads),               # P (s, s) x V (s, d) per head
            (b * s, h, h // t, 1),          # (b s, H/t) x (H/t, H)
            (b * s, f // t, h, 1),          # (b s, H) x (H, F/t)
            (b * s, h, f // t, 1)]          # (b s, F/t) x (F/t, H)


def head_gemm(b: int, s: int, h: int, v: int, t: int) -> tuple[int, int, int, int]:
    """The logits: (b s, H) x (H, V/t) on each tensor-parallel rank."""
    return (b * s, -(-v // t), h, 1)


def layer_bytes(b: int, s: int, h: int, a: int, f: int, t: int, sp: bool = False) -> float:
    """Bytes one layer's element-wise kernels read and write in its forward, on one rank.

    Per (b, s, H) 16-bit tensor (/t with sequence parallelism): two LayerNorms read and write it
    (4 + 4), two bias-dropout-residual adds read two and write one plus a 1-byte mask (7 + 7), the
    attention output's layout copy (4): 26 sbh, or 26 sbh / t. Per (b, s, F/t) tensor: bias-GeLU
    reads and writes it (4). Per attention score, b A/t s^2 of them: the fused scale-mask-softmax
    reads and writes it (4), dropout reads it and writes it and its mask (5).
    """
    sbh = b * s * h
    return 26.0 * sbh / (t if sp else 1) + 4.0 * b * s * f / t + 9.0 * b * a * s * s / t


def head_bytes(b: int, s: int, v: int, t: int) -> float:
    """The cross-entropy of float32 logits (b, s, V/t): written, read for the max, the exponentials,
    the sum and the loss (5 passes of 4 bytes); its backward about the same again (counted by the caller)."""
    return 20.0 * b * s * v / t


def step_flops(b: int, s: int, h: int, a: int, f: int, v: int, layers: int, sequences: int,
               recompute: str = "full") -> float:
    """FLOPs of a step of ``sequences`` sequences, every GEMM of the model: the layers' forward x (3,
    or 4 with full recomputation; selective adds the two score GEMMs again), the head's x 3.

    With full recomputation and F = 4H this is Narayanan et al.'s eq. 3, 96 B s L H^2 (1 + s/(6H) + V/(16 L H)).
    """
    per_layer = sum(2.0 * m * n * k * batch for m, n, k, batch in layer_gemms(1, s, h, a, f, 1))
    scores = sum(2.0 * m * n * k * batch for m, n, k, batch in layer_gemms(1, s, h, a, f, 1)[1:3])
    passes = 4 if recompute == "full" else 3
    extra = scores if recompute == "selective" else 0.0
    m, n, k, _ = head_gemm(1, s, h, v, 1)
    return sequences * (layers * (passes * per_layer + extra) + 3 * 2.0 * m * n * k)


BACKWARD_BYTES = 1.3   # element-wise backward / forward bytes: softmax and dropout 11 / 9, LayerNorm 6 / 4, GeLU 6 / 4


def _gemm_seconds(gemms, peak: float, ceiling: float) -> float:
    return sum(2.0 * m * n * k * batch / (peak * gemm_efficiency(m, n, k, peak, ceiling)) for m, n, k, batch in gemms)


def layer_seconds(b: int, s: int, h: int, a: int, f: int, t: int, sp: bool, recompute: str, peak: float, hbm: float,
                  ceiling: float) -> tuple[float, float]:
    """(forward, backward) seconds of one layer's compute on one tensor-parallel rank, one micro-batch of b sequences
    (no communication): GEMMs at ``gemm_efficiency`` of their shape, element-wise bytes at ``hbm``; backward runs each
    GEMM twice and ``BACKWARD_BYTES`` x the bytes, full recomputation adds the forward, selective the score GEMMs
    and the softmax and dropout."""
    gemms = layer_gemms(b, s, h, a, f, t)
    fwd = _gemm_seconds(gemms, peak, ceiling) + layer_bytes(b, s, h, a, f, t, sp) / hbm
    bwd = 2 * _gemm_seconds(gemms, peak, ceiling) + BACKWARD_BYTES * layer_bytes(b, s, h, a, f, t, sp) / hbm
    if recompute == "full":
        bwd += fwd
    elif recompute == "selective":
        bwd += _gemm_seconds(gemms[1:3], peak, ceiling) + 9.0 * b * a * s * s / t / hbm
    return fwd, bwd


def micro_batch_seconds(spec, cluster, config) -> tuple[float, float]:
    """(forward, backward) seconds of one micro-batch's compute on one rank of a stage, by shapes.

    The stage's L/pp layers: GEMMs at ``gemm_efficiency`` of their shape, element-wise bytes at
    ``cluster.hbm``; backward runs each GEMM twice (data and weight gradients, same shapes) and
    ``BACKWARD_BYTES`` x the bytes; full recomputation adds the forward to the backward, selective
    the score GEMMs and the softmax and dropout. The head and its cross-entropy run on the last
    stage (Megatron-LM's placement), the slowest, which paces the pipeline: every stage is timed as
    the last (the first stage's embedding lookup moves bytes only and is left out).
    """
    b, s, h, a, f, t = spec.micro, spec.seq, spec.hidden, spec.heads, spec.ffn_size, config.tp
    peak, hbm = cluster.peak_flops, cluster.hbm
    ceiling = cluster.gemm_ceiling
    fwd, bwd = layer_seconds(b, s, h, a, f, t, config.sequence_parallel, config.recompute, peak, hbm, ceiling)
    layers = spec.layers / config.pp
    head = _gemm_seconds([head_gemm(b, s, h, spec.vocab, t)], peak, ceiling)
    ce = head_bytes(b, s, spec.vocab, t) / hbm
    return layers * fwd + head + ce, layers * bwd + 2 * head + ce
