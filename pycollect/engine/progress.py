"""Waiting on MPI requests by polling: so that a wait can end at a deadline, and can look around while it waits.

Both the watchdog's deadline (engine/watchdog.py) and the search for a stray message of a call
that already ended on this rank (engine/pairing.py) need a wait that MPI does not block in.
Polling yields the core between tests (as MPI's own waits do) and, after a few milliseconds,
sleeps between them, which matters when ranks outnumber cores.
"""
from __future__ import annotations

import os
import time

from mpi4py import MPI

SPIN_S = 0.005       # poll without pause this long, then
NAP_S = 0.0002       # pause this long between polls (ranks may outnumber cores)
LOOK_S = 0.01        # between two calls of ``look`` while a wait lasts


def poll(requests, timeout: float | None = None, statuses=None, look=None, nap: float = NAP_S) -> float | None:
    """Test ``requests`` until all complete (None) or ``timeout`` seconds pass (the seconds waited).

    ``statuses`` (one ``MPI.Status`` per request) are filled when all complete, and say which
    requests failed when MPI raises. ``look()`` runs every ``LOOK_S`` seconds of waiting (it may
    end the job); a wait that completes at once never calls it. ``nap`` 0: never sleep (a transport that
    moves bytes only while MPI is called, such as TCP between nodes, stalls for every nap).
    """
    testall = MPI.Request.Testall
    if testall(requests, statuses):
        return None
    start = time.monotonic()
    deadline = start + timeout if timeout is not None else float("inf")
    spin, glance = start + SPIN_S, start + LOOK_S
    while not testall(requests, statuses):
        now = time.monotonic()
        if now >= deadline:
            return now - start
        if look is not None and now >= glance:
            look()
            glance = now + LOOK_S
        if nap and now > spin:
            time.sleep(nap)
        else:
            os.sched_yield()  # as MPI's own waits do: a peer sharing this core gets to run
    return None


def reported(statuses, error: MPI.Exception) -> str:
    """What MPI said went wrong: the requests' own errors, else the exception's."""
    codes = {st.Get_error() for st in statuses} - {MPI.SUCCESS, MPI.ERR_PENDING}
    text = "; ".join(sorted(MPI.Get_error_string(c) for c in codes)) or str(error)
    return " ".join(text.split())   # MPICH's error stacks span lines: one line here
