"""An mpi4py-compatible face: an mpi4py program switches to pycollect's algorithms in one line.

    from mpi4py import MPI
    import pycollect as pc
    comm = pc.mpi4py(MPI.COMM_WORLD)     # was: comm = MPI.COMM_WORLD
    comm.Allreduce(x, y, op=MPI.SUM)     # y written in place, as by mpi4py

buffers.py reads mpi4py's buffer specifications into arrays, reductions.py MPI's ops into pycollect's,
face.py routes each upper-case collective to the Communicator's, requests.py is the I-forms' Request.
"""
from .face import Face
from .requests import Request, Testall, Testany, Testsome, Waitall, Waitany, Waitsome

__all__ = ["Face", "Request", "Testall", "Testany", "Testsome", "Waitall", "Waitany", "Waitsome"]
