"""The face's requests: mpi4py's ``Wait``, ``Test``, ``Get_status``, ``Free`` and the class methods over lists
(``Waitall``, ``Testall``, ``Waitany``, ``Testany``, ``Waitsome``, ``Testsome``) over pycollect's Requests."""
from __future__ import annotations

import os
from typing import Literal

from mpi4py import MPI


class Request:
    """A face call in flight. ``Wait()`` finishes it (the result is then in the caller's recvbuf), ``Test()``
    advances it without blocking and says whether it is done; ``Get_status``, ``Free``, the lower-case ``wait`` and
    ``test`` and its truth (active or not) are mpi4py's too. The class methods over lists (``Waitall``,
    ``Waitany``, ...) take face requests and mpi4py's own (an ``Isend`` through the face falls through to
    mpi4py) alike, with mpi4py's results: a request once reported complete is inactive, as MPI's become
    ``MPI.REQUEST_NULL``, and the list methods pass it over (``Waitany`` of only those: ``MPI.UNDEFINED``).

    ``MPI.Request.Waitall`` cannot finish a face request: pycollect moves a call's later rounds from
    ``Wait``/``Test`` (no thread runs them), which MPI does not know of; use this class's
    (``pc.mpi4py.Request.Waitall``, as ``MPI.Request.Waitall`` reads).
    """

    def __init__(self, started=None):
        self._started = started   # a pycollect Request, or None when already complete
        self._active = True       # False once Wait or Test reported it complete

    def Wait(self, status=None) -> Literal[True]:
        if self._started is not None:
            self._started.wait()
            self._started = None
        self._active = False
        return True

    def Test(self, status=None) -> bool:
        done = self._advance()
        if done:
            self._active = False
        return done

    def Get_status(self, status=None) -> bool:
        """Whether the call is complete, advancing it without blocking; unlike ``Test`` the request stays active
        (MPI_Request_get_status)."""
        return self._advance()

    def _advance(self) -> bool:
        """Advance the call without blocking; whether it is complete."""
        if self._started is not None and self._started.test():
            self._started.wait()   # done: returns at once, and runs what finishes the call
            self._started = None
        return self._started is None

    def Free(self) -> None:
        """Let go of the request. MPI's call goes on without it; pycollect's moves only in ``Wait`` and ``Test``,
        so this finishes the call first (its result is in recvbuf when it returns)."""
        if not self._active:   # as mpi4py's own refuses to free MPI.REQUEST_NULL ("Invalid MPI_Request")
            raise MPI.Exception(MPI.ERR_REQUEST)
        self.Wait()

    def wait(self, status=None) -> None:
        """mpi4py's lower-case form: ``Wait``, and the buffer call's object, None."""
        self.Wait(status)

    def test(self, status=None) -> tuple[bool, None]:
        """mpi4py's lower-case form: ``(Test(), None)``."""
        return self.Test(status), None

    def __bool__(self) -> bool:
        """True while active, as an mpi4py request is until it becomes MPI.REQUEST_NULL."""
        return self._active

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

    @classmethod
    def Waitany(cls, requests, status=None) -> int:
        """The index of an active request that completed, advancing them all in turn until one does;
        ``MPI.UNDEFINED`` when none is active."""
        active = _active(requests)
        while active:
            for i in active:
                if requests[i].Test():
                    return i
            os.sched_yield()   # between passes, as MPI's own waits do: a rank sharing this core gets to run
        return MPI.UNDEFINED

    @classmethod
    def Testany(cls, requests, status=None) -> tuple[int, bool]:
        """``(index, True)`` of an active request that completed on this pass, ``(MPI.UNDEFINED, False)`` when
        none did, ``(MPI.UNDEFINED, True)`` when none is active."""
        active = _active(requests)
        for i in active:
            if requests[i].Test():
                return i, True
        return MPI.UNDEFINED, not active

    @classmethod
    def Waitsome(cls, requests, statuses=None) -> list[int] | None:
        """The indices of the active requests that completed, at least one (passes until one does); None when
        none is active."""
        active = _active(requests)
        while active:
            done = [i for i in active if requests[i].Test()]
            if done:
                return done
            os.sched_yield()
        return None

    @classmethod
    def Testsome(cls, requests, statuses=None) -> list[int] | None:
        """The indices of the active requests that completed on this pass (perhaps none); None when none is
        active."""
        active = _active(requests)
        return [i for i in active if requests[i].Test()] if active else None

    def __repr__(self) -> str:
        return f"<pycollect mpi4py face Request, {'complete' if self._started is None else 'in flight'}>"


def _active(requests) -> list[int]:
    """The indices of the requests not yet reported complete (mpi4py's own: not ``MPI.REQUEST_NULL``)."""
    return [i for i, r in enumerate(requests) if (r._active if isinstance(r, Request) else r != MPI.REQUEST_NULL)]


Waitall = Request.Waitall
Testall = Request.Testall
Waitany = Request.Waitany
Testany = Request.Testany
Waitsome = Request.Waitsome
Testsome = Request.Testsome
