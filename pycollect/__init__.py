"""pycollect: MPI collectives for NumPy and CuPy arrays, written as schedules.

    import pycollect as pc
    comm = pc.Communicator()
    y = comm.allreduce(x)
"""
from ._version import __version__  # noqa: F401 (pc.__version__)
from .algorithms import algorithms
from .comm import Communicator, detect_topology
from .engine.errors import CollectiveError, CollectiveMismatchError, CollectiveTimeout
from .engine.request import Request, wait_all
from .engine.topology import Topology
from .traffic import traffic
from . import nn, parallel, optim, models, moe, zero  # noqa: E402  (the model layer: pc.nn, pc.parallel, pc.models.GPT, pc.moe, pc.zero)

__all__ = ["Communicator", "CollectiveError", "CollectiveMismatchError", "CollectiveTimeout", "Request", "Topology",
           "algorithms", "detect_topology", "models", "moe", "nn", "optim", "parallel", "traffic", "wait_all", "zero"]
