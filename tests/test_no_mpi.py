"""What runs without MPI (issue 17): importing pycollect starts no MPI; the planner, ``explain``, ``pc.traffic``,
the pipeline simulator and ``trace merge`` run where the MPI library cannot be loaded; the commands that need it say so in
one line.

Each check runs in a fresh interpreter whose ``mpi4py.MPI`` is made unloadable before anything is imported,
in two ways: the module blocked (``None`` in ``sys.modules``: an ImportError, as where mpi4py's wheel finds
no MPI library) and an import that raises RuntimeError, as where ``MPI_Init`` fails on a login node.
"""
import json
import os
import subprocess
import sys

import pytest

from pycollect import __version__
from pycollect.tools.info import launcher_rank

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
LEAKY = ("SLURM_", "PMI_", "PMIX_", "OMPI_", "HYDRA_", "MPI_LOCAL", "MPIR_CVAR_", "PYCOLLECT_")

BLOCKS = {
    "not loadable": "import sys\nsys.modules['mpi4py.MPI'] = None\n",
    "init fails": (
        "import sys\n"
        "class _InitFails:\n"
        "    def find_spec(self, name, path=None, target=None):\n"
        "        if name == 'mpi4py.MPI':\n"
        "            raise RuntimeError('MPI_Init failed: no process manager')\n"
        "sys.meta_path.insert(0, _InitFails())\n"),
}
# python -m pycollect ARGS, after the block
AS_MAIN = "import runpy\nsys.argv = ['pycollect', *sys.argv[1:]]\nrunpy.run_module('pycollect', run_name='__main__', alter_sys=True)\n"


def _env(**extra) -> dict:
    env = {k: v for k, v in os.environ.items() if not k.startswith(LEAKY)}
    return {**env, "MPIEXEC_TIMEOUT": "60", "OMP_NUM_THREADS": "1", "OPENBLAS_NUM_THREADS": "1", **extra}


def python(code: str, *args, block: str | None = "not loadable", **env) -> subprocess.CompletedProcess:
    """``python -c code args`` with MPI made unloadable first (``block=None``: MPI as installed)."""
    prelude = BLOCKS[block] if block else ""
    return subprocess.run([sys.executable, "-c", prelude + code, *args], env=_env(**env), cwd=ROOT,
                          capture_output=True, text=True, timeout=120)


def pycollect(*args, block: str = "not loadable", **env) -> subprocess.CompletedProcess:
    return python(AS_MAIN, *args, block=block, **env)


def _ok(proc) -> None:
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]


# -- importing ------------------------------------------------------------------------------------------
def test_import_loads_no_mpi_and_a_communicator_does_as_mpi4py_always_does():
    proc = python("import sys\n"
                  "import pycollect as pc\n"
                  "assert 'mpi4py.MPI' not in sys.modules, 'import pycollect loaded MPI'\n"
                  "from pycollect import Communicator\n"
                  "from mpi4py import MPI\n"
                  "assert Communicator is pc.Communicator and MPI.Is_initialized()\n"
                  "import numpy as np\n"
                  "comm = pc.Communicator()\n"
                  "print(comm.size, comm.allreduce(np.ones(3)).sum())\n"
                  "comm.free()\n", block=None)
    _ok(proc)
    assert proc.stdout.split() == ["1", "3.0"], proc.stdout


def test_every_public_name_is_there():
    proc = python("import pycollect as pc\n"
                  "missing = [n for n in pc.__all__ if getattr(pc, n, None) is None]\n"
                  "assert not missing, missing\n"
                  "assert callable(pc.traffic) and callable(pc.algorithms) and callable(pc.wait_all)\n"
                  "assert pc.models.GPT and pc.zero.ZeroAdamW and pc.parallel.ProcessMesh and pc.moe.MoELayer\n"
                  "assert set(pc.__all__) <= set(dir(pc))\n", block=None)
    _ok(proc)


@pytest.mark.parametrize("block", sorted(BLOCKS))
def test_names_that_need_mpi_say_how_to_get_it(block):
    proc = python("import pycollect as pc\n"
                  "for name in ('Communicator', 'Request', 'parallel', 'models', 'zero'):\n"
                  "    try:\n"
                  "        getattr(pc, name)\n"
                  "    except ImportError as e:\n"
                  "        print(name, e)\n"
                  "    else:\n"
                  "        print(name, 'loaded')\n", block=block)
    _ok(proc)
    lines = proc.stdout.splitlines()
    assert len(lines) == 5 and all("could not be loaded" in line and "pycollect-mpi[mpich]" in line
                                   for line in lines), proc.stdout


# -- what runs without MPI ------------------------------------------------------------------------------
@pytest.mark.parametrize("block", sorted(BLOCKS))
def test_plan_runs(block, tmp_path):
    out = tmp_path / "plan.json"
    proc = pycollect("plan", "--model", "1.3B", "--gpus", "16", "--gpus-per-node", "8", "--memory", "80G",
                     "--peak-flops", "989T", "--preset", "nvlink,ib-ndr", "--batch", "64", "--seq", "2048",
                     "--top", "2", "--json", str(out), block=block)
    _ok(proc)
    assert "top 2 by predicted step time" in proc.stdout
    assert json.loads(out.read_text())["records"][0]["rank"] == 1


EXPLAINED = [
    (["allreduce", "--algorithm", "ring", "--size", "8", "--bytes", "64M"], "ring allreduce of 64M bytes"),
    (["allreduce", "--algorithm", "hierarchical", "--size", "8", "--nodes", "2", "--bytes", "8M"],
     "hierarchical allreduce"),
    (["alltoall", "--algorithm", "bruck", "--size", "6", "--bytes", "96K"], "bruck alltoall"),
    (["reduce_scatter", "--algorithm", "all", "--size", "4", "--bytes", "1M"], "every "),
    (["broadcast", "--algorithm", "binomial", "--size", "5", "--bytes", "1M"], "binomial broadcast"),
    (["allreduce", "--algorithm", "all", "--size", "16384", "--nodes", "2048", "--bytes", "1G", "--predict"],
     "predicted: allreduce of 1G bytes"),
    (["pipeline", "--schedule", "1f1b", "--stages", "4", "--microbatches", "8"], "bubble 27.27% simulated"),
    (["pipeline", "--schedule", "interleaved", "--stages", "4", "--microbatches", "8", "--virtual", "2"], "bubble"),
]


# several command lines in one interpreter (cli.main each): rc, stdout, stderr as JSON lines
MAINS = ("import contextlib, io, json\n"
         "from pycollect import cli\n"
         "for argv in json.loads(sys.argv[1]):\n"
         "    out, err = io.StringIO(), io.StringIO()\n"
         "    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):\n"
         "        try:\n"
         "            rc = cli.main(argv)\n"
         "        except SystemExit as e:\n"
         "            rc = e.code\n"
         "    print(json.dumps([rc, out.getvalue(), err.getvalue()]))\n")


def mains(argvs: list[list[str]], block: str) -> list[tuple[int, str, str]]:
    proc = python(MAINS, json.dumps(argvs), block=block)
    _ok(proc)
    return [tuple(json.loads(line)) for line in proc.stdout.splitlines()]


@pytest.mark.parametrize("block", sorted(BLOCKS))
def test_explain_runs(block, tmp_path):
    paths = [str(tmp_path / f"explain{i}.json") for i in range(len(EXPLAINED))]
    runs = mains([["explain", *argv, "--json", path] for (argv, _), path in zip(EXPLAINED, paths)], block)
    for (argv, said), path, (rc, out, err) in zip(EXPLAINED, paths, runs):
        assert rc == 0 and said in out, (argv, rc, out[:500], err)
        header = json.loads(open(path).read())["header"]
        assert header["explain"] and header["world_size"] > 1, header
        assert header["pycollect"] == __version__, header   # the build, from git (setuptools-scm)


def test_explain_pipeline_runs_as_python_m(tmp_path):
    proc = pycollect("explain", "pipeline", "--schedule", "gpipe", "--stages", "4", "--microbatches", "4")
    _ok(proc)
    assert "bubble 42.86% simulated" in proc.stdout, proc.stdout


def test_traffic_the_planner_and_the_pipeline_simulator_run_as_python():
    proc = python("import pycollect as pc\n"
                  "from pycollect import plan\n"
                  "from pycollect.pipeline import all_actions, bubble_formula, simulate\n"
                  "t = pc.traffic('allreduce', 'ring', 4, 1 << 20)\n"
                  "model = plan.ModelSpec.from_name('gpt3-1.3b', batch=64, micro=1)\n"
                  "cluster = plan.ClusterSpec.from_presets(16, 8, memory=80e9, peak_flops=989e12, intra='nvlink4',"
                  " inter='ib-ndr')\n"
                  "p = plan.predict(model, cluster, plan.ParallelConfig(dp=8, tp=2, pp=1))\n"
                  "sim = simulate(all_actions('gpipe', 4, 8, 1))\n"
                  "print(t.per_rank[0].bytes_sent, p.step_time > 0, round(sim.bubble, 4),"
                  " round(bubble_formula('gpipe', 4, 8, 1), 4))\n")
    _ok(proc)
    sent, stepped, bubble, formula = proc.stdout.split()
    assert int(sent) == 2 * 3 * (1 << 20) // 4 and stepped == "True" and bubble == formula == "0.2727"


def _rank_trace(rank: int, world: int) -> dict:
    """A per-rank file as the tracer writes it: one collective span (2 ms) holding a wait span (0.5 ms x rank)."""
    args = {"collective": "allreduce", "algorithm": "ring", "bytes": 4096, "seq": 1}
    return {"traceEvents": [
        {"ph": "X", "cat": "collective", "name": "allreduce", "pid": rank, "tid": 0, "ts": 10.0, "dur": 2000.0,
         "args": args},
        {"ph": "X", "cat": "wait", "name": "wait", "pid": rank, "tid": 0, "ts": 20.0, "dur": 500.0 * rank,
         "args": {"seq": 1}}],
        "otherData": {"node": rank // 2, "world_size": world, "clock": {"ranks": world}}}


@pytest.mark.parametrize("block", sorted(BLOCKS))
def test_trace_merge_runs(block, tmp_path):
    for rank in (0, 1, 2):   # a world of 4 with rank 3's file missing
        (tmp_path / f"pycollect-trace-rank{rank}.json").write_text(json.dumps(_rank_trace(rank, 4)))
    out = tmp_path / "merged.json"
    proc = pycollect("trace", "merge", str(tmp_path), "-o", str(out), block=block)
    _ok(proc)
    merged = json.loads(out.read_text())
    names = {e["pid"]: e["args"]["name"] for e in merged["traceEvents"] if e["ph"] == "M"}
    assert names == {0: "rank 0 (node 0)", 1: "rank 1 (node 0)", 2: "rank 2 (node 1)"}
    assert sorted((e["pid"], e["cat"]) for e in merged["traceEvents"] if e["ph"] == "X") == \
        [(r, cat) for r in (0, 1, 2) for cat in ("collective", "wait")]
    assert merged["otherData"]["notes"] == ["no file for rank(s) [3] of a world of 4"]
    rows = [line.split() for line in proc.stdout.splitlines() if line.split()[:1] in (["0"], ["1"], ["2"])]
    assert [(r[0], r[1], r[2], r[-1]) for r in rows] == [("0", "0", "1", "0.0"), ("1", "0", "1", "25.0"),
                                                         ("2", "1", "1", "50.0")], proc.stdout
    assert f"wrote {out}: 3 rank(s), 9 events" in proc.stdout, proc.stdout


# -- what needs MPI says so ---------------------------------------------------------------------------
NEEDS_MPI = [["info"], ["bench", "allreduce"], ["train", "--steps", "1"]]


@pytest.mark.parametrize("block", sorted(BLOCKS))
def test_bench_fit_from_a_saved_run_runs(block, tmp_path):
    """README: ``bench fit --from F`` refits a saved run without MPI (on a login node); the command stopped at the
    check for MPI that every ``bench`` made. Its abbreviation too; a bad flag beside it says so in one line."""
    saved = os.path.join(ROOT, "bench", "results", "2026-12-01-fit-2ranks.json")
    for flag in ("--from", "--fro"):
        out = tmp_path / f"refit{flag}.json"
        r = pycollect("bench", "fit", flag, saved, "--json", str(out), block=block)
        assert r.returncode == 0 and "needs an MPI library" not in r.stderr, r.stderr
        assert json.loads(out.read_text())["header"]["refit_from"] == saved
    r = pycollect("bench", "fit", "--from", saved, "--bogus", block=block)
    assert r.returncode == 2 and r.stderr.strip().splitlines() == ["pycollect: error: unrecognized arguments: --bogus"]


@pytest.mark.parametrize("block", sorted(BLOCKS))
def test_commands_that_need_mpi_say_it_in_one_line(block):
    for argv, (rc, out, err) in zip(NEEDS_MPI, mains(NEEDS_MPI, block)):
        assert rc == 1 and out == "", (argv, rc, out, err)
        lines = err.splitlines()
        assert len(lines) == 1 and lines[0].startswith(
            f"pycollect {argv[0]}: error: pycollect needs an MPI library, which could not be loaded"), (argv, err)


def test_info_as_python_m_says_it_in_one_line():
    proc = pycollect("info")
    assert proc.returncode == 1 and "Traceback" not in proc.stderr, proc.stdout + proc.stderr
    assert proc.stderr.count("\n") == 1 and "could not be loaded" in proc.stderr, proc.stderr


# -- who prints, without MPI -------------------------------------------------------------------------------
@pytest.mark.parametrize("environ, rank", [
    ({}, 0), ({"PMI_RANK": "3"}, 3), ({"OMPI_COMM_WORLD_RANK": "2", "PMI_RANK": "x"}, 2), ({"PMIX_RANK": "1"}, 1),
    ({"SLURM_PROCID": "5"}, 0),                                  # outside a step: the allocation's shell
    ({"SLURM_PROCID": "5", "SLURM_STEP_ID": "0"}, 5),
    ({"SLURM_PROCID": "1", "SLURM_STEP_ID": "0", "PMI_RANK": "4"}, 4),   # mpiexec's proxies in an srun step
])
def test_launcher_rank(environ, rank):
    assert launcher_rank(environ) == rank


def test_explain_under_mpiexec_prints_once_and_loads_no_mpi():
    code = BLOCKS["not loadable"] + AS_MAIN
    proc = subprocess.run(["mpiexec", "-n", "2", sys.executable, "-c", code, "explain", "allreduce", "--algorithm",
                           "ring", "--size", "4", "--bytes", "1M"], env=_env(), cwd=ROOT, capture_output=True,
                          text=True, timeout=120)
    _ok(proc)
    assert proc.stdout.count("ring allreduce of 1M bytes") == 1, proc.stdout
