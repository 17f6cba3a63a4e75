"""A 2-D heat equation by Jacobi iteration, on pycollect and on plain mpi4py, timed in the same run.

Run under MPI, for example::

    OMP_NUM_THREADS=1 mpiexec -n 2 python bench/apps/heat.py --grid 1024

The steady state of the heat equation on the global ``(R, C)`` cells, the top boundary held at 1 and the
other three at 0, by Jacobi iteration: each step every cell becomes the mean of its four neighbours.
The cells are split over ``MPI.Compute_dims(size, 2)`` ranks with one ghost layer; a step starts the
halo exchange, updates the interior (cells whose stencil reads no ghost) while it is in flight, waits,
then updates the ring of cells next to the ghosts. Every ``--every`` steps the largest change of a
cell in the last step is allreduced (``max``) and the run stops below ``--tol`` or at ``--max-steps``.

Every cell is computed by the same expression in the same order whatever the split, and ``max`` does
not depend on the order of reduction, so the result is the single-process one bit for bit, on any
number of ranks, for both implementations. ``--impl both`` (the default) runs pycollect's and
mpi4py's solves a block of ``--every`` steps at a time, in turn, and writes per-step times (median
and best over blocks, the slowest rank's), steps, final residual and their largest difference as
JSON (bench/README.md, "Applications"). After the timed blocks each implementation's final cells,
steps and residual are checked bit for bit against a single-process solve (``reference``, on rank
0, up to ``--reference-cells`` cells) and against each other's; a difference is printed as FAILED,
named in the summary's ``failed``, leaves the ratios null and makes the exit status 1 on every rank.
"""
from __future__ import annotations

import sys

import numpy as np

from grid2d import Check, interior_and_ring, parser, run

HOT = 1.0     # the top boundary; the other three are 0


def initial(block) -> np.ndarray:
    """This rank's ``(r + 2, c + 2)`` block: zeros, the top ghost row HOT where it is the global boundary."""
    u = np.zeros((block.own[0] + 2, block.own[1] + 2))
    if block.edges()[0]:
        u[0, :] = HOT
    return u


def relax(u, new, box: tuple[int, int, int, int]) -> None:
    """``new`` over ``box`` (``(r0, r1, c0, c1)``): the mean of each cell's four neighbours in ``u``, summed
    up, down, left, right (a fixed order: the same bits whichever box a cell falls in)."""
    r0, r1, c0, c1 = box
    new[r0:r1, c0:c1] = 0.25 * (u[r0 - 1:r1 - 1, c0:c1] + u[r0 + 1:r1 + 1, c0:c1]
                                + u[r0:r1, c0 - 1:c1 - 1] + u[r0:r1, c0 + 1:c1 + 1])


def step(face, u, new) -> None:
    """One Jacobi step from ``u`` into ``new`` (both ``(r + 2, c + 2)``; ``new``'s boundary ghosts as ``u``'s):
    the halo exchange overlapped with the interior, then the ring next to the ghosts."""
    interior, ring = interior_and_ring(u.shape[0] - 2, u.shape[1] - 2)
    h = face.start_halo(u)
    relax(u, new, interior)
    h.wait()
    for box in ring:
        relax(u, new, box)


def change(u, new) -> float:
    """The largest change of an own cell in the last step, on this rank."""
    return float(np.max(np.abs(new[1:-1, 1:-1] - u[1:-1, 1:-1])))


class Heat:
    """The solve on one face: ``advance()`` runs up to ``every`` steps, then allreduces the residual."""

    def __init__(self, face, block, args):
        self.face, self.block = face, block
        self.every, self.tol, self.max_steps = args.every, args.tol, args.max_steps
        self.u = initial(block)                 # (r + 2, c + 2)
        self.new = self.u.copy()                # the boundary ghosts never change
        self.steps, self.residual, self.done = 0, float("inf"), False

    def advance(self) -> None:
        k = min(self.every, self.max_steps - self.steps)
        for i in range(k):
            step(self.face, self.u, self.new)
            if i == k - 1:
                self.residual = self.face.allreduce(change(self.u, self.new), "max")
            self.u, self.new = self.new, self.u
        self.steps += k
        self.done = self.residual < self.tol or self.steps >= self.max_steps

    def own(self) -> np.ndarray:
        return self.u[1:-1, 1:-1]               # (r, c)


def reference(shape, args):
    """One process, the whole grid at once (no blocks, no halo, no MPI): ``(cells (R, C), steps, residual)``, the
    residual checked every ``--every`` steps as the solvers check it."""
    u = np.zeros((shape[0] + 2, shape[1] + 2))     # (R + 2, C + 2) with the boundary
    u[0, :] = HOT
    new, steps = u.copy(), 0
    while True:
        k = min(args.every, args.max_steps - steps)
        for _ in range(k):
            new[1:-1, 1:-1] = 0.25 * (u[:-2, 1:-1] + u[2:, 1:-1] + u[1:-1, :-2] + u[1:-1, 2:])
            residual = float(np.max(np.abs(new[1:-1, 1:-1] - u[1:-1, 1:-1])))
            u, new = new, u
        steps += k
        if residual < args.tol or steps >= args.max_steps:
            return u[1:-1, 1:-1], steps, residual


CHECK = Check(reference, exact=True)   # bit for bit: the cells, the steps and the last residual


def main(argv: list[str]) -> int:
    p = parser(__doc__.split("\n\n")[0], grid=1024, every=20, tol=1e-4, max_steps=400)
    return run("heat", argv, p, Heat, CHECK)


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
