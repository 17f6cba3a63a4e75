"""What every rank of a group must hold alike, agreed in one small allgather where it is set up.

A layout built from each rank's own arguments (the order of a dict's names, their shapes, a shard's width)
decides which elements a later collective sums with which. Ranks that built different ones would reduce one
parameter's gradient into another's, or look a token up in the wrong rows, without an error wherever the
byte counts happen to match. Each check here costs one allgather of one integer per rank, once, where the
layout is made (not per step), and raises on every rank of the group alike.
"""
from __future__ import annotations

import hashlib
import numbers

import numpy as np

from ..comm import Communicator

__all__ = ["check_group", "agree_equal_shards", "agree_layout", "agree_full", "as_text", "OwnChecks", "ranks_differing"]

_SHOWN = 300   # characters of a rank's own layout quoted in the error


def check_group(where: str, group, name: str = "group") -> Communicator:
    """``group`` itself; TypeError naming the argument unless it is a pycollect Communicator."""
    if not isinstance(group, Communicator):
        raise TypeError(f"{where}: {name} must be a pycollect Communicator (e.g. pycollect.Communicator(mpi_comm) "
                        f"or a mesh's group), got {type(group).__name__}")
    return group


def _allgathered(value: int, group: Communicator) -> list[int]:
    return group.allgather(np.array([value], np.int64), counts=[1] * group.size).tolist()


def agree_equal_shards(where: str, name: str, width: int, group: Communicator) -> None:
    """Every rank's shard of ``name`` is ``width`` wide: ValueError on every rank of the group naming the widths
    otherwise. Rank r's shard is taken to start at r * width, so uneven shards (as ``np.array_split`` makes
    them) would put rows or columns in the wrong place."""
    if group.size == 1:
        return
    widths = _allgathered(width, group)
    if len(set(widths)) > 1:
        raise ValueError(f"{where}: the ranks' shards of {name} differ in width, {widths} on ranks 0-{group.size - 1}; "
                         f"each rank holds 1/{group.size} of them (rank r's from r times that): "
                         f"pad to a multiple of {group.size}")


_REFUSED = -(2 ** 63)   # a rank's digest where its own arguments were refused


def _digest(text: str) -> int:
    return int(np.frombuffer(hashlib.sha256(text.encode()).digest()[:8], np.int64)[0])


def ranks_differing(text: str, group: Communicator) -> list[int]:
    """The ranks of ``group`` whose ``text`` differs from rank 0's (one allgather of a digest; [] on a group of
    one), for a caller that words its own error."""
    if group.size == 1:
        return []
    digests = _allgathered(_digest(text), group)
    return [r for r, d in enumerate(digests) if d != digests[0]]


class OwnChecks:
    """``with OwnChecks() as own:`` around a rank's own argument checks (no communication): an error of the
    ``kinds`` raised inside is kept in ``own.failed``, not raised, for ``agree_layout(..., failed=own.failed)`` to
    raise after the agreement, where every other rank raises too."""

    def __init__(self, kinds: tuple = (ValueError, TypeError)):
        self.kinds, self.failed = kinds, None

    def __enter__(self) -> "OwnChecks":
        return self

    def __exit__(self, kind, value, traceback) -> bool:
        if kind is not None and issubclass(kind, self.kinds):
            self.failed = value
            return True
        return False


def agree_layout(where: str, what: str, layout: str, group: Communicator,
                 failed: BaseException | None = None) -> None:
    """``layout`` (text every rank of the group must hold alike: names and shapes in order, settings) agreed
    by a digest of it: ValueError on every rank naming the ranks that differ from rank 0, with this rank's own.

    ``failed``: this rank's own error from checking its arguments, raised here after the agreement, where every
    other rank raises too, naming this one (a rank that raised alone would leave the others waiting)."""
    if group.size == 1:
        if failed is not None:
            raise failed
        return
    digests = _allgathered(_REFUSED if failed is not None else _digest(layout), group)
    refused = [r for r, d in enumerate(digests) if d == _REFUSED]
    if failed is not None:
        raise failed
    if refused:
        raise ValueError(f"{where}: rank(s) {refused} of the group refused their arguments (their errors say why); "
                         f"refused here too (rank {group.rank})")
    differ = [r for r, d in enumerate(digests) if d != digests[0]]
    if differ:
        own = layout if len(layout) <= _SHOWN else layout[:_SHOWN] + "..."
        raise ValueError(f"{where}: the ranks' {what} differ: rank(s) {differ} hold other than rank 0's; every rank "
                         f"of the group must pass the same. Rank {group.rank} holds: {own}")


def agree_full(where: str, params, settings: str, group: Communicator, failed: BaseException | None = None) -> None:
    """A layer's full parameters (names, dtypes, shapes; values are not compared) and ``settings`` agreed over
    ``group`` where it is built from them, as ``agree_layout``: ranks that built other layers would each compute
    with their own shapes and sum into the others' without an error wherever the byte counts happen to match."""
    if isinstance(params, dict):
        described = ", ".join(f"{k} {getattr(v, 'dtype', type(v).__name__)}{tuple(getattr(v, 'shape', ()))}"
                              for k, v in params.items())
    else:
        described = type(params).__name__
    agree_layout(where, "full parameters (names, dtypes, shapes) or settings", f"{described}; {settings}",
                 group, failed)


def as_text(value) -> str:
    """A setting as every rank writes it, NumPy's numbers as Python's (a digest of ``repr`` would tell
    ``np.int64(2)`` from ``2``)."""
    if isinstance(value, numbers.Integral) and not isinstance(value, bool):
        return str(int(value))
    if isinstance(value, numbers.Real) and not isinstance(value, bool):
        return repr(float(value))
    return repr(value)
