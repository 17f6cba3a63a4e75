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


VERDICT = re.compile(r"^check against the single-process twin: (PASS|FAIL): largest relative difference of the losses "
                     r"(\S+), of the final weights (\S+) \(tolerance (\S+) (for float32|for float64|set by --tolerance)\)$",
                     re.M)


def verdict(proc) -> tuple[str, float, float, float, str]:
    """The --check line: PASS or FAIL, the losses' and weights' differences, the tolerance and where it came from."""
    found = VERDICT.findall(proc.stdout)
    assert len(found) == 1, proc.stdout[-2000:] + proc.stderr[-2000:]   # rank 0 alone prints it
    word, loss, weights, tolerance, source = found[0]
    return word, float(loss), float(weights), float(tolerance), source


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
    assert doc["check"]["passed"] is True and doc["check"]["tolerance"] == 1e-8
    assert verdict(proc) == ("PASS", *(float(f"{doc['check'][k]:.2e}") for k in ("max_rel_loss_diff",
                                                                                   "max_rel_weight_diff")),
                             1e-8, "for float64")


def test_pipeline_training_matches_the_twin():
    proc = train(2, "--pp", "2", "--layers", "2", "--schedule", "interleaved", "--virtual", "1", "--micro-batches",
                 "2", "--steps", "3", "--dtype", "float64", "--check")
    assert proc.returncode == 0, proc.stderr
    word, loss, weights, _, _ = verdict(proc)
    assert word == "PASS" and max(loss, weights) < 1e-9, proc.stdout


def test_zero_training_matches_the_twin(tmp_path):
    """Losses and weights as the twin's; the JSON's grad norms those of the same run without ZeRO (before: null under
    --zero, though it clipped), and its header names the schedule a pipeline ran (before: null without --schedule)."""
    norms = {}
    for i, args in enumerate((["--dp", "2", "--zero", "3"], ["--pp", "2", "--layers", "2", "--zero", "1",
                                                            "--micro-batches", "2"],
                              ["--dp", "2", "--zero", "2", "--experts", "2", "--capacity-factor", "0.5"], ["--dp", "2"])):
        out = tmp_path / f"train{i}.json"
        proc = train(2, *args, "--clip", "1.0", "--steps", "3", "--dtype", "float64", "--json", str(out),
                     *(["--check"] if i < 3 else []))
        assert proc.returncode == 0, (args, proc.stderr)
        if i < 3:
            word, loss, weights, _, _ = verdict(proc)
            assert word == "PASS" and max(loss, weights) < 1e-9, (args, proc.stdout)
        doc = json.loads(out.read_text())
        norms[i] = [r["grad_norm"] for r in doc["records"]]
        assert (doc["header"]["schedule"], doc["header"]["virtual_stages"]) == (("1f1b", 1) if i == 1 else (None, None))
    assert all(isinstance(g, float) and g > 0 for g in norms[0]) and norms[1][0] is not None, norms
    assert max(abs(a - b) / b for a, b in zip(norms[0], norms[3])) < 1e-9, norms


def test_a_nan_loss_fails_the_check():
    """--lr 1e10 drives the losses to NaN from the second step: the verdict is FAIL with an infinite difference
    (before, max() skipped a NaN that did not come first and printed 0 for the losses)."""
    proc = train(2, "--tp", "2", "--steps", "4", "--lr", "1e10", "--check")
    assert proc.returncode == 1, proc.stdout + proc.stderr
    assert verdict(proc)[:2] == ("FAIL", float("inf")), proc.stdout


def test_experts_in_the_pipeline_and_under_sequence_parallelism_match_the_twin():
    for args in (["--pp", "2", "--layers", "2", "--micro-batches", "2"], ["--tp", "2", "--sequence-parallel"]):
        proc = train(2, *args, "--experts", "2", "--capacity-factor", "0.5", "--steps", "3", "--dtype", "float64",
                     "--clip", "1.0", "--check")
        assert proc.returncode == 0, (args, proc.stderr)
        word, loss, weights, _, _ = verdict(proc)
        assert word == "PASS" and max(loss, weights) < 1e-9, (args, proc.stdout)


def test_float32_passes_its_own_tolerance_and_fails_a_tighter_one(tmp_path):
    """float32 differs from the twin by rounding (more than 1e-9 after two steps, well within 0.3): PASS at the
    stated tolerance, exit 0; FAIL past --tolerance 1e-9, exit 1 from every rank, and the JSON says so."""
    passed = train(2, "--tp", "2", "--steps", "2", "--check")
    assert passed.returncode == 0, passed.stderr
    word, loss, weights, tolerance, source = verdict(passed)
    assert (word, tolerance, source) == ("PASS", 0.3, "for float32") and 1e-9 < max(loss, weights) < 1e-3
    out = tmp_path / "train.json"
    failed = train(2, "--tp", "2", "--steps", "2", "--check", "--tolerance", "1e-9", "--json", str(out))
    assert failed.returncode == 1, failed.stdout + failed.stderr
    assert verdict(failed) == ("FAIL", loss, weights, 1e-9, "set by --tolerance")   # the same run, deterministic
    check = json.loads(out.read_text())["check"]
    assert check["passed"] is False and check["tolerance"] == 1e-9 and "Traceback" not in failed.stderr


def test_text_task_on_a_data_parallel_mesh(tmp_path):
    proc = train(2, "--dp", "2", "--task", "text", "--text", os.path.join(ROOT, "README.md"), "--steps", "2")
    assert proc.returncode == 0, proc.stderr
    assert "V=256" in proc.stdout and "dp=2" in proc.stdout


def test_bad_flags_fail_on_every_rank_with_one_line():
    for args, message in ((["--tp", "3"], "--tp 3 x --pp 1 = 3 ranks a replica, which the job's 2 do not divide"),
                          (["--tp", "2", "--dp", "2"], "--tp 2 x --pp 1 x --dp 2 = 4 ranks, but the job has 2"),
                          (["--task", "text"], "--task text needs --text FILE"),
                          (["--task", "text", "--text", "no-such.txt"], "--text no-such.txt: no such file"),
                          (["--tp", "2", "--heads", "3", "--embd", "12"], "needs --heads 3 to divide by 2"),
                          # GPTConfig's errors in the command's flags (they named n_embd, n_head, top_k)
                          (["--embd", "30", "--heads", "4"], "error: --embd 30 does not divide by --heads 4"),
                          (["--experts", "2", "--top-k", "3"], "error: --top-k 3 is larger than --experts 2"),
                          (["--dropout", "1.5"], "error: --dropout must be a number in [0, 1), got 1.5"),
                          (["--lr", "-1"], "--lr must be"), (["--tolerance", "0"], "argument --tolerance"),
                          (["--pp", "2", "--layers", "1"], "more stages than layers"),
                          (["--zero", "2", "--micro-batches", "2"], "--zero without a pipeline runs with"),
                          (["--zero", "3", "--pp", "2", "--layers", "2"], "--zero 3 does not run in a pipeline"), (["--batch", "3", "--dp", "2"], "batch = 3"),
                          (["--pp", "2", "--layers", "4", "--schedule", "zbv", "--virtual", "3", "--micro-batches", "2"],
                           "zbv: --virtual must be 2 (two chunks per stage placed V-wise), got --virtual=3"),
                          # flags nothing reads without another (before: taken, ignored, and recorded in the JSON)
                          (["--virtual", "3"], "--virtual is read only with --pp or --schedule"),
                          (["--top-k", "2"], "--top-k is read only with --experts"),
                          (["--text", "README.md"], "--text is read only with --task text"),
                          (["--tolerance", "1e-3"], "--tolerance is read only with --check"),
                          (["--seed", "-1"], "argument --seed"),   # before: a NumPy traceback
                          (["--task", "text", "--text", "LICENSE", "--seq", "100000"], "fewer than --seq + 1"),
                          (["--json", "tests"], "tests: is a directory")):
        proc = train(2, *args, "--steps", "1")
        assert proc.returncode != 0, args
        lines = [ln for ln in proc.stderr.splitlines() if message in ln]
        assert len(lines) == 2 and "Traceback" not in proc.stderr, (args, proc.stderr)
    # before: trained nothing, compared nothing, and printed PASS with exit status 0
    proc = train(2, "--dp", "2", "--check", "--steps", "0")
    lines = [ln for ln in proc.stderr.splitlines() if "--check compares what the mesh" in ln]
    assert proc.returncode != 0 and "PASS" not in proc.stdout and len(lines) == 2, (proc.stdout, proc.stderr)


def configs(world_size, *argv):
    """``_configs`` of ``pycollect train ARGV`` for a job of ``world_size`` ranks (no launch: it reads flags only)."""
    from pycollect.cli import build_parser
    from pycollect.tools.train import _configs
    return _configs(build_parser(["train"]).parse_args(["train", *argv]), world_size)


def test_flags_that_would_be_ignored_or_advise_what_the_command_cannot_do_are_refused():
    """A --tp that does not divide the vocabulary names --tp and the task's vocabulary (GPTConfig's advice, pad the
    vocabulary, is nothing a flag of train does); --vocab with --task text and --sequence-parallel at --tp 1 were
    taken and ignored."""
    import pytest
    readme = os.path.join(ROOT, "README.md")
    for world, argv, message in (
            (3, ["--tp", "3", "--heads", "3", "--embd", "12", "--task", "text", "--text", readme],
             "--tp 3 must divide the vocabulary, 256 byte values with --task text"),
            (2, ["--tp", "2", "--vocab", "15"], "--tp 2 must divide the vocabulary, --vocab 15"),
            (2, ["--vocab", "32", "--task", "text", "--text", readme], "--vocab is read only with --task reverse"),
            (2, ["--sequence-parallel"], "--sequence-parallel is read only with --tp 2 or more")):
        with pytest.raises(ValueError, match=re.escape(message)):
            configs(world, *argv)
    config, _, dp = configs(2, "--tp", "2", "--vocab", "18")
    assert config.vocab_size == 18 and dp == 1
    assert configs(1)[0].vocab_size == 16 and configs(1, "--task", "text", "--text", readme)[0].vocab_size == 256


def test_a_bad_environment_setting_on_one_rank_ends_every_rank_with_one_line():
    """PYCOLLECT_ALGO_ALLREDUCE=bogus on rank 1 alone: a traceback before; now one line on every rank (the
    Communicator agrees its settings across ranks, so none waits for the other)."""
    cmd = ["mpiexec", "-n", "1", sys.executable, "-m", "pycollect", "train", *SMALL, "--steps", "1", ":",
           "-n", "1", "-env", "PYCOLLECT_ALGO_ALLREDUCE", "bogus", sys.executable, "-m", "pycollect", "train", *SMALL,
           "--steps", "1"]
    proc = subprocess.run(cmd, cwd=ROOT, env=ENV, capture_output=True, text=True, timeout=240)
    lines = [ln for ln in proc.stderr.splitlines() if ln.startswith("pycollect train: error: ")]
    assert proc.returncode == 2 and len(lines) == 2 and "Traceback" not in proc.stderr, proc.stderr
    assert all("PYCOLLECT_ALGO_ALLREDUCE must be one of" in ln for ln in lines), lines


def test_a_file_check_that_fails_on_one_rank_stops_every_rank(tmp_path):
    """The ranks run in their own working directories: out/ is a folder for rank 1, a file for rank 0, so --json
    out/x.json can be written by one only. Before, rank 0 refused and exited while rank 1 waited in the first
    collective for ever; now every rank stops with one line (rank 1 naming rank 0's reason)."""
    for rank, kind in ((0, "file"), (1, "dir")):
        (tmp_path / f"w{rank}").mkdir()
        out = tmp_path / f"w{rank}" / "out"
        out.mkdir() if kind == "dir" else out.write_text("")
    one = [sys.executable, "-m", "pycollect", "train", *SMALL, "--steps", "1", "--json", "out/x.json"]
    cmd = ["mpiexec", "-n", "1", "-wdir", str(tmp_path / "w0"), *one, ":", "-n", "1", "-wdir", str(tmp_path / "w1"), *one]
    proc = subprocess.run(cmd, env=dict(ENV, PYTHONPATH=ROOT), capture_output=True, text=True, timeout=240)
    lines = [ln for ln in proc.stderr.splitlines() if ln.startswith("pycollect train: error: ")]
    assert proc.returncode == 2 and len(lines) == 2 and "Traceback" not in proc.stderr, proc.stderr
    assert any("rank 0 stopped: --json" in ln and "is not a directory" in ln for ln in lines), lines


def test_a_loss_that_is_not_finite_stops_every_rank_and_writes_nothing(tmp_path):
    """--lr 1e30: the loss is NaN from the second step. Before, the run printed `loss nan`, exited 0 and wrote a
    JSON file with a bare NaN in it (not JSON)."""
    out = tmp_path / "train.json"
    proc = train(2, "--lr", "1e30", "--steps", "3", "--json", str(out))
    lines = [ln for ln in proc.stderr.splitlines() if "the loss is not finite from step" in ln]
    assert proc.returncode == 1 and len(lines) == 2 and not out.exists(), proc.stderr
