"""PYCOLLECT_TRACE under ``mpiexec -n 2``: per-rank Chrome trace files, their spans, and ``pycollect trace merge``."""
import json
import os
import subprocess
import sys

import pytest

import pycollect as pc
from pycollect.algorithms import registry
from pycollect.engine.schedule import Problem

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
RANKS = 2
N = 1000                       # float32 elements of the traced allreduces
PIPELINE = (1 << 20) // 4      # the Communicator's default pipeline segment, in float32 elements
EPS = 0.002                    # microseconds: timestamps are rounded to nanoseconds

SCRIPT = """
import numpy as np
import pycollect as pc
comm = pc.Communicator()
x = np.arange({n}, dtype=np.float32) + comm.rank
comm.allreduce(x, algorithm="ring")                          # seq 1
comm.allreduce(x, algorithm="mpi")                           # seq 2
req = comm.iallreduce(x, algorithm="recursive_doubling")     # seq 3, in flight during seq 4
small = comm.allreduce(np.ones(4, np.float32))               # seq 4: auto, small (MPI's own)
assert (req.wait() == {total} + {n_ranks} * np.arange({n})).all() and (small == {n_ranks}).all()
"""  # no free(): the files are written at exit


def _run(cmd, env_extra=None, drop=(), cwd=ROOT, timeout=60):
    env = dict(os.environ, MPIEXEC_TIMEOUT="60", OMP_NUM_THREADS="1", OPENBLAS_NUM_THREADS="1")
    for key in drop:
        env.pop(key, None)
    env.update(env_extra or {})
    return subprocess.run(cmd, cwd=cwd, env=env, capture_output=True, text=True, timeout=timeout)


def _launch(script_dir, env_extra=None, drop=()):
    script = script_dir / "traced.py"
    script.write_text(SCRIPT.format(n=N, n_ranks=RANKS, total=sum(range(RANKS))))
    proc = _run(["mpiexec", "-n", str(RANKS), sys.executable, str(script)], env_extra, drop, cwd=script_dir)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]


def _merge(*args):
    return _run([sys.executable, "-m", "pycollect", "trace", "merge", *map(str, args)], timeout=30)


@pytest.fixture(scope="module")
def traced(tmp_path_factory):
    """The trace directory of one run of SCRIPT and each rank's loaded file."""
    directory = tmp_path_factory.mktemp("trace")
    _launch(tmp_path_factory.mktemp("script"), {"PYCOLLECT_TRACE": str(directory)})
    files = {r: json.loads((directory / f"pycollect-trace-rank{r}.json").read_text()) for r in range(RANKS)}
    return directory, files


def _spans(data, cat):
    return [e for e in data["traceEvents"] if e.get("ph") == "X" and e.get("cat") == cat]


def _calls(data):
    return {e["args"]["seq"]: e for e in _spans(data, "collective")}


def _inside(inner, outer):
    return (inner["pid"] == outer["pid"] and inner["tid"] == outer["tid"] and inner["ts"] >= outer["ts"] - EPS
            and inner["ts"] + inner["dur"] <= outer["ts"] + outer["dur"] + EPS)


def _schedule(algorithm, rank):
    problem = Problem(rank, RANKS, pc.Topology.single_node(RANKS), n=N, tree_segment=PIPELINE)
    return registry.get_schedule("allreduce", algorithm)(problem)


def test_one_trace_file_per_rank(traced):
    directory, files = traced
    assert sorted(p.name for p in directory.iterdir()) == [f"pycollect-trace-rank{r}.json" for r in range(RANKS)]
    for rank, data in files.items():
        assert isinstance(data["traceEvents"], list) and data["traceEvents"]
        assert {e["pid"] for e in data["traceEvents"]} == {rank}
        assert data["otherData"]["clock"]["method"] in ("pingpong", "global")
        assert data["otherData"]["clock"]["ranks"] == RANKS
        for e in _spans(data, "collective") + _spans(data, "round") + _spans(data, "wait"):
            assert e["ph"] == "X" and e["dur"] >= 0 and isinstance(e["ts"], (int, float)), e


def test_collective_spans_name_the_call(traced):
    expected = {1: ("ring", 4 * N, True), 2: ("mpi", 4 * N, True), 3: ("recursive_doubling", 4 * N, False),
                4: ("mpi", 16, True)}    # seq 4 went through the lean path's algorithm, traced all the same
    for data in traced[1].values():
        calls = _calls(data)
        assert sorted(calls) == sorted(expected)
        for seq, (algorithm, nbytes, blocking) in expected.items():
            args = calls[seq]["args"]
            assert (args["collective"], args["algorithm"], args["bytes"]) == ("allreduce", algorithm, nbytes), args
            assert (args["dtype"], args["op"], args["blocking"]) == ("float32", "sum", blocking), args
        assert calls[2]["args"]["rounds"] is None and calls[4]["args"]["rounds"] is None
        # the iallreduce has a lane of its own while in flight: spans on one track nest
        assert calls[3]["tid"] != calls[4]["tid"] == calls[1]["tid"] == 0


@pytest.mark.parametrize("seq, algorithm", [(1, "ring"), (3, "recursive_doubling")])
def test_rounds_nest_in_their_call_and_match_the_schedule(traced, seq, algorithm):
    for rank, data in traced[1].items():
        call = _calls(data)[seq]
        rounds = sorted((e for e in _spans(data, "round") if e["args"]["seq"] == seq), key=lambda e: e["ts"])
        sched = _schedule(algorithm, rank)
        assert call["args"]["rounds"] == len(sched.rounds) == len(rounds)
        talking = [e for e in rounds if e["args"]["peers"]]
        assert len(talking) == pc.traffic("allreduce", algorithm, size=RANKS, nbytes=4 * N).per_rank[rank].rounds
        for i, (span, rnd) in enumerate(zip(rounds, sched.rounds)):
            assert _inside(span, call), (span, call)
            assert span["args"]["round"] == i
            assert span["args"]["bytes_sent"] == 4 * sum(s.src.n for s in rnd.sends)
            assert span["args"]["bytes_recv"] == 4 * sum(r.dst.n for r in rnd.recvs)
            assert span["args"]["peers"] == sorted({s.peer for s in rnd.sends} | {r.peer for r in rnd.recvs})
        waits = [e for e in _spans(data, "wait") if e["args"]["seq"] == seq]
        assert len(waits) == len(talking)
        for w in waits:
            assert _inside(w, rounds[w["args"]["round"]]), w


def test_mpi_calls_have_no_rounds(traced):
    for data in traced[1].values():
        assert not [e for e in _spans(data, "round") + _spans(data, "wait") if e["args"]["seq"] in (2, 4)]


def test_merge_joins_the_ranks(traced, tmp_path):
    out = tmp_path / "merged.json"
    proc = _merge(traced[0], "-o", out)
    assert proc.returncode == 0, proc.stderr
    assert str(out) in proc.stdout
    events = json.loads(out.read_text())["traceEvents"]
    names = {e["pid"]: e["args"]["name"] for e in events if e["ph"] == "M" and e["name"] == "process_name"}
    assert names == {r: f"rank {r} (node 0)" for r in range(RANKS)}
    for rank, data in traced[1].items():
        assert sorted(_calls({"traceEvents": [e for e in events if e["pid"] == rank]})) == sorted(_calls(data))


def test_no_variable_no_file(tmp_path):
    _launch(tmp_path, drop=("PYCOLLECT_TRACE",))
    assert [p.name for p in tmp_path.iterdir()] == ["traced.py"]


@pytest.mark.parametrize("where", ["missing", "empty"])
def test_merge_without_files_is_one_line_exit_2(tmp_path, where):
    directory = tmp_path / where
    if where == "empty":
        directory.mkdir()
    proc = _merge(directory)
    assert proc.returncode == 2
    assert len(proc.stderr.strip().splitlines()) == 1 and "error" in proc.stderr, proc.stderr


# -- merge refuses files it cannot join, before it writes anything (no MPI: in this process) -----------------------
def _good(rank, world=2, origin=100.0):
    """A rank's file as the tracer writes it: its process name and one collective span."""
    return {"traceEvents": [{"ph": "M", "pid": rank, "tid": 0, "name": "process_name",
                             "args": {"name": f"rank {rank} (node 0)"}},
                            {"ph": "X", "pid": rank, "tid": 0, "ts": 1, "dur": 5, "cat": "collective",
                             "name": "allreduce ring", "args": {}}],
            "otherData": {"rank": rank, "world_size": world, "node": 0,
                          "clock": {"method": "pingpong", "origin_s": origin, "ranks": world}}}


def _event(**changes):
    return dict({"ph": "X", "pid": 1, "tid": 0, "ts": 1, "dur": 2, "cat": "collective"}, **changes)


def _without(d, key):
    return {k: v for k, v in d.items() if k != key}


# name -> {file name: content (JSON-able, or bytes/str as written)}; the file named in the message is the last one
BAD_DIRECTORIES = {
    "event without pid": {"rank1": {"traceEvents": [_without(_event(), "pid")]}},
    "span without dur": {"rank1": {"traceEvents": [_without(_event(), "dur")]}},
    "null pid and dur": {"rank1": {"traceEvents": [_event(pid=None, dur=None)]}},
    "event not an object": {"rank1": {"traceEvents": [1, 2, 3]}},
    "process_name without args": {"rank1": {"traceEvents": [{"ph": "M", "pid": 1, "name": "process_name"}]}},
    "otherData a list": {"rank1": {"traceEvents": [], "otherData": [1]}},
    "clock a string": {"rank1": {"traceEvents": [], "otherData": {"clock": "x", "world_size": 2}}},
    "world_size a string": {"rank1": {"traceEvents": [], "otherData": {"world_size": "2"}}},
    "NaN and Infinity": {"rank1": '{"traceEvents":[{"ph":"X","pid":1,"tid":0,"ts":NaN,"dur":Infinity}]}'},
    "not UTF-8": {"rank1": b"\xff\xfe{}"},
    "another rank's file": {"rank1": _good(0)},
    "events of another rank": {"rank1": {"traceEvents": [_event(pid=0)]}},
    "two files for rank 1": {"rank1": _good(1), "rank01": _good(1)},
    "a stale file of a 4-rank run": {"rank1": _good(1), "rank3": _good(3, world=4, origin=50.0)},
    "another run's clock": {"rank1": _good(1, origin=7.0)},
    "rank outside the world": {"rank2": _good(2)},
}


def _plant(directory, files):
    directory.mkdir(exist_ok=True)
    (directory / "pycollect-trace-rank0.json").write_text(json.dumps(_good(0)))
    for name, content in files.items():
        path = directory / f"pycollect-trace-{name}.json"
        if isinstance(content, bytes):
            path.write_bytes(content)
        else:
            path.write_text(content if isinstance(content, str) else json.dumps(content))
    return path


def _merge_here(*args):
    """``pycollect trace merge ARGS`` in this process: its exit status."""
    from pycollect import cli
    try:
        return cli.main(["trace", "merge", *map(str, args)])
    except SystemExit as e:
        return e.code


@pytest.mark.parametrize("case", sorted(BAD_DIRECTORIES))
def test_merge_refuses_a_bad_file_in_one_line_naming_it(tmp_path, capsys, case):
    named = _plant(tmp_path / "t", BAD_DIRECTORIES[case])
    status = _merge_here(tmp_path / "t")
    out, err = capsys.readouterr()
    assert status == 2 and err.count("\n") == 1 and "Traceback" not in err, err
    assert named.name in err and err.startswith("pycollect trace merge: error: "), err
    assert out == "" and not (tmp_path / "t" / "pycollect-trace.json").exists()


@pytest.mark.parametrize("output", ["/proc/nope/merged.json", ".", "", "t/pycollect-trace-rank1.json"])
def test_merge_to_an_unwritable_output_is_one_line(tmp_path, capsys, output):
    """An empty -o and a rank trace of its own input are refused too (before 2026-12-04: the default path, and the
    rank's trace replaced by the merged one)."""
    _plant(tmp_path / "t", {"rank1": {"traceEvents": [_event()]}})   # no otherData: as other tracers write
    before = (tmp_path / "t" / "pycollect-trace-rank1.json").read_bytes()
    assert _merge_here(tmp_path / "t", "-o", str(tmp_path / output) if output.startswith("t/") else output) == 2
    assert (tmp_path / "t" / "pycollect-trace-rank1.json").read_bytes() == before
    out, err = capsys.readouterr()
    assert "-o/--output" in err and err.count("\n") == 1 and out == "", err
    assert _merge_here(tmp_path / "t", "-o", tmp_path / "m.json") == 0      # the same files, to a writable place
    merged = json.loads((tmp_path / "m.json").read_text())
    assert {e["pid"] for e in merged["traceEvents"]} == {0, 1} and "2 rank(s)" in capsys.readouterr().out
    assert sorted(p.name for p in tmp_path.iterdir()) == ["m.json", "t"]   # no temporary file left
