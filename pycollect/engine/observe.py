"""What follows a call without changing it: one small interface for the tracer, the flight recorder and recordings.

The runner (pycollect/runner.py) calls an observer at four points of every call it runs:

- ``before(call)``: the call as the caller made it, once (a recording logs it here);
- ``start(call, rounds)``: what runs it is known: MPI's own collective (``rounds`` None) or a schedule of
  ``rounds`` rounds (the tracer opens a span, the watchdog enters the call in its flight recorder);
- ``round(call, index, rnd, times)``: round ``index`` of the schedule ended; ``times`` are ``MPI.Wtime()`` at
  its start, when its messages were posted, when they completed, and at its end;
- ``after(call)``: the result is ready (blocking: before it is returned; non-blocking: when the Request completes).

A call whose schedule fails ends the job (engine/abort.py), so ``after`` is not called for it. Observers are
attached to a Runner in one place; with none attached the runner holds None and makes one check per call.
"""
from __future__ import annotations


class Observer:
    """Each hook does nothing unless a subclass says otherwise."""

    def before(self, call) -> None:
        pass

    def start(self, call, rounds: int | None) -> None:
        pass

    def round(self, call, index: int, rnd, times: tuple[float, float, float, float]) -> None:
        pass

    def after(self, call) -> None:
        pass


class Observers(Observer):
    """Several observers as one, called in the order they were attached."""

    def __init__(self, observers: tuple[Observer, ...]):
        self.observers = observers

    def before(self, call) -> None:
        for o in self.observers:
            o.before(call)

    def start(self, call, rounds: int | None) -> None:
        for o in self.observers:
            o.start(call, rounds)

    def round(self, call, index: int, rnd, times: tuple[float, float, float, float]) -> None:
        for o in self.observers:
            o.round(call, index, rnd, times)

    def after(self, call) -> None:
        for o in self.observers:
            o.after(call)


def joined(observers: tuple[Observer, ...]) -> Observers | None:
    """``observers`` as one, or None when there are none (the runner's one check)."""
    return Observers(observers) if observers else None
