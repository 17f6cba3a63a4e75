"""pycollect: MPI collectives for NumPy and CuPy arrays, written as schedules.

    import pycollect as pc
    comm = pc.Communicator()
    y = comm.allreduce(x)
"""
try:  # written by setuptools-scm when the package is installed (pip install -e . included): the git tag and commit
    from ._version import version as __version__
except ImportError:   # a source tree never installed
    __version__ = "0.1.0+unknown"

try:
    from mpi4py import MPI  # noqa: F401  (loads the MPI library: fail here, saying how to get one)
except (ImportError, RuntimeError, OSError) as e:   # mpi4py's wheel without an MPI library to load
    raise ImportError(f"pycollect needs an MPI library ({e}): pip install 'pycollect-mpi[mpich]' for the MPICH "
                      f"wheel, or build mpi4py against the site MPI (README, 'On a cluster')") from e

from .algorithms import algorithms
from .comm import Communicator, detect_topology
from .engine.errors import CollectiveError, CollectiveMismatchError, CollectiveTimeout
from .engine.request import Request, wait_all
from .engine.topology import Topology
from .traffic import traffic
from . import nn, parallel, optim, models, moe, zero  # noqa: E402  (the model layer: pc.nn, pc.parallel, pc.models.GPT, pc.moe, pc.zero)

__all__ = ["Communicator", "CollectiveError", "CollectiveMismatchError", "CollectiveTimeout", "Request", "Topology",
           "algorithms", "detect_topology", "models", "moe", "nn", "optim", "parallel", "traffic", "wait_all", "zero"]
