"""MPI's ops as pycollect takes them: predefined ones as they are, pair types split, user ops wrapped.

``MPI.SUM`` ... ``MPI.LXOR`` pass through (the Communicator reads MPI's predefined ops by name).
``MPI.MINLOC`` and ``MPI.MAXLOC`` on MPI's pair types (``MPI.DOUBLE_INT``, ``MPI.FLOAT_INT``,
``MPI.LONG_INT``, ``MPI.TWOINT``, ...) become pycollect's ``(values, locations)`` form
(engine/locations.py), the caller's pairs read into the two and the reduced pairs written back
field by field. An op made with ``MPI.Op.Create`` becomes a ``pycollect.Op`` that hands MPI the
elements it combines (``MPI_Reduce_local``, so the user's function sees exactly the buffers and
datatype MPI would hand it), commutative or not as it was created; pycollect then reduces in rank
order where the op does not commute.
"""
from __future__ import annotations

import numpy as np
from mpi4py import MPI

from ..engine.ops import Op
from .buffers import type_name


class UserOps:
    """``pycollect.Op``s of the caller's ``MPI.Op.Create`` ops, one per (op, datatype) object pair: repeated
    calls hand pycollect the same Op, so what pycollect builds per op (MPI's own copy for ``"mpi"``) is
    built once. The pair is held, so neither object's id can serve another while it is here."""

    def __init__(self):
        self._made: dict[tuple[int, int], tuple[MPI.Op, MPI.Datatype, Op]] = {}

    def of(self, op: MPI.Op, datatype: MPI.Datatype) -> Op:
        key = (id(op), id(datatype))
        if key not in self._made:
            self._made[key] = (op, datatype, _user(op, datatype))
        return self._made[key][2]


def _user(op: MPI.Op, datatype: MPI.Datatype) -> Op:
    """A pycollect.Op whose ``f(a, b, out)`` is MPI's ``inout = in op inout`` with ``in`` = a (the lower
    ranks), ``inout`` = a copy of b, on elements of ``datatype`` (arrays of one void element per datum)."""
    def apply(a, b, out):
        inout = np.array(b, copy=True)   # contiguous, and out may be a or b
        op.Reduce_local([np.ascontiguousarray(a), datatype], [inout, datatype])
        out[...] = inout
    return Op(apply, commute=op.Is_commutative(), name="MPI.Op.Create")


def reduction(op, x, out, datatype: MPI.Datatype, user_ops: UserOps, where: str):
    """``(x, op, out)`` as pycollect takes them for MPI's ``op`` on ``x`` (elements of ``datatype``), ``out``
    None off the root; in place where ``out is x``."""
    if not isinstance(op, MPI.Op) or op == MPI.OP_NULL:
        raise TypeError(f"{where}: op must be an MPI.Op (MPI.SUM, ... or one made with MPI.Op.Create), got "
                        f"{type(op).__name__}")
    if op == MPI.REPLACE or op == MPI.NO_OP:
        raise ValueError(f"{where}: op {'MPI.REPLACE' if op == MPI.REPLACE else 'MPI.NO_OP'} is for one-sided "
                         f"accumulates (MPI_Accumulate), not a collective's reduction")
    if op == MPI.MINLOC or op == MPI.MAXLOC:
        names = x.dtype.names
        if names is None or len(names) != 2:
            raise TypeError(f"{where}: op {'MPI.MINLOC' if op == MPI.MINLOC else 'MPI.MAXLOC'} takes a pair "
                            f"datatype (MPI.DOUBLE_INT, MPI.FLOAT_INT, MPI.LONG_INT, MPI.TWOINT, ...), got "
                            f"{type_name(datatype)}")
        value, location = names
        pairs = (x[value].copy(), x[location].copy())   # copies: in place, out is x's memory
        return pairs, op, None if out is None else (out[value], out[location])
    if op.is_predefined:
        return x, op, out
    opaque = _opaque(x)
    return opaque, user_ops.of(op, datatype), opaque if out is x else None if out is None else _opaque(out)


def _opaque(a: np.ndarray) -> np.ndarray:
    """``a``'s elements as one void item each: a user op combines whole elements of its datatype, so no
    schedule may split one (a contiguous type's three doubles stay together)."""
    item = a.itemsize * (int(np.prod(a.shape[1:])) if a.ndim > 1 else 1)
    return a.reshape(-1).view(np.uint8).view(np.dtype((np.void, item)))
