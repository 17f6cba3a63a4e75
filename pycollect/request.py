"""Requests of the non-blocking calls: ``test()`` advances the schedule, ``wait()`` returns the result."""
from __future__ import annotations


class Request:
    """A collective or message in flight; ``wait()`` returns its result once, ``test()`` says if it is done."""

    def __init__(self, run, finish):
        self._run, self._finish = run, finish
        self._result, self._finished = None, False

    @classmethod
    def of_mpi(cls, mpi_request, finish, watch=None) -> "Request":
        """A Request over one MPI request; ``watch`` (PYCOLLECT_TIMEOUT) makes ``wait()`` poll to a deadline."""
        return cls(_MpiRun(mpi_request) if watch is None else _WatchedMpiRun(mpi_request, watch), finish)

    @classmethod
    def completed(cls, value) -> "Request":
        req = cls(None, None)
        req._result, req._finished = value, True
        return req

    def test(self) -> bool:
        """Advance without blocking; True once the result is ready."""
        if not self._finished and self._run.test():
            self._complete()
        return self._finished

    def wait(self):
        """Block until done and return the result (None for sends)."""
        if not self._finished:
            self._run.wait()
            self._complete()
        return self._result

    def _complete(self) -> None:
        self._result, self._finished = self._finish(), True
        self._run = self._finish = None


class _MpiRun:
    def __init__(self, req):
        self.req = req

    def test(self) -> bool:
        return self.req.Test()

    def wait(self) -> None:
        self.req.Wait()


class _WatchedMpiRun(_MpiRun):
    """One MPI request under the watchdog (``watchdog.Watch``)."""

    def __init__(self, req, watch):
        super().__init__(req)
        self.watch = watch

    def test(self) -> bool:
        done = self.req.Test()
        if done:
            self.watch.end()
        return done

    def wait(self) -> None:
        self.watch.finish([self.req])


def wait_all(requests) -> list:
    """Wait for every request and return their results in order."""
    return [r.wait() for r in requests]
