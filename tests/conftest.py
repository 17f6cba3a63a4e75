"""Tests run in two ways: directly (schedules, traffic, tools) and, for tests/mpi, under mpiexec.

``tests/test_mpi.py`` launches ``tests/mpi`` under ``mpiexec`` at several world sizes with
``PYCOLLECT_UNDER_MPI=1``; a plain ``pytest`` run does not collect ``tests/mpi`` itself.
"""
import os
import sys

sys.path.insert(0, os.path.dirname(__file__))

collect_ignore = [] if os.environ.get("PYCOLLECT_UNDER_MPI") == "1" else ["mpi"]

# Python's default, bytecode cached in __pycache__, even where the environment turns it off: the tests start
# about 30 interpreters under mpiexec and many more for the command-line tools, and each would compile
# pycollect and the test modules again (0.7 s of CPU each for tests/mpi with PYTHONDONTWRITEBYTECODE=1).
os.environ.pop("PYTHONDONTWRITEBYTECODE", None)
sys.dont_write_bytecode = False

from pycollect.engine import environment as env  # noqa: E402  (after the bytecode setting above)

# The suite as a whole (not one job launched by hand under mpiexec) runs under pycollect's defaults: a setting the
# user's shell or job script exports (PYCOLLECT_TIMEOUT=60, PYCOLLECT_ALGO_ALLREDUCE=ring, PYCOLLECT_DEBUG=1 ...)
# would change what the tests see -- the lean paths off, other algorithms, other messages -- and failed 8 tests
# of four modules under PYCOLLECT_TIMEOUT=30 with PYCOLLECT_DEBUG=1. Tests that need a setting pass it to
# their own jobs. PYCOLLECT_CUDA_AWARE stays: it describes the machine's MPI (tests/mpi/test_cupy.py's default).
_MODES = (env.DEBUG, env.TIMEOUT, env.TIMEOUT_ABORT, env.FLIGHT_DIR, env.SEGMENT_BYTES, env.TREE_SEGMENT_BYTES,
          env.PIPELINE_BYTES, env.TUNING, env.TRACE, env.ABORT_ON_ERROR)
LEFT_OUT = sorted(name for name in os.environ if os.environ.get("PYCOLLECT_UNDER_MPI") != "1"
                  and (name in _MODES or name.startswith(env.ALGO_PREFIX)))
for _name in LEFT_OUT:
    del os.environ[_name]


def pytest_report_header(config):
    if LEFT_OUT:
        return f"pycollect settings in the environment, left out of the tests (they run under the defaults): " \
               f"{', '.join(LEFT_OUT)}"
