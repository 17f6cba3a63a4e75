"""Every ``PYCOLLECT_*`` environment variable: its name, its meaning, and the one parser that reads it.

Each parser takes the variable's name and the environment, returns its value or the default when it
is unset, and raises ``ValueError`` in one style when it is set wrong: ``NAME must be <what it
takes>, got '<text>'``. The Communicator's settings (pycollect/settings.py) read theirs here when it
is built and agree them across ranks; the engine reads the rest where they act: the tracer when a
Communicator is built, the flight recorder's directory when one is written, CUDA-awareness at the
first call on a device array.
"""
from __future__ import annotations

import math
import os
from typing import Mapping

DEBUG = "PYCOLLECT_DEBUG"                   # 0/1: validation mode (engine/validate.py)
TIMEOUT = "PYCOLLECT_TIMEOUT"               # seconds: the watchdog (engine/watchdog.py)
TIMEOUT_ABORT = "PYCOLLECT_TIMEOUT_ABORT"   # 0/1: on a timeout raise (0) or end the job (1)
FLIGHT_DIR = "PYCOLLECT_FLIGHT_DIR"         # where flight recorders go (default: the temporary directory)
SEGMENT_BYTES = "PYCOLLECT_SEGMENT_BYTES"   # bytes a schedule's messages are cut into (0: uncut)
TREE_SEGMENT_BYTES = "PYCOLLECT_TREE_SEGMENT_BYTES"   # bytes of a segmented tree's pieces (0: one piece)
PIPELINE_BYTES = "PYCOLLECT_PIPELINE_BYTES"           # its old name, still read (with a DeprecationWarning)
TUNING = "PYCOLLECT_TUNING"                 # a tuning file (pycollect bench fit writes one)
ALGO_PREFIX = "PYCOLLECT_ALGO_"             # PYCOLLECT_ALGO_<COLLECTIVE>=name: what auto runs
TRACE = "PYCOLLECT_TRACE"                   # a directory: per-rank Chrome traces (engine/trace.py)
CUDA_AWARE = "PYCOLLECT_CUDA_AWARE"         # 0/1: whether MPI takes device pointers (default: MPI's answer)
ABORT_ON_ERROR = "PYCOLLECT_ABORT_ON_ERROR"  # 0/1: an uncaught exception on one rank ends the job (default 1)


def switch(name: str, default, meaning: str, environ: Mapping[str, str] = os.environ):
    """``0`` or ``1`` as False or True; unset or empty: ``default``."""
    text = environ.get(name)
    if not text:
        return default
    if text not in ("0", "1"):
        raise ValueError(f"{name} must be {meaning}, got {text!r}")
    return text == "1"


def nbytes(name: str, default: int, environ: Mapping[str, str] = os.environ) -> int:
    """A whole number of bytes, 0 or more; unset: ``default``."""
    text = environ.get(name)
    if text is None:
        return default
    try:
        number = int(text)
    except ValueError:
        raise ValueError(f"{name} must be an integer number of bytes, got {text!r}") from None
    if number < 0:
        raise ValueError(f"{name} must not be negative, got {number}")
    return number


def seconds(name: str, environ: Mapping[str, str] = os.environ) -> float | None:
    """A positive, finite number of seconds; unset or empty: None."""
    text = environ.get(name)
    if not text:
        return None
    try:
        value = float(text)
    except ValueError:
        value = math.nan
    if not (value > 0 and math.isfinite(value)):
        raise ValueError(f"{name} must be a number of seconds > 0, got {text!r}")
    return value


def directory(name: str, environ: Mapping[str, str] = os.environ) -> str | None:
    """A directory, made absolute; unset or empty: None."""
    text = environ.get(name)
    return os.path.abspath(text) if text else None


def path(name: str, environ: Mapping[str, str] = os.environ) -> str | None:
    """A file path as given; unset or empty: None."""
    return environ.get(name) or None


def algorithm(name: str, choices, environ: Mapping[str, str] = os.environ) -> str | None:
    """One of ``choices``; unset or empty: None."""
    text = environ.get(name)
    if not text:
        return None
    if text not in choices:
        raise ValueError(f"{name} must be one of {', '.join(choices)}, got {text!r}")
    return text



TREE_SEGMENT_BYTES_DEFAULT = 1 << 20   # a call's tree segment where the environment names none


def tree_segment_bytes(default: int = TREE_SEGMENT_BYTES_DEFAULT, environ: Mapping[str, str] = os.environ) -> int:
    """``PYCOLLECT_TREE_SEGMENT_BYTES``, else its old name ``PYCOLLECT_PIPELINE_BYTES`` (which warns), else
    ``default`` (a call's: 1 MiB)."""
    if environ.get(TREE_SEGMENT_BYTES) is None and environ.get(PIPELINE_BYTES) is not None:
        return renamed(PIPELINE_BYTES, TREE_SEGMENT_BYTES, nbytes(PIPELINE_BYTES, default, environ))
    return nbytes(TREE_SEGMENT_BYTES, default, environ)


def renamed(old: str, new: str, value):
    """``value``, given under its ``old`` name: a DeprecationWarning saying the ``new`` one ("pipeline" now names
    pipeline parallelism alone; the trees' pieces are tree segments)."""
    import warnings
    warnings.warn(f"{old} is now {new} (the segments of the tree algorithms); the old name still works",
                  DeprecationWarning, stacklevel=3)
    return value
