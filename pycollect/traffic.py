"""``pc.traffic``: what a collective sends and receives per rank and tier, from its schedule, without MPI."""
from __future__ import annotations

import numpy as np

from .algorithms import registry
from .engine import traffic as walk
from .engine import environment
from .engine.environment import renamed
from .engine.shapes import even_problem, segment_elements
from .engine.topology import Topology


def traffic(collective: str, algorithm: str, size: int, nbytes: int, topology: Topology | None = None,
            dtype="float32", root: int = 0, tree_segment_bytes: int | None = None,
            pipeline_bytes: int | None = None) -> walk.Traffic:
    """Counts for a call of ``nbytes`` (the vector; each rank's send buffer for alltoall; the gathered total for
    allgather and gather; the root's buffer for scatter). ``collective`` is one of ``registry.NAMES``:
    reduce_scatter_block counts reduce_scatter's schedules on equal blocks (``nbytes`` split evenly, by elements:
    a call on rows splits rows, which may place a few elements elsewhere; the totals are the same).

    ``topology`` defaults to one node of ``size`` ranks; ``tree_segment_bytes`` cuts the segmented trees'
    messages: by default as a call does (``PYCOLLECT_TREE_SEGMENT_BYTES``, else 1 MiB; until 2026-12-04 0,
    unsegmented, so a tree's messages and rounds differed from a call's), 0 for none (``pipeline_bytes``, its
    old name, still works and warns). Messages are the schedule's: the executor cuts one above
    ``segment_bytes`` (4 MiB) into several MPI messages, which these counts do not show. ``"shm"`` counts the
    window schedule; a non-blocking shm call made before any blocking one, or a deferred one, runs its message
    fallback instead (README), whose traffic is other.
    """
    if pipeline_bytes is not None:
        tree_segment_bytes = renamed("traffic: pipeline_bytes", "tree_segment_bytes", pipeline_bytes)
    if tree_segment_bytes is None:
        tree_segment_bytes = environment.tree_segment_bytes()
    itemsize = element_size("traffic", dtype)
    if isinstance(size, bool) or not isinstance(size, (int, np.integer)) or size < 1:
        raise ValueError(f"traffic: size must be an integer of at least 1, got {size!r}")
    if topology is not None and not isinstance(topology, Topology):
        raise TypeError(f"traffic: topology must be a pycollect Topology (or None: one node), got "
                        f"{type(topology).__name__}")
    topology = topology or Topology.single_node(size)
    if topology.size != size:
        raise ValueError(f"traffic: topology has {topology.size} ranks, size is {size}")
    check_call("traffic", topology, nbytes, itemsize, root, tree_segment_bytes, dtype)
    if algorithm not in registry.schedule_algorithms(collective):
        raise ValueError(f"traffic: algorithm must be one of {', '.join(registry.schedule_algorithms(collective))}, "
                         f"got {algorithm!r} (MPI's own collectives have no schedule to walk)")
    segment = segment_elements(tree_segment_bytes, itemsize)
    problem = even_problem(collective, 0, size, topology, nbytes // itemsize, root, segment)
    per_rank = walk.count_summaries(registry.all_summaries(collective, algorithm, problem), topology, itemsize)
    return walk.Traffic(collective, algorithm, size, itemsize, per_rank)


def element_size(where: str, dtype) -> int:
    """The itemsize of ``dtype``, one a collective reduces or moves (integer, float, complex, bfloat16)."""
    from .engine import ops
    try:
        dt = np.dtype(dtype)
    except TypeError:
        raise TypeError(f"{where}: dtype {dtype!r} is not a NumPy dtype") from None
    if ops.dtype_kind(dt) == "?":
        raise TypeError(f"{where}: dtype {dt} is not supported; use an integer, float, complex or bfloat16 dtype")
    return dt.itemsize


def check_call(where: str, topology: Topology, nbytes: int, itemsize: int, root: int = 0,
               tree_segment_bytes: int = 0, dtype=None) -> None:
    """The sizes and root of a call counted or priced without running it (``pc.traffic``, the cost model, the
    cluster simulator; each checks the algorithm in its own words): ValueError naming the first that no call
    could have."""
    for name, value, low in (("nbytes", nbytes, 0), ("itemsize", itemsize, 1),
                             ("tree_segment_bytes", tree_segment_bytes, 0)):
        if isinstance(value, bool) or not isinstance(value, (int, np.integer)) or value < low:
            raise ValueError(f"{where}: {name} must be an integer of at least {low}, got {value!r}")
    if nbytes >= 2**62:   # some schedules lay out their blocks in int64 tables: wrong counts from 2**63
        raise ValueError(f"{where}: nbytes must be below 2**62 (4 EiB), got {nbytes}")
    if nbytes % itemsize:
        elements = "elements" if dtype is None else f"{np.dtype(dtype)} elements"
        raise ValueError(f"{where}: nbytes = {nbytes} is not a whole number of {elements} ({itemsize} bytes each)")
    if isinstance(root, bool) or not isinstance(root, (int, np.integer)) or not 0 <= root < topology.size:
        raise ValueError(f"{where}: root must be a rank in [0, {topology.size}), got {root!r}")
