"""``python -m pycollect bench COLLECTIVE|all`` under ``mpiexec -n 2``.

The outputs agree with each other, the check catches a wrong element, bad flags fail fast on every rank.
"""
import csv
import json
import os
import subprocess
import sys

import pytest

import pycollect as pc
from pycollect.tools import report, sweep

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
RANKS = 2
ENV = dict(os.environ, MPIEXEC_TIMEOUT="120", OMP_NUM_THREADS="1", OPENBLAS_NUM_THREADS="1")
ENV.pop("PYCOLLECT_UNDER_MPI", None)
TINY = ["-n", "2", "-w", "1"]

# Runs `python -m pycollect ...` and writes each rank's exit status to $STATUS_DIR/<rank>. With
# CORRUPT_RANK set, the ring allreduce adds 1 to the first element of its result on that rank:
# a broken schedule, without a hook in the library.
WRAPPER = """
import os, runpy, sys
from mpi4py import MPI
import pycollect.runner as pcr

corrupt = os.environ.get("CORRUPT_RANK")
if corrupt is not None:
    honest = pcr.Runner._schedule_run
    def _schedule_run(self, call):
        def spoil(result):
            if call.collective == "allreduce" and call.name == "ring" and self.rank == int(corrupt):
                result.reshape(-1)[0] += 1
            return result
        result = honest(self, call)
        return spoil(result) if call.blocking else result.then(spoil)
    pcr.Runner._schedule_run = _schedule_run

status = 0
try:
    sys.argv = ["pycollect"] + sys.argv[1:]
    runpy.run_module("pycollect", run_name="__main__", alter_sys=True)
except SystemExit as e:
    status = e.code if isinstance(e.code, int) else (0 if e.code is None else 1)
    raise
finally:
    with open(os.path.join(os.environ["STATUS_DIR"], str(MPI.COMM_WORLD.Get_rank())), "w") as f:
        f.write(str(status))
"""


def bench(*args, timeout=150, wrapper=None, env=None):
    """``mpiexec -n 2 python -m pycollect bench ARGS`` (or through ``wrapper``); the finished process."""
    program = [wrapper] if wrapper else ["-m", "pycollect"]
    cmd = ["mpiexec", "-n", str(RANKS), sys.executable, *program, "bench", *args]
    return subprocess.run(cmd, env={**ENV, **(env or {})}, cwd=ROOT, capture_output=True, text=True, timeout=timeout)


def output(proc) -> str:
    return f"--- stdout ---\n{proc.stdout[-4000:]}\n--- stderr ---\n{proc.stderr[-4000:]}"


def statuses(folder) -> dict[int, int]:
    return {int(name): int((folder / name).read_text()) for name in os.listdir(folder)}


def table_rows(stdout: str) -> list[list[str]]:
    """The data lines of the printed tables (every other line starts with '#'), split into cells."""
    lines = [line for line in stdout.splitlines() if line]
    assert all(line.startswith("#") or line.strip()[:1].isdigit() for line in lines), stdout
    return [line.split() for line in lines if not line.startswith("#")]


@pytest.fixture(scope="module")
def allreduce_all(tmp_path_factory):
    """One allreduce sweep over every algorithm, out of place and in place, with JSON, CSV and a plot."""
    d = tmp_path_factory.mktemp("sweep")
    paths = {k: d / f"out.{k}" for k in ("json", "csv", "png")}
    proc = bench("allreduce", "-b", "8", "-e", "64K", "-f", "8", "-n", "3", "-w", "1", "--algorithm", "all",
                 "--json", str(paths["json"]), "--csv", str(paths["csv"]), "--plot", str(paths["png"]))
    assert proc.returncode == 0, output(proc)
    return proc, json.loads(paths["json"].read_text()), paths


def test_json_has_the_shared_shape(allreduce_all):
    _, data, _ = allreduce_all
    assert data["schema"] == report.SCHEMA == "pycollect.bench/1" and data["kind"] == "sweep"
    assert data["header"]["world_size"] == RANKS and "bench" in data["header"]["argv"]
    assert "targets" in data


def test_every_algorithm_at_every_size(allreduce_all):
    records = allreduce_all[1]["records"]
    assert sorted({r["nominal_bytes"] for r in records}) == [8, 64, 512, 4096, 32768]
    for algorithm in pc.algorithms("allreduce"):
        for inplace in (False, True):
            assert len([r for r in records if (r["algorithm"], r["inplace"]) == (algorithm, inplace)]) == 5, algorithm
    for r in records:
        assert r["wrong"] == 0 and r["iters"] == 3 and r["dtype"] == "float32" and r["op"] == "sum", r
        assert 0 < r["time_us_min"] <= r["time_us_avg"] <= r["time_us_max"], r
        assert r["time_us"] == r["time_us_avg"] and r["time_across"] == "avg", r   # the default, as nccl-tests'
        assert 0 < r["iter_us_min"] <= r["iter_us_p50"] <= r["iter_us_p99"] <= r["iter_us_max"], r
        assert r["algbw_GBps"] == r["size_bytes"] / (r["time_us"] * 1e-6) / 1e9, r
        assert r["busbw_GBps"] == r["algbw_GBps"] * (2 * (RANKS - 1) / RANKS), r
        mpi = next(m for m in records if m["algorithm"] == "mpi" and m["size_bytes"] == r["size_bytes"]
                   and m["inplace"] == r["inplace"])
        assert r["vs_mpi"] == pytest.approx(mpi["time_us"] / r["time_us"]), r


def test_csv_rows_equal_the_json_records(allreduce_all):
    _, data, paths = allreduce_all
    with open(paths["csv"], newline="") as f:
        rows = list(csv.DictReader(f))
    assert len(rows) == len(data["records"])
    for row, rec in zip(rows, data["records"]):
        assert list(row) == sweep.ROW_KEYS
        for key, value in rec.items():
            text = row[key]
            if value is None:
                assert text == "", key
            elif isinstance(value, (bool, str)):
                assert text == str(value), key
            else:
                assert type(value)(text) == value, key


def test_stdout_table_matches_the_json(allreduce_all):
    proc, data, _ = allreduce_all
    assert proc.stdout.count("# pycollect bench:") == 1, "only rank 0 prints"
    rows = table_rows(proc.stdout)
    out_of_place = [r for r in data["records"] if not r["inplace"]]
    in_place = [r for r in data["records"] if r["inplace"]]
    assert len(rows) == len(out_of_place) == len(in_place)
    for cells, r, r_in in zip(rows, out_of_place, in_place):
        assert (r_in["size_bytes"], r_in["algorithm"]) == (r["size_bytes"], r["algorithm"])
        name = f"auto({r['resolved']})" if r["algorithm"] == "auto" else r["algorithm"]
        if r["algorithm"] == "mpi":   # the baseline names MPI's call; even blocks: the regular one
            assert r["mpi_call"] == "MPI_" + {"allreduce": "Allreduce", "reduce_scatter": "Reduce_scatter_block",
                                             "allgather": "Allgather", "alltoall": "Alltoall"}[r["collective"]]
            name = f"mpi({r['mpi_call'][4:]})"
        timed = [[time_text(x["time_us"]), f"{x['algbw_GBps']:.2f}", f"{x['busbw_GBps']:.2f}", str(x["wrong"]),
                  f"{x['vs_mpi']:.2f}"] for x in (r, r_in)]
        assert cells == [str(r["size_bytes"]), str(r["count"]), r["dtype"], r["op"], "-1", name, *timed[0], *timed[1]]


def time_text(us: float) -> str:
    """nccl-tests' precision: two decimals below 100 us, one below 10 ms."""
    return f"{us:.2f}" if us < 100 else f"{us:.1f}" if us < 10000 else f"{us:.0f}"


def test_plot_is_a_png(allreduce_all):
    path = allreduce_all[2]["png"]
    assert path.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    image = pytest.importorskip("matplotlib.image").imread(str(path))
    assert image.ndim == 3 and image.shape[0] > 100 and image.shape[1] > 100


def test_all_covers_ten_collectives(tmp_path):
    path = tmp_path / "all.json"
    proc = bench("all", "-b", "8", "-e", "512", "-f", "8", *TINY, "--algorithm", "all", "--json", str(path))
    assert proc.returncode == 0, output(proc)
    records = json.loads(path.read_text())["records"]
    assert {r["collective"] for r in records} == set(sweep.COLLECTIVES) and len(sweep.COLLECTIVES) == 10
    factors = {"allreduce": 2 * (RANKS - 1) / RANKS, "reduce_scatter": (RANKS - 1) / RANKS,
               "allgather": (RANKS - 1) / RANKS, "alltoall": (RANKS - 1) / RANKS,
               "broadcast": 1.0, "reduce": 1.0, "gather": (RANKS - 1) / RANKS, "scatter": (RANKS - 1) / RANKS,
               "scan": 1.0, "sendrecv": 1.0}
    for r in records:
        assert r["busbw_GBps"] == r["algbw_GBps"] * factors[r["collective"]], r
        assert r["wrong"] == 0, r
        assert r["root"] == (0 if r["collective"] in ("broadcast", "reduce", "gather", "scatter") else None), r
    assert {r["algorithm"] for r in records if r["collective"] == "sendrecv"} == {"mpi", "auto"}
    pairs = {(r["collective"], r["size_bytes"], r["algorithm"]) for r in records}
    assert len(table_rows(proc.stdout)) == len(pairs)
    assert {r["collective"] for r in records if r["inplace"]} == set(sweep.COLLECTIVES) - {"sendrecv"}


def test_shared_buffers_run_every_collective_in_and_out_of_place(tmp_path):
    """``--shared``: inputs and results made by ``shared_empty``, a collective call each (a rank without a result
    makes an empty one): every collective in and out of place, every algorithm, checked element by element."""
    path = tmp_path / "shared.json"
    proc = bench("all", "-b", "8", "-e", "64K", "-f", "64", *TINY, "--algorithm", "all", "--shared", "--json", str(path))
    assert proc.returncode == 0, output(proc)
    records = json.loads(path.read_text())["records"]
    assert {r["collective"] for r in records} == set(sweep.COLLECTIVES)
    assert {r["collective"] for r in records if r["inplace"]} == set(sweep.COLLECTIVES) - {"sendrecv"}
    assert {r["algorithm"] for r in records if r["collective"] == "allreduce"} >= {"shm", "mpi"}
    assert all(r["wrong"] == 0 for r in records), [r for r in records if r["wrong"]]


@pytest.mark.parametrize("flags, combos", [
    (["-d", "float16", "-o", "max"], {("float16", "max")}),
    (["-d", "int32", "-o", "all"], {("int32", op) for op in ("sum", "prod", "min", "max", "avg")}),
    (["-d", "bfloat16,int8", "-o", "avg,prod", "--inplace"],
     {(d, op) for d in ("bfloat16", "int8") for op in ("avg", "prod")}),
])
def test_dtype_op_grid_is_exact(tmp_path, flags, combos):
    path = tmp_path / "grid.json"
    proc = bench("all", "-b", "1K", "-e", "1K", *TINY, "--algorithm", "all", *flags, "--json", str(path))
    assert proc.returncode == 0, output(proc)
    records = json.loads(path.read_text())["records"]
    reducing = [r for r in records if r["collective"] in ("allreduce", "reduce_scatter", "reduce")]
    assert {(r["dtype"], r["op"]) for r in reducing} == combos
    assert all(r["wrong"] == 0 for r in records), [r for r in records if r["wrong"]]
    if "--inplace" in flags:
        assert {r["collective"] for r in records if r["inplace"]} == set(sweep.COLLECTIVES) - {"sendrecv"}
        assert {r["collective"] for r in records if not r["inplace"]} == {"sendrecv"}   # it has no in-place form


def test_check_catches_a_wrong_element(tmp_path):
    """A ring allreduce that spoils one element on rank 1: #wrong 1 per size and placement, exit 1 on every rank."""
    wrapper, path = tmp_path / "wrapper.py", tmp_path / "broken.json"
    wrapper.write_text(WRAPPER)
    (tmp_path / "status").mkdir()
    proc = bench("allreduce", "--algorithm", "ring", "-b", "8", "-e", "4K", "-f", "8", *TINY, "--json", str(path),
                 wrapper=str(wrapper), env={"CORRUPT_RANK": "1", "STATUS_DIR": str(tmp_path / "status")})
    assert proc.returncode == 1, output(proc)
    assert statuses(tmp_path / "status") == {0: 1, 1: 1}
    wrong = {(r["size_bytes"], r["inplace"]): r["wrong"] for r in json.loads(path.read_text())["records"]}
    assert wrong == {(size, inplace): 1 for size in (8, 64, 512, 4096) for inplace in (False, True)}
    assert "# FAILED: 8 wrong elements" in proc.stdout
    assert "# Out of bounds values : 8 FAILED" in proc.stdout
    unchecked = bench("allreduce", "--algorithm", "ring", "-b", "8", "-e", "8", *TINY, "-c", "0", "--json", str(path),
                      wrapper=str(wrapper), env={"CORRUPT_RANK": "1", "STATUS_DIR": str(tmp_path / "status")})
    assert unchecked.returncode == 0, output(unchecked)
    assert [r["wrong"] for r in json.loads(path.read_text())["records"]] == [None, None]
    assert "# Out of bounds values : N/A (not checked: -c 0)" in unchecked.stdout


@pytest.mark.parametrize("flags, says", [(["-b", "x"], "-b/--min-bytes"), (["-d", "nonsense"], "-d/--dtype"),
                                         (["--algorithm", "nope"], "--algorithm")])
def test_bad_flags_fail_on_every_rank(tmp_path, flags, says):
    wrapper = tmp_path / "wrapper.py"
    wrapper.write_text(WRAPPER)
    (tmp_path / "status").mkdir()
    proc = bench("allreduce", *flags, wrapper=str(wrapper), env={"STATUS_DIR": str(tmp_path / "status")}, timeout=60)
    assert proc.returncode == 2, output(proc)
    lines = proc.stderr.splitlines()
    assert len(lines) == RANKS and all(line.startswith("pycollect bench allreduce: error:") and says in line
                                       for line in lines), proc.stderr
    assert proc.stdout == ""
    assert statuses(tmp_path / "status") == {0: 2, 1: 2}


def test_trials_rotate_which_algorithm_runs_first():
    """Each trial starts one algorithm further on, so MPI's baseline (listed first) is not always timed first."""
    names = ["mpi", "auto", "ring"]
    orders = [sweep.rotated(names, t) for t in range(4)]
    assert [o[0] for o in orders] == ["mpi", "auto", "ring", "mpi"]
    assert all(sorted(o) == sorted(names) for o in orders)


# -- command lines that differ between ranks, outputs rank 0 cannot write: every rank stops before any timing ---------
def bench_per_rank(first, second, timeout=60):
    """``mpiexec -n 1 pycollect bench FIRST : -n 1 pycollect bench SECOND`` (a hang ends at MPIEXEC_TIMEOUT)."""
    program = [sys.executable, "-m", "pycollect", "bench"]
    cmd = ["mpiexec", "-n", "1", *program, *first, ":", "-n", "1", *program, *second]
    return subprocess.run(cmd, env={**ENV, "MPIEXEC_TIMEOUT": "30"}, cwd=ROOT, capture_output=True, text=True,
                          timeout=timeout)


SAME = ["allreduce", "-b", "8", "-e", "64", "-n", "1", "-w", "0"]


@pytest.mark.parametrize("extra", [["-d", "float64"],    # was a wrong table
                                   ["-e", "128"]])        # was a hang
def test_ranks_with_different_command_lines_all_stop(extra):
    """Agreed in cli.main before anything else is collective: both ranks say so, exit 2, nothing timed."""
    proc = bench_per_rank(SAME, SAME + extra)
    assert proc.returncode == 2, output(proc)
    lines = proc.stderr.splitlines()
    assert len(lines) == 2 and all(line.startswith("pycollect bench: error: the ranks' command lines differ "
                                                   "(command line: ") and "on rank 1" in line
                                   and line.endswith("run the same command line on every rank")
                                   for line in lines), proc.stderr
    assert proc.stdout == ""


@pytest.mark.parametrize("bad, says", [(["-b", "0"], "argument -b/--min-bytes: size must be at least 1 byte"),
                                       (["--bogus"], "unrecognized arguments: --bogus")])
def test_a_bad_flag_on_one_rank_stops_every_rank(bad, says):
    proc = bench_per_rank(SAME, SAME + bad)     # rank 1 refuses its command line before MPI was ever used
    assert proc.returncode == 2, output(proc)
    lines = sorted(proc.stderr.splitlines())
    stopped = "pycollect bench: error: the ranks' command lines differ: rank 1 stopped: a bad flag (its line says why)"
    assert len(lines) == 2 and stopped in lines and any(f"error: {says}" in line for line in lines), proc.stderr
    assert proc.stdout == ""


def test_an_output_rank_0_cannot_write_stops_every_rank_before_the_sweep(tmp_path):
    proc = bench(*SAME, "--json", str(tmp_path / "ok.json"), "--csv", "/proc/x.csv", timeout=60)
    assert proc.returncode == 2, output(proc)
    assert proc.stderr.splitlines() == ["pycollect bench: error: --csv /proc/x.csv: cannot create files in /proc "
                                        "(No such file or directory)"] * RANKS, proc.stderr
    assert proc.stdout == "" and not list(tmp_path.iterdir())


def test_a_command_line_that_differs_in_its_middle_shows_where():
    """The message cut both command lines to their ends alike, and a flag that differed in the middle vanished: both
    shown lines read the same (found by a helper). They are cut around where they first differ now."""
    from pycollect.tools.common import _shown_apart
    words = ["pycollect", "train", "--tp", "2", "--dp", "2", "--steps", "30", "--lr", "0.001", "--batch", "16",
             "--embd", "32", "--heads", "4", "--layers", "2", "--seed", "7", "--json", "out.json"]
    other = list(words)
    other[9] = "-1"
    one, two = _shown_apart(words, other)
    assert '"0.001"' in one and '"-1"' in two and one != two, (one, two)
    assert _shown_apart({"x": 1}, {"x": 2}) == ('{"x": 1}', '{"x": 2}')
