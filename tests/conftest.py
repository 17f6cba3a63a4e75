"""Tests run in two ways: directly (schedules, traffic, tools) and, for tests/mpi, under mpiexec.

``tests/test_mpi.py`` launches ``tests/mpi`` under ``mpiexec`` at several world sizes with
``PYCOLLECT_UNDER_MPI=1``; a plain ``pytest`` run does not collect ``tests/mpi`` itself.
"""
import os
import sys

sys.path.insert(0, os.path.dirname(__file__))

collect_ignore = [] if os.environ.get("PYCOLLECT_UNDER_MPI") == "1" else ["mpi"]
