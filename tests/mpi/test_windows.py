"""The shared-memory window schedules ("shm") under MPI: calls in flight finished in any order, more calls
than slots, too little shared memory, and windows freed with their Communicator."""
import numpy as np
from mpi4py import MPI

import pycollect as pc
from helpers import agree, integer_valued, mpi_allgather, mpi_allreduce, mpi_alltoall, mpi_reduce_scatter, same
from pycollect.engine import window
from pycollect.engine.executor import Execution
from pycollect.engine.layout import split_even


def _fresh(comm):
    return pc.Communicator(comm.mpi)


def test_calls_in_flight_finish_in_any_order(comm):
    """More calls in flight than slots, completed last first, some ranks spinning on test(), others in wait().

    A request advances only in its own test() and wait(), so every rank completes them in the same order
    (README); a call whose slot is held by an earlier one finishes that one first."""
    p, r = comm.size, comm.rank
    c = _fresh(comm)
    try:
        c.allreduce(np.ones(3), algorithm="shm")   # a blocking call opens the windows; the non-blocking ones use them
        calls = []
        for k in range(2 * window.SLOTS + 1):
            x = integer_valued((7 * p + k,), np.dtype("f8"), "sum", 100 * k + r)
            kind = k % 4
            if kind == 0:
                calls.append((c.iallreduce(x, algorithm="shm"), mpi_allreduce(comm.mpi, x, "sum")))
            elif kind == 1:
                calls.append((c.iallgather(x, algorithm="shm", counts=[x.shape[0]] * p),   # counts: it starts now
                              mpi_allgather(comm.mpi, x)))
            elif kind == 2:
                rows = split_even(x.shape[0], p)
                calls.append((c.ireduce_scatter(x, algorithm="shm"), mpi_reduce_scatter(comm.mpi, x, "sum", rows)))
            else:
                y = x[:p * (x.shape[0] // p)]
                calls.append((c.ialltoall(y, algorithm="shm"), mpi_alltoall(comm.mpi, y, split_even(y.shape[0], p))))
        order = [len(calls) - 1, *range(len(calls) - 1)]   # the last first, then the rest in order
        ok = True
        for i in order:
            req, expected = calls[i]
            if r % 3 == 1:
                while not req.test():
                    pass
            ok &= same(req.wait(), expected)
        blocking = c.allreduce(np.full(5, r + 1.0), algorithm="shm")
        agree(comm, ok and same(blocking, np.full(5, p * (p + 1) / 2)), "shm calls in flight")
        windows = c._runner.windows
        entered = windows.calls if windows is not None else None   # every call above agreed on windows
        # through windows: every call where the opening one went (1 rank: none has window rounds), on several nodes
        # only the allreduces (the others run their messages there)
        exact = entered == (2 * window.SLOTS + 3 if entered else 0) or c.topology.num_nodes > 1
        agree(comm, windows is None or (exact and not windows.queue and not windows.pending),
              f"window calls entered: {entered}")
    finally:
        c.free()


def test_non_blocking_shm_calls_do_not_wait_for_their_peers(comm):
    """A non-blocking shm call returns before its peers have made it: rank 1 tells rank 0 to start only once its
    own call returned (a call that waited for the window agreement would time out here, after 20 s)."""
    p, r = comm.size, comm.rank
    c = pc.Communicator(comm.mpi, timeout=20, abort_on_timeout=False)
    try:
        c.allreduce(np.ones(2), algorithm="shm")   # the windows open at a blocking call
        windows = c._runner.windows
        before = windows.calls if windows is not None else 0   # 0: no window rounds here (uneven nodes)
        ok = True
        for size in (6, 1 << 16):   # the second would have to grow the slot: its messages (a growth waits)
            x = integer_valued((size,), np.dtype("f8"), "sum", size + r)
            if r == 0 and p > 1:
                comm.mpi.Recv(np.empty(1), source=1, tag=7)
            try:
                req = c.iallreduce(x, algorithm="shm")
            except Exception as e:  # noqa: BLE001 (reported below, on every rank)
                req, ok = None, False
                print(f"rank {r}: iallreduce waited: {e}")
            if r == 1:
                comm.mpi.Send(np.zeros(1), dest=0, tag=7)
            ok &= req is not None and same(req.wait(), mpi_allreduce(comm.mpi, x, "sum"))
        entered = windows.calls - before if windows is not None else 0
        grown = windows is not None and any(s is not None and s.nbytes > 4096 for s in windows.slots)
        agree(comm, ok and entered == (2 if before else 0) and not grown,
              f"non-blocking shm calls ({entered} entered, a slot grown: {grown})")
    finally:
        c.free()


def test_too_little_shared_memory_on_one_rank_runs_the_messages(comm, monkeypatch):
    """One rank sees /dev/shm nearly full: every rank runs the message schedule, and no window grows."""
    c = _fresh(comm)
    try:
        if comm.rank == 0:
            monkeypatch.setattr(window, "shm_free", lambda: 1 << 20)
        x = integer_valued((1 << 18,), np.dtype("f4"), "sum", comm.rank)   # 1 MiB
        got = c.allreduce(x, algorithm="shm")
        slots = c._runner.windows.slots if c._runner.windows else [None]
        grown = [s.nbytes for s in slots if s is not None and s.nbytes > 4096]
        agree(comm, same(got, mpi_allreduce(comm.mpi, x, "sum")) and not grown,
              f"shm with no room: windows grown to {grown}")
        monkeypatch.undo()
        again = c.allreduce(x, algorithm="shm")      # room again: the window grows and is used
        grown = [s.nbytes for s in c._runner.windows.slots if s is not None and s.nbytes > 4096] if c._runner.windows else []
        topo = comm.topology   # windows on one node, or uniform nodes of 2+ ranks; else the ring (allreduce_shm)
        windowed = comm.size > 1 and (topo.num_nodes == 1 or (topo.is_uniform and comm.size > topo.num_nodes))
        agree(comm, same(again, mpi_allreduce(comm.mpi, x, "sum")) and (bool(grown) or not windowed
                                                                         or c._runner.windows is None),
              f"shm with room: windows {grown}")
    finally:
        c.free()
    d = _fresh(comm)   # a call that publishes nothing needs no room: its windows whatever /dev/shm holds
    try:
        monkeypatch.setattr(window, "shm_free", lambda: 0)
        puts, read_put = [], Execution._read_put
        monkeypatch.setattr(Execution, "_read_put", lambda self, rnd, slot: (puts.append(rnd), read_put(self, rnd, slot)))
        x = _shared_copy(d, integer_valued((1 << 18,), np.dtype("f4"), "sum", comm.rank), True)
        out = d.shared_empty(x.shape, x.dtype)
        d.allreduce(x, out=out, algorithm="shm")
        windows, one_node = d._runner.windows, comm.size > 1 and d.topology.num_nodes == 1
        agree(comm, same(out, mpi_allreduce(comm.mpi, x, "sum")) and bool(puts) == one_node and
              (windows is None or all(s.nbytes == window._PAGE for s in windows.slots)),
              f"a call on shared inputs and results with no room left: window rounds {len(puts)}")
    finally:
        d.free()


def test_free_releases_the_windows(comm):
    c = _fresh(comm)
    c.broadcast(np.arange(10.0), algorithm="shm")
    opened = c._runner.windows
    c.free()
    agree(comm, c._runner.windows is None and (opened is None or opened.slots == [None] * window.SLOTS),
          "windows left after free()")
    d = _fresh(comm)
    try:
        got = d.broadcast(np.arange(10.0) * (comm.rank == 0), algorithm="shm")
        agree(comm, same(got, np.arange(10.0)), "shm broadcast after another Communicator's free")
    finally:
        d.free()


def _shared_copy(c, x, shared: bool):
    """``x`` in a ``shared_empty`` array (collective: every rank calls, ``shared`` or not) or as it is."""
    y = c.shared_empty(x.shape, x.dtype)
    y[...] = x
    return y if shared else x


def test_inputs_in_shared_memory(comm):
    """Inputs made by ``shared_empty`` (on every other rank, so both kinds meet in one call) are read by the peers
    where they lie: every shm collective equals MPI's, out of place and in place, uneven and zero counts. Where
    every rank's input lies there, the collectives that only read inputs publish nothing: their slots stay a page."""
    p, r = comm.size, comm.rank
    c = _fresh(comm)
    try:
        ok, shared = True, r % 2 == 0
        for n in (0, p - 1, 5 * p + 3):
            x = _shared_copy(c, integer_valued((n,), np.dtype("f8"), "sum", 7 * n + r), shared)
            rows = split_even(n, p)
            ok &= same(c.allreduce(x, algorithm="shm"), mpi_allreduce(comm.mpi, x, "sum"))
            ok &= same(c.reduce_scatter(x, algorithm="shm"), mpi_reduce_scatter(comm.mpi, x, "sum", rows))
            ok &= same(c.allgather(x[:rows[r]], algorithm="shm"), mpi_allgather(comm.mpi, x[:rows[r]]))
            ok &= same(c.alltoall(x, algorithm="shm"), mpi_alltoall(comm.mpi, x, rows))
            ok &= same(c.broadcast(x, root=p - 1, algorithm="shm"), comm.mpi.bcast(x, root=p - 1))
            expected = mpi_allreduce(comm.mpi, x, "sum")
            c.allreduce(x, algorithm="shm", out=x)                       # in place, on shared memory
            ok &= same(x, expected)
            even = p * (n // p)        # in place needs what a rank receives to fit where it sent from
            y = _shared_copy(c, integer_valued((even,), np.dtype("f8"), "sum", n + r), shared)
            expected = mpi_alltoall(comm.mpi, y, split_even(even, p))
            ok &= same(c.alltoall(y, algorithm="shm", out=y), expected)   # in place: peers read the slot
        agree(comm, ok, "shm collectives on shared_empty inputs")
        d = _fresh(comm)   # slots of a page each
        try:
            x = _shared_copy(d, integer_valued((4096 * p,), np.dtype("f8"), "sum", r), True)
            ok = same(d.allgather(x, algorithm="shm"), mpi_allgather(comm.mpi, x))
            ok &= same(d.reduce_scatter(x, algorithm="shm"), mpi_reduce_scatter(comm.mpi, x, "sum", [4096] * p))
            slots = d._runner.windows.slots if d._runner.windows else []
            agree(comm, ok and all(s.nbytes == window._PAGE for s in slots), "slots grown for lent inputs")
        finally:
            d.free()
    finally:
        c.free()


def test_shared_inputs_are_not_copied(comm):
    """A rank whose input lies in shared memory publishes nothing: its slot stays as allocated (zeros), while an
    ordinary input is copied in (the same call, the other kind of input)."""
    p, r = comm.size, comm.rank
    c = _fresh(comm)
    try:
        published = []
        for shared in (True, False):
            x = _shared_copy(c, np.full(64, r + 1.0), shared)
            got = c.allgather(x, algorithm="shm")
            slot = c._runner.windows.slots[(c._runner.windows.calls - 1) % window.SLOTS] if c._runner.windows else None  # this call's
            published.append(slot is not None and bool(slot.regions[r][:x.nbytes].view(x.dtype).any()))
            agree(comm, same(got, np.repeat(np.arange(1.0, p + 1), 64)), f"allgather (shared={shared})")
        windows = p > 1 and c._runner.windows is not None and c.topology.num_nodes == 1   # else allgather's ring
        agree(comm, not windows or published == [False, True], f"published into the slot (shared, not): {published}")
    finally:
        c.free()


def test_results_put_into_shared_memory(comm):
    """An allreduce whose ``out`` lies in shared memory gets its sums written there by their owners (``puts``):
    equal to MPI's with inputs and results in shared memory, only one of them there, in place, one kind on every
    other rank, every op, blocks of several chunks (engine/executor._PUT_CHUNK_BYTES), calls in flight. Where every
    rank's input and result lie there on one node, nothing is published into the call's slot: it stays zeros."""
    p, r = comm.size, comm.rank
    c = _fresh(comm)
    try:
        ok, chunk = True, 256 * 1024 // 8
        x = _shared_copy(c, integer_valued((3 * chunk * p + 5,), np.dtype("f8"), "sum", r), True)
        out = c.shared_empty(x.shape, x.dtype)
        c.allreduce(x, out=out, algorithm="shm")   # the first shm call: fresh slots
        slot = c._runner.windows.slots[0] if c._runner.windows else None
        one_node = p > 1 and slot is not None and c.topology.num_nodes == 1
        agree(comm, not one_node or (slot.nbytes == window._PAGE and not slot.regions[r].any()),
              "the slot grew or was published into although every rank lends and puts")
        ok &= same(out, mpi_allreduce(comm.mpi, x, "sum"))
        for n in (0, p - 1, 5 * p + 3, 3 * chunk * p + 5):
            for op in ("sum", "max", "prod"):
                x0 = integer_valued((n,), np.dtype("f8"), op, 7 * n + r)
                expected = mpi_allreduce(comm.mpi, x0, op)
                for kind in ("both", "out", "in", "in place", "every other"):
                    shared_x = kind in ("both", "in", "in place") or (kind == "every other" and r % 2 == 0)
                    shared_out = kind in ("both", "out") or (kind == "every other" and r % 2 == 0)
                    x = _shared_copy(c, x0, shared_x)
                    res = x if kind == "in place" else _shared_copy(c, np.full(n, -1.0), shared_out)
                    got = c.allreduce(x, op=op, out=res, algorithm="shm")
                    right = same(res, expected)
                    ok &= got is res and right
                    if not right:
                        print(f"rank {r}: n={n} {op} {kind}: {res[:4]} vs {expected[:4]}", flush=True)
        # in flight: two calls putting at once, completed last first
        xs = [_shared_copy(c, integer_valued((11 * p + k,), np.dtype("f8"), "sum", k + r), True) for k in range(2)]
        outs = [c.shared_empty(y.shape, y.dtype) for y in xs]
        reqs = [c.iallreduce(y, out=o, algorithm="shm") for y, o in zip(xs, outs)]
        for k in (1, 0):
            ok &= same(reqs[k].wait(), mpi_allreduce(comm.mpi, xs[k], "sum"))
        agree(comm, ok, "shm allreduce with results in shared memory")
    finally:
        c.free()


def test_shared_memory_outlives_free_while_used(comm):
    """A shared_empty window is released (at the next shared_empty, or free()) once no rank's array uses it, and
    not before: a kept array stays usable after free()."""
    c = _fresh(comm)
    kept = c.shared_empty((3, 4), np.float32)
    dropped = c.shared_empty(10)
    kept[...] = comm.rank
    view = kept[1:]
    del kept
    if comm.rank == 0:
        dropped = None                # still used on the other ranks: not released
    c.shared_empty(1)
    opened = c._runner.windows
    agree(comm, opened is None or [s is not None for s, _ in opened.shared] == [True, comm.size > 1, True],
          "a window released while a rank uses it")
    del dropped                       # now unused on every rank
    c.shared_empty(1)
    agree(comm, opened is None or [s is not None for s, _ in opened.shared] == [True, False, False, True],
          f"windows unused on every rank not released: {opened and [s is not None for s, _ in opened.shared]}")
    c.free()
    view += 1                         # still mapped: the window holding it was not freed
    agree(comm, view.shape == (2, 4) and bool((view == comm.rank + 1).all()), "array after free()")
    agree(comm, opened is None or opened.shared == [], "shared windows listed after free()")


def test_shared_empty_bad_shape_raises_everywhere(comm):
    """A bad shape on one rank raises on every rank (naming the call), and no rank allocates."""
    from helpers import raises
    c = _fresh(comm)
    try:
        shape = (-1, 2) if comm.rank == comm.size - 1 else (4, 2)
        raises(comm, lambda: c.shared_empty(shape), ValueError, ["shared_empty"])
        raises(comm, lambda: c.shared_empty("big"), TypeError, ["shared_empty"])
        if c.topology.num_nodes == 1 and window.shm_free() is not None:   # MPI's raw error stack named nothing
            huge = (window.shm_free() // 8 + 1,) if comm.rank == comm.size - 1 else (4,)
            raises(comm, lambda: c.shared_empty(huge), ValueError, ["shared_empty"])
        ok = c.shared_empty((2, 2), np.int32).shape == (2, 2)
        agree(comm, ok, "shared_empty after errors")
    finally:
        c.free()


def test_a_slot_takes_its_room_in_shared_memory_as_it_is_made(comm):
    """Shared memory takes room where a page is first written, and the room a slot's growth checks is what is free:
    each rank writes its region as the slot is made, so every slot counts whole in the next check (this
    Communicator's or another's). Before, a slot doubled for a call was written only as far as that call went, and
    a later call could fill the rest without any check seeing it (in a small /dev/shm: SIGBUS)."""
    node = comm.mpi.Split_type(MPI.COMM_TYPE_SHARED)
    before, nbytes, ranks = window.shm_free(), 16 << 20, node.Get_size()
    node.Barrier()
    slot = window.Slot(node, nbytes, list(range(ranks)))
    node.Barrier()
    taken = None if before is None else before - window.shm_free()
    slot.free()
    node.Free()
    agree(comm, taken is None or ranks == 1 or taken >= 0.9 * nbytes * ranks,   # one rank: private memory
          f"a slot of {nbytes} bytes a rank on {ranks} rank(s) took {taken} bytes of shared memory")


def test_a_shared_empty_input_of_a_window_call_is_released_once_unused(comm):
    """A shared_empty array handed to an "shm" call, then deleted: the next shared_empty releases its window (it
    stayed held by the slot's last call, to the end of the process, and free() left it: 8 MiB a rank each time;
    found by a helper)."""
    import gc
    c = pc.Communicator(comm.mpi)
    for _ in range(4):
        a = c.shared_empty(1 << 12)
        a[:] = 1.0
        y = c.allreduce(a, algorithm="shm")
        ok = bool((y == comm.size).all())
        del a, y
        gc.collect()
    c.shared_empty(8)   # releases what no array uses
    windows = c._runner.windows
    held = 0 if windows is None else sum(slot is not None for slot, _ in windows.shared)
    agree(comm, ok and held <= 1, f"{held} shared_empty windows still held (the newest one only should be)")
    c.free()
