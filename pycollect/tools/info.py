"""``pycollect info``: MPI library, world, nodes, GPU and what ``auto`` picks; checks the launcher's world size.

Every rank checks the world size against what its launcher says (an ``srun`` step's task
count, Open MPI's or a PMI process manager's world size). A mismatch, typically N tasks that
each started a world of one, is an ERROR line on stderr of that rank and exit status 3.
"""
from __future__ import annotations

import os
import sys

from . import report
from .common import bcast_json, communicator

SIZES = (8, 32 * report.KiB, report.MiB, 64 * report.MiB)
EXIT_MISMATCH = 3


def add_arguments(parser) -> None:
    parser.add_argument("--json", metavar="FILE", help="also write these facts as JSON (kind 'info')")


def run(args) -> int:
    from mpi4py import MPI
    errors = launcher_errors(MPI.COMM_WORLD.Get_size(), os.environ)
    status = _run(args, errors)
    for line in errors:
        sys.stderr.write(f"pycollect info: ERROR: {line}\n")
    sys.stderr.flush()
    return EXIT_MISMATCH if errors else status


def _run(args, errors: list[str]) -> int:
    comm = communicator("pycollect info")   # collective: every rank, mismatch or not, so none waits alone
    if comm is None:                         # a bad PYCOLLECT_* setting or tuning file
        return 2
    try:
        problem = _json_problem(comm, args.json)
        if problem:
            sys.stderr.write(f"pycollect info: error: {problem}\n")
            return 2
        return _report(comm, args, errors) if comm.rank == 0 else 0
    finally:
        comm.free()


def _json_problem(comm, path: str | None) -> str | None:
    """Why rank 0 cannot write ``--json path``, on every rank (None: it can, or no ``--json``); checked before
    anything is collected, by rank 0 alone (the file is its to write) and told to the others."""
    if path is None:
        return None
    from mpi4py import MPI
    mine = report.output_problem(path, "--json") if comm.rank == 0 else None
    return bcast_json(MPI.COMM_WORLD, mine)


def _report(comm, args, errors: list[str]) -> int:
    """Print the facts (rank 0) and write them as JSON when asked; returns the exit status so far."""
    facts = collect_facts(comm, errors)
    print("\n".join(format_facts(facts)), flush=True)
    if args.json:
        header = report.run_header(comm, **{k: v for k, v in facts.items() if k != "auto"})
        try:   # write_json's temporary name is this process's own: N singletons may all write the same path
            print(f"wrote {report.write_json(args.json, 'info', header, facts['auto'])}", flush=True)
        except OSError as e:
            sys.stderr.write(f"pycollect info: error: cannot write --json {args.json}: {e}\n")
            return 2
    return 0


# -- the launcher check ---------------------------------------------------------------------------
def launcher_sizes(environ) -> dict[str, int]:
    """``{variable: world size it states}`` for the launcher variables set here.

    Slurm's count is read only inside an ``srun`` step, and only when no process manager below
    it (hydra's ``PMI_SIZE``, Open MPI's ``OMPI_COMM_WORLD_SIZE``) states the size: ``mpiexec``
    inside an allocation starts its proxies as an srun step of one task per node.
    """
    stated = {v: environ[v] for v in ("OMPI_COMM_WORLD_SIZE", "PMI_SIZE") if v in environ}
    if not stated and ("SLURM_STEP_ID" in environ or "SLURM_STEP_NUM_TASKS" in environ):
        var = "SLURM_STEP_NUM_TASKS" if "SLURM_STEP_NUM_TASKS" in environ else "SLURM_NTASKS"
        if var in environ:
            stated[var] = environ[var]
    return {v: int(s) for v, s in stated.items() if s.strip().isdigit()}


def launcher_rank(environ) -> int:
    """This process's rank as its launcher states it, 0 where none does: who prints, without starting MPI.

    As in ``launcher_sizes``, a process manager's variable wins over Slurm's, read only inside an
    ``srun`` step (under ``mpiexec`` in an allocation, ``SLURM_PROCID`` numbers the proxies).
    """
    for var in ("OMPI_COMM_WORLD_RANK", "PMI_RANK", "PMIX_RANK"):
        if environ.get(var, "").strip().isdigit():
            return int(environ[var])
    if "SLURM_STEP_ID" in environ and environ.get("SLURM_PROCID", "").strip().isdigit():
        return int(environ["SLURM_PROCID"])
    return 0


def launcher_errors(world: int, environ) -> list[str]:
    """One message per launcher variable that disagrees with the MPI world size."""
    return [_mismatch(world, var, n) for var, n in launcher_sizes(environ).items() if n != world]


def _mismatch(world: int, var: str, n: int) -> str:
    ranks = f"{world} rank" + ("" if world == 1 else "s")
    head = f"MPI world has {ranks} but {var} says {n}: "
    if world == 1:
        return head + (f"the tasks did not join one MPI job ({n} singletons). "
                       "Launch with srun --mpi=pmi2 (or pmix), or the mpiexec of the MPI that mpi4py loaded.")
    return head + ("the launcher and the MPI library mpi4py loaded disagree. "
                   "Launch with that MPI's own mpiexec, or srun --mpi=pmi2 (or pmix).")


# -- the facts ------------------------------------------------------------------------------------
def collect_facts(comm, errors: list[str]) -> dict:
    """Everything ``info`` reports, as plain data (rank 0)."""
    from mpi4py import MPI

    import mpi4py

    import pycollect
    topo = comm.topology
    return {"pycollect": pycollect.__version__,
            "mpi_library_line": MPI.Get_library_version().strip().splitlines()[0].strip(),
            "mpi_version": "%d.%d" % MPI.Get_version(), "mpi4py": mpi4py.__version__,
            "libmpi": loaded_libmpi(), "world_size": comm.size, "topology": topo.describe(),
            "num_nodes": topo.num_nodes, "node_of": list(topo.node_of), "node_sizes": list(topo.node_sizes),
            "gpu": gpu_facts(), "cuda_aware": cuda_aware_fact(MPI),
            "launcher": {"stated": launcher_sizes(os.environ), "errors": list(errors)},
            "auto": auto_table(comm)}


def loaded_libmpi() -> list[str]:
    """Paths of the libmpi shared objects this process has mapped (empty where /proc is missing)."""
    try:
        with open("/proc/self/maps") as maps:
            return sorted({line.split()[-1] for line in maps if "libmpi" in line.rsplit("/", 1)[-1]})
    except OSError:
        return []


def gpu_facts() -> dict:
    """Whether CuPy imports and how many CUDA devices it can use; never raises."""
    try:
        import cupy
    except Exception as e:  # ImportError, or a broken CUDA install
        return {"cupy": None, "devices": 0, "note": f"CuPy does not import ({type(e).__name__}: {e})"}
    try:
        devices = int(cupy.cuda.runtime.getDeviceCount())
        note = ""
    except Exception as e:  # no driver, no device
        devices, note = 0, f"{type(e).__name__}: {e}"
    return {"cupy": cupy.__version__, "devices": devices, "note": note}


def cuda_aware_fact(mpi) -> bool | str:
    """``engine.backend.cuda_aware``, or the error it raised (a bad ``PYCOLLECT_CUDA_AWARE``)."""
    from ..engine import backend
    try:
        return backend.cuda_aware(mpi)
    except ValueError as e:
        return f"error: {e}"


def auto_table(comm, dtype: str = "float32") -> list[dict]:
    """One record per (collective, size): what ``algorithm="auto"`` runs."""
    from ..algorithms import registry
    return [{"collective": c, "size_bytes": n, "dtype": dtype, "algorithm": comm.auto_algorithm(c, n, dtype)}
            for c in registry.COLLECTIVES for n in SIZES]


# -- printing -------------------------------------------------------------------------------------
def format_facts(f: dict) -> list[str]:
    """The report as lines of text."""
    nodes = "; ".join(f"node {i}: {_ranks(f['node_of'], i)}" for i in range(f["num_nodes"]))
    lines = [f"pycollect       {f['pycollect']}",
             f"MPI library     {f['mpi_library_line']}",
             f"MPI standard    {f['mpi_version']}",
             f"mpi4py          {f['mpi4py']} (libmpi: {', '.join(f['libmpi']) or 'unknown'})",
             f"world size      {f['world_size']}",
             f"nodes           {f['num_nodes']} ({f['topology']})",
             f"ranks per node  {', '.join(map(str, f['node_sizes']))}",
             f"node of rank    {nodes}",
             f"GPU             {_gpu_line(f['gpu'])}",
             f"CUDA-aware MPI  {_yes_no(f['cuda_aware'])}",
             f"launcher        {_launcher_line(f['launcher'])}",
             "", f"algorithm=\"auto\" picks ({f['auto'][0]['dtype']}):"]
    return lines + format_auto(f["auto"])


def format_auto(records: list[dict]) -> list[str]:
    """The auto records pivoted: one row per collective, one column per size."""
    rows: dict = {}
    for r in records:
        row = rows.setdefault(r["collective"], {"collective": r["collective"]})
        row[report.human_size(r["size_bytes"])] = r["algorithm"]
    cols = [("collective", "collective", "{}")] + [(report.human_size(n), _size_title(n), "{}") for n in SIZES]
    return report.format_table(list(rows.values()), cols)


def _size_title(nbytes: int) -> str:
    text = report.human_size(nbytes)
    return f"{text} B" if text.isdigit() else f"{text[:-1]} {text[-1]}iB"


def _ranks(node_of: list[int], node: int) -> str:
    return ",".join(str(r) for r, n in enumerate(node_of) if n == node)


def _gpu_line(g: dict) -> str:
    if g["cupy"] is None:
        return f"no ({g['note']})"
    usable = f"{g['devices']} usable device" + ("" if g["devices"] == 1 else "s")
    return f"CuPy {g['cupy']}, {usable}" + (f" ({g['note']})" if g["note"] else "")


def _yes_no(value) -> str:
    return "yes" if value is True else "no" if value is False else str(value)


def _launcher_line(launcher: dict) -> str:
    if not launcher["stated"]:
        return "no launcher variable states the world size (plain process or unknown launcher)"
    said = ", ".join(f"{v}={n}" for v, n in launcher["stated"].items())
    return f"{said}: " + ("MISMATCH, see stderr" if launcher["errors"] else "agrees")
