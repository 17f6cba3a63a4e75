"""bench/apps/heat.py and cg.py at one rank (no mpiexec) on a tiny grid: exit 0, complete JSON, both
implementations equal bit for bit, and the solutions equal a single-process NumPy solve (tests/apps_reference.py).
The multi-rank check is in tests/mpi/test_cartesian.py."""
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
    assert summary["bit_equal"] and summary["max_diff"] == 0.0 and summary["ratio"] > 0
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
