"""The sweep's output as users of nccl-tests and OSU read it.

Without MPI: the flags (``-m``, ``-i``, ``-x``, ``-a``, nccl-tests' dtype names), the table's layout and
summary lines. Under ``mpiexec -n 2``, one sweep over every collective: its printed output parsed as an
nccl-tests user would (``#`` before every line that is not data, each row the columns its header names,
the summary computed from the rows), both placements side by side, the root column, ``-a 2``.
"""
import json
import os
import re
import subprocess
import sys

import numpy as np
import pytest

import pycollect
from pycollect.cli import build_parser
from pycollect.tools import sweep, sweep_output

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
RANKS = 2
ENV = dict(os.environ, MPIEXEC_TIMEOUT="120", OMP_NUM_THREADS="1", OPENBLAS_NUM_THREADS="1")
ENV.pop("PYCOLLECT_UNDER_MPI", None)


def settings(*flags) -> sweep.Settings:
    return sweep.settings_of(build_parser().parse_args(["bench", "allreduce", *flags]))


# -- flags ---------------------------------------------------------------------------------------------------
@pytest.mark.parametrize("osu, nccl", [
    (["-m", "1K:64K"], ["--min-bytes", "1K", "--max-bytes", "64K"]),
    (["-m", "64K"], ["-e", "64K"]),
    (["-m", "1K:"], ["-b", "1K"]),
    (["-m", "1K:", "-e", "4K"], ["-b", "1K", "-e", "4K"]),
    (["-i", "7", "-x", "3"], ["--iters", "7", "--warmup", "3"]),
])
def test_osu_flags_are_aliases(osu, nccl):
    got, want = settings(*osu), settings(*nccl)
    assert got == want
    assert got != settings()   # each case changes something from the defaults


def test_message_size_range_gives_the_sizes():
    assert settings("-m", "1K:64K", "-f", "4").sizes == [1024, 4096, 16384, 65536]


@pytest.mark.parametrize("flags", [["-m", "1K:64K", "-b", "8"], ["-m", "64K", "-e", "1M"], ["-m", "64K:1K"],
                                   ["-m", ":"], ["-m", "x:1K"]])
def test_bad_size_flags_are_parser_errors(flags, capsys):
    with pytest.raises(SystemExit) as e:
        settings(*flags)
    assert e.value.code == 2
    assert "error:" in capsys.readouterr().err


@pytest.mark.parametrize("alias, numpy_name", [("half", "float16"), ("float", "float32"), ("double", "float64"),
                                               ("bfloat16", "bfloat16"), ("int8", "int8"), ("char", "int8"),
                                               ("uint8", "uint8"), ("int", "int32"), ("int32", "int32"),
                                               ("uint32", "uint32"), ("int64", "int64"), ("uint64", "uint64")])
def test_nccl_dtype_names_map_to_numpy(alias, numpy_name):
    s = settings("-d", alias)
    assert s.dtypes == [numpy_name]
    assert sweep.np_dtype(s.dtypes[0]) == sweep.np_dtype(numpy_name)
    assert sweep.np_dtype(s.dtypes[0]).itemsize == {"float16": 2, "bfloat16": 2, "float32": 4, "float64": 8}.get(
        numpy_name, np.dtype(numpy_name).itemsize)


def test_dtype_aliases_and_numpy_names_mix_without_repeats():
    assert settings("-d", "float,float32,half,double").dtypes == ["float32", "float16", "float64"]


@pytest.mark.parametrize("flag, how", [("0", "rank0"), ("1", "avg"), ("2", "min"), ("3", "max")])
def test_average_flag_names_the_statistic(flag, how):
    assert settings("-a", flag).time_across == how
    assert settings().time_across == "avg"      # nccl-tests' and OSU's default


def test_placements_default_to_both():
    assert settings().placements == ("out", "in")
    assert settings("--inplace").placements == ("in",)
    assert settings("--placement", "out").placements == ("out",)


# -- in place ----------------------------------------------------------------------------------------------------
class Recorder:
    """A stand-in for the baseline's communicator: records each MPI call's name and arguments."""

    def __init__(self):
        self.calls = []

    def __getattr__(self, name):
        return lambda *args, **kwargs: self.calls.append((name, args, kwargs))


def in_place_point(collective, rank, size=4, op="sum"):
    return sweep.Point(collective, np.dtype("float32"), op, 8 * size, rank, size, inplace=True)


@pytest.mark.parametrize("rank", [0, 2])
def test_in_place_buffers_lie_where_each_form_has_them(rank):
    rs = in_place_point("reduce_scatter", rank)
    x, out = sweep.buffers(rs, np)
    assert x.size == 32 and out.base is x and np.shares_memory(out, x[8 * rank:8 * rank + 8])
    ag = in_place_point("allgather", rank)
    x, out = sweep.buffers(ag, np)
    assert out.size == 32 and np.shares_memory(x, out[8 * rank:8 * rank + 8]) and x.size == 8
    assert np.array_equal(x, sweep.rank_input(ag)) and np.isnan(np.delete(out, np.s_[8 * rank:8 * rank + 8])).all()
    for collective in ("allreduce", "alltoall", "broadcast", "reduce"):
        x, out = sweep.buffers(in_place_point(collective, rank), np)
        assert out is x


@pytest.mark.parametrize("collective, rank, call, in_place, result", [
    ("allreduce", 1, "Allreduce", True, "out"),
    ("alltoall", 1, "Alltoall", True, "out"),
    ("allgather", 1, "Allgather", True, "out"),
    ("reduce_scatter", 1, "Reduce_scatter_block", True, "x[:8]"),  # MPI's in-place result: the start of x
    ("reduce", 0, "Reduce", True, "out"),                           # the root
    ("reduce", 1, "Reduce", False, None),                           # MPI_IN_PLACE only on the root
    ("broadcast", 1, "Bcast", False, "out"),
])
def test_mpi_baseline_in_place_passes_mpi_in_place(collective, rank, call, in_place, result):
    from mpi4py import MPI
    point = in_place_point(collective, rank)
    x, out = sweep.buffers(point, np)
    raw = Recorder()
    got = sweep.mpi_baseline(raw, point, x, out)()
    [(name, args, _)] = raw.calls
    assert name == call and (args[0] is MPI.IN_PLACE) == in_place
    expected = {"out": out, "x[:8]": x[:8], None: None}[result]
    assert (got is None) if expected is None else (got is out if result == "out" else
                                                   np.shares_memory(got, expected) and got.size == 8)


def test_sendrecv_has_no_in_place_form():
    assert "sendrecv" not in sweep.INPLACE and set(sweep.INPLACE) == set(sweep.COLLECTIVES) - {"sendrecv"}
    assert sweep.placements_of("sendrecv", ("out", "in")) == ("out",)
    layout = sweep_output.Layout(("out",), compare=False)
    assert "no in-place form: out of place" in sweep.section_lines("sendrecv", 2, ("out", "in"), layout)[1]


# -- one row's times -------------------------------------------------------------------------------------------
def test_row_reports_the_chosen_statistic_and_keeps_all_four():
    timing = sweep.Timing(means=[4e-6, 1e-6, 7e-6], calls=np.array([1e-6, 2e-6, 3e-6, 10e-6]))
    point = sweep.Point("allreduce", np.dtype("float32"), "sum", 16, 0, 3)
    for how, expect in (("rank0", 4.0), ("avg", 4.0), ("min", 1.0), ("max", 7.0)):
        row = sweep._row(point, 64, "ring", 4, timing, 0, sweep.Settings(["allreduce"], [64], time_across=how))
        assert row["time_us"] == pytest.approx(expect) == pytest.approx(row[f"time_us_{how}"])
        assert row["time_across"] == how
        assert row["time_us_min"] <= row["time_us_avg"] <= row["time_us_max"]
        assert row["iter_us_min"] == pytest.approx(1.0) and row["iter_us_max"] == pytest.approx(10.0)
        assert row["iter_us_min"] <= row["iter_us_p50"] <= row["iter_us_p99"] <= row["iter_us_max"]
        assert set(row) == set(sweep.ROW_KEYS)


def test_time_calls_counts_the_page_faults_of_memory_fresh_on_every_call():
    """A call that maps and touches new memory each time faults on every page of it, every call; one that writes
    into memory it keeps does not, nor one that faults once in a burst (averaged over 5 calls it would be 410
    a call). The rows carry it and the lines after the targets name the faulting ones."""
    import mmap
    from mpi4py import MPI
    kept = np.ones(1 << 21)                           # 16 MiB, touched once here (np.zeros maps lazily)

    def fresh(_):
        m = mmap.mmap(-1, 8 << 20)
        m.madvise(mmap.MADV_NOHUGEPAGE)               # 4 KiB pages whatever the kernel's default
        np.frombuffer(m, np.uint8)[::4096] = 1        # one write per page: 2048 faults
        m.close()

    def reused(_):
        kept[::512] += 1                              # one write per page of memory already there

    calls = iter(range(5))

    def once(_):                                      # a burst on the first call alone: 2048 faults in 5 calls
        if next(calls) == 0:
            fresh(_)

    faulting = sweep.time_calls(MPI.COMM_SELF, fresh, "ring", 4)
    quiet = sweep.time_calls(MPI.COMM_SELF, reused, "ring", 4)
    burst = sweep.time_calls(MPI.COMM_SELF, once, "ring", 5)
    assert 2048 <= faulting.faults_per_call() < 2048 + 64
    assert quiet.faults_per_call() < 8
    assert burst.faults_per_call() < 8                # not every call's: one half of the loop saw none
    point = sweep.Point("allreduce", np.dtype("float32"), "sum", 1 << 24, 0, 1)
    rows = [sweep._row(point, 64 << 20, name, 4, timing, 0, sweep.Settings(["allreduce"], [64 << 20]))
            for name, timing in (("mpi", faulting), ("ring", quiet))]
    rows[0]["mpi_call"] = "MPI_Allreduce"
    lines = sweep_output.fault_lines(rows)
    assert lines[0].startswith("# page faults on every call")
    assert any(line.startswith("#   allreduce mpi(Allreduce): 64M 20") for line in lines)
    assert not any("ring" in line for line in lines) and all(line.startswith("#") for line in lines)
    assert sweep_output.fault_lines(rows[1:]) == []


# -- the table without MPI --------------------------------------------------------------------------------------
def record(size, algorithm, inplace, busbw, wrong=0, root=None, collective="allreduce"):
    return {"collective": collective, "dtype": "float32", "op": "sum", "nominal_bytes": size, "size_bytes": size,
            "count": size // 4, "root": root, "algorithm": algorithm, "resolved": "ring" if algorithm == "auto" else None,
            "mpi_call": "MPI_Allreduce" if algorithm == "mpi" else None, "inplace": inplace, "time_us": 12345.6,
            "algbw_GBps": busbw, "busbw_GBps": busbw, "wrong": wrong, "vs_mpi": 1.0}


def test_layout_rows_have_the_columns_the_header_names():
    layout = sweep_output.Layout(("out", "in"), compare=True)
    header = layout.header_lines()
    assert all(line.startswith("#") for line in header)
    assert header[0].split()[1:] == ["out-of-place", "in-place"]
    assert header[1][1:].split() == layout.titles()
    assert header[2][1:].split() == ["(B)", "(elements)", "(us)", "(GB/s)", "(GB/s)", "(us)", "(GB/s)", "(GB/s)"]
    rows = sweep_output.pair_up([record(64, "auto", False, 1.5), record(64, "auto", True, 2.5, wrong=None)])
    assert len(rows) == 1
    cells = layout.row_line(rows[0]).split()
    assert len(cells) == len(layout.titles())
    assert dict(zip(layout.titles()[:6], cells)) == {"size": "64", "count": "16", "type": "float32", "redop": "sum",
                                                     "root": "-1", "algorithm": "auto(ring)"}
    assert cells[6:] == ["12346", "1.50", "1.50", "0", "1.00", "12346", "2.50", "2.50", "N/A", "1.00"]


def test_titles_and_units_sit_over_their_columns():
    """A reader who slices by position finds each title and unit right-aligned over its cells."""
    layout = sweep_output.Layout(("out",), compare=False)
    _, titles, units = layout.header_lines()
    line = layout.row_line({"out": record(1024, "ring", False, 0.25, root=0, collective="broadcast")})
    for word in ("size", "count", "type", "root", "algorithm", "time", "busbw", "#wrong"):
        end = titles.index(word) + len(word)
        assert line[end - 1] != " " and (end == len(line) or line[end] == " "), word
    assert units.index("(elements)") + len("(elements)") == titles.index("count") + len("count")


def test_time_has_nccl_tests_precision():
    assert [sweep_output.format_time(t) for t in (3.14159, 123.456, 12345.6)] == ["3.14", "123.5", "12346"]


def test_summary_lines_are_computed_from_the_rows():
    records = [record(8, "mpi", False, 1.0), record(8, "ring", False, 3.0, wrong=2), record(8, "ring", True, 5.0)]
    lines = sweep_output.summary_lines(records, checked=True)
    assert all(line.startswith("#") for line in lines)
    assert "# Out of bounds values : 2 FAILED" in lines
    assert "# Avg bus bandwidth    : 3" in lines
    assert "# Avg busbw by algorithm : mpi 1  ring 4" in lines
    unchecked = sweep_output.summary_lines([record(8, "ring", False, 1.0, wrong=None)], checked=False)
    assert "# Out of bounds values : N/A (not checked: -c 0)" in unchecked
    assert not any("by algorithm" in line for line in unchecked)


def test_targets_compare_out_of_place_rows():
    rows = [record(64 << 20, "mpi", inplace, 1.0) for inplace in (False, True)]
    rows += [dict(record(64 << 20, "ring", False, 1.0), vs_mpi=1.5), dict(record(64 << 20, "ring", True, 1.0),
                                                                          vs_mpi=9.0)]
    assert sweep_output.targets(rows)["allreduce best schedule vs_mpi at 64M"]["value"] == 1.5


def test_targets_leave_out_rows_with_wrong_results():
    """A row whose results were wrong is no figure (a wrong ring at 64 MiB was printed as the best schedule)."""
    rows = [record(64 << 20, "mpi", False, 1.0), dict(record(64 << 20, "ring", False, 1.0), vs_mpi=10.0, wrong=5),
            dict(record(64 << 20, "tree", False, 1.0), vs_mpi=1.5)]
    assert sweep_output.targets(rows)["allreduce best schedule vs_mpi at 64M"] == {"value": 1.5, "algorithm": "tree"}
    rows[2]["wrong"] = 1
    assert "allreduce best schedule vs_mpi at 64M" not in sweep_output.targets(rows)


class _OneRank:
    """The world of one rank as ``sweep.check`` uses it: its sum over ranks is its own."""

    def Allreduce(self, sendbuf, recvbuf, op):
        pass


def test_check_counts_an_input_changed_out_of_place_against_its_algorithm_alone():
    """Out of place, a call that writes into its input is wrong there, and the next algorithm starts from the input
    again (it was blamed for the first one's damage)."""
    point = sweep.Point("allreduce", np.dtype("float32"), "sum", 16, 0, 1)
    x, out = sweep.buffers(point, np)

    def run(algorithm):
        out[...] = x
        if algorithm == "clobbers":
            x[3] += 1
        return out
    assert sweep.check(_OneRank(), point, run, x, out, ["clobbers", "right"], np) == {"clobbers": 1, "right": 0}


def test_the_sweep_checks_again_after_the_timed_calls(monkeypatch):
    """A result that goes wrong only after its first call shows in #wrong (only the first call was checked)."""
    from mpi4py import MPI
    monkeypatch.setattr(sweep, "time_calls", lambda world, run, a, iters, sync=None: [run(a) for _ in range(iters)]
                        and None)
    point = sweep.Point("allreduce", np.dtype("float32"), "sum", 16, 0, 1)
    calls = {"ring": 0}
    real = sweep.caller

    def later_wrong(comm, point, x, out, raw=None):
        run = real(comm, point, x, out, raw)

        def counted(algorithm):
            got = run(algorithm)
            calls[algorithm] += 1
            if calls[algorithm] > 1:
                got[0] += 1
            return got
        return counted
    monkeypatch.setattr(sweep, "caller", later_wrong)
    comm = pycollect.Communicator(MPI.COMM_SELF)
    try:
        rows = sweep.measure(MPI.COMM_SELF, comm, point, 64, ["ring"], settings("-n", "3", "-w", "1"))
    finally:
        comm.free()
    assert rows[0]["wrong"] == 1 and calls["ring"] == 1 + 1 + 3 + 1   # check, warmup, timed calls, check again


def test_plot_puts_a_log_latency_panel_for_small_sizes_beside_busbw(monkeypatch):
    pytest.importorskip("matplotlib")
    kept = {}
    monkeypatch.setattr(sweep_output, "save_figure", lambda fig, path: kept.setdefault("fig", fig) and path)
    sizes = [8 << k for k in range(0, 24, 4)]            # 8 B .. 64 MiB
    records = [record(size, algorithm, False, 1.0, collective=collective) for size in sizes
               for algorithm in ("mpi", "ring") for collective in ("allreduce", "broadcast")]
    sweep_output.plot("unused.png", records, {"world_size": 2, "node_of": [0, 0], "mpi_library": "MPICH"})
    axes = kept["fig"].axes
    assert len(axes) == 4 and [ax.get_title() for ax in axes] == [
        "allreduce latency", "allreduce bus bandwidth", "broadcast latency", "broadcast bus bandwidth"]
    for latency, busbw in (axes[:2], axes[2:]):
        assert latency.get_yscale() == "log" and busbw.get_yscale() == "linear"
        assert max(max(line.get_xdata()) for line in latency.get_lines()) <= sweep_output.LATENCY_PLOT_MAX_BYTES
        assert max(max(line.get_xdata()) for line in busbw.get_lines()) == sizes[-1]
    import matplotlib.pyplot as plt
    plt.close(kept["fig"])


def test_plot_title_names_ranks_nodes_dtype_and_library():
    head = {"world_size": 4, "node_of": [0, 0, 1, 1], "mpi_library": "MPICH Version:  4.2.0\nMPICH Release date: x",
            "time_across_ranks": "avg"}
    title = sweep_output.plot_title([record(8, "ring", False, 1.0)], head)
    assert title == "4 ranks on 2 nodes, float32, MPICH Version: 4.2.0, out-of-place, time avg over ranks"


# -- under MPI ------------------------------------------------------------------------------------------------
@pytest.fixture(scope="module")
def every_collective(tmp_path_factory):
    """``bench all`` with auto and MPI's own, both placements, OSU's size flags and nccl-tests' dtype name, -a 2."""
    path = tmp_path_factory.mktemp("sweep") / "all.json"
    cmd = ["mpiexec", "-n", str(RANKS), sys.executable, "-m", "pycollect", "bench", "all", "-m", "64:512", "-f", "8",
           "-i", "2", "-x", "1", "-d", "float", "-a", "2", "--algorithm", "auto,mpi", "--json", str(path)]
    proc = subprocess.run(cmd, env=ENV, cwd=ROOT, capture_output=True, text=True, timeout=150)
    assert proc.returncode == 0, proc.stdout[-4000:] + proc.stderr[-4000:]
    return proc.stdout, json.loads(path.read_text())


def sections(stdout: str) -> list[tuple[str, list[str], list[list[str]]]]:
    """(collective, column titles, data rows split into cells) per table, as a reader of nccl-tests splits them."""
    out = []
    for line in stdout.splitlines():
        if line.startswith("#"):
            words = line[1:].split()
            if len(words) > 1 and words[1].startswith("(busbw"):
                out.append([words[0], None, []])
            elif words[:2] == ["size", "count"]:
                out[-1][1] = words
        else:
            out[-1][2].append(line.split())
    return [tuple(s) for s in out]


def test_every_line_that_is_not_data_starts_with_a_hash(every_collective):
    stdout, data = every_collective
    lines = [line for line in stdout.splitlines() if line]
    data_lines = [line for line in lines if not line.startswith("#")]
    assert all(re.fullmatch(r"\s+\d+\s+\d+\s.*", line) for line in data_lines), data_lines
    assert any(line.startswith("# targets:") for line in lines) and any(line.startswith("# wrote ") for line in lines)


def test_rows_have_the_columns_their_header_names(every_collective):
    stdout, data = every_collective
    tables = sections(stdout)
    assert [t[0] for t in tables] == list(sweep.COLLECTIVES)
    for collective, titles, rows in tables:
        assert rows and all(len(cells) == len(titles) for cells in rows), (collective, titles, rows)
        in_place = collective in sweep.INPLACE
        assert titles.count("time") == titles.count("busbw") == titles.count("vs_mpi") == (2 if in_place else 1)
        cells = [dict(zip(titles, row)) for row in rows]
        assert {c["root"] for c in cells} == ({"0"} if collective in sweep.ROOTED else {"-1"})
        assert {c["type"] for c in cells} == {"float32"} and {c["size"] for c in cells} == {"64", "512"}


def test_both_placements_side_by_side_match_the_json(every_collective):
    stdout, data = every_collective
    titles, rows = next((t, r) for c, t, r in sections(stdout) if c == "allreduce")
    group = len(sweep_output.Layout(("out",), True).group)
    records = {(r["size_bytes"], r["algorithm"], r["inplace"]): r for r in data["records"]
               if r["collective"] == "allreduce"}
    assert len(records) == 2 * len(rows) == 8
    for row in rows:
        algorithm = row[5].split("(")[0]
        for k, inplace in enumerate((False, True)):
            r = records[(int(row[0]), algorithm, inplace)]
            cells = row[6 + k * group: 6 + (k + 1) * group]
            assert cells == sweep_output.timed_cells(r, compare=True)
            assert float(cells[0]) == pytest.approx(r["time_us_min"], rel=0.01, abs=0.01)   # -a 2


def test_every_collective_but_sendrecv_runs_in_place_too(every_collective):
    stdout, data = every_collective
    ran = {(r["collective"], r["algorithm"], r["inplace"]) for r in data["records"]}
    assert ran == {(c, a, p) for c in sweep.COLLECTIVES for a in ("mpi", "auto") for p in (False, True)
                   if not (p and c == "sendrecv")}
    titles = {line.split()[1]: line for line in stdout.splitlines() if "(busbw = " in line}
    for collective, form in sweep.INPLACE_FORMS.items():
        assert f"in place: {form}" in titles[collective], titles[collective]
    assert "no in-place form" in titles["sendrecv"]


def test_average_two_reports_the_minimum_across_ranks(every_collective):
    _, data = every_collective
    assert data["header"]["time_across_ranks"] == "min"
    assert data["header"]["pycollect"] == pycollect.__version__   # the build, from git (setuptools-scm)
    for r in data["records"]:
        assert r["time_across"] == "min" and r["time_us"] == r["time_us_min"], r
        assert 0 < r["time_us_min"] <= r["time_us_avg"] <= r["time_us_max"], r
        assert r["time_us_min"] <= r["time_us_rank0"] <= r["time_us_max"], r
        assert 0 < r["iter_us_min"] <= r["iter_us_p50"] <= r["iter_us_p99"] <= r["iter_us_max"], r
        assert r["iters"] == 2 and r["dtype"] == "float32" and r["wrong"] == 0, r


def test_summary_lines_agree_with_the_rows(every_collective):
    stdout, data = every_collective
    busbw = [float(cells[i]) for _, titles, rows in sections(stdout) for cells in rows
             for i, title in enumerate(titles) if title == "busbw"]
    assert len(busbw) == len(data["records"])
    avg = float(re.search(r"^# Avg bus bandwidth    : (\S+)$", stdout, re.M).group(1))
    assert avg == pytest.approx(sum(busbw) / len(busbw), abs=0.006)
    assert avg == pytest.approx(sum(r["busbw_GBps"] for r in data["records"]) / len(data["records"]), rel=1e-5)
    assert re.search(r"^# Out of bounds values : 0 OK$", stdout, re.M)


@pytest.mark.parametrize("collective, placement", [("scatter", "in"), ("scatter", "out"), ("allreduce", "out"),
                                                  ("allreduce", "in")])
def test_the_check_counts_a_result_that_never_reached_out(collective, placement):
    """sweep.check against calls that do not deliver into out: one that leaves out as it was (before, in place off
    a scatter's root out was never reset to the sentinel, so what an earlier algorithm left there passed) and one
    that returns a right result in a new array, out untouched (before: its return value alone was compared)."""
    from mpi4py import MPI
    point = sweep.Point(collective, np.dtype("float32"), "sum" if collective == "allreduce" else None, 32, 1, 4,
                        inplace=placement == "in")
    x, out = sweep.buffers(point, np)
    ref = sweep.expected(point)

    def run(algorithm):
        if algorithm == "right":
            out[...] = ref
            return out
        if algorithm == "fresh":
            return ref.copy()
        return out                    # "untouched": nothing written
    out[...] = ref                    # what a previous algorithm left in out
    wrong = sweep.check(MPI.COMM_SELF, point, run, x, out, ["right", "untouched", "fresh"], np)
    assert wrong == {"right": 0, "untouched": ref.size, "fresh": ref.size}, wrong   # in place: x holds the input


# -- sizes with a bound, outputs checked before the sweep --------------------------------------------------------
@pytest.mark.parametrize("flags, says", [(["-e", "99999999999G"], "1024G (2**40 bytes)"),
                                         (["-b", "2048G", "-e", "4096G"], "1024G (2**40 bytes)"),
                                         (["-m", "1K:99999999999999999999999"], "1024G (2**40 bytes)")])
def test_sizes_above_the_bound_are_parser_errors(flags, says, capsys):
    with pytest.raises(SystemExit) as e:
        settings(*flags)
    err = capsys.readouterr().err
    assert e.value.code == 2 and says in err and err.count("\n") == 1, err


def test_sizes_above_the_machines_memory_are_parser_errors(monkeypatch, capsys):
    monkeypatch.setattr(sweep.report, "physical_memory", lambda: 1 << 30)
    assert settings("-e", "1G").sizes[-1] == 1 << 30
    with pytest.raises(SystemExit) as e:
        settings("-b", "1G", "-e", "2G")
    err = capsys.readouterr().err
    assert e.value.code == 2 and "-e/--max-bytes 2G: above this machine's memory (1.0 GiB)" in err, err


def test_outputs_are_checked_before_the_sweep(tmp_path):
    ok = str(tmp_path / "new" / "out.json")
    assert sweep.outputs_problem(sweep.Outputs(json=ok, csv=ok[:-4] + "csv", plot=str(tmp_path / "a.png"))) is None
    assert sweep.outputs_problem(sweep.Outputs(json=ok, csv=ok)) == f"--json and --csv name the same file {ok}"
    assert sweep.outputs_problem(sweep.Outputs(json="")) == "--json: the path is empty; name a file"
    assert sweep.outputs_problem(sweep.Outputs(json=ok, csv=str(tmp_path))) == f"--csv {tmp_path}: is a directory"
    assert sweep.outputs_problem(sweep.Outputs(json="/proc/nope/x.json")).startswith("--json /proc/nope/x.json: ")
    assert "--plot" in sweep.outputs_problem(sweep.Outputs(plot=str(tmp_path / "a.nope")))
    assert not list(tmp_path.iterdir())
