"""Small metadata between ranks: JSON in byte buffers, never pickle (pycollect never unpickles what it receives)."""
from __future__ import annotations

import json

import numpy as np


def encode(obj) -> np.ndarray:
    return np.frombuffer(json.dumps(obj).encode(), np.uint8)


def decode(buf: np.ndarray):
    return json.loads(buf.tobytes().decode())


def allgather_json(mpi, obj) -> list:
    """Every rank's JSON-able ``obj``, as a list on every rank (an mpi4py intracommunicator)."""
    data = encode(obj)
    sizes = np.empty(mpi.Get_size(), np.int64)
    mpi.Allgather(np.array([data.size], np.int64), sizes)
    offs = np.concatenate([[0], np.cumsum(sizes)])
    buf = np.empty(int(offs[-1]), np.uint8)
    mpi.Allgatherv(data, [buf, (sizes, offs[:-1])])
    return [decode(buf[offs[i]:offs[i + 1]]) for i in range(mpi.Get_size())]


def gather_json(mpi, obj, root: int = 0) -> list | None:
    """Every rank's JSON-able ``obj`` as a list on ``root`` (None elsewhere); tuples come back as lists."""
    data = encode(obj)
    rank = mpi.Get_rank()
    sizes = np.empty(mpi.Get_size(), np.int64) if rank == root else None
    mpi.Gather(np.array([data.size], np.int64), sizes, root=root)
    if rank != root:
        mpi.Gatherv(data, None, root=root)
        return None
    assert sizes is not None   # allocated above on root
    offs = np.concatenate([[0], np.cumsum(sizes)])
    buf = np.empty(int(offs[-1]), np.uint8)
    mpi.Gatherv(data, [buf, (sizes, offs[:-1])], root=root)
    return [decode(buf[offs[i]:offs[i + 1]]) for i in range(mpi.Get_size())]


def bcast_json(mpi, obj, root: int = 0):
    """``root``'s JSON-able ``obj`` on every rank."""
    data = encode(obj) if mpi.Get_rank() == root else None
    size = np.array([data.size if data is not None else 0], np.int64)
    mpi.Bcast(size, root=root)
    buf = data.copy() if data is not None else np.empty(int(size[0]), np.uint8)
    mpi.Bcast(buf, root=root)
    return decode(buf)
