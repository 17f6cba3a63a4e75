"""Reduction operations: which dtypes each accepts and the ufunc that applies it."""
from __future__ import annotations

from functools import lru_cache

import numpy as np

# name -> ufunc name (looked up in NumPy or CuPy); avg is a sum divided afterwards
_UFUNC = {"sum": "add", "avg": "add", "prod": "multiply", "min": "minimum", "max": "maximum",
          "band": "bitwise_and", "bor": "bitwise_or", "bxor": "bitwise_xor"}
OPS = tuple(_UFUNC)


@lru_cache(maxsize=128)   # every call's argument check asks; dtype.name costs microseconds
def dtype_kind(dtype) -> str:
    """'i' signed int, 'u' unsigned, 'f' float (bfloat16 included), 'c' complex, or '?' unsupported."""
    dtype = np.dtype(dtype)
    if dtype.name == "bfloat16":
        return "f"
    if dtype.kind in "iufc" and dtype != np.longdouble and dtype != np.clongdouble:
        return dtype.kind
    return "?"


def check_op(op: str, dtype, where: str) -> None:
    """Raise a ValueError naming the op and dtype when they do not go together."""
    if op not in _UFUNC:
        raise ValueError(f"{where}: unknown op {op!r}; expected one of {', '.join(OPS)}")
    kind = dtype_kind(dtype)
    if kind == "?":
        raise TypeError(f"{where}: dtype {np.dtype(dtype)} is not supported; use an integer, float, complex or bfloat16 dtype")
    if op in ("band", "bor", "bxor") and kind not in "iu":
        raise ValueError(f"{where}: op {op!r} needs an integer dtype, got {np.dtype(dtype)}")
    if op in ("min", "max") and kind == "c":
        raise ValueError(f"{where}: op {op!r} is not defined on complex dtype {np.dtype(dtype)}")


def ufunc(op: str, xp=np):
    """The binary function ``f(a, b, out=...)`` applying ``op`` in array module ``xp``."""
    return getattr(xp, _UFUNC[op])


def finish_avg(result, size: int, xp=np) -> None:
    """Divide a sum by ``size`` in place; integers round toward zero, as C and NCCL do."""
    if dtype_kind(result.dtype) in "iu":
        q = xp.abs(result) // size
        result[...] = xp.where(result < 0, -q, q) if dtype_kind(result.dtype) == "i" else q
    else:
        result *= xp.asarray(1.0 / size, dtype=result.dtype)
