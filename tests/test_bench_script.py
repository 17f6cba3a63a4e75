"""bench/collectives.py --quick under ``mpiexec -n 2``: exits 0 and writes a complete, consistent JSON file."""
import json
import os
import subprocess
import sys

import numpy as np
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


def run_script(tmp_path, script, args, wrapper=None, ranks=RANKS, timeout=120, out="--json"):
    """``bench/<script>`` under ``mpiexec -n ranks`` (through ``wrapper``, a ``python -c`` program that gets the
    script's path as its first argument, when given), its JSON written where ``out`` says; returns (process, the
    JSON or None)."""
    path = tmp_path / "out.json"
    env = dict(os.environ, MPIEXEC_TIMEOUT=str(timeout - 10), OMP_NUM_THREADS="1", OPENBLAS_NUM_THREADS="1",
               PYTHONPATH=os.pathsep.join([ROOT] + [p for p in [os.environ.get("PYTHONPATH")] if p]))
    script = os.path.join(ROOT, "bench", script)
    head = [sys.executable, script] if wrapper is None else [sys.executable, "-c", wrapper, script]
    if path.exists():
        path.unlink()
    proc = subprocess.run(["mpiexec", "-n", str(ranks), *head, *args, out, str(path)], env=env, cwd=ROOT,
                          capture_output=True, text=True, timeout=timeout)
    return proc, (json.loads(path.read_text()) if path.exists() else None)


# the ring allreduce right at its first call on each Communicator, wrong on rank 1 from its second call on
RING_GOES_WRONG = """
import runpy, sys
import pycollect as pc
honest, calls = pc.Communicator.allreduce, {}
def later_wrong(self, x, op="sum", algorithm="auto", out=None, accumulate=None):
    result = honest(self, x, op=op, algorithm=algorithm, out=out, accumulate=accumulate)
    if algorithm == "ring" and self.rank == 1:
        calls[id(self)] = calls.get(id(self), 0) + 1
        if calls[id(self)] > 1:
            result[:1] += 1
    return result
pc.Communicator.allreduce = later_wrong
sys.argv = sys.argv[1:]
runpy.run_path(sys.argv[0], run_name="__main__")
"""


def test_two_tier_checks_after_the_timed_calls(tmp_path):
    """two_tier.py: right at their first call, the rings (flat and ordered) go wrong in their timed calls: the check
    after them counts it, their ratios are null, the JSON names them and the exit status is 1; the others stay
    right."""
    args = ["--sizes", "4K", "--iters", "2", "--trials", "2"]
    proc, data = run_script(tmp_path, "two_tier.py", args)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    assert data["failed"] == [] and all(r["wrong"] == 0 and r["vs_mpi"] > 0 for r in data["records"])
    proc, data = run_script(tmp_path, "two_tier.py", args, wrapper=RING_GOES_WRONG)
    assert proc.returncode == 1, proc.stdout[-3000:] + proc.stderr[-3000:]
    assert "FAILED" in proc.stdout
    by = {r["variant"]: r for r in data["records"]}
    assert all(by[v]["wrong"] == 1 and by[v]["vs_mpi"] is None for v in ("flat_ring", "ring"))
    assert all(by[v]["wrong"] == 0 and by[v]["vs_mpi"] > 0 for v in ("hierarchical", "rabenseifner", "mpi"))
    assert all(r["vs_flat_ring"] is None for r in data["records"])   # its baseline was wrong
    assert [f.split(":")[0] for f in data["failed"]] == ["4K flat_ring", "4K ring"]


def test_two_tier_rotates_the_variants_per_trial():
    """Each trial starts one variant further on (pycollect.tools.sweep.rotated), as the sweep's trials do."""
    sys.path.insert(0, os.path.join(ROOT, "bench"))
    try:
        import two_tier
    finally:
        sys.path.pop(0)
    order = []

    class Args:
        trials, iters = 3, 1

    class World:
        rank, size = 0, 2

        def allreduce(self, value, op=None):
            return value

        def Barrier(self):
            pass

        def Allreduce(self, x, out, op):
            order.append("mpi")
            out[...] = 2 * x

    class Comm:
        def __init__(self, flat):
            self.flat = flat

        def allreduce(self, x, algorithm="auto", out=None):
            if out is not None:
                order.append(("flat_" if self.flat else "") + algorithm)
            result = np.empty_like(x) if out is None else out
            result[...] = 2 * x
            return result

    comms = {v: Comm(v == "flat_ring") for v in two_tier.VARIANTS}
    rows = two_tier.measure(World(), comms, 64, Args())
    assert all(r["wrong"] == 0 for r in rows)
    runs = [v for i, v in enumerate(order) if i == 0 or order[i - 1] != v]   # each variant's calls as one run
    n = len(two_tier.VARIANTS)
    assert len(runs) == 5 * n and runs[:n] == runs[-n:] == list(two_tier.VARIANTS)   # the checks, before and after
    assert [runs[n + k * n] for k in range(3)] == ["flat_ring", "ring", "hierarchical"], runs


# pycollect's allreduce wrong on rank 1 from its fourth call on (the warm-up and timed calls; no check before them)
ALLREDUCE_GOES_WRONG = """
import runpy, sys
import pycollect as pc
honest, calls = pc.Communicator.allreduce, [0]
def later_wrong(self, x, op="sum", algorithm="auto", out=None, accumulate=None):
    result = honest(self, x, op=op, algorithm=algorithm, out=out, accumulate=accumulate)
    calls[0] += 1
    if self.rank == 1 and calls[0] > 3:
        result[-1:] += 1
    return result
pc.Communicator.allreduce = later_wrong
sys.argv = sys.argv[1:]
runpy.run_path(sys.argv[0], run_name="__main__")
"""


def test_lean_overhead_checks_every_case_after_its_timed_calls(tmp_path):
    """lean_overhead.py: every case (bare MPI and pycollect's, every collective) right, exit 0; pycollect's allreduce
    wrong in its timed calls, its two cases counted wrong on every rank, no figure, the JSON names them, exit 1."""
    args = ["--allreduce-sizes", "64", "--allgather-sizes", "64", "--other-sizes", "8,64", "--iters", "3",
            "--large-iters", "2", "--trials", "1"]
    proc, data = run_script(tmp_path, "lean_overhead.py", args, out="--out")
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    assert data["failed"] == [] and len(data["records"]) == 3 + 4 + 2 * 3 * 7
    assert all(r["wrong"] == 0 and r["ratio"] > 0 for r in data["records"])
    args = ["--allreduce-sizes", "64", "--allgather-sizes", "", "--others", "", "--iters", "5", "--trials", "2"]
    proc, data = run_script(tmp_path, "lean_overhead.py", args, wrapper=ALLREDUCE_GOES_WRONG, out="--out")
    assert proc.returncode == 1, proc.stdout[-3000:] + proc.stderr[-3000:]
    assert "FAILED" in proc.stdout
    by = {r["variant"]: r for r in data["records"]}
    assert by["mpi"]["wrong"] == 0 and by["mpi"]["ratio"] == 1.0
    assert all(by[v]["wrong"] == 1 and by[v]["ratio"] is None for v in ("pycollect", "pycollect out="))
    assert len(data["failed"]) == 2


def test_scale_leaves_failed_runs_out_and_exits_1(tmp_path, monkeypatch):
    """scale.py: a plan or explain run that exits non-zero has no seconds (kept as seconds_failed), is named in the
    JSON's failed, and the exit status is 1; with every run right, 0 (subprocess.run stands in for the commands)."""
    sys.path.insert(0, os.path.join(ROOT, "bench"))
    try:
        import scale
    finally:
        sys.path.pop(0)
    monkeypatch.setattr(scale.registry, "COLLECTIVES", ("allreduce", "broadcast"))
    failing = set()

    def fake(cmd, **kwargs):
        name = cmd[4] if len(cmd) > 4 and cmd[3] in ("plan", "explain") else None
        return subprocess.CompletedProcess(cmd, 1 if name in failing else 0, "", "")

    monkeypatch.setattr(scale.subprocess, "run", fake)
    argv = ["--no-traffic", "--no-simulate", "--sizes", "16", "--json", str(tmp_path / "s.json")]
    assert scale.main(argv) == 0
    data = json.loads((tmp_path / "s.json").read_text())
    assert data["failed"] == [] and all(r["seconds"] is not None for r in data["records"])
    failing.update({"--model", "broadcast"})   # every plan (cmd[4] is its flag) and explain broadcast
    assert scale.main(argv) == 1
    data = json.loads((tmp_path / "s.json").read_text())
    bad = [r for r in data["records"] if r.get("ok") is False]
    assert len(bad) == 3 + 1 and len(data["failed"]) == 4
    assert all(r["seconds"] is None and r["seconds_failed"] >= 0 for r in bad)
    assert all(r["seconds"] is not None for r in data["records"] if r not in bad)


# tcp_exchange's exchange of the polled pattern leaves one byte wrong on rank 2 from its second exchange on
TCP_GOES_WRONG = """
import importlib.util, sys
spec = importlib.util.spec_from_file_location("tcp_exchange", sys.argv[1])
script = importlib.util.module_from_spec(spec)
spec.loader.exec_module(script)
honest, calls = script.exchange, [0]
def exchange(comm, pattern, buf, got, one):
    seconds = honest(comm, pattern, buf, got, one)
    if pattern == "two pairs polled":
        calls[0] += 1
        if comm.rank == 2 and calls[0] > 1:
            got[-1] ^= 1
    return seconds
script.exchange = exchange
sys.argv = sys.argv[1:]
sys.exit(script.main())
"""


@pytest.mark.parametrize("wrong", [False, True])
def test_tcp_exchange_checks_the_bytes_received(tmp_path, wrong):
    """tcp_exchange.py at 4 ranks, tiny sizes: every received message compared with what its peer sent; one wrong
    byte in the polled pattern's timed exchanges counts, the JSON names it, exit 1 on every rank."""
    proc, data = run_script(tmp_path, "tcp_exchange.py", ["--sizes", "1K", "--repeats", "2"], ranks=4,
                            wrapper=TCP_GOES_WRONG if wrong else None)
    assert proc.returncode == (1 if wrong else 0), proc.stdout[-3000:] + proc.stderr[-3000:]
    by = {r["pattern"]: r for r in data["records"]}
    assert {p: r["wrong"] for p, r in by.items()} == {p: 2 if wrong and p == "two pairs polled" else 0 for p in by}
    assert len(data["failed"]) == wrong and ("FAILED" in proc.stdout) == wrong


# the allreduce ring wrong on rank 1 at every call (cluster_sim_check times it through tools/fit.measure)
RING_WRONG = RING_GOES_WRONG.replace("calls[id(self)] > 1", "True")


@pytest.mark.parametrize("wrong", [False, True])
def test_cluster_sim_check_checks_every_schedule_after_the_timing(tmp_path, wrong):
    """cluster_sim_check.py at tiny sizes: every schedule timed is checked against MPI's own afterwards; a wrong ring
    is counted, its rows left out, the JSON names it, exit 1 on every rank."""
    args = ["--sizes", "1K,4K", "--pair-max", "4K", "--iters", "2", "--collectives", "allreduce,allgather"]
    proc, data = run_script(tmp_path, "cluster_sim_check.py", args, wrapper=RING_WRONG if wrong else None)
    assert proc.returncode == (1 if wrong else 0), proc.stdout[-3000:] + proc.stderr[-3000:]
    algorithms = {(r["collective"], r["algorithm"]) for r in data["records"]}
    assert all(r["wrong"] == 0 for r in data["records"])
    assert (("allreduce", "ring") in algorithms) != wrong and ("allgather", "ring") in algorithms
    assert [f.split(":")[0] for f in data["failed"]] == (["allreduce 1K ring", "allreduce 4K ring"] if wrong else [])
