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
