"""ZeroAdamW checkpoints (pycollect.zero.checkpoint): save at the job's world size W, reload at every
M <= W (sub-communicators of M consecutive ranks) and every stage.

Parameters: float64, 53 elements in all (prime: padded at every W > 1). The state after the reload
must equal the saved one bit for bit; K more steps from the reload must equal K more steps of the
optimizer that never stopped, bit for bit when it reduces over the same group with the same
collective (the same stage, or stages 1 to 3 among themselves), to 1e-12 relative otherwise (sums
over other world sizes, or stage 0's allreduce against a reduce-scatter, differ in the last bits).
Damaged checkpoints are refused on every rank with a message naming the file and the fault.
"""
import hashlib
import json
import os
import re
import shutil
import tempfile

import numpy as np
import pytest

from helpers import agree, carve_group, rel_close, release_group
from pycollect.zero import STAGES, ZeroAdamW, load_checkpoint, save_checkpoint
from pycollect.zero import checkpoint as ckpt
from pycollect.zero.checkpoint import METADATA, CheckpointError

SHAPES = {"emb": (7, 3), "w1": (3, 5), "b1": (5,), "w2": (5, 2), "b2": (2,)}  # 53 elements
CONFIG = dict(lr=1e-2, betas=(0.9, 0.99), eps=1e-8, weight_decay=0.1, no_decay=("b1", "b2"),
              loss_scale="dynamic", growth_interval=2, max_grad_norm=6e-5)
STEPS, MORE = 4, 2  # steps before the save (step 1 overflows and is skipped), steps after it
RTOL = 1e-12


def make_params(dtype=np.float64, seed=3) -> dict:
    rng = np.random.default_rng(seed)
    return {n: rng.standard_normal(s).astype(dtype) for n, s in SHAPES.items()}


def grads_for(step: int, rank: int, size: int, dtype=np.float64) -> dict:
    """Local gradients whose average over ``size`` ranks is the same at every size (up to rounding);
    step 1 holds an inf on rank 0, so the dynamic loss scale skips it and halves."""
    rng = np.random.default_rng(1000 + step)
    out = {}
    for n, s in SHAPES.items():
        g, d = rng.standard_normal(s), rng.standard_normal(s)
        out[n] = (g + 0.1 * (rank - (size - 1) / 2) * d).astype(dtype)
    if step == 1 and rank == 0:
        out["b1"][2] = np.inf
    return out


def run(opt, group, steps, dtype=np.float64) -> None:
    for k in steps:
        opt.step(grads_for(k, group.rank, group.size, dtype))


def counters(opt) -> tuple:
    return (opt.t, opt.loss_scale, opt.good_steps, opt.skipped, opt.lr, opt.betas, opt.eps, opt.weight_decay,
            opt.no_decay, opt.max_grad_norm, opt.growth_interval, opt.dtype, opt.master_dtype)


def same_state(a: dict, b: dict) -> bool:
    return all(a[k][n].dtype == b[k][n].dtype and np.array_equal(a[k][n], b[k][n]) for k in a for n in SHAPES)


def close_state(a: dict, b: dict) -> bool:
    return all(rel_close(np.concatenate([a[k][n].ravel() for n in SHAPES]),
                         np.concatenate([b[k][n].ravel() for n in SHAPES]), RTOL) for k in a)


@pytest.fixture
def shared_dir(comm):
    """A directory every rank agrees on (rank 0 makes it), removed after the test."""
    path = tempfile.mkdtemp(prefix="pycollect-ckpt-") if comm.rank == 0 else None
    path = comm.mpi.bcast(path, root=0)
    yield path
    comm.mpi.Barrier()
    if comm.rank == 0:
        shutil.rmtree(path, ignore_errors=True)


def on_root(comm, fn) -> None:
    """``fn()`` on rank 0 while the others wait."""
    if comm.rank == 0:
        fn()
    comm.mpi.Barrier()


# -- resharding ---------------------------------------------------------------------------------------
@pytest.mark.parametrize("saved_stage", STAGES)
def test_reshard_every_size_and_stage_bit_identical_and_continues(comm, shared_dir, saved_stage):
    path = os.path.join(shared_dir, "made", "by", "save")  # created by save
    opt = ZeroAdamW(make_params(), comm, stage=saved_stage, **CONFIG)
    run(opt, comm, range(STEPS))
    before, saved = opt.full_state(), counters(opt)
    save_checkpoint(opt, path)
    assert opt.skipped == 1 and opt.t == STEPS - 1  # the overflow was skipped: the loss-scale state is live
    run(opt, comm, range(STEPS, STEPS + MORE))
    never_stopped = opt.full_state()
    problems = []
    for m in range(1, comm.size + 1):
        group, sub = carve_group(comm, m)
        if group is not None:
            for stage in STAGES:
                got = load_checkpoint(path, group, stage)
                if got.stage != stage or got.world != (1 if stage == 0 else m):
                    problems.append(f"M={m} stage {stage}: built at stage {got.stage}, world {got.world}")
                if not same_state(got.full_state(), before):
                    problems.append(f"M={m} stage {stage}: state after the reshard differs")
                if counters(got) != saved:
                    problems.append(f"M={m} stage {stage}: counters {counters(got)} != {saved}")
                params = got.full_params()
                if not all(np.array_equal(params[n], before["master"][n]) for n in SHAPES):
                    problems.append(f"M={m} stage {stage}: parameters are not the master weights")
                run(got, group, range(STEPS, STEPS + MORE))
                after = got.full_state()
                # stages 1 to 3 reduce-scatter the same buckets and take the norm from the same shards
                exact = m == comm.size and (stage == saved_stage or min(stage, saved_stage) >= 1)
                if not (same_state(after, never_stopped) if exact else close_state(after, never_stopped)):
                    problems.append(f"M={m} stage {stage}: {MORE} steps after the reload left the trajectory "
                                    f"({'bit for bit' if exact else f'rtol {RTOL}'})")
        release_group(group, sub)
    agree(comm, not problems, f"saved at stage {saved_stage}: {problems[:4]}")


@pytest.mark.parametrize("dtype", ["float16", "bfloat16"])
def test_mixed_precision_reshard(comm, shared_dir, dtype):
    """float32 master weights and moments round trip; parameters come back as the master cast."""
    dt = np.dtype(dtype)  # helpers imports ml_dtypes, which names bfloat16
    opt = ZeroAdamW(make_params(dt), comm, stage=2, **CONFIG)
    run(opt, comm, range(STEPS), dt)
    before, saved = opt.full_state(), counters(opt)
    save_checkpoint(opt, shared_dir)
    problems = []
    for m in range(1, comm.size + 1):
        group, sub = carve_group(comm, m)
        if group is not None:
            for stage in STAGES:
                got = load_checkpoint(shared_dir, group, stage)
                params = got.full_params()
                if (not same_state(got.full_state(), before) or counters(got) != saved
                        or not all(params[n].dtype == dt and np.array_equal(params[n], before["master"][n].astype(dt))
                                   for n in SHAPES)):
                    problems.append(f"M={m} stage {stage}")
        release_group(group, sub)
    agree(comm, not problems, f"{dtype}: {problems[:4]}")


@pytest.mark.parametrize("stage", STAGES)
def test_load_into_callers_params(comm, shared_dir, stage):
    """``params=``: checked, filled with the saved values and kept (stages 0-2), only checked at stage 3."""
    opt = ZeroAdamW(make_params(), comm, stage=1, **CONFIG)
    run(opt, comm, range(STEPS))
    before = opt.full_state()
    save_checkpoint(opt, shared_dir)
    mine = {n: np.zeros(s) for n, s in SHAPES.items()}
    got = load_checkpoint(shared_dir, comm, stage, params=mine, lr=5e-3, bucket_bytes=64)
    ok = got.lr == 5e-3 and same_state(got.full_state(), before)
    if stage < 3:
        ok &= got.params is mine and all(np.array_equal(mine[n], before["master"][n]) for n in SHAPES)
        got.step(grads_for(STEPS, comm.rank, comm.size))
        ok &= all(np.array_equal(mine[n], got.full_state()["master"][n]) for n in SHAPES)  # updated in place
    else:
        ok &= all(not mine[n].any() for n in SHAPES)
    agree(comm, ok, f"stage {stage}: params= not honoured")


# -- refusals -----------------------------------------------------------------------------------------
def _json(path):
    with open(path) as f:
        return json.load(f)


def _rank_file(path, rank):
    meta = _json(os.path.join(path, METADATA))
    return os.path.join(path, meta["files"][rank]["name"])


def _meta_sha256(meta: dict) -> str:
    """The metadata's own checksum as the format defines it: sha256 of the canonical JSON of every field
    but "sha256" (sorted keys, no spaces)."""
    rest = {k: v for k, v in meta.items() if k != "sha256"}
    return hashlib.sha256(json.dumps(rest, sort_keys=True, separators=(",", ":"), allow_nan=False).encode()).hexdigest()


def _write_meta(path, meta, resign=True):
    """``meta`` as the checkpoint's metadata, its checksum recomputed (``resign``) or left as it was."""
    if resign:
        meta["sha256"] = _meta_sha256(meta)
    with open(os.path.join(path, METADATA), "w") as f:
        json.dump(meta, f)


def _edit_meta(fn, resign=True):
    """Edit the parsed metadata with ``fn``; re-signed, so the load sees the edit itself, unless ``resign``
    is false (then the checksum refuses it)."""
    def edit(path):
        meta = _json(os.path.join(path, METADATA))
        fn(meta)
        _write_meta(path, meta, resign)
    return edit


def _alter(old, new):
    """Replace the one occurrence of ``old`` in checkpoint.json's text by ``new`` (still valid JSON that
    passes every field check); the checksum is left as it was."""
    def edit(path):
        file = os.path.join(path, METADATA)
        with open(file) as f:
            text = f.read()
        assert text.count(old) == 1, f"{old!r} occurs {text.count(old)} times in {METADATA}"
        with open(file, "w") as f:
            f.write(text.replace(old, new))
    return edit


def _truncate(path):
    file = _rank_file(path, -1)
    with open(file, "r+b") as f:
        f.truncate(os.path.getsize(file) - 7)


def _flip(path):
    file = _rank_file(path, 0)
    with open(file, "r+b") as f:
        f.seek(os.path.getsize(file) // 2)
        b = f.read(1)
        f.seek(-1, 1)
        f.write(bytes([b[0] ^ 0x40]))


def _truncate_meta(path):
    file = os.path.join(path, METADATA)
    with open(file, "r+b") as f:
        f.truncate(os.path.getsize(file) // 2)


def _resign_as_float32(path):
    """Rank file 0 rewritten with float32 arrays, its size and checksum updated in the metadata."""
    file = os.path.join(path, METADATA)
    meta = _json(file)
    entry = meta["files"][0]
    with np.load(os.path.join(path, entry["name"]), allow_pickle=False) as z:
        data = ckpt._npz_bytes({k: z[k].astype(np.float32) for k in z.files})
    with open(os.path.join(path, entry["name"]), "wb") as f:
        f.write(data)
    entry["bytes"], entry["sha256"] = len(data), hashlib.sha256(data).hexdigest()
    _write_meta(path, meta)


def _set(key, value):
    return _edit_meta(lambda m: m.__setitem__(key, value))


def _hyper(key, value):
    return _edit_meta(lambda m: m["hyperparameters"].__setitem__(key, value))


FILE = r"rank-\d{5}-of-\d{5}\.[0-9a-f]{16}\.npz"
ALTERED = METADATA + r": sha256 checksum of the metadata mismatch \(altered\)"
CORRUPTIONS = {
    "truncated rank file": (_truncate, FILE + r": \d+ bytes, expected \d+ \(truncated or altered\)"),
    "flipped byte": (_flip, FILE + r": sha256 checksum mismatch \(altered\)"),
    "deleted rank file": (lambda p: os.unlink(_rank_file(p, -1)), FILE + r": rank file missing"),
    "re-signed with other dtypes": (_resign_as_float32, FILE + r": array 'master' is float32\(\d+,\), expected float64"),
    "shapes edited": (_edit_meta(lambda m: m["shapes"].__setitem__("w1", [3, 6])),
                      METADATA + r": offsets .* disagree with the shapes"),
    "world edited": (_edit_meta(lambda m: m.__setitem__("world", m["world"] + 1)),
                     METADATA + r": world \d+ but \d+ rank files listed"),
    "unknown version": (_set("version", 99), METADATA + r": unknown metadata version 99"),
    "metadata truncated": (_truncate_meta, METADATA + r": not valid JSON"),
    "metadata missing": (lambda p: os.unlink(os.path.join(p, METADATA)), METADATA + r": no checkpoint metadata"),
    "file outside the directory": (_edit_meta(lambda m: m["files"][0].__setitem__("name", "../" + m["files"][0]["name"])),
                                   METADATA + r": rank file entry 0 is malformed"),
    # the metadata's own checksum: one character changed, still valid JSON that passes every field check
    "step count altered": (_alter('"t": 3,', '"t": 4,'), ALTERED),  # t = STEPS - 1 (step 1 was skipped)
    "loss scale altered": (_alter('"value": 65536.0,', '"value": 95536.0,'), ALTERED),  # CONFIG: dynamic
    "lr altered": (_alter('"lr": 0.01,', '"lr": 0.02,'), ALTERED),
    "world edited, not re-signed": (_edit_meta(lambda m: m.__setitem__("world", m["world"] + 1), resign=False),
                                    ALTERED),
    "metadata checksum malformed": (_edit_meta(lambda m: m.__setitem__("sha256", m["sha256"][:-1]), resign=False),
                                    METADATA + r": sha256 checksum of the metadata malformed: .* \(altered\)"),
    "metadata checksum removed": (_edit_meta(lambda m: m.pop("sha256"), resign=False),
                                  METADATA + r": no sha256 of the metadata \(written by an older pycollect, or altered\)"),
    "version 1 metadata": (_edit_meta(lambda m: (m.pop("sha256"), m.__setitem__("version", 1)), resign=False),
                           METADATA + r": metadata version 1 has no sha256 of its own.*reads version 2 only"),
    # hyperparameters out of range (re-signed): a CheckpointError naming the file and the field, as the other fields'
    # (before: ZeroAdamW's ValueError, raised only after every rank file had been read)
    "lr out of range": (_hyper("lr", -1), METADATA + r": hyperparameters: lr must be a finite number >= 0.0, got -1"),
    "betas out of range": (_hyper("betas", [1.5, 2]),
                           METADATA + r": hyperparameters: betas must be two numbers in \[0, 1\), got \[1.5, 2\]"),
    "eps zero": (_hyper("eps", 0), METADATA + r": hyperparameters: eps must be a finite number > 0.0, got 0"),
    "weight_decay negative": (_hyper("weight_decay", -5),
                              METADATA + r": hyperparameters: weight_decay must be a finite number >= 0.0, got -5"),
    "max_grad_norm negative": (_hyper("max_grad_norm", -1),
                               METADATA + r": hyperparameters: max_grad_norm must be a finite number > 0.0, got -1"),
    "stage a float": (_set("stage", 1.0), METADATA + r": stage must be one of \(0, 1, 2, 3\), got 1.0"),
}


@pytest.fixture(scope="module")
def saved(comm):
    """One checkpoint (stage 1, the job's world size) and its state, copied for each corruption."""
    path = tempfile.mkdtemp(prefix="pycollect-ckpt-base-") if comm.rank == 0 else None
    path = comm.mpi.bcast(path, root=0)
    opt = ZeroAdamW(make_params(), comm, stage=1, **CONFIG)
    run(opt, comm, range(STEPS))
    save_checkpoint(opt, path)
    yield path
    comm.mpi.Barrier()
    if comm.rank == 0:
        shutil.rmtree(path, ignore_errors=True)


@pytest.mark.parametrize("case", list(CORRUPTIONS))
def test_damaged_checkpoint_refused_on_every_rank(comm, saved, shared_dir, case):
    damage, message = CORRUPTIONS[case]
    path = os.path.join(shared_dir, "copy")
    on_root(comm, lambda: (shutil.copytree(saved, path), damage(path)))
    for m in sorted({comm.size, 1}):
        group, sub = carve_group(comm, m)
        for stage in (1, 0):
            with pytest.raises(CheckpointError, match=message):
                load_checkpoint(path, group, stage)
        release_group(group, sub)
    comm.mpi.Barrier()


def test_metadata_checksum_covers_the_content_not_the_layout(comm, saved, shared_dir):
    """The saved metadata (version 2) carries the sha256 of its canonical JSON; rewritten with other
    whitespace (the same content, not re-signed) it still loads, to the same state."""
    meta = _json(os.path.join(saved, METADATA))
    agree(comm, meta["version"] == ckpt.VERSION == 2 and meta.get("sha256") == _meta_sha256(meta),
          f"version {meta['version']}, sha256 {meta.get('sha256')!r} != {_meta_sha256(meta)!r}")
    path = os.path.join(shared_dir, "copy")
    on_root(comm, lambda: (shutil.copytree(saved, path), _edit_meta(lambda m: None, resign=False)(path)))
    with open(os.path.join(path, METADATA)) as f:
        agree(comm, "\n" not in f.read(), "the metadata was not rewritten")
    got, want = load_checkpoint(path, comm, 1), load_checkpoint(saved, comm, 1)
    agree(comm, same_state(got.full_state(), want.full_state()) and counters(got) == counters(want),
          "the reformatted metadata loads to another state")


def test_params_that_differ_from_the_checkpoint_are_refused(comm, saved):
    transposed = make_params()
    transposed["w1"] = transposed["w1"].T.copy()
    reordered = dict(reversed(list(make_params().items())))
    single = {n: p.astype(np.float32) for n, p in make_params().items()}
    fewer = {n: p for n, p in make_params().items() if n != "b2"}
    cases = [(transposed, METADATA + r": parameter 'w1' has shape \(5, 3\) but the checkpoint has \(3, 5\)"),
             (reordered, r"parameter names differ .*another order"),
             (single, r"parameter 'emb' has dtype float32 but the checkpoint has float64"),
             (fewer, r"params has \[\] that it lacks, lacks \['b2'\]")]
    for params, message in cases:
        with pytest.raises(CheckpointError, match=message):
            load_checkpoint(saved, comm, 2, params=params)
    with pytest.raises(CheckpointError, match="stage must be one of"):
        load_checkpoint(saved, comm, 4)
    with pytest.raises(CheckpointError, match=r"unknown settings \['momentum'\]"):
        load_checkpoint(saved, comm, 1, momentum=0.9)


@pytest.mark.parametrize("stage", [0, 1, 2])
def test_a_read_only_target_refuses_the_load_before_any_is_written(comm, saved, stage):
    """params={... "b2": read-only} on the last rank alone: CheckpointError naming params['b2'] on every rank, and no
    rank's params written (before: the last rank's other arrays held the saved values, then numpy's "assignment
    destination is read-only" there while the others went on)."""
    mine = {n: np.full(s, -7.0) for n, s in SHAPES.items()}
    if comm.rank == comm.size - 1:
        mine["b2"].flags.writeable = False
    try:
        load_checkpoint(saved, comm, stage, params=mine)
        got = "no error"
    except CheckpointError as e:
        want = f"params['b2'] is read-only; at stage {stage} the load writes the saved values"
        got = "" if want in str(e) else str(e)
    agree(comm, not got, f"stage {stage}: {got}")
    agree(comm, all(np.all(mine[n] == -7.0) for n in SHAPES), "params written by a load that raised")


def test_ranks_that_disagree_on_a_load_are_refused_on_every_rank(comm, saved, shared_dir):
    """The last rank passes another path (a valid checkpoint of another run, the same shapes), another stage, a bad
    stage, an unknown setting or another lr: CheckpointError on every rank, nothing built (before: a silent mix of
    two runs' shards, MPI's "Message truncated" abort, or the others waiting for ever)."""
    other = os.path.join(shared_dir, "other")
    opt = ZeroAdamW(make_params(seed=9), comm, stage=1, **CONFIG)
    run(opt, comm, range(2))
    save_checkpoint(opt, other)
    last = comm.rank == comm.size - 1
    cases = [("another path", lambda: load_checkpoint(other if last else saved, comm, 1), "read another checkpoint"),
             ("another stage", lambda: load_checkpoint(saved, comm, 1 if last else 0), "pass another stage"),
             ("a bad stage", lambda: load_checkpoint(saved, comm, 4 if last else 1), "stage must be one of"),
             ("an unknown setting", lambda: load_checkpoint(saved, comm, 1, **({"lrr": 1.0} if last else {})),
              r"unknown settings \['lrr'\]"),
             ("another lr", lambda: load_checkpoint(saved, comm, 2, lr=0.5 if last else 0.1), "other settings")]
    problems = []
    for what, load, words in cases:
        try:
            load()
            got = "no error"
        except CheckpointError as e:
            got = "" if re.search(words, str(e)) else str(e)
        if got and (comm.size > 1 or what in ("a bad stage", "an unknown setting")):
            problems.append(f"{what}: {got}")
    agree(comm, not problems, "; ".join(problems))


def test_ranks_saving_to_other_paths_keep_the_previous_checkpoint(comm, shared_dir):
    """The last rank saves to another directory than the others: CheckpointError on every rank, and the previous
    checkpoint in the others' directory stays whole and loadable (before: every rank returned, the metadata named a
    file in the other directory and the previous checkpoint's files were removed)."""
    if comm.size == 1:
        return
    opt = ZeroAdamW(make_params(), comm, stage=1, **CONFIG)
    run(opt, comm, range(2))
    save_checkpoint(opt, shared_dir)
    first, first_counters = opt.full_state(), counters(opt)
    run(opt, comm, range(2, 3))
    elsewhere = os.path.join(shared_dir, "elsewhere")
    error = ""
    try:
        save_checkpoint(opt, elsewhere if comm.rank == comm.size - 1 else shared_dir)
    except CheckpointError as e:
        error = str(e)
    ok = f"the files of ranks [{comm.size - 1}] are not in" in error
    got = load_checkpoint(shared_dir, comm, 1)
    agree(comm, ok and same_state(got.full_state(), first) and counters(got) == first_counters,
          f"error {error!r}; the previous checkpoint {'whole' if same_state(got.full_state(), first) else 'lost'}")


# -- interrupted saves --------------------------------------------------------------------------------
def _rank_files(path):
    return sorted(f for f in os.listdir(path) if f.startswith("rank-"))


def test_save_interrupted_before_the_metadata_keeps_the_previous(comm, shared_dir, monkeypatch):
    opt = ZeroAdamW(make_params(), comm, stage=2, **CONFIG)
    run(opt, comm, range(STEPS))
    save_checkpoint(opt, shared_dir)
    first, first_counters = opt.full_state(), counters(opt)
    run(opt, comm, range(STEPS, STEPS + MORE))

    def crash(path, meta):
        raise RuntimeError("simulated crash before the metadata")
    monkeypatch.setattr(ckpt, "_write_metadata", crash)  # rank files written, then rank 0 "dies"
    with pytest.raises(CheckpointError, match="simulated crash before the metadata"):
        save_checkpoint(opt, shared_dir)
    monkeypatch.undo()
    agree(comm, len(_rank_files(shared_dir)) == 2 * comm.size, f"rank files {_rank_files(shared_dir)}")
    got = load_checkpoint(shared_dir, comm, 2)
    agree(comm, same_state(got.full_state(), first) and counters(got) == first_counters,
          "the previous checkpoint did not survive the interrupted save")

    def disk_full(arrays):
        raise OSError(28, "No space left on device")
    if comm.rank == comm.size - 1:
        monkeypatch.setattr(ckpt, "_npz_bytes", disk_full)  # one rank cannot write its file
    with pytest.raises(CheckpointError, match=rf"No space left on device \(found by rank {comm.size - 1};"
                                              if comm.size > 1 else "No space left on device"):
        save_checkpoint(opt, shared_dir)
    monkeypatch.undo()
    got = load_checkpoint(shared_dir, comm, 3)
    agree(comm, same_state(got.full_state(), first), "the previous checkpoint did not survive a failed rank file")

    save_checkpoint(opt, shared_dir)  # a save that completes removes what the interrupted ones left
    agree(comm, len(_rank_files(shared_dir)) == comm.size, f"rank files left: {_rank_files(shared_dir)}")
    got = load_checkpoint(shared_dir, comm, 1)
    agree(comm, same_state(got.full_state(), opt.full_state()) and got.t == opt.t, "the new checkpoint")


def test_save_between_grad_ready_and_step_is_refused(comm, shared_dir):
    opt = ZeroAdamW(make_params(), comm, stage=1, **CONFIG)
    grads = grads_for(0, comm.rank, comm.size)
    opt.grad_ready("b2", grads["b2"])
    with pytest.raises(CheckpointError, match="between grad_ready and step"):
        save_checkpoint(opt, shared_dir)
    opt.step(grads)
    agree(comm, not os.path.exists(os.path.join(shared_dir, METADATA)), "metadata written by a refused save")


# -- owned parameters (each rank's own experts) ---------------------------------------------------------------
def owned_of(rank: int, dtype=np.float64) -> tuple[dict, dict]:
    """Rank ``rank``'s own parameters (different values on every rank) and their gradient arrays."""
    rng = np.random.default_rng(50 + rank)
    params = {"e.w": rng.standard_normal((2, 3)).astype(dtype), "e.b": rng.standard_normal(2).astype(dtype)}
    return params, {n: np.zeros_like(a) for n, a in params.items()}


def run_owned(opt, grads: dict, group, steps) -> None:
    for k in steps:
        rng = np.random.default_rng([77, k, group.rank])
        for n, g in grads.items():
            g[...] = rng.standard_normal(g.shape)
        opt.step(grads_for(k, group.rank, group.size))


@pytest.mark.parametrize("stage", STAGES)
def test_owned_parameters_round_trip_at_the_saving_size(comm, shared_dir, stage):
    """Each rank's owned state is in its own rank file: reloaded at the same size and any stage, the
    owned master weights, moments and the caller's owned arrays are bit-identical, and the next steps
    follow the optimizer that never stopped. At another size, or without owned_params, or with
    misshapen ones, load refuses on every rank."""
    path = os.path.join(shared_dir, "owned")
    params, grads = owned_of(comm.rank)
    opt = ZeroAdamW(make_params(), comm, stage=stage, owned_params=params, owned_grads=grads, **CONFIG)
    run_owned(opt, grads, comm, range(STEPS))
    saved = {k: getattr(opt.owned, k).copy() for k in ("master", "m", "v")}
    at_save = {n: a.copy() for n, a in params.items()}      # the caller's arrays as saved, apart from any layout
    save_checkpoint(opt, path)
    run_owned(opt, grads, comm, range(STEPS, STEPS + MORE))
    never_stopped = {n: a.copy() for n, a in params.items()}
    problems = []
    for load_stage in STAGES:
        mine, mine_grads = owned_of(comm.rank)  # fresh arrays: load fills them
        got = load_checkpoint(path, comm, load_stage, owned_params=mine, owned_grads=mine_grads)
        if not all(np.array_equal(getattr(got.owned, k), saved[k]) for k in saved):
            problems.append(f"stage {load_stage}: owned state differs after the reload")
        if not all(np.array_equal(mine[n], at_save[n]) for n in mine):
            problems.append(f"stage {load_stage}: the caller's owned arrays are not the saved master weights")
        run_owned(got, mine_grads, comm, range(STEPS, STEPS + MORE))
        if not all(rel_close(mine[n], never_stopped[n], RTOL) for n in mine):
            problems.append(f"stage {load_stage}: {MORE} steps after the reload left the trajectory")
    for what, call, match in (
            ("no owned_params", lambda: load_checkpoint(path, comm, stage), "owned_params must be"),
            ("misshapen", lambda: load_checkpoint(path, comm, stage, owned_params={"e.w": np.zeros((3, 2)),
                                                                                  "e.b": np.zeros(2)},
                                                 owned_grads={"e.w": np.zeros((3, 2)), "e.b": np.zeros(2)}),
             "owned_params must be")):
        try:
            call()
            problems.append(f"{what}: no error")
        except CheckpointError as e:
            if match not in str(e):
                problems.append(f"{what}: {e}")
    if comm.size > 1:  # another size: the experts would land on other ranks
        group, sub = carve_group(comm, comm.size - 1)
        if group is not None:
            mine, mine_grads = owned_of(comm.rank)
            try:
                load_checkpoint(path, group, stage, owned_params=mine, owned_grads=mine_grads)
                problems.append("another size: no error")
            except CheckpointError as e:
                if f"load it at {comm.size} ranks, not {comm.size - 1}" not in str(e):
                    problems.append(f"another size: {e}")
        release_group(group, sub)
    agree(comm, not problems, "; ".join(problems))


def test_owned_parameters_are_refused_by_a_checkpoint_without_them(comm, shared_dir):
    path = os.path.join(shared_dir, "plain")
    save_checkpoint(ZeroAdamW(make_params(), comm, stage=1, **CONFIG), path)
    mine, mine_grads = owned_of(comm.rank)
    with pytest.raises(CheckpointError, match="holds no owned parameters, but owned_params were passed"):
        load_checkpoint(path, comm, 1, owned_params=mine, owned_grads=mine_grads)


def test_a_group_that_is_no_communicator_and_an_opt_that_is_no_optimizer_are_refused(comm, shared_dir):
    """load_checkpoint(path, MPI.COMM_WORLD) raised a TypeError about a str on rank 0 and left the others waiting;
    save_checkpoint(None, path) an AttributeError naming nothing (found by a helper)."""
    from mpi4py import MPI
    from pycollect.zero import load_checkpoint, save_checkpoint
    with pytest.raises(TypeError, match="load_checkpoint: group must be a pycollect Communicator"):
        load_checkpoint(str(shared_dir), MPI.COMM_WORLD)
    with pytest.raises(TypeError, match="opt must be a ZeroAdamW, got NoneType"):
        save_checkpoint(None, str(shared_dir))
