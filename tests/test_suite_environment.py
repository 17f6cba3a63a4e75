"""The suite runs under pycollect's defaults whatever the user's shell exports (tests/conftest.py)."""
import os
import subprocess
import sys

import pytest

PROBE = "PYCOLLECT_SUITE_PROBE"   # set only for the inner run below


@pytest.mark.skipif(os.environ.get(PROBE) != "1", reason="the inner run of the test below")
def test_probe():
    assert "PYCOLLECT_TIMEOUT" not in os.environ and "PYCOLLECT_ALGO_ALLREDUCE" not in os.environ
    assert os.environ.get("PYCOLLECT_CUDA_AWARE") == "0"   # the machine's MPI, kept


def test_settings_exported_by_the_user_are_left_out_of_the_tests():
    env = dict(os.environ, PYCOLLECT_TIMEOUT="7", PYCOLLECT_ALGO_ALLREDUCE="ring", PYCOLLECT_CUDA_AWARE="0",
               **{PROBE: "1"})
    env.pop("PYCOLLECT_UNDER_MPI", None)
    proc = subprocess.run([sys.executable, "-m", "pytest", "-p", "no:cacheprovider", "-o", "addopts=",
                           f"{__file__}::test_probe"], env=env, capture_output=True, text=True, timeout=120)
    out = proc.stdout + proc.stderr
    assert proc.returncode == 0 and "1 passed" in out, out
    assert "left out of the tests (they run under the defaults): PYCOLLECT_ALGO_ALLREDUCE, PYCOLLECT_TIMEOUT" in out, out
