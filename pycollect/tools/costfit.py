"""Fit the cost model's terms on measured collective calls, and measure how well it predicts sizes it did not see.

A ping-pong fits a link's alpha and beta with the message alone in flight and in cache; a
collective call also pays for its reductions and copies, for data that has left the cache, for
the executor's rounds and for the call itself (costmodel.py lists the terms). Here every
parameter is fitted on the measured calls: for a fixed choice of the slowest message of each round
and of the slowest rank (taken from the current model), a schedule's predicted time is linear in
the parameters, ``t = terms . params``. Each measured call gives one equation, divided by its
measured time so that the fit minimises relative error (small calls would count for nothing
otherwise), solved with every parameter >= 0; the choices are then re-taken from the new model and
the fit repeated until they settle. The crossovers (``cache_bytes``, a link's ``far_bytes``) are not
linear: each candidate is fitted and the one of least error kept.

Held out: each collective's sizes sorted, the even-placed ones are one half and the odd-placed the
other; the model fitted on one half predicts the other, and the other way round, so every point is
predicted by a fit that did not see its size. No MPI here; everything is pure.
"""
from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Mapping, Sequence

import numpy as np

from ..algorithms.registry import all_summaries
from ..engine.shapes import even_problem, segment_elements
from ..engine.summary import Shape, Summary
from ..engine.topology import Topology
from ..costmodel import Model, dirty_bytes, slowest_message, summary_times, working_set

INTRA = "intra-node"
TARGET = 0.25            # the error a prediction should stay within
FROM_BYTES = 32 << 10    # where the target starts: below it a call is its fixed costs, timed to a few us
QUIET = 0.10             # a point whose median pass is within this of its fastest is measured steadily


@dataclass(frozen=True)
class Point:
    """One measured call: ``seconds`` of ``collective`` by ``algorithm`` on ``nbytes`` (sized as ``pc.traffic``)."""

    collective: str
    algorithm: str
    nbytes: int
    seconds: float


class Calls:
    """The measured points with every rank's summary of each, computed once (they do not depend on the model)."""

    def __init__(self, points: Sequence[Point], topology: Topology, itemsize: int = 4, tree_segment_bytes: int = 0):
        bad = [p for p in points if not p.seconds > 0]
        if bad:
            raise ValueError(f"costfit: measured seconds must be > 0; got {bad[0]}")
        self.points, self.topology, self.itemsize = list(points), topology, itemsize
        segment = segment_elements(tree_segment_bytes, itemsize)
        self._summaries: dict[tuple, list[Summary]] = {}
        for p in self.points:
            key = (p.collective, p.algorithm, p.nbytes)
            if key not in self._summaries:
                problem = even_problem(p.collective, 0, topology.size, topology, p.nbytes // itemsize, tree_segment=segment)
                self._summaries[key] = all_summaries(p.collective, p.algorithm, problem)

    def subset(self, keep: Sequence[bool]) -> "Calls":
        out = object.__new__(Calls)
        out.points = [p for p, k in zip(self.points, keep) if k]
        out.topology, out.itemsize, out._summaries = self.topology, self.itemsize, self._summaries
        return out

    def summaries(self, p: Point) -> list[Summary]:
        return self._summaries[(p.collective, p.algorithm, p.nbytes)]

    def working_set(self, p: Point) -> int:
        return working_set(p.collective, p.nbytes, self.topology)

    def predict(self, model: Model, p: Point) -> float:
        return max(summary_times(model.at_call(self.working_set(p)), self.summaries(p), self.topology, self.itemsize))


# -- the model as a vector of parameters ----------------------------------------------------------------
def param_names(tiers: Sequence[str]) -> list[str]:
    per_tier = [f"{name}:{t}" for t in tiers for name in ("alpha", "beta", "beta_far", "beta_shared", "beta_memory")]
    return per_tier + ["gamma", "gamma_far", "copy", "copy_far", "overhead", "fence", "call_overhead",
                       "gamma_memory", "copy_memory", "dirty"]


def params_of(model: Model) -> dict[str, float]:
    """Every parameter's value; a far rate that is None (the same as near) is its near rate, a memory rate
    that is None its far rate."""
    out = {}
    for t, k in model.links.items():
        far = _or(k.beta_far, k.beta)
        out.update({f"alpha:{t}": k.alpha, f"beta:{t}": k.beta, f"beta_far:{t}": far,
                    f"beta_shared:{t}": k.beta_shared, f"beta_memory:{t}": _or(k.beta_memory, far)})
    gamma_far, copy_far = _or(model.gamma_far, model.gamma), _or(model.copy_far, model.copy)
    return out | {"gamma": model.gamma, "gamma_far": gamma_far, "copy": model.copy, "copy_far": copy_far,
                  "overhead": model.overhead, "fence": model.fence, "call_overhead": model.call_overhead,
                  "gamma_memory": _or(model.gamma_memory, gamma_far), "copy_memory": _or(model.copy_memory, copy_far),
                  "dirty": model.dirty}


def _or(value, default):
    return default if value is None else value


def with_params(model: Model, values: Mapping[str, float]) -> Model:
    """``model`` with the parameters named in ``values`` replaced (crossovers kept)."""
    v = params_of(model) | dict(values)

    def kept(name: str, regime: object) -> float | None:   # a rate of a regime the model has (crossover set)
        return v[name] if regime is not None else None
    memory = model.memory_bytes
    links = {t: dataclasses.replace(k, alpha=v[f"alpha:{t}"], beta=v[f"beta:{t}"],
                                    beta_far=kept(f"beta_far:{t}", k.far_bytes), beta_shared=v[f"beta_shared:{t}"],
                                    beta_memory=kept(f"beta_memory:{t}", k.beta_memory))
             for t, k in model.links.items()}
    return dataclasses.replace(model, links=links, gamma=v["gamma"], gamma_far=kept("gamma_far", model.cache_bytes),
                               copy=v["copy"], copy_far=kept("copy_far", model.cache_bytes), overhead=v["overhead"],
                               fence=v["fence"], call_overhead=v["call_overhead"],
                               gamma_memory=kept("gamma_memory", memory), copy_memory=kept("copy_memory", memory),
                               dirty=v["dirty"])


def with_crossovers(model: Model, cache_bytes: int | None, far_bytes: Mapping[str, int | None],
                    memory_bytes: int | None = None, memory_tiers: Sequence[str] = ()) -> Model:
    """``model`` with its crossovers set; a far rate starts equal to its near rate, a memory rate to its far
    rate. Past ``memory_bytes`` (None: no memory regime) reductions, copies and the ``memory_tiers`` links
    take memory rates."""
    def far(rate, near, crossover):
        return None if crossover is None else _or(rate, near)
    links = {}
    for t, k in model.links.items():
        beta_far = far(k.beta_far, k.beta, far_bytes.get(t))
        memory = memory_bytes if t in memory_tiers else None
        links[t] = dataclasses.replace(k, beta_far=beta_far, far_bytes=far_bytes.get(t),
                                       beta_memory=far(k.beta_memory, _or(beta_far, k.beta), memory))
    gamma_far, copy_far = far(model.gamma_far, model.gamma, cache_bytes), far(model.copy_far, model.copy, cache_bytes)
    return dataclasses.replace(model, links=links, cache_bytes=cache_bytes, gamma_far=gamma_far, copy_far=copy_far,
                               memory_bytes=memory_bytes,
                               gamma_memory=far(model.gamma_memory, _or(gamma_far, model.gamma), memory_bytes),
                               copy_memory=far(model.copy_memory, _or(copy_far, model.copy), memory_bytes))


# -- a prediction as terms . params ---------------------------------------------------------------------
def _split(nbytes: float, limit: int | None) -> tuple[float, float]:
    """``(bytes at the near rate, bytes at the far rate)``."""
    if limit is None or nbytes <= limit:
        return nbytes, 0.0
    return float(limit), nbytes - limit


def _rated(kind: str, nbytes: float, limit: int | None, memory: float, suffix: str = "") -> dict[str, float]:
    """Coefficients of ``nbytes`` of one kind (``gamma``, ``copy``, ``beta``) split near/far at ``limit``, of which
    the fraction ``memory`` streams from memory instead (``Model.at_call``; 0 where the kind has no memory rate)."""
    near, far = _split(nbytes, limit)
    return {f"{kind}{suffix}": (1.0 - memory) * near, f"{kind}_far{suffix}": (1.0 - memory) * far,
            f"{kind}_memory{suffix}": memory * nbytes}


def round_terms(model: Model, shape: Shape, rank: int, topology: Topology, itemsize: int,
                working_set_bytes: int = 0) -> dict[str, float]:
    """The round's time as coefficients of the parameters: ``round_time == sum(terms[k] * params[k])``.

    The slowest message is the one the current model finds slowest (ties: the first listed, as
    ``round_time``'s ``max`` keeps it); every other term is linear already. ``working_set_bytes``: the
    call's node's (``costmodel.working_set``), past the model's ``memory_bytes`` a part of every byte
    streams from memory."""
    memory = memory_fraction(model, working_set_bytes)
    gx = memory if model.gamma_memory is not None else 0.0
    cx = memory if model.copy_memory is not None else 0.0
    terms: dict[str, float] = {}
    if shape.window and not model.window_as_messages:      # costmodel.window_round_time
        for _, n, reduces in shape.recvs:
            _add(terms, _rated("gamma", n * itemsize, model.cache_bytes, gx) if reduces else
                 _rated("copy", n * itemsize, model.cache_bytes, cx))
        for copied in (shape.copied, shape.published):
            _add(terms, _rated("copy", copied * itemsize, model.cache_bytes, cx))
        _add(terms, {"overhead": 1.0, "fence": 1.0,
                     "dirty": float(dirty_bytes(model, sum(n for _, n, _ in shape.recvs) * itemsize))})
        return terms
    messages = [(topology.tier(rank, peer), n * itemsize)
                for peer, n in [(peer, n) for peer, n in shape.sends] + [(peer, n) for peer, n, _ in shape.recvs]]
    if messages:
        priced = model.at_call(working_set_bytes)
        first_slowest = slowest_message(priced, messages)
        tier, nbytes = messages[first_slowest]
        link = model.links[tier]
        _add(terms, {f"alpha:{tier}": 0.0 if model.eager_sends and not shape.recvs else 1.0})
        _add(terms, _rated("beta", nbytes, link.far_bytes, memory if link.beta_memory is not None else 0.0, f":{tier}"))
        _add(terms, {"dirty": float(dirty_bytes(model, shape.written * itemsize))})
        for i, (other, b) in enumerate(messages):
            if i != first_slowest:
                _add(terms, {f"beta_shared:{other}": float(b)})
    for _, n, reduces in shape.recvs:
        if reduces:
            _add(terms, _rated("gamma", n * itemsize, model.cache_bytes, gx))
    for copied in (shape.copied, shape.published):
        if copied:
            _add(terms, _rated("copy", copied * itemsize, model.cache_bytes, cx))
    if shape.communicates:
        _add(terms, {"overhead": 1.0, "fence": 1.0 if shape.window else 0.0})
    return terms


def memory_fraction(model: Model, working_set_bytes: int) -> float:
    """The fraction of a call's bytes that streams from memory (``Model.at_call``): 0 up to ``memory_bytes``."""
    if model.memory_bytes is None or working_set_bytes <= model.memory_bytes:
        return 0.0
    return 1.0 - model.memory_bytes / working_set_bytes


def _add(into: dict, terms: Mapping[str, float], k: float = 1.0) -> None:
    for name, c in terms.items():
        if c:
            into[name] = into.get(name, 0.0) + k * c


def call_terms(model: Model, calls: Calls, p: Point) -> dict[str, float]:
    """The terms of the rank the current model finds slowest (as ``predict`` takes the slowest rank's time)."""
    summaries, ws = calls.summaries(p), calls.working_set(p)
    times = summary_times(model.at_call(ws), summaries, calls.topology, calls.itemsize)
    rank = int(np.argmax(times))
    terms = {"call_overhead": 1.0}
    for k, shape in summaries[rank]:
        _add(terms, round_terms(model, shape, rank, calls.topology, calls.itemsize, ws), k)
    if any(shape.window for _, shape in summaries[rank]):
        _add(terms, {"fence": 1.0})
    return terms


# -- fitting --------------------------------------------------------------------------------------------
def nonnegative_lstsq(a: np.ndarray, y: np.ndarray) -> np.ndarray:
    """Least squares with every coefficient >= 0: refit without the most negative one until none is."""
    x = np.zeros(a.shape[1])
    free = list(range(a.shape[1]))
    while free:
        sol = np.linalg.lstsq(a[:, free], y, rcond=None)[0]
        if sol.min() >= 0:
            x[free] = sol
            break
        free.pop(int(np.argmin(sol)))
    return x


def fit_terms(calls: Calls, start: Model, iterations: int = 6) -> tuple[Model, float]:
    """Every parameter that some call depends on, fitted on ``calls`` from ``start`` (its crossovers kept).

    Each link's alpha stays the ping-pong's: every communicating round pays its slowest message's
    alpha and the executor's ``overhead`` together, so the calls cannot tell them apart. Returns the
    model and its training loss (the mean squared relative error). A parameter no call depends on
    (a window's fence where no schedule uses a window) keeps its value in ``start``.
    """
    if not calls.points:
        raise ValueError("fit_terms: no measured calls to fit")
    model = start
    seconds = np.array([p.seconds for p in calls.points])                              # (P,)
    for _ in range(iterations):
        rows = [call_terms(model, calls, p) for p in calls.points]
        values = params_of(model)
        fixed = np.array([sum(c * values[n] for n, c in r.items() if n.startswith("alpha:")) for r in rows])  # (P,)
        names = [n for n in param_names(list(model.links))
                 if not n.startswith("alpha:") and any(r.get(n) for r in rows)]
        a = np.array([[r.get(n, 0.0) for n in names] for r in rows]) / seconds[:, None]   # (P, K), relative
        x = nonnegative_lstsq(a, 1.0 - fixed / seconds)
        fitted = with_params(model, dict(zip(names, x.tolist())))
        if fitted == model:
            break
        model = fitted
    return model, loss(model, calls)


def loss(model: Model, calls: Calls) -> float:
    return float(np.mean([(calls.predict(model, p) / p.seconds - 1) ** 2 for p in calls.points]))


def outliers(model: Model, calls: Calls, trim: float) -> list[bool]:
    """Whether each call is one ``model`` misses by more than ``trim`` and by more than 4 times the median
    miss: a call that stalled (a loopback TCP exchange that waits out a timer), not one the terms price."""
    misses = np.abs([calls.predict(model, p) / p.seconds - 1 for p in calls.points])
    return list(misses > max(trim, 4 * float(np.median(misses))))


def fit_trimmed(calls: Calls, start: Model, trim: float | None = None) -> tuple[Model, float]:
    """``fit_terms``; with ``trim``, fitted again without its ``outliers`` (the loss then over the calls kept),
    so that a few calls no term explains do not bend every parameter towards them."""
    model, err = fit_terms(calls, start)
    if trim is None:
        return model, err
    out = outliers(model, calls, trim)
    if not any(out) or len(out) - sum(out) < len(out) // 2:     # nothing to set aside, or too much
        return model, err
    kept = calls.subset([not o for o in out])
    model, _ = fit_terms(kept, model)
    return model, loss(model, kept)


def crossover_candidates(calls: Calls, factor: int = 4, smallest: int = 16 << 10) -> list[int | None]:
    """None (one regime) and sizes from ``smallest`` by ``factor`` below the largest call's bytes."""
    largest = max(p.nbytes for p in calls.points)
    out: list[int | None] = [None]
    size = smallest
    while size < largest:
        out.append(size)
        size *= factor
    return out


def memory_candidates(calls: Calls, smallest: int = 8 << 20) -> list[int | None]:
    """None (every call in cache) and node working sets from ``smallest`` by 2 below the largest call's."""
    largest = max(calls.working_set(p) for p in calls.points)
    out: list[int | None] = [None]
    size = smallest
    while size < largest:
        out.append(size)
        size *= 2
    return out


def fit(calls: Calls, start: Model, candidates: Sequence[int | None] | None = None,
        memory: Sequence[int | None] | None = (None,), trim: float | None = None) -> Model:
    """``fit_terms`` at every combination of crossovers; the one of least training loss.

    The intra-node link shares ``cache_bytes``: its messages are copies through shared memory, and
    leave the cache where reductions and copies do. Each other tier gets its own crossover (a
    network's protocol changes at message sizes of its own). ``memory``: the candidates of
    ``memory_bytes`` (None there: ``memory_candidates``), where reductions, copies and the intra-node
    link's copies start to stream from memory. ``trim``: each combination fitted by ``fit_trimmed``. Each is
    fitted with a round that only sends paying the link's latency and without (``Model.eager_sends``: whether the
    calls' sends complete before their receivers have them).
    """
    candidates = crossover_candidates(calls) if candidates is None else list(candidates)
    memory = memory_candidates(calls) if memory is None else list(memory)
    start = dataclasses.replace(start, window_as_messages=False)   # priced as the executor runs them
    others = [t for t in start.links if t != INTRA]
    best: tuple[Model, float] | None = None
    for combo in _product([[False, True], list(memory), candidates] + [candidates] * len(others)):
        eager, combo = combo[0], combo[1:]
        far = dict(zip(others, combo[2:])) | ({INTRA: combo[1]} if INTRA in start.links else {})
        model, err = fit_trimmed(calls, with_crossovers(dataclasses.replace(start, eager_sends=eager), combo[1], far,
                                                        combo[0], [INTRA]), trim)
        if best is None or err < best[1]:
            best = (model, err)
    assert best is not None, "no crossover candidates"   # one combo at least: candidates is never empty
    return best[0]


def _product(lists):
    if not lists:
        return [()]
    return [(x,) + rest for x in lists[0] for rest in _product(lists[1:])]


# -- held out -------------------------------------------------------------------------------------------
def halves(points: Sequence[Point]) -> list[int]:
    """0 or 1 for each point: the place of its size among its collective's sizes (sorted), even or odd."""
    sizes: dict[str, set[int]] = {}
    for p in points:
        sizes.setdefault(p.collective, set()).add(p.nbytes)
    place = {c: {s: i for i, s in enumerate(sorted(v))} for c, v in sizes.items()}
    return [place[p.collective][p.nbytes] % 2 for p in points]


def heldout(calls: Calls, start: Model, candidates: Sequence[int | None] | None = None,
            memory: Sequence[int | None] | None = (None,), trim: float | None = None) -> tuple[list[dict], list[Model]]:
    """Each point predicted by the model fitted on the other half of the sizes.

    Returns ``([{collective, algorithm, size_bytes, measured_us, predicted_us, error, fitted_on}], [model of half 0,
    model of half 1])``; ``error`` is predicted / measured - 1, ``fitted_on`` the half whose fit predicted it.
    """
    half = halves(calls.points)
    if len(set(half)) < 2:
        raise ValueError("heldout: the points have one size per collective; holding half of the sizes out needs two")
    models = [fit(calls.subset([h == k for h in half]), start, candidates, memory, trim) for k in (0, 1)]
    out = []
    for p, h in zip(calls.points, half):
        predicted = calls.predict(models[1 - h], p)
        out.append({"collective": p.collective, "algorithm": p.algorithm, "size_bytes": p.nbytes,
                    "measured_us": p.seconds * 1e6, "predicted_us": predicted * 1e6,
                    "error": predicted / p.seconds - 1, "fitted_on": 1 - h})
    return out, models


def error_stats(errors: Sequence[float], target: float = TARGET) -> dict:
    """``{count, median, p90, max, within}`` of the absolute relative errors (``within``: the fraction <= target)."""
    e = np.abs(np.asarray(errors, dtype=np.float64))
    if len(e) == 0:
        return {"count": 0, "median": None, "p90": None, "max": None, "within": None, "target": target}
    return {"count": int(len(e)), "median": float(np.median(e)), "p90": float(np.percentile(e, 90)),
            "max": float(e.max()), "within": float(np.mean(e <= target)), "target": target}


def between(records: Sequence[dict]) -> list[bool]:
    """For each of ``heldout``'s records: whether its size lies between the smallest and the largest size of the half
    whose fit predicted it (an interpolation), or beyond them (an extrapolation: with sizes placed alternately, the
    half without a collective's largest size predicts that size beyond its own)."""
    sizes: dict[str, set[int]] = {}
    for r in records:
        sizes.setdefault(r["collective"], set()).add(r["size_bytes"])
    spans = {}
    for c, v in sizes.items():
        ordered = sorted(v)
        spans[c] = {k: (ordered[k], ordered[k::2][-1]) if len(ordered) > k else None for k in (0, 1)}
    inside = []
    for r in records:
        span = spans[r["collective"]][r["fitted_on"]]
        inside.append(span is not None and span[0] < r["size_bytes"] < span[1])
    return inside


def summarize(records: Sequence[dict], from_bytes: int = FROM_BYTES, target: float = TARGET) -> dict:
    """Error statistics of ``records`` (``heldout``'s) over all sizes, from ``from_bytes`` up, per half fitted on
    (from ``from_bytes`` up), split into sizes between and beyond those of the fit that predicted them (``between``;
    from ``from_bytes`` up) and per size; where records carry their ``spread`` (the point's own noise), the
    statistics of the quiet points (spread <= ``QUIET``) from ``from_bytes`` up, and every miss (error beyond
    ``target``) there beside its spread."""
    inside = between(records)
    split = {k: error_stats([r["error"] for r, i in zip(records, inside) if i is k and r["size_bytes"] >= from_bytes])
             for k in (True, False)}
    big = [r for r in records if r["size_bytes"] >= from_bytes]
    sizes = sorted({r["size_bytes"] for r in records})
    quiet = [r for r in big if r.get("spread") is not None and r["spread"] <= QUIET]
    misses = [{k: r.get(k) for k in ("collective", "algorithm", "size_bytes", "error", "spread")}
              for r in big if abs(r["error"]) > target]
    return {"all": error_stats([r["error"] for r in records]),
            "from_bytes": from_bytes, "from": error_stats([r["error"] for r in big]),
            "quiet": error_stats([r["error"] for r in quiet]), "quiet_spread": QUIET, "misses": misses,
            "by_half": {str(k): error_stats([r["error"] for r in big if r["fitted_on"] == k]) for k in (0, 1)},
            "between": split[True], "beyond": split[False],
            "by_size": {str(s): error_stats([r["error"] for r in records if r["size_bytes"] == s]) for s in sizes}}
