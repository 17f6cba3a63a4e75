"""Inputs, MPI references and agreement across ranks for the multi-rank tests."""
from __future__ import annotations

import time
from contextlib import contextmanager

import ml_dtypes
import numpy as np
import pytest
from mpi4py import MPI

import pycollect as pc
from pycollect.engine import ops
from pycollect.parallel import ProcessMesh

DTYPES = [np.dtype(t) for t in ("i1", "i2", "i4", "i8", "u1", "u2", "u4", "u8", "f2", "f4", "f8", "c8", "c16")]
DTYPES.append(np.dtype(ml_dtypes.bfloat16))
MPI_OPS = {"sum": MPI.SUM, "avg": MPI.SUM, "prod": MPI.PROD, "min": MPI.MIN, "max": MPI.MAX,
           "band": MPI.BAND, "bor": MPI.BOR, "bxor": MPI.BXOR}


def ops_for(dtype) -> list[str]:
    """The ops a dtype takes, as README lists them (a literal table, not the library's check: an op it refused
    wrongly would drop out of every grid unseen): all eight on integers, the bitwise ones on nothing else."""
    kind = "f" if np.dtype(dtype).name == "bfloat16" else np.dtype(dtype).kind
    return {"i": ["sum", "avg", "prod", "min", "max", "band", "bor", "bxor"],
            "u": ["sum", "avg", "prod", "min", "max", "band", "bor", "bxor"],
            "f": ["sum", "avg", "prod", "min", "max"], "c": ["sum", "avg", "prod"]}[kind]


def pairs_by_hand(x, location) -> np.ndarray:
    """What MPI's pair types (MPI.DOUBLE_INT, ...) hold, laid out as C lays out their struct (the value, then a C int
    location, aligned), built apart from the library's own pairs: ``location`` an int or one per element."""
    pairs = np.zeros(np.shape(x), np.dtype([("value", np.asarray(x).dtype), ("location", np.int32)], align=True))
    pairs["value"], pairs["location"] = x, location
    return pairs


def integer_valued(shape, dtype, op, seed) -> np.ndarray:
    """Values whose reduction over up to 8 ranks is exact in every dtype, whatever the order."""
    rng = np.random.default_rng(seed)
    kind = ops.dtype_kind(dtype)
    if op in ("band", "bor", "bxor"):
        vals = rng.integers(0, 128, shape)
    elif op == "prod":
        vals = rng.choice([1, 2] if kind == "u" else [-2, -1, 1, 2], shape)
    else:
        vals = rng.integers(0 if kind == "u" else -3, 4, shape)
    x = vals.astype(np.float64 if kind in "fc" else np.int64)
    if kind == "c":
        x = x + 1j * rng.integers(-3, 4, shape)
    return x.astype(dtype)


def wide(dtype):
    """A dtype MPI reduces in which ``dtype``'s integer-valued data is exact."""
    return np.dtype("f8") if np.dtype(dtype).name in ("float16", "bfloat16") else np.dtype(dtype)


def agree(comm, ok: bool, message: str) -> None:
    """Fail on every rank when any rank failed, so all ranks stop (and shrink) together."""
    flags = comm.mpi.allgather(bool(ok))
    bad = [r for r, f in enumerate(flags) if not f]
    assert not bad, f"ranks {bad}: {message}"


class Verdicts:
    """Cases checked on each rank and agreed once, at the end: one collective for a whole grid of cases instead
    of one per case (on ranks sharing cores every collective costs a scheduler round). Every rank runs the same
    calls whatever its verdicts, so holding a failure until the end cannot hang a rank; the report names each
    failing rank's first case and how many failed."""

    def __init__(self, comm):
        self.comm, self.failed = comm, []

    def __call__(self, ok: bool, message: str) -> None:
        if not ok:
            self.failed.append(message)

    def agree(self) -> None:
        first = (len(self.failed), self.failed[0]) if self.failed else None
        reports = self.comm.mpi.allgather(first)
        bad = {r: report for r, report in enumerate(reports) if report is not None}
        assert not bad, "; ".join(f"rank {r}: {n} failed, first {msg}" for r, (n, msg) in bad.items())


@contextmanager
def verdicts(comm):
    """``with verdicts(comm) as check: ... check(ok, message)``: agreed when the block ends normally (an error
    raised inside ends the job through the conftest's abort instead)."""
    check = Verdicts(comm)
    yield check
    check.agree()


def same(got, expected, exact=True, rtol=0.0, atol=0.0) -> bool:
    if got is None or expected is None:
        return got is None and expected is None
    if got.shape != expected.shape or got.dtype != expected.dtype:
        return False
    if exact:
        return bool(np.array_equal(np.asarray(got, np.complex128 if got.dtype.kind == "c" else None),
                                   np.asarray(expected, np.complex128 if got.dtype.kind == "c" else None)))
    return bool(np.allclose(np.asarray(got, np.complex128), np.asarray(expected, np.complex128), rtol=rtol, atol=atol))


def avg_of(total: np.ndarray, size: int) -> np.ndarray:
    """The average ``op="avg"`` must give, computed apart from the library's: integers truncated toward zero in
    Python's integers (no wrap at the dtype's minimum), floats divided in their own dtype, complex part by part."""
    if total.dtype.kind in "iu":
        quotients = [-(-v // size) if v < 0 else v // size for v in total.ravel().tolist()]
        return np.array(quotients, total.dtype).reshape(total.shape)
    out = total.copy()
    for part in (out.real, out.imag) if out.dtype.kind == "c" else (out,):
        part[...] = np.true_divide(part, np.asarray(size, part.dtype))
    return out


# -- MPI's own collectives on the user's communicator, widened where MPI cannot reduce the dtype ---------
def mpi_allreduce(mpi, x, op):
    w = np.ascontiguousarray(x, wide(x.dtype))
    r = np.empty_like(w)
    mpi.Allreduce(w, r, MPI_OPS[op])
    r = r.astype(x.dtype)
    return avg_of(r, mpi.size) if op == "avg" else r


def mpi_reduce_scatter(mpi, x, op, rows):
    total = mpi_allreduce(mpi, x, op)
    start = sum(rows[:mpi.rank])
    return total[start:start + rows[mpi.rank]].copy()


def mpi_allgather(mpi, x):
    parts = mpi.allgather(np.ascontiguousarray(x))
    return np.concatenate(parts)


def mpi_alltoall(mpi, x, rows):
    starts = np.cumsum([0, *rows])
    sent = [np.ascontiguousarray(x[starts[i]:starts[i + 1]]) for i in range(mpi.size)]
    got = mpi.alltoall(sent)
    return np.concatenate(got)


# -- the model-layer tests: groups carved from the world, relative closeness, counted calls -------------
def carve_group(comm, p: int):
    """``(group, carved)``: this rank's pycollect Communicator of ``p`` consecutive ranks (the world itself
    when ``p`` is its size), or ``(None, None)`` for the ranks left over; ``carved`` is to be freed."""
    import pycollect as pc
    if p == comm.size:
        return pc.Communicator(comm.mpi), None
    group = comm.split(comm.rank // p if comm.rank < comm.size // p * p else None)   # a group of comm's
    return group, group


def release_group(group, carved) -> None:
    if group is not None and carved is not None:
        carved.free()


@contextmanager
def carved(comm, p: int):
    """A module fixture's group: skips when ``p`` ranks do not fit the world, else ``carve_group``'s
    group (None on ranks left over), released on exit."""
    if p > comm.size:
        pytest.skip(f"group of {p} ranks does not fit in a world of {comm.size}")
    group, sub = carve_group(comm, p)
    try:
        yield group
    finally:
        release_group(group, sub)


@contextmanager
def carved_mesh(comm, tp: int = 1, dp: int = 1, pp: int = 1):
    """A ProcessMesh on ``tp * dp * pp`` carved ranks (None on ranks left over), freed on exit. The smaller
    worlds cover the small meshes: the 5-rank world runs only the 4-rank meshes (a rank left over; of the many-step
    training cases only those a file assigns to it, ``shown_at_four``), larger worlds only meshes of all their
    ranks (the ranks left over would only poll the two cores away)."""
    n = tp * dp * pp
    if comm.size > 4 and n < (4 if comm.size == 5 else comm.size):
        pytest.skip("small meshes are covered by the smaller worlds")
    with carved(comm, n) as group:
        mesh = None if group is None else ProcessMesh(group, tp=tp, dp=dp, pp=pp)
        try:
            yield mesh
        finally:
            if mesh is not None:
                mesh.free()


def shown_at_four(comm) -> bool:
    """True in the 5-rank world: it carves the 4-rank meshes again to show a rank left over beside them. A
    many-step training case the 4-rank world already ran returns here (``agree`` on every rank, the one left
    over too); the cases a file assigns to 5 ranks keep showing the left-over rank."""
    return comm.size == 5


def rel_close(got, expected, rtol: float, same_dtype: bool = True) -> bool:
    """Same shape (and dtype), and ``|got - expected| <= rtol * |expected|`` in the 2-norm, computed in float64."""
    if got.shape != expected.shape or (same_dtype and got.dtype != expected.dtype):
        return False
    scale = max(float(np.linalg.norm(expected.astype(np.float64))), 1e-300)
    return float(np.linalg.norm(got.astype(np.float64) - expected.astype(np.float64))) <= rtol * scale


def count_calls(monkeypatch, group, name: str = "allreduce") -> list:
    """Wrap ``group.<name>`` to count its calls; returns a one-element list holding the count."""
    calls = [0]
    inner = getattr(group, name)

    def counted(*args, **kwargs):
        calls[0] += 1
        return inner(*args, **kwargs)
    monkeypatch.setattr(group, name, counted)
    return calls


_REFERENCE_RUNS: dict = {}


def reference_run(config, cfg, dp: int, seq_groups: int):
    """``train_reference``'s (model, optimizer, history), run once per configuration and kept: the schedules,
    ZeRO stages and meshes of one dp and sequence split share one single-process twin (its results are only
    read)."""
    from pycollect.training import train_reference
    key = (repr(config), repr(cfg), dp, seq_groups)
    if key not in _REFERENCE_RUNS:
        _REFERENCE_RUNS[key] = train_reference(config, cfg, dp=dp, seq_groups=seq_groups)
    return _REFERENCE_RUNS[key]


def train_vs_twin(config, cfg, mesh, sequence_parallel: bool = False, weight_rtol: float = 1e-10, **train_kw) -> dict:
    """``train`` on ``mesh`` and ``train_reference`` routing experts as the ranks do (dp row groups,
    tp sequence slices under sequence parallelism). Returns the model and optimizer, both loss
    histories, both optimizers' step counts ``t``/``ref_t``, ``off`` (parameters whose final full values
    differ by more than ``weight_rtol``) and ``memory`` (report categories that differ from the
    optimizer's formulas, when it has them)."""
    from pycollect.training import train
    model, opt, history = train(config, cfg, mesh, sequence_parallel=sequence_parallel, **train_kw)
    seq_groups = mesh.tp_size if sequence_parallel else 1
    ref, ref_opt, ref_history = reference_run(config, cfg, mesh.dp_size, seq_groups)
    full = model.full_params()
    memory = {}
    if hasattr(opt, "expected_memory"):
        report = model.memory_report()
        memory = {k: (report[k], v) for k, v in opt.expected_memory().items() if report[k] != v}
    return {"model": model, "opt": opt, "losses": np.array([r["loss"] for r in history]),
            "ref_losses": np.array([r["loss"] for r in ref_history]), "memory": memory,
            "t": opt.t, "ref_t": ref_opt.t,
            "off": [n for n in ref.params if not rel_close(full[n], ref.params[n], weight_rtol)]}


# -- bad inputs: raised on every rank, nothing written, ranks still in step ----------------------------------
def in_step(comm) -> None:
    """A barrier, then an allreduce whose result every rank checks: no rank was left behind."""
    comm.barrier()
    got = comm.allreduce(np.full(3, comm.rank + 1, np.int64), algorithm="ring")
    agree(comm, same(got, np.full(3, comm.size * (comm.size + 1) // 2, np.int64)), "ranks out of step after the error")


def raises(comm, call, exc, words, arrays=()):
    """``call()`` raises ``exc`` naming every one of ``words`` on every rank; ``arrays`` are untouched."""
    copies = [np.array(a, copy=True) for a in arrays]
    err = None
    try:
        made = call()
    except Exception as e:  # noqa: BLE001 (the type is what the test checks)
        err = e
    else:
        if isinstance(made, pc.Communicator):  # a constructor that should have raised: keep ranks in step
            made.free()
    message = f"{type(err).__name__}: {err}" if err is not None else "no exception"
    agree(comm, isinstance(err, exc) and all(w in str(err) for w in words),
          f"expected {exc} naming {words}, got {message}")
    agree(comm, all(a.tobytes() == c.tobytes() for a, c in zip(arrays, copies)), f"caller's array written ({message})")
    in_step(comm)
    return err


def refused_alone(comm, call, own: list, group_words=("refused their arguments",)):
    """``call()`` made with a bad argument on ``comm``'s last rank alone raises there naming ``own`` (exception of
    any kind), and on every other rank a ValueError naming ``group_words``: none waits for the one that refused."""
    last = comm.rank == comm.size - 1
    return raises(comm, call, Exception, own if last or comm.size == 1 else list(group_words))


LATE_NOTICE = 91   # a tag on the caller's communicator: pycollect's own messages go on duplicates of its own


def short_deadline(communicator, seconds: float = 0.5) -> None:
    """``communicator``'s calls time out after ``seconds`` from now on: a test's set-up calls run under a generous
    deadline first (a rank descheduled for half a second in one of them timed out there, not where meant)."""
    communicator._runner.watch.timeout = seconds


def tell_the_late_rank(comm, late: int) -> None:
    """This rank is done with the call the late rank skipped (timed out, or needed nothing of it)."""
    comm.mpi.Send(np.zeros(1), dest=late, tag=LATE_NOTICE)


def drive_progress(comm, seconds: float = 0.2) -> None:
    """Keep MPI's progress engine turning for ``seconds`` (probes, short naps): whatever MPI still owes a call left
    to it -- a late peer's data into what it was given -- arrives now, so a check that nothing was written after a
    timeout can see a write (a plain sleep calls no MPI, and a write would land only at the next call)."""
    end = time.monotonic() + seconds
    while time.monotonic() < end:
        comm.mpi.Iprobe(MPI.ANY_SOURCE, MPI.ANY_TAG)
        time.sleep(0.001)


def wait_for_the_others(comm) -> None:
    """The late rank: once every other rank is done with the call it comes late to (no sleep that a loaded
    machine can outlast: the others' deadlines may pass later than any fixed pause). A notice from each rank by
    name, not from any source: once, on two simulated nodes, the late rank waited in a receive from any source
    while every other rank had sent its notice and waited in the next barrier (a clean-clone run, 2026-12-05)."""
    for peer in range(comm.size):
        if peer != comm.rank:
            comm.mpi.Recv(np.empty(1), source=peer, tag=LATE_NOTICE)
