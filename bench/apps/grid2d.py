"""What bench/apps/heat.py and cg.py share: a 2-D grid of cells split over a 2-D grid of ranks, the two
communication faces each solver runs on (pycollect's and plain mpi4py's), and the interleaved timing,
table and JSON.

A rank holds its block of the global ``(R, C)`` cells with one ghost layer on each side: ``u`` is
``(r + 2, c + 2)`` for its ``(r, c)`` own cells. Ghosts next to a neighbour are filled by the halo
exchange; those at the edge of the global grid hold the Dirichlet boundary and are never written by
it. A face offers ``start_halo(u)`` (a request whose ``wait()`` has landed the ghosts; faces only, the
5-point stencil reads no corner) and ``allreduce(value, op)`` of one float64 (``"sum"`` or ``"max"``).
The solvers are written once, against a face, so the two runs differ in their communication alone.
"""
from __future__ import annotations

import argparse
import datetime
import os
import statistics
import time

import numpy as np
from mpi4py import MPI

import pycollect as pc
from pycollect.tools.report import format_table, run_header, write_json

IMPLS = ("pycollect", "mpi4py")
MPI_OPS = {"sum": MPI.SUM, "max": MPI.MAX}
RESULTS = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "results")


def split(n: int, parts: int, i: int) -> tuple[int, int]:
    """Cells ``[start, stop)`` of part ``i`` when ``n`` cells split over ``parts``: the first ``n % parts`` parts
    one cell larger."""
    base, extra = divmod(n, parts)
    start = i * base + min(i, extra)
    return start, start + base + (i < extra)


class Block:
    """This rank's own cells of the global ``shape`` on a grid of ranks ``dims``, at ``coords``."""

    def __init__(self, shape: tuple[int, int], dims: tuple[int, int], coords: tuple[int, int]):
        self.shape, self.dims, self.coords = tuple(shape), tuple(dims), tuple(coords)
        if any(n < p for n, p in zip(self.shape, self.dims)):
            raise ValueError(f"grid {self.shape} has fewer cells than ranks {self.dims} along a dimension")
        self.rows = split(self.shape[0], self.dims[0], self.coords[0])
        self.cols = split(self.shape[1], self.dims[1], self.coords[1])
        self.own = (self.rows[1] - self.rows[0], self.cols[1] - self.cols[0])   # (r, c)

    def edges(self) -> tuple[bool, bool, bool, bool]:
        """Whether this block's top, bottom, left and right ghosts lie on the global boundary."""
        return (self.rows[0] == 0, self.rows[1] == self.shape[0], self.cols[0] == 0, self.cols[1] == self.shape[1])


def interior_and_ring(r: int, c: int) -> tuple[tuple[int, int, int, int], list[tuple[int, int, int, int]]]:
    """Index ranges ``(r0, r1, c0, c1)`` of a ``(r + 2, c + 2)`` block: its interior (cells whose stencil reads no
    ghost), then the ring of own cells next to the ghosts (top row, bottom row, left and right columns between)."""
    ring = [(1, 2, 1, c + 1), (max(r, 2), r + 1, 1, c + 1), (2, r, 1, 2), (2, r, max(c, 2), c + 1)]
    return (2, r, 2, c), [box for box in ring if box[0] < box[1] and box[2] < box[3]]


# -- the two faces ------------------------------------------------------------------------------------------
class PycollectFace:
    """pycollect: ``comm.cartesian(dims)``, its halo exchange (subarray datatypes, one phase without corners) and
    its allreduce (``algorithm`` as given: ``auto`` runs MPI's own call on 8 bytes)."""

    name = "pycollect"

    def __init__(self, world: MPI.Intracomm, dims: tuple[int, int], algorithm: str = "auto"):
        self.comm = pc.Communicator(world)
        self.grid = self.comm.cartesian(dims, periods=False)
        self.coords = self.grid.coords
        self.algorithm = algorithm
        self._send, self._recv = np.zeros(1), np.zeros(1)   # (1,) each

    def start_halo(self, u):
        return self.grid.start_halo(u, 1, corners=False)

    def allreduce(self, value: float, op: str) -> float:
        self._send[0] = value
        self.grid.allreduce(self._send, op=op, algorithm=self.algorithm, out=self._recv)
        return float(self._recv[0])

    def free(self) -> None:
        self.grid.free()
        self.comm.free()


class Mpi4pyFace:
    """Plain mpi4py: ``Create_cart``, ``Irecv``/``Isend`` of subarray datatypes over ``u`` (committed once per
    shape), ``Waitall``, and ``Allreduce`` of one float64."""

    name = "mpi4py"

    def __init__(self, world: MPI.Intracomm, dims: tuple[int, int]):
        self.cart = world.Create_cart(list(dims), [False, False], reorder=False)
        self.coords = tuple(self.cart.Get_coords(self.cart.Get_rank()))
        self.peers = [self.cart.Shift(d, 1) for d in (0, 1)]   # (below, above) per dimension; PROC_NULL at an edge
        self.types: dict[tuple[int, ...], list] = {}
        self._send, self._recv = np.zeros(1), np.zeros(1)

    def _faces(self, shape: tuple[int, ...]) -> list:
        """``(recv type, send type, peer, recv tag, send tag)`` of the four faces of a ``shape`` block. A message
        going up dimension ``d`` (to the neighbour above) has tag ``2 d``, one going down ``2 d + 1``: the two
        messages between a pair of ranks never share a tag."""
        if shape not in self.types:
            r, c = shape[0] - 2, shape[1] - 2
            faces = []
            for d, n in ((0, r), (1, c)):
                below, above = self.peers[d]
                sub = [1, c] if d == 0 else [r, 1]
                up, down = 2 * d, 2 * d + 1
                for recv, send, peer, tags in ((0, 1, below, (up, down)), (n + 1, n, above, (down, up))):
                    types = [MPI.DOUBLE.Create_subarray(list(shape), sub, [i, 1] if d == 0 else [1, i]).Commit()
                             for i in (recv, send)]
                    faces.append((*types, peer, *tags))
            self.types[shape] = faces
        return self.types[shape]

    def start_halo(self, u) -> "_Requests":
        faces = self._faces(u.shape)
        requests = [self.cart.Irecv([u, 1, recv], peer, tag) for recv, _, peer, tag, _ in faces]
        requests += [self.cart.Isend([u, 1, send], peer, tag) for _, send, peer, _, tag in faces]
        return _Requests(requests)

    def allreduce(self, value: float, op: str) -> float:
        self._send[0] = value
        self.cart.Allreduce(self._send, self._recv, MPI_OPS[op])
        return float(self._recv[0])

    def free(self) -> None:
        for faces in self.types.values():
            for recv, send, *_ in faces:
                recv.Free()
                send.Free()
        self.cart.Free()


class _Requests:
    def __init__(self, requests: list):
        self.requests = requests

    def wait(self) -> None:
        MPI.Request.Waitall(self.requests)


def face(impl: str, world: MPI.Intracomm, dims: tuple[int, int], algorithm: str = "auto"):
    if impl == "pycollect":
        return PycollectFace(world, dims, algorithm)
    if impl == "mpi4py":
        return Mpi4pyFace(world, dims)
    raise ValueError(f"impl must be one of {', '.join(IMPLS)}, got {impl!r}")


# -- the whole grid, for checks ------------------------------------------------------------------------------
def assemble(world: MPI.Intracomm, block: Block, own) -> np.ndarray:
    """The global ``(R, C)`` cells on every rank, from each rank's ``own`` ``(r, c)`` cells (small grids only)."""
    whole = np.empty(block.shape)
    for rows, cols, part in world.allgather((block.rows, block.cols, np.ascontiguousarray(own))):
        whole[rows[0]:rows[1], cols[0]:cols[1]] = part
    return whole


def gather_whole(world: MPI.Intracomm, block: Block, own) -> np.ndarray | None:
    """The global ``(R, C)`` cells on rank 0 (None elsewhere), from each rank's ``own`` ``(r, c)`` cells."""
    parts = world.gather((block.rows, block.cols, np.ascontiguousarray(own)), root=0)
    if parts is None:
        return None
    whole = np.empty(block.shape)
    for rows, cols, part in parts:
        whole[rows[0]:rows[1], cols[0]:cols[1]] = part
    return whole


class Check:
    """What an application's results are held to (``heat.CHECK``, ``cg.CHECK``).

    ``reference(shape, args)``: a single-process solve of the whole grid, ``(cells (R, C), steps, residual)``;
    ``exact``: the solution, steps and residual equal the reference's bit for bit (else: every cell within
    ``rtol`` of the reference's largest cell, the same convergence, steps within ``steps_slack``);
    ``residual(cells, shape)``: a residual computed afresh from a solution (or None), held below
    ``residual_factor * --tol`` where the run converged."""

    def __init__(self, reference, exact: bool, rtol: float = 0.0, steps_slack: int = 0, residual=None,
                 residual_factor: float = 10.0):
        self.reference, self.exact, self.rtol, self.steps_slack = reference, exact, rtol, steps_slack
        self.residual, self.residual_factor = residual, residual_factor

    def differences(self, name: str, cells, steps: int, residual: float, against: str, ref, tol: float) -> list[str]:
        """What ``name``'s result (cells, steps, final residual) does not share with ``against``'s ``ref``."""
        ref_cells, ref_steps, ref_residual = ref
        diff = float(np.max(np.abs(cells - ref_cells), initial=0.0))
        out = []
        if self.exact:
            if diff or steps != ref_steps or residual != ref_residual:
                out.append(f"{name} differs from {against} (bit for bit expected): largest cell difference "
                           f"{diff:.3e}, steps {steps} against {ref_steps}, residual {residual:.6e} against "
                           f"{ref_residual:.6e}")
            return out
        bound = self.rtol * float(np.max(np.abs(ref_cells), initial=0.0))
        if not diff <= bound:
            out.append(f"{name} differs from {against}: largest cell difference {diff:.3e} > {bound:.3e} "
                       f"({self.rtol:g} of its largest cell)")
        if (residual < tol) != (ref_residual < tol):
            out.append(f"{name} {'converged' if residual < tol else 'did not converge'} (residual {residual:.3e}, "
                       f"{steps} steps) where {against} {'did' if ref_residual < tol else 'did not'} "
                       f"(residual {ref_residual:.3e}, {ref_steps} steps)")
        elif abs(steps - ref_steps) > self.steps_slack:
            out.append(f"{name} took {steps} steps, {against} {ref_steps}")
        return out


def verify(world: MPI.Intracomm, solvers: dict, args, check: Check) -> tuple[dict, list[str]]:
    """Every implementation's final solution (after its timed blocks) against a single-process solve of the whole
    grid when it has at most ``--reference-cells`` cells (gathered to rank 0), and against the other
    implementation's; plus a residual computed afresh from it (``check.residual``, on the gathered grid). Returns
    ``(what was compared, the differences)``, the same on every rank."""
    cells = args.grid[0] * args.grid[1]
    whole = cells <= args.reference_cells
    wholes = {name: gather_whole(world, s.block, s.own()) for name, s in solvers.items()} if whole else {}
    problems: list[str] = []
    checked = {"reference": "single process" if whole else None, "reference_cells": args.reference_cells}
    if world.rank == 0 and whole:
        ref = check.reference(args.grid, args)
        checked.update(reference_steps=ref[1], reference_residual=ref[2])
        for name, s in solvers.items():
            problems += check.differences(name, wholes[name], s.steps, s.residual, "the single-process solve", ref,
                                          args.tol)
            if check.residual is not None and s.residual < args.tol:
                again = check.residual(wholes[name], args.grid)
                checked[f"{name}_residual_afresh"] = again
                if not again <= check.residual_factor * args.tol:
                    problems.append(f"{name}'s solution has residual {again:.3e} computed afresh, over "
                                    f"{check.residual_factor:g} x --tol {args.tol:g}")
    if len(solvers) == 2:   # pycollect against mpi4py, each rank its own cells
        a, b = (solvers[name] for name in IMPLS)
        ref = (b.own(), b.steps, b.residual)
        mine = check.differences("pycollect", a.own(), a.steps, a.residual, "mpi4py", ref, args.tol)
        flags = world.allgather(bool(mine))
        if any(flags) and world.rank == 0:
            problems += mine or [f"pycollect differs from mpi4py on rank {flags.index(True)}"]
        checked["against_mpi4py"] = True
    problems = world.bcast(problems, root=0)
    return world.bcast(checked, root=0), problems


# -- the run: interleaved timing, table, JSON ----------------------------------------------------------------
def parser(description: str, grid: int, every: int, tol: float, max_steps: int) -> argparse.ArgumentParser:
    """The flags both applications take, with each one's defaults."""
    p = argparse.ArgumentParser(description=description)
    p.add_argument("--grid", type=_shape, default=(grid, grid), help=f"global cells, N or ROWSxCOLS (default {grid})")
    p.add_argument("--impl", choices=(*IMPLS, "both"), default="both", help="which to run (default both, interleaved)")
    p.add_argument("--every", type=int, default=every, help=f"steps per timed block (default {every})")
    p.add_argument("--tol", type=float, default=tol, help=f"stop below this residual (default {tol:g})")
    p.add_argument("--max-steps", type=int, default=max_steps, help=f"stop after this many steps (default {max_steps})")
    p.add_argument("--algorithm", default="auto", help="pycollect's allreduce algorithm (default auto)")
    p.add_argument("--json", help="output file (default bench/results/<date>-apps-<app>-<p>ranks.json)")
    p.add_argument("--save", help="an .npz file of each implementation's global solution (small grids)")
    p.add_argument("--reference-cells", type=int, default=1 << 20,
                   help="compare with a single-process solve (gathered to rank 0) up to this many cells "
                        "(default 1048576: 1024x1024)")
    return p


def _shape(text: str) -> tuple[int, int]:
    try:
        rows, _, cols = text.lower().partition("x")
        shape = (int(rows), int(cols or rows))
    except ValueError:
        raise argparse.ArgumentTypeError(f"not a grid: {text!r} (examples: 1024, 600x400)") from None
    if min(shape) < 1:
        raise argparse.ArgumentTypeError(f"grid {text!r} must have at least one cell along each dimension")
    return shape


def timed(world: MPI.Intracomm, run) -> float:
    """The slowest rank's seconds for ``run()``, all ranks starting together."""
    world.Barrier()
    t0 = time.perf_counter()
    run()
    return world.allreduce(time.perf_counter() - t0, op=MPI.MAX)


def race(world: MPI.Intracomm, solvers: dict) -> dict[str, list[float]]:
    """Every solver advanced one block at a time, in turn (the first to go alternates), until each has stopped;
    returns each one's seconds per step of every block."""
    times: dict[str, list[float]] = {name: [] for name in solvers}
    order = list(solvers)
    while not all(s.done for s in solvers.values()):
        for name in order:
            s = solvers[name]
            if not s.done:
                before = s.steps
                seconds = timed(world, s.advance)
                times[name].append(seconds / (s.steps - before))
        order.reverse()
    return times


def run(app: str, argv: list[str], p: argparse.ArgumentParser, make, check: Check) -> int:
    """Parse ``argv``, build a solver with ``make(face, block, args)`` per implementation, race them, check their
    final solutions (``verify``), report; the exit status is 1 on every rank when a check failed."""
    args = p.parse_args(argv)
    if args.every < 1 or args.max_steps < 1:
        p.error("--every and --max-steps must be >= 1")
    world = MPI.COMM_WORLD
    dims = tuple(MPI.Compute_dims(world.size, 2))
    if any(n < d for n, d in zip(args.grid, dims)):
        p.error(f"--grid {args.grid[0]}x{args.grid[1]} has fewer cells than ranks {dims[0]}x{dims[1]} along a "
                f"dimension")
    faces = [face(i, world, dims, args.algorithm) for i in (IMPLS if args.impl == "both" else (args.impl,))]
    try:
        solvers = {f.name: make(f, Block(args.grid, dims, f.coords), args) for f in faces}
        times = race(world, solvers)
        records = [record(app, s, times[name], args) for name, s in solvers.items()]
        summary = compare(world, solvers)
        checked, failed = verify(world, solvers, args, check)
        summary.update(checked=checked, failed=failed)
        if args.save:
            wholes = {name: assemble(world, s.block, s.own()) for name, s in solvers.items()}
            if world.rank == 0:
                np.savez(args.save, **wholes)
        meta = pc.Communicator(world)    # the run's header: MPI library, topology (collective: every rank)
        head = run_header(meta, argv, grid=list(args.grid), every=args.every, tol=args.tol, max_steps=args.max_steps)
        meta.free()
        if world.rank == 0:
            report(app, head, args, records, summary)
    finally:
        for f in faces:
            f.free()
    return 1 if failed else 0


def record(app: str, s, per_step: list[float], args) -> dict:
    return {"app": app, "impl": s.face.name, "grid": list(s.block.shape), "dims": list(s.block.dims),
            "algorithm": args.algorithm if s.face.name == "pycollect" else "mpi", "steps": s.steps,
            "residual": s.residual, "converged": s.residual < args.tol, "blocks": len(per_step),
            "step_us": statistics.median(per_step) * 1e6, "step_us_best": min(per_step) * 1e6,
            "step_us_blocks": [round(t * 1e6, 2) for t in per_step]}


def compare(world: MPI.Intracomm, solvers: dict) -> dict:
    """How far apart the implementations' solutions are (the largest difference of a cell, over all ranks)."""
    if len(solvers) < 2:
        return {}
    a, b = (solvers[name] for name in IMPLS)
    diff = world.allreduce(float(np.max(np.abs(a.own() - b.own()), initial=0.0)), op=MPI.MAX)
    return {"max_diff": diff, "bit_equal": diff == 0.0 and a.residual == b.residual and a.steps == b.steps,
            "same_steps": a.steps == b.steps, "residual_diff": abs(a.residual - b.residual)}


def report(app: str, head: dict, args, records: list[dict], summary: dict) -> None:
    """The table on stdout and the JSON file (rank 0)."""
    failed = summary["failed"]
    if len(records) == 2:   # a wrong solve's time is no figure
        pc_rec, mpi_rec = records
        summary.update(ratio=None if failed else pc_rec["step_us"] / mpi_rec["step_us"],
                       ratio_best=None if failed else pc_rec["step_us_best"] / mpi_rec["step_us_best"])
    columns = [("impl", "impl", "{}"), ("steps", "steps", "{}"), ("residual", "residual", "{:.3e}"),
               ("step_us", "us/step (median)", "{:.1f}"), ("step_us_best", "us/step (best)", "{:.1f}"),
               ("blocks", "blocks", "{}")]
    print(f"# {app}: grid {args.grid[0]}x{args.grid[1]} on ranks {records[0]['dims']}, tol {args.tol:g}")
    print("\n".join(format_table(records, columns)))
    if len(records) == 2 and not failed:
        print(f"# pycollect/mpi4py time per step: {summary['ratio']:.3f} (median), {summary['ratio_best']:.3f} (best); "
              f"max difference of the solutions {summary['max_diff']:.3e}, bit for bit: {summary['bit_equal']}")
    checked = summary["checked"]
    against = [what for what, key in (("a single-process solve", "reference"), ("each other", "against_mpi4py"))
               if checked.get(key)]
    print(f"# final solutions checked against {' and '.join(against) or 'nothing (over --reference-cells, one impl)'}")
    for line in failed:
        print(f"FAILED: {line}")
    date = datetime.date.today().isoformat()
    path = args.json or os.path.join(RESULTS, f"{date}-apps-{app}-{head['world_size']}ranks.json")
    print("wrote", write_json(path, f"app_{app}", head, records, summary=summary))
