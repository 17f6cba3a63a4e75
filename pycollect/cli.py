"""``python -m pycollect`` / ``pycollect``: info, bench, explain, trace, train and plan.

Every rank of an MPI job runs the same command line; rank 0 prints. A bad flag is one line
on stderr and exit status 2 on every rank; in a launched job (bench, train) the ranks agree their
command lines first (one small allgather), so that a rank whose line differs or was refused stops
every rank, none waits.
"""
from __future__ import annotations

import argparse
import importlib
import os
import sys

# subcommand -> module under pycollect.tools with add_arguments(parser) and run(args) -> int
COMMANDS = {
    "info": "info",
    "bench": "bench",
    "explain": "explain",
    "trace": "trace",
    "train": "train",
    "plan": "plan",
}
HELP = {
    "info": "MPI library, world, nodes, GPU, what auto picks; checks the launcher's world size",
    "bench": "benchmarks: a collective sweep (nccl-tests style), tiers, or fit",
    "explain": "a schedule's rounds and traffic per rank and tier, without running it",
    "trace": "merge per-rank PYCOLLECT_TRACE files into one timeline",
    "train": "train the GPT on a tensor x data x pipeline parallel mesh (optionally against its single-process twin)",
    "plan": "rank dp x tp x pp, ZeRO, schedule and recomputation by predicted memory, traffic and step time",
}


class OneLineParser(argparse.ArgumentParser):
    """Argument errors as one line (``pycollect bench: error: ...``) and exit status 2."""

    def error(self, message):
        sys.stderr.write(f"{self.prog}: error: {message}\n")
        raise SystemExit(2)


def _version() -> str:
    from . import __version__
    return __version__


def build_parser(argv: list[str] | None = None) -> argparse.ArgumentParser:
    """The parser; given the command line, only its command's module is imported for its flags (``explain`` need
    not load the planner or the benchmarks: their imports cost a tenth of a second). Without one, or with no
    command in it, every command's flags."""
    parser = OneLineParser(prog="pycollect", description=__doc__.splitlines()[0])
    parser.add_argument("--version", action="version", version=f"%(prog)s {_version()}")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND", parser_class=OneLineParser)
    sub.required = True
    chosen = _command_of(argv)
    for name, module in COMMANDS.items():
        p = sub.add_parser(name, help=HELP[name], description=HELP[name])
        p.set_defaults(_module=module)
        if chosen in (None, name):
            importlib.import_module(f"pycollect.tools.{module}").add_arguments(p)
    return parser


def _command_of(argv: list[str] | None) -> str | None:
    """The command a command line names (its first word that is not a flag: the top level takes no values),
    or None."""
    words = [a for a in (sys.argv[1:] if argv is None else argv) if not a.startswith("-")]
    return words[0] if words and words[0] in COMMANDS else None


# commands that run an MPI job: each checks the launcher first (info reports the same check itself)
LAUNCHED = ("bench", "train")
# commands that load MPI; plan, explain and trace (merge) do not
NEEDS_MPI = ("info", "bench", "train")
EXIT_NO_MPI = 1


def main(argv: list[str] | None = None) -> int:
    words = sys.argv[1:] if argv is None else list(argv)
    command = _command_of(words)
    try:
        args = build_parser(words).parse_args(words)
        refused = None
    except SystemExit as e:   # the line (or the help) is written; in a launched job the other ranks must learn of it
        if command not in LAUNCHED or refits(words):
            raise
        refused = e
    if refits(words):   # bench fit --from F: the saved run refitted here, no MPI loaded, no job (a login node)
        command = "bench --from"
    if command in NEEDS_MPI:
        missing = mpi_missing(f"pycollect {command}")
        if missing is not None:
            return missing
    if command in LAUNCHED:
        mismatch = launch_mismatch(f"pycollect {command}")
        if mismatch is not None:
            return mismatch
        problem = same_command_line(words, refused)
        if refused is not None:
            raise refused
        if problem is not None:
            sys.stderr.write(f"pycollect {command}: error: {problem}\n")
            return 2
        warn_about_cores(f"pycollect {command}")
    module = importlib.import_module(f"pycollect.tools.{args._module}")
    if command in LAUNCHED:     # a rank that stops writing must end the job (the excepthook aborts it)
        return module.run(args)
    try:
        return module.run(args)
    except BrokenPipeError:     # the reader left (``pycollect plan ... | head``): stop quietly, as a shell tool does
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())   # the interpreter's last flush of stdout would fail again
        return 1


def refits(words: list[str]) -> bool:
    """Whether the command line is ``bench fit --from F`` (or ``--from=F``, or an abbreviation argparse takes: ``--f``
    and on): a saved run refitted without MPI (tools/refit.py)."""
    rest = [w for w in words if not w.startswith("-")]
    return rest[:2] == ["bench", "fit"] and any(w.split("=")[0] in ("--f", "--fr", "--fro", "--from") for w in words)


def same_command_line(words: list[str], refused: SystemExit | None) -> str | None:
    """Every rank of a launched job runs the same command line, agreed before anything else is collective (one
    small allgather): None, or the line to print. A rank whose line was refused (or that printed the help) takes
    part too, so that the others stop with it instead of waiting."""
    from mpi4py import MPI

    from .tools.common import agree_command_line
    world = MPI.COMM_WORLD
    if world.Get_size() == 1:
        return None
    said = None if refused is None else ("a bad flag (its line says why)" if refused.code else "it printed the help")
    return agree_command_line(world, None if said else {"command line": words}, error=said)


def mpi_missing(prog: str) -> int | None:
    """Exit status after one line on stderr where the MPI library cannot be loaded; None once it is loaded."""
    from . import load_mpi
    try:
        load_mpi()
    except ImportError as e:
        sys.stderr.write(f"{prog}: error: {e}\n")
        return EXIT_NO_MPI
    return None


BLAS_THREADS = ("OMP_NUM_THREADS", "OPENBLAS_NUM_THREADS", "MKL_NUM_THREADS")


def warn_about_cores(prog: str) -> None:
    """One line (from the first rank of each node) when ranks outnumber the node's cores, or when several ranks
    share a node and BLAS may start a thread per core in each (measured: train --tp 2 at 2 ranks took 31.4 s
    without OMP_NUM_THREADS=1, 3.8 s with it). Collective over the world: every rank calls it."""
    import os

    from mpi4py import MPI
    node = MPI.COMM_WORLD.Split_type(MPI.COMM_TYPE_SHARED)
    try:
        ranks, first = node.Get_size(), node.Get_rank() == 0
    finally:
        node.Free()
    cores = os.cpu_count() or 1
    if not first:
        return
    if ranks > cores:
        sys.stderr.write(f"{prog}: warning: {ranks} ranks on a node of {cores} cores: ranks wait for cores, and "
                         f"timings mean less\n")
    if ranks > 1 and not any(os.environ.get(v) for v in BLAS_THREADS):
        sys.stderr.write(f"{prog}: warning: {ranks} ranks on this node and BLAS threads not limited: set "
                         f"OMP_NUM_THREADS=1 (or {max(1, cores // ranks)}) for each rank\n")


def launch_mismatch(prog: str) -> int | None:
    """info's exit status for a launch whose MPI world is not the one the launcher started (N singletons, two
    MPI libraries), after one line on stderr from each rank; None when they agree or no launcher says."""
    import os

    from mpi4py import MPI

    from .tools.info import EXIT_MISMATCH, launcher_errors
    errors = launcher_errors(MPI.COMM_WORLD.Get_size(), os.environ)
    for line in errors:
        sys.stderr.write(f"{prog}: error: {line}\n")
    return EXIT_MISMATCH if errors else None


if __name__ == "__main__":
    raise SystemExit(main())
