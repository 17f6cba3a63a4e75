"""``pycollect explain pipeline`` as users run it: a subprocess, no mpiexec."""
import json
import os
import re
import subprocess
import sys

import pytest

from pycollect import cli
from pycollect.tools import report

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
LEAKY = ("SLURM_", "PMI_", "PMIX_", "OMPI_", "HYDRA_", "MPI_LOCAL", "MPIR_CVAR_", "PYCOLLECT_")


def pycollect(*args) -> subprocess.CompletedProcess:
    """``python -m pycollect ARGS`` in a clean environment (no launcher variables)."""
    env = {k: v for k, v in os.environ.items() if not k.startswith(LEAKY)}
    env.update(OMP_NUM_THREADS="1", OPENBLAS_NUM_THREADS="1", MPLBACKEND="Agg")
    return subprocess.run([sys.executable, "-m", "pycollect", *args], env=env, cwd=ROOT, capture_output=True,
                          text=True, timeout=90)


def _ok(proc) -> None:
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]


def test_explain_1f1b_prints_lists_bubble_and_draws(tmp_path):
    png, out = tmp_path / "fig" / "1f1b.png", tmp_path / "1f1b.json"
    proc = pycollect("explain", "pipeline", "--schedule", "1f1b", "--stages", "4", "--microbatches", "8",
                     "--plot", str(png), "--json", str(out))
    _ok(proc)
    assert png.exists() and png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    lines = proc.stdout.splitlines()
    assert "stage 0: F0 F1 F2 F3 B0 F4 B1 F5 B2 F6 B3 F7 B4 B5 B6 B7" in lines
    assert "stage 3: F0 B0 F1 B1 F2 B2 F3 B3 F4 B4 F5 B5 F6 B6 F7 B7" in lines
    # (p-1)/(m+p-1) = 3/11
    assert "bubble 27.27% simulated, 27.27% by the formula (p-1)/(m+p-1)" in lines, proc.stdout
    assert "makespan 33 (the work of one stage: 24)" in lines
    rows = [line.split() for line in lines if re.match(r"^\s+\d\s", line)]
    assert [(int(r[0]), int(r[4])) for r in rows] == [(0, 4), (1, 3), (2, 2), (3, 1)]     # peak in flight
    data = json.loads(out.read_text())
    assert data["schema"] == report.SCHEMA and data["kind"] == "explain"
    summary = data["summary"]
    assert summary["bubble"] == pytest.approx(3 / 11) and summary["bubble_formula"] == pytest.approx(3 / 11)
    assert [r["peak_in_flight"] for r in data["records"]] == [4, 3, 2, 1]
    assert data["records"][1]["actions"][:3] == ["RECV_ACT0<-0", "F0", "SEND_ACT0->2"]
    assert data["header"]["world_size"] == 4 and data["header"]["explain"]["schedule"] == "1f1b"
    assert [len(row) for row in data["timeline"]] == [16] * 4


def test_explain_interleaved_literature_number(tmp_path, capsys):
    png = tmp_path / "interleaved.png"
    assert cli.main(["explain", "pipeline", "--schedule", "interleaved", "--stages", "8", "--microbatches", "32",
                     "--virtual", "2", "--plot", str(png)]) == 0
    out = capsys.readouterr().out
    assert "bubble 9.86% simulated, 9.86% by the formula (p-1)/(m*v+p-1)" in out       # 7/71
    assert png.exists()


def test_explain_gpipe_with_latency_and_comm_lists(capsys):
    assert cli.main(["explain", "pipeline", "--schedule", "gpipe", "--stages", "2", "--microbatches", "2",
                     "--comm", "--comm-cost", "0.5", "--forward-cost", "1", "--backward-cost", "1"]) == 0
    out = capsys.readouterr().out.splitlines()
    assert "stage 0: F0 SEND_ACT0->1 F1 SEND_ACT1->1 RECV_GRAD0<-1 B0 RECV_GRAD1<-1 B1" in out
    # (m+p-1)(F+B) + 2(p-1)c = 6 + 1: bubble 1 - 4/7 against the formula's 1/3
    assert "bubble 42.86% simulated, 33.33% by the formula (p-1)/(m+p-1) (which counts no communication time)" in out


@pytest.mark.parametrize("argv, message", [
    (["--schedule", "interleaved", "--stages", "4", "--microbatches", "3"],
     "--microbatches 3 is fewer than --stages 4"),
    (["--schedule", "1f1b", "--stages", "4", "--microbatches", "8", "--virtual", "2"],
     "--virtual 2: 1f1b has one chunk per stage"),
    (["--schedule", "gpipe", "--stages", "0", "--microbatches", "8"], "argument --stages: must be at least 1, got 0"),
    (["--schedule", "zb", "--stages", "2", "--microbatches", "8"], "argument --schedule: invalid choice: 'zb'"),
    (["--stages", "2", "--microbatches", "8"], "the following arguments are required: --schedule"),
    (["--schedule", "gpipe", "--stages", "2", "--microbatches", "2", "--backward-cost", "-1"],
     "argument --backward-cost: must be a finite number at least 0, got -1"),
    (["--schedule", "1f1b", "--stages", "4", "--microbatches", "8", "--forward-cost", "1e308"],
     "--comm-cost are so large that the run's time could pass what a float holds"),   # printed inf and nan%
    (["--schedule", "1f1b", "--stages", "1000", "--microbatches", "1000"],
     "--stages 1000 x --microbatches 1000 x --virtual 1 = 1,000,000 chunk passes; at most 100,000"),  # ran minutes
    (["--schedule", "gpipe", "--stages", "2", "--microbatches", "2", "--size", "8"],
     "--size is for 'explain COLLECTIVE', not 'explain pipeline'"),
])
def test_bad_pipeline_flags_are_one_line_and_exit_2(argv, message, tmp_path):
    proc = pycollect("explain", "pipeline", *argv, "--plot", str(tmp_path / "no.png"))
    assert proc.returncode == 2, (proc.stdout, proc.stderr)
    assert proc.stdout == "" and proc.stderr.count("\n") == 1, proc.stderr
    assert proc.stderr.startswith("pycollect explain: error: ") and message in proc.stderr, proc.stderr
    assert not (tmp_path / "no.png").exists()


def test_pipeline_flags_are_refused_for_a_collective(capsys):
    status = cli.main(["explain", "allreduce", "--algorithm", "ring", "--size", "4", "--bytes", "8M",
                       "--schedule", "1f1b"])
    err = capsys.readouterr().err
    assert status == 2
    assert err == "pycollect explain: error: --schedule is for 'explain pipeline', not 'explain allreduce'\n"
    assert cli.main(["explain", "allreduce", "--size", "4"]) == 2
    assert "the following arguments are required: --algorithm, --bytes" in capsys.readouterr().err


def test_explain_zb_h1_draws_w_and_prints_the_bubble(tmp_path):
    png = tmp_path / "zb.png"
    proc = pycollect("explain", "pipeline", "--schedule", "zb-h1", "--stages", "4", "--microbatches", "8",
                     "--plot", str(png))
    _ok(proc)
    assert png.exists() and png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    lines = proc.stdout.splitlines()
    assert lines[0] == ("zb-h1 pipeline: 4 stages, 8 micro-batches; per chunk F=1 B=2 (input gradient 1, W=1) "
                        "comm=0")
    assert "stage 3: F0 B0 F1 B1 F2 B2 F3 B3 W0 F4 B4 W1 F5 B5 W2 F6 B6 W3 F7 B7 W4 W5 W6 W7" in lines
    # (p-1)/(3m+p-1) = 3/27: a third of 1f1b's idle time, (p-1)(T_F + T_B - T_W) per stage
    assert "bubble 11.11% simulated, 11.11% by the formula (p-1)/(3m+p-1) at T_F = T_B = T_W" in lines
    assert "makespan 27 (the work of one stage: 24)" in lines
    bad = pycollect("explain", "pipeline", "--schedule", "zb-h1", "--stages", "4", "--microbatches", "8",
                    "--weight-cost", "3")
    assert bad.returncode == 2 and "--weight-cost 3 exceeds --backward-cost 2" in bad.stderr
