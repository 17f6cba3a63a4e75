"""Reduction operations: which dtypes each accepts and the function that applies it.

An op is a name (``"sum"``, ``"land"``, ``"minloc"``, ...) or a user's ``Op``: a NumPy binary ufunc
(``np.hypot``, taken as commutative) or any ``function(a, b, out=)`` wrapped as ``Op(function,
commute=False)``. Every reduction computes ``op(a, b)`` with ``a`` holding the lower ranks'
contribution, as MPI's user functions do, so a non-commutative op gives rank order when the schedule
combines contiguous ranks from low to high (algorithms/rank_order.py says which do).
"""
from __future__ import annotations

import types
import zlib
from functools import lru_cache

import numpy as np

# name -> ufunc name (looked up in NumPy or CuPy); avg is a sum divided afterwards
_UFUNC = {"sum": "add", "avg": "add", "prod": "multiply", "min": "minimum", "max": "maximum",
          "band": "bitwise_and", "bor": "bitwise_or", "bxor": "bitwise_xor",
          "land": "logical_and", "lor": "logical_or", "lxor": "logical_xor"}
OPS = ("sum", "avg", "prod", "min", "max", "band", "bor", "bxor")   # the arithmetic and bitwise ops
LOGICAL = ("land", "lor", "lxor")        # bool and integers; an integer counts as true when not 0 (C's rule)
LOCATING = ("minloc", "maxloc")          # values and their locations (engine/locations.py)
NAMES = OPS + LOGICAL + LOCATING         # every op a name stands for
# dtype kinds each named op reduces (dtype_kind): MPI's groups, bool only under the logical ops
_KINDS = dict.fromkeys(("sum", "avg", "prod"), "iufc") | dict.fromkeys(("min", "max"), "iuf") \
    | dict.fromkeys(("band", "bor", "bxor"), "iu") | dict.fromkeys(LOGICAL, "iub") | dict.fromkeys(LOCATING, "iuf")


@lru_cache(maxsize=128)   # every call's argument check asks; dtype.name costs microseconds
def dtype_kind(dtype) -> str:
    """'i' signed int, 'u' unsigned, 'f' float (bfloat16 and long double included), 'c' complex, 'b' bool,
    or '?' unsupported."""
    dtype = np.dtype(dtype)
    if dtype.name == "bfloat16":
        return "f"
    return dtype.kind if dtype.kind in "iufcb" else "?"


class Op:
    """A user's reduction op: ``function(a, b, out=)`` writes ``a op b`` elementwise into ``out`` (which may be
    ``a`` or ``b`` itself), ``a`` holding lower ranks than ``b``. It must be associative; ``commute=False``
    (MPI's default for ``MPI.Op.Create``) makes pycollect reduce in rank order, on the schedules that keep
    it. A NumPy ufunc passed as ``op`` is ``Op(ufunc, commute=True)``.

    Structured dtypes let one element be a block: ``np.dtype([("m", "f8", (2, 2))])`` with
    ``lambda a, b, out: np.matmul(a["m"], b["m"], out=out["m"])`` is a product of 2x2 matrices.
    """

    def __init__(self, function, commute: bool = False, name: str | None = None):
        if not callable(function):
            raise TypeError(f"Op: function must be callable, got {type(function).__name__}")
        self.function, self.commute = function, bool(commute)
        self.name = name or getattr(function, "__name__", None) or type(function).__name__
        code = getattr(function, "__code__", None)
        self._code = None if isinstance(function, np.ufunc) or code is None else zlib.crc32(_code_bytes(code))

    def __repr__(self) -> str:   # the same on every rank for the same op: validation compares it
        code = "" if self._code is None else f", code {self._code:08x}"
        return f"Op({self.name}, commute={self.commute}{code})"

    def __str__(self) -> str:
        return self.name

    def combine(self, xp=np):
        """``f(a, b, out=)`` in array module ``xp`` (a NumPy ufunc becomes CuPy's of the same name)."""
        f = self.function
        if xp is not np and isinstance(f, np.ufunc):
            f = getattr(xp, f.__name__)

        def apply(a, b, out):
            result = f(a, b, out=out)
            # a function that returned its result instead of writing out (one that wrote a view of out is done)
            if result is not None and result is not out and not xp.may_share_memory(result, out):
                out[...] = result
        return apply


def _code_bytes(code: types.CodeType) -> bytes:
    """A Python function's compiled code as bytes that are the same in every process running the same source
    (its instructions, names and constants, nested code too; not its file or line, nor addresses): two ops of
    one name with other bodies (two lambdas, two functions called ``combine``) differ in validation mode."""
    parts = [code.co_code, repr((code.co_names, code.co_varnames)).encode()]
    for const in code.co_consts:
        if isinstance(const, types.CodeType):
            parts.append(_code_bytes(const))
        elif isinstance(const, frozenset):        # a set's order follows the process's string hashing
            parts.append(repr(sorted(map(repr, const))).encode())
        else:
            parts.append(repr(const).encode())
    return b"\0".join(parts)


@lru_cache(maxsize=64)
def user_op(function) -> Op:
    """A NumPy binary ufunc as an Op (commutative, named after it): one per ufunc, so repeated calls match."""
    return Op(function, commute=True)


def commutes(op) -> bool:
    return not isinstance(op, Op) or op.commute


def check_op(op, dtype, where: str) -> None:
    """Raise a ValueError naming the op and dtype when they do not go together."""
    if isinstance(op, Op):
        return check_user(op, dtype, where)
    if op not in _KINDS:
        raise ValueError(f"{where}: unknown op {op!r}; expected one of {', '.join(NAMES)}, a NumPy binary ufunc "
                         f"or a pycollect.Op")
    dtype = np.dtype(dtype)
    if op in LOCATING and dtype.names == ("value", "location"):   # the pairs engine/locations.py builds
        dtype = dtype["value"]
    kind = dtype_kind(dtype)
    if kind == "?":
        raise TypeError(f"{where}: dtype {dtype} is not supported by op {op!r}; use bool, an integer, float, "
                        f"complex or bfloat16 dtype, or a pycollect.Op for other fixed-size dtypes")
    if kind not in _KINDS[op]:
        wants = {"iufc": "an integer, float or complex dtype", "iuf": "an integer or float dtype (not complex)",
                 "iu": "an integer dtype", "iub": "a bool or integer dtype"}[_KINDS[op]]
        hint = "; for bool use 'land', 'lor' or 'lxor'" if kind == "b" else ""
        raise ValueError(f"{where}: op {op!r} needs {wants}, got {dtype}{hint}")


def check_user(op: Op, dtype, where: str) -> None:
    """A user's op tried on one element of ``dtype``, so a function that cannot take it fails here, before
    anything is sent, rather than inside the collective (which would end the job)."""
    f = op.function
    if isinstance(f, np.ufunc) and (f.nin != 2 or f.nout != 1):
        raise ValueError(f"{where}: op {op.name} is a ufunc of {f.nin} input(s) and {f.nout} output(s); a reduction "
                         f"needs a binary ufunc (2 inputs, 1 output)")
    a = np.zeros(1, dtype)
    try:
        with np.errstate(all="ignore"):
            op.combine(np)(a, a.copy(), out=np.empty_like(a))
    except Exception as e:  # noqa: BLE001 (any failure of the user's function is a bad op for this dtype)
        raise ValueError(f"{where}: op {op.name} cannot reduce dtype {np.dtype(dtype)}: {type(e).__name__}: {e}") \
            from None


def ufunc(op, xp=np):
    """The binary function ``f(a, b, out=...)`` applying ``op`` in array module ``xp``."""
    if isinstance(op, Op):
        return op.combine(xp)
    if op in LOCATING:
        return _minloc if op == "minloc" else _maxloc
    return getattr(xp, _UFUNC[op])


def _located(a, b, out, b_wins) -> None:
    """``out`` = the pair of ``a`` or ``b`` that ``b_wins`` picks; on equal values the lower location (MPI's rule)."""
    av, bv, ai, bi = a["value"], b["value"], a["location"], b["location"]
    take = b_wins(bv, av) | ((bv == av) & (bi < ai))
    value, location = np.where(take, bv, av), np.where(take, bi, ai)   # both before out (which may be a) changes
    out["value"], out["location"] = value, location


def _minloc(a, b, out) -> None:
    _located(a, b, out, np.less)


def _maxloc(a, b, out) -> None:
    _located(a, b, out, np.greater)


def finish_avg(result, size: int, xp=np) -> None:
    """Divide a sum by ``size`` in place; integers round toward zero, as C and NCCL do."""
    if dtype_kind(result.dtype) in "iu":
        q = result // size                       # floor, which never overflows (abs() does at the dtype's minimum)
        if dtype_kind(result.dtype) == "i":      # toward zero: a negative sum that leaves a remainder goes up one
            q += (result < 0) & (result % size != 0)
        result[...] = q
    else:
        # divided, not times a rounded 1/size (seven 3.0 average 3.0); a complex sum part by part (NumPy divides a
        # complex by a real as by a complex, which rounds: 21/7 gave 3.0000002)
        for part in (result.real, result.imag) if dtype_kind(result.dtype) == "c" else (result,):
            if part.dtype.itemsize < 4:     # float16, bfloat16: the size itself may round there (257 to 256)
                part[...] = part.astype(xp.float32) / xp.float32(size)
            else:
                part /= xp.asarray(size, dtype=part.dtype)
