"""The watchdog (PYCOLLECT_TIMEOUT): jobs with a missing or dead rank end with a message instead of hanging.

Jobs run under ``mpiexec`` with ``MPIEXEC_TIMEOUT`` as a backstop and a subprocess timeout;
the in-process tests use ``MPI.COMM_SELF``. The settings' checks need no MPI job at all.
"""
import json
import os
import re
import subprocess
import sys
import time

import numpy as np
import pytest
from mpi4py import MPI

import pycollect as pc
from pycollect.engine import watchdog

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
TIMEOUT = 2.0       # PYCOLLECT_TIMEOUT of the jobs
SLACK = 20.0        # start-up, the grace before Abort, a loaded machine
BACKSTOP = 60       # MPIEXEC_TIMEOUT: a job the watchdog failed to end

MISSING = """
import time
import numpy as np
import pycollect as pc
comm = pc.Communicator()
x = np.ones(1000, np.float32)
comm.allreduce(x, algorithm="ring")          # seq 1
comm.allreduce(x)                            # seq 2 (MPI's own)
if comm.rank == comm.size - 1:
    time.sleep(3 * {backstop})               # never arrives at seq 3
comm.allreduce(x, algorithm="ring")          # seq 3
print("unreachable", flush=True)
"""

DIES = """
import os
import numpy as np
import pycollect as pc
from pycollect.engine import executor
comm = pc.Communicator()
x = np.ones(1 << 16, np.float32)
comm.allreduce(x, algorithm="ring")          # seq 1
if comm.rank == 1:                           # seq 2: rank 1 exits once its first round is done
    end_round = executor.Execution._end_round
    def exit_after_first_round(self):
        end_round(self)
        os._exit(1)
    executor.Execution._end_round = exit_after_first_round
comm.allreduce(x, algorithm="ring")
print("unreachable", flush=True)
"""

CATCH = """
import json, time
import numpy as np
from mpi4py import MPI
import pycollect as pc
comms = [pc.Communicator() for _ in range(4)]   # one a case: a call that timed out breaks its Communicator off
if comms[0].rank == 1:
    time.sleep(3 * {backstop})               # takes part in nothing
caught, refused, outs = [], [], []
out = np.full(1000, -7.0)
for comm, (name, call) in zip(comms, [("recv", lambda c: c.recv(out[:3], source=1, tag=7)),
                                      ("allreduce", lambda c: c.allreduce(np.ones(1000), algorithm="ring", out=out)),
                                      ("allreduce", lambda c: c.allreduce(np.ones(4), algorithm="mpi", out=out[:4])),
                                      ("barrier", lambda c: c.barrier())]):
    t = time.monotonic()
    try:
        call(comm)
    except pc.CollectiveTimeout as e:
        caught.append({{"expected": name, "collective": e.collective, "seq": e.seq, "algorithm": e.algorithm,
                       "round": e.round, "rounds": e.rounds, "peers": e.peers, "pending": e.pending,
                       "waited": e.waited, "elapsed": time.monotonic() - t, "message": str(e),
                       "is_collective_error": isinstance(e, pc.CollectiveError)}})
    for later in (lambda: comm.allreduce(np.ones(2)), lambda: comm.send(np.ones(2), 1)):
        try:                                 # refused before MPI: a late peer's call would pair with that one
            later()
            refused.append("ran")
        except RuntimeError as e:
            refused.append(str(e))
    outs.append(bool((out == -7.0).all()))   # MPI was handed copies: nothing written into out
in_flight = [comm.in_flight() for comm in comms]   # the calls that timed out are over for the Communicator
try:
    for comm in comms:
        comm.free()
    freed = "freed"
except RuntimeError as e:
    freed = str(e)
with open("after.json", "w") as f:
    json.dump({{"in_flight": in_flight, "freed": freed, "refused": refused, "untouched": outs}}, f)
with open("caught.json", "w") as f:          # a file: Abort may end the launcher before it forwards stdout
    json.dump(caught, f)
print("CAUGHT", len(caught), flush=True)
time.sleep(1.0)
MPI.COMM_WORLD.Abort(7)
"""


def run_job(tmp_path, script: str, n: int, env_extra: dict, launcher=()):
    path = tmp_path / "job.py"
    path.write_text(script.format(backstop=BACKSTOP))
    env = dict(os.environ, MPIEXEC_TIMEOUT=str(BACKSTOP), PYCOLLECT_TIMEOUT=str(TIMEOUT),
               PYCOLLECT_FLIGHT_DIR=str(tmp_path / "flight"), OMP_NUM_THREADS="1", PYTHONUNBUFFERED="1")
    env.pop("PYCOLLECT_TIMEOUT_ABORT", None)
    env.update(env_extra)
    start = time.monotonic()
    proc = subprocess.run(["mpiexec", *launcher, "-n", str(n), sys.executable, str(path)], cwd=tmp_path, env=env,
                          capture_output=True, text=True, timeout=BACKSTOP + 30)
    return proc, time.monotonic() - start


def flight(tmp_path, rank: int) -> dict:
    return json.loads((tmp_path / "flight" / f"pycollect-flight-rank{rank}.json").read_text())


# -- (1) a rank that never arrives -------------------------------------------------------------------------
def test_missing_rank_times_out_names_the_peer_and_aborts(tmp_path):
    proc, elapsed = run_job(tmp_path, MISSING, 2, {})
    out = proc.stdout + proc.stderr
    assert proc.returncode != 0 and "unreachable" not in out, out
    assert TIMEOUT <= elapsed < TIMEOUT + SLACK, (elapsed, out)
    line = (re.escape("pycollect: rank 0: allreduce #3 (ring) timed out after ") + r"2\.0\d"
            + re.escape(" s (timeout 2 s) in round 0 of 2 (0-based); still pending: receive from rank 1"))
    assert re.search(line, out), out
    assert "aborting the job" in out
    data = flight(tmp_path, 0)
    assert data["schema"] == "pycollect.flight/1" and data["rank"] == 0 and data["timeout_s"] == TIMEOUT
    assert data["timed_out"]["collective"] == "allreduce" and data["timed_out"]["seq"] == 3
    assert data["timed_out"]["pending"] == [["recv", 1]] and data["timed_out"]["round"] == 0
    calls = data["collectives"]
    assert [(c["seq"], c["algorithm"], c["state"]) for c in calls] == [
        (1, "ring", "done"), (2, "mpi", "done"), (3, "ring", "timed out")]
    assert calls[0]["bytes"] == 4000 and calls[0]["dtype"] == "float32" and calls[0]["rounds_done"] == 2
    assert calls[2]["finished"] is None and calls[2]["rounds_done"] == 0 and calls[2]["started"] > 0


# -- (2) a rank that dies in the middle of a schedule -----------------------------------------------------------
def test_rank_dying_mid_schedule_is_named(tmp_path):
    """With the launcher's clean-up off, the survivors' watchdog ends the job and names the dead peer."""
    proc, elapsed = run_job(tmp_path, DIES, 3, {}, launcher=("-disable-auto-cleanup",))
    out = proc.stdout + proc.stderr
    assert proc.returncode != 0 and "unreachable" not in out, out
    assert elapsed < TIMEOUT + SLACK, (elapsed, out)
    pattern = (r"pycollect: rank [02]: allreduce #2 \(ring\) (timed out|failed) after [\d.]+ s.* in round \d of 4 "
               r"\(0-based\)[:;].*still pending: .*(receive from|send to) rank 1")
    assert re.search(pattern, out), out
    written = sorted(os.listdir(tmp_path / "flight"))
    assert written and all(json.loads((tmp_path / "flight" / f).read_text())["collectives"][-1]["seq"] == 2
                           for f in written), written


def test_rank_dying_under_the_default_launcher_ends_the_job(tmp_path):
    proc, elapsed = run_job(tmp_path, DIES, 3, {})
    assert proc.returncode != 0 and elapsed < TIMEOUT + SLACK, (elapsed, proc.stdout + proc.stderr)


# -- (3) abort off: the exception is raised and caught ---------------------------------------------------------
def test_abort_off_raises_a_catchable_timeout(tmp_path):
    proc, elapsed = run_job(tmp_path, CATCH, 2, {"PYCOLLECT_TIMEOUT_ABORT": "0"})
    out = proc.stdout + proc.stderr
    written = tmp_path / "caught.json"
    assert written.exists(), (proc.returncode, elapsed, out)
    caught = json.loads(written.read_text())
    assert [c["expected"] for c in caught] == [c["collective"] for c in caught] == [
        "recv", "allreduce", "allreduce", "barrier"], caught
    recv, ring, native, barrier = caught
    assert recv["seq"] is None and recv["pending"] == [["recv", 1]] and recv["peers"] == [1], recv
    assert "recv (point-to-point, tag 7) timed out" in recv["message"] and "receive from rank 1" in recv["message"]
    assert ring["seq"] == 1 and ring["algorithm"] == "ring" and ring["round"] == 0 and ring["rounds"] == 2
    assert ring["peers"] == [1] and ["recv", 1] in ring["pending"], ring
    assert native["seq"] == 1 and native["algorithm"] == "mpi" and native["pending"] == [] and native["rounds"] == 1
    assert "MPI's own collective" in native["message"]
    assert barrier["seq"] == 1 and barrier["algorithm"] == "mpi"
    for c in caught:
        assert c["is_collective_error"] and TIMEOUT <= c["waited"] < TIMEOUT + 2 and c["elapsed"] < TIMEOUT + 8, c
    assert "aborting the job" not in out
    assert flight(tmp_path, 0)["timed_out"]["collective"] == "barrier"
    after = json.loads((tmp_path / "after.json").read_text())
    # the timed-out ring allreduce is not left in flight: free() goes ahead (it refused, naming a Request to wait)
    assert after["in_flight"] == [0, 0, 0, 0] and after["freed"] == "freed", after
    # each Communicator refuses every later call, collective or message, naming the call that timed out (before
    # 2026-12-05 they ran on: a late or skipping peer's next call paired with the one that timed out, and the ranks
    # that had caught the timeout got wrong sums); MPI wrote nothing into out (it wrote the late peers' result
    # there after the exception)
    whats = ["recv (point-to-point, tag 7) timed out", "allreduce #1 (ring) timed out",
             "allreduce #1 (mpi) timed out", "barrier #1 (mpi) timed out"]
    assert len(after["refused"]) == 8, after
    for i, message in enumerate(after["refused"]):
        assert "takes no more calls on this rank: " + whats[i // 2] in message, (i, message)
    assert after["untouched"] == [True] * 4, after


def test_timeout_in_process_names_the_message_and_writes_the_recorder(tmp_path, monkeypatch):
    monkeypatch.setenv("PYCOLLECT_FLIGHT_DIR", str(tmp_path))
    comm = pc.Communicator(MPI.COMM_SELF, timeout=0.2, abort_on_timeout=False)
    try:
        comm.allreduce(np.ones(10), algorithm="ring")
        with pytest.raises(pc.CollectiveTimeout, match=r"rank 0: recv \(point-to-point, tag 5\) timed out after "
                                                       r"\d+\.\d\d s \(timeout 0\.2 s\).*receive from rank 0") as info:
            comm.recv(np.empty(3), source=0, tag=5)
        assert info.value.peers == [0] and info.value.waited >= 0.2
        with pytest.raises(RuntimeError, match=r"takes no more calls on this rank: recv \(point-to-point, tag 5\) "
                                               r"timed out \(abort off\)"):
            comm.send(np.zeros(3), 0, tag=5)   # it would complete the receive left posted, not a later one
        data = json.loads((tmp_path / "pycollect-flight-rank0.json").read_text())
        assert data["timed_out"]["collective"] == "recv" and data["collectives"][0]["state"] == "done"
    finally:
        comm.free()


# -- (4) settings ----------------------------------------------------------------------------------------------
@pytest.mark.parametrize("name, value", [
    ("PYCOLLECT_TIMEOUT", "abc"), ("PYCOLLECT_TIMEOUT", "0"), ("PYCOLLECT_TIMEOUT", "-1"),
    ("PYCOLLECT_TIMEOUT", "nan"), ("PYCOLLECT_TIMEOUT", "inf"), ("PYCOLLECT_DEBUG", "yes"),
    ("PYCOLLECT_DEBUG", "2"), ("PYCOLLECT_TIMEOUT_ABORT", "maybe")])
def test_invalid_settings_name_the_variable(monkeypatch, name, value):
    monkeypatch.setenv(name, value)
    with pytest.raises(ValueError, match=f"{name} must .*got '{value}'"):
        pc.Communicator(MPI.COMM_SELF)


@pytest.mark.parametrize("kw", [{"timeout": 0}, {"timeout": -2.0}, {"timeout": "soon"}])
def test_invalid_timeout_argument(kw):
    with pytest.raises(ValueError, match="Communicator: timeout must be a number of seconds > 0"):
        pc.Communicator(MPI.COMM_SELF, **kw)


def test_settings_from_the_environment(monkeypatch):
    for name in ("PYCOLLECT_TIMEOUT", "PYCOLLECT_DEBUG", "PYCOLLECT_TIMEOUT_ABORT"):
        monkeypatch.delenv(name, raising=False)
    plain = pc.Communicator(MPI.COMM_SELF)
    assert (plain.timeout, plain.validate, plain.abort_on_timeout) == (None, False, True)
    assert plain._runner.watch is None and plain._check is None and plain._lean   # nothing added to any call
    plain.free()
    monkeypatch.setenv("PYCOLLECT_TIMEOUT", "2.5")
    monkeypatch.setenv("PYCOLLECT_DEBUG", "1")
    monkeypatch.setenv("PYCOLLECT_TIMEOUT_ABORT", "0")
    env = pc.Communicator(MPI.COMM_SELF)
    assert (env.timeout, env.validate, env.abort_on_timeout) == (2.5, True, False)
    assert not env._lean
    env.free()
    given = pc.Communicator(MPI.COMM_SELF, timeout=1, validate=False, abort_on_timeout=True)
    assert (given.timeout, given.validate, given.abort_on_timeout) == (1.0, False, True)
    given.free()


def test_flight_recorder_keeps_the_last_calls():
    dog = watchdog.Watchdog(1.0, False, 0, 1)
    for seq in range(1, watchdog.KEEP + 10):
        dog.call("allreduce", seq, "ring", 8, np.dtype("f4"), rounds=2).end()
    seqs = [w.record()["seq"] for w in dog.flight]
    assert seqs == list(range(10, watchdog.KEEP + 10))


def test_flight_recorders_written_from_several_threads_at_once_stay_whole(tmp_path, monkeypatch):
    """Communicators timing out together in several threads write the rank's one recorder: whole JSON, and every
    timeout names it as written (before 2026-12-05 they shared one temporary file: "not written (... .tmp: No such
    file)", or a recorder of invalid JSON that the messages named; found by a helper)."""
    import threading
    monkeypatch.setenv("PYCOLLECT_FLIGHT_DIR", str(tmp_path))
    comms = [pc.Communicator(MPI.COMM_SELF, timeout=0.05, abort_on_timeout=False) for _ in range(8)]
    messages: list[str] = []
    start = threading.Barrier(len(comms))

    def time_out(comm):
        for _ in range(8):
            start.wait()   # the threads' timeouts expire together
            try:
                comm.recv(np.empty(3), source=0, tag=9)
            except pc.CollectiveTimeout as e:
                messages.append(str(e))
            comm.free()   # broken off by its timeout: a new one, as users do
            comm = pc.Communicator(MPI.COMM_SELF, timeout=0.05, abort_on_timeout=False)
        comm.free()
    threads = [threading.Thread(target=time_out, args=(c,)) for c in comms]
    switch = sys.getswitchinterval()
    sys.setswitchinterval(1e-6)   # threads switch often, inside one another's writes
    try:
        for t in threads:
            t.start()
        for t in threads:
            t.join()
    finally:
        sys.setswitchinterval(switch)
    assert len(messages) == 8 * 8, len(messages)
    assert not [m for m in messages if "not written" in m], messages
    data = json.loads((tmp_path / "pycollect-flight-rank0.json").read_text())
    assert data["timed_out"]["collective"] == "recv"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["pycollect-flight-rank0.json"]


def test_the_flight_recorder_goes_to_a_temporary_directory_by_default(tmp_path, monkeypatch):
    """Without PYCOLLECT_FLIGHT_DIR: under tempfile.gettempdir(), never the current directory (a checkout)."""
    import tempfile
    monkeypatch.delenv("PYCOLLECT_FLIGHT_DIR", raising=False)
    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path / "tmp"))
    work = tmp_path / "work"
    work.mkdir()
    monkeypatch.chdir(work)
    comm = pc.Communicator(MPI.COMM_SELF, timeout=0.2, abort_on_timeout=False)
    try:
        with pytest.raises(pc.CollectiveTimeout):
            comm.recv(np.empty(3), source=0, tag=6)
        assert (tmp_path / "tmp" / "pycollect-flight" / "pycollect-flight-rank0.json").exists()
        assert list(work.iterdir()) == []
    finally:
        comm.free()
