"""ProcessMesh: every factorisation of the world size, against Megatron's group enumeration."""
import os
import warnings

import numpy as np
import pytest

import pycollect as pc
from pycollect.parallel import ProcessMesh

from helpers import agree


def factorisations(n):
    """Every (tp, dp, pp) with tp * dp * pp == n."""
    return [(tp, dp, n // (tp * dp)) for tp in range(1, n + 1) if n % tp == 0
            for dp in range(1, n // tp + 1) if (n // tp) % dp == 0]


def megatron_groups(world, tp, pp):
    """Groups as Megatron-LM's initialize_model_parallel enumerates them (lists of global ranks)."""
    dp = world // (tp * pp)
    tp_groups = [list(range(i * tp, (i + 1) * tp)) for i in range(world // tp)]
    dp_groups = []
    per_stage = world // pp
    for i in range(pp):
        start, end = i * per_stage, (i + 1) * per_stage
        for j in range(tp):
            dp_groups.append(list(range(start + j, end, tp)))
    pp_groups = [list(range(i, world, per_stage)) for i in range(per_stage)]
    assert all(len(g) == dp for g in dp_groups)
    return {"tp": tp_groups, "dp": dp_groups, "pp": pp_groups}


def test_mesh_every_factorisation(comm):
    n, r = comm.size, comm.rank
    for tp, dp, pp in factorisations(n):
        mesh = ProcessMesh(comm, tp=tp, pp=pp, dp=dp)
        try:
            expected = megatron_groups(n, tp, pp)
            problems = []
            for kind, size in (("tp", tp), ("dp", dp), ("pp", pp)):
                mine = [g for g in expected[kind] if r in g]
                group = getattr(mesh, kind)
                members = group.mpi.allgather(r)   # the real members, in group-rank order
                if len(mine) != 1 or mesh.groups[kind] != mine[0] or members != mine[0] or group.size != size:
                    problems.append(f"{kind}: groups {mesh.groups[kind]}, members {members}, expected {mine}")
                # the group communicates: the sum of its global ranks
                total = group.allreduce(np.array([r], np.int64))
                if int(total[0]) != sum(mesh.groups[kind]):
                    problems.append(f"{kind}: allreduce {total} expected {sum(mesh.groups[kind])}")
            t, d, p = mesh.coords
            if r != t + d * tp + p * tp * dp or (mesh.tp.rank, mesh.dp.rank, mesh.pp.rank) != (t, d, p):
                problems.append(f"coords {mesh.coords} vs group ranks {(mesh.tp.rank, mesh.dp.rank, mesh.pp.rank)}")
            if mesh.rank_of() != r or mesh.rank_of(tp=0, dp=0, pp=0) != 0 \
                    or mesh.rank_of(tp=tp - 1, dp=dp - 1, pp=pp - 1) != n - 1:
                problems.append("rank_of")
            if [mesh.rank_of(tp=i) for i in range(tp)] != mesh.groups["tp"]:
                problems.append("rank_of(tp=i) vs the tp group")
            if f"tp_rank={t}" not in mesh.describe():
                problems.append(f"describe: {mesh.describe()}")
            agree(comm, not problems, f"tp={tp} dp={dp} pp={pp}: {problems}")
        finally:
            mesh.free()


def test_mesh_bad_factorisation_raises_everywhere(comm):
    n = comm.size
    for kw in ({"tp": n + 1}, {"tp": 2, "dp": n}, {"pp": n, "dp": 2}, {"tp": 0}, {"dp": -1}):
        try:
            ProcessMesh(comm, **kw)
            msg = "no error"
        except ValueError as e:
            msg = str(e)
        if all(v > 0 for v in kw.values()):
            ok = all(f"{k}={kw.get(k, 1)}" in msg for k in ("tp", "dp", "pp")) and f"world size is {n}" in msg
        else:
            ok = "positive integer" in msg
        agree(comm, ok, f"{kw}: {msg}")
    with pytest.raises(TypeError):
        ProcessMesh(comm.mpi, tp=n)
    with pytest.raises(ValueError, match="rank_of: tp=5"):
        mesh = ProcessMesh(comm, dp=n)
        try:
            mesh.rank_of(tp=5)
        finally:
            mesh.free()


def test_mesh_sizes_that_differ_between_ranks_are_refused_everywhere(comm):
    """Ranks that pass other sizes (each product the world's) or refuse their own: ValueError on every rank
    (before, the ranks split into groups that matched nobody's mesh, silently, or the others waited). NumPy
    integers are sizes too."""
    n, last = comm.size, comm.rank == comm.size - 1
    if n % 2 == 0:
        mine = {"tp": 2, "dp": n // 2} if last else {"tp": 1, "dp": n}
        try:
            ProcessMesh(comm, **mine).free()
            msg = "no error"
        except ValueError as e:
            msg = str(e)
        agree(comm, "the ranks' mesh sizes differ" in msg and f"[{n - 1}]" in msg, msg)
    try:
        ProcessMesh(comm, dp=0 if last else n).free()
        msg = "no error"
    except ValueError as e:
        msg = str(e)
    want = "dp must be a positive integer" if last else f"rank(s) [{n - 1}] of the group refused their arguments"
    agree(comm, want in msg, msg)
    mesh = ProcessMesh(comm, tp=np.int64(1), dp=np.int64(n))
    agree(comm, mesh.tp_size == 1 and type(mesh.dp_size) is int and mesh.dp.size == n, "numpy sizes")
    mesh.free()


def test_mesh_check_group(comm):
    n = comm.size
    tp = next(d for d in range(2, n + 1) if n % d == 0) if n > 1 else 1
    mesh = ProcessMesh(comm, tp=tp, dp=n // tp)
    try:
        problems = []
        for kind in ("tp", "dp", "pp"):
            mesh.check_group(getattr(mesh, kind), kind)
            for other, group in (("tp", mesh.tp), ("dp", mesh.dp), ("pp", mesh.pp), ("world", comm)):
                members = list(range(n)) if other == "world" else mesh.groups[other]
                should = members == mesh.groups[kind]
                try:
                    mesh.check_group(group, kind)
                    passed = True
                except ValueError as e:
                    passed = False
                    if f"{kind} group" not in str(e):
                        problems.append(str(e))
                if passed != should:
                    problems.append(f"check_group({other}, {kind}) passed={passed}, expected {should}")
        for bad in ((mesh.tp, "ep"), (comm.mpi, "tp")):
            try:
                mesh.check_group(*bad)
                problems.append(f"check_group{bad} passed")
            except ValueError:
                pass
        agree(comm, not problems, str(problems))
    finally:
        mesh.free()


def _warned(comm, topology, tp):
    """Build a mesh with ``tp`` over ``comm`` seen with ``topology``; the ProcessMesh warnings caught."""
    c = comm if topology is None else pc.Communicator(comm.mpi, topology=topology)
    try:
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            mesh = ProcessMesh(c, tp=tp, dp=comm.size // tp)
            mesh.free()
        return [w for w in caught if "tensor-parallel" in str(w.message)], mesh
    finally:
        if c is not comm:
            c.free()


def test_mesh_topology_warning(comm):
    """tp groups spanning nodes warn once, on rank 0; a tp dividing block-placed nodes does not."""
    n = comm.size
    if n % 2 or n < 4:
        pytest.skip("needs an even world size of at least 4")
    problems = []
    for by_block in (True, False):
        got, _ = _warned(comm, pc.Topology.uniform(n, 2, by_block=by_block), 2)
        expected = (not by_block) and comm.rank == 0
        if len(got) != (1 if expected else 0):
            problems.append(f"two ranks per node, by_block={by_block}: {[str(w.message) for w in got]}")
    # The detected topology (under MPIR_CVAR_NUM_CLIQUES=2: blocks or round robin)
    got, mesh = _warned(comm, None, 2)
    spans = bool(mesh.tp_groups_across_nodes())
    if os.environ.get("PYCOLLECT_EXPECT_NODES") and spans != (os.environ.get("PYCOLLECT_EXPECT_BY_BLOCK") != "1"):
        problems.append(f"spans={spans} on {comm.topology}")
    if len(got) != (1 if spans and comm.rank == 0 else 0):
        problems.append(f"detected {comm.topology}: spans={spans}, warnings {[str(w.message) for w in got]}")
    agree(comm, not problems, str(problems))
