"""pycollect ships ``py.typed``: mypy finds no error in the package (settings in setup.cfg's [mypy])."""
import os
import subprocess
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def test_mypy_finds_no_error_in_the_package(tmp_path):
    proc = subprocess.run([sys.executable, "-m", "mypy", "pycollect", "--cache-dir", str(tmp_path / "mypy-cache")],
                          cwd=ROOT, capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stdout[-20000:] + proc.stderr[-5000:]
    assert "Success: no issues found" in proc.stdout, proc.stdout
