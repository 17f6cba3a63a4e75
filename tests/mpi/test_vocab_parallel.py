"""Vocabulary parallelism (pycollect.parallel.vocab) against its single-process twin from pycollect.nn.

Groups of 1, 2 and 4 ranks split from the world (ranks left over when the world does not divide sit
the test out; sizes larger than the world skip on every rank). Every rank draws the same full
weights, ids and logits; the embedding is compared with nn.Embedding (float64 to 1e-12), the
cross-entropy with nn.cross_entropy on the full logits (float64 to 1e-10), and the cross-entropy is
checked never to communicate more than B*T elements at once.
"""
import numpy as np
import pytest

from helpers import agree, carved
from helpers import rel_close as close
from pycollect.nn import Embedding
from pycollect.nn.loss import cross_entropy
from pycollect.parallel.mappings import allgather_along
from pycollect.parallel.vocab import VocabParallelCrossEntropy, VocabParallelEmbedding

B, T, T_MAX, C, V = 2, 5, 7, 4, 48  # V divides by 1, 2 and 4; V/4 * B * T > B * T
F8 = np.dtype("f8")


@pytest.fixture(scope="module", params=[1, 2, 4])
def group(request, comm):
    """The tp group of this rank as a Communicator, or None when this rank is left over."""
    with carved(comm, request.param) as g:
        yield g


@pytest.fixture
def record_traffic(monkeypatch):
    """Wrap ``group.allreduce`` and ``group.allgather``; returns a list of (name, size) of every array sent."""
    def wrap(group):
        sent = []
        for name in ("allreduce", "allgather"):
            inner = getattr(group, name)

            def recorded(x, *args, _inner=inner, _name=name, **kwargs):
                sent.append((_name, int(x.size)))
                return _inner(x, *args, **kwargs)
            monkeypatch.setattr(group, name, recorded)
        return sent
    return wrap


def ids(seed, ignore_index=None):
    """(B, T) ids over all of [0, V) with repeats; with ``ignore_index`` a few set to it."""
    rng = np.random.default_rng(seed)
    idx = rng.integers(0, V, (B, T))
    idx[0, 1] = idx[0, 0]  # repeated tokens within a row and across rows
    idx[1, 3] = idx[0, 0]
    idx[1, 0] = V - 1  # the last shard is always hit
    if ignore_index is not None:
        idx[0, 2] = idx[1, 4] = ignore_index
    return idx


def block(x, group, axis=-1):
    n = x.shape[axis] // group.size
    return np.take(x, np.arange(group.rank * n, (group.rank + 1) * n), axis=axis)


def test_embedding_matches_single_process(comm, group):
    """forward, full grads (accumulated over two backwards) as nn.Embedding, with repeated tokens."""
    if group is None:
        return agree(comm, True, "left over")
    rng = np.random.default_rng(5)
    wte, wpe, dout = rng.standard_normal((V, C)), rng.standard_normal((T_MAX, C)), rng.standard_normal((B, T, C))
    idx = ids(6)
    ref = Embedding(wte.copy(), wpe.copy())
    y_ref = ref.forward(idx)
    ref.backward(dout)
    ref.backward(dout)
    emb = VocabParallelEmbedding.from_full({"wte": wte, "wpe": wpe}, group)
    y = emb.forward(idx)
    emb.backward(dout)
    emb.backward(dout)
    full = emb.full_grads()
    ok = emb.params["wte"].shape == (V // group.size, C) and close(y, y_ref, 1e-12)
    ok = ok and sorted(full) == ["wpe", "wte"] and all(close(full[k], ref.grads[k], 1e-12) for k in full)
    emb.zero_grad()
    ok = ok and all(not g.any() for g in emb.full_grads().values())
    agree(comm, ok, f"VocabParallelEmbedding p={group.size}")


@pytest.mark.parametrize("ignore_index", [None, -100, 3])
def test_cross_entropy_matches_single_process(comm, group, ignore_index, record_traffic):
    """loss and gathered dlogits as nn.cross_entropy; three allreduces of at most B*T elements."""
    if group is None:
        return agree(comm, True, "left over")
    rng = np.random.default_rng(8)
    logits = rng.standard_normal((B, T, V)) * 3.0
    targets = ids(9, ignore_index)
    loss_ref, dlogits_ref = cross_entropy(logits, targets, ignore_index)
    ce = VocabParallelCrossEntropy(group, ignore_index=ignore_index, equal_shards=True)   # block(): V/p each
    sent = record_traffic(group)
    loss = ce.forward(block(logits, group), targets)
    dshard = ce.backward()
    traffic = list(sent)
    dlogits = allgather_along(dshard, -1, group)  # (B, T, V), for the comparison only
    ok = dshard.shape == (B, T, V // group.size)
    ok = ok and close(loss, loss_ref, 1e-10) and close(dlogits, dlogits_ref, 1e-10)
    ok = ok and all(n <= B * T for _, n in traffic)
    ok = ok and len(traffic) == (3 if group.size > 1 else 0)
    agree(comm, ok, f"VocabParallelCrossEntropy p={group.size} ignore_index={ignore_index}: traffic {traffic}")


@pytest.mark.parametrize("dtype, top", [(np.int8, 128), (np.uint8, 256), (np.int16, 300)])
def test_narrow_id_dtypes_equal_int64(comm, group, dtype, top):
    """Ids and targets of a narrow integer dtype, a vocabulary whose shards start beyond it (V = 256 p): the same
    embedding, loss and gradients as int64 ids (before, ``ids - lo`` overflowed in the ids' dtype on the ranks
    past the first: OverflowError there, the others waiting)."""
    if group is None:
        return agree(comm, True, "left over")
    v = 256 * group.size
    rng = np.random.default_rng(11)
    wte, wpe = rng.standard_normal((v, C)), rng.standard_normal((T_MAX, C))
    wide = rng.integers(0, min(top, v), (B, T))
    narrow = wide.astype(dtype)
    emb = VocabParallelEmbedding.from_full({"wte": wte, "wpe": wpe}, group)
    logits = rng.standard_normal((B, T, v))
    ce = VocabParallelCrossEntropy(group, equal_shards=True)
    got = (emb.forward(narrow), ce.forward(block(logits, group), narrow), ce.backward())
    want = (emb.forward(wide), ce.forward(block(logits, group), wide), ce.backward())
    agree(comm, all(np.array_equal(a, b) for a, b in zip(got, want)), f"{np.dtype(dtype)} ids p={group.size}")


def test_cross_entropy_all_ignored_is_zero(comm, group):
    if group is None:
        return agree(comm, True, "left over")
    logits = np.random.default_rng(10).standard_normal((B, T, V))
    ce = VocabParallelCrossEntropy(group, ignore_index=-1)
    loss = ce.forward(block(logits, group), np.full((B, T), -1))
    ok = float(loss) == 0.0 and not ce.backward().any()
    agree(comm, ok, f"VocabParallelCrossEntropy p={group.size}: all targets ignored")


def test_vocab_that_does_not_divide_raises(comm, group):
    """V not divisible by the group size: ValueError naming V and the size, on every rank of the group."""
    if group is None or group.size == 1:
        return agree(comm, True, "every V divides by a group of one")
    bad = group.size * 5 + 1
    rng = np.random.default_rng(11)
    wte, wpe = rng.standard_normal((bad, C)), rng.standard_normal((T_MAX, C))
    try:
        VocabParallelEmbedding.from_full({"wte": wte, "wpe": wpe}, group)
        msg = "no error"
    except ValueError as e:
        msg = "" if (f"V (wte.shape[0]) = {bad}" in str(e) and f"group size {group.size}" in str(e)) else str(e)
    agree(comm, not msg, f"VocabParallelEmbedding p={group.size} V={bad}: {msg}")


def test_shards_built_by_hand_are_agreed_and_uneven_ones_refused(comm, group):
    """Built by hand (not from_full), the layers agree their shards' widths at the first forward: equal ones give the
    single process's results; uneven ones (np.array_split of a V the group does not divide) raise ValueError naming
    the widths on every rank of the group (before, rank r's shard was taken to start at r times its own width: a
    wrong lookup and a target counted twice, without an error); the cross-entropy at every forward."""
    if group is None:
        return agree(comm, True, "left over")
    rng = np.random.default_rng(12)
    wte, wpe = rng.standard_normal((V, C)), rng.standard_normal((T_MAX, C))
    idx, logits = ids(13), rng.standard_normal((B, T, V))
    emb = VocabParallelEmbedding(block(wte, group, axis=0).copy(), wpe.copy(), group)
    loss_ref, _ = cross_entropy(logits, idx)
    loss = VocabParallelCrossEntropy(group).forward(block(logits, group), idx)
    ok = close(emb.forward(idx), Embedding(wte.copy(), wpe.copy()).forward(idx), 1e-12) and close(loss, loss_ref, 1e-10)
    problems = [] if ok else ["equal shards built by hand: results differ"]
    if group.size > 1:
        odd = V + 1                                   # (odd, ...): np.array_split's first ranks one row more
        rows = np.array_split(np.arange(odd), group.size)[group.rank]
        wide = rng.standard_normal((odd, C))
        small = np.minimum(idx, odd - group.size)     # ids every rank's view of V accepts
        for name, run in (("embedding", lambda: VocabParallelEmbedding(wide[rows].copy(), wpe.copy(), group)
                           .forward(small)),
                          ("cross-entropy", lambda: VocabParallelCrossEntropy(group).forward(
                              rng.standard_normal((B, T, odd))[..., rows], small))):
            try:
                run()
                problems.append(f"{name}: uneven shards accepted")
            except ValueError as e:
                if "differ in width" not in str(e) or str(len(rows)) not in str(e):
                    problems.append(f"{name}: {e}")
        # one cross-entropy, equal widths first, then rank 0's alone one column wider: every forward agrees
        # (before, only the rank whose width changed agreed again, and the ranks waited on each other for ever)
        ce, width = VocabParallelCrossEntropy(group), V // group.size
        ce.forward(block(logits, group), idx)
        try:
            ce.forward(rng.standard_normal((B, T, width + (group.rank == 0))), np.minimum(idx, width - 1))
            problems.append("cross-entropy: a width changed on rank 0 alone accepted")
        except ValueError as e:
            if "differ in width" not in str(e):
                problems.append(f"cross-entropy, width changed: {e}")
    agree(comm, not problems, f"p={group.size}: {problems}")

