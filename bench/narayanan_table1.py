"""The planner against Narayanan et al. 2021, Table 1: achieved teraFLOP/s per GPU predicted, and the rank of the published (t, p, d).

    PYTHONPATH=. python3 bench/narayanan_table1.py --json bench/results/2026-12-02-late-narayanan-table1.json

"Efficient Large-Scale Language Model Training on GPU Clusters Using Megatron-LM" (SC'21), Table 1:
ten GPTs (s = 2048, V = 51200) on Selene, 80-GB A100s (312 TFLOP/s dense 16-bit, 2039 GB/s HBM2e),
NVLink 3 inside a node of 8, 8 HDR InfiniBand ports (200 Gb/s) a node. The micro-batch, the
interleaving (v = layers / pp / --num-layers-per-virtual-pipeline-stage) and the gradient reduction
(PyTorch DDP, overlapped with backward, for the rows without a pipeline; Megatron-LM's local DDP,
after backward, for the others) come from the authors' examples/sc21/run_table_1.sh in Megatron-LM;
every row recomputes activations fully, has no sequence parallelism (it came later) and uses the
scatter/gather split of pipeline messages (the paper's section 4.1).

The planner runs with ``compute="shapes"`` (every GEMM of the paper's eq. 3 at the efficiency of its
shape, element-wise bytes at the HBM bandwidth), ``nics_per_node=8``. Achieved teraFLOP/s = eq. 3's
FLOPs / (predicted step x GPUs), as the paper counts them. Columns:

- ``prediction``: the GEMM ceiling fitted to Korthikanti et al.'s A100 measurements of Megatron-LM
  (MLSys 2023, Table 5's full-recompute iteration times, the setting of Table 1; ``korthikanti_tables``),
  the shape curve's fixed cost from the H100 measurement: no number taken from Table 1;
- ``A100 matmul``: the ceiling of the A100's best matmul (``compute.A100_CEILING``, 267.9 of 312
  TFLOP/s, Bekman's MAMF table), the earlier prediction;
- ``H100 curve``: the ceiling as fitted to OpenXLA's H100 table (0.824), for comparison;
- ``calibrated``: the one number fitted to Table 1, the GEMM ceiling c that minimises the largest
  |log(predicted / published)| over the ten rows: what the prediction leaves out, as one factor.

Ranking (with the prediction): ``plan`` over every (t, p, d) of the row's GPU count and every
micro-batch of 1, 2, 4, 8, 16 that divides the batch, full recomputation, no ZeRO, 1F1B and
interleaved (the row's v, or 2; the schedules of 2021), the row's gradient overlap, 80 GB a GPU;
distinct (t, p, d) ranked by their fastest configuration. Nothing runs; no MPI.
"""
from __future__ import annotations

import argparse
import dataclasses
import math
import sys
import time

from pycollect import plan
from pycollect.plan import compute
from pycollect.tools.report import format_table, host_header, write_json

import korthikanti_tables

# name, heads A, hidden H, layers L, t, p, d, GPUs, batch B, published TFLOP/s per GPU, micro b, v
ROWS = [
    ("1.7B", 24, 2304, 24, 1, 1, 32, 32, 512, 137, 16, 1),
    ("3.6B", 32, 3072, 30, 2, 1, 32, 64, 512, 138, 16, 1),
    ("7.5B", 32, 4096, 36, 4, 1, 32, 128, 512, 142, 16, 1),
    ("18.4B", 48, 6144, 40, 8, 1, 32, 256, 1024, 135, 8, 1),
    ("39.1B", 64, 8192, 48, 8, 2, 32, 512, 1536, 138, 4, 1),
    ("76.1B", 80, 10240, 60, 8, 4, 32, 1024, 1792, 140, 2, 3),
    ("145.6B", 96, 12288, 80, 8, 8, 24, 1536, 2304, 148, 2, 2),
    ("310.1B", 128, 16384, 96, 8, 16, 15, 1920, 2160, 155, 1, 2),
    ("529.6B", 128, 20480, 105, 8, 35, 9, 2520, 2520, 163, 1, 3),
    ("1008.0B", 160, 25600, 128, 8, 64, 6, 3072, 3072, 163, 1, 1),
]
SEQ, VOCAB = 2048, 51200
MICROS = (1, 2, 4, 8, 16)       # micro-batch sizes searched (the published rows use 1 to 16)
A100 = dict(memory=80e9, peak_flops=312e12, intra="nvlink3", inter="ib-hdr", compute="shapes", hbm=2.039e12,
            nics_per_node=8)


def parse(argv):
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--json", default="bench/results/narayanan-table1.json")
    p.add_argument("--no-rank", action="store_true", help="skip the searches (the predictions only)")
    return p.parse_args(argv)


def eq3(row) -> float:
    """The paper's eq. 3: 96 B s L H^2 (1 + s/(6H) + V/(16 L H)) FLOPs a step."""
    _, _, h, layers, *_ = row
    batch = row[8]
    return 96.0 * batch * SEQ * layers * h * h * (1 + SEQ / (6 * h) + VOCAB / (16 * layers * h))


def setup(row, ceiling: float, **options):
    name, heads, hidden, layers, t, p, d, gpus, batch, _, micro, v = row
    spec = plan.ModelSpec(layers, hidden, heads, VOCAB, SEQ, batch, micro)
    cluster = plan.ClusterSpec.from_presets(gpus, 8, gemm_ceiling=ceiling, **A100)
    config = plan.ParallelConfig(dp=d, tp=t, pp=p, schedule="interleaved" if v > 1 else "1f1b", v=v,
                                 recompute="full", sp=False, overlap=p == 1, scatter_gather=True, **options)
    return spec, cluster, config


def achieved(row, ceiling: float, **options) -> plan.Prediction:
    return plan.predict(*setup(row, ceiling, **options))


def variant(row, ceiling: float, cluster_kw: dict, config_kw: dict) -> float:
    """Achieved TFLOP/s per GPU with some cluster and configuration settings changed."""
    spec, cluster, config = setup(row, ceiling)
    pred = plan.predict(spec, dataclasses.replace(cluster, **cluster_kw), dataclasses.replace(config, **config_kw))
    return pred.achieved_flops / 1e12


def fit_ceiling(rows) -> float:
    """The GEMM ceiling minimising max |log(predicted / published)| over ``rows``."""
    return korthikanti_tables.smallest_worst(
        lambda c: max(abs(math.log(achieved(r, c).achieved_flops / 1e12 / r[9])) for r in rows))


def _by_mesh(result) -> tuple[list, dict]:
    """Distinct (t, p, d) in ranked order, and the fastest prediction of each."""
    meshes: list[tuple] = []
    best: dict = {}
    for p in result.ranked:
        key = (p.config.tp, p.config.pp, p.config.dp)
        if key not in best:
            best[key] = p
            meshes.append(key)
    return meshes, best


def rank(row, ceiling: float, micros) -> dict:
    """Where the published (t, p, d) ranks among distinct meshes, each by its fastest configuration over
    the micro-batches ``micros``; the first three meshes; the micro-batch the planner picks for the published one."""
    spec, cluster, config = setup(row, ceiling)
    v = row[11] if row[11] > 1 else 2
    space = plan.SearchSpace(zero=(0,), schedules=("1f1b", "interleaved"), virtual=(v,), recompute=("full",),
                             sp=False, overlap=row[5] == 1, scatter_gather=True, micro=tuple(micros))
    t0 = time.perf_counter()
    result = plan.plan(spec, cluster, space)
    seconds = time.perf_counter() - t0
    meshes, best = _by_mesh(result)
    published = (row[4], row[5], row[6])
    top = [{"t": k[0], "p": k[1], "d": k[2], "micro": best[k].micro, "schedule": best[k].config.schedule,
            "v": best[k].config.v, "tflops": best[k].achieved_flops / 1e12, "step_s": best[k].step_time}
           for k in meshes[:3]]
    mine = best.get(published)
    return {"rank": meshes.index(published) + 1 if mine else None, "meshes": len(meshes), "top3": top,
            "search_s": seconds, "rejected": len(result.rejected), "planner_micro": mine.micro if mine else None,
            "planner_micro_tflops": mine.achieved_flops / 1e12 if mine else None}


def ranks(row, ceiling: float) -> dict:
    """``rank`` at the published micro-batch (``fixed_*``) and over every micro-batch of ``MICROS`` (``searched_*``)."""
    fixed, searched = rank(row, ceiling, (row[10],)), rank(row, ceiling, MICROS)
    return {**{f"fixed_{k}": x for k, x in fixed.items()}, **{f"searched_{k}": x for k, x in searched.items()}}


def row_record(row, ceilings: dict) -> dict:
    """One row at its published configuration under each ceiling, and the effect of each option."""
    name, heads, hidden, layers, t, p, d, gpus, batch, published, micro, v = row
    preds = {k: achieved(row, c) for k, c in ceilings.items()}
    pred = preds["prediction"]
    assert abs(pred.flops_charged / eq3(row) - 1) < 1e-9, (name, pred.flops_charged, eq3(row))
    c = ceilings["prediction"]
    effects = {  # one setting changed: how much it moves the prediction
        "one NIC per ring": variant(row, c, {"nics_per_node": None}, {}),
        "gradient reduction exposed" if p == 1 else "gradient reduction behind backward":
            variant(row, c, {}, {"overlap": p > 1}),
        "pipeline sends behind compute": variant(row, c, {}, {"overlap_p2p": True}),
        "no scatter/gather": variant(row, c, {}, {"scatter_gather": False}),
    }
    rec = {"model": name, "heads": heads, "hidden": hidden, "layers": layers, "t": t, "p": p, "d": d,
           "gpus": gpus, "batch": batch, "micro": micro, "v": v, "published_tflops": published,
           "eq3_flops": eq3(row)}
    for k, x in preds.items():
        rec[f"{k}_tflops"] = x.achieved_flops / 1e12
        rec[f"{k}_ratio"] = x.achieved_flops / 1e12 / published
    rec.update({"step_s": pred.step_time, "times_s": dict(pred.times), "bubble": pred.bubble["predicted"],
                "mfu_6pt": pred.mfu, "option_effects_tflops": effects})
    return rec


COLUMNS = [("model", "model", "{}"), ("t", "t", "{}"), ("p", "p", "{}"), ("d", "d", "{}"), ("micro", "b", "{}"),
           ("published_tflops", "published", "{}"), ("prediction_tflops", "prediction", "{:.1f}"),
           ("prediction_ratio", "ratio", "{:.2f}"), ("a100_matmul_tflops", "A100 matmul", "{:.1f}"),
           ("a100_matmul_ratio", "ratio", "{:.2f}"), ("h100_curve_tflops", "H100 curve", "{:.1f}"),
           ("calibrated_tflops", "calibrated", "{:.1f}"), ("calibrated_ratio", "ratio", "{:.2f}")]
RANK_COLUMNS = [("fixed_rank", "rank, published b", "{}"), ("fixed_meshes", "of", "{}"),
                ("searched_rank", "rank, b searched", "{}"), ("searched_meshes", "of", "{}"),
                ("searched_planner_micro", "planner's b", "{}")]


def print_korthikanti(tables: dict, ceilings: dict) -> None:
    """Korthikanti et al.'s Tables 5 and 4 beside the planner's times (predicted / measured)."""
    print(f"# Korthikanti et al. 2023 Table 5, seconds an iteration; ceiling {ceilings['prediction']:.4f} fitted to "
          f"the full-recompute column, A100 matmul {ceilings['a100_matmul']:.4f}")
    cols = [("model", "model", "{}"), ("measured_full_s", "full", "{}"), ("prediction_full_ratio", "fitted", "{:.3f}"),
            ("a100_matmul_full_ratio", "A100 matmul", "{:.3f}"), ("measured_present_s", "present work", "{}"),
            ("prediction_present_ratio", "fitted", "{:.3f}"), ("a100_matmul_present_ratio", "A100 matmul", "{:.3f}")]
    print("\n".join(format_table(tables["table5"], cols)))
    print("# Korthikanti et al. 2023 Table 4, one 22B layer, ms (predicted / measured)")
    cols = [("experiment", "experiment", "{}"), ("measured_forward_ms", "forward", "{}"),
            ("prediction_forward_ratio", "fitted", "{:.3f}"), ("measured_backward_ms", "backward", "{}"),
            ("prediction_backward_ratio", "fitted", "{:.3f}"), ("a100_matmul_forward_ratio", "A100 matmul fwd", "{:.3f}"),
            ("a100_matmul_backward_ratio", "bwd", "{:.3f}")]
    print("\n".join(format_table(tables["table4"], cols)))


def main(argv) -> int:
    args = parse(argv)
    ceilings = {"prediction": korthikanti_tables.fitted_ceiling(), "a100_matmul": compute.A100_CEILING,
                "h100_curve": compute.GEMM_CEILING, "calibrated": fit_ceiling(ROWS)}
    korthikanti = korthikanti_tables.records({k: ceilings[k] for k in ("prediction", "a100_matmul")})
    print_korthikanti(korthikanti, ceilings)
    records = []
    for row in ROWS:
        rec = row_record(row, ceilings)
        if not args.no_rank:
            rec.update(ranks(row, ceilings["prediction"]))
        records.append(rec)
        print(f"{rec['model']}: {rec['prediction_tflops']:.1f} TF/GPU predicted (published {rec['published_tflops']}), "
              f"rank {rec.get('fixed_rank')}", file=sys.stderr, flush=True)
    print(f"# Narayanan et al. 2021 Table 1; GEMM ceiling: prediction {ceilings['prediction']:.4f} (fitted to "
          f"Korthikanti et al.'s Table 5), A100 matmul {ceilings['a100_matmul']:.4f}, H100 curve {ceilings['h100_curve']}, "
          f"calibrated {ceilings['calibrated']} (fitted to the table)")
    print("\n".join(format_table(records, COLUMNS + ([] if args.no_rank else RANK_COLUMNS))))
    worst = {k: max(abs(r[f"{k}_ratio"] - 1) for r in records) for k in ceilings}
    within = sum(abs(r["prediction_ratio"] - 1) <= 0.15 for r in records)
    print(f"prediction: {within} of {len(records)} rows within 15%, largest deviation {worst['prediction']:.1%}; "
          f"calibrated: largest {worst['calibrated']:.1%}")
    header = host_header(sys.argv, hardware=A100, seq=SEQ, vocab=VOCAB)
    print("wrote", write_json(args.json, "narayanan_table1", header, records, gemm_ceilings=ceilings,
                              worst_deviation=worst, rows_within_15_percent=within, micro_searched=MICROS,
                              korthikanti=korthikanti))
    return 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
