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
from ..costmodel import Model, summary_times

INTRA = "intra-node"
TARGET = 0.25            # the error a prediction should stay within
FROM_BYTES = 32 << 10    # where the target starts: below it a call is its fixed costs, timed to a few us


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

    def predict(self, model: Model, p: Point) -> float:
        return max(summary_times(model, self.summaries(p), self.topology, self.itemsize))


# -- the model as a vector of parameters ----------------------------------------------------------------
def param_names(tiers: Sequence[str]) -> list[str]:
    per_tier = [f"{name}:{t}" for t in tiers for name in ("alpha", "beta", "beta_far", "beta_shared")]
    return per_tier + ["gamma", "gamma_far", "copy", "copy_far", "overhead", "fence", "call_overhead"]


def params_of(model: Model) -> dict[str, float]:
    """Every parameter's value; a far rate that is None (the same as near) is its near rate."""
    out = {}
    for t, k in model.links.items():
        out.update({f"alpha:{t}": k.alpha, f"beta:{t}": k.beta, f"beta_far:{t}": _or(k.beta_far, k.beta),
                    f"beta_shared:{t}": k.beta_shared})
    return out | {"gamma": model.gamma, "gamma_far": _or(model.gamma_far, model.gamma), "copy": model.copy,
                  "copy_far": _or(model.copy_far, model.copy), "overhead": model.overhead, "fence": model.fence,
                  "call_overhead": model.call_overhead}


def _or(value, default):
    return default if value is None else value


def with_params(model: Model, values: Mapping[str, float]) -> Model:
    """``model`` with the parameters named in ``values`` replaced (crossovers kept)."""
    v = params_of(model) | dict(values)
    links = {t: dataclasses.replace(k, alpha=v[f"alpha:{t}"], beta=v[f"beta:{t}"],
                                    beta_far=v[f"beta_far:{t}"] if k.far_bytes is not None else None,
                                    beta_shared=v[f"beta_shared:{t}"])
             for t, k in model.links.items()}
    far = model.cache_bytes is not None
    return dataclasses.replace(model, links=links, gamma=v["gamma"], gamma_far=v["gamma_far"] if far else None,
                               copy=v["copy"], copy_far=v["copy_far"] if far else None, overhead=v["overhead"],
                               fence=v["fence"], call_overhead=v["call_overhead"])


def with_crossovers(model: Model, cache_bytes: int | None, far_bytes: Mapping[str, int | None]) -> Model:
    """``model`` with its crossovers set; a far rate starts equal to its near rate."""
    links = {t: dataclasses.replace(k, beta_far=None if far_bytes.get(t) is None else _or(k.beta_far, k.beta),
                                    far_bytes=far_bytes.get(t)) for t, k in model.links.items()}
    far = cache_bytes is not None
    return dataclasses.replace(model, links=links, cache_bytes=cache_bytes,
                               gamma_far=_or(model.gamma_far, model.gamma) if far else None,
                               copy_far=_or(model.copy_far, model.copy) if far else None)


# -- a prediction as terms . params ---------------------------------------------------------------------
def _split(nbytes: float, limit: int | None) -> tuple[float, float]:
    """``(bytes at the near rate, bytes at the far rate)``."""
    if limit is None or nbytes <= limit:
        return nbytes, 0.0
    return float(limit), nbytes - limit


def round_terms(model: Model, shape: Shape, rank: int, topology: Topology, itemsize: int) -> dict[str, float]:
    """The round's time as coefficients of the parameters: ``round_time == sum(terms[k] * params[k])``.

    The slowest message is the one the current model finds slowest (ties: the first listed, as
    ``round_time``'s ``max`` keeps it); every other term is linear already."""
    terms: dict[str, float] = {}
    if shape.window and not model.window_as_messages:      # costmodel.window_round_time
        for _, n, reduces in shape.recvs:
            near, far = _split(n * itemsize, model.cache_bytes)
            _add(terms, {"gamma": near, "gamma_far": far} if reduces else {"copy": near, "copy_far": far})
        for copied in (shape.copied, shape.published):
            near, far = _split(copied * itemsize, model.cache_bytes)
            _add(terms, {"copy": near, "copy_far": far})
        _add(terms, {"overhead": 1.0, "fence": 1.0})
        return terms
    messages = [(topology.tier(rank, peer), n * itemsize)
                for peer, n in [(peer, n) for peer, n in shape.sends] + [(peer, n) for peer, n, _ in shape.recvs]]
    if messages:
        first_slowest = max(range(len(messages)), key=lambda i: model.link(messages[i][0]).time(messages[i][1]))
        tier, nbytes = messages[first_slowest]
        near, far = _split(nbytes, model.links[tier].far_bytes)
        _add(terms, {f"alpha:{tier}": 1.0, f"beta:{tier}": near, f"beta_far:{tier}": far})
        for i, (other, b) in enumerate(messages):
            if i != first_slowest:
                _add(terms, {f"beta_shared:{other}": float(b)})
    for _, n, reduces in shape.recvs:
        if reduces:
            near, far = _split(n * itemsize, model.cache_bytes)
            _add(terms, {"gamma": near, "gamma_far": far})
    for copied in (shape.copied, shape.published):
        if copied:
            near, far = _split(copied * itemsize, model.cache_bytes)
            _add(terms, {"copy": near, "copy_far": far})
    if shape.communicates:
        _add(terms, {"overhead": 1.0, "fence": 1.0 if shape.window else 0.0})
    return terms


def _add(into: dict, terms: Mapping[str, float], k: float = 1.0) -> None:
    for name, c in terms.items():
        if c:
            into[name] = into.get(name, 0.0) + k * c


def call_terms(model: Model, calls: Calls, p: Point) -> dict[str, float]:
    """The terms of the rank the current model finds slowest (as ``predict`` takes the slowest rank's time)."""
    summaries = calls.summaries(p)
    times = summary_times(model, summaries, calls.topology, calls.itemsize)
    rank = int(np.argmax(times))
    terms = {"call_overhead": 1.0}
    for k, shape in summaries[rank]:
        _add(terms, round_terms(model, shape, rank, calls.topology, calls.itemsize), k)
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


def crossover_candidates(calls: Calls, factor: int = 4, smallest: int = 16 << 10) -> list[int | None]:
    """None (one regime) and sizes from ``smallest`` by ``factor`` below the largest call's bytes."""
    largest = max(p.nbytes for p in calls.points)
    out: list[int | None] = [None]
    size = smallest
    while size < largest:
        out.append(size)
        size *= factor
    return out


def fit(calls: Calls, start: Model, candidates: Sequence[int | None] | None = None) -> Model:
    """``fit_terms`` at every combination of crossovers; the one of least training loss.

    The intra-node link shares ``cache_bytes``: its messages are copies through shared memory, and
    leave the cache where reductions and copies do. Each other tier gets its own crossover (a
    network's protocol changes at message sizes of its own).
    """
    candidates = crossover_candidates(calls) if candidates is None else list(candidates)
    start = dataclasses.replace(start, window_as_messages=False)   # priced as the executor runs them
    others = [t for t in start.links if t != INTRA]
    best: tuple[Model, float] | None = None
    for combo in _product([candidates] * (1 + len(others))):
        far = dict(zip(others, combo[1:])) | ({INTRA: combo[0]} if INTRA in start.links else {})
        model, err = fit_terms(calls, with_crossovers(start, combo[0], far))
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


def heldout(calls: Calls, start: Model, candidates: Sequence[int | None] | None = None) -> tuple[list[dict], list[Model]]:
    """Each point predicted by the model fitted on the other half of the sizes.

    Returns ``([{collective, algorithm, size_bytes, measured_us, predicted_us, error, fitted_on}], [model of half 0,
    model of half 1])``; ``error`` is predicted / measured - 1, ``fitted_on`` the half whose fit predicted it.
    """
    half = halves(calls.points)
    if len(set(half)) < 2:
        raise ValueError("heldout: the points have one size per collective; holding half of the sizes out needs two")
    models = [fit(calls.subset([h == k for h in half]), start, candidates) for k in (0, 1)]
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


def summarize(records: Sequence[dict], from_bytes: int = FROM_BYTES) -> dict:
    """Error statistics of ``records`` (``heldout``'s) over all sizes, from ``from_bytes`` up, per half fitted on
    (from ``from_bytes`` up) and per size."""
    big = [r for r in records if r["size_bytes"] >= from_bytes]
    sizes = sorted({r["size_bytes"] for r in records})
    return {"all": error_stats([r["error"] for r in records]),
            "from_bytes": from_bytes, "from": error_stats([r["error"] for r in big]),
            "by_half": {str(k): error_stats([r["error"] for r in big if r["fitted_on"] == k]) for k in (0, 1)},
            "by_size": {str(s): error_stats([r["error"] for r in records if r["size_bytes"] == s]) for s in sizes}}
