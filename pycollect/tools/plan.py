"""``pycollect plan``: which dp x tp x pp, ZeRO stage, schedule and recomputation to train a GPT with.

    pycollect plan --model 7B --gpus 64 --gpus-per-node 8 --memory 80G --peak-flops 989T \\
        --preset nvlink,ib-ndr --batch 1024 --micro 1 --seq 4096 [--json FILE] [--top 10]

Every configuration of the search space (``pycollect.plan.rank``) is checked and predicted
(``pycollect.plan.predict``): memory per rank by category, each step's collectives counted by
their schedules (``pc.traffic``) and priced by the alpha-beta links, the pipeline walked by the
simulator, step time, MFU. Printed: the top configurations by predicted step time; for the best,
its memory under every ZeRO stage and recomputation, its communication per tier and the bubble of
every schedule; the rejected ones with their reasons. Nothing runs and no MPI is used. Quantities
take SI prefixes (7B, 989T, 80G = 80e9 bytes, 450G bytes/s; 80GiB binary); docs/planner.md has the formulas.
"""
from __future__ import annotations

import argparse
import sys
from collections import Counter
from typing import TYPE_CHECKING

from .common import int_at_least
from .report import outputs_problem

if TYPE_CHECKING:
    from ..plan.config import ParallelConfig

PROG = "pycollect plan"
_positive_int = int_at_least(1)
MAX_GPUS = 1 << 20   # the search walks the divisors of N one by one (gpt3-6.7b on a million GPUs: 2 minutes)
_gpus = int_at_least(1, MAX_GPUS, " (the search walks the divisors of N one by one)")
GB = 1e9


# -- argument types (argparse turns their errors into one line and exit 2) ---------------------------
def _si(what: str, low: float = 0.0, integer: bool = False, high: float = float("inf")):
    def convert(text):
        from ..plan.presets import parse_si
        try:
            value = parse_si(text, what)
        except ValueError as e:
            raise argparse.ArgumentTypeError(str(e)) from None
        if value <= low:
            raise argparse.ArgumentTypeError(f"{what} must be greater than {low:g}, got {text!r}")
        if value > high:
            raise argparse.ArgumentTypeError(f"{what} must be at most {high:g}, got {text!r}")
        if integer:
            if value != int(value):
                raise argparse.ArgumentTypeError(f"{what} must be a whole number, got {text!r}")
            return int(value)
        return value
    return convert


def _int_list(low: int, high: int | None = None):
    def convert(text):
        out = []
        for part in text.split(","):
            try:
                value = int(part)
            except ValueError:
                raise argparse.ArgumentTypeError(f"not an integer list: {text!r}") from None
            if value < low or (high is not None and value > high):
                bound = f"in {low}..{high}" if high is not None else f"at least {low}"
                raise argparse.ArgumentTypeError(f"each value must be {bound}, got {value}")
            out.append(value)
        return tuple(dict.fromkeys(out))
    return convert


def _choices(allowed):
    def convert(text):
        out = tuple(dict.fromkeys(text.split(",")))
        bad = [x for x in out if x not in allowed]
        if bad:
            raise argparse.ArgumentTypeError(f"{', '.join(bad)} not among {', '.join(allowed)}")
        return out
    return convert


def _positive_fraction(text: str) -> float:
    """A fraction above 0: a GEMM ceiling of 0 would mean no computation at all."""
    value = _fraction(text)
    if value <= 0:
        raise argparse.ArgumentTypeError(f"must be above 0 (at most 1, or 100%), got {text!r}")
    return value


def _fraction(text: str) -> float:
    t = text.strip()
    try:
        value = float(t[:-1]) / 100 if t.endswith("%") else float(t)
    except ValueError:
        raise argparse.ArgumentTypeError(f"not a fraction: {text!r} (examples: 0.25, 25%)") from None
    if not 0 <= value <= 1:
        raise argparse.ArgumentTypeError(f"must be between 0 and 1 (or 0% and 100%), got {text!r}")
    return value


def _seconds(text: str) -> float:
    from ..plan.presets import parse_seconds
    try:
        return parse_seconds(text)
    except ValueError as e:
        raise argparse.ArgumentTypeError(str(e)) from None


def add_arguments(parser) -> None:
    _model_arguments(parser.add_argument_group("model (--model, or --layers --hidden --heads)"))
    _machine_arguments(parser.add_argument_group("machine"))
    _search_arguments(parser.add_argument_group("search (comma lists; default: everything)"))
    _output_arguments(parser.add_argument_group("output"))


def _model_arguments(model) -> None:
    from ..plan.model import OPTIMIZERS, PRECISIONS
    model.add_argument("--model", metavar="M",
                       help="a parameter count (7B, 1.3e9: the nearest named shape, scaled to the count) or a "
                            "named shape (gpt3-6.7b, megatron-7.5b, ...: see docs/planner.md)")
    model.add_argument("--layers", type=_positive_int, metavar="L", help="transformer layers")
    model.add_argument("--hidden", type=_positive_int, metavar="H", help="hidden size")
    model.add_argument("--heads", type=_positive_int, metavar="A", help="attention heads")
    model.add_argument("--vocab", type=_positive_int, metavar="V", help="vocabulary (default 51200, or the named shape's)")
    model.add_argument("--ffn", type=_positive_int, metavar="F", help="MLP width (default 4H)")
    model.add_argument("--seq", type=_positive_int, metavar="S", help="sequence length (default 2048, or the shape's)")
    model.add_argument("--no-biases", action="store_true", help="count no biases or LayerNorm parameters (12H^2 a layer)")
    model.add_argument("--batch", type=_positive_int, required=True, metavar="B", help="global batch, in sequences")
    model.add_argument("--micro", type=_int_list(1), default=(1,), metavar="b",
                       help="sequences per micro-batch (default 1); a list (1,2,4) searches them")
    model.add_argument("--optimizer", choices=OPTIMIZERS, default="adam", help="default adam")
    model.add_argument("--precision", choices=tuple(PRECISIONS), default="mixed",
                       help="mixed (= fp16, bf16: 16-bit weights, gradients, activations; 32-bit optimizer "
                            "state) or fp32 (default mixed)")


def _machine_arguments(machine) -> None:
    machine.add_argument("--gpus", type=_gpus, required=True, metavar="N", help=f"GPUs in all (at most {MAX_GPUS})")
    machine.add_argument("--gpus-per-node", type=_positive_int, metavar="G", help="GPUs per node (default min(8, N))")
    machine.add_argument("--memory", type=_si("--memory"), default=80e9, metavar="BYTES",
                         help="memory per GPU (default 80G = 80e9 bytes; 80GiB for 2^30 units)")
    machine.add_argument("--peak-flops", type=_si("--peak-flops", high=1e18), default=989e12, metavar="FLOPS",
                         help="peak FLOP/s per GPU at the training precision (default 989T: H100 SXM dense BF16)")
    machine.add_argument("--efficiency", type=_fraction, default=0.5, metavar="E",
                         help="fraction of the peak the layers reach (default 0.5; 1 with a measured rate)")
    machine.add_argument("--compute", choices=("flat", "shapes"), default="flat",
                         help="flat: 6 x parameters x tokens at peak x efficiency (default); shapes: every GEMM at "
                              "the efficiency of its shape, element-wise bytes at --hbm (docs/planner.md)")
    machine.add_argument("--hbm", type=_si("--hbm"), default=3.35e12, metavar="BYTES/S",
                         help="memory bandwidth per GPU for --compute shapes (default 3.35T: H100 SXM)")
    machine.add_argument("--gemm-ceiling", type=_positive_fraction, default=0.824, metavar="C",
                         help="the largest GEMMs' fraction of the peak for --compute shapes (default 0.824, "
                              "fitted to an H100 measurement; 0.72 reproduces Megatron-LM's published A100 runs, "
                              "docs/planner.md)")
    machine.add_argument("--nics-per-node", type=_positive_int, metavar="N",
                         help="spread a group's inter-node traffic over the node's N NICs (default: one port a message)")
    machine.add_argument("--simulate", action="store_true",
                         help="price the collectives with the cluster simulator (ranks waiting on late peers; "
                              "pycollect explain --predict) where it answers, instead of each rank on its own")
    machine.add_argument("--preset", default="nvlink4,ib-ndr", metavar="INTRA[,INTER]",
                         help="named links inside and between nodes (default nvlink4,ib-ndr; one name for both): "
                              "nvlink3, nvlink4, pcie4, pcie5, ib-hdr, ib-ndr, eth-100g, eth-400g")
    machine.add_argument("--tuning", metavar="FILE",
                         help="a 'pycollect bench fit' file (--json, or the --tuning-out file PYCOLLECT_TUNING reads): its "
                              "fitted model replaces the presets' links")
    _link_arguments(machine)


def _link_arguments(machine) -> None:
    """--intra-bw, --intra-latency, --inter-bw, --inter-latency: each over the preset's value."""
    for tier in ("intra", "inter"):
        machine.add_argument(f"--{tier}-bw", type=_si(f"--{tier}-bw"), metavar="BYTES/S",
                             help=f"{tier}-node bandwidth one way (450G = 450e9 bytes/s), over the preset")
        machine.add_argument(f"--{tier}-latency", type=_seconds, metavar="T",
                             help=f"{tier}-node latency (2us), over the preset")


def _search_arguments(search) -> None:
    from ..pipeline.schedules import SCHEDULES, ZERO_BUBBLE
    from ..plan.config import RECOMPUTE
    search.add_argument("--dp", type=_int_list(1), metavar="D", help="data-parallel sizes")
    search.add_argument("--tp", type=_int_list(1), metavar="T", help="tensor-parallel sizes")
    search.add_argument("--pp", type=_int_list(1), metavar="P", help="pipeline stages")
    search.add_argument("--zero", type=_int_list(0, 3), default=(0, 1, 2, 3), metavar="Z", help="ZeRO stages (default 0,1,2,3)")
    search.add_argument("--schedule", type=_choices(SCHEDULES + ZERO_BUBBLE), default=SCHEDULES + ZERO_BUBBLE,
                        metavar="S", help=f"pipeline schedules, some of {','.join(SCHEDULES + ZERO_BUBBLE)} (default all)")
    search.add_argument("--virtual", type=_int_list(2), default=(2,), metavar="V",
                        help="chunks per stage of the interleaved schedule (default 2)")
    search.add_argument("--recompute", type=_choices(RECOMPUTE), default=RECOMPUTE, metavar="R",
                        help=f"activation recomputation (default {','.join(RECOMPUTE)})")
    search.add_argument("--no-sp", action="store_true", help="no sequence parallelism with tensor parallelism")
    search.add_argument("--overlap", action="store_true",
                        help="the data-parallel reduction overlaps backward (only what outlasts it is exposed)")
    search.add_argument("--overlap-p2p", action="store_true",
                        help="pipeline sends and receives overlap compute (off the critical path)")
    search.add_argument("--scatter-gather", action="store_true",
                        help="without SP, send 1/tp of each pipeline activation per rank and allgather it")
    search.add_argument("--algorithm", default="ring", metavar="A",
                        help="the collectives' schedule (ring, ...) or auto: the cheapest predicted (default ring)")
    search.add_argument("--max-bubble", type=_fraction, default=0.25, metavar="X",
                        help="reject pipelines whose bubble (formula) exceeds X (default 0.25 = 25%%)")


def _output_arguments(out) -> None:
    out.add_argument("--top", type=_positive_int, default=10, metavar="K", help="configurations to list (default 10)")
    out.add_argument("--show-rejected", type=int, default=15, metavar="K",
                     help="rejected configurations to list with their reasons (default 15; all are in --json)")
    out.add_argument("--json", metavar="FILE", help="write everything as JSON (schema pycollect.bench/1, kind 'plan')")


# -- building the inputs --------------------------------------------------------------------------
def build_model(args):
    from ..plan.model import ModelSpec
    from ..plan.presets import MODELS, parse_si
    kw = dict(batch=args.batch, micro=args.micro[0], precision=args.precision, optimizer=args.optimizer,
              biases=not args.no_biases)
    shape = (args.layers, args.hidden, args.heads)
    if args.model and any(x is not None for x in shape):
        raise ValueError("give --model or --layers/--hidden/--heads, not both")
    if args.model:
        if args.model.lower() in MODELS:
            spec = ModelSpec.from_name(args.model, seq=args.seq, **kw)
            return spec if args.vocab is None and args.ffn is None else _replace(spec, args)
        try:
            count = parse_si(args.model, "--model")
        except ValueError:
            raise ValueError(f"--model {args.model!r}: neither a parameter count (7B, 1.3e9) nor a named shape "
                             f"({', '.join(MODELS)})") from None
        return ModelSpec.from_params(count, seq=args.seq, vocab=args.vocab, what="--model", **kw)
    if any(x is None for x in shape):
        raise ValueError("the model needs --model, or all of --layers, --hidden and --heads")
    if args.hidden % args.heads:
        raise ValueError(f"--hidden {args.hidden} does not divide by --heads {args.heads}")
    return ModelSpec(args.layers, args.hidden, args.heads, args.vocab or 51200, args.seq or 2048, ffn=args.ffn, **kw)


def _replace(spec, args):
    import dataclasses
    return dataclasses.replace(spec, vocab=args.vocab or spec.vocab, ffn=args.ffn or spec.ffn)


def build_cluster(args):
    import dataclasses

    from ..engine.topology import INTER, INTRA
    from ..plan.config import ClusterSpec, links_from_file, links_from_presets
    from ..costmodel import Model
    names = args.preset.split(",")
    if not 1 <= len(names) <= 2 or not all(names):   # "nvlink4," is no INTER link: not nvlink4 between nodes too
        raise ValueError(f"--preset takes INTRA or INTRA,INTER, got {args.preset!r}")
    links = links_from_presets(names[0], names[-1])
    base = links_from_file(args.tuning) if args.tuning else Model(links.links)   # every fitted term, or none
    tiers = dict(links.links) | dict(base.links)
    for tier, bw, lat in ((INTRA, args.intra_bw, args.intra_latency), (INTER, args.inter_bw, args.inter_latency)):
        if bw is not None:   # the bandwidth given holds at every size: no far rate of a fit past it
            tiers[tier] = dataclasses.replace(tiers[tier], beta=1.0 / bw, beta_far=None, far_bytes=None)
        if lat is not None:
            tiers[tier] = dataclasses.replace(tiers[tier], alpha=lat)
    per_node = args.gpus_per_node or min(8, args.gpus)
    return ClusterSpec(args.gpus, per_node, args.memory, args.peak_flops,
                       dataclasses.replace(base, links=tiers, samples={}),
                       args.efficiency, compute=args.compute, hbm=args.hbm, nics_per_node=args.nics_per_node,
                       gemm_ceiling=args.gemm_ceiling, simulate=args.simulate)


def build_space(args):
    from ..plan.rank import SearchSpace
    return SearchSpace(dp=args.dp, tp=args.tp, pp=args.pp, zero=args.zero, schedules=args.schedule,
                       virtual=args.virtual, recompute=args.recompute, sp=not args.no_sp, overlap=args.overlap,
                       algorithm=args.algorithm, max_bubble=args.max_bubble, overlap_p2p=args.overlap_p2p,
                       scatter_gather=args.scatter_gather, micro=tuple(args.micro) if len(args.micro) > 1 else None)


def check_inputs(spec, cluster, space) -> str | None:
    """The one-line reason the request is impossible as a whole, before searching."""
    from ..algorithms import registry
    if space.algorithm != "auto":
        for collective in ("allreduce", "reduce_scatter", "allgather"):
            if space.algorithm not in registry.schedule_algorithms(collective):
                return (f"--algorithm {space.algorithm}: not a schedule of {collective} "
                        f"(expected auto or one of {', '.join(registry.schedule_algorithms(collective))})")
    fixed = [space.dp, space.tp, space.pp]
    if all(x is not None and len(x) == 1 for x in fixed):
        dp, tp, pp = (x[0] for x in fixed)
        if dp * tp * pp != cluster.gpus:
            return f"tp x pp x dp = {tp} x {pp} x {dp} = {tp * pp * dp}, but --gpus is {cluster.gpus}"
    if space.micro is None and space.dp is not None and len(space.dp) == 1 and spec.batch % (spec.micro * space.dp[0]):
        return (f"--batch {spec.batch} is not divisible by --micro {spec.micro} x --dp {space.dp[0]} "
                f"= {spec.micro * space.dp[0]}")
    undivided = [b for b in (space.micro or (spec.micro,)) if spec.batch % b]
    if undivided:
        return f"--batch {spec.batch} is not divisible by --micro {','.join(map(str, undivided))}"
    if space.dp is None and space.tp is None and space.pp is None:
        return None
    from ..plan.rank import candidates
    if not candidates(cluster, space):
        return (f"no dp x tp x pp = {cluster.gpus} with dp in {_set(space.dp)}, tp in {_set(space.tp)}, "
                f"pp in {_set(space.pp)}")
    return None


def _set(values) -> str:
    return "any" if values is None else "{" + ",".join(map(str, values)) + "}"


# -- output ---------------------------------------------------------------------------------------
def _gb(x: float) -> float:
    return x / GB


def top_table(ranked: list) -> list[str]:
    from .report import format_table
    rows = []
    for i, p in enumerate(ranked, 1):
        c, by_tier = p.config, p.comm_bytes
        rows.append({"rank": i, "dp": c.dp, "tp": c.tp, "sp": "sp" if c.sequence_parallel else "",
                     "pp": c.pp, "schedule": (c.schedule + (f" v={c.v}" if c.v > 1 else "")) if c.pp > 1 else "-",
                     "zero": c.zero, "recompute": c.recompute, "b": p.micro, "m": p.micro_batches,
                     "mem": _gb(p.memory["total"]), "step": p.step_time, "mfu": 100 * p.mfu,
                     "bubble": 100 * p.bubble["predicted"], "ratio": p.comm_to_compute,
                     "intra": _gb(by_tier["intra-node"]), "inter": _gb(by_tier["inter-node"])})
    return format_table(rows, [("rank", "#", "{}"), ("dp", "dp", "{}"), ("tp", "tp", "{}"), ("sp", "", "{}"),
                               ("pp", "pp", "{}"), ("schedule", "schedule", "{}"), ("zero", "zero", "{}"),
                               ("recompute", "recompute", "{}"), ("b", "b", "{}"), ("m", "micro-batches", "{}"),
                               ("mem", "memory GB", "{:.1f}"), ("step", "step s", "{:.3f}"), ("mfu", "MFU %", "{:.1f}"),
                               ("bubble", "bubble %", "{:.1f}"), ("ratio", "comm/compute", "{:.2f}"),
                               ("intra", "intra GB/step", "{:.1f}"), ("inter", "inter GB/step", "{:.1f}")])


def memory_rows(spec, config) -> list[dict]:
    """Memory per rank of ``config``'s mesh under each ZeRO stage and each recomputation, with and without SP."""
    import dataclasses

    from ..plan.memory import memory
    zeros = (0, 1, 2, 3) if config.dp > 1 else (0,)
    sps = (True, False) if config.tp > 1 else (False,)
    rows = []
    for zero in zeros:
        c = dataclasses.replace(config, zero=zero)
        row = {"zero": zero, **{k: v for k, v in memory(spec, c).items() if k in ("parameters", "gradients",
                                                                                    "optimizer", "activations_io")}}
        for sp in sps:
            for r in ("none", "selective", "full"):
                m = memory(spec, c, recompute=r, sp=sp)
                row[f"activations_{r}{'_sp' if sp else ''}"] = m["activations"]
                row[f"total_{r}{'_sp' if sp else ''}"] = m["total"]
        rows.append(row)
    return rows


def memory_table(rows: list[dict], tp: int) -> list[str]:
    from .report import format_table
    cols = [("zero", "ZeRO", "{}"), ("parameters", "parameters", "{:.2f}"), ("gradients", "gradients", "{:.2f}"),
            ("optimizer", "optimizer", "{:.2f}")]
    for sp in ((True, False) if tp > 1 else (False,)):
        tag = "_sp" if sp else ""
        label = " SP" if sp else (" no SP" if tp > 1 else "")
        cols += [(f"activations_{r}{tag}", f"act {r}{label}", "{:.2f}") for r in ("none", "selective", "full")]
    cols.append(("activations_io", "act embed/logits", "{:.2f}"))
    shown = [{k: (v / GB if isinstance(v, float) else v) for k, v in r.items()} for r in rows]
    return format_table(shown, cols)


def comm_table(prediction) -> list[str]:
    from .report import format_table
    rows = [{"where": op.where, "what": op.what, "alg": op.algorithm, "group": op.group,
             "mb": op.nbytes / 1e6, "calls": op.calls,
             "intra": _gb(op.step_bytes().get("intra-node", 0)), "inter": _gb(op.step_bytes().get("inter-node", 0)),
             "s": op.step_seconds} for op in prediction.comm]
    return format_table(rows, [("where", "", "{}"), ("what", "what", "{}"), ("alg", "algorithm", "{}"),
                               ("group", "ranks", "{}"), ("mb", "MB/call", "{:.2f}"), ("calls", "calls/step", "{}"),
                               ("intra", "intra GB", "{:.2f}"), ("inter", "inter GB", "{:.2f}"), ("s", "seconds", "{:.4f}")])


def bubble_lines(rows: list[dict], prediction) -> list[str]:
    c = prediction.config
    lines = [f"pipeline bubble at p={c.pp}, m={prediction.micro_batches} (formula; predicted with this "
             f"configuration's chunk and message times):"]
    for r in rows:
        name = r["schedule"] + (f" v={r['v']}" if r["v"] > 1 else "")
        if r["formula"] is None:
            lines.append(f"  {name}: {r['note']}")
        else:
            lines.append(f"  {name}: {100 * r['formula']:.1f}% formula, {100 * r['predicted']:.1f}% predicted "
                         f"({r['model']})")
    return lines


def reason_kind(reason: str) -> str:
    return reason.split(":")[0] if reason.startswith(("does not fit", "TP across", "bubble")) else "sizes do not divide"


def rejected_lines(rejected: list, show: int, in_json: bool) -> list[str]:
    """A count per kind of reason, then up to ``show`` examples taken from every kind in turn."""
    kinds = Counter(reason_kind(r) for _, r in rejected)
    lines = [f"\nrejected {len(rejected)}: " + ", ".join(f"{k} {v}" for k, v in kinds.most_common())]
    queues = {k: [(c, r) for c, r in rejected if reason_kind(r) == k] for k in kinds}
    shown: list[tuple[ParallelConfig, str]] = []
    while len(shown) < min(show, len(rejected)):
        for k in kinds:
            if queues[k] and len(shown) < show:
                shown.append(queues[k].pop(0))
    lines += [f"  {c.describe()}: {r}" for c, r in shown]
    if len(rejected) > len(shown):
        lines.append(f"  ... {len(rejected) - len(shown)} more" + (" (all in the JSON)" if in_json else ""))
    return lines


def describe_cluster(cluster, args) -> str:
    used = ["intra-node"] * (min(cluster.gpus, cluster.gpus_per_node) > 1) + ["inter-node"] * (cluster.nodes > 1)
    tiers = ", ".join(f"{t} {k.bandwidth / 1e9:.3g} GB/s {k.alpha * 1e6:.3g} us" for t, k in cluster.links.links.items()
                      if t in used) or "none used (one GPU)"
    source = f"fitted in {args.tuning} over preset {args.preset}" if args.tuning else f"preset {args.preset}"
    return (f"{cluster.gpus} GPUs, {cluster.gpus_per_node} per node, {cluster.memory / GB:.4g} GB each, "
            f"{cluster.peak_flops / 1e12:.4g} TFLOP/s peak x {_rate(cluster)}; links ({source}): {tiers}"
            + (f", {cluster.nics_per_node} NICs a node" if cluster.nics_per_node else "")
            + ("; collectives priced by the cluster simulator" if cluster.simulate else ""))


def _rate(cluster) -> str:
    if cluster.compute == "flat":
        return f"{cluster.efficiency:g}"
    return f"GEMM efficiency by shape (ceiling {cluster.gemm_ceiling:g}), element-wise at {cluster.hbm / 1e12:.4g} TB/s"


def _error(message: str) -> int:
    sys.stderr.write(f"{PROG}: error: {message}\n")
    return 2


# -- the command ----------------------------------------------------------------------------------
def run(args) -> int:
    import dataclasses

    from ..plan.rank import plan
    try:
        spec = build_model(args)
        cluster = build_cluster(args)
        space = build_space(args)
    except ValueError as e:
        return _error(str(e))
    problem = check_inputs(spec, cluster, space) or outputs_problem([("--json", args.json)])
    if problem:
        return _error(problem)
    result = plan(spec, cluster, space)
    n = len(result.ranked) + len(result.rejected)
    print(f"{PROG}: {spec.describe()}")
    print(f"machine: {describe_cluster(cluster, args)}")
    print(f"{n} configurations: {len(result.ranked)} fit and can run, {len(result.rejected)} rejected")
    best = result.best
    mem_rows: list[dict] = []
    bubbles: list[dict] = []
    if best is not None:
        at_best = spec if best.micro == spec.micro else dataclasses.replace(spec, micro=best.micro)
        mem_rows, bubbles = print_best(result, at_best, space, args.top)
    else:
        print("\nno configuration fits and can run")
    if result.rejected:
        print("\n".join(rejected_lines(result.rejected, args.show_rejected, bool(args.json))))
    if args.json:
        print(f"\nwrote {write_plan(args.json, spec, cluster, space, result, mem_rows, bubbles)}")
    sys.stdout.flush()
    return 0 if best is not None else 1


def print_best(result, spec, space, top: int) -> tuple[list[dict], list[dict]]:
    """The top ``top`` configurations, then the best one's step time, memory table, communication and the
    bubble of every schedule (of the best pipelined one); returns the memory rows and the bubbles."""
    from ..plan.steptime import schedule_bubbles
    best = result.best
    print(f"\ntop {min(top, len(result.ranked))} by predicted step time")
    print("\n".join(top_table(result.ranked[:top])))
    t = best.times
    print(f"\nbest: {best.config.describe()}, {best.micro_batches} micro-batches of {best.micro}")
    print(f"  step {best.step_time:.3f} s = pipeline {t['pipeline']:.3f} s (compute {t['compute']:.3f}, "
          f"tensor-parallel calls {t['tp']:.3f}, bubble {100 * best.bubble['predicted']:.1f}%) + data-parallel "
          f"exposed {t['dp_exposed']:.3f} s of {t['dp']:.3f}; MFU {100 * best.mfu:.1f}%, "
          f"communication/compute {best.comm_to_compute:.2f}")
    mem_rows = memory_rows(spec, best.config)
    print(f"\nmemory per rank (GB, stage {best.memory['stage']}) of dp={best.config.dp} tp={best.config.tp} "
          f"pp={best.config.pp} by ZeRO stage and activation recomputation:")
    print("\n".join(memory_table(mem_rows, best.config.tp)))
    print("\ncommunication per step (the busiest rank of each group):")
    print("\n".join(comm_table(best)))
    bubbles = []
    piped = next((p for p in result.ranked if p.config.pp > 1), None)
    if piped is not None:
        bubbles = schedule_bubbles(piped, space.virtual)
        print("\n" + ("" if piped is best else f"(the best pipelined: {piped.config.describe()})\n")
              + "\n".join(bubble_lines(bubbles, piped)))
    return mem_rows, bubbles


def write_plan(path: str, spec, cluster, space, result, mem_rows: list[dict], bubbles: list[dict]) -> str:
    """The JSON file: one record per ranked configuration; the model, machine, search, rejected, tables."""
    import dataclasses

    from .report import host_header, write_json
    records = [dict(p.to_dict(), rank=i) for i, p in enumerate(result.ranked, 1)]
    return write_json(path, "plan", host_header(), records,
                      model={**dataclasses.asdict(spec), "total_params": spec.total_params,
                             "shape_params": spec.shape_params},
                      cluster={"gpus": cluster.gpus, "gpus_per_node": cluster.gpus_per_node,
                               "memory_bytes": cluster.memory, "peak_flops": cluster.peak_flops,
                               "efficiency": cluster.efficiency, "compute": cluster.compute, "hbm": cluster.hbm,
                               "gemm_ceiling": cluster.gemm_ceiling, "nics_per_node": cluster.nics_per_node,
                               "simulate": cluster.simulate,
                               "links": cluster.links.to_dict()},
                      search=dataclasses.asdict(space),
                      rejected=[{**c.to_dict(), "reason": r} for c, r in result.rejected],
                      memory_table=mem_rows, bubbles=bubbles)
