"""Launch tests/mpi under mpiexec at several world sizes and on two simulated nodes."""
import os
import subprocess
import sys

import pytest

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)
TIMEOUT = int(os.environ.get("PYCOLLECT_MPI_TEST_TIMEOUT", "600"))
HANG_SECONDS = 120  # a test running longer dumps every rank's stacks


def launch(n, extra_env=None, args=()):
    env = dict(os.environ, PYCOLLECT_UNDER_MPI="1", MPIEXEC_TIMEOUT=str(TIMEOUT),
               OMP_NUM_THREADS="1", OPENBLAS_NUM_THREADS="1", PYTHONUNBUFFERED="1")
    env.update(extra_env or {})
    # --capture=sys: what MPI, the watchdog or an abort writes to the process's stderr reaches ours (captured at
    # the descriptor, it went with the process: a job that ended inside a test showed nothing of why)
    cmd = ["mpiexec", "-n", str(n), sys.executable, "-m", "pytest", os.path.join(HERE, "mpi"),
           "-q", "-x", "-p", "no:cacheprovider", "--capture=sys", "-o", "timeout=0",
           "-o", f"faulthandler_timeout={HANG_SECONDS}", *args]
    proc = subprocess.run(cmd, cwd=ROOT, env=env, capture_output=True, text=True, timeout=TIMEOUT + 60)
    assert proc.returncode == 0, (f"mpiexec -n {n} failed with {proc.returncode}: {why(proc.stderr)}\n"
                                  f"--- stdout ---\n{proc.stdout[-20000:]}\n--- stderr ---\n{proc.stderr[-20000:]}")
    return proc


def why(stderr):
    """The lines that say why a job ended (a rank's failed test, pycollect's abort, MPI's), first: a report that
    shows only the start of the message still shows them."""
    marks = ("FAILED", "pycollect:", "Abort(", "Fatal Python error", "Timeout (", "BAD TERMINATION")
    lines = [line.strip() for line in stderr.splitlines() if any(mark in line for mark in marks)]
    return " | ".join(lines[:6])[:2000] or "nothing on stderr says why"


# At 5 and 8 ranks the modules of the API's plumbing, whose behaviour does not change past 4 ranks (its arguments
# and errors, threads, Requests, freeing; 3 is the odd size), are left to the smaller sizes: they took 23 of 8
# ranks' 131 s, and 17 of 5 ranks' 128 s on 2026-12-05.
PLUMBING = ["test_api.py", "test_arguments.py", "test_bad_inputs.py"]


@pytest.mark.parametrize("n", [1, 2, 3, 4, 5, 8])
def test_world_size(n):
    launch(n, args=[f"--ignore={os.path.join(HERE, 'mpi', m)}" for m in PLUMBING] if n >= 5 else ())


@pytest.mark.parametrize("n, by_block", [(4, True), (4, False), (3, False)], ids=["4-by-block", "4-round-robin",
                                                                                   "3-uneven-round-robin"])
def test_two_simulated_nodes(n, by_block):
    """n ranks as two MPICH cliques over loopback TCP: topology detection and the tier-aware paths; at 3 ranks,
    nodes of 2 and 1 (the hierarchical forms fall back, windows stay on the node of two)."""
    env = {"MPIR_CVAR_NUM_CLIQUES": "2", "UCX_TLS": "tcp,self", "PYCOLLECT_EXPECT_NODES": "2",
           "PYCOLLECT_EXPECT_BY_BLOCK": "1" if by_block else "0"}
    if by_block:
        env["MPIR_CVAR_CLIQUES_BY_BLOCK"] = "1"
    more = " or collectives or properties or hypothesis" if n == 3 else ""   # 3 ranks: cheap enough for all of them
    launch(n, env, ["-k", "topology or hierarchical or ring or auto or shm or windows or scan or test_gather"
                        " or test_scatter or gather_scatter or mpi4py_face" + more])
