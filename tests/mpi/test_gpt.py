"""The GPT on a tp x dp mesh against its single-process twin (ReferenceGPT), and its traffic.

Meshes (tp, dp) in (1,1) (2,1) (4,1) (1,2) (2,2) (4,2), each with and without sequence
parallelism (tp > 1), carved from the world where they fit (ranks left over sit the test out;
meshes larger than the world skip). Every rank draws the same full parameters (perturbed from
GPT-2's initialisation so that every gradient is non-trivial) and the same global batch; data-parallel
rank d takes its rows. Closeness is relative in the 2-norm: float64 to 1e-10; float32 to 1e-5
(summation order differs between the sharded and the whole matrices; measured below 5e-7).
"""
import dataclasses
import re

import numpy as np
import pytest

from helpers import agree, carved_mesh, rel_close, train_vs_twin
from pycollect.models import GPT, GPTConfig, ReferenceGPT, init_params, param_shapes
from pycollect.models.data import reverse_batch, shard_rows
from pycollect.training import TrainConfig
from pycollect.parallel import ProcessMesh

CONFIG = GPTConfig(vocab_size=16, block_size=8, n_layer=2, n_head=4, n_embd=16, ffn=32)
DROPPING = dataclasses.replace(CONFIG, dropout=0.2)  # masks by global position: equal on every mesh
B = 4  # global batch; T = block_size = 8, divisible by every tp here
RTOL = {np.dtype("f8"): 1e-10, np.dtype("f4"): 1e-5}
MESHES = [(1, 1), (2, 1), (4, 1), (1, 2), (2, 2), (4, 2)]
CASES = [(tp, dp, sp) for tp, dp in MESHES for sp in ((False, True) if tp > 1 else (False,))]


def case_id(case):
    tp, dp, sp = case
    return f"tp{tp}-dp{dp}" + ("-sp" if sp else "")


@pytest.fixture(scope="module", params=CASES, ids=case_id)
def case(request, comm):
    """(mesh, sequence_parallel), or (None, sp) on ranks left over."""
    tp, dp, sp = request.param
    with carved_mesh(comm, tp=tp, dp=dp) as mesh:
        yield mesh, sp


def perturbed_params(dtype, seed=7):
    """GPT-2's initialisation plus noise: LayerNorm weights away from 1, biases away from 0."""
    params = init_params(CONFIG, seed=seed, dtype=np.float64)
    rng = np.random.default_rng(seed + 1)
    return {k: (v + 0.1 * rng.standard_normal(v.shape)).astype(dtype) for k, v in params.items()}


def twin_step(params, idx, targets, config=CONFIG, key=None):
    ref = ReferenceGPT(config, {k: v.copy() for k, v in params.items()})
    loss = ref.forward(idx, targets, key)
    ref.backward()
    return float(loss), ref.grads


def mesh_step(mesh, sp, params, idx, targets, config=CONFIG, key=None):
    model = GPT.from_full(config, params, mesh, sequence_parallel=sp)
    mi, mt = shard_rows((idx, targets), mesh.dp_rank, mesh.dp_size)
    loss = float(model.forward(mi, mt, key, first_row=mesh.dp_rank * mi.shape[0]))
    model.backward()
    model.finish_grads()
    loss = float(mesh.dp.allreduce(np.array([loss]), op="sum")[0]) / mesh.dp_size
    return model, loss, model.full_grads()


@pytest.mark.parametrize("dtype, dropout", [(np.dtype("f8"), False), (np.dtype("f4"), False),
                                            (np.dtype("f8"), True)], ids=["f8", "f4", "f8-dropout"])
def test_loss_and_every_gradient_match_the_twin(comm, case, dtype, dropout):
    mesh, sp = case
    if mesh is None:
        return agree(comm, True, "left over")
    config, key = (DROPPING, (11, 3)) if dropout else (CONFIG, None)
    params = perturbed_params(dtype)
    idx, targets = reverse_batch(B, CONFIG.block_size, CONFIG.vocab_size, seed=3, step=0)
    ref_loss, ref_grads = twin_step(params, idx, targets, config, key)
    if dropout:  # the masks matter: without them the twin's loss differs
        assert abs(twin_step(params, idx, targets)[0] - ref_loss) > 1e-3
    _, loss, grads = mesh_step(mesh, sp, params, idx, targets, config, key)
    assert set(grads) == set(param_shapes(CONFIG))
    bad = [n for n in grads if not rel_close(grads[n], ref_grads[n], RTOL[dtype])]
    loss_ok = abs(loss - ref_loss) <= RTOL[dtype] * abs(ref_loss)
    agree(comm, not bad and loss_ok, f"{case_id((mesh.tp_size, mesh.dp_size, sp))} {dtype}: loss {loss} vs "
          f"{ref_loss}; gradients off: {bad}")


def test_twenty_steps_of_adamw_stay_on_the_twins_trajectory(comm, case):
    """Losses every step and the final full weights (gathered from the shards) against the twin's,
    with dropout, clipping, weight decay and (dp = 2) two micro-batches per step."""
    mesh, sp = case
    if mesh is None:
        return agree(comm, True, "left over")
    micro = 2 if mesh.dp_size == 2 else 1  # gradient accumulation too where the batch allows
    cfg = TrainConfig(steps=20, batch=B, micro_batches=micro, lr=1e-2, weight_decay=0.1, clip=1.0, seed=5)
    r = train_vs_twin(DROPPING, cfg, mesh, sp, weight_rtol=1e-8)
    losses, ref_losses = r["losses"], r["ref_losses"]
    learnt = ref_losses[-1] < ref_losses[0] - 0.1
    agree(comm, rel_close(losses, ref_losses, 1e-10) and not r["off"] and learnt and r["t"] == r["ref_t"] == 20,
          f"losses {losses[[0, -1]]} vs {ref_losses[[0, -1]]}; weights off: {r['off']}")


def test_full_params_gives_back_what_from_full_took(comm, case):
    """Sharding then gathering is the identity, bit for bit, for every parameter of every layer."""
    mesh, sp = case
    if mesh is None:
        return agree(comm, True, "left over")
    params = perturbed_params(np.float64)
    full = GPT.from_full(CONFIG, params, mesh, sequence_parallel=sp).full_params()
    off = [n for n in params if not (full[n].shape == params[n].shape and np.array_equal(full[n], params[n]))]
    shared = [n for n in full if np.shares_memory(full[n], params[n])]
    agree(comm, not off and not shared and list(full) == list(params), f"differ: {off}; share memory: {shared}")


def expected_tp_calls(b, t, tp, sp):
    """Megatron's counts for one step of a tensor-parallel group of ``tp`` > 1: {phase: {(collective, elements): n}}."""
    L, c = CONFIG.n_layer, CONFIG.n_embd
    btc = b * t * c
    loss = {("allreduce", b * t): 3}  # max, sum of exponentials, target logit
    if not sp:
        return {"forward": {("allreduce", btc): 1 + 2 * L, **loss},  # embedding + 2 per block
                "backward": {("allreduce", btc): 2 * L + 1},  # 2 per block + the head's input
                "finish": {}}
    partial = CONFIG.block_size * c + L * 6 * c + 2 * c  # wpe; per block ln1, b_proj, ln2, b2; lnf
    return {"forward": {("reduce_scatter", btc): 1 + 2 * L, ("allgather", btc // tp): 2 * L + 1, **loss},
            "backward": {("reduce_scatter", btc): 2 * L + 1, ("allgather", btc // tp): 2 * L + 1},
            "finish": {("allreduce", partial): 1}}


def test_traffic_of_one_step_is_megatrons(comm, case):
    """Per block: 2 allreduces of B*T*C each way; with sequence parallelism 2 allgathers and 2
    reduce-scatters each way instead (allgather calls hand in B*T*C/p each). Data parallelism: the
    local gradients once, in buckets, non-blocking."""
    from pycollect.recording import summarize
    mesh, sp = case
    if mesh is None:
        return agree(comm, True, "left over")
    params = perturbed_params(np.float64)
    idx, targets = shard_rows(reverse_batch(B, CONFIG.block_size, CONFIG.vocab_size, 3, 0), mesh.dp_rank,
                              mesh.dp_size)
    model = GPT.from_full(CONFIG, params, mesh, sequence_parallel=sp, bucket_bytes=4096)
    got = {}
    with mesh.dp.record() as dp_log:
        for phase, run in (("forward", lambda: model.forward(idx, targets)), ("backward", model.backward),
                           ("finish", model.finish_grads)):
            with mesh.tp.record() as log:
                run()
            got[phase] = summarize(log)
    b, t = idx.shape
    tp = mesh.tp_size
    expected = expected_tp_calls(b, t, tp, sp) if tp > 1 else {"forward": {}, "backward": {}, "finish": {}}
    local = sum(p.size for p in model.params.values())
    dp_ok = (mesh.dp_size == 1 and not dp_log) or (
        sum(r.elements for r in dp_log) == local + 1 and len(dp_log) > 1   # + the flag of a step left undone
        and all(r.collective == "allreduce" and not r.blocking for r in dp_log))
    agree(comm, got == expected and dp_ok, f"tp calls {got}\nexpected {expected}\ndp calls {dp_log}")


def raises(fn, exc, match) -> str:
    """'' when ``fn()`` raises ``exc`` matching ``match``, else what happened."""
    try:
        fn()
    except exc as e:
        return "" if re.search(match, str(e)) else f"{exc.__name__} without {match!r}: {e}"
    except Exception as e:  # noqa: BLE001 - reported below
        return f"{type(e).__name__} instead of {exc.__name__}: {e}"
    return f"no {exc.__name__} ({match!r})"


def test_a_model_refused_or_configured_otherwise_on_one_rank_is_refused_on_every_rank(comm):
    """The last rank alone passes a parameter of another dtype, or another config: every rank raises where the model
    is built (the refusing rank its own error, the others naming it; before, they waited in the first layer's
    agreement for ever, or built other layers), for GPT and PipelinedGPT."""
    from pycollect.models import PipelinedGPT
    n, last = comm.size, comm.rank == comm.size - 1
    params = perturbed_params(np.float64)
    mixed = dict(params, lnf_b=params["lnf_b"].astype(np.float32)) if last else params
    deeper = dataclasses.replace(CONFIG, n_layer=3)
    elsewhere = "refused their arguments" if n > 1 else "lnf_b has dtype float32"
    listed = dict(params, wte=params["wte"].tolist()) if last else params   # no array: it named nothing before
    for build in (GPT.from_full, PipelinedGPT.from_full):
        mesh = ProcessMesh(comm, dp=n)
        problems = [raises(lambda: build(CONFIG, mixed, mesh), (TypeError, ValueError),
                           "lnf_b has dtype float32" if last else elsewhere),
                    raises(lambda: build(CONFIG, listed, mesh), (TypeError, ValueError),
                           r"params\['wte'\]: expected a NumPy or CuPy array, got list" if last or n == 1
                           else "refused their arguments")]
        if n > 1:
            config = deeper if last else CONFIG
            problems.append(raises(lambda: build(config, init_params(config, 0, np.float64), mesh), ValueError,
                                   rf"full parameters \(names, dtypes, shapes\) or settings differ: rank\(s\) \[{n - 1}\]"))
        mesh.free()
        agree(comm, not any(problems), f"{build.__qualname__}: {[p for p in problems if p]}")


def test_bad_input_is_refused_on_every_rank_before_any_communication(comm):
    """Every rank passes the same bad input, so every rank raises the same error, none hangs."""
    n = comm.size
    tp = 2 if n % 2 == 0 else 1
    mesh = ProcessMesh(comm, tp=tp, dp=n // tp)
    params = perturbed_params(np.float64)
    idx, targets = shard_rows(reverse_batch(n * 2, 8, 16, 0, 0), mesh.dp_rank, mesh.dp_size)
    model = GPT.from_full(CONFIG, params, mesh, sequence_parallel=tp > 1)
    bad_shape = dict(params, **{"h1.w1": params["h1.w1"][:, :-1]})
    mixed = dict(params, lnf_b=params["lnf_b"].astype(np.float32))
    missing = {k: v for k, v in params.items() if k != "h0.b2"}
    problems = [
        raises(lambda: GPT.from_full(CONFIG, params, comm), TypeError, "mesh must be a pycollect.parallel.ProcessMesh"),
        raises(lambda: GPT.from_full(CONFIG, bad_shape, mesh), ValueError, r"h1.w1 has shape \(16, 31\)"),
        raises(lambda: GPT.from_full(CONFIG, mixed, mesh), TypeError, "lnf_b has dtype float32"),
        raises(lambda: GPT.from_full(CONFIG, missing, mesh), ValueError, "lack.*h0.b2"),
        raises(lambda: GPT.from_full(CONFIG, params, mesh, sequence_parallel=1), TypeError, "sequence_parallel"),
        raises(lambda: model.forward(idx[..., None], targets), ValueError, r"idx has shape"),
        raises(lambda: model.forward(idx.astype(np.float64), targets), TypeError, "integer"),
        raises(lambda: model.forward(idx, targets[:, :-1]), ValueError, "targets has shape"),
        raises(lambda: model.forward(idx.tolist(), targets), TypeError, "NumPy or CuPy array"),
        raises(lambda: model.forward(np.zeros((1, 9), np.int64), np.zeros((1, 9), np.int64)), ValueError,
               "T = 9 tokens, more than block_size = 8"),
        raises(lambda: model.forward(idx, targets + 16), ValueError, r"targets holds values in .*expected \[0, 16\)"),
        raises(lambda: model.backward(), RuntimeError, "before forward"),
        raises(lambda: model.finish_grads(), RuntimeError, "no backward"),
    ]
    if tp > 1:
        odd = GPTConfig(vocab_size=15, block_size=8, n_layer=1, n_head=3, n_embd=12)
        problems += [
            raises(lambda: GPT.from_full(odd, init_params(odd), mesh), ValueError, "n_head = 3, vocab_size = 15"),
            raises(lambda: model.forward(idx[:, :7], targets[:, :7]), ValueError, "T = 7 must divide"),
        ]
    with model.no_sync():
        model.forward(idx, targets)
        model.backward()
        problems.append(raises(lambda: model.finish_grads(), RuntimeError, "inside no_sync"))
    model.forward(idx, targets)
    model.backward()
    problems.append(raises(lambda: model.full_grads(), RuntimeError, "finish_grads"))
    problems.append(raises(lambda: model.no_sync().__enter__(), RuntimeError, "call finish_grads"))
    model.finish_grads()  # the step completes: no collective left waiting on any rank
    if n % 2 == 0:
        piped = ProcessMesh(comm, pp=2, dp=n // 2)
        problems.append(raises(lambda: GPT.from_full(CONFIG, params, piped), ValueError, "pp = 2"))
        piped.free()
    mesh.free()
    problems = [p for p in problems if p]
    agree(comm, not problems, "\n".join(problems))


def test_train_refused_on_one_rank_is_refused_on_every_rank(comm):
    """pycollect.training.train agrees its settings over the mesh: a TrainConfig the last rank alone refuses (a batch
    its data-parallel size cannot split, ZeRO with micro-batches) stopped that rank while the others waited in the
    model's construction for ever (found by a helper); a config that differs otherwise would train apart."""
    from helpers import refused_alone
    from pycollect.training import train
    mesh = ProcessMesh(comm, dp=comm.size)
    last = comm.rank == comm.size - 1
    config = GPTConfig(vocab_size=16, block_size=8, n_layer=1, n_head=2, n_embd=8)
    batch = 2 * comm.size
    cases = [(TrainConfig(steps=1, batch=batch, micro_batches=3), None, ["does not divide"]),
             (TrainConfig(steps=1, batch=batch, micro_batches=2), 1, ["one micro-batch per step"]),
             (TrainConfig(steps=1, batch=batch, clip=-1.0), None, ["clip must be a positive"])]
    for bad, zero, words in cases:
        cfg = bad if last else TrainConfig(steps=1, batch=batch)
        refused_alone(comm, lambda: train(config, cfg, mesh, zero_stage=zero if last else None), words,
                      ["refused their arguments"] if comm.size > 1 else words)
    if comm.size > 1:   # differing settings, none refused
        cfg = TrainConfig(steps=1, batch=batch, seed=7 if last else 0)
        refused_alone(comm, lambda: train(config, cfg, mesh), ["settings", "differ"], ["settings", "differ"])
    mesh.free()


def test_clip_grad_norm_refuses_a_max_norm_that_is_not_positive(comm):
    """MeshGPT.clip_grad_norm(-1.0) turned every gradient's sign (scaled by -1 / norm) without an error."""
    mesh = ProcessMesh(comm, dp=comm.size)
    model = GPT.from_full(CONFIG, perturbed_params(np.float64), mesh)
    for bad in (-1.0, 0.0, float("nan")):
        problem = raises(lambda: model.clip_grad_norm(bad), ValueError, "max_norm must be a positive")
        agree(comm, not problem, problem)
    mesh.free()
