"""Single-process references for bench/apps (heat.py, cg.py), on the whole grid at once: NumPy alone, no split
into blocks, no halo, no MPI. Imported by tests/test_bench_apps.py and tests/mpi/test_cartesian.py."""
import math
import os
import sys

import numpy as np

APPS = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "bench", "apps")


def import_apps():
    """bench/apps' modules ``heat``, ``cg`` and ``grid2d`` (the scripts import grid2d from their folder)."""
    if APPS not in sys.path:
        sys.path.insert(0, APPS)
    import cg
    import grid2d
    import heat
    return heat, cg, grid2d


def heat(shape, every: int, tol: float, max_steps: int):
    """Jacobi on ``(R, C)`` cells, top boundary 1, others 0, the largest change checked every ``every`` steps:
    ``(cells (R, C), steps, residual)``."""
    u = np.zeros((shape[0] + 2, shape[1] + 2))     # (R + 2, C + 2) with the boundary
    u[0, :] = 1.0
    new, steps = u.copy(), 0
    while True:
        k = min(every, max_steps - steps)
        for _ in range(k):
            new[1:-1, 1:-1] = 0.25 * (u[:-2, 1:-1] + u[2:, 1:-1] + u[1:-1, :-2] + u[1:-1, 2:])
            residual = float(np.max(np.abs(new - u)))
            u, new = new, u
        steps += k
        if residual < tol or steps >= max_steps:
            return u[1:-1, 1:-1], steps, residual


def cg(shape, tol: float, max_steps: int):
    """Conjugate gradients for the 5-point Laplacian, zero boundaries, ``b = h^2``: ``(x (R, C), steps,
    |r| / |b|)``."""
    h = 1.0 / (max(shape) + 1)
    x, r = np.zeros(shape), np.full(shape, h * h)
    p = np.zeros((shape[0] + 2, shape[1] + 2))     # (R + 2, C + 2), boundary 0
    p[1:-1, 1:-1] = r
    rr = float(np.sum(r * r))
    norm_b = math.sqrt(rr)
    for steps in range(1, max_steps + 1):
        inner = p[1:-1, 1:-1]
        ap = 4.0 * inner - p[:-2, 1:-1] - p[2:, 1:-1] - p[1:-1, :-2] - p[1:-1, 2:]
        alpha = rr / float(np.sum(inner * ap))
        x += alpha * inner
        r -= alpha * ap
        rr, old = float(np.sum(r * r)), rr
        p[1:-1, 1:-1] = r + (rr / old) * inner
        if math.sqrt(rr) / norm_b < tol:
            break
    return x, steps, math.sqrt(rr) / norm_b


def laplacian_residual(x) -> float:
    """``|A x - b| / |b|`` of a CG solution, computed afresh."""
    h = 1.0 / (max(x.shape) + 1)
    p = np.pad(x, 1)
    ax = 4.0 * x - p[:-2, 1:-1] - p[2:, 1:-1] - p[1:-1, :-2] - p[1:-1, 2:]
    return float(np.linalg.norm(ax - h * h) / np.linalg.norm(np.full(x.shape, h * h)))
