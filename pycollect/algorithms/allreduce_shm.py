"""Shared-memory allreduce: each block reduced once, by its owner, straight out of its peers' windows.

One node: round 1, every rank publishes its input and reduces its block (an even split) from
every peer's window into ``out``. Round 2: it publishes that reduced block after the input
(window elements ``n`` on, so nothing a peer may still read in round 1 is overwritten) and
copies every other reduced block out of its owner's window. Every rank's ``out`` holds the same
sums. Where a rank's ``out`` lies in shared memory too (``Communicator.shared_empty``), round 1's
owners write each reduced block straight into it and round 2 has nothing to do for it (``puts``):
with inputs and results all there, each block is read once and written once into every ``out``.

Several nodes of L ranks each (uniform): the hierarchical allreduce (allreduce_hierarchical)
with its two intra-node phases as those two window rounds inside each node: round 1 reduces
the node's sum of local block i on local rank i, a ring allreduce of that block among the
local ranks i of every node crosses the nodes (messages), and round 2 spreads the blocks inside
each node. Without windows (device buffers, nodes that cannot share memory, uneven nodes,
one rank a node) it is the ring allreduce.
"""
from __future__ import annotations

from dataclasses import replace

from ..engine.layout import even_ranges
from ..engine.schedule import Problem, Schedule, Slice
from ..engine.summary import AWAY, MATE, RankClasses, Shape, shape_of
from . import _ring, _window, allreduce_hierarchical, allreduce_ring


def _windowed(p: Problem) -> bool:
    topo = p.topology
    return p.windows and p.size > 1 and p.n > 0 and (topo.num_nodes == 1 or (topo.is_uniform and p.size > topo.num_nodes))


def schedule(p: Problem) -> Schedule:
    if not _windowed(p):
        return allreduce_ring.schedule(p)
    topo = p.topology
    node = topo.node_of[p.rank]
    group = list(topo.nodes[node])               # this node's ranks; block j is group[j]'s
    ranges = even_ranges(0, p.n, len(group))
    local = group.index(p.rank)
    mine = Slice("out", *ranges[local])
    one_node = topo.num_nodes == 1   # puts the sums (across nodes round 1 has a node's partial sum)
    rounds = [_window.reduce_scatter_round(p.rank, ranges, mine, group, puts=one_node)]
    if topo.num_nodes > 1:                       # block `local` allreduced among local rank `local` of every node
        peers = [g[local] for g in topo.nodes]
        sub = even_ranges(*ranges[local], len(peers))
        rounds += _ring.reduce_scatter(node, peers, sub, "out", "out")
        rounds += _ring.allgather(node, peers, sub, "out")
    rounds.append(_window.allgather_round(p.rank, ranges, p.n, group, puts=one_node))
    block = ranges[0][1] - ranges[0][0]   # the largest block (even_ranges puts the longer ones first)
    return Schedule(tuple(rounds), win=p.n + block, lends=True)


def summaries(p: Problem):
    """Without windows, the ring's counted form. With them on several nodes, every rank's two window rounds
    (O(L) each) around the hierarchical allreduce's counted ring across nodes; on one node, the window rounds by
    the size of a rank's own block (``_window.one_node_classes``).

    A rank's class is its two window rounds and the kinds of its ring rounds, with stand-ins for its peers
    (``RankClasses``): every peer of a window round is a node-mate, every peer of the ring on another node. Ranks
    of a node with equal blocks then share one summary (the node's first rank another), which the counting
    walks once a node."""
    if not _windowed(p):
        return allreduce_ring.summaries(p)
    if p.topology.num_nodes == 1:   # classes by the size of a rank's own block
        return _window.one_node_classes(p, schedule, [b - a for a, b in even_ranges(0, p.n, p.size)])
    phases, classes, topo = allreduce_hierarchical.across_phases(p), RankClasses(p.topology), p.topology
    seen: dict = {}   # (node size, local rank) -> its two window rounds, peers as MATE
    for r in range(p.size):
        where = (len(topo.nodes[topo.node_of[r]]), topo.local_rank(r))
        windows = seen.get(where)
        if windows is None:   # built once a class, from its first rank
            windows = seen[where] = tuple(_as_mates(shape_of(rnd)) for rnd in window_rounds(p, r))
        classes.add(r, (windows, *phases(r)), _class_rounds, counted=True)
    return classes


def _class_rounds(key) -> tuple:
    """A class's rounds, the ring's as its kinds counted (``_ring.counted``), peers as MATE and AWAY."""
    (first, last), reduced, gathered = key
    return ((1, first),) + _ring.counted(reduced, AWAY, AWAY, True) + _ring.counted(gathered, AWAY, AWAY, False) + \
        ((1, last),)


def _as_mates(shape: Shape) -> Shape:
    return replace(shape, sends=tuple((MATE, n) for _, n in shape.sends),
                   recvs=tuple((MATE, n, red) for _, n, red in shape.recvs))


def window_rounds(p: Problem, rank: int):
    """Rank ``rank``'s two window rounds (first and last), built without the ring between them."""
    topo = p.topology
    group = list(topo.nodes[topo.node_of[rank]])
    ranges = even_ranges(0, p.n, len(group))
    mine = Slice("out", *ranges[group.index(rank)])
    return (_window.reduce_scatter_round(rank, ranges, mine, group), _window.allgather_round(rank, ranges, p.n, group))
