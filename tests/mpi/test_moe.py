"""Expert parallelism (pycollect.moe.MoELayer) against the token-by-token reference in one process.

Expert groups of 1, 2, 4 and 8 consecutive ranks (8: one expert per rank) are carved from the
world (ranks left over sit the test out; sizes larger than the world skip). Every rank draws the
same full weights; each world rank has its own tokens, a different number per rank (so the
all-to-all counts are uneven), drawn from a seed of its world rank, so any rank can regenerate any
other's. Each rank's y, dx, aux loss
and dropped choices are compared with ``reference_moe`` on its own tokens; the full gradients with
the sum over the group's ranks of the reference's gradients on each rank's tokens (every rank
computes that sum itself). float64 to 1e-10 relative (2-norm), float32 to 1e-5.
"""
import numpy as np
import pytest

from helpers import agree, carve_group, carved, count_calls, rel_close, release_group
from pycollect.moe import MoELayer, init_full, reference_moe

C, F, E = 8, 12, 8  # E divides by every group size of the suite up to 8
COEF = 1e-2
RTOL = {np.dtype("f8"): 1e-10, np.dtype("f4"): 1e-5}
NAMES = ("router", "w1", "b1", "w2", "b2")


@pytest.fixture(scope="module", params=[1, 2, 4, 8])
def ep(request, comm):
    """(group, members): this rank's expert group and the world ranks in it; (None, None) when left over."""
    p = request.param
    with carved(comm, p) as g:
        yield g, (None if g is None else [comm.rank // p * p + i for i in range(p)])


def full_params(dtype, seed=7):
    """The same full weights on every rank, biases nonzero, routing far from ties."""
    full = init_full(C, F, E, std=0.5, rng=seed, dtype=np.float64)
    r = np.random.default_rng(seed + 1)
    full["b1"], full["b2"] = r.standard_normal((E, F)), r.standard_normal((E, C))
    return {k: v.astype(dtype) for k, v in full.items()}


def tokens_of(world_rank: int, dtype):
    """x, dy (T, C) of a world rank: T = 10 + rank % 3, from a seed of its rank."""
    r = np.random.default_rng(1000 + world_rank)
    t = 10 + world_rank % 3
    return r.standard_normal((t, C)).astype(dtype), r.standard_normal((t, C)).astype(dtype)


def reference_sum(full, members, dtype, **kw):
    """Every full gradient summed over the reference runs of the members' tokens (in float64)."""
    total = {k: np.zeros(full[k].shape) for k in NAMES}
    for m in members:
        x, dy = tokens_of(m, dtype)
        got = reference_moe(full, x, dy, **kw)
        for k in NAMES:
            total[k] += got["grads"][k]
    return total


def run_layer(full, group, x, dy, aux_grad, **kw):
    layer = MoELayer.from_full(full, group=group, **kw)
    y = layer.forward(x)
    dx = layer.backward(dy, aux_grad=aux_grad)
    return layer, y, dx, layer.full_grads()


@pytest.mark.parametrize("dtype", [np.dtype("f8"), np.dtype("f4")], ids=str)
@pytest.mark.parametrize("k, drop_tokens", [(1, True), (2, True), (1, False), (2, False)],
                         ids=["top1-capacity", "top2-capacity", "top1-dropless", "top2-dropless"])
def test_equals_reference_when_nothing_drops(comm, ep, dtype, k, drop_tokens):
    """Capacity E (each expert could take every token) or dropless: outputs, dx, aux loss and every
    full gradient, the router's included, as the reference's."""
    group, members = ep
    if group is None:
        return agree(comm, True, "left over")
    full = full_params(dtype)
    x, dy = tokens_of(comm.rank, dtype)
    kw = dict(top_k=k, capacity_factor=float(E), drop_tokens=drop_tokens, aux_loss_coef=COEF)
    layer, y, dx, grads = run_layer(full, group, x, dy, 0.7, **kw)
    ref = reference_moe(full, x, dy, aux_grad=0.7, **kw)
    want = reference_sum(full, members, dtype, aux_grad=0.7, **kw)
    rtol = RTOL[dtype]
    ok = rel_close(y, ref["y"], rtol) and rel_close(dx, ref["dx"], rtol)
    ok = ok and sorted(grads) == sorted(NAMES)
    bad = [n for n in NAMES if not rel_close(grads[n].astype(np.float64), want[n], rtol, same_dtype=False)
           or grads[n].dtype != dtype]
    ok = ok and not bad and layer.dropped.tolist() == [0] * E and ref["dropped"].sum() == 0
    ok = ok and abs(layer.aux_loss - ref["aux_loss"]) <= rtol * ref["aux_loss"]
    agree(comm, ok, f"MoELayer ep={group.size} k={k} drop_tokens={drop_tokens} {dtype}: gradients off {bad}")


@pytest.mark.parametrize("order", ["position", "probability"])
@pytest.mark.parametrize("k", [1, 2])
def test_small_capacity_drops_the_reference_s_tokens(comm, ep, k, order):
    """Capacity factor 0.5: the same choices dropped, per expert counts, y, dx and gradients."""
    group, members = ep
    if group is None:
        return agree(comm, True, "left over")
    full = full_params(np.float64)
    x, dy = tokens_of(comm.rank, np.float64)
    kw = dict(top_k=k, capacity_factor=0.5, drop_order=order, aux_loss_coef=COEF)
    layer, y, dx, grads = run_layer(full, group, x, dy, 1.0, **kw)
    ref = reference_moe(full, x, dy, aux_grad=1.0, **kw)
    want = reference_sum(full, members, np.float64, aux_grad=1.0, **kw)
    same_drops = layer.routing.keep.tolist() == ref["keep"] and layer.dropped.tolist() == ref["dropped"].tolist()
    ok = same_drops and layer.dropped.sum() > 0 and layer.routing.capacity == ref["capacity"]
    ok = ok and rel_close(y, ref["y"], 1e-10) and rel_close(dx, ref["dx"], 1e-10)
    ok = ok and all(rel_close(grads[n], want[n], 1e-10) for n in NAMES)
    ok = ok and abs(layer.aux_loss - ref["aux_loss"]) <= 1e-12 * ref["aux_loss"]
    agree(comm, ok, f"MoELayer ep={group.size} k={k} order={order}: dropped {layer.dropped.tolist()} "
                    f"reference {ref['dropped'].tolist()}")


def test_aux_loss_is_coef_for_uniform_and_coef_e_for_one_expert(comm, ep):
    """Zero router: P uniform, aux = coef on every rank. Router sending everything to expert 0 with
    probability 1: aux = coef * E. Exact (per rank, no communication involved)."""
    group, _ = ep
    if group is None:
        return agree(comm, True, "left over")
    full = full_params(np.float64)
    x, dy = tokens_of(comm.rank, np.float64)
    full["router"] = np.zeros((C, E))
    uniform = MoELayer.from_full(full, top_k=2, capacity_factor=1.0, group=group, aux_loss_coef=COEF)
    uniform.forward(x)
    full["router"][0, 0] = 1000.0
    x[:, 0] = 1.0  # logits (1000, 0, ..., 0): probabilities exactly (1, 0, ..., 0)
    one = MoELayer.from_full(full, top_k=1, capacity_factor=1.0, group=group, aux_loss_coef=COEF)
    one.forward(x)
    t = x.shape[0]
    cap = -(-t // E)  # ceil(T / E)
    want_dropped = [t - cap] + [0] * (E - 1)
    ok = uniform.aux_loss == COEF and one.aux_loss == COEF * E and one.dropped.tolist() == want_dropped
    agree(comm, ok, f"aux loss uniform {uniform.aux_loss!r} (want {COEF}), one expert {one.aux_loss!r} "
                    f"(want {COEF * E}), dropped {one.dropped.tolist()} (want {want_dropped})")


def test_one_allgather_and_two_all_to_alls_forward_two_backward(comm, ep, monkeypatch):
    """Forward: every rank's counts (one allgather), the rows out, the rows back; backward: the two row
    exchanges, the matrix transposed. The all-to-alls get the whole count matrix, so pycollect exchanges
    no counts of its own."""
    group, _ = ep
    if group is None:
        return agree(comm, True, "left over")
    full = full_params(np.float64)
    x, dy = tokens_of(comm.rank, np.float64)
    layer = MoELayer.from_full(full, top_k=2, capacity_factor=1.0, group=group)
    calls = {name: count_calls(monkeypatch, group, name) for name in ("alltoall", "allgather", "_exchange")}
    layer.forward(x)
    fwd = {name: c[0] for name, c in calls.items()}
    layer.backward(dy)
    bwd = {name: c[0] - fwd[name] for name, c in calls.items()}
    many = group.size > 1
    want = ({"alltoall": 2 * many, "allgather": 1 * many, "_exchange": 0},
            {"alltoall": 2 * many, "allgather": 0, "_exchange": 0})
    agree(comm, (fwd, bwd) == want, f"ep={group.size}: forward {fwd}, backward {bwd}, want {want}")


def test_expert_parallel_within_data_parallel(comm):
    """ep = 2 consecutive ranks, dp across them: full_grads() over ep, then summed over dp, equals the
    reference gradients summed over every rank's tokens."""
    if comm.size % 2:
        pytest.skip("needs an even world")
    ep_group, ep_sub = carve_group(comm, 2)
    dp_group = comm.split(comm.rank % 2)
    try:
        full = full_params(np.float64)
        x, dy = tokens_of(comm.rank, np.float64)
        kw = dict(top_k=2, capacity_factor=0.75, aux_loss_coef=COEF)
        _, y, _, grads = run_layer(full, ep_group, x, dy, 1.0, **kw)
        total = {n: dp_group.allreduce(grads[n]) for n in NAMES}
        want = reference_sum(full, range(comm.size), np.float64, aux_grad=1.0, **kw)
        ref = reference_moe(full, x, dy, aux_grad=1.0, **kw)
        ok = rel_close(y, ref["y"], 1e-10) and all(rel_close(total[n], want[n], 1e-10) for n in NAMES)
        agree(comm, ok, f"ep=2 x dp={comm.size // 2}: gradients differ from the reference's")
    finally:
        dp_group.free()
        release_group(ep_group, ep_sub)


def test_bad_input_is_refused_before_any_communication(comm, ep):
    """Every rank passing the same bad argument raises, and the group is still in step afterwards."""
    group, _ = ep
    if group is None:
        return agree(comm, True, "left over")
    full = full_params(np.float64)
    x, dy = tokens_of(comm.rank, np.float64)
    messages = []
    for kwargs in ({"top_k": E + 1}, {"capacity_factor": 0.0}, {"capacity_factor": -2.0}):
        try:
            MoELayer.from_full(full, group=group, **kwargs)
        except ValueError as e:
            messages.append(str(e))
    layer = MoELayer.from_full(full, top_k=2, group=group)
    try:
        layer.forward(x[:, :-1])
    except ValueError as e:
        messages.append(str(e))
    want = [f"MoELayer.from_full: top_k = {E + 1} is larger than num_experts = {E} (each token chooses k "
            f"distinct experts)",
            "MoELayer.from_full: capacity_factor must be a positive finite number, got 0.0",
            "MoELayer.from_full: capacity_factor must be a positive finite number, got -2.0",
            f"MoELayer.forward: x has shape ({x.shape[0]}, {C - 1}), expected (..., {C})"]
    try:                  # mpi4py's communicator: refused where the layer is built (before: at forward, the
        MoELayer.from_full(full, group=group.mpi)     # allgather's unknown keyword 'counts')
    except TypeError as e:
        messages.append(str(e))
    want.append("MoELayer.from_full: group must be a pycollect Communicator (e.g. pycollect.Communicator(mpi_comm) "
                "or a mesh's group), got Intracomm")
    if group.size > 1:   # experts that do not divide by the group (its checks moved into MPI tests: it agrees)
        odd = init_full(C, F, group.size + 1, rng=3)
        try:
            MoELayer.from_full(odd, group=group)
        except ValueError as e:
            messages.append(str(e))
        want.append(f"MoELayer.from_full: num_experts = {group.size + 1} does not divide by the expert-parallel "
                    f"group size {group.size} (rank {group.rank})")
    y = layer.forward(x)  # the group is still in step: a good call goes through
    layer.backward(dy)
    ok = messages == want and y.shape == x.shape
    agree(comm, ok, f"ep={group.size}: got {messages}")


def test_a_layer_refused_on_one_rank_alone_is_refused_on_every_rank(comm):
    """MoELayer(...) with a bad setting on the last rank alone (top_k, d_model, dtype, drop_order): its checks ran
    before the agreement, and the others waited in it for ever (found by a helper)."""
    from helpers import refused_alone
    from pycollect.moe import MoELayer
    last = comm.rank == comm.size - 1
    e = 2 * comm.size
    for bad, words in [({"top_k": e + 1}, ["top_k"]), ({"d_model": 0}, ["d_model must be a positive integer"]),
                       ({"dtype": "bogus"}, ["dtype 'bogus' is not a NumPy dtype"]),
                       ({"drop_order": "random"}, ["drop_order"]),
                       ({"drop_tokens": "no"}, ["MoELayer: drop_tokens must be True or False, got 'no'"])]:
        settings = dict(d_model=4, d_ff=8, num_experts=e, group=comm)
        settings.update(bad if last else {})
        refused_alone(comm, lambda: MoELayer(**settings), words)
