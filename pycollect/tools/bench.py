"""``pycollect bench``: a collective sweep (``allreduce`` ... ``all``), ``tiers`` or ``fit``."""
from __future__ import annotations

import importlib

SWEEP_TARGETS = ("allreduce", "reduce_scatter", "allgather", "alltoall", "broadcast", "reduce", "gather", "scatter", "scan",
                 "sendrecv", "all")
# target -> module under pycollect.tools with add_arguments(parser) and run(args) -> int
TARGETS = {**{t: "sweep" for t in SWEEP_TARGETS}, "tiers": "tiers", "fit": "fit"}
HELP = {"sweep": "time a collective over a sweep of sizes against MPI's own (nccl-tests columns)",
        "tiers": "point-to-point bandwidth and latency per tier, and collectives inside and across nodes",
        "fit": "fit latency and bandwidth per tier, predict every algorithm, write a tuning file"}


def add_arguments(parser) -> None:
    sub = parser.add_subparsers(dest="target", metavar="TARGET", parser_class=type(parser))
    sub.required = True
    for target, module in TARGETS.items():
        p = sub.add_parser(target, help=HELP[module], description=HELP[module])
        p.set_defaults(_bench_module=module)
        importlib.import_module(f"pycollect.tools.{module}").add_arguments(p)


def run(args) -> int:
    module = "refit" if getattr(args, "from_file", None) else args._bench_module   # bench fit --from: no MPI
    return importlib.import_module(f"pycollect.tools.{module}").run(args)
