"""Pieces the benchmark tools share: argument types, size sweeps, backends, JSON between ranks."""
from __future__ import annotations

import argparse
import hashlib
import json
import sys

import numpy as np

from ..engine.exchange import allgather_json, bcast_json, gather_json  # noqa: F401 (JSON between ranks, never pickle)
from .report import outputs_problem, parse_size


MAX_SIZE = 1 << 40   # bytes: 1024G (1 TiB), beyond any one buffer a rank allocates


def size_arg(text: str) -> int:
    """argparse type: a size of at least one byte and at most ``MAX_SIZE`` (8, 32K, 64M)."""
    try:
        value = parse_size(text)
    except ValueError as e:
        raise argparse.ArgumentTypeError(str(e)) from None
    if value < 1:
        raise argparse.ArgumentTypeError(f"size must be at least 1 byte, got {text!r}")
    if value > MAX_SIZE:
        raise argparse.ArgumentTypeError(f"size {text!r} is {value} bytes, above the largest buffer allowed, "
                                         f"1024G (2**40 bytes)")
    return value


def int_at_least(low: int, high: int | None = None, why: str = ""):
    """argparse type: an integer no smaller than ``low`` (and, given, no larger than ``high``, ``why`` said)."""
    def convert(text):
        try:
            value = int(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"not an integer: {text!r}") from None
        if value < low:
            raise argparse.ArgumentTypeError(f"must be at least {low}, got {value}")
        if high is not None and value > high:
            raise argparse.ArgumentTypeError(f"must be at most {high}{why}, got {value}")
        return value
    return convert


def finite_number(low: float = 0.0, strict: bool = False):
    """argparse type: a finite float at least ``low`` (above it when ``strict``)."""
    bound = f"above {low:g}" if strict else f"at least {low:g}"

    def convert(text):
        try:
            value = float(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"not a number: {text!r}") from None
        if not (value > low if strict else value >= low) or value == float("inf"):
            raise argparse.ArgumentTypeError(f"must be a finite number {bound}, got {text}")
        return value
    return convert


def size_sweep(min_bytes: int, max_bytes: int, factor: int) -> list[int]:
    """min, min*factor, ... up to max (nccl-tests' -b, -e, -f)."""
    out, s = [], min_bytes
    while s <= max_bytes:
        out.append(s)
        s *= factor
    return out


def communicator(prog: str, world=None):
    """pycollect's Communicator over ``world`` (MPI's world by default), or None after one line on stderr where a
    ``PYCOLLECT_*`` setting or the tuning file is bad. Building one agrees the settings across ranks and raises on
    every rank when any rank's are bad, so every rank returns here and none waits alone."""
    import pycollect as pc
    try:
        return pc.Communicator() if world is None else pc.Communicator(world)
    except (ValueError, OSError) as e:
        sys.stderr.write(f"{prog}: error: {e}\n")
        return None


def backend(name: str, local_rank: int = 0):
    """``(xp, sync, device)``: NumPy, or CuPy on device ``local_rank mod count`` with its stream sync.

    A ValueError says why CuPy is unusable.
    """
    if name == "numpy":
        return np, (lambda: None), None
    try:
        import cupy
    except ImportError:
        raise ValueError("--backend cupy: CuPy is not installed") from None
    if not cupy.cuda.is_available():
        raise ValueError("--backend cupy: CuPy finds no usable CUDA device")
    device = local_rank % cupy.cuda.runtime.getDeviceCount()
    cupy.cuda.Device(device).use()
    return cupy, (lambda: cupy.cuda.get_current_stream().synchronize()), device


# -- one command line for every rank ----------------------------------------------------------------------
def agree_command_line(world, fields: dict | None, error: str | None = None,
                       problem: str | None = None) -> str | None:
    """Whether every rank may go on, agreed in one small allgather: None, or the line this rank prints.

    ``fields`` are this rank's parsed settings (None where its command line was refused with ``error``); each
    rank sends a digest of them. Fields named with a leading ``_`` follow from the others: they are named in
    the message only when nothing else differs. A rank's ``problem`` (rank 0's: an output it cannot write) stops every rank
    too. Every rank takes the same branch, so the two broadcasts that name differing fields match; a rank
    whose command line failed to parse must call this too (with ``error``), or the others wait for it.
    """
    digest = None if fields is None else hashlib.sha256(json.dumps(fields, sort_keys=True).encode()).hexdigest()
    entries = allgather_json(world, [digest, error, problem])
    if error is not None:
        return error
    refused = next((r for r, (_, e, _) in enumerate(entries) if e is not None), None)
    if refused is not None:
        return f"the ranks' command lines differ: rank {refused} stopped: {entries[refused][1]}"
    odd = next((r for r, (d, _, _) in enumerate(entries) if d != entries[0][0]), None)
    if odd is not None:
        first, other = bcast_json(world, fields, root=0), bcast_json(world, fields, root=odd)
        differ = [k for k in dict.fromkeys([*first, *other]) if first.get(k) != other.get(k)]
        differ = [k for k in differ if not k.startswith("_")] or differ   # "_" fields: consequences of the others
        said = "; ".join(f"{k}: {a} on rank 0, {b} on rank {odd}"
                         for k in differ[:3] for a, b in [_shown_apart(first.get(k), other.get(k))])
        return f"the ranks' command lines differ ({said}): run the same command line on every rank"
    return next((p for _, _, p in entries if p is not None), None)


def _shown_apart(one, two, width: int = 60) -> tuple[str, str]:
    """Two values as JSON, each cut to ``width`` characters around where they first differ (a middle elided alike
    in both hid the one flag that differed)."""
    a, b = (v if isinstance(v, str) else json.dumps(v) for v in (one, two))
    if len(a) <= width and len(b) <= width:
        return a, b
    at = next((i for i, (x, y) in enumerate(zip(a, b)) if x != y), min(len(a), len(b)))
    start = max(0, at - width // 3)
    return tuple(("..." if start else "") + t[start:start + width] + ("..." if start + width < len(t) else "")
                 for t in (a, b))  # type: ignore[return-value]


def refused_outputs(world, prog: str, outputs) -> int | None:
    """Exit status 2, one line on every rank, where rank 0 (which writes them) cannot write one of ``outputs``
    (``report.outputs_problem``); None otherwise. Collective over ``world`` (a pycollect Communicator: one
    broadcast), before any work."""
    problem = bcast_json(world.mpi, outputs_problem(outputs) if world.rank == 0 else None)
    if problem:
        sys.stderr.write(f"{prog}: error: {problem}\n")
        return 2
    return None
