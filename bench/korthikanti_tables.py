"""Korthikanti et al.'s A100 measurements of Megatron-LM, and the GEMM ceiling they imply for the planner.

"Reducing Activation Recomputation in Large Transformer Models" (Korthikanti et al., MLSys 2023,
arXiv 2205.05198), section 6, run on Selene as Narayanan et al. 2021's Table 1 was: 80-GB A100s,
NVLink 3 in a node of 8, 8 HDR InfiniBand ports a node; s = 2048, V = 51200, mixed precision.

- Table 3: four GPTs at t = 8 without data parallelism (22B at p = 1; 175B and 530B interleaved with
  3 chunks a stage; 1T at p = 64), global batch = GPUs (22B: 4), micro-batch 4 (22B) or 1.
- Table 5: seconds an iteration, "full recompute" (full recomputation, no sequence parallelism: the
  setting of every row of Narayanan et al.'s Table 1) and "present work" (sequence parallelism and
  selective recomputation).
- Table 4: one layer of the 22B model (b = 4), forward and backward milliseconds.

``fitted_ceiling`` fits the planner's one free number, the GEMM ceiling c of
``compute.gemm_efficiency``, to Table 5's full-recompute column (minimising the largest
|log(predicted / measured)|); Narayanan et al.'s Table 1 is then predicted with it
(``bench/narayanan_table1.py``). The present-work column and Table 4 are checks the fit does not see.
"""
from __future__ import annotations

import math

from pycollect import plan
from pycollect.plan import compute
from pycollect.plan.comm import tp_ops

SEQ, VOCAB = 2048, 51200
A100 = dict(memory=80e9, peak_flops=312e12, intra="nvlink3", inter="ib-hdr", compute="shapes", hbm=2.039e12,
            nics_per_node=8)

# name, heads A, hidden H, layers L, t, p, GPUs, batch, micro b, chunks v, seconds: full recompute, present work
TABLE5 = [
    ("22B", 64, 6144, 48, 8, 1, 8, 4, 4, 1, 1.42, 1.10),
    ("175B", 96, 12288, 96, 8, 8, 64, 64, 1, 3, 18.13, 13.75),
    ("530B", 128, 20480, 105, 8, 35, 280, 280, 1, 3, 49.05, 37.83),
    ("1T", 160, 25600, 128, 8, 64, 512, 512, 1, 1, 94.42, 71.49),
]
# one layer of the 22B model: experiment, recompute, sequence parallel, forward ms, backward ms
TABLE4 = [
    ("baseline no recompute", "none", False, 7.7, 11.9),
    ("sequence parallelism", "none", True, 7.2, 11.8),
    ("baseline with recompute", "full", False, 7.7, 19.5),
    ("selective recompute", "selective", False, 7.7, 13.2),
    ("selective + sequence", "selective", True, 7.2, 13.1),
]
SETTINGS = {"full recompute": ("full", False), "present work": ("selective", True)}


def setup(row, ceiling: float, recompute: str, sp: bool):
    name, heads, hidden, layers, t, p, gpus, batch, micro, v, *_ = row
    spec = plan.ModelSpec(layers, hidden, heads, VOCAB, SEQ, batch, micro)
    cluster = plan.ClusterSpec.from_presets(gpus, 8, gemm_ceiling=ceiling, **A100)
    config = plan.ParallelConfig(dp=1, tp=t, pp=p, schedule="interleaved" if v > 1 else "1f1b", v=v,
                                 recompute=recompute, sp=sp, overlap=False, scatter_gather=True)
    return spec, cluster, config


def iteration_seconds(row, ceiling: float, setting: str = "full recompute") -> float:
    """The planner's step time for a Table 5 row in one of its two settings."""
    return plan.predict(*setup(row, ceiling, *SETTINGS[setting])).step_time


def fitted_ceiling(rows=TABLE5) -> float:
    """The GEMM ceiling minimising max |log(predicted / measured)| over the full-recompute column."""
    return smallest_worst(lambda c: max(abs(math.log(iteration_seconds(r, c) / r[10])) for r in rows))


def smallest_worst(worst, lo: float = 0.3, hi: float = 1.0) -> float:
    """The ceiling in [lo, hi] where ``worst(c)`` is least (golden-section search; rounded to 4 decimals)."""
    g = (math.sqrt(5) - 1) / 2
    a, b = hi - g * (hi - lo), lo + g * (hi - lo)
    fa, fb = worst(a), worst(b)
    for _ in range(40):
        if fa < fb:
            hi, b, fb = b, a, fa
            a = hi - g * (hi - lo)
            fa = worst(a)
        else:
            lo, a, fa = a, b, fb
            b = lo + g * (hi - lo)
            fb = worst(b)
    return round((lo + hi) / 2, 4)


def layer_ms(ceiling: float, recompute: str, sp: bool) -> tuple[float, float]:
    """(forward, backward) milliseconds of one 22B layer as the planner prices it (Table 4's case): its compute
    (``compute.layer_seconds``) and the layer's tensor-parallel calls."""
    spec, cluster, config = setup(TABLE5[0], ceiling, recompute, sp)
    forward, backward = compute.layer_seconds(spec.micro, SEQ, spec.hidden, spec.heads, spec.ffn_size, config.tp, sp,
                                              recompute, cluster.peak_flops, cluster.hbm, ceiling)
    calls = spec.layers * (spec.batch // spec.micro)                   # one micro-batch, p = 1
    ops = tp_ops(spec, cluster, config)
    forward += sum(op.step_seconds for op in ops if op.phase == "forward") / calls
    backward += sum(op.step_seconds for op in ops if op.phase == "backward") / calls
    return forward * 1e3, backward * 1e3


def records(ceilings: dict) -> dict:
    """Table 5 and Table 4 under each ceiling (name -> c): predicted / measured."""
    table5 = []
    for row in TABLE5:
        rec = {"model": row[0], "t": row[4], "p": row[5], "gpus": row[6], "batch": row[7], "micro": row[8],
               "v": row[9], "measured_full_s": row[10], "measured_present_s": row[11]}
        for name, c in ceilings.items():
            for setting, key in (("full recompute", "full"), ("present work", "present")):
                pred = iteration_seconds(row, c, setting)
                rec[f"{name}_{key}_s"] = pred
                rec[f"{name}_{key}_ratio"] = pred / row[10 if key == "full" else 11]
        table5.append(rec)
    table4 = []
    for what, recompute, sp, fwd, bwd in TABLE4:
        rec = {"experiment": what, "measured_forward_ms": fwd, "measured_backward_ms": bwd}
        for name, c in ceilings.items():
            pf, pb = layer_ms(c, recompute, sp)
            rec.update({f"{name}_forward_ms": pf, f"{name}_backward_ms": pb,
                        f"{name}_forward_ratio": pf / fwd, f"{name}_backward_ratio": pb / bwd})
        table4.append(rec)
    return {"table5": table5, "table4": table4}
