"""MPI's counts: how many elements one MPI call may take.

MPI 4 has large-count calls (``MPI_Send_c``, ``MPI_Allreduce_c``), which mpi4py uses where the library has them;
an MPI-3 library (Open MPI 5.0 implements MPI 3.1) takes counts and displacements as C ints, so more than
2**31-1 elements in one call fail inside MPI (``MPI_ERR_ARG`` from mpi4py's checks). pycollect's messages
(point-to-point, and a schedule's pieces) carry bytes: one past the limit goes as one element of a struct
type covering its bytes (the BigMPI way: 1 GiB blocks and the rest), which MPI-3 takes, and the receiver
counts what came with ``MPI_Get_elements`` (``MPI_Get_count`` of such a message is MPI_UNDEFINED there).
MPI's own collectives cannot be handed such a type for a reduction (MPI's predefined ops take predefined
types only), so the ``"mpi"`` algorithm is not used past the limit there (comm.py: ``auto`` runs its
fallback schedule, an explicit ``"mpi"`` is refused).
"""
from __future__ import annotations

from mpi4py import MPI

INT_MAX = 2**31 - 1

# The most elements (of any MPI type) one MPI call takes; None: no limit (an MPI-4 library). The same on every
# rank: one library serves the job. Tests lower it to run the large-count paths on small arrays.
LIMIT: int | None = None if MPI.Get_version() >= (4, 0) else INT_MAX
CHUNK = 1 << 30   # the block of a large message's type (bytes; at most LIMIT)


def too_many(count: int) -> bool:
    """Whether ``count`` elements are more than one MPI call takes here."""
    return LIMIT is not None and count > LIMIT


def message(buf):
    """A contiguous byte buffer (uint8, host or device) as mpi4py is handed it: itself, or past the limit
    ``([buf, 1, type], type)``, the type a struct of its bytes, committed; free it once the call is posted (MPI
    keeps what a posted call needs)."""
    n = buf.nbytes
    if not too_many(n):
        return buf, None
    big = _bytes_type(n)
    return [buf, 1, big], big


def _bytes_type(n: int) -> MPI.Datatype:
    """``n`` bytes as one element: ``n // chunk`` blocks of ``chunk`` bytes, then the rest."""
    assert LIMIT is not None, "only past a limit"
    chunk = min(CHUNK, LIMIT)
    blocks, rest = divmod(n, chunk)
    block = MPI.BYTE.Create_contiguous(chunk)
    try:
        lengths, displs, types = [blocks], [0], [block]
        if rest:
            lengths.append(rest)
            displs.append(blocks * chunk)
            types.append(MPI.BYTE)
        return MPI.Datatype.Create_struct(lengths, displs, types).Commit()
    finally:
        block.Free()


def received(status: MPI.Status, nbytes: int) -> int:
    """The bytes a completed receive into ``nbytes`` got (its element count where it went as one large element)."""
    return status.Get_elements(MPI.BYTE) if too_many(nbytes) else status.Get_count(MPI.BYTE)


def capped(segment: int, itemsize: int) -> int:
    """A schedule's segment (elements a message; 0: whole messages) cut so that no message passes the limit in
    bytes (a schedule's pieces go as bytes). Every rank cuts alike."""
    if LIMIT is None:
        return segment
    most = max(1, LIMIT // itemsize)
    return most if segment <= 0 else min(segment, most)
