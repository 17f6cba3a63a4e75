"""bench/tp_mlp.py and bench/dp_overlap.py under ``mpiexec -n 2`` at tiny sizes: exit 0, complete JSON, checked results.

Also: a corrupted ParallelMLP or DataParallel shows in the recorded error and makes the exit status 1.
"""
import json
import math
import os
import subprocess
import sys

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
RANKS = 2
TP_ARGS = ["--batch", "2", "--seq", "8", "--hidden", "32", "--ffn", "64", "--iters", "3", "--warmup", "1", "--trials", "2"]
DP_ARGS = ["--layers", "3", "--width", "32", "--batch", "4", "--bucket-bytes", "4K", "--iters", "3", "--warmup", "1",
           "--trials", "2"]
TP_KEYS = {"variant", "ranks_computing", "tp", "batch", "seq", "hidden", "ffn", "dtype", "iters", "time_ms", "time_ms_min",
           "time_ms_max", "trial_medians_ms", "linear_ms", "gelu_ms", "comm_ms", "comm_ms_max", "comm_calls",
           "rank_medians_ms", "gflops_per_rank"}
TP_SUMMARY = {"t1_solo_ms", "t1_both_ms", "t2_ms", "efficiency_solo", "efficiency_both", "comm_ms", "comm_share",
              "allreduce_alone_ms", "err_y", "err_dx", "err_grads", "tolerance"}
DP_KEYS = {"variant", "layers", "width", "batch", "dtype", "bucket_bytes", "buckets", "traffic_bytes", "iters", "time_ms",
           "time_ms_min", "time_ms_max", "trial_medians_ms", "ready_ms", "finish_ms", "err"}
DP_SUMMARY = {"compute_ms", "no_overlap_ms", "overlap_ms", "overlap_no_progress_ms", "comm_only_ms", "speedup",
              "speedup_no_progress", "progress_gain", "hidden", "paired_speedup", "paired_exposed_ms", "max_err",
              "tolerance", "buckets"}


def launch(tmp_path, script_args, wrapper=None):
    """Run a bench script under mpiexec; returns (process, parsed JSON or None)."""
    path = tmp_path / "out.json"
    env = dict(os.environ, MPIEXEC_TIMEOUT="60", OMP_NUM_THREADS="1", OPENBLAS_NUM_THREADS="1",
               PYTHONPATH=os.pathsep.join([ROOT] + [p for p in [os.environ.get("PYTHONPATH")] if p]))
    script, *rest = script_args
    script = os.path.join(ROOT, "bench", script)
    head = [sys.executable, script] if wrapper is None else [sys.executable, "-c", wrapper, script]
    cmd = ["mpiexec", "-n", str(RANKS), *head, *rest, "--json", str(path)]
    proc = subprocess.run(cmd, env=env, cwd=ROOT, capture_output=True, text=True, timeout=90)
    return proc, (json.loads(path.read_text()) if path.exists() else None)


def positive(x) -> bool:
    return isinstance(x, (int, float)) and math.isfinite(x) and x > 0


@pytest.fixture(scope="module")
def tp(tmp_path_factory):
    return launch(tmp_path_factory.mktemp("tp"), ["tp_mlp.py", *TP_ARGS])


@pytest.fixture(scope="module")
def dp(tmp_path_factory):
    return launch(tmp_path_factory.mktemp("dp"), ["dp_overlap.py", *DP_ARGS])


def test_tp_mlp_runs_and_writes_json(tp):
    proc, data = tp
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    assert data["schema"] == "pycollect.bench/1" and data["kind"] == "tp_mlp"
    head = data["header"]
    assert head["world_size"] == RANKS and "--ffn" in head["argv"] and head["topology"]
    assert "efficiency" in proc.stdout


def test_tp_mlp_records(tp):
    data = tp[1]
    records = data["records"]
    assert [r["variant"] for r in records] == ["single_solo", "single_both", "tp", "shard_solo"]
    for r in records:
        assert set(r) == TP_KEYS, r
        assert r["iters"] == 6, r
        assert all(positive(r[k]) for k in ("time_ms", "time_ms_min", "time_ms_max", "linear_ms", "gflops_per_rank")), r
        assert r["time_ms_min"] <= r["time_ms"] <= r["time_ms_max"], r
        assert len(r["trial_medians_ms"]) == 2 and all(positive(t) for t in r["trial_medians_ms"]), r
        assert len(r["rank_medians_ms"]) == r["ranks_computing"], r
    by = {r["variant"]: r for r in records}
    assert by["tp"]["comm_calls"] == 2 and positive(by["tp"]["comm_ms"]), by["tp"]  # the two allreduces were timed
    assert by["single_both"]["comm_calls"] == 0 and by["single_both"]["comm_ms"] == 0
    s = data["summary"]
    assert TP_SUMMARY <= set(s), s
    assert all(positive(s[k]) for k in ("t1_solo_ms", "t1_both_ms", "t2_ms", "efficiency_solo", "efficiency_both"))
    assert s["efficiency_both"] == pytest.approx(s["t1_both_ms"] / (RANKS * s["t2_ms"]))
    for k in ("err_y", "err_dx", "err_grads"):
        assert 0 <= s[k] <= s["tolerance"] == 1e-4, (k, s[k])


def test_dp_overlap_runs_and_writes_json(dp):
    proc, data = dp
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    assert data["schema"] == "pycollect.bench/1" and data["kind"] == "dp_overlap"
    assert data["header"]["world_size"] == RANKS and "--layers" in data["header"]["argv"]
    assert "overlap speedup" in proc.stdout


def test_dp_overlap_records(dp):
    data = dp[1]
    records = data["records"]
    assert [r["variant"] for r in records] == ["compute", "no_overlap", "overlap", "overlap_no_progress", "comm_only"]
    for r in records:
        assert set(r) == DP_KEYS, r
        assert r["iters"] == 6 and r["buckets"] == 3 and r["traffic_bytes"] == 4 * (3 * (32 * 32 + 32) + 1), r   # + the flag of a step left undone
        assert positive(r["time_ms"]) and positive(r["time_ms_min"]), r
        assert r["time_ms_min"] <= r["time_ms"] <= r["time_ms_max"], r
        assert 0 <= r["err"] <= 1e-5, r
        if r["variant"] != "compute":
            assert positive(r["finish_ms"]) and positive(r["ready_ms"]), r
    s = data["summary"]
    assert DP_SUMMARY <= set(s), s
    assert all(positive(s[k]) for k in ("compute_ms", "overlap_ms", "speedup", "paired_speedup"))
    assert s["max_err"] <= s["tolerance"] == 1e-5
    assert s["buckets"] == [["l2.b", "l2.w"], ["l1.b", "l1.w"], ["l0.b", "l0.w"]]


CORRUPT = """
import runpy, sys
import pycollect.parallel as par
if sys.argv[1].endswith("tp_mlp.py"):
    honest = par.ParallelMLP.forward
    def forward(self, x):
        y = honest(self, x)
        if self.group.rank == 1:
            y[..., :1] += 1
        return y
    par.ParallelMLP.forward = forward
else:
    honest = par.DataParallel.finish
    def finish(self):
        honest(self)
        if self.group.rank == 1 and self._buckets:
            self._buckets[0].grads[0][...] += 1
    par.DataParallel.finish = finish
sys.argv = sys.argv[1:]
runpy.run_path(sys.argv[0], run_name="__main__")
"""


@pytest.mark.parametrize("script, args, key", [("tp_mlp.py", TP_ARGS, "err_y"), ("dp_overlap.py", DP_ARGS, "max_err")])
def test_wrong_results_fail_the_run(tmp_path, script, args, key):
    proc, data = launch(tmp_path, [script, *args, "--iters", "1", "--trials", "1", "--warmup", "0"], wrapper=CORRUPT)
    assert proc.returncode == 1, proc.stdout[-3000:] + proc.stderr[-3000:]
    assert "FAILED" in proc.stdout
    assert data["summary"][key] > data["summary"]["tolerance"]


def test_pipeline_bubble_at_tiny_sizes(tmp_path):
    """Every schedule and m runs, the zero-bubble ones with their backward split; the formula column is
    the literature's; GPipe holds m micro-batches, 1F1B at most p - stage, every schedule as many (micro,
    chunk) pairs as the simulator says; the measured timelines are drawn."""
    pytest.importorskip("matplotlib")
    proc, doc = launch(tmp_path, ["pipeline_bubble.py", "--microbatches", "1,2,4", "--rows", "8", "--width", "16",
                                  "--layers", "2", "--trials", "1", "--plot", str(tmp_path / "tl"),
                                  "--schedules", "gpipe,1f1b,interleaved,zb-h1,zb-h2,zbv"])
    assert proc.returncode == 0, proc.stderr
    assert doc["schema"] == "pycollect.bench/1" and doc["kind"] == "pipeline_bubble"
    points = {(r["schedule"], r["microbatches"]): r for r in doc["records"]}
    assert set(points) == {("gpipe", 1), ("gpipe", 2), ("gpipe", 4), ("1f1b", 1), ("1f1b", 2), ("1f1b", 4),
                           ("interleaved", 2), ("interleaved", 4), ("zb-h1", 2), ("zb-h1", 4), ("zb-h2", 2),
                           ("zb-h2", 4), ("zbv", 2), ("zbv", 4)}
    for (schedule, m), r in points.items():
        v = 2 if schedule in ("interleaved", "zbv") else 1
        work = {"zb-h1": 3 * m, "zb-h2": 3 * m, "zbv": 6 * m}.get(schedule, m * v)  # units of a chunk's F
        assert r["bubble_formula"] == pytest.approx(1 / (work + 1))
        assert 0 <= r["bubble_measured"] < 1 and 0 <= r["bubble_simulated"] < 1
        assert (r["weight_ms"] > 0) == schedule.startswith("zb")
        assert r["peak_in_flight"] == r["peak_in_flight_simulated"]
        if schedule in ("gpipe", "1f1b"):     # closed forms; the others are held to the simulator above
            assert r["peak_in_flight"] == ([m, m] if schedule == "gpipe" else [min(2, m), 1])
    assert all((tmp_path / f"tl-{s}.png").exists() for s in ("1f1b", "interleaved", "zb-h1", "zb-h2", "zbv"))


def test_plan_check_at_tiny_sizes(tmp_path):
    """bench fit's JSON feeds the planner; every mesh that fits two ranks is measured and predicted; the
    (1,1,1) mesh calibrates the compute rate, so its ratio is 1."""
    env = dict(os.environ, MPIEXEC_TIMEOUT="120", OMP_NUM_THREADS="1", OPENBLAS_NUM_THREADS="1")
    fit = tmp_path / "fit.json"
    proc = subprocess.run(["mpiexec", "-n", "2", sys.executable, "-m", "pycollect", "bench", "fit", "-b", "1K", "-e",
                           "512K", "-f", "8", "-n", "3", "--json", str(fit)], env=env, cwd=ROOT, capture_output=True,
                          text=True, timeout=150)
    assert proc.returncode == 0, proc.stderr
    proc, doc = launch(tmp_path, ["plan_check.py", "--tuning", str(fit), "--layers", "2", "--embd", "32", "--heads",
                                  "2", "--seq", "8", "--vocab", "16", "--batch", "8", "--micro", "2", "--steps", "2"])
    assert proc.returncode == 0, proc.stderr
    assert doc["kind"] == "plan_check" and doc["header"]["rate_flops"] > 0
    meshes = [(r["dp"], r["tp"], r["pp"], r["schedule"]) for r in doc["records"]]
    assert meshes == [(1, 1, 1, "1f1b"), (2, 1, 1, "1f1b"), (1, 2, 1, "1f1b"), (1, 1, 2, "1f1b"), (1, 1, 2, "gpipe")]
    assert doc["records"][0]["ratio"] == pytest.approx(1.0)
    assert all(math.isfinite(r["ratio"]) and r["ratio"] > 0 and r["measured_s"] > 0 for r in doc["records"])


def test_gpu_models_script_on_host_arrays(tmp_path):
    """bench/gpu_models.py (run on CuPy by bench/gpu_check.sh) works end to end with --backend numpy."""
    proc, doc = launch(tmp_path, ["gpu_models.py", "--backend", "numpy"])
    assert proc.returncode == 0, proc.stderr
    assert doc["kind"] == "gpu_models" and len(doc["records"]) == 8 and doc["worst"] == 0.0


# right at the check before timing (tp: one forward; dp: four finish() calls), wrong on rank 1 from then on
GOES_WRONG_LATER = """
import runpy, sys
import pycollect.parallel as par
calls = [0]
if sys.argv[1].endswith("tp_mlp.py"):
    honest, first = par.ParallelMLP.forward, 1
    def forward(self, x):
        y = honest(self, x)
        calls[0] += 1
        if self.group.rank == 1 and calls[0] > first:
            y[..., :1] += 1
        return y
    par.ParallelMLP.forward = forward
else:
    honest, first = par.DataParallel.finish, 4
    def finish(self):
        honest(self)
        calls[0] += 1
        if self.group.rank == 1 and self._buckets and calls[0] > first:
            self._buckets[0].grads[0][...] += 1
    par.DataParallel.finish = finish
sys.argv = sys.argv[1:]
runpy.run_path(sys.argv[0], run_name="__main__")
"""


@pytest.mark.parametrize("script, args, key, ratios", [
    ("tp_mlp.py", TP_ARGS, "err_y", ("efficiency_solo", "efficiency_both", "t2_ms")),
    ("dp_overlap.py", DP_ARGS, "max_err", ("speedup", "paired_speedup", "hidden"))])
def test_results_wrong_after_the_first_check_fail_the_run(tmp_path, script, args, key, ratios):
    """Right in the check before timing, wrong in the timed steps: the check after them counts it, the summary names
    it and gives no headline figure, and the exit status is 1."""
    proc, data = launch(tmp_path, [script, *args, "--iters", "1", "--trials", "1", "--warmup", "0"],
                        wrapper=GOES_WRONG_LATER)
    assert proc.returncode == 1, proc.stdout[-3000:] + proc.stderr[-3000:]
    assert "FAILED" in proc.stdout
    s = data["summary"]
    assert s[key] > s["tolerance"] and s["failed"] and all(s[k] is None for k in ratios), s
    assert max(s["err_before"].values()) <= s["tolerance"] < max(s["err_after"].values())
