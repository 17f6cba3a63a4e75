"""Hierarchical allreduce: reduce inside each node, allreduce across nodes, spread inside each node.

Inter-node links are the slow tier, so only one node-sum of each element crosses them.

Uniform nodes (M nodes of L ranks), n elements; elements sent per rank, by tier:
  intra-node: 2(L-1)/L * n      (ring reduce-scatter + ring allgather over the node's L blocks)
  inter-node: 2(M-1)/M * n/L    (ring allreduce of block i among the M ranks of local rank i)
A flat ring (``allreduce_ring``) instead pushes 2(N-1)/N * n over each of its M node crossings.

Nodes of different sizes (leaders variant), node of k ranks:
  intra-node: 3(k-1)/k * n on the leader (lowest rank; its scatter), 2(k-1)/k * n + n/k on the others
  inter-node: 2(M-1)/M * n per leader, nothing on the others.

One node is a ring allreduce; one rank per node is a ring across nodes.
"""
from __future__ import annotations

from ..engine.layout import even_ranges, split_even
from ..engine.schedule import Copy, Problem, Recv, Round, Schedule, Send, Slice
from ..engine.summary import AWAY, MATE, RankClasses, Shape, ring_phases, sent_written
from . import _ring


def schedule(p: Problem) -> Schedule:
    if p.size == 1 or p.n == 0:
        return Schedule((Round(pre=(Copy(Slice("in", 0, p.n), Slice("out", 0, p.n)),)),))
    topo = p.topology
    if topo.is_uniform:
        return Schedule(tuple(_uniform(p)))
    return Schedule(tuple(_leaders(p)))


def _uniform(p: Problem) -> list[Round]:
    topo = p.topology
    node, local = topo.node_of[p.rank], topo.local_rank(p.rank)
    group = topo.nodes[node]                     # this node's L ranks, in rank order
    ranges = even_ranges(0, p.n, len(group))     # block i is local rank i's
    # (1) node reduce-scatter: block `local` ends holding the node's sum in "out".
    rounds = _ring.reduce_scatter(local, group, ranges, "in", "out")
    # (2) block `local` allreduced among local rank `local` of every node (one rank a node,
    # so every hop is inter-node). With L == 1 step 1 did nothing and the data is still in "in".
    peers = [g[local] for g in topo.nodes]
    sub = even_ranges(*ranges[local], len(peers))
    src = "out" if len(group) > 1 else "in"
    rounds += _ring.reduce_scatter(node, peers, sub, src, "out")
    rounds += _ring.allgather(node, peers, sub, "out")
    # (3) node allgather: every local rank now holds its block of the global result.
    rounds += _ring.allgather(local, group, ranges, "out")
    return rounds


def _leaders(p: Problem) -> list[Round]:
    topo = p.topology
    node, local = topo.node_of[p.rank], topo.local_rank(p.rank)
    group = topo.nodes[node]
    k, leader = len(group), group[0]
    ranges = even_ranges(0, p.n, k)
    # (1) node reduce-scatter, then one gather round: the leader holds the node's sum in "out".
    # Scatter-gather rather than a chain: each rank sends about n, not the leader receiving (k-1)n.
    rounds = _ring.reduce_scatter(local, group, ranges, "in", "out")
    if k > 1:
        if local == 0:
            rounds.append(Round(recvs=tuple(Recv(r, Slice("out", *ranges[j])) for j, r in enumerate(group) if j)))
        else:
            rounds.append(Round(sends=(Send(leader, Slice("out", *ranges[local])),)))
    # (2) ring allreduce among the leaders, one per node; a lone rank's data is still in "in".
    if local == 0:
        leaders = [g[0] for g in topo.nodes]
        lranges = even_ranges(0, p.n, len(leaders))
        src = "out" if k > 1 else "in"
        rounds += _ring.reduce_scatter(node, leaders, lranges, src, "out")
        rounds += _ring.allgather(node, leaders, lranges, "out")
    # (3) the leader scatters block j to local rank j, then the node allgathers: a broadcast
    # costing the leader (k-1)/k n rather than (k-1) n.
    if k > 1:
        if local == 0:
            rounds.append(Round(sends=tuple(Send(r, Slice("out", *ranges[j])) for j, r in enumerate(group) if j)))
        else:
            rounds.append(Round(recvs=(Recv(leader, Slice("out", *ranges[local])),)))
        rounds += _ring.allgather(local, group, ranges, "out")
    return rounds


def summaries(p: Problem):
    """Every rank's rounds counted without building them (engine/summary.py), on uniform nodes: the three
    ring phases of ``_uniform``, each visiting every block of its ring but one. A rank's class: the kinds of
    round of each phase (its ring neighbours in the node are node-mates, those across nodes on other nodes).
    Uneven nodes: None (walked)."""
    topo = p.topology
    if p.size == 1 or p.n == 0 or not topo.is_uniform:
        return None
    width = len(topo.nodes[0])
    in_node = ring_phases(split_even(p.n, width))    # block i is local rank i's
    phases = across_phases(p) if topo.num_nodes > 1 else lambda r: ((), ())
    classes, local_ranks = RankClasses(topo), topo.local_ranks
    lengths = split_even(p.n, width)
    for r in range(p.size):
        local = local_ranks[r]
        inside = (in_node(local), in_node(local + 1)) if width > 1 else ((), ())
        classes.add(r, (inside, phases(r), _first(lengths, local) if width > 1 else across_first(p, r)),
                    _class_rounds, counted=True)
    return classes


def _first(lengths, pos: int) -> tuple[int, int]:
    """The round of a ring reduce-scatter at ``pos`` that sends the caller's input, its first: ``(sent, received)``."""
    return lengths[pos - 1], lengths[pos - 2]


def across_first(p: Problem, r: int) -> tuple[int, int]:
    """``_first`` of rank r's ring across nodes on uniform nodes of one rank (the sub-blocks of the whole vector)."""
    return _first(split_even(p.n, p.topology.num_nodes), p.topology.node_of[r])


def counts(p: Problem):
    """``summaries`` on any nodes, for what reads a rank's rounds but not the round it finishes in (the traffic, the
    cost model's time). Uneven nodes run ``_leaders``: a rank's class is its node's size k and its local rank, and
    for a leader the kinds of its rounds in the ring across nodes (every leaders' block but one, ``ring_phases``);
    its rounds are the node's ring reduce-scatter, the gather to the leader, the leaders' ring allreduce, the
    leader's scatter and the node's ring allgather. (Leaders of smaller nodes reach their ring earlier and wait in
    it, so the round a rank finishes in is the walk's to tell: ``summaries`` declines.) One rank, an empty vector:
    None (walked)."""
    topo = p.topology
    if p.size == 1 or p.n == 0 or topo.is_uniform:
        return summaries(p)
    in_node: dict = {}                                              # node size k -> its ring's kinds of round
    across = ring_phases(split_even(p.n, topo.num_nodes))           # block i is node i's leader's
    classes, local_ranks, node_of = RankClasses(topo), topo.local_ranks, topo.node_of
    for r in range(p.size):
        node, local = node_of[r], local_ranks[r]
        k = len(topo.nodes[node])
        phases = in_node.get(k)
        if phases is None:
            phases = in_node[k] = ring_phases(split_even(p.n, k))
        leads = (across(node), across(node + 1)) if local == 0 and topo.num_nodes > 1 else None
        lengths = split_even(p.n, k if k > 1 else topo.num_nodes)   # the ring it starts in: its node's, or the leaders'
        classes.add(r, (split_even(p.n, k) if k > 1 else (), local, phases(local), phases(local + 1), leads,
                        _first(lengths, local if k > 1 else node)), _leader_rounds, counted=True)
    return classes


def _leader_rounds(key) -> tuple:
    """``_leaders`` counted: the node's reduce-scatter, gather, the leaders' ring, scatter, the node's allgather."""
    lengths, local, reduced, gathered, leads, first = key
    to_leader: tuple = ()
    from_leader: tuple = ()
    if lengths and local == 0:
        to_leader = ((1, Shape(recvs=tuple((MATE, n, False) for n in lengths[1:]))),)
        from_leader = ((1, sent_written(Shape(sends=tuple((MATE, n) for n in lengths[1:])))),)
    elif lengths:
        to_leader = ((1, sent_written(Shape(sends=((MATE, lengths[local]),)))),)
        from_leader = ((1, Shape(recvs=((MATE, lengths[local], False),))),)
    inside = bool(lengths)
    ring: tuple = ()
    if leads:   # the leaders' ring sends the caller's input first where the node has no ring of its own
        ring = (_ring.counted(leads[0], AWAY, AWAY, True) if inside else
                _ring.counted_from(first, leads[0], AWAY, AWAY, True)) + _ring.counted(leads[1], AWAY, AWAY, False)
    return ((_ring.counted_from(first, reduced, MATE, MATE, True) if inside else ()) + to_leader + ring + from_leader
            + (_ring.counted(gathered, MATE, MATE, False) if inside else ()))


def _class_rounds(key) -> tuple:
    """Reduce-scatter in the node, the ring allreduce across nodes, allgather in the node."""
    (reduced, gathered), (across_reduced, across_gathered), first = key   # first: the round sending the input
    inside = (_ring.counted_from(first, reduced, MATE, MATE, True) if reduced else ()) \
        + (_ring.counted(across_reduced, AWAY, AWAY, True) if reduced else
           _ring.counted_from(first, across_reduced, AWAY, AWAY, True))
    return inside + _ring.counted(across_gathered, AWAY, AWAY, False) + _ring.counted(gathered, MATE, MATE, False)


def across_phases(p: Problem):
    """``phases(r)``: the kinds of rank r's rounds in step (2) on uniform nodes of more than one, ``(reduce-scatter,
    allgather)`` as ``ring_phases`` counts them (every sub-block of its local block but one)."""
    topo = p.topology
    lengths = split_even(p.n, len(topo.nodes[0]))
    subs: dict = {}                               # the sub-blocks of a block of each length

    def phases(r: int) -> tuple:
        node, length = topo.node_of[r], lengths[topo.local_rank(r)]
        sub = subs.get(length)
        if sub is None:
            sub = subs[length] = ring_phases(split_even(length, topo.num_nodes))
        return sub(node), sub(node + 1)
    return phases
