"""Conjugate gradients on a 2-D Poisson problem, on pycollect and on plain mpi4py, timed in the same run.

Run under MPI, for example::

    OMP_NUM_THREADS=1 mpiexec -n 2 python bench/apps/cg.py --grid 1024

Solves ``A x = b`` for the 5-point Laplacian on the global ``(R, C)`` cells with zero Dirichlet
boundaries (``(A x)_ij = 4 x_ij - x_i-1,j - x_i+1,j - x_i,j-1 - x_i,j+1``, ghosts outside the grid
0) and ``b = h^2`` (a unit source, ``h = 1 / (max(R, C) + 1)``), matrix-free: ``A p`` is the stencil
applied after a halo exchange of ``p``, overlapped with the interior as in heat.py. The two dot
products of an iteration are a local sum and an allreduce (``sum``) of one float64. It stops when
``|r| / |b|`` falls below ``--tol`` or at ``--max-steps`` iterations.

A dot product is each rank's partial sum, then the allreduce: a single process sums in another
order, so the solution agrees with a single-process solve to rounding, not bit for bit. pycollect's
``auto`` allreduce of 8 bytes is MPI's own call, so both implementations reduce in the same order and
agree bit for bit; ``--algorithm`` picks one of pycollect's schedules instead (where its order
differs, the JSON's ``max_diff`` says by how much). ``--impl both`` (the default) runs the two solves
``--every`` iterations at a time, in turn (bench/README.md, "Applications"). After the timed blocks
each implementation's final solution is checked against a single-process solve (``reference``, on
rank 0, up to ``--reference-cells`` cells: every cell within 1e-9 of the reference's largest, the
same convergence, iterations within 1), its residual computed afresh (``residual``, below 10 x
``--tol`` where it converged) and against the other implementation's (within the same bounds); a
difference is printed as FAILED, named in the summary's ``failed``, leaves the ratios null and makes
the exit status 1 on every rank.
"""
from __future__ import annotations

import math
import sys

import numpy as np

from grid2d import Check, interior_and_ring, parser, run


def laplace(p, ap, box: tuple[int, int, int, int]) -> None:
    """``ap`` (own cells, ``(r, c)``) over ``box`` of ``p`` (``(r + 2, c + 2)``, indices with ghosts): the
    5-point stencil, terms in a fixed order."""
    r0, r1, c0, c1 = box
    ap[r0 - 1:r1 - 1, c0 - 1:c1 - 1] = (4.0 * p[r0:r1, c0:c1] - p[r0 - 1:r1 - 1, c0:c1] - p[r0 + 1:r1 + 1, c0:c1]
                                        - p[r0:r1, c0 - 1:c1 - 1] - p[r0:r1, c0 + 1:c1 + 1])


def apply(face, p, ap) -> None:
    """``ap = A p``: the halo exchange of ``p`` overlapped with the interior, then the ring next to the ghosts."""
    interior, ring = interior_and_ring(p.shape[0] - 2, p.shape[1] - 2)
    h = face.start_halo(p)
    laplace(p, ap, interior)
    h.wait()
    for box in ring:
        laplace(p, ap, box)


def dot(face, a, b) -> float:
    """The global dot product of two ``(r, c)`` arrays: this rank's sum, then the allreduce."""
    return face.allreduce(float(np.sum(a * b)), "sum")


class CG:
    """The solve on one face: ``advance()`` runs up to ``every`` iterations (fewer once converged)."""

    def __init__(self, face, block, args):
        self.face, self.block = face, block
        self.every, self.tol, self.max_steps = args.every, args.tol, args.max_steps
        r, c = block.own
        h = 1.0 / (max(block.shape) + 1)
        self.x = np.zeros((r, c))               # (r, c) the solution so far
        self.r = np.full((r, c), h * h)         # (r, c) b - A x, with x = 0
        self.p = np.zeros((r + 2, c + 2))       # (r + 2, c + 2) the search direction; boundary ghosts stay 0
        self.p[1:-1, 1:-1] = self.r
        self.ap = np.empty((r, c))              # (r, c)
        self.rr = dot(face, self.r, self.r)
        self.norm_b = math.sqrt(self.rr)
        self.steps, self.residual, self.done = 0, 1.0, False

    def iterate(self) -> None:
        p = self.p[1:-1, 1:-1]                  # (r, c) own cells of p
        apply(self.face, self.p, self.ap)
        alpha = self.rr / dot(self.face, p, self.ap)
        self.x += alpha * p
        self.r -= alpha * self.ap
        rr = dot(self.face, self.r, self.r)
        p *= rr / self.rr
        p += self.r
        self.rr = rr
        self.steps += 1
        self.residual = math.sqrt(rr) / self.norm_b

    def advance(self) -> None:
        for _ in range(self.every):
            self.iterate()
            self.done = self.residual < self.tol or self.steps >= self.max_steps
            if self.done:
                return

    def own(self) -> np.ndarray:
        return self.x


def reference(shape, args):
    """One process, the whole grid at once (no blocks, no halo, no MPI): ``(x (R, C), steps, |r| / |b|)``."""
    h = 1.0 / (max(shape) + 1)
    x, r = np.zeros(shape), np.full(shape, h * h)
    p = np.zeros((shape[0] + 2, shape[1] + 2))     # (R + 2, C + 2), boundary 0
    p[1:-1, 1:-1] = r
    rr = float(np.sum(r * r))
    norm_b, steps = math.sqrt(rr), 0
    while steps < args.max_steps:
        inner = p[1:-1, 1:-1]
        ap = 4.0 * inner - p[:-2, 1:-1] - p[2:, 1:-1] - p[1:-1, :-2] - p[1:-1, 2:]
        alpha = rr / float(np.sum(inner * ap))
        x += alpha * inner
        r -= alpha * ap
        rr, old = float(np.sum(r * r)), rr
        p[1:-1, 1:-1] = r + (rr / old) * inner
        steps += 1
        if math.sqrt(rr) / norm_b < args.tol:
            break
    return x, steps, math.sqrt(rr) / norm_b


def residual(x, shape) -> float:
    """``|b - A x| / |b|`` of a whole solution, computed afresh (not the iteration's own recurrence)."""
    h = 1.0 / (max(shape) + 1)
    p = np.pad(x, 1)
    ax = 4.0 * x - p[:-2, 1:-1] - p[2:, 1:-1] - p[1:-1, :-2] - p[1:-1, 2:]
    return float(np.linalg.norm(ax - h * h) / (h * h * math.sqrt(x.size)))


# to rounding: every cell within 1e-9 of the largest cell, the same convergence, steps within 1; and, converged, the
# residual computed afresh from the solution below 10 x --tol
CHECK = Check(reference, exact=False, rtol=1e-9, steps_slack=1, residual=residual)


def main(argv: list[str]) -> int:
    p = parser(__doc__.split("\n\n")[0], grid=1024, every=10, tol=1e-8, max_steps=5000)
    return run("cg", argv, p, CG, CHECK)


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
