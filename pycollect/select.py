"""Resolve ``algorithm="auto"``: environment override, then a tuning table by message size.

The table maps each collective to rows ``[max_bytes, algorithm]`` tried in order (``null``
max means no limit); the first row whose limit is at least the message size wins. A JSON
file of that shape (``PYCOLLECT_TUNING=path`` or ``Communicator(tuning=path)``), such as
one the benchmark writes, replaces the rows of the collectives it names.
``PYCOLLECT_ALGO_ALLREDUCE=ring`` (one variable per collective) forces a choice.
"""
from __future__ import annotations

import json
import os

from .algorithms import registry
from .engine import environment

KiB, MiB = 1 << 10, 1 << 20
ENV_TUNING = environment.TUNING


def default_table(size: int, multi_node: bool) -> dict[str, list]:
    """The built-in choices, measured with bench/collectives.py on one 2-core host against MPI's regular calls
    (bench/README.md, bench/results/2026-12-0*).

    MPICH's own collectives win on small and mid-size messages, MPI_Alltoall at every size measured, and
    MPI_Allgather but at 2 ranks from 32 KiB to 2 MiB (below). The schedules win on large
    reductions: at 2 ranks the recursive doubling above 8 KiB to 1 MiB, whose one round the allreduce's lean path
    runs straight on MPI (engine/lean_exchange.py: 1.23-2.22x MPI_Allreduce at 16-256 KiB, 1.20-1.26x at 1 MiB,
    bench/results/2026-12-05-allreduce-exchange-2ranks*), and the ring beyond; at more ranks on one node Rabenseifner
    from 8 to 16 MiB and "shm" beyond (below), across nodes the hierarchical allreduce from 256 KiB. At 2 ranks on
    one node the ring reduce-scatter from 32 KiB, its one round straight on MPI to 8 MiB (1.03-1.16x
    MPI_Reduce_scatter_block at 32 KiB, 1.36-1.43x at 64 KiB, 7.2-9.2x at 256 KiB, MPICH's slow spot, 2.2-2.4x at
    64 MiB: bench/results/2026-12-05-reduce-scatter-exchange-2ranks-*), and the ring allgather's one round from
    32 KiB to 2 MiB (one MPI_Sendrecv straight into out: 1.04-1.06x MPI_Allgather at 32 KiB, 1.09-1.85x from
    64 KiB to 2 MiB; MPI's own again from 4 MiB, where the exchange ran 0.86-0.98 of it named:
    bench/results/2026-12-05-allgather-exchange-2ranks-*);
    the reduce-scatter schedules beyond 4 MiB at 2 ranks across nodes and beyond 64 MiB at more, and around
    256 KiB across nodes, where MPICH's MPI_Reduce_scatter_block was 3x slower than at 1 MiB in the runs of
    2026-12-01/02 (kept there; on one node at 4 ranks the recursive halving ran 0.29-0.53 of MPI's call at
    128-512 KiB in three runs of 2026-12-05, bench/README.md, so MPI's own runs there now). With more
    than two ranks on one node the shared-memory window schedules ("shm") win the large allreduce,
    reduce-scatter (from 16-32 MiB); with two, MPICH's single-copy transport (CMA) moves
    each byte once and "shm", which copies into its window first, does not win. Across nodes the
    hierarchical allreduce keeps most bytes on the fast tier. On one node (bench/results/2026-12-02-late-rooted-*):
    the linear gather beats MPI_Gather from 4 MiB at 4 ranks (1.7x) but not at 2 (0.73-1.01 from 16 MiB in three
    quiet runs, bench/results/2026-12-03-*), the linear scatter MPI_Scatter from 4 MiB at 4 ranks (1.3x; 1.86x at
    16 MiB) but not at 2, and the linear scan MPI_Scan from 256 KiB (2x at 1 MiB, 4.5x at 64 MiB). Across nodes
    they were not measured: MPI's own stays. The broadcast is MPI's own everywhere: from 1 MiB its root copies x
    into out while MPI_Ibcast moves x (mpi_native.overlapped_bcast), which beats the scatter_allgather and shm
    schedules out of place and in place at 2 and 4 ranks (bench/results/2026-12-03-bcast-*; the schedules had
    won only against MPI_Bcast after the root's copy). At 2 ranks the binomial reduce beats MPI_Reduce from
    512 KiB (1.16-1.54x to 4 MiB and 1.5-2.0x beyond with glibc keeping MPICH's temporary buffer, 7x from 16 MiB
    without: bench/README.md, "MPI's reductions from 32 MiB").
    """
    table: dict[str, list] = {c: [[None, "mpi"]] for c in registry.COLLECTIVES}
    if size == 2:
        table["allreduce"] = [[8 * KiB, "mpi"], [1 * MiB, "recursive_doubling"], [None, "ring"]]
        table["reduce_scatter"] = [[128 * KiB, "mpi"], [512 * KiB, "ring"], [4 * MiB, "mpi"], [None, "ring"]]
        if not multi_node:   # measured on one node only
            # the ring's one round straight on MPI (engine/lean_exchange.py)
            table["reduce_scatter"] = [[16 * KiB, "mpi"], [None, "ring"]]
            table["allgather"] = [[16 * KiB, "mpi"], [2 * MiB, "ring"], [None, "mpi"]]
            table["reduce"] = [[256 * KiB, "mpi"], [None, "binomial"]]
    if size >= 2 and not multi_node:
        table["scan"] = [[128 * KiB, "mpi"], [None, "linear"]]
    if size > 2 and not multi_node:
        table["gather"] = [[2 * MiB, "mpi"], [None, "linear"]]
        table["scatter"] = [[2 * MiB, "mpi"], [None, "linear"]]
        table["allreduce"] = [[8 * MiB, "mpi"], [16 * MiB, "rabenseifner"], [None, "shm"]]
        table["reduce_scatter"] = [[32 * MiB, "mpi"], [None, "shm"]]
    elif size > 2:
        table["reduce_scatter"] = [[128 * KiB, "mpi"], [512 * KiB, "recursive_halving"], [64 * MiB, "mpi"],
                                   [None, "recursive_halving"]]
    if multi_node:
        table["allreduce"] = [[256 * KiB, "mpi"], [None, "hierarchical"]]
    return table


def nonblocking_rows(size: int, multi_node: bool) -> dict[str, list]:
    """Rows for the non-blocking forms (iallreduce, ireduce_scatter, iallgather) where they differ from the blocking
    ones: at 2 ranks on one node the blocking calls from 16-32 KiB run a one-round schedule straight on MPI (their
    lean paths, engine/lean_exchange.py), which a non-blocking call cannot (its rounds go through the executor, whose
    Python made the recursive doubling 0.52-0.80 of MPI_Iallreduce and the ring reduce-scatter 0.52-0.67 of
    MPI_Ireduce_scatter_block at 16-64 KiB in a one-off timing): these keep the rows measured before."""
    if size == 2 and not multi_node:
        return {"allreduce": [[1 * MiB, "mpi"], [None, "ring"]],
                "reduce_scatter": [[128 * KiB, "mpi"], [512 * KiB, "ring"], [4 * MiB, "mpi"], [None, "ring"]],
                "allgather": [[None, "mpi"]]}
    return {}


def _check_rows(collective: str, rows, source: str) -> list:
    if not isinstance(rows, list) or not rows:
        raise ValueError(f"{source}: {collective} must map to a non-empty list of [max_bytes, algorithm] rows")
    names = registry.algorithms(collective)
    below = -1   # the rows are tried in order: a threshold not above the one before would never be reached
    for i, row in enumerate(rows):
        if (not isinstance(row, (list, tuple)) or len(row) != 2
                or not (row[0] is None or (type(row[0]) is int and row[0] >= 0))):
            raise ValueError(f"{source}: {collective} row {row!r} is not [max_bytes or null, algorithm]")
        if not isinstance(row[1], str) or row[1] not in names or row[1] == "auto":
            raise ValueError(f"{source}: {collective} row {row!r} names unknown algorithm {row[1]!r}; expected one of {', '.join(names[1:])}")
        if (row[0] is None) != (i == len(rows) - 1):
            raise ValueError(f"{source}: {collective} rows must end with a row of max_bytes null, and only the last")
        if row[0] is not None and row[0] <= below:
            raise ValueError(f"{source}: {collective} row {row!r} comes after one of max_bytes {below}: the rows' "
                             "max_bytes must increase (each row takes the sizes up to its own; a later row below "
                             "would never be used)")
        below = -1 if row[0] is None else row[0]
    return [list(r) for r in rows]


def load_tuning(path: str, source: str = ENV_TUNING) -> dict:
    """Read and check a tuning file; every error names ``source`` (the setting that gave the path), the file
    and what is wrong with it."""
    where = f"{source}: tuning file {path!r}"
    try:
        with open(path, "rb") as f:
            raw = f.read()
    except OSError as e:
        raise ValueError(f"{where} cannot be read: {e.strerror or e}") from None
    if not raw.strip():
        raise ValueError(f"{where} is empty; expected a JSON object of collective -> [[max_bytes, algorithm], ...]")
    try:
        data = json.loads(raw.decode("utf-8"))
    except UnicodeDecodeError as e:
        raise ValueError(f"{where} is not UTF-8 text (byte {e.start}: {e.reason})") from None
    except json.JSONDecodeError as e:
        raise ValueError(f"{where} is not valid JSON ({e.msg} at line {e.lineno} column {e.colno})") from None
    table = data.get("table", data) if isinstance(data, dict) else None
    if not isinstance(table, dict):
        raise ValueError(f"{where}: expected a JSON object of collective -> rows")
    for coll in table:
        if coll in registry.ALIASES:
            raise ValueError(f"{where}: {coll} runs {registry.canonical(coll)}'s algorithms: give its rows under "
                             f"{registry.canonical(coll)!r}")
        if coll not in registry.COLLECTIVES:
            raise ValueError(f"{where}: unknown collective {coll!r}")
    return {c: _check_rows(c, rows, where) for c, rows in table.items()}


def env_overrides(environ=os.environ) -> dict:
    """``{collective: algorithm}`` from ``PYCOLLECT_ALGO_<COLLECTIVE>``; unknown names are errors, a variable of no
    collective too (a misspelt one was ignored without a word, as was reduce_scatter_block's)."""
    for var in environ:
        if var.startswith(environment.ALGO_PREFIX) and environ[var] \
                and var[len(environment.ALGO_PREFIX):].lower() not in registry.COLLECTIVES:
            named = var[len(environment.ALGO_PREFIX):].lower()
            why = (f"{named} runs {registry.canonical(named)}'s algorithms: set "
                   f"{environment.ALGO_PREFIX}{registry.canonical(named).upper()}" if named in registry.ALIASES else
                   f"no collective is called {named!r}; expected one of "
                   f"{', '.join(environment.ALGO_PREFIX + c.upper() for c in registry.COLLECTIVES)}")
            raise ValueError(f"{var}: {why}")
    out = {}
    for coll in registry.COLLECTIVES:
        name = environment.algorithm(environment.ALGO_PREFIX + coll.upper(), registry.algorithms(coll), environ)
        if name is not None and name != "auto":
            out[coll] = name
    return out


class Selector:
    """Picks an algorithm per call; built once per communicator so the hot path is a dict lookup."""

    def __init__(self, tuning: str | dict | None = None, environ=os.environ, size: int = 2, multi_node: bool = False,
                 forced: dict | None = None):
        """``tuning``: a file's path, or its rows already read (``load_tuning``); without it ``PYCOLLECT_TUNING``.
        ``forced``: ``{collective: algorithm}`` already read; without it ``PYCOLLECT_ALGO_*``."""
        self.table = default_table(size, multi_node)
        self.nonblocking = nonblocking_rows(size, multi_node)
        if isinstance(tuning, dict):
            given = tuning
        elif tuning or environment.path(ENV_TUNING, environ):
            given = load_tuning(tuning or environ[ENV_TUNING], "tuning" if tuning else ENV_TUNING)
        else:
            given = {}
        self.table.update(given)
        for collective in given:   # a tuning file's rows are both forms'
            self.nonblocking.pop(collective, None)
        self.forced = env_overrides(environ) if forced is None else forced

    def mpi_limit(self, collective: str) -> float:
        """Largest message size for which ``auto`` picks ``"mpi"`` at every size up to it (0 if none)."""
        if collective in self.forced:
            return float("inf") if self.forced[collective] == "mpi" else 0
        limit: float = 0
        for max_bytes, name in self.table[collective]:
            if name != "mpi":
                break
            limit = float("inf") if max_bytes is None else max_bytes
        return limit

    def run_of(self, collective: str, name: str, above: float) -> float:
        """Largest message size up to which ``auto`` picks ``name`` at every size past ``above`` (``above`` itself
        where it picks another just past it)."""
        if collective in self.forced:
            return float("inf") if self.forced[collective] == name else above
        top = above
        for max_bytes, chosen in self.table[collective]:
            if max_bytes is not None and max_bytes <= above:
                continue
            if chosen != name:
                break
            top = float("inf") if max_bytes is None else max_bytes
        return top

    def choose(self, collective: str, nbytes: int, blocking: bool = True) -> str:
        """``auto``'s algorithm for a call of ``nbytes`` (a non-blocking one: ``nonblocking_rows`` where given)."""
        forced = self.forced.get(collective)
        if forced:
            return forced
        rows = self.table[collective] if blocking else self.nonblocking.get(collective, self.table[collective])
        for limit, name in rows:
            if limit is None or nbytes <= limit:
                return name
        raise AssertionError("tables end with an unlimited row")
