"""Ending the job from inside a collective: the one way pycollect aborts, and nothing follows it.

A rank that cannot finish a collective it has started (its messages do not pair up with the
other ranks', MPI raised in the middle of a schedule, the watchdog's deadline passed) must not
leave the others waiting, and must not hand anything back to its caller. MPICH's ``MPI_Abort``
may return for some milliseconds before the launcher kills the job, long enough for a caller to
go on with a half-filled buffer, so every abort ends this process itself right after.
"""
from __future__ import annotations

import os
import sys
import threading
import time
from typing import NoReturn

from mpi4py import MPI

from . import environment


GRACE_S = 0.2   # between the message and the abort: the launcher forwards it, other ranks write theirs


def end_job(message: str, code: int = 1, grace: float = GRACE_S) -> NoReturn:
    """Write ``pycollect: message`` to stderr, abort every rank of the job, end this process: never returns.

    ``grace`` seconds pass between the message and the abort (the launcher may otherwise end the job
    before it forwards the message; other ranks that found the same fault write theirs).
    """
    try:
        sys.stdout.flush()
        _tell(f"pycollect: {message}\n")
        if grace > 0:
            time.sleep(grace)
    finally:
        try:
            MPI.COMM_WORLD.Abort(code)   # looked up now: the world of this process, whatever wraps it
        finally:
            os._exit(code)


def _tell(line: str) -> None:
    """``line`` on ``sys.stderr``, and on the process's own stderr where something replaced it (pytest's capture, a
    notebook's stream): the process ends right after, and a replacement's buffer would end with it unread."""
    own = sys.__stderr__
    for stream in [sys.stderr] + ([own] if own is not None and own is not sys.stderr else []):
        try:
            stream.write(line)
            stream.flush()
        except Exception:  # noqa: BLE001 (a closed or broken stream: the other may still reach someone)
            pass


def collective_failed(call: str, rank: int, error: BaseException | str, inside: str = "the collective") -> NoReturn:
    """An exception (or a description of the failure) inside a started collective ``call``, e.g.
    ``allreduce #3 (ring)`` (or ``inside`` another MPI call: a message): end the job, naming both."""
    what = error if isinstance(error, str) else f"{type(error).__name__}: {error}"
    text = " ".join(what.split())   # MPICH's error stacks span lines
    end_job(f"rank {rank}: {call} failed inside {inside}: {text}; aborting the job so that no rank waits "
            f"for this one")


def _end_job_after(previous):
    """An excepthook: ``previous`` (the traceback, as Python prints it), then the job ended for every rank."""
    def hook(kind, value, tb):
        try:
            previous(kind, value, tb)
        finally:
            if MPI.Is_initialized() and not MPI.Is_finalized() and MPI.COMM_WORLD.Get_size() > 1:
                end_job(f"rank {MPI.COMM_WORLD.Get_rank()}: the program ended with an uncaught {kind.__name__} "
                        f"(above); aborting the job so that no rank waits for this one "
                        f"({environment.ABORT_ON_ERROR}=0 leaves it to the launcher)")
    hook.pycollect_ends_job = True   # type: ignore[attr-defined]
    return hook


def _end_job_after_thread(previous):
    """A ``threading.excepthook``: ``previous`` (the thread's traceback), then the job ended for every rank. A thread
    that ends with an uncaught error may have been the one that calls pycollect (its peers then wait in their next
    call for ever, as for the main thread's); SystemExit, which ends a thread quietly, is left alone."""
    def hook(args):
        try:
            previous(args)
        finally:
            if args.exc_type is not SystemExit and MPI.Is_initialized() and not MPI.Is_finalized() \
                    and MPI.COMM_WORLD.Get_size() > 1:
                name = "a thread" if args.thread is None else f"thread {args.thread.name!r}"
                end_job(f"rank {MPI.COMM_WORLD.Get_rank()}: {name} ended with an uncaught {args.exc_type.__name__} "
                        f"(above); aborting the job so that no rank waits for this one "
                        f"({environment.ABORT_ON_ERROR}=0 leaves it to the launcher)")
    hook.pycollect_ends_job = True   # type: ignore[attr-defined]
    return hook


def abort_on_error(environ=os.environ) -> bool:
    """``PYCOLLECT_ABORT_ON_ERROR``: whether ``end_job_on_uncaught_errors`` installs its hook (default yes)."""
    return bool(environment.switch(environment.ABORT_ON_ERROR, True, "0 or 1", environ))


def end_job_on_uncaught_errors_from_now() -> None:
    """``end_job_on_uncaught_errors`` as pycollect's MPI names load (comm.py's import: ``pc.Communicator`` and the
    rest), unless ``PYCOLLECT_ABORT_ON_ERROR`` says no; a bad value there is left to the first Communicator, which
    raises it on every rank. From the load, not from the first Communicator: a rank whose first Communicator
    raised alone (a misspelt keyword, which Python refuses before any agreement) ended without the hook, and the
    others waited in their Communicator's first collective until the launcher's time limit."""
    try:
        wanted = abort_on_error()
    except ValueError:
        return
    if wanted:
        end_job_on_uncaught_errors()


def end_job_on_uncaught_errors() -> None:
    """From pycollect's MPI names' load on: in a job of several ranks, an exception that ends this rank's program
    (uncaught, at the top) ends the job, as ``python -m mpi4py`` does. Without it the other ranks wait in their
    next collective for ever (MPI_Finalize at exit waits too): the usual way a rank's own argument error, or a
    bug on one rank, hangs a job until the launcher's time limit. comm.py's import and every Communicator call
    it unless ``PYCOLLECT_ABORT_ON_ERROR=0`` (``abort_on_error``). Installed once; an excepthook the program sets later
    replaces it. Likewise ``threading.excepthook``: an uncaught error that ends a thread other than the main one."""
    if not getattr(sys.excepthook, "pycollect_ends_job", False):
        sys.excepthook = _end_job_after(sys.excepthook)
    if not getattr(threading.excepthook, "pycollect_ends_job", False):
        threading.excepthook = _end_job_after_thread(threading.excepthook)
