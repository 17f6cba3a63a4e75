"""Which node each rank lives on, the tier of any pair, and a ring order that crosses nodes least."""
from __future__ import annotations

import operator
from dataclasses import dataclass
from functools import cached_property

SELF, INTRA, INTER = "self", "intra-node", "inter-node"
TIERS = (SELF, INTRA, INTER)


@dataclass(frozen=True)
class Topology:
    """``node_of[r]`` is the node index of rank ``r``; nodes are numbered by their lowest rank."""

    node_of: tuple[int, ...]

    def __post_init__(self):
        try:   # any sequence of integers, kept as a tuple of ints: hashable, as the caches of schedules need
            node_of = tuple(operator.index(node) for node in self.node_of)
        except TypeError:
            raise TypeError(f"Topology: node_of must be a sequence of integers (each rank's node), got "
                            f"{self.node_of!r}") from None
        object.__setattr__(self, "node_of", node_of)
        if not self.node_of:
            raise ValueError("Topology: node_of must name at least one rank")
        top = -1                 # the highest node so far: a node first seen must be the next number
        for node in self.node_of:
            if not 0 <= node <= top + 1:
                raise ValueError(f"Topology: nodes must be numbered 0.. in order of their lowest rank, got {self.node_of}")
            top = max(top, node)

    @classmethod
    def single_node(cls, size: int) -> "Topology":
        return cls((0,) * size)

    @classmethod
    def uniform(cls, size: int, ranks_per_node: int, by_block: bool = True) -> "Topology":
        """``size`` ranks on nodes of ``ranks_per_node``: blocks (0,1),(2,3) or round robin (0,2),(1,3). Round robin
        deals the ranks over as many nodes as blocks would fill (``ceil(size / ranks_per_node)``), as MPICH's cliques
        do, so that nodes there may hold fewer: 4 ranks by 3 are nodes (0, 2), (1, 3)."""
        if ranks_per_node <= 0:
            raise ValueError(f"Topology.uniform: ranks_per_node must be positive, got {ranks_per_node}")
        if by_block:
            return cls(tuple(r // ranks_per_node for r in range(size)))
        nodes = -(-size // ranks_per_node)
        return cls(tuple(r % nodes for r in range(size)))

    @classmethod
    def from_labels(cls, labels) -> "Topology":
        """From any per-rank node label (for example each node's lowest world rank)."""
        index: dict = {}
        return cls(tuple(index.setdefault(label, len(index)) for label in labels))

    @property
    def size(self) -> int:
        return len(self.node_of)

    @cached_property
    def nodes(self) -> tuple[tuple[int, ...], ...]:
        """The ranks of each node, in rank order."""
        groups: list[list[int]] = [[] for _ in range(max(self.node_of) + 1)]
        for rank, node in enumerate(self.node_of):
            groups[node].append(rank)
        return tuple(tuple(g) for g in groups)

    @property
    def num_nodes(self) -> int:
        return len(self.nodes)

    @property
    def node_sizes(self) -> tuple[int, ...]:
        return tuple(len(g) for g in self.nodes)

    @property
    def ranks_per_node(self) -> int:
        """Ranks on the largest node (all nodes have this many when ``uniform`` is true)."""
        return max(self.node_sizes)

    @property
    def is_uniform(self) -> bool:
        return len(set(self.node_sizes)) == 1

    def local_rank(self, rank: int) -> int:
        return self.local_ranks[rank]

    @cached_property
    def local_ranks(self) -> tuple[int, ...]:
        """``local_ranks[r]``: rank r's index among its node's ranks (in rank order)."""
        local = [0] * self.size
        for group in self.nodes:
            for i, r in enumerate(group):
                local[r] = i
        return tuple(local)

    def tier(self, a: int, b: int) -> str:
        if a == b:
            return SELF
        return INTRA if self.node_of[a] == self.node_of[b] else INTER

    @cached_property
    def ring_order(self) -> tuple[int, ...]:
        """Ranks grouped node by node, so a ring crosses a node boundary once per node."""
        return tuple(r for group in self.nodes for r in group)

    @cached_property
    def ring_position(self) -> tuple[int, ...]:
        """``ring_position[r]``: where rank r sits in ``ring_order`` (one lookup, not a search, at any scale)."""
        pos = [0] * self.size
        for i, r in enumerate(self.ring_order):
            pos[r] = i
        return tuple(pos)

    def describe(self) -> str:
        """"8 ranks on 2 node(s) of 4 ranks"; on uneven nodes every node's size."""
        sizes = self.ranks_per_node if self.is_uniform else self.node_sizes   # not 2048 equal sizes at scale
        return f"{self.size} ranks on {self.num_nodes} node(s) of {sizes} ranks"
