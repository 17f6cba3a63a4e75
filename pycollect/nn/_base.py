"""What every layer shares: the array module, argument checks, the Layer base, erf, scatter-add."""
from __future__ import annotations

import math
from typing import Any

import numpy as np

from ..engine.backend import array_module

__all__ = ["array_module", "Layer", "ForWeight", "check_array", "check_bool", "check_float", "check_shape",
           "check_same_dtype", "erf", "scatter_add"]


def is_float(dtype) -> bool:
    """A floating dtype: NumPy's own, or ml_dtypes' bfloat16 (whose kind is "V")."""
    return dtype.kind == "f" or dtype.name == "bfloat16"


def check_array(where: str, name: str, x):
    """``x``'s array module (numpy or cupy); TypeError naming the argument for anything else (a list, None)."""
    try:
        return array_module(x)
    except TypeError:
        raise TypeError(f"{where}: {name} must be a NumPy or CuPy array, got {type(x).__name__}") from None


def check_bool(where: str, name: str, value) -> bool:
    """``value`` as a Python bool: True or False (NumPy's ``bool_`` too); TypeError naming the argument for
    anything else, a string above all (``"no"`` is truthy)."""
    if not isinstance(value, (bool, np.bool_)):
        raise TypeError(f"{where}: {name} must be True or False, got {value!r}")
    return bool(value)


def check_float(where: str, name: str, x) -> None:
    """TypeError unless ``x`` is a NumPy/CuPy array of a floating dtype."""
    check_array(where, name, x)
    if not is_float(x.dtype):
        raise TypeError(f"{where}: {name} has dtype {x.dtype}, expected a floating dtype")


def check_shape(where: str, name: str, x, expected: tuple) -> None:
    """ValueError unless ``x.shape`` matches ``expected``; None matches any size, a leading ... any prefix."""
    if not hasattr(x, "shape"):
        check_array(where, name, x)   # TypeError naming the argument (a list has no shape)
    shape = tuple(x.shape)
    if expected and expected[0] is Ellipsis:
        tail = expected[1:]
        ok = len(shape) >= len(tail) and all(
            e is None or e == s for e, s in zip(tail, shape[len(shape) - len(tail):]))
    else:
        ok = len(shape) == len(expected) and all(e is None or e == s for e, s in zip(expected, shape))
    if not ok:
        parts = ["..." if e is Ellipsis else ("*" if e is None else str(e)) for e in expected]
        want = "(" + ", ".join(parts) + ("," if len(parts) == 1 and expected[0] is not Ellipsis else "") + ")"
        raise ValueError(f"{where}: {name} has shape {shape}, expected {want}")


def check_same_dtype(where: str, name: str, x, ref_name: str, ref) -> None:
    """TypeError unless ``x`` has ``ref``'s dtype and lives where ``ref`` does (NumPy host or CuPy device)."""
    xm, rm = check_array(where, name, x), array_module(ref)
    if xm is not rm:
        raise TypeError(f"{where}: {name} is a {xm.__name__} array but {ref_name} a {rm.__name__} array; "
                        f"move {name} to the same backend")
    if x.dtype != ref.dtype:
        raise TypeError(f"{where}: {name} has dtype {x.dtype}, expected {ref.dtype} (the dtype of {ref_name})")


_erf_ufunc = np.frompyfunc(math.erf, 1, 1)


def erf(x):
    """Elementwise erf in ``x``'s dtype.

    NumPy has no erf: on NumPy this applies ``math.erf`` elementwise (exact to float64, slow on big
    arrays); on CuPy it is ``cupyx.scipy.special.erf``.
    """
    xp = array_module(x)
    if xp is np:
        return np.asarray(_erf_ufunc(x), dtype=np.float64).astype(x.dtype, copy=False)
    from cupyx.scipy.special import erf as cupy_erf
    return cupy_erf(x)


def scatter_add(target, index, values) -> None:
    """``target[index] += values`` with repeated indices summed (``np.add.at`` / ``cupyx.scatter_add``)."""
    xp = array_module(target)
    if xp is np:
        np.add.at(target, index, values)
    else:
        import cupyx
        cupyx.scatter_add(target, index, values)


class ForWeight(tuple):
    """What a layer's B (``backward_input``) keeps for its W (``backward_weight``), in ``cache``: the
    forward's cache is dropped by B, so between the two a layer holds only what W reads."""


class Layer:
    """Parameters and gradients as dicts of arrays by name; ``backward`` adds into ``grads``.

    Gradients accumulate across ``backward`` calls (micro-batches) until ``zero_grad``.

    The backward comes in two steps (Qi et al., "Zero Bubble Pipeline Parallelism", ICLR 2024):
    ``backward_input(dy)`` (B) returns the input gradient, the one the previous layer (or pipeline
    stage) waits for, and leaves in ``cache`` a ``ForWeight`` of what the weight gradient needs;
    ``backward_weight()`` (W) adds the weight gradients into ``grads`` from it and clears ``cache``.
    ``backward(dy)`` is B then W, the same arithmetic as one step. A layer without weights has
    W = nothing (its B clears ``cache``). Any communication a layer's backward needs belongs to B.
    """

    def __init__(self, params: dict):
        self.params = params
        self.grads = {name: array_module(p).zeros_like(p) for name, p in params.items()}
        # what ``forward`` keeps for ``backward`` (None: nothing yet); an array, a tuple or a dict as each layer needs
        self.cache: Any = None

    def zero_grad(self) -> None:
        for g in self.grads.values():
            g[...] = 0

    def __call__(self, *args, **kwargs):
        return self.forward(*args, **kwargs)

    def backward(self, dy):
        """B then W: the input gradient returned, the weight gradients added into ``grads``. The
        forward's caches stay, as before the split (another backward of the same forward adds again)."""
        return self._b_then_w(lambda: self.backward_input(dy))

    def _b_then_w(self, b):
        layers = layers_in(self)
        kept = [layer.cache for layer in layers]
        dx = b()
        self.backward_weight()
        restore_caches(layers, kept)
        return dx

    def backward_input(self, dy):
        raise NotImplementedError(f"{type(self).__name__}.backward_input")

    def backward_weight(self) -> None:
        """W of a layer without weights: nothing (its B left no cache)."""

    def _take_cache(self, where: str):
        if self.cache is None:
            raise RuntimeError(f"{where}: backward called before forward (no cache)")
        if isinstance(self.cache, ForWeight):
            raise RuntimeError(f"{where}: backward_input called again before backward_weight "
                               f"(the forward's cache is gone)")
        return self.cache

    def _take_for_weight(self, where: str) -> ForWeight:
        """What B kept for W, ``cache`` cleared: RuntimeError when no B came first."""
        saved = self.cache
        if not isinstance(saved, ForWeight):
            raise RuntimeError(f"{where}: backward_weight called before backward_input (nothing kept for W)")
        self.cache = None
        return saved


def normal(shape, std, rng, dtype, xp):
    """Parameters drawn from N(0, std^2) with a NumPy Generator, placed in ``xp``."""
    rng = np.random.default_rng(rng)
    return xp.asarray((rng.standard_normal(shape) * std).astype(dtype))


def layers_in(root) -> list:
    """Every ``Layer`` reachable from ``root`` through attributes of layer-like objects (those with a
    ``forward``), lists and tuples (root included), once each.

    A pipeline keeps several micro-batches in flight through the same layers; each layer holds one
    ``cache``. ``stash_caches``/``restore_caches`` swap them per micro-batch.
    """
    found: list[Layer] = []
    seen: set[int] = set()
    todo = [root]
    while todo:
        obj = todo.pop()
        if isinstance(obj, (list, tuple)):
            todo.extend(obj)
            continue
        if id(obj) in seen or not hasattr(obj, "forward") or not hasattr(obj, "__dict__"):
            continue  # layer-like objects only (not arrays, communicators, meshes)
        seen.add(id(obj))
        if isinstance(obj, Layer):
            found.append(obj)
        todo.extend(vars(obj).values())
    return found


def stash_caches(layers) -> list:
    """The caches of ``layers`` (in order), each layer's ``cache`` reset to None."""
    saved = [layer.cache for layer in layers]
    for layer in layers:
        layer.cache = None
    return saved


def restore_caches(layers, saved) -> None:
    for layer, cache in zip(layers, saved):
        layer.cache = cache
