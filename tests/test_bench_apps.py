"""bench/apps/heat.py and cg.py at one rank (no mpiexec) on a tiny grid: exit 0, complete JSON, both
implementations equal bit for bit, and the solutions equal a single-process NumPy solve (tests/apps_reference.py).
The multi-rank check is in tests/mpi/test_cartesian.py. Also, at two ranks: a pycollect halo exchange that goes
wrong after a few steps fails the run (the scripts' own check of the final solutions)."""
import json
import os
import subprocess
import sys

import numpy as np
import pytest

import apps_reference as ref

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
SHAPE = (9, 7)
KEYS = {"app", "impl", "grid", "dims", "algorithm", "steps", "residual", "converged", "blocks", "step_us",
        "step_us_best", "step_us_blocks"}


def launch(tmp_path, app, *flags):
    env = dict(os.environ, OMP_NUM_THREADS="1", PYTHONPATH=os.pathsep.join(
        [ROOT] + [p for p in [os.environ.get("PYTHONPATH")] if p]))
    cmd = [sys.executable, os.path.join(ROOT, "bench", "apps", f"{app}.py"), "--grid", "9x7", *flags,
           "--json", str(tmp_path / "out.json"), "--save", str(tmp_path / "out.npz")]
    proc = subprocess.run(cmd, env=env, cwd=ROOT, capture_output=True, text=True, timeout=60)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    return json.loads((tmp_path / "out.json").read_text()), np.load(tmp_path / "out.npz")


@pytest.mark.parametrize("app", ["heat", "cg"])
def test_app_at_one_rank_matches_a_single_process_solve(tmp_path, app):
    flags = ["--every", "5", "--tol", "1e-6", "--max-steps", "300"] if app == "heat" else ["--tol", "1e-10"]
    data, saved = launch(tmp_path, app, *flags)
    assert data["schema"] == "pycollect.bench/1" and data["kind"] == f"app_{app}"
    assert data["header"]["world_size"] == 1 and data["header"]["grid"] == list(SHAPE)
    records = data["records"]
    assert [r["impl"] for r in records] == ["pycollect", "mpi4py"] and all(set(r) == KEYS for r in records)
    for r in records:
        assert r["converged"] and r["dims"] == [1, 1] and r["step_us"] > 0 and len(r["step_us_blocks"]) == r["blocks"]
    summary = data["summary"]
    assert summary["bit_equal"] and summary["max_diff"] == 0.0 and summary["ratio"] > 0 and summary["failed"] == []
    assert summary["checked"]["reference"] == "single process" and summary["checked"]["against_mpi4py"]
    if app == "heat":
        cells, steps, residual = ref.heat(SHAPE, 5, 1e-6, 300)
        assert np.array_equal(saved["pycollect"], cells) and np.array_equal(saved["mpi4py"], cells)
        assert records[0]["steps"] == steps and records[0]["residual"] == residual
    else:
        x, steps, residual = ref.cg(SHAPE, 1e-10, 5000)
        assert np.array_equal(saved["pycollect"], saved["mpi4py"])
        assert np.allclose(saved["pycollect"], x, rtol=1e-12, atol=0) and records[0]["steps"] == steps
        assert ref.laplacian_residual(saved["pycollect"]) < 1e-9


def test_a_bad_flag_is_an_error_before_any_solve(tmp_path):
    script = os.path.join(ROOT, "bench", "apps", "heat.py")
    proc = subprocess.run([sys.executable, script, "--grid", "0x4"], capture_output=True, text=True, timeout=60,
                          env=dict(os.environ, PYTHONPATH=ROOT))
    assert proc.returncode == 2 and "--grid" in proc.stderr and "at least one cell" in proc.stderr


# pycollect's halo exchange right for its first three calls, then rank 1's top ghost row (its neighbour's cells) off by
# 1e-3 after every wait: a wrong exchange from the fourth step on
HALO_GOES_WRONG = """
import os, runpy, sys
sys.path.insert(0, os.path.dirname(sys.argv[1]))
import grid2d
honest, calls = grid2d.PycollectFace.start_halo, [0]
class Wrong:
    def __init__(self, request, u):
        self.request, self.u = request, u
    def wait(self):
        self.request.wait()
        self.u[0, 1:-1] += 1e-3
def start_halo(self, u):
    calls[0] += 1
    request = honest(self, u)
    return Wrong(request, u) if self.comm.rank == 1 and calls[0] > 3 else request
grid2d.PycollectFace.start_halo = start_halo
sys.argv = sys.argv[1:]
runpy.run_path(sys.argv[0], run_name="__main__")
"""


@pytest.mark.parametrize("app, flags", [("heat", ["--every", "5", "--tol", "1e-6", "--max-steps", "40"]),
                                        ("cg", ["--tol", "1e-10", "--max-steps", "200"])])
@pytest.mark.parametrize("wrong", [False, True])
def test_a_wrong_solution_at_two_ranks_fails_the_run(tmp_path, app, flags, wrong):
    """Under mpiexec -n 2 on 16x12: right, exit 0 with the single-process solve and mpi4py's as references; a halo
    exchange wrong after three steps, exit 1 on every rank, a FAILED line, the summary naming what differed and no
    ratio."""
    env = dict(os.environ, OMP_NUM_THREADS="1", MPIEXEC_TIMEOUT="60", PYTHONPATH=os.pathsep.join(
        [ROOT] + [p for p in [os.environ.get("PYTHONPATH")] if p]))
    script = os.path.join(ROOT, "bench", "apps", f"{app}.py")
    head = [sys.executable, "-c", HALO_GOES_WRONG, script] if wrong else [sys.executable, script]
    cmd = ["mpiexec", "-n", "2", *head, "--grid", "16x12", *flags, "--json", str(tmp_path / "out.json")]
    proc = subprocess.run(cmd, env=env, cwd=ROOT, capture_output=True, text=True, timeout=90)
    summary = json.loads((tmp_path / "out.json").read_text())["summary"]
    if not wrong:
        assert proc.returncode == 0 and summary["failed"] == [] and summary["ratio"] > 0, proc.stdout + proc.stderr
        return
    assert proc.returncode == 1, proc.stdout[-3000:] + proc.stderr[-3000:]
    assert "FAILED: pycollect differs from the single-process solve" in proc.stdout
    assert summary["ratio"] is None and summary["ratio_best"] is None
    assert any(f.startswith("pycollect differs from the single-process solve") for f in summary["failed"])
    assert any(f.startswith("pycollect differs from mpi4py") for f in summary["failed"])
    assert not any(f.startswith("mpi4py") for f in summary["failed"])
