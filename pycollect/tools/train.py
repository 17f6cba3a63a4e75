"""``pycollect train``: train the GPT on a tp x dp mesh under mpiexec, optionally against its twin.

    OMP_NUM_THREADS=1 mpiexec -n 4 python -m pycollect train --tp 2 --dp 2 --steps 100
    mpiexec -n 2 python -m pycollect train --tp 2 --sequence-parallel --task text --text README.md \
        --steps 30 --dtype float64 --check

Rank 0 prints the loss per step; ``--json`` writes the records (``pycollect.bench/1``, kind
``train``). ``--check`` also trains the single-process twin on every rank from the same data,
prints the largest relative difference of the losses and of the final weights and a verdict
against a tolerance (``CHECK_TOLERANCE`` by dtype, or ``--tolerance``), and exits with status 1
on FAIL.
"""
from __future__ import annotations

import os
import re
import sys

import numpy as np

from ..pipeline.schedules import ALL_SCHEDULES
from .common import allgather_json, communicator, finite_number, int_at_least
from .report import outputs_problem

KIND = "train"
EXIT_CHECK_FAILED = 1
# --check: the largest relative difference from the single-process twin that passes, of the losses and of the
# final weights alike. The mesh sums each product and reduction in another order than the twin, so the two
# differ by rounding from the first step; AdamW divides every update by the root of its second moment, which
# turns a rounding difference in a small gradient into a step of full size, and a top-k router can send a
# token the other way: the difference grows with the steps. float64 rounds 2^29 times finer than float32.
# Measured (bench/train_check.sh, 2026-12-04; README.md's --check paragraph): the reverse task to 500 steps,
# float64 at most 3.0e-11, float32 at most 1.8e-2; the text task trains chaotically (float64: 4.0e-13 after 20
# steps, 2.2e-9 after 40, 1.9e-6 after 100), so it passes over 40 steps or fewer only. float32 is a coarse
# check, float64 the tight one.
CHECK_TOLERANCE = {"float64": 1e-8, "float32": 3e-1}


def add_arguments(p) -> None:
    p.set_defaults(prog_name=p.prog)
    g = p.add_argument_group("mesh")
    g.add_argument("--tp", type=int_at_least(1), default=1, help="tensor-parallel size (default 1)")
    g.add_argument("--pp", type=int_at_least(1), default=1, help="pipeline stages (default 1)")
    g.add_argument("--dp", type=int_at_least(1), default=None,
                   help="data-parallel size (default: world size / (tp x pp))")
    g.add_argument("--schedule", choices=ALL_SCHEDULES, default=None,
                   help="pipeline schedule (default 1f1b when --pp > 1); micro-batches from --micro-batches")
    g.add_argument("--virtual", type=int_at_least(1), default=1,
                   help="chunks per stage: with --schedule interleaved[-mcore] 2 or more; --schedule zbv needs "
                        "--virtual 2 (default 1)")
    g.add_argument("--sequence-parallel", action="store_true", help="Megatron sequence parallelism")
    g.add_argument("--zero", type=int, choices=(0, 1, 2, 3), default=None,
                   help="ZeRO stage of the optimizer over the data-parallel group: 0-3 without a pipeline "
                        "(--micro-batches 1), 0-2 with --pp or --schedule (gradients reduced once the schedule "
                        "has drained); default: plain AdamW, gradients allreduced")
    m = p.add_argument_group("model")
    m.add_argument("--layers", type=int_at_least(1), default=2)
    m.add_argument("--embd", type=int_at_least(1), default=64, help="width C (default 64)")
    m.add_argument("--heads", type=int_at_least(1), default=4)
    m.add_argument("--ffn", type=int_at_least(1), default=None, help="MLP width F (default 4C)")
    m.add_argument("--seq", type=int_at_least(2), default=16, help="sequence length T = block size (default 16)")
    m.add_argument("--experts", type=int_at_least(0), default=0,
                   help="experts per MoE layer, spread over the data-parallel ranks, whole on every "
                        "tensor-parallel rank (default 0: dense MLPs)")
    m.add_argument("--top-k", type=int_at_least(1), default=None, help="experts per token (default 1)")
    m.add_argument("--capacity-factor", type=finite_number(0.0, strict=True), default=None,
                   help="expert capacity factor (default 1.25)")
    m.add_argument("--dropless", action="store_true", help="no expert capacity: no token dropped")
    m.add_argument("--dropout", type=float, default=0.0,
                   help="dropout rate (embedding, attention probabilities, residual branches; default 0)")
    m.add_argument("--vocab", type=int_at_least(3), default=None,
                   help="vocabulary of task reverse (default 16; task text uses its 256 byte values)")
    t = p.add_argument_group("training")
    t.add_argument("--task", choices=("reverse", "text"), default="reverse",
                   help="reverse: reverse a random string (learnable; loss goes to ~0); text: bytes of --text")
    t.add_argument("--text", help="a text file for --task text (e.g. README.md)")
    t.add_argument("--steps", type=int_at_least(0), default=100)
    t.add_argument("--batch", type=int_at_least(1), default=16, help="global batch in sequences (default 16)")
    t.add_argument("--micro-batches", type=int_at_least(1), default=1, help="gradient accumulation steps")
    t.add_argument("--lr", type=float, default=3e-3)
    t.add_argument("--weight-decay", type=float, default=0.0)
    t.add_argument("--clip", type=float, default=None, help="clip gradients to this global norm")
    t.add_argument("--dtype", choices=("float32", "float64"), default="float32")
    t.add_argument("--seed", type=int_at_least(0), default=0)
    o = p.add_argument_group("output")
    o.add_argument("--json", help="write the per-step records here")
    o.add_argument("--check", action="store_true",
                   help="also train the single-process twin; print the largest relative differences of the "
                        "losses and final weights, PASS or FAIL against --tolerance; exit status 1 on FAIL")
    o.add_argument("--tolerance", type=finite_number(0.0, strict=True), default=None, metavar="REL",
                   help=f"the largest relative difference of the losses and of the final weights --check passes "
                        f"(default {CHECK_TOLERANCE['float64']:g} for float64, {CHECK_TOLERANCE['float32']:g} for "
                        f"float32: the mesh sums in another order than the twin, and AdamW's normalised steps "
                        f"carry the rounding difference further every step; float32 measured up to 2.1e-1 after "
                        f"200 steps, float64 below 1e-9: check in float64 for a tight answer)")
    o.add_argument("--every", type=int_at_least(1), default=10, help="print every N steps (default 10)")


def _configs(args, world_size: int):
    """(GPTConfig, TrainConfig, dp) or a ValueError that names the bad setting."""
    from ..models import GPTConfig
    from ..training import TrainConfig

    dp = args.dp if args.dp is not None else world_size // (args.tp * args.pp)
    if args.dp is None and world_size % (args.tp * args.pp):   # the data-parallel size is what is left over
        raise ValueError(f"--tp {args.tp} x --pp {args.pp} = {args.tp * args.pp} ranks a replica, which the job's "
                         f"{world_size} do not divide into (--dp, not given, is the job's ranks over tp x pp)")
    if args.tp * args.pp * dp != world_size:
        raise ValueError(f"--tp {args.tp} x --pp {args.pp} x --dp {dp} = {args.tp * args.pp * dp} ranks, but the "
                         f"job has {world_size}")
    piped = args.pp > 1 or args.schedule is not None
    _refuse_unused(args, piped)
    if args.zero is not None and not piped and args.micro_batches != 1:
        raise ValueError("--zero without a pipeline runs with --micro-batches 1")
    if args.zero == 3 and piped:
        raise ValueError("--zero 3 does not run in a pipeline (its parameter gathers would repeat in every "
                         "micro-batch); use --zero 1 or 2 with --pp")
    if args.pp > 1 or args.schedule is not None:
        from ..models.gpt_pipeline import split_layers
        from ..pipeline.schedules import check_schedule_args
        check_schedule_args(args.schedule or "1f1b", args.pp, args.micro_batches, args.virtual,
                            ("--pp", "--micro-batches", "--virtual"))
        split_layers(args.layers, args.pp * args.virtual)
    if args.task == "text" and not args.text:
        raise ValueError("--task text needs --text FILE")
    if args.task == "text" and not os.path.isfile(args.text):
        raise ValueError(f"--text {args.text}: no such file")
    if args.check and args.steps == 0:
        raise ValueError("--check compares what the mesh and its single-process twin trained: give --steps 1 or "
                         "more (--steps 0 trains nothing)")
    if args.task == "text" and os.path.getsize(args.text) < args.seq + 1:
        raise ValueError(f"--text {args.text} has {os.path.getsize(args.text)} bytes, fewer than --seq + 1 = "
                         f"{args.seq + 1} (a window of T inputs and the next byte)")
    if problem := outputs_problem([("--json", args.json)]):   # every rank; rank 0 writes it
        raise ValueError(f"{problem}; name a file to write")
    for flag, value, low in (("--lr", args.lr, 0.0), ("--weight-decay", args.weight_decay, 0.0)):
        if not np.isfinite(value) or value < low:
            raise ValueError(f"{flag} must be a finite number >= {low}, got {value}")
    if args.clip is not None and not (np.isfinite(args.clip) and args.clip > 0):
        raise ValueError(f"--clip must be a positive number, got {args.clip}")
    vocab = 256 if args.task == "text" else 16 if args.vocab is None else args.vocab
    if vocab % args.tp:   # before GPTConfig, whose advice (pad the vocabulary) names no flag of this command
        raise ValueError(f"--tp {args.tp} must divide the vocabulary, "
                         + ("256 byte values with --task text" if args.task == "text" else f"--vocab {vocab}"))
    try:
        config = GPTConfig(vocab_size=vocab, block_size=args.seq, n_layer=args.layers, n_head=args.heads,
                           n_embd=args.embd, ffn=args.ffn, dropout=args.dropout, n_experts=args.experts,
                           moe_top_k=args.top_k or 1,
                           moe_capacity_factor=1.25 if args.capacity_factor is None else args.capacity_factor,
                           moe_dropless=args.dropless)
        config.check_tensor_parallel(args.tp)
    except ValueError as e:
        raise ValueError(in_flags(str(e))) from None
    if args.experts and args.experts % dp:
        raise ValueError(f"--experts {args.experts} does not divide by the data-parallel size {dp}")
    if args.sequence_parallel and args.seq % args.tp:
        raise ValueError(f"--sequence-parallel needs --seq {args.seq} to divide by --tp {args.tp}")
    if args.task == "reverse" and args.seq % 2:
        raise ValueError(f"--task reverse needs an even --seq, got {args.seq}")
    train = TrainConfig(steps=args.steps, batch=args.batch, micro_batches=args.micro_batches, lr=args.lr,
                        weight_decay=args.weight_decay, clip=args.clip, seed=args.seed, task=args.task,
                        text=args.text, dtype=args.dtype)
    train.check(dp)
    return config, train, dp


# GPTConfig's fields (and the MoE router's names for them) as this command's flags
_FLAGS = {"n_embd": "--embd", "n_head": "--heads", "n_layer": "--layers", "ffn": "--ffn", "vocab_size": "--vocab",
          "block_size": "--seq", "n_experts": "--experts", "num_experts": "--experts", "top_k": "--top-k"}


def in_flags(message: str) -> str:
    """A GPTConfig error in this command's words: ``GPTConfig: n_embd = 30 does not divide by n_head = 4`` ->
    ``--embd 30 does not divide by --heads 4``."""
    text = re.sub(r"\b(" + "|".join(_FLAGS) + r") = ", lambda m: _FLAGS[m.group(1)] + " ",
                  message.removeprefix("GPTConfig: "))
    return text.replace("dropout rate", "--dropout")


def _refuse_unused(args, piped: bool) -> None:
    """ValueError for a flag given where nothing reads it (it would be taken, ignored and recorded)."""
    unused = [(args.virtual != 1 and not piped, "--virtual", "--pp or --schedule"),
              (args.text is not None and args.task != "text", "--text", "--task text"),
              (args.vocab is not None and args.task != "reverse", "--vocab", "--task reverse (text has 256 bytes)"),
              (args.sequence_parallel and args.tp == 1, "--sequence-parallel", "--tp 2 or more"),
              (args.tolerance is not None and not args.check, "--tolerance", "--check")]
    unused += [(given and not args.experts, flag, "--experts") for given, flag in
               ((args.top_k is not None, "--top-k"), (args.capacity_factor is not None, "--capacity-factor"),
                (args.dropless, "--dropless"))]
    for given, flag, needs in unused:
        if given:
            raise ValueError(f"{flag} is read only with {needs}")


def _worst(values) -> float:
    """The largest of ``values`` (0 for none), a NaN among them counted as infinite: Python's max() skips a NaN
    that does not come first, which would let a step of NaN loss pass the check."""
    a = np.nan_to_num(np.asarray(list(values), dtype=np.float64), nan=np.inf)
    return float(a.max()) if a.size else 0.0


def _rel(a, b) -> float:
    den = float(np.linalg.norm(b))
    return float(np.linalg.norm(a - b)) / (den if den > 0 else 1.0)


def run(args) -> int:
    from ..training import train
    from ..parallel import ProcessMesh

    prog = getattr(args, "prog_name", "pycollect train")
    world = communicator(prog)
    if world is None:
        return 2
    try:
        config, train_cfg, dp = _configs(args, world.size)
        said = None
    except ValueError as e:
        said = str(e)
    # The flags are the same on every rank (cli.main agreed them) but a rank's files may not be (a path another
    # rank's working directory lacks): every rank stops when any does, before anything else is collective.
    errors = allgather_json(world.mpi, said)   # every rank, its own checks passed or not
    said = said or next((f"rank {r} stopped: {e}" for r, e in enumerate(errors) if e), None)
    if said:
        sys.stderr.write(f"{prog}: error: {said}\n")
        return 2
    mesh = ProcessMesh(world, tp=args.tp, dp=dp, pp=args.pp)
    if world.rank == 0:
        print(_describe(args, config, dp))

    def show(r):
        if world.rank == 0 and (r["step"] % args.every == 0 or r["step"] == args.steps - 1):
            print(f"step {r['step']:5d}  loss {r['loss']:.6f}  {r['seconds'] * 1e3:8.1f} ms", flush=True)

    model, _, history = train(config, train_cfg, mesh, sequence_parallel=args.sequence_parallel, on_step=show,
                              schedule=args.schedule, virtual_stages=args.virtual, zero_stage=args.zero)
    extra, status = {}, 0
    if args.check:
        extra["check"] = check_against_twin(args, config, train_cfg, dp, model, history, world)
        status = 0 if extra["check"]["passed"] else EXIT_CHECK_FAILED
    bad = next((r["step"] for r in history if not np.isfinite(r["loss"])), len(history))
    bad = int(world.allreduce(np.array([bad]), op="min")[0])   # every rank stops alike, none writes a JSON of NaN
    if bad < len(history):
        sys.stderr.write(f"{prog}: error: the loss is not finite from step {bad} on (--lr {args.lr:g}); nothing "
                         f"was written\n")
        mesh.free()
        return 1
    if args.json and world.rank == 0:
        from .report import run_header, write_json
        piped = args.pp > 1 or args.schedule is not None   # what ran: the schedule's default named
        header = run_header(world, sys.argv, model=config.to_dict(), tp=args.tp, pp=args.pp, dp=dp,
                            schedule=(args.schedule or "1f1b") if piped else None,
                            virtual_stages=args.virtual if piped else None, zero_stage=args.zero,
                            sequence_parallel=args.sequence_parallel, train=dict(vars(train_cfg)))
        print("wrote", write_json(args.json, KIND, header, history, **extra))
    mesh.free()
    return status


def _describe(args, config, dp: int) -> str:
    """The first line: the model, the mesh, the task."""
    piped = f" schedule {args.schedule or '1f1b'} x{args.virtual}" if args.pp > 1 or args.schedule else ""
    piped += f" ZeRO stage {args.zero}" if args.zero is not None else ""
    experts = ""
    if config.n_experts:
        capacity = "dropless" if config.moe_dropless else f"capacity factor {config.moe_capacity_factor:g}"
        experts = f", {config.n_experts} experts top-{config.moe_top_k} {capacity}"
    extras = "".join(f", {name} {value:g}" for name, value in (("dropout", config.dropout), ("clip", args.clip))
                     if value)
    return (f"pycollect train: GPT L={config.n_layer} C={config.n_embd} NH={config.n_head} F={config.ffn} "
            f"V={config.vocab_size} T={config.block_size}{experts}, {config.num_params():,} parameters; mesh "
            f"tp={args.tp} pp={args.pp} dp={dp}{' sequence-parallel' if args.sequence_parallel else ''}"
            f"{piped}; task {args.task}, global batch {args.batch} in {args.micro_batches} micro-batch"
            f"{'es' if args.micro_batches > 1 else ''}, {args.dtype}{extras}")


def check_against_twin(args, config, train_cfg, dp: int, model, history: list[dict], world) -> dict:
    """Train the single-process twin (every rank) and hold the run to it: the largest relative differences of
    the losses and of the final weights (the largest over ranks, so that every rank reaches the same verdict),
    the tolerance and whether both are within it. Rank 0 prints the verdict in one line. Collective."""
    from ..training import train_reference
    ref, _, ref_history = train_reference(config, train_cfg, dp=dp,
                                          seq_groups=args.tp if args.sequence_parallel else 1)
    loss_diff = _worst(abs(a["loss"] - b["loss"]) / max(abs(b["loss"]), 1e-30) for a, b in zip(history, ref_history))
    full = model.full_params()  # gathered over the tensor-parallel group; equal across dp
    weight_diff = _worst(_rel(full[n], ref.params[n]) for n in ref.params)
    mine = np.array([loss_diff, weight_diff])   # a NaN anywhere is infinite here (_worst): it fails, on every rank
    loss_diff, weight_diff = (float(d) for d in world.allreduce(mine, op="max"))
    tolerance = CHECK_TOLERANCE[args.dtype] if args.tolerance is None else args.tolerance
    passed = loss_diff <= tolerance and weight_diff <= tolerance
    if world.rank == 0:
        source = f"for {args.dtype}" if args.tolerance is None else "set by --tolerance"
        print(f"check against the single-process twin: {'PASS' if passed else 'FAIL'}: largest relative difference "
              f"of the losses {loss_diff:.2e}, of the final weights {weight_diff:.2e} (tolerance {tolerance:.1e} "
              f"{source})", flush=True)
    return {"max_rel_loss_diff": loss_diff, "max_rel_weight_diff": weight_diff, "tolerance": tolerance,
            "passed": passed}
