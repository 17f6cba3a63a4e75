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
    assert all(positive(v["vs_mpi_dispatch_combine"]) and positive(v["vs_mpi_pc_alltoall"]) for v in s.values())
    assert run[1]["failed"] == []


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
    assert "FAILED" in proc.stdout
    assert_only_wrong(data, "dispatch_combine")


def assert_only_wrong(data, variant):
    """``variant`` wrong at every point (its vs_mpi null, in the records and the summary, and named in ``failed``);
    the others right."""
    for r in data["records"]:
        assert (r["wrong"] > 0) == (r["variant"] == variant), r
        assert (r["vs_mpi"] is None) == (r["variant"] == variant), r
    assert len(data["failed"]) == 4 and all(variant in f for f in data["failed"]), data["failed"]
    other = "vs_mpi_pc_alltoall" if variant == "dispatch_combine" else "vs_mpi_dispatch_combine"
    for point in data["summary"].values():
        assert point[f"vs_mpi_{variant}"] is None and positive(point[other]), point


# pycollect's alltoall given a row of counts (the pc_alltoall variant; dispatch hands it the whole matrix) corrupts
# one row on rank 1: at every call ("always"), or after the first two at each point (routing and mode: a point starts
# with router.keep_mask), which are the check before timing ("later")
ROW_COUNTS_WRONG = """
import runpy, sys
import numpy as np
import pycollect as pc
from pycollect.moe import router
honest, calls, later = pc.Communicator.alltoall, [0], sys.argv.pop(1) == "later"
def alltoall(self, x, counts=None, **kw):
    got = honest(self, x, counts=counts, **kw)
    if counts is not None and np.ndim(counts) == 1:
        calls[0] += 1
        if self.rank == 1 and len(got) and (calls[0] > 2 or not later):
            got[:1] += 1
    return got
pc.Communicator.alltoall = alltoall
honest_mask = router.keep_mask
def keep_mask(*a, **kw):
    calls[0] = 0
    return honest_mask(*a, **kw)
router.keep_mask = keep_mask
sys.argv = sys.argv[1:]
runpy.run_path(sys.argv[0], run_name="__main__")
"""

# pycollect.moe.dispatch.to_experts right at its first call at each point (the check before timing), wrong on rank 1
# from then on (the timed steps)
DISPATCH_WRONG_LATER = """
import runpy, sys
from pycollect.moe import dispatch, router
honest, calls = dispatch.to_experts, [0]
def to_experts(rows, plan, group, algorithm="auto"):
    got = honest(rows, plan, group, algorithm)
    calls[0] += 1
    if group.rank == 1 and len(got) and calls[0] > 1:
        got[:1] += 1
    return got
dispatch.to_experts = to_experts
honest_mask = router.keep_mask
def keep_mask(*a, **kw):
    calls[0] = 0
    return honest_mask(*a, **kw)
router.keep_mask = keep_mask
sys.argv = sys.argv[1:]
runpy.run_path(sys.argv[0], run_name="__main__")
"""


@pytest.mark.parametrize("when", ["always", "later"])
def test_pc_alltoall_moving_rows_wrongly_fails_the_run(tmp_path, when):
    """The timed pc_alltoall variant (a row of counts each: the count exchange's path) is checked like the others,
    before and after the timed steps."""
    proc, data = launch(tmp_path, [*ARGS, "--iters", "1", "--trials", "1", "--warmup", "0"],
                        wrapper=ROW_COUNTS_WRONG.replace("sys.argv.pop(1)", repr(when)))
    assert proc.returncode == 1, proc.stdout[-3000:] + proc.stderr[-3000:]
    assert "FAILED" in proc.stdout
    assert_only_wrong(data, "pc_alltoall")


def test_dispatch_going_wrong_in_the_timed_steps_fails_the_run(tmp_path):
    proc, data = launch(tmp_path, [*ARGS, "--iters", "1", "--trials", "1", "--warmup", "0"],
                        wrapper=DISPATCH_WRONG_LATER)
    assert proc.returncode == 1, proc.stdout[-3000:] + proc.stderr[-3000:]
    assert "FAILED" in proc.stdout
    assert_only_wrong(data, "dispatch_combine")


@pytest.mark.parametrize("args, message", [
    (["--experts", "3"], "--experts 3 does not divide by the 2 ranks"),
    (["--top-k", "9"], "--top-k 9 is larger than --experts 8"),
    (["--algorithm", "fastest"], "--algorithm 'fastest' is not an alltoall algorithm"),
])
def test_bad_flags_exit_2(tmp_path, args, message):
    proc, data = launch(tmp_path, args)
    assert proc.returncode == 2 and message in proc.stderr and data is None, proc.stderr
