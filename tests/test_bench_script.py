"""bench/collectives.py --quick under ``mpiexec -n 2``: exits 0 and writes a complete, consistent JSON file."""
import json
import os
import subprocess
import sys

import pytest

import pycollect as pc

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
SCRIPT = os.path.join(ROOT, "bench", "collectives.py")
COLLECTIVES = ("allreduce", "reduce_scatter", "allgather", "alltoall")
RANKS = 2


def _factor(collective: str, n: int) -> float:
    return 2 * (n - 1) / n if collective == "allreduce" else (n - 1) / n


@pytest.fixture(scope="module")
def quick(tmp_path_factory):
    """The exit status, output and parsed JSON of one quick run (every collective, every algorithm)."""
    path = tmp_path_factory.mktemp("bench") / "quick.json"
    env = dict(os.environ, MPIEXEC_TIMEOUT="120", OMP_NUM_THREADS="1", OPENBLAS_NUM_THREADS="1")
    cmd = ["mpiexec", "-n", str(RANKS), sys.executable, SCRIPT, "--quick", "--json", str(path)]
    proc = subprocess.run(cmd, env=env, cwd=ROOT, capture_output=True, text=True, timeout=180)
    data = json.loads(path.read_text()) if path.exists() else None
    return proc, data


def test_exits_zero_and_writes_json(quick):
    proc, data = quick
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    assert data is not None and data["header"]["world_size"] == RANKS
    assert "# targets:" in proc.stdout
    assert all(line.startswith("#") or line.strip()[:1].isdigit() for line in proc.stdout.splitlines() if line)


def test_header_names_the_setup(quick):
    head = quick[1]["header"]
    for key in ("topology", "mpi_library", "numpy", "date", "argv"):
        assert head[key], key
    assert "--quick" in head["argv"]


@pytest.mark.parametrize("collective", COLLECTIVES)
def test_every_algorithm_has_rows_at_every_size(quick, collective):
    records = [r for r in quick[1]["records"] if r["collective"] == collective]
    sizes = {r["size_bytes"] for r in records}
    assert sizes and max(sizes) == 1 << 20
    for algorithm in pc.algorithms(collective):
        got = {r["size_bytes"] for r in records if r["algorithm"] == algorithm}
        assert got == sizes, (collective, algorithm)


def test_rows_are_consistent(quick):
    for r in quick[1]["records"]:
        assert r["time_us"] > 0 and r["time_us_min"] > 0 and r["iters"] >= 3, r
        assert r["time_us_min"] <= r["time_us_avg"] <= r["time_us_max"], r
        assert r["time_us"] == r["time_us_avg"] and not r["inplace"], r   # the script's defaults: -a 1, out of place
        assert r["algbw_GBps"] == r["size_bytes"] / (r["time_us"] * 1e-6) / 1e9, r
        assert r["busbw_GBps"] == r["algbw_GBps"] * _factor(r["collective"], RANKS), r
        assert r["wrong"] == 0, r
        if r["algorithm"] == "mpi":
            assert r["vs_mpi"] == 1.0, r
        if r["algorithm"] == "auto":
            assert r["resolved"] in pc.algorithms(r["collective"]), r
        if r["collective"] == "allreduce" and r["size_bytes"] >= 1 << 20:   # every rank's copy, timed beside
            assert r["copy_GBps"] == r["size_bytes"] / (r["copy_us"] * 1e-6) / 1e9 > 0, r
            assert r["busbw_vs_copy"] == r["busbw_GBps"] / r["copy_GBps"], r
        else:
            assert r["copy_us"] is None and r["busbw_vs_copy"] is None, r


def test_targets_name_the_busbw_against_the_copy_bandwidth():
    from pycollect.tools import sweep_output
    rows = [{"collective": "allreduce", "dtype": "float32", "op": "sum", "nominal_bytes": 64 << 20, "inplace": False,
             "algorithm": a, "vs_mpi": 1.0, "busbw_vs_copy": v, "copy_GBps": 5.0} for a, v in
            (("mpi", 0.9), ("ring", 0.8), ("auto", 0.7))]
    got = sweep_output.targets(rows)["allreduce busbw / concurrent copy bandwidth at 64M"]
    assert got == {"value": 0.8, "algorithm": "ring", "copy_GBps": 5.0}   # MPI's own is the baseline, not a contender


@pytest.fixture(scope="module")
def rooted(tmp_path_factory):
    """One quick run of gather, scatter and scan, out of place and in place, every algorithm."""
    path = tmp_path_factory.mktemp("bench") / "rooted.json"
    env = dict(os.environ, MPIEXEC_TIMEOUT="120", OMP_NUM_THREADS="1", OPENBLAS_NUM_THREADS="1")
    cmd = ["mpiexec", "-n", str(RANKS), sys.executable, SCRIPT, "--quick", "--sizes", "8,4K,1M", "--placement", "both",
           "--collectives", "gather,scatter,scan", "--json", str(path)]
    proc = subprocess.run(cmd, env=env, cwd=ROOT, capture_output=True, text=True, timeout=180)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    return json.loads(path.read_text())["records"]


def test_gather_scatter_and_scan_against_mpis_regular_calls(rooted):
    """Every algorithm at every size and placement, checked right; the baseline is MPI_Gather, MPI_Scatter, MPI_Scan
    (the sweep's blocks are even); gather and scatter from root 0, their busbw the root's share."""
    calls = {"gather": "MPI_Gather", "scatter": "MPI_Scatter", "scan": "MPI_Scan"}
    for collective, call in calls.items():
        records = [r for r in rooted if r["collective"] == collective]
        got = {(r["algorithm"], r["nominal_bytes"], r["inplace"]) for r in records}
        assert got == {(a, b, p) for a in pc.algorithms(collective) for b in (8, 4096, 1 << 20) for p in (False, True)}
        for r in records:
            assert r["wrong"] == 0 and r["time_us"] > 0, r
            assert r["size_bytes"] % (4 * RANKS if collective != "scan" else 4) == 0, r   # even blocks
            assert r["root"] == (None if collective == "scan" else 0) and r["op"] == ("sum" if collective == "scan"
                                                                                         else None), r
            assert r["mpi_call"] == (call if r["algorithm"] == "mpi" else None), r
            factor = 1.0 if collective == "scan" else (RANKS - 1) / RANKS
            assert r["busbw_GBps"] == r["algbw_GBps"] * factor, r


BROKEN_RING = """
import runpy, sys
import pycollect as pc
honest = pc.Communicator.allreduce
def broken(self, x, op="sum", algorithm="auto", out=None, accumulate=None):
    result = honest(self, x, op=op, algorithm=algorithm, out=out, accumulate=accumulate)
    if algorithm == "ring" and self.rank == 1:
        result[:1] += 1
    return result
pc.Communicator.allreduce = broken
sys.argv = [sys.argv[1]] + sys.argv[2:]
runpy.run_path(sys.argv[0], run_name="__main__")
"""


def test_wrong_results_fail_the_run(tmp_path):
    """A schedule that corrupts one element on one rank shows in #wrong and makes the exit status 1."""
    path = tmp_path / "broken.json"
    env = dict(os.environ, MPIEXEC_TIMEOUT="60", OMP_NUM_THREADS="1")
    cmd = ["mpiexec", "-n", str(RANKS), sys.executable, "-c", BROKEN_RING, SCRIPT, "--collectives", "allreduce",
           "--algorithms", "ring", "--sizes", "8,4K", "--iters", "3", "--warmup", "1", "--json", str(path)]
    proc = subprocess.run(cmd, env=env, cwd=ROOT, capture_output=True, text=True, timeout=90)
    assert proc.returncode == 1, proc.stdout[-3000:] + proc.stderr[-3000:]
    wrong = {(r["algorithm"], r["size_bytes"]): r["wrong"] for r in json.loads(path.read_text())["records"]}
    assert wrong == {("mpi", 8): 0, ("ring", 8): 1, ("mpi", 4096): 0, ("ring", 4096): 1}


SEEN_ALGORITHMS = """
import json, runpy, sys
import pycollect as pc
seen, honest = set(), pc.Communicator.allreduce
def watched(self, x, op="sum", algorithm="auto", out=None, accumulate=None):
    seen.add(algorithm)
    return honest(self, x, op=op, algorithm=algorithm, out=out, accumulate=accumulate)
pc.Communicator.allreduce = watched
sys.argv = sys.argv[2:]
try:
    runpy.run_path(sys.argv[0], run_name="__main__")
finally:   # the script ends with sys.exit
    json.dump(sorted(seen), open(sys.argv[-1] + ".seen", "w"))
"""


def test_lean_overhead_times_the_algorithm_it_is_given(tmp_path):
    """``lean_overhead.py --algorithm allreduce=ring``: pycollect's allreduces run the ring schedule (the others
    auto), the header says so; a collective it does not time is refused."""
    script = os.path.join(os.path.dirname(SCRIPT), "lean_overhead.py")
    path = tmp_path / "lean.json"
    base = ["--allreduce-sizes", "4K", "--allgather-sizes", "", "--others", "", "--iters", "2", "--trials", "1"]
    subprocess.run([sys.executable, "-c", SEEN_ALGORITHMS, "-", script] + base +
                   ["--algorithm", "allreduce=ring", "--out", str(path)], check=True, capture_output=True, timeout=120)
    assert json.load(open(str(path) + ".seen")) == ["ring"]
    data = json.load(open(path))
    assert data["header"]["algorithms"] == {"allreduce": "ring"}
    assert {r["variant"] for r in data["records"]} == {"mpi", "pycollect", "pycollect out="}
    bad = subprocess.run([sys.executable, script, "--algorithm", "allredcue=ring"], capture_output=True, text=True,
                         timeout=60)
    assert bad.returncode == 2 and "--algorithm: unknown collective(s) allredcue" in bad.stderr
