"""Run an algorithm's schedules for all ranks in one process and compare with a NumPy reference."""
from __future__ import annotations

from dataclasses import replace

import numpy as np

from pycollect.algorithms.registry import all_schedules
from pycollect.engine.schedule import Problem
from pycollect.engine.shapes import in_elems, out_elems
from pycollect.engine.simulate import simulate
from pycollect.engine.topology import Topology

UFUNCS = {"sum": np.add, "prod": np.multiply, "min": np.minimum, "max": np.maximum,
          "band": np.bitwise_and, "bor": np.bitwise_or, "bxor": np.bitwise_xor}


def make_problem(collective, size, n=0, counts=None, matrix=None, root=0, topology=None, tree_segment=0, windows=False):
    from pycollect.engine.layout import split_even
    topology = topology or Topology.single_node(size)
    if counts is None:
        counts = split_even(n, size)
    if collective == "reduce_scatter" or collective == "allgather":
        n = sum(counts)
    if collective == "alltoall" and matrix is None:
        matrix = (tuple(counts),) * size
    return Problem(0, size, topology, n=n, counts=tuple(counts),
                   matrix=tuple(map(tuple, matrix)) if matrix is not None else (), root=root, tree_segment=tree_segment,
                   windows=windows)


def reference(collective, problem, inputs, op="sum"):
    """What each rank must hold after the collective (None where it holds nothing)."""
    size = problem.size
    f = UFUNCS[op]
    if collective in ("allreduce", "reduce", "reduce_scatter"):
        total = inputs[0].copy()
        for x in inputs[1:]:
            total = f(total, x)
        if collective == "allreduce":
            return [total.copy() for _ in range(size)]
        if collective == "reduce":
            return [total if r == problem.root else None for r in range(size)]
        offs = np.cumsum([0, *problem.counts])            # the blocks' starts, apart from the library's offsets
        return [total[offs[r]:offs[r + 1]] for r in range(size)]
    if collective == "allgather":
        whole = np.concatenate(inputs)
        return [whole.copy() for _ in range(size)]
    if collective == "broadcast":
        return [inputs[problem.root].copy() for _ in range(size)]
    if collective == "alltoall":
        outs = []
        for dst in range(size):
            parts = []
            for src in range(size):
                offs = np.cumsum([0, *problem.matrix[src]])
                parts.append(inputs[src][offs[dst]:offs[dst + 1]])
            outs.append(np.concatenate(parts) if parts else np.zeros(0, inputs[0].dtype))
        return outs
    raise ValueError(collective)


def run(collective, algorithm, problem, op="sum", inplace=False, dtype=np.int64, seed=0):
    """Simulate ``algorithm`` and return (results, expected, inputs, originals)."""
    rng = np.random.default_rng(seed)
    size = problem.size
    probs = [replace(problem, rank=r) for r in range(size)]
    if op == "prod":
        inputs = [rng.integers(1, 3, in_elems(collective, p)).astype(dtype) for p in probs]
    else:
        inputs = [rng.integers(0, 100, in_elems(collective, p)).astype(dtype) for p in probs]
    originals = [x.copy() for x in inputs]
    expected = reference(collective, problem, originals, op)
    outs = []
    for p, x in zip(probs, inputs):
        m = out_elems(collective, p)
        if inplace and m == x.size:
            outs.append(x)
        else:
            outs.append(None if m is None else np.full(m, 0x55, dtype))  # unwritten elements show
    aliased = any(o is not None and np.shares_memory(o, x) for o, x in zip(outs, inputs))
    scheds = all_schedules(collective, algorithm, replace(problem, aliased=aliased))
    simulate(scheds, inputs, outs, UFUNCS[op])
    return outs, expected, inputs, originals


def check(collective, algorithm, problem, op="sum", inplace=False, dtype=np.int64):
    """Assert every rank holds the reference result and no input was written (unless in place)."""
    outs, expected, inputs, originals = run(collective, algorithm, problem, op, inplace, dtype)
    for r in range(problem.size):
        if expected[r] is None:
            assert outs[r] is None, f"rank {r}: expected no output"
            continue
        np.testing.assert_array_equal(outs[r], expected[r], err_msg=f"{collective}/{algorithm} rank {r} of {problem.size}")
        if not (inplace and outs[r] is inputs[r]):
            np.testing.assert_array_equal(inputs[r], originals[r], err_msg=f"rank {r}: input was written")
