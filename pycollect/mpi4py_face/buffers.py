"""mpi4py's buffer specifications read once into arrays: the caller's memory as elements of the MPI datatype.

mpi4py takes a buffer as an object exposing memory (a NumPy array, bytearray, ...) or a list
``[buf, datatype]``, ``[buf, count, datatype]``, ``[buf, (count, displ), datatype]`` or
``[buf, count, displ, datatype]`` (``src/mpi4py/MPI.src/msgbuffer.pxi``); the v-collectives take
counts and displacements per rank in the same places. A missing datatype is the buffer's own
(its format, as mpi4py maps it: ``"B"`` as the installed mpi4py does, ``unsigned_bytes_type``), a missing count the whole buffer split
into the blocks the collective needs. What comes out is a view of the caller's memory, so a result
written into it lands where MPI would write it; counts and displacements are in elements of the
datatype, as MPI counts them.
"""
from __future__ import annotations

import functools
import operator
from typing import NamedTuple

import numpy as np
from mpi4py import MPI
from mpi4py.util import dtlib

_DTYPES: dict[int, np.dtype] = {}   # predefined datatypes' handles -> their NumPy dtypes


class Block(NamedTuple):
    """A buffer of ``blocks`` equal blocks (one block when the collective splits nothing)."""
    data: np.ndarray   # (blocks * per_block, ...) elements of the datatype, a view of the caller's memory
    per_block: int     # elements in one block: the spec's count
    datatype: MPI.Datatype

    def block(self, i: int) -> np.ndarray:   # (per_block, ...)
        return self.data[i * self.per_block:(i + 1) * self.per_block]


class Vector(NamedTuple):
    """A buffer of one block per rank, each at its own displacement."""
    data: np.ndarray   # (N, ...) the whole buffer's elements from its start
    counts: tuple[int, ...]
    displs: tuple[int, ...]
    datatype: MPI.Datatype

    def block(self, i: int) -> np.ndarray:   # (counts[i], ...)
        return self.data[self.displs[i]:self.displs[i] + self.counts[i]]

    def packed(self) -> bool:
        """Blocks back to back from the start in rank order: the buffer's first sum(counts) elements."""
        return self.displs == tuple(np.cumsum((0,) + self.counts[:-1]).tolist())


def in_place(spec) -> bool:
    return spec is MPI.IN_PLACE


def simple(spec, where: str, name: str, writable: bool, blocks: int = 0) -> Block:
    """A buffer of ``max(blocks, 1)`` blocks; ``count`` (one block's) from the spec or the buffer's length."""
    buf, count, displ, datatype = _unpack(spec, where, name, vector=False)
    raw, fmt = _memory(buf, where, name, writable)
    datatype = _datatype(datatype, fmt, where, name)
    dtype = numpy_dtype(datatype, where, name)
    start = _index(displ, where, name, "displacement") * dtype.itemsize
    if start > raw.size:
        raise ValueError(f"{where}: {name} displacement {displ} is past its end ({raw.size // dtype.itemsize} "
                         f"elements of {type_name(datatype)})")
    have = (raw.size - start) // dtype.itemsize
    if count is None:
        count = _inferred(raw.size - start, dtype, max(blocks, 1), where, name, datatype)
    count = _index(count, where, name, "count")
    if count * max(blocks, 1) > have:
        raise ValueError(f"{where}: {name} holds {have} elements of {type_name(datatype)}, the count asks for "
                         f"{count * max(blocks, 1)} ({max(blocks, 1)} x {count})")
    return Block(elements(raw[start:], dtype, count * max(blocks, 1)), count, datatype)


def vector(spec, where: str, name: str, writable: bool, blocks: int) -> Vector:
    """A buffer of ``blocks`` blocks, counts and displacements from the spec as mpi4py reads them: counts None
    (the buffer split as evenly as it goes, the first ranks one more), one int (each), or one per rank;
    displacements None (back to back), one int (a stride) or one per rank."""
    buf, counts, displs, datatype = _unpack(spec, where, name, vector=True)
    raw, fmt = _memory(buf, where, name, writable)
    datatype = _datatype(datatype, fmt, where, name)
    dtype = numpy_dtype(datatype, where, name)
    have = raw.size // dtype.itemsize
    if counts is None:
        total = _inferred(raw.size, dtype, 1, where, name, datatype)
        counts = [total // blocks + (i < total % blocks) for i in range(blocks)]
    counts = per_rank(counts, blocks, where, name, "counts")
    if displs is None:
        displs = np.cumsum([0] + counts[:-1]).tolist()
    elif not isinstance(displs, (list, tuple, np.ndarray)):
        displs = [i * _index(displs, where, name, "displacement") for i in range(blocks)]
    displs = per_rank(displs, blocks, where, name, "displs")
    for i, (c, d) in enumerate(zip(counts, displs)):
        if c and d + c > have:
            raise ValueError(f"{where}: {name} block {i} (displs[{i}]={d}, counts[{i}]={c}) runs past its end "
                             f"({have} elements of {type_name(datatype)})")
    return Vector(elements(raw, dtype, have), tuple(counts), tuple(displs), datatype)


def numpy_dtype(datatype: MPI.Datatype, where: str, name: str) -> np.dtype:
    """The NumPy dtype of one element of ``datatype`` (mpi4py's dtlib); refused where the datatype's elements
    are not whole NumPy elements (a lower bound, or gaps other than a pair type's padding)."""
    known = _DTYPES.get(datatype.handle) if datatype.is_predefined else None
    if known is not None:
        return known
    try:
        dtype = dtlib.to_numpy_dtype(datatype)
    except (KeyError, ValueError, TypeError, MPI.Exception) as e:
        raise TypeError(f"{where}: {name} has datatype {type_name(datatype)}, which has no NumPy dtype ({e})") \
            from None
    lb, extent = datatype.Get_extent()
    if dtype.itemsize == 0:      # MPI.WCHAR: dtlib's '<U0', no element NumPy can hold
        raise TypeError(f"{where}: {name} has datatype {type_name(datatype)}, which has no NumPy dtype of its "
                        f"{extent} bytes")
    if lb != 0 or extent != dtype.itemsize or (not datatype.is_predefined and datatype.Get_size() != extent):
        raise TypeError(f"{where}: {name} has datatype {type_name(datatype)} (lower bound {lb}, size "
                        f"{datatype.Get_size()}, extent {extent}); the face takes datatypes without gaps")
    if datatype.is_predefined:
        _DTYPES[datatype.handle] = dtype
    return dtype


def elements(raw: np.ndarray, dtype: np.dtype, n: int) -> np.ndarray:
    """The first ``n`` elements of ``dtype`` in the bytes ``raw``: (n,) or, for a subarray dtype such as a
    contiguous type's, (n, *its shape)."""
    if dtype.subdtype is not None:
        base, shape = dtype.subdtype
        return raw[:n * dtype.itemsize].view(base).reshape((n,) + shape)
    return raw[:n * dtype.itemsize].view(dtype)


def type_name(datatype) -> str:
    """MPI's name of ``datatype`` (``MPI_DOUBLE``); a derived one has none: then what it is."""
    if not isinstance(datatype, MPI.Datatype):
        return repr(datatype)
    return datatype.Get_name() or f"a derived datatype of {datatype.Get_size()} bytes"


def _unpack(spec, where: str, name: str, vector: bool):
    """``(buf, count(s), displ(s), datatype)`` of a spec, each None where it is not given."""
    if not isinstance(spec, (list, tuple)):
        return spec, None, None, None
    if len(spec) == 2:
        buf, second = spec
        if isinstance(second, (MPI.Datatype, str)):
            return buf, None, None, second
        pair = isinstance(second, tuple) or (not vector and isinstance(second, list))
        return (buf, *_pair(second, where, name), None) if pair else (buf, second, None, None)
    if len(spec) == 3:
        buf, second, datatype = spec
        pair = isinstance(second, tuple) or (not vector and isinstance(second, list))
        return (buf, *_pair(second, where, name), datatype) if pair else (buf, second, None, datatype)
    if len(spec) == 4:
        return tuple(spec)
    raise ValueError(f"{where}: {name} must be a buffer or a list of 2 to 4 items [buf, count, displ, datatype], "
                     f"got {len(spec)} items")


def _pair(value, where: str, name: str):
    if len(value) != 2:
        raise ValueError(f"{where}: {name} has {value!r} where (count, displacement) goes: expected 2 items")
    return value[0], value[1]


def _memory(buf, where: str, name: str, writable: bool) -> tuple[np.ndarray, str | None]:
    """The caller's memory as flat bytes (a view) and its buffer format (None where the buffer has none)."""
    if buf is None:   # mpi4py's empty buffer: a count of 0
        return np.empty(0, np.uint8), None
    try:
        view = memoryview(buf)
    except TypeError:
        raise TypeError(f"{where}: {name} must be a buffer (a NumPy array, bytearray, ...), MPI.IN_PLACE where the "
                        f"collective allows it, or a list [buf, count, displ, datatype]; got {type(buf).__name__}") \
            from None
    if writable and view.readonly:
        raise BufferError(f"{where}: {name} is read-only, and the result is written into it")
    if isinstance(buf, np.ndarray) and type(buf) is not np.ndarray:
        buf = buf.view(np.ndarray)   # a subclass (np.matrix, a masked array): its memory, all mpi4py reads of it
    if isinstance(buf, np.ndarray) and (buf.flags.c_contiguous or buf.flags.f_contiguous):
        raw = buf.reshape(-1, order="A").view(np.uint8)   # memory order either way
    elif view.c_contiguous:
        raw = np.frombuffer(view, np.uint8)
    else:
        raise BufferError(f"{where}: {name} is not contiguous; MPI reads and writes a buffer's memory as it lies")
    return raw, view.format


def _datatype(datatype, fmt: str | None, where: str, name: str) -> MPI.Datatype:
    """The spec's datatype (an MPI.Datatype or a type code), else the one mpi4py infers from the buffer format."""
    if isinstance(datatype, MPI.Datatype):
        if datatype == MPI.DATATYPE_NULL:
            raise ValueError(f"{where}: {name} has datatype MPI.DATATYPE_NULL")
        return datatype
    code = datatype if datatype is not None else fmt
    if code is None:
        return MPI.BYTE
    if not isinstance(code, str):
        raise TypeError(f"{where}: {name} has {type(code).__name__} where an MPI.Datatype goes")
    if datatype is None and code[:1] in "@<>":   # a byte order mark: native is all MPI moves
        if code[0] == (">" if np.little_endian else "<"):
            raise BufferError(f"{where}: {name} has format {code!r}, of non-native byte order")
        code = code[1:]
    if datatype is None and code == "B":
        return unsigned_bytes_type()
    try:
        return MPI.Datatype.fromcode(code)
    except (KeyError, ValueError):
        raise TypeError(f"{where}: {name}: cannot map {code!r} to an MPI datatype; give one, [buf, MPI.DOUBLE]") \
            from None


@functools.cache
def unsigned_bytes_type() -> MPI.Datatype:
    """The datatype mpi4py gives a buffer of format ``"B"`` (a uint8 array, a bytearray): ``MPI.UNSIGNED_CHAR`` in
    mpi4py 4.1, ``MPI.BYTE`` in releases that mapped that format apart. Asked of mpi4py itself, once: it refuses
    a reduction whose two buffers it types differently, before calling MPI (here on this rank alone)."""
    byte = np.zeros(1, np.uint8)
    try:
        MPI.COMM_SELF.Allreduce(byte, [np.zeros(1, np.uint8), MPI.BYTE], op=MPI.BOR)
    except ValueError:     # "mismatch in send and receive MPI datatypes"
        return MPI.UNSIGNED_CHAR
    return MPI.BYTE


def _inferred(nbytes: int, dtype: np.dtype, blocks: int, where: str, name: str, datatype) -> int:
    """One block's count when the spec gives none: the bytes split into ``blocks`` whole blocks."""
    if nbytes % dtype.itemsize:
        raise ValueError(f"{where}: {name} has {nbytes} bytes, not a whole number of {type_name(datatype)} "
                         f"elements ({dtype.itemsize} bytes)")
    n = nbytes // dtype.itemsize
    if n % blocks:
        raise ValueError(f"{where}: {name} has {n} elements of {type_name(datatype)}, not a multiple of the "
                         f"{blocks} blocks the collective needs; give the count, [buf, count, datatype]")
    return n // blocks


def _index(value, where: str, name: str, what: str) -> int:
    if value is None:
        return 0
    try:
        value = operator.index(value)
    except TypeError:
        raise TypeError(f"{where}: {name} {what} must be an integer, got {value!r}") from None
    if value < 0:
        raise ValueError(f"{where}: {name} {what} must not be negative, got {value}")
    return value


def per_rank(values, blocks: int, where: str, name: str, what: str) -> list[int]:
    if isinstance(values, (int, np.integer)) and what == "counts":
        return [_index(values, where, name, what)] * blocks
    try:
        values = list(values)
    except TypeError:
        raise TypeError(f"{where}: {name} {what} must be an int or one per rank, got {values!r}") from None
    if len(values) != blocks:
        raise ValueError(f"{where}: {name} has {len(values)} {what}, expected one per rank ({blocks})")
    return [_index(v, where, name, f"{what}[{i}]") for i, v in enumerate(values)]
