"""Bruck all-to-all: ceil(log2 N) rounds of one packed message each, for any N.

Latency-optimal for small blocks at the price of forwarding: a block travels once per
set bit of its distance. Slot j of rank r starts as r's block for r+j; round k sends
every slot with bit k set to r+2^k, so after all rounds slot j holds r-j's block for r.

The rotations are done by addressing rather than copying: a slot is packed straight
from ``in`` the first time it moves, and written to ``out`` only in the last round's
post (after every read of ``in``, so in-place calls are safe). Between moves a slot
lives in its own fixed region of tmp, sized for the largest block it ever holds there.
"""
from __future__ import annotations

import numpy as np

from ..engine.layout import ceil_log2, offsets
from ..engine.schedule import Copy, Problem, Recv, Round, Schedule, Send, Slice
from ..engine.summary import AWAY, IDLE, MATE, RankClasses, all_written, waits
from . import _alltoall


def _held(p: Problem, j: int, k: int) -> int:
    """Elements in slot j of this rank before round k: from r - (j mod 2^k) to that origin + j."""
    origin = (p.rank - (j & ((1 << k) - 1))) % p.size
    return p.matrix[origin][(origin + j) % p.size]


def _lay(lengths: list[int], base: int) -> list[Slice]:
    """Pieces of the given lengths end to end in tmp from ``base``."""
    ends = offsets(lengths)
    return [Slice("tmp", base + a, base + b) for a, b in zip(ends, ends[1:])]


def _copies(pairs) -> tuple[Copy, ...]:
    """Copies for ``(src, dst)`` pairs, empty ones dropped."""
    return tuple(Copy(a, b) for a, b in pairs if a.n)


def schedule(p: Problem) -> Schedule:
    r, size = p.rank, p.size
    send, recv, own = _alltoall.layout(p)
    if size == 1:
        return Schedule((Round(pre=(own,)),))
    steps = ceil_log2(size)
    slots = range(1, size)  # slot 0 never moves: it is the own copy
    held = [[_held(p, j, k) for j in range(size)] for k in range(steps + 1)]  # (steps+1, N)
    moves = [[j for j in slots if j >> k & 1] for k in range(steps)]
    # Slot j rests in tmp after every round but the last that moves it; room for the largest.
    cap = [max([held[k + 1][j] for k in range(steps - 1) if j >> k & 1], default=0) for j in range(size)]
    starts = offsets(cap)
    home = [Slice("tmp", a, a) for a in starts[:size]]  # start of each slot's region
    outbox = starts[size]  # then the packed message to send, then the one received
    inbox = outbox + max(sum(held[k][j] for j in moves[k]) for k in range(steps))
    at = {j: Slice("in", *send[(r + j) % size]) for j in slots}  # where slot j's data is now
    final = {j: Slice("out", *recv[(r - j) % size]) for j in slots}  # r-j's block for r
    rounds, late = [], [(own.src, own.dst)]  # own first: it reads in, the other late copies only tmp
    for k, moved in enumerate(moves):
        last = k == steps - 1
        packed = _lay([held[k][j] for j in moved], outbox)
        unpacked = _lay([held[k + 1][j] for j in moved], inbox)
        pre = _copies(zip([at[j] for j in moved], packed))
        for j in moved:  # where each arriving slot rests: out only in the last round
            at[j] = final[j] if last else home[j].sub(0, held[k + 1][j])
            if not last and k == j.bit_length() - 1:  # its last move: to out at the end
                late.append((at[j], final[j]))
        post = _copies(zip(unpacked, [at[j] for j in moved]))
        msg = Slice("tmp", outbox, packed[-1].stop)
        got = Slice("tmp", inbox, unpacked[-1].stop)
        rounds.append(Round(sends=(Send((r + (1 << k)) % size, msg),) if msg.n else (),
                            recvs=(Recv((r - (1 << k)) % size, got),) if got.n else (),
                            pre=pre, post=_copies(late) + post if last else post))
    tmp = inbox + max(sum(held[k + 1][j] for j in moves[k]) for k in range(steps))
    return Schedule(tuple(x for x in rounds if x.communicates or x.pre or x.post), tmp=tmp)


def summaries(p: Problem):
    """Every rank's rounds counted without building them (engine/summary.py), where every rank sends the same
    counts (``matrix[i][j] = c[j]``, as ``shapes.even_problem`` builds it): round k packs the slots with bit k set
    from where they lie, sends them to r+2^k, receives as many slots from r-2^k and unpacks them; the last round
    also copies out the rank's own block and the slots whose last move came earlier (those below 2^(steps-1)). An
    empty message is left out and a round that moves nothing dropped, as ``schedule`` does: that rank runs ahead
    until a receive waits for its sender, the rounds it waits counted IDLE before it (``summary.waits``). A rank's
    class: the tiers of its two peers, its sizes and waits each round. Anything else: None (walked)."""
    size, matrix = p.size, p.matrix
    if size == 1 or len(matrix) != size or not _alltoall.same_rows(matrix):
        return None
    c, steps = matrix[0], ceil_log2(size)
    sent, got = moved_sizes(c)                                 # (steps, N) each
    ranks = np.arange(size)
    idle = waits(sent, got, [(ranks - (1 << k)) % size for k in range(steps)])
    late = [v << (steps - 1) for v in c]   # the own block and the slots below 2^(steps-1), r's own size each

    def rounds(key):
        tiers, sizes, own, wait = key
        out: list = []
        for k, ((to, frm), (gone, came), w) in enumerate(zip(tiers, sizes, wait)):
            out += [IDLE] * w
            out.append((((to, gone),) if gone else (), ((frm, came, False),) if came else (),
                        gone + came + (own if k == steps - 1 else 0)))
        return out
    classes, node_of = RankClasses(p.topology), p.topology.node_of
    for r in range(size):
        home = node_of[r]   # classes.where of both peers, inline: N log N of them
        key = (tuple((MATE if node_of[(r + (1 << k)) % size] == home else AWAY,
                      MATE if node_of[(r - (1 << k)) % size] == home else AWAY) for k in range(steps)),
               tuple(zip(sent[:, r].tolist(), got[:, r].tolist())), late[r], tuple(idle[:, r].tolist()))
        classes.add(r, key, lambda key: all_written(rounds(key)))   # every round sends slots packed into tmp
    return classes


def in_step(p: Problem) -> bool:
    """Whether the counted form keeps every rank's round t with its peers' round t (the cluster simulator's
    lockstep): no block empty, so that no rank has a round that moves nothing (registry.counted_summaries)."""
    return all(all(row) for row in p.matrix)


def moved_sizes(c) -> tuple[np.ndarray, np.ndarray]:
    """``(sent, got)``, each (steps, N): the elements rank r sends and receives in round k, every rank sending
    ``c[j]`` to rank j. Slot j holds r + (j with its low k bits cleared)'s block for the rank that far on, so round k
    sends, for each run of 2^k slots whose bit k is set, 2^k blocks of one size, and receives the blocks of the
    run's sources one bit further on: per round a strided sum over the ranks' counts (``_strided``), O(N log N)."""
    size, steps = len(c), ceil_log2(len(c))
    cr = np.asarray(c, dtype=np.int64)
    sent, got = np.zeros((steps, size), dtype=np.int64), np.zeros((steps, size), dtype=np.int64)
    for k in range(steps):
        run, stride = 1 << k, 2 << k
        for out, first, upto in ((sent, run, size), (got, 0, size - run)):
            # runs start at first, first + stride, ... below upto: slots [start + run - first, ...) of the run
            out[k] = run * _strided(cr, first, stride, upto)
            last = first + (-(-(upto - first) // stride) - 1) * stride      # the last run's start
            short = (last + stride - first) - size if first == 0 else last + run - size
            if short > 0:   # the last run passes N-1: fewer slots in it
                out[k] -= short * np.roll(cr, -last)
    return sent, got


def _strided(cr: np.ndarray, first: int, stride: int, upto: int) -> np.ndarray:
    """For every rank r: the sum of ``cr[(r + b) % N]`` over b = first, first + stride, ... below ``upto``."""
    size = len(cr)
    terms = -(-(upto - first) // stride)
    if terms <= 0:
        return np.zeros(size, dtype=np.int64)
    length = -(-2 * size // stride) * stride + stride
    padded = np.zeros(length, dtype=np.int64)
    padded[:2 * size] = np.concatenate((cr, cr))
    sums = padded.reshape(-1, stride).cumsum(axis=0).ravel()   # sums[x]: padded[x] + padded[x - stride] + ...
    r = np.arange(size)
    below = r + first - stride
    return sums[r + first + (terms - 1) * stride] - np.where(below >= 0, sums[np.maximum(below, 0)], 0)
