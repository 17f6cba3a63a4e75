"""The argument layer: every public entry of the Communicator normalises its arguments here.

Each function checks one kind of argument (an array, an ``out``, an op, an algorithm name, counts,
a rank, a tag, a setting) for type, writability, integer-ness and range, and raises a
``TypeError`` (wrong kind of thing) or ``ValueError`` (right kind, wrong value) whose message
starts with the call (``allreduce:``) and names the argument. Nothing here communicates, so a
bad argument raises before anything is sent (validation mode then shares the error with every
rank, engine/validate.py).
"""
from __future__ import annotations

import math
import operator
import os
from collections.abc import Mapping, Set as AbstractSet

import numpy as np

from . import ops
from .backend import array_module
from .layout import split_even


# -- arrays ------------------------------------------------------------------------------------------------
def array(where: str, name: str, x):
    """``numpy`` or ``cupy`` for an array pycollect can move: fixed-size elements, no object references."""
    try:
        xp = array_module(x)
    except TypeError:
        raise TypeError(f"{where}: {name} must be a NumPy or CuPy array, got {type(x).__name__}") from None
    _plain_enough(where, name, x)
    dtype = x.dtype
    if dtype.hasobject:
        raise TypeError(f"{where}: {name} has dtype {dtype}, which holds references to Python objects; pycollect "
                        f"moves fixed-size data only (bool, integers, floats, complex, bfloat16, or other "
                        f"fixed-size dtypes for the collectives that do not reduce)")
    if dtype.itemsize == 0:
        raise TypeError(f"{where}: {name} has dtype {dtype}, whose elements have no bytes")
    return xp


def _plain_enough(where: str, name: str, x) -> None:
    """Refuse the ndarray subclasses whose views do not behave as arrays' do: ``np.matrix`` stays two-dimensional
    through every reshape and slice (the schedules' flat views of it are not flat), a masked array's mask would be
    left behind (its masked elements reduced and moved as data). Others (``np.memmap``, ``np.recarray``) pass."""
    if isinstance(x, np.matrix):
        raise TypeError(f"{where}: {name} is a numpy.matrix, which keeps two dimensions through every reshape; pass "
                        f"np.asarray({name}) (the same memory as an array)")
    if isinstance(x, np.ma.MaskedArray):
        raise TypeError(f"{where}: {name} is a masked array (numpy.ma); pycollect moves data, not masks, and would "
                        f"reduce the masked elements too: pass {name}.filled(value) with the op's identity, or "
                        f"{name}.data to mean every element")


def rows(where: str, x) -> None:
    if x.ndim == 0:
        raise ValueError(f"{where}: x must have at least one dimension (blocks are split along axis 0)")


def writable(where: str, name: str, a) -> None:
    """``a`` will be written: refuse a read-only array before anything is sent (CuPy arrays are always writable)."""
    if not getattr(a.flags, "writeable", True):
        raise ValueError(f"{where}: {name} is read-only (its flags.writeable is False); pass an array pycollect "
                         f"may write the result into")


def out(where: str, out, shape, dtype, xp) -> None:
    """``out`` against the expected ``shape`` and ``dtype``; a None in ``shape`` (rows not known yet) matches any."""
    if out is None:
        return
    try:
        oxp = array_module(out)
    except TypeError:
        raise TypeError(f"{where}: out must be a NumPy or CuPy array, got {type(out).__name__}") from None
    if oxp is not xp:
        raise TypeError(f"{where}: out is a {oxp.__name__} array but x is a {xp.__name__} array")
    _plain_enough(where, "out", out)
    if tuple(out.shape) != tuple(shape) and not _fits(tuple(out.shape), shape):
        expected = "(" + ", ".join("*" if e is None else str(e) for e in shape) + ("," if len(shape) == 1 else "") + ")"
        raise ValueError(f"{where}: out has shape {tuple(out.shape)}, expected {expected}")
    if out.dtype != dtype:
        raise TypeError(f"{where}: out has dtype {out.dtype}, expected {np.dtype(dtype)}")
    writable(where, "out", out)


def displaced_result(where: str, name: str, rows: int, shape, dtype) -> None:
    """A result without ``out`` whose ``rows`` the displacements ``name`` set: refused where no array can hold it
    (the allocation would fail inside the call, in words that name nothing the caller passed)."""
    nbytes = rows * math.prod(shape[1:]) * np.dtype(dtype).itemsize
    if nbytes > np.iinfo(np.intp).max:
        raise ValueError(f"{where}: {name} reach row {rows}: a result of {nbytes} bytes, more than an array can "
                         f"hold (pass out=, or displacements within the rows the blocks need)")


def _fits(got: tuple, expected: tuple) -> bool:
    return len(got) == len(expected) and all(e is None or g == e for g, e in zip(got, expected))


def receive_buffer(where: str, buf) -> object:
    """A buffer a message lands in as it is (``irecv``): an array, contiguous and writable; returns its module."""
    xp = array(where, "out", buf)
    if not buf.flags.c_contiguous:
        raise ValueError(f"{where}: out must be C-contiguous (it is written in place)")
    writable(where, "out", buf)
    return xp


# -- names --------------------------------------------------------------------------------------------------
def op(where: str, op, dtype):
    """The op, checked to fit ``dtype``: one of the names, in any case ("SUM"); MPI's predefined op (``MPI.SUM``,
    ``MPI.LAND``, ``MPI.MINLOC``) as mpi4py users write it; a NumPy binary ufunc (``np.hypot``, commutative);
    or an ``ops.Op``. Returns the name or the Op; anything else (a list, None) is refused by name."""
    if isinstance(op, np.ufunc):
        op = ops.user_op(op)
    elif not isinstance(op, (str, ops.Op)):
        name = _mpi_op_name(op)
        if name is None:
            raise ValueError(f"{where}: unknown op {_short(op)}; expected one of {', '.join(ops.NAMES)} (a str, "
                             f"any case), MPI's {', '.join(n.upper() for n in _MPI_NAMES)}, a NumPy binary ufunc "
                             f"or a pycollect.Op")
        op = name
    elif isinstance(op, str) and op not in ops.NAMES and op.lower() in ops.NAMES:
        op = op.lower()
    ops.check_op(op, dtype, where)
    return op


def locating(op) -> bool:
    """Whether ``op`` asks for values and their locations (``"minloc"``, ``"maxloc"``, any case, or MPI's)."""
    if isinstance(op, str):
        return op.lower() in ops.LOCATING
    return not isinstance(op, (np.ufunc, ops.Op)) and _mpi_op_name(op) in ops.LOCATING


_MPI_NAMES = ("sum", "prod", "min", "max", "band", "bor", "bxor", "land", "lor", "lxor", "minloc", "maxloc")


def _mpi_op_name(op) -> str | None:
    """The name of one of MPI's predefined ops pycollect has (``MPI.SUM`` -> "sum"), else None."""
    from mpi4py import MPI
    if not isinstance(op, MPI.Op):
        return None
    return next((n for n in _MPI_NAMES if op == getattr(MPI, n.upper())), None)


def algorithm(where: str, algorithm, names) -> None:
    """``algorithm`` is one of ``names`` (a str)."""
    if not isinstance(algorithm, str) or algorithm not in names:
        raise ValueError(f"{where}: unknown algorithm {_short(algorithm)}; expected one of {', '.join(names)}")


def accumulate(where: str, accumulate, dtype) -> bool:
    """Whether to run the collective in ``accumulate`` (only float16 and bfloat16 are widened)."""
    if accumulate is None:
        return False
    if accumulate != "float32" or not isinstance(accumulate, str):
        raise ValueError(f"{where}: accumulate must be None or 'float32', got {accumulate!r}")
    return np.dtype(dtype).name in ("float16", "bfloat16")


# -- integers ------------------------------------------------------------------------------------------------
def integer(where: str, name: str, value) -> int:
    """``value`` as an int: Python and NumPy integers only (no bool, float, str: nothing is rounded or parsed)."""
    if isinstance(value, (bool, np.bool_)):
        raise TypeError(f"{where}: {name} must be an integer, got bool {value!r}")
    try:
        return operator.index(value)
    except TypeError:
        raise TypeError(f"{where}: {name} must be an integer, got {type(value).__name__} {value!r}") from None


def rank(where: str, name: str, value, size: int) -> int:
    """A rank of a communicator of ``size``."""
    try:
        r = integer(where, name, value)
    except TypeError:
        r = None
    if r is None or not 0 <= r < size:
        raise ValueError(f"{where}: {name} must be a rank in [0, {size}), got {value!r}")
    return r


def tag(where: str, value, upper: int) -> int:
    """A point-to-point tag: an integer in [0, ``upper``] (MPI's ``TAG_UB``)."""
    t = integer(where, "tag", value)
    if not 0 <= t <= upper:
        raise ValueError(f"{where}: tag must be in [0, {upper}] (MPI's TAG_UB), got {t}")
    return t


def counts(where: str, counts, rows, size: int) -> tuple[int, ...]:
    """Rows per rank: given ``counts`` checked (integers, one per rank, none negative, summing to ``rows``
    unless ``rows`` is None), or an even split of ``rows``."""
    if counts is None:
        return split_even(rows, size)
    given = _per_rank(where, "counts", counts, size)
    if rows is not None and sum(given) != rows:
        raise ValueError(f"{where}: counts sum to {sum(given)} but x has {rows} rows along axis 0")
    return given


def _per_rank(where: str, name: str, values, size: int) -> tuple[int, ...]:
    """``values`` (counts, displacements): a sequence of one integer per rank, none negative; nothing is rounded."""
    # a dict or a set iterates its keys, in an order that is not the ranks': refused, not read as a sequence
    if isinstance(values, (str, bytes, Mapping, AbstractSet)) or not hasattr(values, "__iter__"):
        raise TypeError(f"{where}: {name} must be a sequence of {size} integers, got {type(values).__name__} "
                        f"{_short(values)}")
    try:
        given = tuple(integer(where, name, v) for v in values)
    except TypeError:
        raise TypeError(f"{where}: {name} must hold integers (nothing is rounded), got {_short(values)}") from None
    if len(given) != size:
        raise ValueError(f"{where}: {name} must have one entry per rank ({size}), got {len(given)}")
    if any(v < 0 for v in given):
        raise ValueError(f"{where}: {name} must not be negative, got {given}")
    return given


def displacements(where: str, given, counts: tuple[int, ...] | None, size: int) -> tuple[int, ...]:
    """A gather's or scatter's ``displs`` (rows of the root's buffer), which need ``counts`` (``displs``)."""
    if counts is None:
        raise ValueError(f"{where}: displs needs counts (the rows of every rank's block), got counts=None")
    return displs(where, "displs", given, counts, size)


def displs(where: str, name: str, displs, rows, size: int, apart: bool = True) -> tuple[int, ...]:
    """Row offsets of each rank's block (MPI's displacements), checked: integers, one per rank, none negative, and
    (``apart``: blocks written) the blocks of ``rows`` rows starting there apart (empty blocks lie anywhere)."""
    given = _per_rank(where, name, displs, size)
    blocks = sorted((d, d + c, r) for r, (d, c) in enumerate(zip(given, rows)) if c) if apart else []
    for (a, end, r), (b, stop, q) in zip(blocks, blocks[1:]):
        if b < end:
            raise ValueError(f"{where}: {name} overlap: rank {r}'s rows [{a}, {end}) and rank {q}'s rows [{b}, {stop})")
    return given


def is_matrix(counts) -> bool:
    """Whether ``counts`` is given as a (size, size) matrix (alltoall) rather than a row."""
    if counts is None or isinstance(counts, (str, bytes)):
        return False
    if isinstance(counts, (list, tuple)):  # the common case, without building an array
        return bool(counts) and all(isinstance(r, (list, tuple)) or getattr(r, "ndim", None) == 1 for r in counts)
    try:
        return np.ndim(counts) == 2
    except ValueError:  # ragged nesting: not a matrix, and not a row of integers either
        return False


def count_matrix(where: str, counts, rows: int | None, size: int, rank: int):
    """A (size, size) ``counts`` checked (row ``rank`` against the ``rows`` of x); None for any other ``counts``."""
    if not is_matrix(counts):
        return None
    try:
        matrix = tuple(tuple(integer(where, "counts", c) for c in r) for r in counts)
    except TypeError:
        raise TypeError(f"{where}: counts must hold integers (nothing is rounded), got {_short(counts)}") from None
    if len(matrix) != size or any(len(r) != size for r in matrix):
        raise ValueError(f"{where}: counts as a matrix must be ({size}, {size}) (rows each rank sends to each "
                         f"rank), got {len(matrix)} rows of lengths {sorted({len(r) for r in matrix})}")
    if any(c < 0 for r in matrix for c in r):
        raise ValueError(f"{where}: counts must not be negative, got {[list(r) for r in matrix]}")
    if rows is not None and sum(matrix[rank]) != rows:
        raise ValueError(f"{where}: counts[{rank}] (this rank's row) sums to {sum(matrix[rank])} "
                         f"but x has {rows} rows along axis 0")
    return matrix


def _short(value) -> str:
    text = repr(value)
    return text if len(text) <= 120 else text[:117] + "..."


# -- settings of a Communicator ----------------------------------------------------------------------------------
def flag(name: str, value) -> bool:
    """A switch passed as an argument: True or False (1 and 0 too); a string is refused, since "0" would be true."""
    if isinstance(value, (bool, np.bool_)) or (isinstance(value, (int, np.integer)) and value in (0, 1)):
        return bool(value)
    raise TypeError(f"{name} must be True or False, got {type(value).__name__} {value!r}")


def nbytes(name: str, value) -> int:
    """A byte count passed as an argument: an integer >= 0."""
    try:
        n = integer("Communicator", name, value)
    except TypeError:   # a str ("4M") is not read either: the variables hold plain integers
        raise TypeError(f"Communicator: {name} must be an integer number of bytes >= 0, got "
                        f"{type(value).__name__} {value!r}") from None
    if n < 0:
        raise ValueError(f"Communicator: {name} must be an integer number of bytes >= 0, got {n}")
    return n


def seconds(name: str, value) -> float:
    """A positive, finite number of seconds (strings are read, as environment variables hold them)."""
    if isinstance(value, (bool, np.bool_)):
        raise ValueError(f"{name} must be a number of seconds > 0, got {value!r}")
    try:
        s = float(value)
    except (TypeError, ValueError):
        raise ValueError(f"{name} must be a number of seconds > 0, got {value!r}") from None
    if not (s > 0 and math.isfinite(s)):
        raise ValueError(f"{name} must be a number of seconds > 0, got {value!r}")
    return s


def path(name: str, value) -> str:
    """A file path (str or os.PathLike): an int would be taken as an open file descriptor, and closed."""
    if isinstance(value, (str, os.PathLike)) and not isinstance(value, bytes):
        return os.fspath(value)
    raise TypeError(f"{name} must be a path to a JSON file (str or os.PathLike), got {type(value).__name__} {value!r}")
