"""What every tool writes: the run's metadata, JSON, CSV and a fixed-width table.

JSON files share one shape (documented in README, stable across issues)::

    {"schema": "pycollect.bench/1", "kind": "sweep" | "tiers" | "fit" | ...,
     "header": {run metadata: pycollect version, MPI library, world size, topology, date, argv, ...},
     "records": [one object per row], ...kind-specific extras}
"""
from __future__ import annotations

import csv
import datetime
import json
import os
import platform
import sys
import tempfile

SCHEMA = "pycollect.bench/1"
KiB, MiB, GiB = 1 << 10, 1 << 20, 1 << 30
_UNITS = {"": 1, "K": KiB, "M": MiB, "G": GiB}
ENV_KEYS = ("OMP_NUM_THREADS", "OPENBLAS_NUM_THREADS", "MPIEXEC_TIMEOUT", "SLURM_JOB_ID", "SLURM_NTASKS",
            "GLIBC_TUNABLES")
ENV_PREFIXES = ("MPIR_CVAR_", "PYCOLLECT_", "UCX_", "MALLOC_")   # MALLOC_: glibc's malloc (bench/README.md)


def parse_size(text: str) -> int:
    """``"8"``, ``"32K"``, ``"64M"``, ``"1G"`` (binary units; ``B``/``iB`` suffixes allowed) -> bytes."""
    t = str(text).strip().upper().removesuffix("IB").removesuffix("B")
    unit = t[-1:] if t[-1:] in ("K", "M", "G") else ""
    try:
        value = int(t[: len(t) - len(unit)]) * _UNITS[unit]
    except ValueError:
        raise ValueError(f"not a size: {text!r} (examples: 8, 32K, 64M, 1G)") from None
    if value < 0:
        raise ValueError(f"size must not be negative: {text!r}")
    return value


def human_size(nbytes: int) -> str:
    """The shortest exact binary spelling: 8, 32K, 64M, 1G (or plain bytes)."""
    for unit, scale in (("G", GiB), ("M", MiB), ("K", KiB)):
        if nbytes >= scale and nbytes % scale == 0:
            return f"{nbytes // scale}{unit}"
    return str(nbytes)


def host_header(argv=None, **extra) -> dict:
    """The metadata of a run that uses no MPI (pycollect, Python and NumPy versions, host, UTC date, argv)."""
    import numpy as np

    import pycollect
    head = {"pycollect": pycollect.__version__, "python": platform.python_version(), "numpy": np.__version__,
            "host": platform.node(), "date": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
            "argv": list(sys.argv if argv is None else argv)}
    head.update(extra)
    return head


def run_header(comm, argv=None, **extra) -> dict:
    """Metadata every JSON file carries: ``host_header``'s plus the MPI library, world and topology;
    ``comm`` is a ``pycollect.Communicator``."""
    from mpi4py import MPI

    env = {k: v for k, v in os.environ.items() if k in ENV_KEYS or k.startswith(ENV_PREFIXES)}
    head = host_header(argv, mpi_library=MPI.Get_library_version().strip(), mpi_version="%d.%d" % MPI.Get_version(),
                       mpi4py=_version("mpi4py"), world_size=comm.size, topology=comm.topology.describe(),
                       node_of=list(comm.topology.node_of), env=env)
    head.update(extra)  # the caller's fields win, as before
    return head


def _version(module: str) -> str:
    return getattr(sys.modules.get(module), "__version__", "?")


def write_json(path: str, kind: str, header: dict, records: list[dict], **extra) -> str:
    """Write the shared JSON shape; returns the absolute path.

    Written to a temporary name and renamed, so a reader (or a second writer) never sees half a file.
    """
    body = {"schema": SCHEMA, "kind": kind, "header": header, "records": records, **extra}
    return write_atomically(path, lambda f: json.dump(body, f, indent=1))


def write_csv(path: str, records: list[dict], columns: list[str]) -> str:
    """One line per record, the given columns in order (missing values empty)."""
    def write(f):
        w = csv.DictWriter(f, fieldnames=columns, extrasaction="ignore")
        w.writeheader()
        w.writerows(records)
    return write_atomically(path, write, newline="")


def write_atomically(path: str, write, newline: str | None = None) -> str:
    """``write(f)`` into ``path.PID.tmp``, renamed to ``path`` once whole; returns the absolute path.

    Folders are made; on any failure the temporary file is removed and the error raised, so ``path`` is either
    the complete new file or left as it was.
    """
    path = os.path.abspath(path)
    os.makedirs(os.path.dirname(path), exist_ok=True)
    tmp = f"{path}.{os.getpid()}.tmp"
    try:
        with open(tmp, "w", newline=newline) as f:
            write(f)
        os.replace(tmp, path)
    except BaseException:
        if os.path.lexists(tmp) and not os.path.isdir(tmp):
            os.remove(tmp)
        raise
    return path


def output_problem(path: str, flag: str) -> str | None:
    """Why ``path`` cannot be written as an output file (``flag`` names the option), or None.

    Checked before any work: ``path`` must not be a folder, its nearest existing ancestor must be a folder in
    which a file can be made (tried with a probe file, removed at once: root ignores permission bits, so
    ``os.access`` cannot tell, and /proc refuses new files whatever they say).
    """
    path = os.path.abspath(path)
    if os.path.isdir(path):
        return f"{flag} {path}: is a directory"
    folder = os.path.dirname(path)
    while not os.path.lexists(folder):
        folder = os.path.dirname(folder)
    if not os.path.isdir(folder):
        return f"{flag} {path}: {folder} is not a directory"
    try:
        fd, probe = tempfile.mkstemp(dir=folder, prefix=".pycollect-probe-")
    except OSError as e:
        return f"{flag} {path}: cannot create files in {folder} ({e.strerror})"
    os.close(fd)
    os.remove(probe)
    return None


def physical_memory() -> int | None:
    """Bytes of this machine's memory (None where the system does not say)."""
    try:
        return os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    except (ValueError, OSError, AttributeError):
        return None


def outputs_problem(outputs) -> str | None:
    """Why one of ``outputs`` (``(flag, path)`` pairs; a None path was not asked for) cannot be written, or None.

    Checked before any work, so that nothing is half-written: an empty path, a place ``output_problem`` refuses,
    two flags naming one file (the later would replace the earlier), and a ``--plot`` in a format matplotlib
    does not draw."""
    named: dict[str, str] = {}
    for flag, path in outputs:
        if path is None:
            continue
        problem = f"{flag}: the path is empty; name a file" if not path else output_problem(path, flag)
        if problem:
            return problem
        full = os.path.abspath(path)
        if full in named:
            return f"{named[full]} and {flag} name the same file {full}"
        named[full] = flag
        if flag == "--plot":
            problem = plot_problem(path)
            if problem:
                return problem
    return None


def plot_problem(path: str) -> str | None:
    """Why matplotlib cannot draw ``--plot path`` (not installed, or no format of that suffix), or None."""
    try:
        from matplotlib.backend_bases import FigureCanvasBase
    except ImportError:
        return "--plot needs matplotlib (pip install matplotlib)"
    suffix = os.path.splitext(path)[1][1:].lower()
    if suffix not in FigureCanvasBase.get_supported_filetypes():
        return f"--plot {path}: matplotlib draws no {suffix or 'file without a suffix'}; name a .png"
    return None


def format_table(records: list[dict], columns: list[tuple[str, str, str]]) -> list[str]:
    """Lines of a fixed-width table; ``columns`` are ``(key, title, format)``, e.g. ``("time_us", "time", "{:.1f}")``."""
    cells = [[title for _, title, _ in columns]]
    for r in records:
        cells.append([("" if r.get(k) is None else fmt.format(r[k])) for k, _, fmt in columns])
    widths = [max(len(row[i]) for row in cells) for i in range(len(columns))]
    return ["  ".join(c.rjust(w) for c, w in zip(row, widths)) for row in cells]
