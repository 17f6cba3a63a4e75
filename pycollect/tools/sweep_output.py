"""What the sweep prints and draws: nccl-tests' table, its summary lines, the targets and the plot.

The table reads as nccl-tests' does: every line that is not a data row starts with ``#`` (the
placement line, the column titles, a units row, the summary), and each data row holds one point and
one algorithm with its out-of-place and in-place measurements side by side (``pycollect bench allreduce``)::

    #                                                                   out-of-place                          in-place
    #       size         count      type  redop  root         algorithm      time    algbw    busbw  #wrong      time ...
    #        (B)    (elements)                                               (us)   (GB/s)   (GB/s)              (us) ...
             512           128   float32    sum    -1         auto(mpi)      4.96     0.10     0.10       0      4.65 ...
    #
    # Out of bounds values : 0 OK
    # Avg bus bandwidth    : 0.365131

(the algorithm column is 25 wide, shortened here). Records (the JSON's rows) stay one per placement;
``pair_up`` joins them into table rows.
"""
from __future__ import annotations

import dataclasses
import math

from ..plotting import pyplot, save_figure
from . import report

PLACEMENT_TITLES = {"out": "out-of-place", "in": "in-place"}
LATENCY_PLOT_MAX_BYTES = report.MiB   # the latency panel: sizes where time, not bandwidth, is the story


@dataclasses.dataclass(frozen=True)
class Column:
    key: str
    title: str
    unit: str
    width: int


POINT_COLUMNS = (Column("size", "size", "(B)", 12), Column("count", "count", "(elements)", 12),
                 Column("type", "type", "", 8), Column("redop", "redop", "", 5), Column("root", "root", "", 4),
                 Column("algorithm", "algorithm", "", 25))
TIMED_COLUMNS = (Column("time", "time", "(us)", 8), Column("algbw", "algbw", "(GB/s)", 7),
                 Column("busbw", "busbw", "(GB/s)", 7), Column("wrong", "#wrong", "", 6))
VS_MPI_COLUMN = Column("vs_mpi", "vs_mpi", "", 6)
GAP = "  "


# -- the table --------------------------------------------------------------------------------------------
@dataclasses.dataclass(frozen=True)
class Layout:
    """The table's columns: the point's, then one group per placement run (with vs_mpi when comparing)."""
    placements: tuple[str, ...]           # "out", "in", in the order they are printed
    compare: bool

    @property
    def group(self) -> tuple[Column, ...]:
        return TIMED_COLUMNS + ((VS_MPI_COLUMN,) if self.compare else ())

    def titles(self) -> list[str]:
        """Every column's title in order, as a reader splitting the title line finds them."""
        return [c.title for c in POINT_COLUMNS] + [c.title for _ in self.placements for c in self.group]

    def header_lines(self) -> list[str]:
        """The placement line, the column titles and the units row, each starting with ``#``."""
        point_width = sum(c.width for c in POINT_COLUMNS) + len(GAP) * len(POINT_COLUMNS)
        group_width = sum(c.width for c in self.group) + len(GAP) * (len(self.group) - 1)
        groups = GAP.join(PLACEMENT_TITLES[p].center(group_width) for p in self.placements)
        columns = POINT_COLUMNS + self.group * len(self.placements)
        return [_commented(" " * point_width + groups),
                _commented(_cells([c.title for c in columns], columns)),
                _commented(_cells([c.unit for c in columns], columns))]

    def row_line(self, by_placement: dict[str, dict]) -> str:
        """One data row from the records of one point and algorithm, keyed by placement."""
        first = next(iter(by_placement.values()))
        cells = point_cells(first)
        for placement in self.placements:
            record = by_placement.get(placement)
            cells += timed_cells(record, self.compare) if record else ["N/A"] * len(self.group)
        return _cells(cells, POINT_COLUMNS + self.group * len(self.placements))


def _cells(texts: list[str], columns) -> str:
    return GAP.join(t.rjust(c.width) for t, c in zip(texts, columns))


def _commented(line: str) -> str:
    """``line`` with its first character replaced by ``#`` (the first column is right-aligned and wider than
    its title, so that character is a space): header lines keep the data rows' widths."""
    return "#" + line[1:].rstrip()


def algorithm_label(r: dict) -> str:
    """``auto(ring)`` names what auto ran; ``mpi(Allgather)`` names MPI's call the baseline made."""
    if r["algorithm"] == "auto" and r.get("resolved"):
        return f"auto({r['resolved']})"
    if r["algorithm"] == "mpi" and r.get("mpi_call"):
        return f"mpi({r['mpi_call'].removeprefix('MPI_')})"
    return r["algorithm"]


def point_cells(r: dict) -> list[str]:
    """size, count, type, redop, root (-1 where the collective has none, as nccl-tests prints) and algorithm."""
    root = -1 if r.get("root") is None else r["root"]
    return [str(r["size_bytes"]), str(r["count"]), r["dtype"], r["op"] or "none", str(root), algorithm_label(r)]


def format_time(us: float) -> str:
    """nccl-tests' precision: two decimals below 100 us, one below 10 ms, none above."""
    return f"{us:.0f}" if us >= 10000 else f"{us:.1f}" if us >= 100 else f"{us:.2f}"


def timed_cells(r: dict, compare: bool) -> list[str]:
    """time, algbw, busbw, #wrong (``N/A`` unchecked) and, when comparing, vs_mpi (``-`` without an mpi row)."""
    cells = [format_time(r["time_us"]), f"{r['algbw_GBps']:.2f}", f"{r['busbw_GBps']:.2f}",
             "N/A" if r["wrong"] is None else str(r["wrong"])]
    if compare:
        cells.append("-" if r["vs_mpi"] is None else f"{r['vs_mpi']:.2f}")
    return cells


def pair_up(records: list[dict]) -> list[dict[str, dict]]:
    """The records grouped into table rows (one point and algorithm), each ``{placement: record}``, in order."""
    rows: dict[tuple, dict[str, dict]] = {}
    for r in records:
        key = (r["collective"], r["dtype"], r["op"], r["nominal_bytes"], r["algorithm"])
        rows.setdefault(key, {})["in" if r["inplace"] else "out"] = r
    return list(rows.values())


# -- summary lines ----------------------------------------------------------------------------------------
def summary_lines(records: list[dict], checked: bool) -> list[str]:
    """nccl-tests' closing lines: wrong elements over every row, and the mean busbw of every measurement;
    with several algorithms, each one's mean too (its own line, so a reader of the first finds the total)."""
    wrong = sum(r["wrong"] or 0 for r in records)
    bounds = (f"{wrong} {'FAILED' if wrong else 'OK'}" if checked else "N/A (not checked: -c 0)")
    lines = ["#", f"# Out of bounds values : {bounds}",
             f"# Avg bus bandwidth    : {_mean(r['busbw_GBps'] for r in records):g}"]
    algorithms = list(dict.fromkeys(r["algorithm"] for r in records))
    if len(algorithms) > 1:
        means = "  ".join(f"{a} {_mean(r['busbw_GBps'] for r in records if r['algorithm'] == a):g}"
                          for a in algorithms)
        lines.append(f"# Avg busbw by algorithm : {means}")
    return lines + ["#"]


def _mean(values) -> float:
    values = list(values)
    return sum(values) / len(values)


def comparison_rows(records: list[dict]) -> list[dict]:
    """The records targets and plots compare: the out-of-place ones, or the in-place ones when only they ran."""
    out = [r for r in records if not r["inplace"]]
    return out or list(records)


# -- targets: the figures the selection table is judged by (bench/README.md) ----------------------------
def targets(records: list[dict]) -> dict[str, dict]:
    """Per dtype (named when several): best schedule at 64 MiB and auto's worst ratios to MPI's own. A row with
    wrong results is no figure: rows whose ``wrong`` is not 0 are left out (the sweep names them and fails)."""
    out: dict[str, dict] = {}
    records = [r for r in comparison_rows(records) if not r.get("wrong")]
    dtypes = list(dict.fromkeys(r["dtype"] for r in records))
    for dtype in dtypes:
        rows = [r for r in records if r["dtype"] == dtype and r["op"] in (None, "sum") and r["vs_mpi"] is not None]
        tag = f" [{dtype}]" if len(dtypes) > 1 else ""
        for name, value in _targets_of(rows).items():
            out[name + tag] = value
    return out


def _targets_of(records: list[dict]) -> dict[str, dict]:
    out: dict[str, dict] = {}
    colls = dict.fromkeys(r["collective"] for r in records)
    if "allreduce" in colls:
        best = [r for r in _at(records, "allreduce", None, 64 * report.MiB, 64 * report.MiB)
                if r["algorithm"] not in ("mpi", "auto")]
        if best:
            top = max(best, key=lambda r: r["vs_mpi"])
            out["allreduce best schedule vs_mpi at 64M"] = {"value": top["vs_mpi"], "algorithm": top["algorithm"]}
        _min_vs_mpi(out, records, "allreduce", 32 * report.KiB, 256 * report.MiB)
        copied = [r for r in _at(records, "allreduce", None, 64 * report.MiB, 64 * report.MiB)
                  if r.get("busbw_vs_copy") is not None and r["algorithm"] != "mpi"]
        if copied:
            top = max(copied, key=lambda r: r["busbw_vs_copy"])
            out["allreduce busbw / concurrent copy bandwidth at 64M"] = {
                "value": top["busbw_vs_copy"], "algorithm": top["algorithm"], "copy_GBps": top["copy_GBps"]}
        small = [(r, _mpi_time(records, r)) for r in _at(records, "allreduce", "auto", 0, 32 * report.KiB - 1)]
        if small:
            worst, mpi = max(small, key=lambda rm: rm[0]["time_us"] - rm[1])
            out["allreduce auto extra latency us below 32K"] = {
                "value": worst["time_us"] - mpi, "size_bytes": worst["nominal_bytes"]}
    for coll in colls:
        if coll != "allreduce":
            _min_vs_mpi(out, records, coll, report.MiB, math.inf)
    return out


def _at(records, collective, algorithm, lo=0, hi=math.inf):
    return [r for r in records if r["collective"] == collective and algorithm in (None, r["algorithm"])
            and lo <= r["nominal_bytes"] <= hi]


def _mpi_time(records, r) -> float:
    return next(m["time_us"] for m in _at(records, r["collective"], "mpi", r["nominal_bytes"], r["nominal_bytes"])
                if m["inplace"] == r["inplace"])


def _min_vs_mpi(out, records, collective, lo, hi) -> None:
    rows = _at(records, collective, "auto", lo, hi)
    if rows:
        worst = min(rows, key=lambda r: r["vs_mpi"])
        span = f"{report.human_size(lo)}..{report.human_size(hi)}" if hi != math.inf else f">= {report.human_size(lo)}"
        out[f"{collective} auto min vs_mpi {span}"] = {"value": worst["vs_mpi"], "size_bytes": worst["nominal_bytes"]}


def format_targets(found: dict[str, dict]) -> list[str]:
    lines = ["# targets:"]
    for name, t in found.items():
        where = t.get("algorithm") or report.human_size(t["size_bytes"])
        lines.append(f"#   {name}: {t['value']:.2f} ({where})")
    if len(lines) == 1:
        lines.append("#   (none: the sweep has no auto rows or no sizes in the target ranges)")
    return lines


# -- page faults: memory a call touches fresh every time ------------------------------------------------
FAULTS_NOTED = 64   # minor page faults a call (256 KiB of fresh 4 KiB pages) from which a row is named


def fault_lines(records: list[dict]) -> list[str]:
    """The rows whose calls page-faulted every time (``faults_per_call``, the most of any rank), per collective
    and algorithm, and why it matters: a ratio against such a row measures the allocator as well. MPI's own
    reductions (MPICH's Allreduce, Reduce_scatter_block, Reduce, Scan) allocate a temporary buffer per call, which
    glibc maps anew, and the call faults it in page by page, from its mmap threshold's ceiling (32 MiB) up."""
    named: dict[str, list[str]] = {}
    for r in records:
        if (r.get("faults_per_call") or 0) >= FAULTS_NOTED:
            where = report.human_size(r["nominal_bytes"]) + (" in place" if r["inplace"] else "")
            named.setdefault(f"{r['collective']} {algorithm_label(r)}", []).append(
                f"{where} {r['faults_per_call']:.0f}")
    if not named:
        return []
    return (["# page faults on every call (minor faults a call, the most of any rank):"]
            + [f"#   {label}: {', '.join(points)}" for label, points in named.items()]
            + ["#   such a call touches fresh memory each time (a temporary buffer the allocator maps anew); with",
               "#   glibc, MALLOC_MMAP_MAX_=0 MALLOC_TRIM_THRESHOLD_=4294967296 in the environment keeps it (bench/README.md)"])


# -- the plot -----------------------------------------------------------------------------------------------
def plot(path: str, records: list[dict], head: dict) -> str:
    """Per collective, latency (log-log, sizes up to 1 MiB) beside busbw (log2 sizes); one line per algorithm,
    mpi dashed. The title says ranks, nodes, dtypes, MPI library and placement."""
    plt = pyplot()
    records = comparison_rows(records)
    colls = list(dict.fromkeys(r["collective"] for r in records))
    fig, axes = plt.subplots(len(colls), 2, figsize=(11, 4 * len(colls)), squeeze=False)
    for (latency_ax, busbw_ax), coll in zip(axes, colls):
        rows = [r for r in records if r["collective"] == coll]
        small = [r for r in rows if r["size_bytes"] <= LATENCY_PLOT_MAX_BYTES]
        _draw(latency_ax, small if len({r["size_bytes"] for r in small}) > 1 else rows, "time_us")
        latency_ax.set_yscale("log")
        latency_ax.set_ylabel("time per call (us, log scale)")
        latency_ax.set_title(f"{coll} latency")
        _draw(busbw_ax, rows, "busbw_GBps")
        busbw_ax.set_ylabel("busbw (GB/s)")
        busbw_ax.set_title(f"{coll} bus bandwidth")
    fig.suptitle(plot_title(records, head))
    fig.tight_layout()
    return save_figure(fig, path)


def plot_title(records: list[dict], head: dict) -> str:
    """``4 ranks on 2 nodes, float32, MPICH Version: 4.2.0, out-of-place, time avg over ranks``."""
    nodes = len(set(head.get("node_of") or [0]))
    library = " ".join(head.get("mpi_library", "MPI ?").splitlines()[0].split())
    dtypes = ",".join(dict.fromkeys(r["dtype"] for r in records))
    placement = "in-place" if records and records[0]["inplace"] else "out-of-place"
    return (f"{head.get('world_size', '?')} ranks on {nodes} node{'s' if nodes != 1 else ''}, {dtypes}, "
            f"{library}, {placement}, time {head.get('time_across_ranks', 'avg')} over ranks")


def _draw(ax, rows: list[dict], key: str) -> None:
    """``key`` against size (log2 axis), one line per algorithm (and dtype, op when the panel has several)."""
    variants = {(r["dtype"], r["op"]) for r in rows}
    lines: dict = {}
    for r in rows:
        name = (r["algorithm"],) + ((r["dtype"], r["op"]) if len(variants) > 1 else ())
        lines.setdefault(name, []).append((r["size_bytes"], r[key]))
    for name, points in lines.items():
        points.sort()
        ax.plot([p[0] for p in points], [p[1] for p in points], marker=".",
                linestyle="--" if name[0] == "mpi" else "-", label=" ".join(k for k in name if k))
    ax.set_xscale("log", base=2)
    ticks = sorted({r["size_bytes"] for r in rows})
    step = max(1, len(ticks) // 8)
    ax.set_xticks(ticks[::step], [report.human_size(t) for t in ticks[::step]])
    ax.set_xlabel("size (bytes)")
    ax.grid(True, alpha=0.3)
    ax.legend(fontsize="small")
