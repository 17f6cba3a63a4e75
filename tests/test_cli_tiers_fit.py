"""``pycollect bench tiers`` and ``pycollect bench fit`` under mpiexec, on one node and on two simulated nodes.

Two nodes: four ranks as two MPICH cliques (0,2), (1,3) talking over loopback TCP, a slow
second tier (MPICH cliques over loopback TCP: two nodes on one host).
"""
import json
import os
import subprocess
import sys
import textwrap

import pytest

from pycollect.select import load_tuning
from pycollect.tools import fit, tiers
from pycollect.tools.common import size_sweep

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
TIMEOUT = 60      # MPIEXEC_TIMEOUT: MPICH kills a hung job
TWO_NODES = {"MPIR_CVAR_NUM_CLIQUES": "2", "UCX_TLS": "tcp,self"}


def _run(args, n=None, env=None):
    base = dict(os.environ, MPIEXEC_TIMEOUT=str(TIMEOUT), OMP_NUM_THREADS="1", OPENBLAS_NUM_THREADS="1",
                PYTHONUNBUFFERED="1")
    for key in ("PYCOLLECT_TUNING", "MPIR_CVAR_NUM_CLIQUES", "MPIR_CVAR_CLIQUES_BY_BLOCK", "UCX_TLS"):
        base.pop(key, None)
    base.update(env or {})
    cmd = ([] if n is None else ["mpiexec", "-n", str(n)]) + [sys.executable, *args]
    return subprocess.run(cmd, cwd=ROOT, env=base, capture_output=True, text=True, timeout=TIMEOUT + 30)


def _ok(proc):
    assert proc.returncode == 0, f"exit {proc.returncode}\n{proc.stdout[-4000:]}\n{proc.stderr[-4000:]}"


# -- one node -------------------------------------------------------------------------------------------
@pytest.fixture(scope="module")
def one_node(tmp_path_factory):
    d = tmp_path_factory.mktemp("tiers1")
    proc = _run(["-m", "pycollect", "bench", "tiers", "-b", "8", "-e", "1M", "-f", "32", "-n", "3",
                 "--json", str(d / "t.json"), "--plot", str(d / "t.png"), "--csv", str(d / "t.csv")], n=2)
    return proc, d


def test_tiers_on_one_node(one_node):
    proc, d = one_node
    _ok(proc)
    data = json.loads((d / "t.json").read_text())
    assert data["kind"] == "tiers" and data["header"]["world_size"] == 2
    assert [t["tier"] for t in data["tiers"]] == ["intra-node"] and data["tiers"][0]["pairs"] == 1
    pairs = [r for r in data["records"] if r["section"] == "p2p"]
    assert {(r["a"], r["b"]) for r in pairs} == {(0, 1)}
    assert sorted(r["size_bytes"] for r in pairs) == [8, 256, 8 << 10, 256 << 10]
    assert all(r["one_way_us"] > 0 and r["bandwidth_GBps"] > 0 and r["iters"] == 3 for r in pairs)
    rows = [r for r in data["records"] if r["section"] == "collective"]
    assert {r["scope"] for r in rows} == {"intra-node"}          # one node: the world is the node
    assert {r["collective"] for r in rows} == {"allreduce", "allgather", "reduce_scatter"}
    assert {r["algorithm"] for r in rows} == {"mpi", "auto"}
    assert all(r["busbw_GBps"] > 0 and r["ranks"] == 2 for r in rows)
    assert (d / "t.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert (d / "t.csv").read_text().splitlines()[0].startswith("section,a,b,tier")
    assert "per tier" in proc.stdout and "intra-node" in proc.stdout


# -- two simulated nodes --------------------------------------------------------------------------------
@pytest.fixture(scope="module")
def two_nodes(tmp_path_factory):
    d = tmp_path_factory.mktemp("tiers2")
    proc = _run(["-m", "pycollect", "bench", "tiers", "-b", "64", "-e", "1M", "-f", "128", "-n", "5",
                 "--collectives", "allreduce", "--json", str(d / "t.json")], n=4, env=TWO_NODES)
    return proc, d


def test_tiers_reports_both_tiers_in_one_run(two_nodes):
    proc, d = two_nodes
    _ok(proc)
    data = json.loads((d / "t.json").read_text())
    assert data["header"]["node_of"] == [0, 1, 0, 1]
    summary = {t["tier"]: t for t in data["tiers"]}
    assert set(summary) == {"intra-node", "inter-node"}
    assert summary["intra-node"]["pairs"] == 2 and summary["inter-node"]["pairs"] == 4
    pairs = {(r["a"], r["b"]): r["tier"] for r in data["records"] if r["section"] == "p2p"}
    assert pairs == {(0, 2): "intra-node", (1, 3): "intra-node", (0, 1): "inter-node", (0, 3): "inter-node",
                     (1, 2): "inter-node", (2, 3): "inter-node"}
    intra, inter = summary["intra-node"]["bandwidth_GBps_median"], summary["inter-node"]["bandwidth_GBps_median"]
    assert inter < 0.5 * intra, (intra, inter)
    scopes = {r["scope"]: r["ranks"] for r in data["records"] if r["section"] == "collective"}
    assert scopes == {"intra-node": 2, "inter-node": 2, "world": 4}
    world = {r["algorithm"] for r in data["records"] if r.get("scope") == "world"}
    assert world == {"mpi", "auto", "hierarchical"}


@pytest.fixture(scope="module")
def fitted(tmp_path_factory):
    d = tmp_path_factory.mktemp("fit")
    proc = _run(["-m", "pycollect", "bench", "fit", "-b", "8", "-e", "1M", "-f", "32", "-n", "3",
                 "--collectives", "allreduce,allgather", "--json", str(d / "f.json"),
                 "--tuning-out", str(d / "tuning.json"), "--plot", str(d / "f.png")], n=4, env=TWO_NODES)
    return proc, d


def test_fit_prints_model_predictions_and_reasons(fitted):
    proc, d = fitted
    _ok(proc)
    data = json.loads((d / "f.json").read_text())
    assert data["kind"] == "fit"
    tiers_ = data["pingpong_model"]["tiers"]
    assert set(tiers_) == {"intra-node", "inter-node"}
    assert all(t["alpha_s"] >= 0 and t["beta_s_per_byte"] > 0 for t in tiers_.values())
    assert tiers_["inter-node"]["beta_s_per_byte"] > tiers_["intra-node"]["beta_s_per_byte"]
    # the model fitted on the calls keeps the ping-pong's alpha; its other terms are never negative
    fitted_ = data["model"]
    assert {t: v["alpha_s"] for t, v in fitted_["tiers"].items()} == {t: v["alpha_s"] for t, v in tiers_.items()}
    assert all(v >= 0 for v in [fitted_["gamma_s_per_byte"], fitted_["copy_s_per_byte"], fitted_["overhead_s_per_call"],
                                fitted_["overhead_s_per_round"]] + [t["beta_s_per_byte"] for t in fitted_["tiers"].values()])
    for r in data["records"]:
        assert r["measured_us"] > 0
        assert (r["predicted_us"] is None) == (r["algorithm"] == "mpi"), r
    assert {r["algorithm"] for r in data["records"] if r["collective"] == "allreduce"} == \
        {"mpi", "ring", "recursive_doubling", "rabenseifner", "tree", "hierarchical", "shm"}
    assert "alpha us" in proc.stdout and "model picks" in proc.stdout
    assert (d / "f.png").stat().st_size > 0
    # every schedule's point predicted by the fit on the other half of the sizes, and the distribution of the errors
    schedules = [r for r in data["records"] if r["algorithm"] != "mpi"]
    held = data["heldout"]
    assert len(held["points"]) == len(schedules) == held["stats"]["all"]["count"]
    assert all(r["heldout_error"] == pytest.approx(r["heldout_us"] / r["measured_us"] - 1) for r in schedules)
    assert {p["fitted_on"] for p in held["points"]} == {0, 1}
    assert "held-out error" in proc.stdout and "within 25%" in proc.stdout


def test_fit_tuning_is_the_fastest_measured(fitted):
    proc, d = fitted
    _ok(proc)
    data = json.loads((d / "f.json").read_text())
    table = load_tuning(str(d / "tuning.json"))
    assert table == data["tuning"]
    entries = json.loads((d / "tuning.json").read_text())["entries"]
    assert {e["source"] for e in entries} == {"measured", "predicted"}
    # the same file carries the fitted model: plan --tuning reads it as it reads the fit's JSON
    from pycollect.plan.config import links_from_file
    assert links_from_file(str(d / "tuning.json")) == links_from_file(str(d / "f.json"))
    for e in entries:      # every entry is what the table gives at its size
        assert _lookup(table[e["collective"]], e["size_bytes"]) == e["algorithm"]
    for p in data["choices"]:
        here = [r for r in data["records"] if (r["collective"], r["size_bytes"]) == (p["collective"], p["size_bytes"])]
        assert p["measured_best"] == min(here, key=lambda r: r["measured_us"])["algorithm"]
        assert _lookup(table[p["collective"]], p["size_bytes"]) == p["measured_best"]


def _lookup(rows, nbytes):
    return next(name for limit, name in rows if limit is None or nbytes <= limit)


USES_TUNING = textwrap.dedent("""
    import json, sys
    import numpy as np
    import pycollect as pc
    path = sys.argv[1]
    table = json.load(open(path))["table"]
    comm = pc.Communicator(tuning=path)
    for coll, rows in table.items():
        for nbytes in [8, 1000, 1 << 16, 1 << 20, 1 << 26] + [r[0] for r in rows if r[0] is not None]:
            want = next(name for limit, name in rows if limit is None or nbytes <= limit)
            assert comm.auto_algorithm(coll, nbytes) == want, (coll, nbytes, want)
    y = comm.allreduce(np.arange(1 << 18, dtype=np.float32))
    assert np.array_equal(y, comm.size * np.arange(1 << 18, dtype=np.float32))
    if comm.rank == 0:
        print("tuning used")
""")


def test_communicator_uses_the_fitted_tuning(fitted):
    proc, d = fitted
    _ok(proc)
    check = _run(["-c", USES_TUNING, str(d / "tuning.json")], n=2)
    _ok(check)
    assert "tuning used" in check.stdout


# -- flags ----------------------------------------------------------------------------------------------
@pytest.mark.parametrize("argv", [
    ["tiers", "-f", "1"],
    ["tiers", "--collectives", "allreduce,bogus"],
    ["tiers", "-b", "12Q"],
    ["tiers", "-n", "0"],
    ["tiers", "-b", "1M", "-e", "8"],
    ["fit", "-b", "8", "-e", "8"],
    ["fit", "--nope"],
    ["tiers", "-b", "8", "-e", "1024G"],   # above this machine's memory (before: a MemoryError traceback)
])
def test_bad_flags_are_one_line_and_exit_2(argv):
    proc = _run(["-m", "pycollect", "bench", *argv])
    assert proc.returncode == 2, (proc.stdout, proc.stderr)
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1 and "error:" in lines[0], proc.stderr
    assert proc.stdout == ""


# -- pure pieces ----------------------------------------------------------------------------------------
@pytest.mark.parametrize("n", range(1, 10))
@pytest.mark.parametrize("serial", [False, True])
def test_tournament_meets_every_pair_once_in_disjoint_rounds(n, serial):
    rounds = tiers.tournament(n, serial)
    met = [p for r in rounds for p in r]
    assert sorted(met) == [(a, b) for a in range(n) for b in range(a + 1, n)]
    for r in rounds:
        ranks = [x for p in r for x in p]
        assert len(ranks) == len(set(ranks))
    if not serial and n > 1:
        assert len(rounds) == (n - 1 if n % 2 == 0 else n)


def test_tuning_table_merges_runs_and_loads(tmp_path):
    picks = [{"collective": "allreduce", "size_bytes": s, "algorithm": a}
             for s, a in [(8, "mpi"), (256, "mpi"), (8192, "ring"), (1 << 18, "mpi"), (1 << 20, "rabenseifner")]]
    table = fit.tuning_table(picks)
    assert table == {"allreduce": [[256, "mpi"], [8192, "ring"], [1 << 18, "mpi"], [None, "rabenseifner"]]}
    path = tmp_path / "t.json"
    path.write_text(json.dumps({"table": table}))
    assert load_tuning(str(path)) == table


def test_sweep_and_spread():
    assert size_sweep(8, 1 << 20, 32) == [8, 256, 8192, 1 << 18]
    assert tiers.spread(list(range(10)), 4) == [0, 3, 6, 9]
    assert tiers.spread([1, 2], 4) == [1, 2]


@pytest.mark.parametrize("argv, words", [
    (["tiers", "--json", "{d}"], "--json {d}: is a directory"),
    (["tiers", "--json", "{d}/t.json", "--csv", "{d}/t.json"], "--json and --csv name the same file"),
    (["tiers", "--json", "{d}/t.json", "--plot", "{d}/t.txt"], "matplotlib draws no txt"),
    (["fit", "--json", "{d}/f.json", "--tuning-out", "{d}/file/tuning.json"], "{d}/file is not a directory"),
    (["fit", "--json", ""], "--json: the path is empty"),
])
def test_outputs_that_cannot_be_written_stop_every_rank_before_any_work(tmp_path, argv, words):
    """Checked by rank 0 (which writes them) and told to every rank before anything is measured: before
    2026-12-04 tiers and fit found them after the whole run (a traceback, the job aborted, the files before the
    bad one written), and an empty path was taken as no output."""
    (tmp_path / "file").write_text("")
    argv = [a.format(d=tmp_path) for a in argv]
    proc = _run(["-m", "pycollect", "bench", *argv, "-b", "8", "-e", "64"], n=2)
    lines = [ln for ln in proc.stderr.splitlines() if "error:" in ln]
    assert proc.returncode == 2 and len(lines) == 2, (proc.stdout, proc.stderr)
    assert all(words.format(d=tmp_path) in ln for ln in lines) and "Traceback" not in proc.stderr, lines
    assert sorted(p.name for p in tmp_path.iterdir()) == ["file"]   # nothing written
