"""Pieces the benchmark tools share: argument types, size sweeps, backends, JSON between ranks."""
from __future__ import annotations

import argparse
import sys

import numpy as np

from ..engine.exchange import allgather_json, bcast_json, gather_json  # noqa: F401 (JSON between ranks, never pickle)
from .report import parse_size


def size_arg(text: str) -> int:
    """argparse type: a size of at least one byte (8, 32K, 64M)."""
    try:
        value = parse_size(text)
    except ValueError as e:
        raise argparse.ArgumentTypeError(str(e)) from None
    if value < 1:
        raise argparse.ArgumentTypeError(f"size must be at least 1 byte, got {text!r}")
    return value


def int_at_least(low: int):
    """argparse type: an integer no smaller than ``low``."""
    def convert(text):
        try:
            value = int(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"not an integer: {text!r}") from None
        if value < low:
            raise argparse.ArgumentTypeError(f"must be at least {low}, got {value}")
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
