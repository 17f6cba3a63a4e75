"""``pycollect bench COLLECTIVE|all``: time a collective over a sweep of sizes, nccl-tests style.

Every rank runs the same command line, for example::

    mpiexec -n 2 python -m pycollect bench allreduce -b 8 -e 64M -f 2 --algorithm all

At each point (collective x dtype x op x size) every algorithm first runs once and is checked
against a NumPy reference (inputs are small integers, so every reduction is exact in every dtype
and every order; wrong elements are summed over ranks), then is timed: warmup calls, a barrier,
``iters`` back-to-back blocking calls; ``trials`` repeat that with the algorithms interleaved and
each keeps its best trial. Every point runs out of place and, where the collective has an in-place
form (``INPLACE_FORMS``; MPI's baseline then passes ``MPI_IN_PLACE``), in place; the table shows both side by
side (``sweep_output``). A call's time is each rank's mean
taken across ranks as ``-a`` says (nccl-tests' 0 rank 0, 1 average, 2 minimum, 3 maximum; the JSON keeps
all four, and min/p50/p99/max of the single calls); algbw = size / time and busbw = algbw x
nccl-tests' factor. With several algorithms MPI's own (``mpi``) is always timed too and ``vs_mpi`` =
mpi time / time. Any wrong element makes the exit status 1 on every rank, after the outputs are written.

``bench/collectives.py`` is a thin wrapper over the same functions (``Settings`` and ``execute``).
"""
from __future__ import annotations

import argparse
import dataclasses
import importlib.util
import math
import sys
import time

import numpy as np

from ..engine.shapes import bus_factor
from . import report, sweep_output
from .common import (agree_command_line, allgather_json, backend, bcast_json, communicator, gather_json, int_at_least,
                     size_arg, size_sweep)

COLLECTIVES = ("allreduce", "reduce_scatter", "allgather", "alltoall", "broadcast", "reduce", "gather", "scatter",
               "scan", "sendrecv")
REDUCING = ("allreduce", "reduce_scatter", "reduce", "scan")
# How each collective runs in place, as nccl-tests and MPI_IN_PLACE have it (sendrecv has no such form: pycollect
# has no counterpart of MPI_Sendrecv_replace, so it runs out of place and its title line says so).
INPLACE_FORMS = {"allreduce": "out=x", "alltoall": "out=x", "broadcast": "out=x",
                 "reduce": "out=x on the root",
                 "reduce_scatter": "out=x's block rank (MPI_IN_PLACE leaves MPI's result at the start of x)",
                 "allgather": "x=out's block rank", "gather": "x=out's block root on the root",
                 "scatter": "out=x's block root on the root", "scan": "out=x"}
INPLACE = tuple(INPLACE_FORMS)                            # collectives that run in place
ROOTED = ("broadcast", "reduce", "gather", "scatter")     # always root 0
SPLIT = ("reduce_scatter", "allgather", "alltoall", "gather", "scatter")   # even blocks: a multiple of n elements
SENDRECV_ALGORITHMS = ("auto", "mpi")                     # auto: pycollect's isend/irecv; mpi: MPI_Sendrecv
NCCL_DTYPES = ("int8", "uint8", "int32", "uint32", "int64", "uint64", "float16", "float32", "float64", "bfloat16")
DTYPES = NCCL_DTYPES + ("int16", "uint16", "complex64", "complex128")
DTYPE_ALIASES = {"char": "int8", "int": "int32", "half": "float16", "float": "float32", "double": "float64"}  # nccl-tests'
PLACEMENTS = {"both": ("out", "in"), "out": ("out",), "in": ("in",)}
ACROSS_RANKS = ("rank0", "avg", "min", "max")           # -a 0..3, as nccl-tests numbers them
ALL_OPS = ("sum", "prod", "min", "max", "avg")
OPS = ALL_OPS + ("band", "bor", "bxor")
BACKENDS = ("numpy", "cupy")
PERIOD = 61   # inputs repeat with this period, so references are computed on one period
ROW_KEYS = ["collective", "size_bytes", "nominal_bytes", "count", "dtype", "op", "root", "inplace", "backend",
            "algorithm", "resolved", "mpi_call", "iters", "time_across", "time_us", "time_us_rank0", "time_us_min",
            "time_us_avg", "time_us_max", "iter_us_min", "iter_us_p50", "iter_us_p99", "iter_us_max",
            "algbw_GBps", "busbw_GBps", "vs_mpi", "wrong", "copy_us", "copy_GBps", "busbw_vs_copy", "faults_per_call"]
COPY_FROM = 1 << 20   # allreduce sizes from which the sweep also times every rank copying its input at once


@dataclasses.dataclass
class Settings:
    """What a sweep runs; the command line's flags, as data."""
    collectives: list[str]
    sizes: list[int]                       # nominal bytes
    dtypes: list[str] = dataclasses.field(default_factory=lambda: ["float32"])
    ops: list[str] = dataclasses.field(default_factory=lambda: ["sum"])
    algorithm: str = "auto"                # a name, a comma list, or "all"
    iters: int = 20                        # timed calls per point (the most, when seconds is set)
    warmup: int = 5
    trials: int = 1
    check: bool = True
    placements: tuple[str, ...] = ("out", "in")   # out of place, in place (where the collective has it)
    time_across: str = "avg"               # one of ACROSS_RANKS: how each rank's mean becomes the call's time
    backend: str = "numpy"
    seconds: float | None = None           # aim for this much timed work per point (None: always iters)
    shared: bool = False                   # inputs and results in memory the node's ranks share (shared_empty)
    baseline: bool | None = None           # time "mpi" too (None: when more than one algorithm is asked)


@dataclasses.dataclass
class Outputs:
    json: str | None = None
    csv: str | None = None
    plot: str | None = None
    progress: bool | None = None           # None: a bar when stderr is a terminal and the sweep is long


@dataclasses.dataclass(frozen=True)
class Block:
    """One collective x dtype x op and the algorithms run at each of its sizes ("mpi" first)."""
    collective: str
    dtype: str
    op: str | None
    algorithms: tuple[str, ...]


# -- command line -------------------------------------------------------------------------------------
DEFAULT_MIN_BYTES, DEFAULT_MAX_BYTES = 8, 64 * report.MiB


def add_arguments(parser) -> None:
    """nccl-tests' flags (``-b -e -f -n -w -c -o -d -a``), OSU's aliases (``-m -i -x``) and pycollect's own."""
    size = size_arg
    parser.add_argument("-b", "--min-bytes", type=size, metavar="SIZE", help="smallest size (default 8)")
    parser.add_argument("-e", "--max-bytes", type=size, metavar="SIZE",
                        help="largest size (default 64M; K, M, G are binary)")
    parser.add_argument("-m", "--message-size", type=size_range, metavar="[MIN:]MAX",
                        help="OSU's spelling of -b and -e: 1K:64K, 64K (the largest only) or 1K: (the smallest only)")
    parser.add_argument("-f", "--step-factor", type=int_at_least(2), default=2, metavar="F",
                        help="ratio between sizes (default 2)")
    parser.add_argument("-n", "-i", "--iters", type=int_at_least(1), default=20,
                        help="timed calls per point (default 20; -i is OSU's name)")
    parser.add_argument("-w", "-x", "--warmup", type=int_at_least(0), default=5,
                        help="untimed calls first (default 5; -x is OSU's name)")
    parser.add_argument("-c", "--check", type=int, choices=(0, 1), default=1,
                        help="1: check every result against a NumPy reference (default); 0: time only")
    parser.add_argument("-a", "--average", type=int, choices=range(len(ACROSS_RANKS)), default=1, metavar="0|1|2|3",
                        help="a call's time from the ranks' means: 0 rank 0, 1 average (default), 2 minimum, "
                             "3 maximum (nccl-tests' -a; the JSON keeps all four)")
    parser.add_argument("-o", "--op", type=_choice_list(OPS, ALL_OPS, "op"), default=["sum"], metavar="OP",
                        help=f"reduction of allreduce, reduce_scatter, reduce and scan: {', '.join(OPS)}, a comma list, "
                             "or all (sum,prod,min,max,avg); default sum")
    parser.add_argument("-d", "--dtype", type=_choice_list(DTYPES, NCCL_DTYPES, "dtype", DTYPE_ALIASES),
                        default=["float32"], metavar="DTYPE",
                        help=f"{', '.join(DTYPES)}; nccl-tests' names too (float is float32: "
                             f"{', '.join(f'{k}={v}' for k, v in DTYPE_ALIASES.items())}); a comma list, "
                             "or all (nccl-tests' ten); default float32")
    parser.add_argument("--algorithm", type=_algorithm_spec, default="auto", metavar="NAME",
                        help="auto (default), a name, a comma list, or all; with more than one, MPI's own "
                             "(mpi) is timed too and a vs-mpi column compares with it")
    parser.add_argument("--backend", choices=BACKENDS, default="numpy", help="array module of the buffers")
    parser.add_argument("--placement", choices=tuple(PLACEMENTS), default="both",
                        help="both (default, as nccl-tests): out of place and in place side by side (out=x; reduce: "
                             "out=x on the root; reduce_scatter: out=x's block rank; allgather: x=out's block rank; "
                             "MPI's baseline with MPI_IN_PLACE); sendrecv has no in-place form and runs out of place")
    parser.add_argument("--inplace", dest="placement", action="store_const", const="in",
                        help="in place only (--placement in)")
    parser.add_argument("--shared", action="store_true",
                        help="inputs and results in shared memory (Communicator.shared_empty), for every algorithm and "
                             "MPI's own; the shm schedules read inputs where they lie, and the shm allreduce writes "
                             "its sums straight into every rank's result")
    parser.add_argument("--trials", type=int_at_least(1), default=1,
                        help="interleaved timing trials per point; each algorithm keeps its best (default 1)")
    parser.add_argument("--json", metavar="FILE", help="write the records (pycollect.bench/1, kind sweep)")
    parser.add_argument("--csv", metavar="FILE", help="write the records as CSV (same keys as the JSON)")
    parser.add_argument("--plot", metavar="FILE.png",
                        help="per collective, latency (log scale, up to 1M) beside busbw against size")
    parser.add_argument("--progress", action="store_true", help="always show a progress bar on stderr")
    parser.set_defaults(_sweep_parser=parser)
    _refuse_together(parser)


def _refuse_together(parser) -> None:
    """Make ``parser``'s errors after parsing (``run``'s checks: a combination of flags, a size above this
    machine's memory, which may differ between nodes) end every rank of a launched job: the refusing rank takes
    part in the agreement the others hold before any timing (``agree_command_line`` in ``_execute``), then
    writes its line and exits 2. Errors while parsing are ``cli.main``'s (it agrees the command lines first)."""
    plain = parser.error

    def error(message):
        if getattr(parser, "_parsed", False):
            from mpi4py import MPI
            if MPI.COMM_WORLD.Get_size() > 1:
                agree_command_line(MPI.COMM_WORLD, None, error=message)
        plain(message)

    parser.error = error


def size_range(text: str) -> tuple[int | None, int | None]:
    """argparse type of OSU's ``-m``: ``MIN:MAX``, ``MAX`` or ``MIN:`` -> (min or None, max or None)."""
    low, colon, high = text.partition(":")
    if not colon:
        low, high = "", low
    if not (low or high):
        raise argparse.ArgumentTypeError(f"not a size range: {text!r} (examples: 1K:64K, 64K, 1K:)")
    return (size_arg(low) if low else None), (size_arg(high) if high else None)


def _choice_list(choices, everything, what, aliases=None):
    aliases = aliases or {}

    def convert(text):
        if text == "all":
            return list(everything)
        names = [aliases.get(t, t) for t in text.split(",") if t]
        bad = [t for t in names if t not in choices]
        if bad or not names:
            known = ", ".join(list(choices) + list(aliases))
            raise argparse.ArgumentTypeError(f"unknown {what} {','.join(bad) or repr(text)}; "
                                             f"expected one of {known}, a comma list, or all")
        return list(dict.fromkeys(names))
    return convert


def known_algorithms(collective: str) -> tuple[str, ...]:
    """Names ``--algorithm`` accepts for ``collective`` (``auto`` and ``mpi`` included)."""
    if collective == "sendrecv":
        return SENDRECV_ALGORITHMS
    import pycollect
    return pycollect.algorithms(collective)


def _algorithm_spec(text: str) -> str:
    if text == "all":
        return text
    known = sorted({a for c in COLLECTIVES for a in known_algorithms(c)})
    names = [a for a in text.split(",") if a]
    bad = [a for a in names if a not in known]
    if bad or not names:
        raise argparse.ArgumentTypeError(f"unknown algorithm {','.join(bad) or repr(text)}; "
                                         f"expected one of {', '.join(known)}, a comma list, or all")
    return ",".join(dict.fromkeys(names))


def size_bounds(args) -> tuple[int, int]:
    """(smallest, largest) from -b/-e or OSU's -m (one source per bound: naming both is an error)."""
    low, high = args.message_size or (None, None)
    if low is not None and args.min_bytes is not None:
        args._sweep_parser.error("-m/--message-size names the smallest size; drop -b/--min-bytes or give MAX only")
    if high is not None and args.max_bytes is not None:
        args._sweep_parser.error("-m/--message-size names the largest size; drop -e/--max-bytes or give MIN: only")
    low = next(v for v in (low, args.min_bytes, DEFAULT_MIN_BYTES) if v is not None)
    high = next(v for v in (high, args.max_bytes, DEFAULT_MAX_BYTES) if v is not None)
    if low > high:
        args._sweep_parser.error(f"--min-bytes {low} is above --max-bytes {high}")
    return low, high


def settings_of(args) -> Settings:
    """The ``Settings`` of parsed ``pycollect bench`` flags (a bad combination is a parser error)."""
    parser = args._sweep_parser
    low, high = size_bounds(args)
    collectives = list(COLLECTIVES) if args.target == "all" else [args.target]
    if args.target != "all" and args.algorithm != "all":
        lacking = [a for a in args.algorithm.split(",") if a not in known_algorithms(args.target)]
        if lacking:
            parser.error(f"--algorithm: {args.target} has no {', '.join(lacking)}; expected one of "
                         f"{', '.join(known_algorithms(args.target))}, or all")
    if args.shared and args.backend != "numpy":
        parser.error(f"--shared: shared memory holds host arrays; it cannot go with --backend {args.backend}")
    memory = report.physical_memory()
    if memory is not None and high > memory:
        flag = "-e/--max-bytes" if args.max_bytes is not None else "-m/--message-size"
        parser.error(f"{flag} {report.human_size(high)}: above this machine's memory ({memory / report.GiB:.1f} "
                     "GiB), and every rank holds buffers of the largest size")
    return Settings(collectives=collectives, sizes=size_sweep(low, high, args.step_factor), dtypes=args.dtype,
                    ops=args.op, algorithm=args.algorithm, iters=args.iters, warmup=args.warmup, trials=args.trials,
                    check=bool(args.check), placements=PLACEMENTS[args.placement],
                    time_across=ACROSS_RANKS[args.average], backend=args.backend, shared=args.shared)


def run(args) -> int:
    """``pycollect bench TARGET`` (every rank): check the flags, then ``execute`` (which first agrees them across
    ranks; an error here takes part in that agreement through ``_refuse_together``)."""
    parser = args._sweep_parser
    parser._parsed = True
    if args.plot and importlib.util.find_spec("matplotlib") is None:
        parser.error("--plot needs matplotlib (pip install matplotlib)")
    settings = settings_of(args)
    blocks, notes = plan(settings)
    if not blocks:
        parser.error("nothing to run: " + "; ".join(notes))
    outputs = Outputs(json=args.json, csv=args.csv, plot=args.plot, progress=True if args.progress else None)
    return execute(settings, outputs, blocks, notes)


# -- what runs ------------------------------------------------------------------------------------------
def np_dtype(name: str) -> np.dtype:
    if name == "bfloat16":
        import ml_dtypes
        return np.dtype(ml_dtypes.bfloat16)
    return np.dtype(name)


def algorithm_list(collective: str, spec: str, baseline: bool | None = None) -> list[str]:
    """The algorithms of ``spec`` that ``collective`` has; "mpi" first when comparing (several, or ``baseline``)."""
    known = known_algorithms(collective)
    asked = list(known) if spec == "all" else spec.split(",")
    names = [a for a in asked if a in known]
    if not names:
        return []
    compare = (spec == "all" or len(asked) > 1) if baseline is None else baseline
    if compare or "mpi" in names:
        names = ["mpi"] + [a for a in names if a != "mpi"]
    return names


def plan(s: Settings) -> tuple[list[Block], list[str]]:
    """The blocks to run and notes on what is skipped (an op a dtype lacks, no MPI baseline for bfloat16)."""
    from ..engine import mpi_native, ops
    blocks, notes = [], []
    for collective in s.collectives:
        names = algorithm_list(collective, s.algorithm, s.baseline)
        ops_of = [op for op in s.ops if not (collective == "scan" and op == "avg")]   # MPI_Scan has no average
        if collective == "scan" and len(ops_of) < len(s.ops):
            notes.append("scan: op 'avg' has no prefix form (MPI has none); skipped")
        if not names:
            notes.append(f"{collective}: has no algorithm {s.algorithm}; skipped")
            continue
        for dtype in s.dtypes:
            algs = list(names)
            if "mpi" in algs and collective != "sendrecv" and not mpi_native.supports(np_dtype(dtype)):
                algs.remove("mpi")    # sendrecv's mpi moves bytes; MPI has no bfloat16, float16 only from MPI 4 on
                note = f"{dtype}: MPI's own collectives take no {dtype}; no mpi baseline"
                notes += [note] if note not in notes else []
            if not algs:
                continue
            for op in (ops_of if collective in REDUCING else [None]):
                if op is not None:
                    try:
                        ops.check_op(op, np_dtype(dtype), collective)
                    except (ValueError, TypeError) as e:
                        notes.append(f"{e}; skipped")
                        continue
                blocks.append(Block(collective, dtype, op, tuple(algs)))
    return blocks, notes


# -- sizes, inputs and references ---------------------------------------------------------------------
def element_count(collective: str, nbytes: int, itemsize: int, n: int) -> int:
    """Elements of the sized buffer; split collectives round down to a multiple of n (at least n)."""
    count = max(1, nbytes // itemsize)
    return max(n, count // n * n) if collective in SPLIT else count


@dataclasses.dataclass(frozen=True)
class Point:
    """One measured point on one rank: the collective, its element count and where this rank stands."""
    collective: str
    dtype: np.dtype
    op: str | None
    count: int          # elements of the sized buffer (see element_count)
    rank: int
    size: int
    inplace: bool = False
    root: int = 0

    @property
    def input_count(self) -> int:
        """Elements of x: a block for allgather and gather, none off scatter's root (MPI reads no send buffer there)."""
        if self.collective == "scatter" and self.rank != self.root:
            return 0
        return self.count // self.size if self.collective in ("allgather", "gather") else self.count

    @property
    def output_count(self) -> int:
        return self.count // self.size if self.collective in ("reduce_scatter", "scatter") else self.count

    def peers(self) -> tuple[int, int]:
        """sendrecv's (dest, source): pairs r <-> r^1 at an even world size, else a ring shift r -> r+1."""
        if self.size % 2 == 0:
            return self.rank ^ 1, self.rank ^ 1
        return (self.rank + 1) % self.size, (self.rank - 1) % self.size


def value_limit(dtype: np.dtype, op: str | None, n: int) -> int:
    """Largest input value: sums of n of them stay exact integers in ``dtype``; at most 60."""
    if op not in ("sum", "avg"):
        return 60
    if dtype.kind in "iu":
        exact = int(np.iinfo(dtype).max)
    else:
        import ml_dtypes
        real = np.dtype(dtype.char.lower()) if dtype.kind == "c" else dtype
        exact = 2 ** (int(ml_dtypes.finfo(real).nmant) + 1)
    return max(1, min(60, exact // n))


def period(point: Point, rank: int) -> np.ndarray:
    """One period of ``rank``'s input: integers 0..limit, or 1 and 2 for prod (exact in every order)."""
    base = (np.arange(PERIOD) * 7 + rank * 13) % PERIOD
    if point.op == "prod":
        values = np.where(base % 3 == 0, 2, 1)
    else:
        values = base % (value_limit(point.dtype, point.op, point.size) + 1)
    return values.astype(point.dtype)


def _stretch(one_period: np.ndarray, start: int, stop: int) -> np.ndarray:
    """Elements ``start:stop`` of the periodic sequence."""
    return np.resize(np.roll(one_period, -(start % PERIOD)), max(0, stop - start))


def rank_input(point: Point) -> np.ndarray:
    return _stretch(period(point, point.rank), 0, point.input_count)


def _average(total: np.ndarray, n: int) -> np.ndarray:
    """``op="avg"``'s result computed apart from the library's (the check must not share the code it checks):
    integers toward zero in Python's integers, floats divided in their own dtype, complex part by part."""
    if total.dtype.kind in "iu":
        return np.array([-(-v // n) if v < 0 else v // n for v in total.tolist()], total.dtype)
    for part in (total.real, total.imag) if total.dtype.kind == "c" else (total,):
        part[...] = np.true_divide(part, np.asarray(n, part.dtype))
    return total


def expected(point: Point) -> np.ndarray | None:
    """This rank's correct result from every rank's input, with NumPy (None off the root of reduce)."""
    c, n, r = point.collective, point.size, point.rank
    if c in REDUCING:
        if c == "reduce" and r != point.root:
            return None
        from ..engine import ops
        assert point.op is not None   # a reducing collective's point has its op
        combine = ops.ufunc(point.op, np)
        total = period(point, 0)
        for other in range(1, r + 1 if c == "scan" else n):   # a scan: the prefix of ranks 0..r
            total = combine(total, period(point, other))
        if point.op == "avg":
            total = _average(total, n)
        start = r * (point.count // n) if c == "reduce_scatter" else 0
        return _stretch(total, start, start + point.output_count)
    if c == "broadcast":
        return _stretch(period(point, point.root), 0, point.count)
    if c == "sendrecv":
        return _stretch(period(point, point.peers()[1]), 0, point.count)
    block = point.count // n
    if c == "scatter":
        return _stretch(period(point, point.root), r * block, (r + 1) * block)
    if c == "gather" and r != point.root:
        return None
    if c in ("allgather", "gather"):
        return np.concatenate([_stretch(period(point, other), 0, block) for other in range(n)])
    return np.concatenate([_stretch(period(point, other), r * block, (r + 1) * block) for other in range(n)])


def sentinel(dtype: np.dtype):
    """What an unwritten element holds: NaN, or a value no exact result takes."""
    if dtype.kind in "iu":
        return -1 if dtype.kind == "i" else int(np.iinfo(dtype).max)
    return np.nan


# -- array backend -------------------------------------------------------------------------------------
def stream_sync(xp):
    """``sync()``: wait for the device work queued on the current stream (nothing to wait for on NumPy)."""
    if xp is np:
        return lambda: None
    return xp.cuda.get_current_stream().synchronize


def to_host(a) -> np.ndarray:
    return a if isinstance(a, np.ndarray) else a.get()


def device_info(xp) -> dict:
    if xp is np:
        return {}
    dev = xp.cuda.Device()
    name = xp.cuda.runtime.getDeviceProperties(dev.id)["name"]
    return {"cupy": xp.__version__, "device": dev.id,
            "device_name": name.decode() if isinstance(name, bytes) else str(name),
            "cuda_runtime": xp.cuda.runtime.runtimeGetVersion()}


# -- one point -------------------------------------------------------------------------------------------
def buffers(point: Point, xp, comm=None):
    """(x, out): this rank's input and the output buffer (None off reduce's root); with ``comm``, the input and,
    out of place, the output lie in the node's shared memory (``comm.shared_empty``, collective: every rank makes
    as many, one in place and two out of place, an empty one where it has no output).

    In place (INPLACE_FORMS): ``out`` is ``x``, except reduce_scatter's and scatter's on the root (``x``'s block
    ``rank``, where nccl-tests and MPI_IN_PLACE have it) and allgather's and gather's on the root (``x`` is
    ``out``'s block ``rank``, as MPI_IN_PLACE has it); off the root a gather or scatter runs as out of place.
    """
    c, elsewhere = point.collective, point.rank != point.root and point.collective in ("gather", "scatter")
    if point.inplace and c in ("allgather", "gather") and not elsewhere:
        out = _allocate(point.output_count, point.dtype, xp, comm)
        x = own_block(out, point)
        fill_input(point, x, out, xp)
        return x, out
    x = _allocate(point.input_count, point.dtype, xp, comm)
    fill_input(point, x, None, xp)
    if point.inplace and not elsewhere:
        return x, (own_block(x, point) if c in ("reduce_scatter", "scatter") else x)
    none = c in ("reduce", "gather") and point.rank != point.root
    if point.inplace:   # off the root of an in-place gather or scatter: out of place, beside the root's one window
        return x, None if none else xp.empty(point.output_count, point.dtype)
    out = _allocate(0 if none else point.output_count, point.dtype, xp, comm)
    return x, None if none else out


def _allocate(count: int, dtype, xp, comm):
    return xp.empty(count, dtype) if comm is None else comm.shared_empty((count,), dtype)


def own_block(a, point: Point):
    """This rank's block of ``a`` (the sweep's blocks are even): where an in-place allgather's input lies and an
    in-place reduce_scatter's result lands."""
    block = point.count // point.size
    return a[point.rank * block:(point.rank + 1) * block]


def fill_input(point: Point, x, out, xp) -> None:
    """This rank's input into ``x``; ``out`` (an in-place allgather's, which holds ``x``) first to the sentinel,
    so that a block left unwritten shows."""
    if out is not None:
        out.fill(sentinel(point.dtype))
    x[...] = xp.asarray(rank_input(point))


def caller(comm, point: Point, x, out, raw=None):
    """``run(algorithm)``: one blocking call on ``x`` into ``out``, returning its result; ``raw`` is a duplicate of
    the world on which "mpi" (the baseline) calls MPI itself, as a user of MPI would (NumPy buffers)."""
    if point.collective == "sendrecv":
        return _sendrecv(comm, point, x, out, raw)
    baseline = mpi_baseline(raw, point, x, out) if raw is not None and isinstance(x, np.ndarray) else None
    run = _pycollect(comm, point, x, out)
    if baseline is None:
        return run
    return lambda algorithm: baseline() if algorithm == "mpi" else run(algorithm)


def _pycollect(comm, point: Point, x, out):
    c, op = point.collective, point.op
    method = getattr(comm, c)
    if c in ("allreduce", "reduce_scatter", "scan"):
        return lambda algorithm: method(x, op=op, algorithm=algorithm, out=out)
    if c in ("gather", "scatter"):   # the blocks given, as MPI_Gather's and MPI_Scatter's counts are: no exchange
        rows = [point.count // point.size] * point.size
        return lambda algorithm: method(x, root=point.root, algorithm=algorithm, out=out, counts=rows)
    if c == "allgather":   # likewise MPI_Allgather's recvcount (without counts the ranks' rows are exchanged first)
        rows = [point.count // point.size] * point.size
        return lambda algorithm: method(x, algorithm=algorithm, out=out, counts=rows)
    if c == "reduce":
        return lambda algorithm: method(x, root=point.root, op=op, algorithm=algorithm, out=out)
    if c == "broadcast":
        return lambda algorithm: method(x, root=point.root, algorithm=algorithm, out=out)
    return lambda algorithm: method(x, algorithm=algorithm, out=out)


def mpi_baseline(raw, point: Point, x, out):
    """MPI's own call on the same buffers, the call a user of MPI would make: the regular collective (the sweep's
    blocks are even), ``MPI_IN_PLACE`` in place, the division of ``avg`` after a sum; None where MPI has no such
    call (float16, bfloat16). The call returns where its result lies (None off reduce's root)."""
    from ..engine import mpi_native, ops
    if not mpi_native.supports(point.dtype):
        return None
    call = _mpi_call(raw, point, x, out)
    if point.op != "avg":
        return call

    def averaged():
        got = call()
        if got is not None:
            ops.finish_avg(got, point.size)
        return got
    return averaged


def _mpi_call(raw, point: Point, x, out):
    """MPI's call, returning the array it leaves its result in; ``MPI_IN_PLACE`` as the standard defines it."""
    from mpi4py import MPI

    from ..engine import mpi_native
    c, op, root, at_root = point.collective, mpi_native.mpi_op(point.op or "sum"), point.root, point.rank == point.root
    send = MPI.IN_PLACE if point.inplace else x
    if c == "reduce_scatter" and point.inplace:   # MPI reads x and leaves the result at its start
        return _returning(lambda: raw.Reduce_scatter_block(MPI.IN_PLACE, x, op), x[:point.output_count])
    if c == "reduce" and not at_root:   # the receive buffer (and MPI_IN_PLACE) matters on the root only
        return _returning(lambda: raw.Reduce(x, None, op, root=root), None)
    if c == "broadcast":
        buf = out if out is not None else x
        bcast = _returning(lambda: raw.Bcast(buf, root=root), buf)
        # out= on the root holds x's data, as pycollect's does
        return _copied_then(buf, x, bcast) if buf is not x and at_root else bcast
    if c == "gather":
        return _returning(lambda: raw.Gather(send if at_root else x, out, root=root), out)
    if c == "scatter":   # MPI_IN_PLACE as the root's receive buffer: its block stays where it lies in x
        return _returning(lambda: raw.Scatter(x if at_root else None, MPI.IN_PLACE if point.inplace and at_root
                                              else out, root=root), out)
    calls = {"allreduce": lambda: raw.Allreduce(send, out, op),
             "reduce_scatter": lambda: raw.Reduce_scatter_block(x, out, op),
             "allgather": lambda: raw.Allgather(send, out),
             "alltoall": lambda: raw.Alltoall(send, out),
             "reduce": lambda: raw.Reduce(send, out, op, root=root), "scan": lambda: raw.Scan(send, out, op)}
    return _returning(calls[c], out)


def _returning(call, result):
    def run():
        call()
        return result
    return run


def _copied_then(out, x, call):
    def run():
        out[...] = x
        return call()
    return run


def baseline_name(collective: str) -> str:
    """``MPI_Allgather``: the call the "mpi" rows time (sendrecv: ``MPI_Sendrecv``)."""
    from ..engine import mpi_native
    return "MPI_Sendrecv" if collective == "sendrecv" else "MPI_" + mpi_native.mpi_call(collective, even=True)


def _sendrecv(comm, point: Point, x, out, raw):
    """auto: pycollect's irecv + isend; mpi: ``MPI_Sendrecv`` (through host copies if MPI cannot take device memory)."""
    from ..engine.backend import array_module as module_of, byte_view
    dest, source = point.peers()
    xp = module_of(x)
    staging = comm.stages_through_host(xp)

    def run(algorithm):
        if algorithm == "mpi":
            send = byte_view(to_host(x) if staging else x, np if staging else xp)
            recv = np.empty(out.nbytes, np.uint8) if staging else byte_view(out, xp)
            if xp is not np:
                xp.cuda.get_current_stream().synchronize()
            raw.Sendrecv(send, dest, 0, recv, source, 0)
            if staging:
                out[...] = xp.asarray(recv.view(out.dtype))
            return out
        req = comm.irecv(out, source, tag=1)
        comm.isend(x, dest, tag=1).wait()
        return req.wait()
    return run


def check(world, point: Point, run, x, out, algorithms, xp) -> dict[str, int]:
    """Wrong elements per algorithm (summed over ranks): each runs once, from the input, against NumPy, and is read
    where it says its result lies (MPI's in-place reduce-scatter leaves it elsewhere than pycollect's). Out of
    place, each element of ``x`` the call changed counts as wrong too, and ``x`` is filled again for the next one
    (an input clobbered by one algorithm was blamed on the next)."""
    from mpi4py import MPI
    ref = expected(point)
    given = None if point.inplace else rank_input(point)
    wrong = np.zeros(len(algorithms), np.int64)
    for i, algorithm in enumerate(algorithms):
        if point.inplace:
            fill_input(point, x, out if point.collective in ("allgather", "gather") else None, xp)
        else:
            x[...] = xp.asarray(given)
        if out is not None and not xp.may_share_memory(out, x):   # off the root of an in-place scatter too
            out.fill(sentinel(point.dtype))
        got = run(algorithm)
        # pycollect's calls return out itself: a result handed back elsewhere, out left as it was, is wrong
        # (MPI's baseline returns where the standard leaves it: an in-place reduce-scatter's at x's start)
        elsewhere = algorithm != "mpi" and out is not None and got is not None and not xp.may_share_memory(got, out)
        if ref is not None:
            wrong[i] = ref.size if got is None or elsewhere else np.count_nonzero(to_host(got) != ref)
        if given is not None:
            wrong[i] += np.count_nonzero(to_host(x) != given)
    world.Allreduce(MPI.IN_PLACE, wrong, op=MPI.SUM)
    return {a: int(w) for a, w in zip(algorithms, wrong)}


def choose_iters(world, run, algorithm, s: Settings, sync=lambda: None) -> int:
    """Warm up; then ``s.iters``, or with ``s.seconds`` as many calls as fill it (3..iters, rank 0 decides)."""
    fastest = math.inf
    for _ in range(s.warmup if s.seconds is None else max(1, s.warmup)):
        t0 = time.perf_counter()
        run(algorithm)
        sync()
        fastest = min(fastest, time.perf_counter() - t0)
    if s.seconds is None:
        return s.iters
    iters = min(s.iters, max(3, math.ceil(s.seconds / max(fastest, 1e-9))))
    return bcast_json(world, iters)


@dataclasses.dataclass
class Timing:
    """One timed run of ``iters`` calls, on rank 0: each rank's mean seconds per call (rank order), and each
    call's seconds as the slowest rank saw it (a call is done when every rank is done with it)."""
    means: list[float]
    calls: np.ndarray      # (iters,)
    faults: list[float] = dataclasses.field(default_factory=list)   # each rank's minor page faults per call

    def faults_per_call(self) -> float | None:
        """The most minor page faults per call any rank took in both halves of the loop: fresh memory touched on
        every call (e.g. a temporary buffer past glibc's mmap threshold, mapped anew and faulted in page by page),
        not a one-off burst, which lands in one half (``time_calls`` keeps each rank's smaller half)."""
        return max(self.faults) if self.faults else None

    def across(self, how: str) -> float:
        """The ranks' means as one time: ``rank0``, ``avg``, ``min`` or ``max`` (ACROSS_RANKS)."""
        return {"rank0": self.means[0], "avg": sum(self.means) / len(self.means),
                "min": min(self.means), "max": max(self.means)}[how]


def time_calls(world, run, algorithm, iters, sync=lambda: None) -> Timing | None:
    """Time ``iters`` back-to-back calls on every rank; the ``Timing`` on rank 0 (None elsewhere).

    ``sync()`` runs before the barrier and before the clock stops, so device work is counted in the mean; the
    single calls are stamped on the host as each returns (no sync between them, which would slow the loop).
    """
    from mpi4py import MPI
    sync()
    world.Barrier()
    stamps = np.empty(iters + 1)
    half = iters // 2
    faults = [minor_faults()]
    stamps[0] = time.perf_counter()
    for i in range(iters):
        if i == half and half:   # the faults of each half: a one-off burst lands in one (its time counted)
            faults.append(minor_faults())
        run(algorithm)
        stamps[i + 1] = time.perf_counter()
    sync()
    mean = (time.perf_counter() - stamps[0]) / iters
    faults.append(minor_faults())
    calls_per_part = [half, iters - half] if half else [iters]
    fault_rate = min((b - a) / n for a, b, n in zip(faults, faults[1:], calls_per_part))
    calls = np.diff(stamps)
    slowest = np.empty_like(calls) if world.rank == 0 else None
    world.Reduce(calls, slowest, op=MPI.MAX, root=0)
    ranks = gather_json(world, [mean, fault_rate])
    if world.rank != 0:
        return None
    assert ranks is not None and slowest is not None   # rank 0 is the root of both
    return Timing([m for m, _ in ranks], slowest, [f for _, f in ranks])


def minor_faults() -> int:
    """This process's minor page faults so far (getrusage's ru_minflt)."""
    import resource
    return resource.getrusage(resource.RUSAGE_SELF).ru_minflt


def measure(world, comm, point: Point, nominal: int, algorithms, s: Settings, xp=np, raw=None) -> list[dict]:
    """Check, then time, every algorithm at one point; rows (times on rank 0 only). Beside MPI's baseline, a large
    out-of-place allreduce also times every rank copying its input at once (``copy_us``): the memory bandwidth a
    rank gets while all copy, which bounds what any allreduce can reach here (issue 14's last target)."""
    x, out = buffers(point, xp, comm if s.shared else None)
    run = caller(comm, point, x, out, raw)
    sync = stream_sync(xp)
    first = check(world, point, run, x, out, algorithms, xp) if s.check else None
    timed = list(algorithms)
    if raw is not None and xp is np and point.collective == "allreduce" and not point.inplace and nominal >= COPY_FROM:
        run, timed = _with_copy(run, x), timed + ["copy"]
    best: dict[str, Timing | None] = dict.fromkeys(timed)
    with np.errstate(all="ignore"):   # in place, repeated sums and products overflow (as in nccl-tests)
        # one count for every algorithm at a point (nccl-tests' one -n): the fewest that any one's fastest warmup
        # call allows, so that every best-of-trials is a best over as many calls
        fewest = min(choose_iters(world, run, a, s, sync) for a in timed)
        iters = dict.fromkeys(timed, fewest)
        # Trials interleave the algorithms, and each keeps its best trial: a burst of load from
        # elsewhere on a shared machine then spoils one trial of one algorithm, not the comparison.
        # Each trial starts one algorithm further on: no algorithm always runs first (after the
        # barrier, in caches the previous trial's last algorithm left), e.g. MPI's baseline.
        for trial in range(s.trials):
            for a in rotated(timed, trial):
                timing = time_calls(world, run, a, iters[a], sync)
                kept = best[a]
                if timing is not None and (kept is None or
                                           timing.across(s.time_across) < kept.across(s.time_across)):
                    best[a] = timing
    wrong: dict[str, int | None] = dict.fromkeys(algorithms)
    if first is not None:   # once more after the timed calls: a result that goes wrong after the first call shows too
        after = check(world, point, run, x, out, algorithms, xp)
        wrong = {a: max(first[a], after[a]) for a in algorithms}
    rows = [_row(point, nominal, a, iters[a], best[a], wrong[a], s) for a in algorithms]
    copy = best.get("copy")
    if copy is not None:
        for row in rows:
            row["copy_us"] = copy.across(s.time_across) * 1e6
    return rows


def rotated(items: list, k: int) -> list:
    """``items`` from index ``k`` (mod its length) on, then the ones before."""
    k %= len(items)
    return items[k:] + items[:k]


def _with_copy(run, x):
    """``run`` that also takes the name "copy": this rank copies ``x`` into a buffer of its own (np.copyto)."""
    into = np.empty_like(x)
    return lambda algorithm: np.copyto(into, x) if algorithm == "copy" else run(algorithm)


def _row(point: Point, nominal, algorithm, iters, timing: Timing | None, wrong, s: Settings) -> dict:
    row = dict.fromkeys(ROW_KEYS)
    row.update(collective=point.collective, size_bytes=point.count * point.dtype.itemsize, nominal_bytes=nominal,
               count=point.count, dtype=point.dtype.name, op=point.op, inplace=point.inplace, backend=s.backend,
               root=point.root if point.collective in ROOTED else None, algorithm=algorithm, iters=iters,
               wrong=wrong, mpi_call=baseline_name(point.collective) if algorithm == "mpi" else None,
               time_across=s.time_across)
    if timing is not None:
        us = {how: timing.across(how) * 1e6 for how in ACROSS_RANKS}
        p50, p99 = np.percentile(timing.calls, [50, 99]) * 1e6
        row.update(time_us=us[s.time_across], time_us_rank0=us["rank0"], time_us_min=us["min"],
                   time_us_avg=us["avg"], time_us_max=us["max"], iter_us_min=float(timing.calls.min() * 1e6),
                   iter_us_p50=float(p50), iter_us_p99=float(p99), iter_us_max=float(timing.calls.max() * 1e6),
                   faults_per_call=timing.faults_per_call())
    return row


def finish_rows(rows: list[dict], n: int, comm) -> None:
    """Add bandwidths, vs_mpi and what "auto" resolved to, in place (rank 0; the rows of one point)."""
    mpi = next((r for r in rows if r["algorithm"] == "mpi"), None)
    for r in rows:
        seconds = r["time_us"] * 1e-6
        r["algbw_GBps"] = r["size_bytes"] / seconds / 1e9
        r["busbw_GBps"] = r["algbw_GBps"] * bus_factor(r["collective"], n)
        if r["copy_us"] is not None:   # bytes copied per second (each read once and written once)
            r["copy_GBps"] = r["size_bytes"] / (r["copy_us"] * 1e-6) / 1e9
            r["busbw_vs_copy"] = r["busbw_GBps"] / r["copy_GBps"]
        if mpi is not None:
            r["vs_mpi"] = 1.0 if r is mpi else mpi["time_us"] / r["time_us"]
        if r["algorithm"] == "auto":
            r["resolved"] = "p2p" if r["collective"] == "sendrecv" else \
                comm.auto_algorithm(r["collective"], r["size_bytes"], np_dtype(r["dtype"]))


# -- progress ------------------------------------------------------------------------------------------
class Progress:
    """A tqdm bar over the points on rank 0's stderr: on request, or when stderr is a terminal and the sweep
    runs longer than two seconds; table lines go through it so they do not tear the bar."""

    def __init__(self, total: int, show: bool | None, rank: int):
        self.bar = None
        if rank == 0 and (show or (show is None and sys.stderr.isatty())):
            from tqdm import tqdm
            self.bar = tqdm(total=total, file=sys.stderr, unit="point", delay=0 if show else 2,
                            dynamic_ncols=True, leave=False)
        self.rank = rank

    def say(self, line: str) -> None:
        if self.rank != 0:
            return
        if self.bar is not None:
            self.bar.write(line, file=sys.stdout)
        else:
            print(line)
        sys.stdout.flush()

    def step(self, text: str) -> None:
        if self.bar is not None:
            self.bar.set_description(text, refresh=False)
            self.bar.update(1)

    def close(self) -> None:
        if self.bar is not None:
            self.bar.close()


# -- the run ----------------------------------------------------------------------------------------------
def sweep(world, comm, s: Settings, blocks: list[Block], xp, progress: Progress, compare: bool, raw=None) -> list[dict]:
    """Every block x size x placement; prints rows on rank 0 as each size finishes; returns the records (rank 0)."""
    records, shown = [], None
    for block in blocks:
        layout = sweep_output.Layout(placements_of(block.collective, s.placements), compare)
        if block.collective != shown:
            shown = block.collective
            for line in section_lines(block.collective, world.size, s.placements, layout):
                progress.say(line)
        dtype = np_dtype(block.dtype)
        for nominal in s.sizes:
            count = element_count(block.collective, nominal, dtype.itemsize, world.size)
            rows = []
            for placement in layout.placements:
                point = Point(block.collective, dtype, block.op, count, world.rank, world.size,
                              inplace=placement == "in")
                rows += measure(world, comm, point, nominal, block.algorithms, s, xp, raw)
            progress.step(f"{block.collective} {block.dtype} {block.op or ''} {report.human_size(nominal)}")
            if world.rank == 0:
                for placement in layout.placements:    # vs_mpi compares with mpi in the same placement
                    finish_rows([r for r in rows if r["inplace"] == (placement == "in")], world.size, comm)
                records += rows
                for row in sweep_output.pair_up(rows):
                    progress.say(layout.row_line(row))
    return records


def placements_of(collective: str, asked: tuple[str, ...]) -> tuple[str, ...]:
    """The placements ``collective`` runs: in place only where it has that form (else out of place)."""
    return tuple(p for p in asked if p == "out" or collective in INPLACE) or ("out",)


def section_lines(collective: str, n: int, asked: tuple[str, ...], layout) -> list[str]:
    """A collective's title (its busbw factor, root, its in-place form or the lack of one) and the table's header."""
    extra = ", root 0" if collective in ROOTED else ""
    if "in" in layout.placements:
        extra += f", in place: {INPLACE_FORMS[collective]}"
    elif "in" in asked:
        extra += ", no in-place form: out of place"
    return ["#", f"# {collective} (busbw = algbw x {bus_factor(collective, n):.3f}{extra})"] + layout.header_lines()


def settings_header(s: Settings, blocks: list[Block], comm, n: int) -> dict:
    return {"sweep": {**dataclasses.asdict(s), "blocks": [dataclasses.asdict(b) for b in blocks]},
            "backend": s.backend, "root": 0, "sendrecv": "pairs r<->r^1" if n % 2 == 0 else "ring shift r->r+1",
            "segment_bytes": comm.segment_bytes, "tree_segment_bytes": comm.tree_segment_bytes,
            "busbw_factors": {c: bus_factor(c, n) for c in COLLECTIVES}, "time_across_ranks": s.time_across}


def execute(s: Settings, out: Outputs, blocks: list[Block], notes: list[str], argv: list[str] | None = None) -> int:
    """Run the sweep on every rank, print and write on rank 0; the exit status (1 if any element was wrong).

    An exception on any rank aborts the whole job instead of leaving the others waiting.
    """
    from mpi4py import MPI
    world = MPI.COMM_WORLD
    try:
        return _execute(world, s, out, blocks, notes, argv)
    except Exception as e:
        if world.size == 1:
            raise
        import traceback
        traceback.print_exc()
        from ..engine.abort import end_job
        end_job(f"pycollect bench: rank {world.rank}: {type(e).__name__}: {e}; aborting the job")


def _execute(world, s, out, blocks, notes, argv) -> int:
    problem = agree_command_line(world, agreed_fields(s, blocks), problem=outputs_problem(out) if world.rank == 0
                                 else None)
    if problem:     # before any communicator, timing or output: every rank, one line, exit status 2
        sys.stderr.write(f"pycollect bench: error: {problem}\n")
        return 2
    comm = communicator("pycollect bench", world)
    if comm is None:
        return 2
    try:
        xp, problem = backend(s.backend, comm.topology.local_rank(world.rank))[0], None
    except ValueError as e:
        xp, problem = np, str(e)
    problems = [p for p in allgather_json(world, problem) if p]
    if problems:
        sys.stderr.write(f"pycollect bench: error: {problems[0]}\n")
        comm.free()
        return 2
    raw = world.Dup()   # MPI's own calls for the baseline, apart from pycollect's traffic
    compare = any(len(b.algorithms) > 1 for b in blocks)
    head = report.run_header(comm, argv, **settings_header(s, blocks, comm, world.size), **device_info(xp))
    if xp is not np:
        head["staged_through_host"] = comm.stages_through_host(xp)
    progress = Progress(len(blocks) * len(s.sizes), out.progress, world.rank)
    progress.say(f"# pycollect bench: {head['topology']}; {head['mpi_library'].splitlines()[0]}; "
                 f"backend {s.backend}; {head['date']}")
    progress.say(f"# minBytes {s.sizes[0]} maxBytes {s.sizes[-1]} warmup iters: {s.warmup} iters: {s.iters} "
                 f"trials: {s.trials} validation: {int(s.check)} time across ranks: {s.time_across} "
                 f"(-a {ACROSS_RANKS.index(s.time_across)})")
    for note in notes:
        progress.say(f"# note: {note}")
    try:
        records = sweep(world, comm, s, blocks, xp, progress, compare, raw)
    finally:
        progress.close()
    wrong = sum(r["wrong"] or 0 for r in records)
    if world.rank == 0:
        _report(progress.say, records, compare, head, out, wrong)
    if raw is not None:
        raw.Free()
    comm.free()
    return 1 if bcast_json(world, wrong) else 0


# Settings' fields as the flags that set them, for the line that says what differs between ranks
FLAGS = {"collectives": "COLLECTIVE", "sizes": "sizes (-b/-e/-f/-m)", "dtypes": "-d/--dtype", "ops": "-o/--op",
         "algorithm": "--algorithm", "iters": "-n/--iters", "warmup": "-w/--warmup", "trials": "--trials",
         "check": "-c/--check", "placements": "--placement", "time_across": "-a/--average", "backend": "--backend",
         "shared": "--shared"}


def agreed_fields(s: Settings, blocks: list[Block]) -> dict:
    """What every rank must run alike (rank 0's outputs are its own): the settings, by flag, and the blocks."""
    fields = {FLAGS.get(k, k): v for k, v in dataclasses.asdict(s).items()}
    fields["sizes (-b/-e/-f/-m)"] = ",".join(report.human_size(n) for n in s.sizes)
    fields["_blocks"] = [dataclasses.asdict(b) for b in blocks]
    return fields


def outputs_problem(out: Outputs) -> str | None:
    """Why one of ``out``'s files cannot be written (rank 0's to write), or None; checked before the sweep."""
    return report.outputs_problem((("--json", out.json), ("--csv", out.csv), ("--plot", out.plot)))


def _report(say, records, compare, head, out: Outputs, wrong: int) -> None:
    """The summary lines and the files (rank 0)."""
    for line in sweep_output.summary_lines(records, checked=records[0]["wrong"] is not None):
        say(line)
    found = sweep_output.targets(records) if compare else {}
    if compare:
        for line in sweep_output.format_targets(found):
            say(line)
    for line in sweep_output.fault_lines(records):
        say(line)
    if out.json:
        say(f"# wrote {report.write_json(out.json, 'sweep', head, records, targets=found)}")
    if out.csv:
        say(f"# wrote {report.write_csv(out.csv, records, ROW_KEYS)}")
    if out.plot:
        say(f"# wrote {sweep_output.plot(out.plot, records, head)}")
    if wrong:
        say(f"# FAILED: {wrong} wrong elements (see the #wrong columns)")
