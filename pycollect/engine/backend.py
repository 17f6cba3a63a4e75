"""NumPy or CuPy: which module an array belongs to, flat contiguous views, stream sync, staging."""
from __future__ import annotations

import threading

import numpy as np

from . import environment


def is_cupy(x) -> bool:
    return type(x).__module__.startswith("cupy")


def array_module(x):
    """``numpy`` or ``cupy`` for an array; TypeError for anything else."""
    if isinstance(x, np.ndarray):
        return np
    if is_cupy(x):
        import cupy
        return cupy
    raise TypeError(f"expected a NumPy or CuPy array, got {type(x).__name__}")


def flat(x):
    """A flat contiguous view of ``x``, or a contiguous copy when ``x`` is strided."""
    if x.flags.c_contiguous:
        return x.reshape(-1)
    return x.ravel()  # ravel copies a non-contiguous array


def sync(xp) -> None:
    """Finish queued device work before MPI reads or writes device memory."""
    if xp is not np:
        xp.cuda.get_current_stream().synchronize()


def cuda_aware(mpi) -> bool:
    """Whether MPI takes device pointers: ``PYCOLLECT_CUDA_AWARE`` (0/1) wins, else MPI's own query."""
    said = environment.switch(environment.CUDA_AWARE, None, "0 or 1")
    if said is not None:
        return said
    query = getattr(mpi, "Query_cuda_support", None)  # mpi4py on an MPI-4.1 library
    if query is not None:
        try:
            return bool(query())
        except Exception:  # mpi4py has the name, the library lacks the call
            pass
    return _mpix_query_cuda_support()


def _mpix_query_cuda_support() -> bool:
    """MPICH's and Open MPI's ``MPIX_Query_cuda_support()``, from the libmpi this process loaded."""
    import ctypes
    try:
        with open("/proc/self/maps") as maps:
            libs = {line.split()[-1] for line in maps if "libmpi" in line.rsplit("/", 1)[-1]}
    except OSError:
        return False
    for path in sorted(libs):
        try:
            fn = ctypes.CDLL(path).MPIX_Query_cuda_support
        except (OSError, AttributeError):
            continue
        fn.restype = ctypes.c_int
        return bool(fn())
    return False


def same_buffer(a, b) -> bool:
    """Whether two C-contiguous arrays are exactly the same bytes (an in-place call through another view)."""
    if not (a.flags.c_contiguous and b.flags.c_contiguous) or a.nbytes != b.nbytes:
        return False
    return _address(a) == _address(b)


def is_block_of(x, out, index: int) -> bool:
    """Whether ``x`` is exactly block ``index`` of ``out`` split in blocks of ``x``'s size, both C-contiguous (an
    in-place allgather: each rank's input already in its slot of the output)."""
    return lies_at(x, out, index * x.nbytes)


def lies_at(x, out, offset: int) -> bool:
    """Whether ``x`` is exactly the ``x.nbytes`` bytes of ``out`` from byte ``offset`` on, both C-contiguous and
    ``x`` not empty."""
    if out is None or x.nbytes == 0 or not (x.flags.c_contiguous and out.flags.c_contiguous):
        return False
    if not is_cupy(x) and not np.may_share_memory(x, out):   # the common case, settled without building addresses
        return False
    return _address(x) == _address(out) + offset and offset + x.nbytes <= out.nbytes


def overlap(a, b) -> bool:
    """Whether two C-contiguous arrays of one module share any byte."""
    if a.nbytes == 0 or b.nbytes == 0:
        return False
    start_a, start_b = _address(a), _address(b)
    return start_a < start_b + b.nbytes and start_b < start_a + a.nbytes


def _address(a) -> int:
    return a.data.ptr if is_cupy(a) else a.__array_interface__["data"][0]


def byte_view(x, xp):
    """The bytes of a flat contiguous array, as MPI should see them (no datatype lookup)."""
    return x.view(xp.uint8)


class BufferPool:
    """Scratch arrays kept between calls: fresh large allocations cost page faults on every call."""

    def __init__(self, keep: int = 4):
        self._free: dict = {}
        self._keep = keep
        self.made = 0          # arrays allocated because none kept was large enough (tests count them)
        self._lock = threading.Lock()   # two threads' calls in flight (each Request waited in its own) take and give

    def take(self, xp, dtype, n: int):
        with self._lock:
            free = self._free.get((xp.__name__, dtype), [])
            for i, arr in enumerate(free):
                if arr.size >= n:
                    return free.pop(i)
            self.made += 1
        return xp.empty(max(n, 1), dtype)

    def give(self, arr) -> None:
        with self._lock:
            free = self._free.setdefault((type(arr).__module__.split(".")[0], arr.dtype), [])
            free.append(arr)
            free.sort(key=lambda a: a.size)
            del free[:-self._keep]
