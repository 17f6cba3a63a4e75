"""Requests of the non-blocking calls: ``test()`` advances the schedule, ``wait()`` returns the result.

A Request dropped before it completes (no reference left, ``wait()`` never called) is not freed: MPI may still
read and write its buffers (freeing them crashed the process or corrupted its heap), and its peers may wait on its
messages. Its ``__del__`` hands it to ``dropped``, its runner's list, which moves it at the runner's next calls and
completes it in ``free()`` (runner.py), with a ResourceWarning that names it.
"""
from __future__ import annotations

import itertools
import warnings

from mpi4py import MPI

from .abort import collective_failed


_MADE = itertools.count()


class Request:
    """A collective or message in flight; ``wait()`` returns its result once, ``test()`` says if it is done."""

    def __init__(self, run, finish, dropped: list | None = None, label: str = ""):
        self.made = next(_MADE)   # the order Requests were made in: a runner's calls start in call order
        self._run, self._finish = run, finish
        self._result, self._finished = None, False
        self._dropped, self.label = dropped, label   # where it goes if dropped in flight; what it is
        self.raised = False   # its test() or wait() raised: its error told, never moved again

    @classmethod
    def of_mpi(cls, mpi_request, finish, watch=None, label: str = "", rank: int = 0,
               dropped: list | None = None, with_status: bool = False, inside: str = "the collective",
               keep=None, track=None) -> "Request":
        """A Request over one MPI request; ``watch`` (PYCOLLECT_TIMEOUT) makes ``wait()`` poll to a deadline.
        ``label`` and ``rank`` name the call in the message if MPI fails it (the job then ends, engine/abort.py).
        ``with_status``: ``finish`` takes the completed request's ``MPI.Status`` (a receive's byte count);
        ``inside``: what the failure message says failed (a message is no collective). ``keep``: the buffers MPI
        reads or writes until the request completes, held until then: mpi4py holds none of a non-blocking
        collective's, and a temporary one (the contiguous copy of a strided input) freed as the call returned was
        read by MPI after it was reused (wrong results, no error). ``track``: a set (weak) the run joins while in
        flight (``Runner.native``: free() completes MPI's own calls before it frees their communicator)."""
        run = (_MpiRun(mpi_request, label, rank, inside, keep) if watch is None
               else _WatchedMpiRun(mpi_request, label, rank, watch, inside, keep))
        if track is not None:
            track.add(run)
        return cls(run, (lambda: finish(run.status)) if with_status else finish, dropped, label)

    def __del__(self):
        # No reference left while in flight: kept alive on the runner's list (module docstring), never freed here
        if not self._finished and self._dropped is not None:
            self._dropped.append(self)
            if self.raised:
                return
            try:
                warnings.warn(f"pycollect: the Request of {self.label or 'a call'} was dropped before it completed; "
                              "it completes at the communicator's next calls or free(). wait() for every Request",
                              ResourceWarning, stacklevel=2)
            except Exception:  # noqa: BLE001 (interpreter shutdown: warnings may be gone)
                pass

    @classmethod
    def completed(cls, value) -> "Request":
        req = cls(None, None)
        req._result, req._finished = value, True
        return req

    def then(self, after) -> "Request":
        """A Request for ``after(result)``, called once this one completes (by ``test()`` or ``wait()``)."""
        return Request(_Chained(self), lambda: after(self.wait()), self._dropped, self.label)

    def test(self) -> bool:
        """Advance without blocking; True once the result is ready."""
        try:
            if not self._finished and self._run.test():
                self._complete()
        except BaseException:
            self.raised = True
            raise
        return self._finished

    def wait(self):
        """Block until done and return the result (None for sends)."""
        try:
            if not self._finished:
                self._run.wait()
                self._complete()
        except BaseException:
            self.raised = True
            raise
        return self._result

    def _complete(self) -> None:
        self._result, self._finished = self._finish(), True
        self._run = self._finish = None


class _Chained:
    """Another Request driven as the run of a Request (``Request.then``)."""

    def __init__(self, request: Request):
        self.request = request

    def test(self) -> bool:
        return self.request.test()

    def wait(self) -> None:
        self.request.wait()


class _MpiRun:
    def __init__(self, req, label: str, rank: int, inside: str = "the collective", keep=None):
        self.req, self.label, self.rank, self.inside = req, label, rank, inside
        self.status = MPI.Status()   # filled on completion
        self.keep = keep             # the buffers MPI uses while in flight (Request.of_mpi), let go with the run

    def test(self) -> bool:
        try:
            return self.req.Test(self.status)
        except MPI.Exception as e:
            collective_failed(self.label, self.rank, e, self.inside)

    def wait(self) -> None:
        try:
            self.req.Wait(self.status)
        except MPI.Exception as e:
            collective_failed(self.label, self.rank, e, self.inside)


class _WatchedMpiRun(_MpiRun):
    """One MPI request under the watchdog (``watchdog.Watch``)."""

    def __init__(self, req, label: str, rank: int, watch, inside: str = "the collective", keep=None):
        super().__init__(req, label, rank, inside, keep)
        self.watch = watch
        self.lost = False   # its wait raised: Runner.complete_native passes it by

    def test(self) -> bool:
        done = super().test()
        if done:
            self.watch.end()
        return done

    def wait(self) -> None:
        try:
            self.watch.wait([self.req], statuses=[self.status])
        except BaseException:   # timed out (abort off) or interrupted: left to MPI, never waited again (free())
            self.lost = True
            raise
        self.watch.end()


def wait_all(requests) -> list:
    """Wait for every request and return their results in order."""
    return [r.wait() for r in requests]
