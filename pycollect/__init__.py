"""pycollect: MPI collectives for NumPy and CuPy arrays, written as schedules.

    import pycollect as pc
    comm = pc.Communicator()
    y = comm.allreduce(x)

Importing pycollect does not start MPI: the names that need it (``pc.Communicator``,
``pc.Request``, ``pc.parallel``, ...) load ``mpi4py.MPI`` on first use, so the planner,
``pc.traffic``, ``explain`` and the pipeline simulator run where MPI cannot start (a login node).
"""
import importlib
from typing import TYPE_CHECKING

try:  # written by setuptools-scm when the package is installed (pip install -e . included): the git tag and commit
    from ._version import version as __version__
except ImportError:   # a source tree never installed
    __version__ = "0.1.0+unknown"

from .algorithms import algorithms
from .engine.errors import CollectiveError, CollectiveMismatchError, CollectiveTimeout
from .engine.ops import Op
from .engine.topology import Topology
from .traffic import traffic   # bound here: the function, not the module pycollect.traffic

if TYPE_CHECKING:   # the names imported on first use, for type checkers (py.typed)
    from . import models, moe, nn, optim, parallel, zero
    from .comm import CartesianGrid, Communicator, detect_topology
    from .engine.request import Request, wait_all
    from .mpi4py_face import Face as mpi4py

# name -> (module, its attribute or None for the module itself, whether it needs MPI), imported on first use
_LAZY = {"Communicator": ("pycollect.comm", "Communicator", True),
         "CartesianGrid": ("pycollect.comm", "CartesianGrid", True),
         "detect_topology": ("pycollect.comm", "detect_topology", True),
         "Request": ("pycollect.engine.request", "Request", True),
         "wait_all": ("pycollect.engine.request", "wait_all", True),
         "mpi4py": ("pycollect.mpi4py_face", "Face", True),
         "parallel": ("pycollect.parallel", None, True),
         "models": ("pycollect.models", None, True),
         "zero": ("pycollect.zero", None, True),
         "nn": ("pycollect.nn", None, False),
         "optim": ("pycollect.optim", None, False),
         "moe": ("pycollect.moe", None, False)}

__all__ = ["CartesianGrid", "Communicator", "CollectiveError", "CollectiveMismatchError", "CollectiveTimeout", "Op",
           "Request", "Topology",
           "algorithms", "detect_topology", "load_mpi", "models", "moe", "mpi4py", "nn", "optim", "parallel", "traffic",
           "wait_all", "zero"]


def load_mpi():
    """``mpi4py.MPI``, loading (and, as mpi4py does on import, initialising) the MPI library on first call.

    Raises ImportError, in one line saying how to get an MPI library, where it cannot be loaded.
    """
    try:
        from mpi4py import MPI
    except (ImportError, RuntimeError, OSError) as e:   # mpi4py's wheel without an MPI library to load
        reason = " ".join(str(e).split())
        raise ImportError(f"pycollect needs an MPI library, which could not be loaded ({reason}): pip install "
                          f"'pycollect-mpi[mpich]' for the MPICH wheel, or build mpi4py against the site MPI "
                          f"(README, 'On a cluster')") from e
    return MPI


def __getattr__(name: str):
    """PEP 562: the names that need MPI (or are seldom used) are imported when first asked for."""
    if name not in _LAZY:
        raise AttributeError(f"module 'pycollect' has no attribute {name!r}")
    module, attribute, needs_mpi = _LAZY[name]
    if needs_mpi:
        load_mpi()
    value = importlib.import_module(module)
    if attribute is not None:
        value = getattr(value, attribute)
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(_LAZY))
