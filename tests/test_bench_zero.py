"""bench/zero.py under ``mpiexec -n 2`` at a tiny size: exit 0, complete JSON, the counts it reports.

Also: a ZeroAdamW that leaves one rank's shard un-updated shows in the error and makes the exit status 1.
"""
import math

import pytest

from test_bench_model import RANKS, launch, positive

P_ASKED, LAYERS, ITERS, WARMUP = 4096, 3, 2, 1
ARGS = ["zero.py", "--params", str(P_ASKED), "--layers", str(LAYERS), "--iters", str(ITERS), "--warmup", str(WARMUP),
        "--bucket-bytes", "1K"]
VARIANTS = ["dp", "stage0", "stage1", "stage2", "stage3"]
KEYS = {"variant", "stage", "dtype", "params", "padded", "tensors", "width", "bucket_bytes", "iters", "time_ms",
        "time_ms_min", "time_ms_max", "times_ms", "ready_ms", "gather_ms", "step_ms", "memory", "memory_total_max",
        "memory_bytes_per_param", "comm", "comm_elements", "comm_bytes", "allgather_output_elements", "ring_bytes",
        "ring_elements_per_param", "time_vs_dp", "memory_vs_dp", "ring_bytes_vs_dp", "err", "err_ref", "err_m", "err_v",
        "steps_taken"}
MEMORY = {"parameters", "gradients", "master_weights", "moments", "communication_buffers", "total"}


@pytest.fixture(scope="module", params=["float32", "float16"])
def run(request, tmp_path_factory):
    proc, data = launch(tmp_path_factory.mktemp("zero"), [*ARGS, "--dtype", request.param])
    return request.param, proc, data


def test_runs_and_writes_json(run):
    dtype, proc, data = run
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    assert data["schema"] == "pycollect.bench/1" and data["kind"] == "zero"
    head = data["header"]
    assert head["world_size"] == RANKS and "--params" in head["argv"] and head["topology"] and head["dtype"] == dtype
    assert "parameters vs dp" in proc.stdout and "FAILED" not in proc.stdout and data["summary"]["failed"] == []


def test_records(run):
    dtype, _, data = run
    records = data["records"]
    assert [r["variant"] for r in records] == VARIANTS
    width = records[0]["width"]
    P = LAYERS * (width * width + width)
    assert abs(P - P_ASKED) <= 2 * LAYERS * width  # the nearest width
    for r in records:
        assert set(r) == KEYS, set(r) ^ KEYS
        assert r["params"] == P and r["tensors"] == 2 * LAYERS and r["dtype"] == dtype and r["iters"] == ITERS
        assert r["steps_taken"] == WARMUP + ITERS + 1  # and one recorded step
        assert all(positive(r[k]) for k in ("time_ms", "time_ms_min", "step_ms", "ready_ms")), r
        assert r["time_ms_min"] <= r["time_ms"] <= r["time_ms_max"] and len(r["times_ms"]) == ITERS
        assert (r["gather_ms"] > 0) == (r["variant"] == "stage3")
        assert set(r["memory"]) == MEMORY and r["memory"]["total"] == sum(v for k, v in r["memory"].items() if k != "total")
        assert r["memory_total_max"] >= r["memory"]["total"]
        assert 0 <= r["err"] <= data["summary"]["tolerance"] and 0 <= r["err_ref"] <= data["summary"]["tolerance"]
        assert 0 <= max(r["err_m"], r["err_v"]) <= data["summary"]["moment_tolerance"]
        assert r["time_vs_dp"] == pytest.approx(r["time_ms"] / records[0]["time_ms"])


def test_memory_and_traffic_counts(run):
    """Per rank at N = 2: the formulas for memory; the elements handed to each collective; a ring's bytes."""
    dtype, _, data = run
    c, f = (4, 4) if dtype == "float32" else (2, 4)
    by = {r["variant"]: r for r in data["records"]}
    P = by["dp"]["params"]
    pp = 2 * -(-P // 2)
    s = pp // 2
    assert by["stage0"]["padded"] == P and all(by[f"stage{k}"]["padded"] == pp for k in (1, 2, 3))
    state = {"stage0": P, "stage1": s, "stage2": s, "stage3": s}
    for v, n in state.items():
        m = by[v]["memory"]
        assert m["master_weights"] == f * n and m["moments"] == 2 * f * n, (v, m)
    assert by["stage0"]["memory"]["gradients"] == c * P and by["stage1"]["memory"]["gradients"] == c * pp
    assert by["stage2"]["memory"]["gradients"] == by["stage3"]["memory"]["gradients"] == c * s
    assert by["stage3"]["memory"]["parameters"] == c * s and by["stage2"]["memory"]["parameters"] == c * P
    dp = by["dp"]["memory"]  # float32: the parameters are the masters; float16: float32 masters beside them
    assert dp["parameters"] == dp["gradients"] == c * P and dp["moments"] == 8 * P
    assert dp["master_weights"] == (0 if dtype == "float32" else 4 * P)

    # DataParallel's last bucket carries one element more: the flag of a step some rank left undone; ZeroAdamW's
    # step ends with a vote (2 int64: some rank refused, some shard overflowed), 16 bytes a 2-rank ring sends
    vote = 16
    assert by["dp"]["comm"]["allreduce"]["elements"] - 1 == by["stage0"]["comm"]["allreduce"]["elements"] - 2 == P
    for v in ("stage1", "stage2", "stage3"):
        assert by[v]["comm"]["reduce_scatter"]["elements"] == pp
        assert by[v]["comm"]["allreduce"] == {"calls": 1, "elements": 2, "bytes": 16}
    for v in ("stage1", "stage2"):
        assert by[v]["comm"]["allgather"] == {"calls": 1, "elements": s, "bytes": c * s}
        assert by[v]["ring_bytes"] == pytest.approx(c * pp + vote)  # 1/2 P' reduce-scattered + 1/2 P' allgathered
    assert by["stage3"]["comm"]["allgather"]["calls"] == 2 * LAYERS  # every layer for forward and backward
    assert by["stage3"]["allgather_output_elements"] == 2 * P
    assert by["stage3"]["ring_bytes"] == pytest.approx(c * (pp / 2 + P) + vote)
    assert by["dp"]["ring_bytes"] == pytest.approx(c * (P + 1))
    assert by["stage0"]["ring_bytes"] == pytest.approx(c * P + vote)
    assert by["stage3"]["ring_bytes_vs_dp"] == pytest.approx(1.5, abs=8 / P)
    assert all(math.isclose(by[v]["ring_bytes_vs_dp"], 1.0, abs_tol=8 / P) for v in ("stage0", "stage1", "stage2"))


UNDERUPDATED = """
import runpy, sys
from pycollect.zero import ZeroAdamW
honest = ZeroAdamW._update
def _update(self, g, go, xp):
    if not (self.stage == 2 and self.group.rank == 1):
        honest(self, g, go, xp)
ZeroAdamW._update = _update
sys.argv = sys.argv[1:]
runpy.run_path(sys.argv[0], run_name="__main__")
"""


def test_wrong_parameters_fail_the_run(tmp_path):
    proc, data = launch(tmp_path, ARGS, wrapper=UNDERUPDATED)
    assert proc.returncode == 1, proc.stdout[-3000:] + proc.stderr[-3000:]
    assert "FAILED" in proc.stdout
    by = {r["variant"]: r for r in data["records"]}
    assert by["stage2"]["err"] > data["summary"]["tolerance"] >= by["stage1"]["err"]


# a gradient summed over the ranks instead of averaged: ZeroAdamW at stage 2 multiplies its reduced shard back by the
# ranks before its update; DataParallel (the dp variant) its averaged buckets, after finish()
SUMMED = """
import runpy, sys
from pycollect.parallel import DataParallel
from pycollect.zero import ZeroAdamW
which = sys.argv.pop(1)
if which == "stage2":
    honest = ZeroAdamW._update
    def _update(self, g, go, xp):
        if self.stage == 2:
            g *= self.group.size
        honest(self, g, go, xp)
    ZeroAdamW._update = _update
else:
    honest = DataParallel.finish
    def finish(self):
        honest(self)
        for bucket in self._buckets:
            for grad in bucket.grads:
                grad *= self.group.size
    DataParallel.finish = finish
sys.argv = sys.argv[1:]
runpy.run_path(sys.argv[0], run_name="__main__")
"""


@pytest.mark.parametrize("dtype", ["float32", "float16"])
@pytest.mark.parametrize("which", ["stage2", "dp"])
def test_a_summed_gradient_fails_the_run(tmp_path, which, dtype):
    """A sum instead of a mean barely moves AdamW's parameters (it divides m by sqrt(v)): the moments against one
    process's AdamW on the gradient averaged by hand show it; the run fails and gives no ratio of the variant (of
    any variant, when dp itself is wrong)."""
    proc, data = launch(tmp_path, [*ARGS, "--dtype", dtype], wrapper=SUMMED.replace("sys.argv.pop(1)", repr(which)))
    assert proc.returncode == 1, proc.stdout[-3000:] + proc.stderr[-3000:]
    assert "FAILED" in proc.stdout
    by = {r["variant"]: r for r in data["records"]}
    s = data["summary"]
    assert by[which]["err_m"] > 0.5 and by[which]["err_v"] > 0.5   # m doubled, v four times
    assert by[which]["err"] <= s["tolerance"] or which == "dp"   # the parameters alone do not show it
    wrong = set(VARIANTS) if which == "dp" else {which}
    for v in VARIANTS:
        assert (by[v]["time_vs_dp"] is None) == (v in wrong) and (s["time_vs_dp"][v] is None) == (v in wrong), v
    assert {f.split(":")[0] for f in s["failed"]} == {which}
