"""bench/moe.py under ``mpiexec -n 2`` at tiny sizes: exit 0, complete and consistent JSON, checked rows.

Also: rows moved wrongly make the exit status 1, and a bad flag exits 2 before any communication.
"""
import json
import math
import os
import subprocess
import sys

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
SCRIPT = os.path.join(ROOT, "bench", "moe.py")
RANKS = 2
T, C, E, K = 64, 16, 4, 2
ARGS = ["--tokens", str(T), "--hidden", str(C), "--experts", str(E), "--top-k", str(K), "--capacity-factor", "1.0",
        "--skew", "1.5", "--iters", "3", "--warmup", "1", "--trials", "2"]
KEYS = {"routing", "mode", "tokens", "hidden", "experts", "top_k", "capacity_factor", "capacity", "skew", "dtype",
        "dropped_rate", "tokens_dropped_rate", "dropped_per_expert", "load_per_expert", "load_imbalance",
        "recv_rows_per_rank", "bytes_busiest_rank", "wrong", "variant", "algorithm", "resolved", "iters", "time_ms",
        "time_ms_min", "time_ms_max", "trial_medians_ms", "GBps", "vs_mpi"}


def launch(tmp_path, args, wrapper=None):
    """Run bench/moe.py under mpiexec; returns (process, parsed JSON or None)."""
    path = tmp_path / "moe.json"
    env = dict(os.environ, MPIEXEC_TIMEOUT="60", OMP_NUM_THREADS="1", OPENBLAS_NUM_THREADS="1",
               PYTHONPATH=os.pathsep.join([ROOT] + [p for p in [os.environ.get("PYTHONPATH")] if p]))
    head = [sys.executable, SCRIPT] if wrapper is None else [sys.executable, "-c", wrapper, SCRIPT]
    cmd = ["mpiexec", "-n", str(RANKS), *head, *args, "--json", str(path)]
    proc = subprocess.run(cmd, env=env, cwd=ROOT, capture_output=True, text=True, timeout=90)
    return proc, (json.loads(path.read_text()) if path.exists() else None)


def positive(x) -> bool:
    return isinstance(x, (int, float)) and math.isfinite(x) and x > 0


@pytest.fixture(scope="module")
def run(tmp_path_factory):
    return launch(tmp_path_factory.mktemp("moe"), ARGS)


def test_runs_and_writes_json(run):
    proc, data = run
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    assert data["schema"] == "pycollect.bench/1" and data["kind"] == "moe"
    head = data["header"]
    assert head["world_size"] == RANKS and "--tokens" in head["argv"] and head["topology"]
    assert "vs_mpi" in proc.stdout


def test_records(run):
    records = run[1]["records"]
    assert [(r["routing"], r["mode"], r["variant"]) for r in records] == [
        (routing, mode, v) for routing in ("balanced", "skewed") for mode in ("capacity", "dropless")
        for v in ("dispatch_combine", "pc_alltoall", "mpi")]
    cap = math.ceil(K * T / E * 1.0)
    for r in records:
        assert set(r) == KEYS, r
        assert r["wrong"] == 0 and r["iters"] == 6 and len(r["trial_medians_ms"]) == 2, r
        assert r["time_ms_min"] <= r["time_ms"] <= r["time_ms_max"] and positive(r["time_ms_min"]), r
        assert r["GBps"] == pytest.approx(r["bytes_busiest_rank"] / (r["time_ms"] * 1e-3) / 1e9), r
        assert sum(r["load_per_expert"]) == RANKS * T * K, r
        dropped = sum(r["dropped_per_expert"])
        assert r["dropped_rate"] == pytest.approx(dropped / (RANKS * T * K)), r
        assert sum(r["recv_rows_per_rank"]) == RANKS * T * K - dropped, r  # what was kept, all delivered
        assert r["capacity"] == (cap if r["mode"] == "capacity" else None), r
        if r["mode"] == "dropless":
            assert dropped == 0 and r["tokens_dropped_rate"] == 0, r
        if r["variant"] == "mpi":
            assert r["vs_mpi"] == 1.0, r
    skewed = [r for r in records if r["routing"] == "skewed" and r["mode"] == "capacity"]
    balanced = [r for r in records if r["routing"] == "balanced"]
    assert skewed[0]["dropped_rate"] > 0.1 and skewed[0]["load_imbalance"] > max(b["load_imbalance"] for b in balanced)
    s = run[1]["summary"]
    assert set(s) == {"balanced_capacity", "balanced_dropless", "skewed_capacity", "skewed_dropless"}
    assert all(positive(v["vs_mpi_dispatch_combine"]) for v in s.values())


CORRUPT = """
import runpy, sys
from pycollect.moe import dispatch
honest = dispatch.to_experts
def to_experts(rows, plan, group, algorithm="auto"):
    got = honest(rows, plan, group, algorithm)
    if group.rank == 1 and len(got):
        got[:1] += 1
    return got
dispatch.to_experts = to_experts
sys.argv = sys.argv[1:]
runpy.run_path(sys.argv[0], run_name="__main__")
"""


def test_rows_moved_wrongly_fail_the_run(tmp_path):
    proc, data = launch(tmp_path, [*ARGS, "--iters", "1", "--trials", "1", "--warmup", "0"], wrapper=CORRUPT)
    assert proc.returncode == 1, proc.stdout[-3000:] + proc.stderr[-3000:]
    assert "FAILED" in proc.stdout and all(r["wrong"] > 0 for r in data["records"])


@pytest.mark.parametrize("args, message", [
    (["--experts", "3"], "--experts 3 does not divide by the 2 ranks"),
    (["--top-k", "9"], "--top-k 9 is larger than --experts 8"),
    (["--algorithm", "fastest"], "--algorithm 'fastest' is not an alltoall algorithm"),
])
def test_bad_flags_exit_2(tmp_path, args, message):
    proc, data = launch(tmp_path, args)
    assert proc.returncode == 2 and message in proc.stderr and data is None, proc.stderr
