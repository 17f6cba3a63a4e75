"""Under mpiexec: a failing test ends the whole job at once.

A hung one is reported by pytest's ``faulthandler_timeout`` (stacks dumped) and ended by
``MPIEXEC_TIMEOUT``, both set by tests/test_mpi.py.
"""
import sys

import pytest
from hypothesis import settings
from mpi4py import MPI

import pycollect as pc

settings.register_profile("mpi", derandomize=True, database=None, deadline=None, max_examples=25,
                          print_blob=True)
settings.load_profile("mpi")


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item, call):
    outcome = yield
    report = outcome.get_result()
    if report.failed:
        # The other ranks may be waiting in a collective this rank will never enter.
        # The process's own stderr: pytest's capture (sys.stderr, or the descriptor without --capture=sys) would
        # end with the process unread.
        own = sys.__stderr__
        own.write(f"\n[rank {MPI.COMM_WORLD.rank}] FAILED {item.nodeid}\n{report.longreprtext}\n")
        own.flush()
        MPI.COMM_WORLD.Abort(1)


@pytest.fixture(scope="session")
def comm():
    c = pc.Communicator()
    yield c
    c.free()


@pytest.fixture(autouse=True)
def messages_in_order_again(comm):
    """A message a test refused ends its peer and tag's messages on that rank (Communicator._in_order); it posted
    nothing, so the next test's messages there pair in order again."""
    yield
    comm._refused_messages.clear()
