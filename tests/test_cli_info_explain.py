"""``pycollect info`` and ``pycollect explain`` as users run them: subprocesses, plain and under mpiexec."""
import json
import os
import re
import subprocess
import sys

import pytest

import pycollect as pc
from pycollect import cli
from pycollect.algorithms.registry import COLLECTIVES, NAMES
from pycollect.engine.schedule import Recv, Round, Schedule, Send, Slice
from pycollect.tools import explain, info, report

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
MiB = 1 << 20
# launcher and library settings of the environment pytest runs in must not leak into the runs
LEAKY = ("SLURM_", "PMI_", "PMIX_", "OMPI_", "HYDRA_", "MPI_LOCAL", "MPIR_CVAR_", "PYCOLLECT_")
BAD_FLAGS = [["explain", "nope", "--algorithm", "ring", "--size", "8", "--bytes", "8M"],
             ["explain", "allreduce", "--algorithm", "nonsense", "--size", "8", "--bytes", "8M"],
             ["explain", "allreduce", "--algorithm", "ring", "--size", "8", "--bytes", "x"]]


def _env(**extra) -> dict:
    env = {k: v for k, v in os.environ.items() if not k.startswith(LEAKY)}
    return {**env, "MPIEXEC_TIMEOUT": "60", "OMP_NUM_THREADS": "1", "OPENBLAS_NUM_THREADS": "1", **extra}


def pycollect(*args, ranks: int | None = None, **env) -> subprocess.CompletedProcess:
    """``python -m pycollect ARGS``, under ``mpiexec -n ranks`` when given."""
    cmd = [sys.executable, "-m", "pycollect", *args]
    if ranks is not None:
        cmd = ["mpiexec", "-n", str(ranks), *cmd]
    return subprocess.run(cmd, env=_env(**env), cwd=ROOT, capture_output=True, text=True, timeout=90)


def _ok(proc) -> None:
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]


# -- info -----------------------------------------------------------------------------------------
@pytest.fixture(scope="module")
def info_two(tmp_path_factory):
    path = tmp_path_factory.mktemp("info") / "info.json"
    proc = pycollect("info", "--json", str(path), ranks=2)
    return proc, (json.loads(path.read_text()) if path.exists() else None)


def test_info_reports_world_and_auto_table(info_two):
    proc, _ = info_two
    _ok(proc)
    assert re.search(r"^world size\s+2$", proc.stdout, re.M), proc.stdout
    assert re.search(r"^launcher\s+PMI_SIZE=2: agrees$", proc.stdout, re.M), proc.stdout
    table = proc.stdout.split('algorithm="auto" picks')[1].splitlines()
    assert table[1].split() == ["collective", "8", "B", "32", "KiB", "1", "MiB", "64", "MiB"]
    for collective in COLLECTIVES:
        row = next(line.split() for line in table if line.split()[:1] == [collective])
        assert len(row) == 5 and all(a in pc.algorithms(collective) for a in row[1:]), row
    assert proc.stdout.count("pycollect       ") == 1        # rank 0 alone prints


def test_info_json(info_two):
    data = info_two[1]
    assert data["schema"] == report.SCHEMA and data["kind"] == "info"
    head = data["header"]
    assert head["world_size"] == 2 and head["node_of"] == [0, 0] and head["launcher"]["errors"] == []
    assert {"mpi_library", "mpi4py", "gpu", "cuda_aware", "libmpi"} <= set(head)
    got = {(r["collective"], r["size_bytes"]) for r in data["records"]}
    assert got == {(c, n) for c in COLLECTIVES for n in info.SIZES}
    assert all(r["algorithm"] in pc.algorithms(r["collective"]) and r["algorithm"] != "auto" for r in data["records"])


@pytest.mark.parametrize("env, var", [({"OMPI_COMM_WORLD_SIZE": "2"}, "OMPI_COMM_WORLD_SIZE"),
                                      ({"SLURM_STEP_NUM_TASKS": "2", "SLURM_STEP_ID": "0", "SLURM_NTASKS": "2"},
                                       "SLURM_STEP_NUM_TASKS")])
def test_info_world_mismatch_is_an_error(env, var):
    proc = pycollect("info", **env)     # one process: a world of 1 where the launcher says 2
    assert proc.returncode == info.EXIT_MISMATCH, proc.stdout + proc.stderr
    errors = [line for line in proc.stderr.splitlines() if "ERROR" in line]
    assert errors == [f"pycollect info: ERROR: MPI world has 1 rank but {var} says 2: the tasks did not join "
                      "one MPI job (2 singletons). Launch with srun --mpi=pmi2 (or pmix), or the mpiexec of "
                      "the MPI that mpi4py loaded."], proc.stderr


@pytest.mark.parametrize("argv", [("bench", "allreduce", "-b", "8", "-e", "8"), ("train", "--steps", "1")])
def test_every_launched_command_refuses_singletons(argv):
    """What info checks, bench and train check before they run: two singleton sweeps would each exit 0."""
    proc = pycollect(*argv, OMPI_COMM_WORLD_SIZE="2")
    assert proc.returncode == info.EXIT_MISMATCH and proc.stdout == "", proc.stdout + proc.stderr
    errors = [line for line in proc.stderr.splitlines() if "error" in line]   # (mpi4py warns of the variable too)
    assert errors == [f"pycollect {argv[0]}: error: MPI world has 1 rank but OMPI_COMM_WORLD_SIZE "
                                        "says 2: the tasks did not join one MPI job (2 singletons). Launch with srun "
                                        "--mpi=pmi2 (or pmix), or the mpiexec of the MPI that mpi4py loaded."], \
        proc.stderr


def test_launched_commands_warn_about_blas_threads_and_shared_cores():
    argv = ("bench", "allreduce", "-b", "8", "-e", "8", "-n", "1", "-w", "0")
    unlimited = pycollect(*argv, ranks=2, OMP_NUM_THREADS="", OPENBLAS_NUM_THREADS="")
    _ok(unlimited)
    assert unlimited.stderr.count("BLAS threads not limited") == 1, unlimited.stderr     # once a node
    limited = pycollect(*argv, ranks=2, OMP_NUM_THREADS="1")
    _ok(limited)
    assert "warning" not in limited.stderr, limited.stderr
    crowded = os.cpu_count() + 1
    over = pycollect(*argv, ranks=crowded, OMP_NUM_THREADS="1")
    _ok(over)
    assert f"{crowded} ranks on a node of {os.cpu_count()} cores" in over.stderr, over.stderr


def test_info_mpiexec_inside_an_srun_step_is_no_mismatch():
    # hydra's proxies run as an srun step of one task per node; PMI_SIZE states the world
    proc = pycollect("info", ranks=2, SLURM_STEP_NUM_TASKS="1", SLURM_STEP_ID="0", SLURM_NTASKS="2")
    _ok(proc)
    assert "ERROR" not in proc.stderr


@pytest.mark.parametrize("env, stated", [
    ({"SLURM_NTASKS": "4"}, {}),                                               # batch script, not a step
    ({"SLURM_STEP_ID": "0", "SLURM_NTASKS": "4"}, {"SLURM_NTASKS": 4}),
    ({"SLURM_STEP_ID": "0", "SLURM_NTASKS": "4", "SLURM_STEP_NUM_TASKS": "2"}, {"SLURM_STEP_NUM_TASKS": 2}),
    ({"SLURM_STEP_NUM_TASKS": "2", "PMI_SIZE": "4"}, {"PMI_SIZE": 4}),
    ({"OMPI_COMM_WORLD_SIZE": "3", "PMI_SIZE": "x"}, {"OMPI_COMM_WORLD_SIZE": 3}),
])
def test_launcher_sizes(env, stated):
    assert info.launcher_sizes(env) == stated
    assert len(info.launcher_errors(4, env)) == sum(n != 4 for n in stated.values())


def test_info_two_simulated_nodes(tmp_path):
    path = tmp_path / "info.json"
    proc = pycollect("info", "--json", str(path), ranks=4, MPIR_CVAR_NUM_CLIQUES="2", MPIR_CVAR_CLIQUES_BY_BLOCK="1")
    _ok(proc)
    assert re.search(r"^nodes\s+2 \(", proc.stdout, re.M), proc.stdout
    head = json.loads(path.read_text())["header"]
    assert head["num_nodes"] == 2 and head["node_of"] == [0, 0, 1, 1] and head["node_sizes"] == [2, 2]


# -- explain --------------------------------------------------------------------------------------
def _explain_json(tmp_path, *args):
    path = tmp_path / "explain.json"
    proc = pycollect("explain", *args, "--json", str(path))
    _ok(proc)
    data = json.loads(path.read_text())
    assert data["schema"] == report.SCHEMA and data["kind"] == "explain"
    return proc, data


def test_explain_ring_allreduce_is_textbook(tmp_path):
    proc, data = _explain_json(tmp_path, "allreduce", "--algorithm", "ring", "--size", "8", "--bytes", "8M")
    assert "rank 0 (node 0): 14 rounds" in proc.stdout
    assert data["summary"]["rounds"] == data["summary"]["critical_path_rounds"] == 14
    assert [r["rank"] for r in data["records"]] == list(range(8))
    assert all(r["bytes_sent"] == 2 * (8 - 1) * (8 * MiB) // 8 for r in data["records"])
    assert all(r["bytes_sent_inter"] == 0 and r["rounds"] == 14 for r in data["records"])
    rows = data["rounds"]["rows"]
    assert [r["round"] for r in rows if r["op"] == "send"] == list(range(14))
    assert sum(r["op"] == "recv+reduce" for r in rows) == 7 and all(r["peer"] in (1, 7) for r in rows)
    assert data["header"]["world_size"] == 8 and data["header"]["explain"]["nbytes"] == 8 * MiB


def test_explain_hierarchical_crosses_nodes_less_than_ring(tmp_path):
    common = ("allreduce", "--size", "8", "--bytes", "8M", "--nodes", "2")
    _, hier = _explain_json(tmp_path, *common, "--algorithm", "hierarchical")
    _, ring = _explain_json(tmp_path, *common, "--algorithm", "ring", "--round-robin")
    assert ring["header"]["node_of"] == [0, 1] * 4 and hier["header"]["node_of"] == [0] * 4 + [1] * 4
    # M=2 nodes of L=4: each rank sends 2(M-1)/M * n/L across nodes
    assert all(r["bytes_sent_inter"] == 2 * MiB for r in hier["records"])
    assert 0 < hier["summary"]["total_bytes_inter"] < ring["summary"]["total_bytes_inter"]


@pytest.mark.parametrize("collective", NAMES)
def test_explain_all_lists_every_algorithm(collective, capsys, tmp_path):
    path = tmp_path / "all.json"
    assert cli.main(["explain", collective, "--algorithm", "all", "--size", "6", "--bytes", "96K",
                     "--nodes", "2", "--json", str(path)]) == 0
    names = pc.algorithms(collective)[2:]
    lines = capsys.readouterr().out.splitlines()
    assert [line.split()[0] for line in lines[2:2 + len(names)]] == list(names)
    records = json.loads(path.read_text())["records"]
    assert [r["algorithm"] for r in records] == list(names)
    assert all(r["max_bytes_sent"] > 0 and r["critical_path_rounds"] > 0 for r in records)


def test_reduce_scatter_block_counts_reduce_scatter_on_equal_blocks(capsys):
    for algorithm in pc.algorithms("reduce_scatter")[2:]:
        block = pc.traffic("reduce_scatter_block", algorithm, 6, 6 * 4096)
        assert block.collective == "reduce_scatter_block"
        assert block.per_rank == pc.traffic("reduce_scatter", algorithm, 6, 6 * 4096).per_rank
    with pytest.raises(ValueError, match="4096 elements do not split into 5 equal blocks"):
        pc.traffic("reduce_scatter_block", "ring", 5, 4 * 4096)
    assert cli.main(["explain", "reduce_scatter_block", "--algorithm", "ring", "--size", "5", "--bytes", "16K"]) == 2
    assert "--bytes 16384 does not split into --size 5 equal blocks of float32" in capsys.readouterr().err


@pytest.mark.parametrize("ranks", [None, 2])
def test_bad_flags_are_one_line_and_exit_2(ranks):
    for argv in BAD_FLAGS:
        proc = pycollect(*argv, ranks=ranks)
        assert proc.returncode == 2, (argv, proc.stdout, proc.stderr)
        lines = proc.stderr.splitlines()
        assert len(lines) == (ranks or 1) and len(set(lines)) == 1, (argv, proc.stderr)
        assert lines[0].startswith("pycollect explain: error: "), lines[0]
        assert proc.stdout == ""


@pytest.mark.parametrize("argv, message", [
    (["--size", "0"], "argument --size: must be at least 1, got 0"),
    (["--size", "100000000"], "argument --size: must be at most 1048576 (explain lists every rank one by one), "
                              "got 100000000"),   # it ran past a minute; 10**12 raised MemoryError
    (["--nodes", "3"], "--nodes 3 does not divide --size 8"),
    (["--rank", "8"], "--rank 8 is out of range for --size 8 (0..7)"),
    (["--bytes", "10"], "--bytes 10 is not a whole number of float32 elements (4 bytes each)"),
    (["--algorithm", "mpi"], "--algorithm 'mpi' has no schedule to walk"),
])
def test_explain_argument_errors(argv, message, capsys):
    base = {"--algorithm": "ring", "--size": "8", "--bytes": "8M"}
    base.update(zip(argv[::2], argv[1::2]))
    try:
        status = cli.main(["explain", "allreduce", *[x for kv in base.items() for x in kv]])
    except SystemExit as e:       # argparse's own errors
        status = e.code
    err = capsys.readouterr().err
    assert status == 2 and err.count("\n") == 1 and message in err, err


def test_critical_path_waits_for_senders_and_finds_unmatched_messages():
    one = Slice("in", 0, 1)
    relay = [Schedule((Round(sends=(Send(1, one),)),)),                  # 0 -> 1 -> 2, one hop a round
             Schedule((Round(recvs=(Recv(0, one),)), Round(sends=(Send(2, one),)))),
             Schedule((Round(recvs=(Recv(1, one),)),))]
    assert explain.critical_path(relay) == [1, 2, 2]
    with pytest.raises(RuntimeError, match="rank 0 waits in its round 0"):
        explain.critical_path([Schedule((Round(recvs=(Recv(1, one),)),)), Schedule(())])
    with pytest.raises(RuntimeError, match="rank 1 sends rank 0 1 message"):
        explain.critical_path([Schedule(()), Schedule((Round(sends=(Send(0, one),)),))])


def test_a_reader_that_leaves_ends_the_command_quietly():
    """``pycollect plan ... | head -1``: the reader closes the pipe; the command stops without a traceback."""
    read, write = os.pipe()
    os.close(read)
    try:
        done = subprocess.run([sys.executable, "-m", "pycollect", "plan", "--model", "gpt3-1.3b", "--gpus", "16",
                               "--batch", "64"], stdout=write, stderr=subprocess.PIPE, text=True, timeout=120,
                              env=_env(), cwd=ROOT)
    finally:
        os.close(write)
    assert done.returncode == 1 and done.stderr == "", done.stderr
