"""The face's requests: mpi4py's ``Wait``, ``Test``, ``Waitall`` and ``Testall`` over pycollect's Requests."""
from __future__ import annotations

from typing import Literal


class Request:
    """A face call in flight. ``Wait()`` finishes it (the result is then in the caller's recvbuf), ``Test()``
    advances it without blocking and says whether it is done. ``Request.Waitall(requests)`` takes face
    requests and mpi4py's own (an ``Isend`` through the face falls through to mpi4py) alike.

    ``MPI.Request.Waitall`` cannot finish a face request: pycollect moves a call's later rounds from
    ``Wait``/``Test`` (no thread runs them), which MPI does not know of; use this class's ``Waitall``
    (``pc.mpi4py.Request.Waitall``, as ``MPI.Request.Waitall`` reads).
    """

    def __init__(self, started=None):
        self._started = started   # a pycollect Request, or None when already complete

    def Wait(self, status=None) -> Literal[True]:
        if self._started is not None:
            self._started.wait()
            self._started = None
        return True

    def Test(self, status=None) -> bool:
        if self._started is not None and self._started.test():
            self._started.wait()   # done: returns at once, and runs what finishes the call
            self._started = None
        return self._started is None

    @classmethod
    def Waitall(cls, requests, statuses=None) -> Literal[True]:
        """Wait for every request, in order (pycollect's calls complete in call order anyway)."""
        for request in requests:
            request.Wait()
        return True

    @classmethod
    def Testall(cls, requests, statuses=None) -> bool:
        """Advance every request once; True when all are done."""
        return all([request.Test() for request in requests])

    def __repr__(self) -> str:
        return f"<pycollect mpi4py face Request, {'complete' if self._started is None else 'in flight'}>"


Waitall = Request.Waitall
Testall = Request.Testall
