"""minloc and maxloc: each element's least (greatest) value over the ranks and where it lives.

``comm.allreduce(x, op="minloc")`` returns ``(values, ranks)``: per element the least value and the
lowest rank that holds it. ``comm.allreduce((x, index), op="minloc")`` returns ``(values, indices)``:
the caller's integer ``index`` (say, each element's global index) stands in for the rank, and on equal
values the lowest index wins (MPI's rule). ``out`` is None or a pair ``(values_out, locations_out)``.
Why this shape: the caller keeps plain arrays (no pair dtypes or ``MPI.DOUBLE_INT`` to build), the
common question (which rank) needs no second argument, and the pairs pycollect builds underneath are
exactly MPI's (a value, then a C int), so ``algorithm="mpi"`` hands them to ``MPI_MINLOC`` as they are.
Locations are int32, as in MPI's pair types. NumPy arrays only (CuPy has no structured dtypes).
"""
from __future__ import annotations

import numpy as np

from . import args, ops

_INT32 = np.iinfo(np.int32)


def pair_dtype(values) -> np.dtype:
    """MPI's pair layout for ``values``: ``{value; int location}`` with C's alignment (``MPI.DOUBLE_INT``'s)."""
    return np.dtype([("value", values), ("location", np.int32)], align=True)


def values_of(x):
    """The values array of ``x`` (an array, or an ``(values, index)`` pair): what validation compares."""
    return x[0] if isinstance(x, tuple) and len(x) == 2 else x


def pairs(where: str, x, op: str, rank: int) -> np.ndarray:
    """``x`` as (value, location) pairs (location: ``rank``, or the caller's index), checked before anything
    is sent: NumPy values of a dtype ``op`` orders, an integer index of the same shape within int32."""
    values, index = x if isinstance(x, tuple) and len(x) == 2 else (x, None)
    xp = args.array(where, "x" if index is None else "x[0] (the values)", values)
    if xp is not np:
        raise TypeError(f"{where}: op {op!r} takes NumPy arrays (its pairs need a structured dtype, which CuPy lacks)")
    ops.check_op(op.lower() if isinstance(op, str) else "minloc", values.dtype, where)
    result = np.empty(values.shape, pair_dtype(values.dtype))
    result["value"] = values
    if index is None:
        result["location"] = rank
        return result
    if args.array(where, "x[1] (the index)", index) is not np or ops.dtype_kind(index.dtype) not in "iu":
        raise TypeError(f"{where}: x[1] (the index) must be a NumPy integer array, got {_kind(index)}")
    if index.shape != values.shape:
        raise ValueError(f"{where}: x[1] (the index) has shape {index.shape}, the values {values.shape}")
    if index.size and (index.min() < _INT32.min or index.max() > _INT32.max):
        raise ValueError(f"{where}: x[1] (the index) must fit in int32 (MPI's pair types hold a C int), got values "
                         f"in [{index.min()}, {index.max()}]")
    result["location"] = index
    return result


def _kind(a) -> str:
    dtype = getattr(a, "dtype", None)
    return f"{type(a).__name__} of dtype {dtype}" if dtype is not None else type(a).__name__


def check_out(where: str, out, shape, dtype) -> None:
    """``out``: None, or ``(values_out, locations_out)`` of the result's ``shape``, writable NumPy arrays, values of
    the values' dtype, locations of an integer dtype."""
    if out is None:
        return
    if not (isinstance(out, tuple) and len(out) == 2):
        raise TypeError(f"{where}: out must be None or a pair (values_out, locations_out) with op minloc or maxloc, "
                        f"got {type(out).__name__}")
    values = dtype["value"]
    args.out(where, out[0], shape, values, np)
    locations = out[1]
    args.array(where, "out[1]", locations)
    if not isinstance(locations, np.ndarray) or ops.dtype_kind(locations.dtype) not in "iu":
        raise TypeError(f"{where}: out[1] (the locations) must be a NumPy integer array, got {_kind(locations)}")
    if tuple(locations.shape) != tuple(shape):
        raise ValueError(f"{where}: out[1] has shape {tuple(locations.shape)}, expected {tuple(shape)}")
    args.writable(where, "out[1]", locations)


def split(result, out):
    """The reduced pairs as ``(values, locations)``, written into ``out`` when given; None stays None (a reduce
    off its root)."""
    if result is None:
        return None
    if out is None:
        return result["value"].copy(), result["location"].copy()
    out[0][...] = result["value"]
    out[1][...] = result["location"]
    return out


def finished(result, out, blocking: bool):
    """``split`` of a blocking call's result, or the Request whose ``wait()`` returns it."""
    if blocking:
        return split(result, out)
    return result.then(lambda reduced: split(reduced, out))
