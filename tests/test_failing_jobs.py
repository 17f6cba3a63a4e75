"""Jobs where something goes wrong inside a collective: they end with a message, never with a wrong answer.

Each job runs under ``mpiexec`` without ``PYCOLLECT_TIMEOUT`` (``MPIEXEC_TIMEOUT`` is only a
backstop) and prints ``RETURNED`` if a collective handed anything back. The tests assert that
no rank did, that the job ended soon, and what the message names.
"""
import os
import subprocess
import sys
import time

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
BACKSTOP = 60       # MPIEXEC_TIMEOUT: a job pycollect failed to end
PROMPT = 25.0       # a job that ends on its own ends well within this (start-up on a loaded machine included)


def run_job(tmp_path, script: str, n: int, env_extra=None):
    path = tmp_path / "job.py"
    path.write_text(script)
    env = dict(os.environ, MPIEXEC_TIMEOUT=str(BACKSTOP), OMP_NUM_THREADS="1", PYTHONUNBUFFERED="1")
    for name in ("PYCOLLECT_TIMEOUT", "PYCOLLECT_DEBUG", "PYCOLLECT_TIMEOUT_ABORT"):
        env.pop(name, None)
    env.update(env_extra or {})
    start = time.monotonic()
    cmd = [sys.executable, str(path)] if n == 0 else ["mpiexec", "-n", str(n), sys.executable, str(path)]
    proc = subprocess.run(cmd, cwd=tmp_path, env=env, capture_output=True, text=True, timeout=BACKSTOP + 30)
    return proc, time.monotonic() - start, proc.stdout + proc.stderr


def ended_without_returning(proc, elapsed, out):
    assert proc.returncode != 0, out
    assert "RETURNED" not in out, out
    assert elapsed < PROMPT, (elapsed, out)


# -- (1) nothing follows an abort ---------------------------------------------------------------------------
ABORT_RETURNS = """
import numpy as np
from mpi4py import MPI
world = MPI.COMM_WORLD

class ReturningWorld:
    # MPICH's Abort may return for some milliseconds before the job is killed
    def Get_rank(self):
        return world.Get_rank()

    def Abort(self, code=0):
        print("ABORT", code, flush=True)

MPI.COMM_WORLD = ReturningWorld()
import pycollect as pc
comm = pc.Communicator(world, timeout=0.2)
comm.recv(np.zeros(3), source=0, tag=5)     # nothing was sent: times out, the watchdog aborts
print("RETURNED", flush=True)
"""


def test_watchdog_abort_never_returns_to_the_caller(tmp_path):
    proc, elapsed, out = run_job(tmp_path, ABORT_RETURNS, 0, {"PYCOLLECT_FLIGHT_DIR": str(tmp_path)})
    ended_without_returning(proc, elapsed, out)
    assert "ABORT 1" in out and "recv (point-to-point, tag 5) timed out" in out, out


# -- (4) a rank that catches its own argument error and goes on ------------------------------------------------
SKIPS = """
import numpy as np
import pycollect as pc
comm = pc.Communicator()
x = np.full(1000, comm.rank + 1.0)
{first}
try:
    comm.allreduce(x, op="mean" if comm.rank == 1 else "sum", algorithm="{algorithm}")   # rank 1 fails
except ValueError as e:
    print("caught:", e, flush=True)
y = comm.allreduce(10 * x, algorithm="{algorithm}")                                        # the next call
print("RETURNED", comm.rank, y[:2], flush=True)
"""


@pytest.mark.parametrize("n, algorithm", [(2, "ring"), (2, "recursive_doubling"), (3, "recursive_doubling"),
                                          (4, "rabenseifner")])
def test_a_rank_that_skips_a_call_is_found_not_paired(tmp_path, n, algorithm):
    """At two ranks the recursive doubling is the lean exchange (one MPI_Sendrecv, which cannot look for strays
    while it waits): the rank that went on finds the other's message of the call it left."""
    proc, elapsed, out = run_job(tmp_path, SKIPS.format(algorithm=algorithm, first=""), n)
    ended_without_returning(proc, elapsed, out)
    assert "caught: allreduce: unknown op 'mean'" in out
    assert f"allreduce #2 ({algorithm})" in out and "message of call #1" in out and "calls do not pair up" in out, out
    assert "aborting the job" in out


SKIPS_ALLGATHER = """
import numpy as np
import pycollect as pc
comm = pc.Communicator()
x = np.full(10000, comm.rank + 1.0)                      # 160 KB gathered: auto runs the ring's exchange at two ranks
try:
    comm.allgather(x, counts=[10000, 10000], out=np.zeros(3) if comm.rank == 1 else None)   # rank 1 fails
except ValueError as e:
    print("caught:", e, flush=True)
y = comm.allgather(10 * x, counts=[10000, 10000])
print("RETURNED", comm.rank, y[:2], flush=True)
"""


def test_a_rank_that_skips_an_allgather_exchange_is_found_not_paired(tmp_path):
    proc, elapsed, out = run_job(tmp_path, SKIPS_ALLGATHER, 2)
    ended_without_returning(proc, elapsed, out)
    assert "caught: allgather: out has shape (3,)" in out
    assert "allgather #2 (ring)" in out and "message of call #1" in out and "calls do not pair up" in out, out


@pytest.mark.parametrize("n, algorithm", [(2, "mpi"), (3, "auto")])
def test_a_rank_that_caught_its_argument_error_never_pairs_with_mpis_own_call(tmp_path, n, algorithm):
    """MPI pairs its own collectives by order: the rank's next call went into MPI_Allreduce beside the others' call
    #1, and every rank returned a wrong sum without an error (before 2026-12-05). Now that rank meets the others in
    the recheck first (Runner.refused), where it waits, as the others wait in call #1: under PYCOLLECT_TIMEOUT the
    job ends. Where a schedule follows, its tags find the skipped call (the test above)."""
    proc, elapsed, out = run_job(tmp_path, SKIPS.format(algorithm=algorithm, first=""), n, {"PYCOLLECT_TIMEOUT": "2"})
    ended_without_returning(proc, elapsed, out)
    assert "caught: allreduce: unknown op 'mean'" in out
    assert "call #2 (recheck after call #1 raised here) timed out" in out and "aborting the job" in out, out


AFTER_REFUSAL = """
import numpy as np
import pycollect as pc
comm = pc.Communicator()
x = np.full(4, comm.rank + 1.0)
try:   # rank 1 refuses call #1 (its own out), the others wait in MPI's own allreduce
    y = comm.{refused}(x, out=np.zeros(5) if comm.rank == 1 else None){wait}
    print("RETURNED", comm.rank, y, flush=True)
except ValueError as e:
    print("caught:", e, flush=True)
    y = {next}
    print("RETURNED", comm.rank, y, flush=True)
"""


@pytest.mark.parametrize("how", ['algorithm="auto"', 'algorithm="mpi"',
                                 'op=pc.Op(lambda a, b, out: np.add(a, b, out=out), commute=False)'],
                         ids=["auto", "mpi", "non-commutative"])
def test_a_non_blocking_call_after_a_refused_one_never_pairs_with_mpis_own(tmp_path, how):
    """A rank refused a call the others wait in, then makes a small non-blocking call to MPI's own: MPI would pair it
    with theirs by order, and under PYCOLLECT_TIMEOUT (a watched MPI call is non-blocking inside) both returned the
    other's sums without an error (until 2026-12-05: 201 on rank 0, 101 on rank 1; from that morning "auto" ran a
    schedule instead, but ``algorithm="mpi"`` and a non-commutative op's call still paired, until the evening).
    Its start does not wait: it starts the recheck and goes behind it, and waits there, as the others wait in call
    #1: the job ends."""
    script = AFTER_REFUSAL.format(refused="allreduce", wait="", next=f"comm.iallreduce(100 * x, {how}).wait()")
    proc, elapsed, out = run_job(tmp_path, script, 2, {"PYCOLLECT_TIMEOUT": "2"})
    ended_without_returning(proc, elapsed, out)
    assert "caught: allreduce: out has shape" in out, out
    assert "call #2 (recheck after call #1 raised here) timed out" in out and "aborting the job" in out, out


@pytest.mark.parametrize("form", ["blocking", "non-blocking"])
def test_an_exchange_of_counts_after_a_refused_call_never_pairs_with_mpis_own(tmp_path, form):
    """A rank refused a call the others wait in (MPI's own allreduce), then makes an allgather without counts, whose
    rows are exchanged first. The exchange went on the communicator of MPI's own calls, and MPI matched it with the
    others' pending call (non-blocking, or watched under PYCOLLECT_TIMEOUT): rank 0 returned the exchanged row as
    its sums ([1. nan ...]) before the job ended (until 2026-12-05). Exchanges have a communicator of their own."""
    i, wait = ("", "") if form == "blocking" else ("i", ".wait()")
    script = AFTER_REFUSAL.format(refused=f"{i}allreduce", wait=wait, next=f"comm.{i}allgather(np.full(2, 7.0)){wait}")
    proc, elapsed, out = run_job(tmp_path, script, 2, {"PYCOLLECT_TIMEOUT": "2"})
    ended_without_returning(proc, elapsed, out)
    assert "caught: allreduce: out has shape" in out, out
    assert "allgather #2 (exchange of counts) timed out" in out and "aborting the job" in out, out


REFUSED_AGAIN = """
import numpy as np
import pycollect as pc
comm = pc.Communicator()
x = np.full(4, comm.rank + 1.0)
try:   # call #1: every rank refuses it
    comm.allreduce(x, out=np.zeros(5))
except ValueError as e:
    print("caught:", e, flush=True)
comm.iallreduce(x, algorithm="mpi").wait()   # call #2: starts the recheck, which every rank passes
try:   # call #3: rank 1 refuses it alone, the others wait in MPI's own
    comm.allreduce(x, out=np.zeros(5) if comm.rank == 1 else None)
    print("RETURNED", comm.rank, flush=True)
except ValueError as e:
    print("caught again:", e, flush=True)
    y = {next}
    print("RETURNED", comm.rank, y, flush=True)
"""


@pytest.mark.parametrize("next", ["comm.allreduce(100 * x)", "comm.iallreduce(100 * x).wait()"],
                         ids=["blocking", "non-blocking"])
def test_a_call_refused_after_a_recheck_started_is_rechecked_again(tmp_path, next):
    """The recheck a non-blocking call started (call #2) does not cover a call this rank refused after it (#3): its
    next call starts a recheck of its own, where it waits, as the others wait in call #3. Covered by the first
    recheck, it went on to MPI's own and paired with the others' call #3 (a wrong sum on every rank, found by
    reading before it could land)."""
    proc, elapsed, out = run_job(tmp_path, REFUSED_AGAIN.format(next=next), 2, {"PYCOLLECT_TIMEOUT": "2"})
    ended_without_returning(proc, elapsed, out)
    assert "caught again: allreduce: out has shape" in out, out
    assert "call #4 (recheck after call #3 raised here) timed out" in out and "aborting the job" in out, out


ZERO_NAMES = """
import numpy as np
import pycollect as pc
from pycollect.zero import ZeroAdamW
comm = pc.Communicator()
params = {"a": np.arange(6.0), "b": 100 + np.arange(6.0), "c": 200 + np.arange(4.0)}   # b spans both shards
opt = ZeroAdamW(params, comm, stage=3)
try:   # rank 1 names no parameter; the others gather b
    got = opt.gather(["nope"] if comm.rank == 1 else ["b"])
    print("RETURNED", comm.rank, got["b"], flush=True)
except ValueError as e:
    print("caught:", e, flush=True)
    got = opt.gather(["c"])
    print("RETURNED", comm.rank, got["c"], flush=True)
"""


def test_a_rank_that_caught_a_bad_layer_name_never_pairs_its_next_gather_with_the_others(tmp_path):
    """ZeroAdamW.gather with names that are no parameters raised on that rank alone, before its allgather; a rank
    that caught it and gathered the next layer paired that allgather with the others' of the first: rank 0 returned
    b as [100. 101. 200. 201. 202. 203.] (c's rows in b's), no error, until 2026-12-05. The error now counts as a
    refused collective: the next gather meets the others first, where it waits as they wait in theirs."""
    proc, elapsed, out = run_job(tmp_path, ZERO_NAMES, 2, {"PYCOLLECT_TIMEOUT": "2"})
    ended_without_returning(proc, elapsed, out)
    assert "caught: ZeroAdamW.gathered: ['nope'] are not parameters" in out, out
    assert "(recheck after call #2 raised here) timed out" in out and "aborting the job" in out, out


@pytest.mark.parametrize("case", ["skips", "skips-first", "shapes", "ops"])
def test_window_calls_that_do_not_pair_end_the_job(tmp_path, case):
    """Shared-memory windows carry no tags: the ranks compare call numbers and shapes at each call's start
    (the first window call of a Communicator, before its windows open, in the exchange of counts)."""
    opened = 'comm.allreduce(x, algorithm="shm")   # every rank: the windows open'
    script = {"skips": SKIPS.format(algorithm="shm", first=opened), "skips-first": SKIPS.format(algorithm="shm", first=""),
              "shapes": DIFFERS.format(n0=1000, n1=5000, dtype0="f8", dtype1="f8", algorithm="shm"),
              "ops": DIFFERS.format(n0=1000, n1=1000, dtype0="f8", dtype1="f8", algorithm="shm").replace(
                  'algorithm="shm")', 'algorithm="shm", op="sum" if comm.rank == 0 else "max")')}[case]
    proc, elapsed, out = run_job(tmp_path, script, 3)
    ended_without_returning(proc, elapsed, out)
    words = {"skips": ["allreduce #3 (shm)", "ranks were at calls #2 to #3"],
             "skips-first": ["(exchange of counts)", "counts of calls #2 (rank 1), #1 (ranks 0, 2)"],
             "shapes": ["allreduce #2 (shm)", "calls differ in shape, counts, root, dtype or op"],
             "ops": ["allreduce #2 (shm)", "calls differ in shape, counts, root, dtype or op"]}[case]
    assert all(w in out for w in words) and "do not pair up" in out and "aborting the job" in out, out


WINDOW_MISSING = """
import numpy as np
import pycollect as pc
comm = pc.Communicator(timeout=1.0)
comm.allreduce(np.ones(1000), algorithm="shm")       # call 1: every rank, the windows open
if comm.rank != 1:                                   # call 2: rank 1 never comes
    y = comm.allreduce(np.ones(1000), algorithm="shm")
    print("RETURNED", comm.rank, y[:2], flush=True)
else:
    import time; time.sleep(20)
"""


def test_a_rank_missing_from_a_window_call_times_out(tmp_path):
    """The agreement at a window call's start is watched like any wait: the watchdog names it and ends the job."""
    proc, elapsed, out = run_job(tmp_path, WINDOW_MISSING, 3)
    ended_without_returning(proc, elapsed, out)
    assert "allreduce #2 (window agreement) timed out" in out, out


# -- (6) an error on one rank inside a collective ends the job, naming the call ------------------------------------
DIFFERS = """
import numpy as np
import pycollect as pc
comm = pc.Communicator()
x = np.ones({n0} if comm.rank == 0 else {n1}, "{dtype0}" if comm.rank == 0 else "{dtype1}")
comm.allreduce(np.ones(4), algorithm="ring")                # call 1 pairs up
y = comm.allreduce(x, algorithm="{algorithm}")             # call 2 does not
print("RETURNED", comm.rank, y[:2], flush=True)
"""


@pytest.mark.parametrize("case", [
    dict(n0=1000, n1=1000, dtype0="f8", dtype1="f4", algorithm="ring"),
    dict(n0=1000, n1=1002, dtype0="f8", dtype1="f8", algorithm="ring"),
    dict(n0=1002, n1=1000, dtype0="f8", dtype1="f8", algorithm="recursive_doubling"),
    dict(n0=5000, n1=5002, dtype0="f8", dtype1="f8", algorithm="auto"),   # the two ranks' exchange (lean path)
], ids=["dtypes", "shapes", "shapes-rd", "shapes-auto-exchange"])
def test_calls_that_differ_end_the_job_naming_the_call(tmp_path, case):
    proc, elapsed, out = run_job(tmp_path, DIFFERS.format(**case), 2)
    ended_without_returning(proc, elapsed, out)
    named = "recursive_doubling" if case["algorithm"] == "auto" else case["algorithm"]
    assert f"allreduce #2 ({named})" in out and "aborting the job" in out, out


DIFFERS_RS = """
import numpy as np
import pycollect as pc
comm = pc.Communicator()
x = np.ones(10000 if comm.rank == 0 else 10004)
y = comm.reduce_scatter(x)                               # auto at two ranks: the ring's exchange (lean path)
print("RETURNED", comm.rank, y[:2], flush=True)
"""


def test_a_reduce_scatter_exchange_whose_ranks_differ_ends_the_job(tmp_path):
    proc, elapsed, out = run_job(tmp_path, DIFFERS_RS, 2)
    ended_without_returning(proc, elapsed, out)
    assert "reduce_scatter #1 (ring)" in out and "aborting the job" in out, out


DIFFERS_AG = """
import numpy as np
import pycollect as pc
comm = pc.Communicator()
n = 10000 if comm.rank == 0 else 10008                   # each rank's counts say its own rows: they differ
y = comm.allgather(np.ones(n, "f4"), counts=[n, n])       # auto at two ranks: the ring's exchange (lean path)
print("RETURNED", comm.rank, y[:2], flush=True)
"""


def test_an_allgather_exchange_whose_ranks_differ_ends_the_job(tmp_path):
    proc, elapsed, out = run_job(tmp_path, DIFFERS_AG, 2)
    ended_without_returning(proc, elapsed, out)
    assert "allgather #1 (ring)" in out and "aborting the job" in out, out


DIFFERS_NATIVE = """
import numpy as np
import pycollect as pc
comm = pc.Communicator()
x = np.ones(1000 if comm.rank == 0 else 999)
y = comm.allreduce(x, algorithm="mpi")
print("RETURNED", comm.rank, flush=True)
"""


def test_mpi_own_call_that_fails_ends_the_job(tmp_path):
    proc, elapsed, out = run_job(tmp_path, DIFFERS_NATIVE, 2)
    ended_without_returning(proc, elapsed, out)


OP_RAISES = """
import numpy as np
import pycollect as pc
comm = pc.Communicator()
def add(a, b, out):
    if a.size > 1:   # passes the one-element check, fails inside the reduction (on each rank that reduces)
        raise ZeroDivisionError("the user's op failed")
    np.add(a, b, out=out)
y = comm.allreduce(np.ones(1000), op=pc.Op(add, commute=False), algorithm="{algorithm}")
print("RETURNED", comm.rank, y[:2], flush=True)
"""


@pytest.mark.parametrize("algorithm", ["mpi", "tree"])
def test_a_user_op_that_raises_inside_the_reduction_ends_the_job(tmp_path, algorithm):
    """Raised inside MPI's own reduction, mpi4py's handler calls MPI_Abort, which returns in MPICH: MPI went on
    without that rank's part and handed the ranks a wrong result before the launcher ended the job."""
    proc, elapsed, out = run_job(tmp_path, OP_RAISES.format(algorithm=algorithm), 3)
    ended_without_returning(proc, elapsed, out)
    where = "MPI's own reduction with op add" if algorithm == "mpi" else "allreduce #1 (tree)"
    assert f"{where} failed inside the collective: ZeroDivisionError: the user's op failed" in out, out


# -- (4) the count exchange carries the call's number: found whatever algorithm follows, MPI's own too ------------
SKIPS_EXCHANGE = """
import numpy as np
import pycollect as pc
comm = pc.Communicator()
x = np.full((comm.size, 2), comm.rank + 1.0)
counts = [comm.size] + [0] * (comm.size - 1) if "{collective}" == "alltoall" else None   # a row: exchanged
try:
    comm.{collective}(x, algorithm="{algorithm}", counts=counts, out=np.zeros(1) if comm.rank == 1 else None)  # 1
except (ValueError, TypeError) as e:
    print("caught:", e, flush=True)
y = comm.{collective}(x, algorithm="{algorithm}", counts=counts)                                           # 2
print("RETURNED", comm.rank, y.shape, flush=True)
"""


@pytest.mark.parametrize("collective, algorithm", [("allgather", "mpi"), ("allgather", "ring"), ("alltoall", "mpi")])
def test_a_skipped_call_is_found_at_the_count_exchange(tmp_path, collective, algorithm):
    proc, elapsed, out = run_job(tmp_path, SKIPS_EXCHANGE.format(collective=collective, algorithm=algorithm), 3)
    ended_without_returning(proc, elapsed, out)
    assert "caught:" in out and "the ranks exchanged the counts of calls" in out, out
    assert "calls #2 (rank 1), #1 (ranks 0, 2)" in out and "calls do not pair up" in out, out


# -- a rank whose program dies of an uncaught error ------------------------------------------------------------
IN_A_THREAD = """
import threading
import numpy as np
import pycollect as pc
comm = pc.Communicator()
def work():
    if comm.rank == 1:
        comm.allreduce(np.ones(3), op="average")    # rank 1's own argument error in its worker thread, not caught
    print("RETURNED", comm.rank, comm.allreduce(np.ones(3)), flush=True)   # the others wait here for rank 1
worker = threading.Thread(target=work, name="worker")
worker.start()
worker.join()
"""


def test_a_thread_that_dies_of_an_uncaught_error_ends_the_job(tmp_path):
    """An uncaught error that ends a worker thread (the one calling pycollect) on one rank: its traceback, then
    pycollect's abort (threading.excepthook), at once. Before 2026-12-05 only sys.excepthook was set: the rank's main
    thread ended, and every other rank waited in its allreduce until the launcher's time limit (found by a helper)."""
    proc, elapsed, out = run_job(tmp_path, IN_A_THREAD, 3)
    assert "RETURNED" not in out and "unknown op 'average'" in out, out
    ended_without_returning(proc, elapsed, out)
    assert "pycollect: rank 1: thread 'worker' ended with an uncaught ValueError (above); aborting the job" in out, out

UNCAUGHT = """
import sys
import numpy as np
import pycollect as pc
comm = pc.Communicator()
{hook}
if comm.rank == 1:
    comm.allreduce(np.ones(3), op="average")    # rank 1's own argument error, not caught: its program ends
y = comm.allreduce(np.ones(3))                  # the others wait here for rank 1
print("RETURNED", comm.rank, y, flush=True)
"""


@pytest.mark.parametrize("hook", ["", "sys.excepthook = sys.__excepthook__"], ids=["pycollect's", "the program's"])
def test_a_rank_that_dies_of_an_uncaught_error_ends_the_job(tmp_path, hook):
    """The rank's traceback, then pycollect's abort: the job ends at once (before, every other rank waited in its
    allreduce, and MPI_Finalize on the dying rank, until the launcher's time limit). A program that sets its own
    excepthook keeps it (and the old behaviour); so does PYCOLLECT_ABORT_ON_ERROR=0."""
    proc, elapsed, out = run_job(tmp_path, UNCAUGHT.format(hook=hook), 3, {"MPIEXEC_TIMEOUT": "8"} if hook else None)
    assert "RETURNED" not in out and "unknown op 'average'" in out, out
    if hook:       # the launcher's backstop ends it
        assert elapsed >= 8 and "pycollect: rank 1: the program ended" not in out, (elapsed, out)
        return
    ended_without_returning(proc, elapsed, out)
    assert "pycollect: rank 1: the program ended with an uncaught ValueError (above); aborting the job" in out, out


MISSPELT = """
import pycollect as pc
from mpi4py import MPI
settings = {"timeot": 5} if MPI.COMM_WORLD.rank == 1 else {}
comm = pc.Communicator(**settings)    # rank 1's TypeError comes from Python, before any agreement
print("RETURNED", comm.rank, flush=True)
"""


def test_a_rank_whose_first_communicator_raises_alone_ends_the_job(tmp_path):
    """A misspelt keyword to a rank's first Communicator: Python raises it before the settings' agreement, which the
    others wait in. The hook is installed as pycollect loads MPI, so the job ends at once; before 2026-12-05 it came
    with the first Communicator, which that rank never made: the job waited until the launcher's time limit."""
    proc, elapsed, out = run_job(tmp_path, MISSPELT, 2)
    assert "unexpected keyword argument 'timeot'" in out, out
    ended_without_returning(proc, elapsed, out)
    assert "pycollect: rank 1: the program ended with an uncaught TypeError (above); aborting the job" in out, out


# -- the recheck after a refused call (Runner.refused), where MPI's own calls follow ------------------------------
LEAF_THEN_ALL = """
import numpy as np
import pycollect as pc
c = pc.Communicator()
R = c.rank
try:   # rank 1 refuses broadcast #1 (its own bad out); the root's MPI_Bcast returns without it
    c.broadcast(np.full(4, 111.0) if R == 0 else np.zeros(4), root=0, out=np.zeros(5) if R == 1 else None)
except ValueError as e:
    print("caught:", e, flush=True)
try:   # every rank refuses call #2
    c.allreduce(np.ones(4), op="mean")
except ValueError as e:
    print("caught:", e, flush=True)
got = c.broadcast(np.full(4, 333.0) if R == 0 else np.zeros(4), root=0)   # rank 1's took broadcast #1's message
print("RETURNED", R, got, flush=True)
"""

NEIGHBOURS = """
import numpy as np
import pycollect as pc
c = pc.Communicator()
g = c.cartesian([c.size], periods=True)
try:   # rank 1 refuses neighbor_allgather #k (its own bad out)
    g.neighbor_allgather(np.full(2, 100.0 + c.rank), out=np.zeros((3, 2)) if c.rank == 1 else None)
except ValueError as e:
    print("caught:", e, flush=True)
got = g.neighbor_allgather(np.full(2, 300.0 + c.rank))   # paired with the others' refused call before
print("RETURNED", c.rank, got.ravel(), flush=True)
"""


def test_a_rank_that_refused_alone_then_with_the_others_is_found_at_the_recheck(tmp_path):
    """The recheck compares the calls the ranks refused first too: rank 1 alone refused a broadcast the root ended
    without it, then every rank refused call #2; on the numbers alone they passed, and rank 1's broadcast #3 returned
    broadcast #1's data (found by a helper)."""
    proc, elapsed, out = run_job(tmp_path, LEAF_THEN_ALL, 2)
    ended_without_returning(proc, elapsed, out)
    assert "recheck after call #" in out and "the calls they refused first" in out, out


def test_a_refused_neighbourhood_call_is_not_paired_with_the_next(tmp_path):
    """Neighbourhood calls are MPI's own, paired by order: rank 1's next call took the data of the one it refused
    and the others' refused call the next one's (found by a helper). Now it waits in the recheck, as they wait in
    the call it refused: under PYCOLLECT_TIMEOUT the job ends."""
    proc, elapsed, out = run_job(tmp_path, NEIGHBOURS, 3, {"PYCOLLECT_TIMEOUT": "2"})
    ended_without_returning(proc, elapsed, out)
    assert "caught:" in out and "timed out" in out, out
