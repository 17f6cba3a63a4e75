"""``python -m pycollect train`` under ``mpiexec``: it trains, agrees with its twin, and refuses bad flags."""
import json
import re
import os
import subprocess
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
ENV = dict(os.environ, MPIEXEC_TIMEOUT="180", OMP_NUM_THREADS="1", OPENBLAS_NUM_THREADS="1")
ENV.pop("PYCOLLECT_UNDER_MPI", None)
SMALL = ["--layers", "1", "--embd", "16", "--heads", "2", "--seq", "8", "--batch", "4"]


def train(n, *args):
    cmd = ["mpiexec", "-n", str(n), sys.executable, "-m", "pycollect", "train", *SMALL, *args]
    return subprocess.run(cmd, cwd=ROOT, env=ENV, capture_output=True, text=True, timeout=240)


def test_sequence_parallel_training_matches_the_twin_and_writes_json(tmp_path):
    out = tmp_path / "train.json"
    proc = train(2, "--tp", "2", "--sequence-parallel", "--micro-batches", "2", "--steps", "5", "--dropout", "0.1", "--dtype",
                 "float64", "--check", "--json", str(out))
    assert proc.returncode == 0, proc.stderr
    doc = json.loads(out.read_text())
    assert doc["schema"] == "pycollect.bench/1" and doc["kind"] == "train"
    assert [r["step"] for r in doc["records"]] == list(range(5))
    assert doc["header"]["tp"] == 2 and doc["header"]["dp"] == 1 and doc["header"]["sequence_parallel"]
    assert doc["check"]["max_rel_loss_diff"] < 1e-10 and doc["check"]["max_rel_weight_diff"] < 1e-8
    assert proc.stdout.count("check against the single-process twin") == 1  # rank 0 prints


def test_pipeline_training_matches_the_twin():
    proc = train(2, "--pp", "2", "--layers", "2", "--schedule", "interleaved", "--virtual", "1", "--micro-batches",
                 "2", "--steps", "3", "--dtype", "float64", "--check")
    assert proc.returncode == 0, proc.stderr
    line = next(ln for ln in proc.stdout.splitlines() if ln.startswith("check against"))
    diffs = [float(x) for x in re.findall(r"\d\.\d+e[+-]\d+", line)]
    assert len(diffs) == 2 and max(diffs) < 1e-9, line


def test_zero_training_matches_the_twin():
    for args in (["--dp", "2", "--zero", "3"], ["--pp", "2", "--layers", "2", "--zero", "1", "--micro-batches", "2"],
                 ["--dp", "2", "--zero", "2", "--experts", "2", "--capacity-factor", "0.5"]):
        proc = train(2, *args, "--clip", "1.0", "--steps", "3", "--dtype", "float64", "--check")
        assert proc.returncode == 0, (args, proc.stderr)
        line = next(ln for ln in proc.stdout.splitlines() if ln.startswith("check against"))
        diffs = [float(x) for x in re.findall(r"\d\.\d+e[+-]\d+", line)]
        assert len(diffs) == 2 and max(diffs) < 1e-9, (args, line)


def test_experts_in_the_pipeline_and_under_sequence_parallelism_match_the_twin():
    for args in (["--pp", "2", "--layers", "2", "--micro-batches", "2"], ["--tp", "2", "--sequence-parallel"]):
        proc = train(2, *args, "--experts", "2", "--capacity-factor", "0.5", "--steps", "3", "--dtype", "float64",
                     "--clip", "1.0", "--check")
        assert proc.returncode == 0, (args, proc.stderr)
        line = next(ln for ln in proc.stdout.splitlines() if ln.startswith("check against"))
        diffs = [float(x) for x in re.findall(r"\d\.\d+e[+-]\d+", line)]
        assert len(diffs) == 2 and max(diffs) < 1e-9, (args, line)


def test_text_task_on_a_data_parallel_mesh(tmp_path):
    proc = train(2, "--dp", "2", "--task", "text", "--text", os.path.join(ROOT, "README.md"), "--steps", "2")
    assert proc.returncode == 0, proc.stderr
    assert "V=256" in proc.stdout and "dp=2" in proc.stdout


def test_bad_flags_fail_on_every_rank_with_one_line():
    for args, message in ((["--tp", "3"], "--tp 3 x --pp 1 x --dp 0"), (["--task", "text"], "--task text needs --text"),
                          (["--tp", "2", "--heads", "3", "--embd", "12"], "n_head = 3"),
                          (["--lr", "-1"], "--lr must be"),
                          (["--pp", "2", "--layers", "1"], "more stages than layers"),
                          (["--zero", "2", "--micro-batches", "2"], "--zero without a pipeline runs with"),
                          (["--zero", "3", "--pp", "2", "--layers", "2"], "--zero 3 does not run in a pipeline"), (["--batch", "3", "--dp", "2"], "batch = 3")):
        proc = train(2, *args, "--steps", "1")
        assert proc.returncode != 0, args
        lines = [ln for ln in proc.stderr.splitlines() if message in ln]
        assert len(lines) == 2 and "Traceback" not in proc.stderr, (args, proc.stderr)
