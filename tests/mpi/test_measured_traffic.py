"""What a call hands MPI, counted at MPI's door, against what ``pc.traffic`` says the same call sends.

``pc.traffic`` walks (or counts by class) the schedules without MPI; a call runs them through the runner's Plan and
executor (and, at two ranks, the allreduce's, reduce-scatter's and allgather's exchanges straight on MPI). Here
every Isend, Irecv and Sendrecv a call posts is counted by peer on each rank (a stand-in for the runner's MPI
communicator) and compared with ``pc.traffic`` for the Communicator's own topology: bytes and messages sent and
received per rank, sent per tier. So the traffic the tools report is the traffic that runs, on one node and on the
simulated two-node topologies (the test's name carries "topology" for their ``-k``).
"""
import itertools
from collections import Counter

import numpy as np
import pytest

import pycollect as pc
from helpers import verdicts
from pycollect.algorithms import registry
from pycollect.engine.layout import split_even

TREE_SEGMENT_BYTES = 256   # small enough that the segmented trees pipeline at these sizes


class _Counting:
    """The runner's MPI communicator, its point-to-point posts counted by peer: bytes (``sent``, ``received``) and
    messages (``sent_messages``, ``received_messages``)."""

    def __init__(self, inner):
        self.inner = inner
        self.sent, self.received = Counter(), Counter()
        self.sent_messages, self.received_messages = Counter(), Counter()

    def __getattr__(self, name):
        return getattr(self.inner, name)

    def Isend(self, buf, dest, tag):
        self.sent[dest] += memoryview(buf).nbytes
        self.sent_messages[dest] += 1
        return self.inner.Isend(buf, dest, tag)

    def Irecv(self, buf, source, tag):
        self.received[source] += memoryview(buf).nbytes
        self.received_messages[source] += 1
        return self.inner.Irecv(buf, source, tag)

    def Sendrecv(self, sendbuf, dest, sendtag, recvbuf, source, recvtag, status=None):
        """The exchanges at two ranks (engine/lean_exchange.py)."""
        self.sent[dest] += memoryview(sendbuf).nbytes
        self.sent_messages[dest] += 1
        self.received[source] += memoryview(recvbuf).nbytes
        self.received_messages[source] += 1
        return self.inner.Sendrecv(sendbuf, dest, sendtag, recvbuf, source, recvtag, status)


def _run(c, collective, algorithm, n, root, in_place):
    """One call of ``n`` elements in all (pc.traffic's ``nbytes`` / 4), split as ``even_problem`` splits them; in
    place where the collective has that form (README) and ``in_place``."""
    r, p = c.rank, c.size
    counts = split_even(n, p)
    start = sum(counts[:r])
    f = np.float32
    if collective == "allreduce":
        x = np.ones(n, f)
        return c.allreduce(x, algorithm=algorithm, out=x if in_place else None)
    if collective == "reduce_scatter":
        x = np.ones(n, f)
        return c.reduce_scatter(x, counts=counts, algorithm=algorithm,
                                out=x[start:start + counts[r]] if in_place else None)
    if collective == "allgather":
        out = np.ones(n, f)
        return c.allgather(out[start:start + counts[r]] if in_place else np.ones(counts[r], f), counts=counts,
                           algorithm=algorithm, out=out if in_place else None)
    if collective == "alltoall":
        return c.alltoall(np.ones(n, f), counts=counts, algorithm=algorithm)
    if collective == "broadcast":
        return c.broadcast(np.ones(n, f), root=root, algorithm=algorithm)
    if collective == "reduce":
        return c.reduce(np.ones(n, f), root=root, algorithm=algorithm)
    if collective == "gather":   # in place: the root's x is its block of out
        out = np.ones(n, f) if in_place and r == root else None
        x = out[start:start + counts[r]] if out is not None else np.ones(counts[r], f)
        return c.gather(x, root=root, counts=counts, algorithm=algorithm, out=out)
    if collective == "scatter":   # in place: the root's out is its block of x
        x = np.ones(n if r == root else 0, f)
        out = x[start:start + counts[r]] if in_place and r == root else None
        return c.scatter(x, root=root, counts=counts, algorithm=algorithm, out=out)
    if collective in ("scan", "exscan"):
        return getattr(c, collective)(np.ones(n, f), algorithm=algorithm)
    raise AssertionError(f"no call for {collective}")


def _cases():
    for collective in registry.COLLECTIVES:
        for algorithm in registry.schedule_algorithms(collective):
            if algorithm != "shm":   # a window round reads peers' windows: no message to count at MPI's door
                yield collective, algorithm


ROOTED = ("broadcast", "reduce", "gather", "scatter")
IN_PLACE = ("allreduce", "reduce_scatter", "allgather", "gather", "scatter")


@pytest.fixture(scope="module")
def counted(comm):
    """A Communicator whose point-to-point posts are counted (trees cut into segments of TREE_SEGMENT_BYTES)."""
    c = pc.Communicator(comm.mpi, tree_segment_bytes=TREE_SEGMENT_BYTES)
    counting = _Counting(c._runner.lib)
    c._runner.lib = counting
    yield c, counting
    c._runner.lib = counting.inner
    c.free()


def _posted(counting, topology, rank):
    """(bytes sent, received, messages sent, received, bytes sent by tier) of what was posted since the last."""
    by_tier = Counter()
    for peer, nbytes in counting.sent.items():
        by_tier[topology.tier(rank, peer)] += nbytes
    posted = (sum(counting.sent.values()), sum(counting.received.values()), sum(counting.sent_messages.values()),
              sum(counting.received_messages.values()), {t: b for t, b in by_tier.items() if b})
    for kind in (counting.sent, counting.received, counting.sent_messages, counting.received_messages):
        kind.clear()
    return posted


@pytest.mark.parametrize("collective, algorithm", list(_cases()))
def test_what_a_call_posts_is_what_pc_traffic_counts_on_this_topology(comm, counted, collective, algorithm):
    c, counting = counted
    r, p = c.rank, c.size
    sizes = sorted({0, p - 1, 3 * p + 1, 100 * p + 7})
    roots = sorted({0, p - 1}) if collective in ROOTED else [0]
    with verdicts(comm) as check:
        for n, root, in_place in itertools.product(sizes, roots, (False, True) if collective in IN_PLACE else [False]):
            _posted(counting, c.topology, r)
            _run(c, collective, algorithm, n, root, in_place)
            posted = _posted(counting, c.topology, r)
            said = pc.traffic(collective, algorithm, p, 4 * n, topology=c.topology, root=root,
                              tree_segment_bytes=TREE_SEGMENT_BYTES).per_rank[r]
            claimed = (said.bytes_sent, said.bytes_recv, said.messages_sent, said.messages_recv,
                       {t: b for t, b in said.sent_by_tier.items() if b})
            check(posted == claimed, f"{collective} {algorithm} n={n} root={root} in place {in_place}: posted (bytes "
                                     f"sent, received, messages sent, received, sent by tier) {posted}, pc.traffic "
                                     f"{claimed}")
