"""The GPT with mixture-of-experts blocks, experts spread over the data-parallel ranks, against its
single-process twin (ReferenceGPT routing the batch in as many groups as there are ranks x micro-batches).

Meshes (tp, dp) in (1, 1), (1, 2), (1, 4), (2, 1), (2, 2); with tp = 2 the experts are whole on both
tensor-parallel ranks, which hold the same tokens, or with sequence parallelism each its own half of
the sequence (the twin then routes in twice as many groups, split along the sequence). The loss (cross-entropy plus the balancing losses) and every full gradient, router and
experts included, equal the twin's in float64 to 1e-10, with capacity enough for every token and with
a capacity that drops; 20 AdamW steps with two micro-batches follow the twin's trajectory and learn;
one step's traffic per layer over the data-parallel group is one allgather of counts and 2 all-to-alls
forward, 2 all-to-alls backward.
"""
import dataclasses
import re

import numpy as np
import pytest

from helpers import agree, carved_mesh, rel_close, shown_at_four, train_vs_twin
from pycollect.models import GPT, GPTConfig, ReferenceGPT, init_params
from pycollect.models.data import reverse_batch, shard_rows
from pycollect.training import TrainConfig

CONFIG = GPTConfig(vocab_size=16, block_size=8, n_layer=2, n_head=4, n_embd=16, ffn=32, n_experts=4, moe_top_k=2,
                   moe_capacity_factor=4.0)
DROPPING = dataclasses.replace(CONFIG, moe_capacity_factor=0.5, dropout=0.1)


@pytest.fixture(scope="module", params=[(1, 1), (1, 2), (1, 4), (2, 1), (2, 2)], ids=lambda m: f"tp{m[0]}-dp{m[1]}")
def mesh(request, comm):
    tp, dp = request.param
    with carved_mesh(comm, tp=tp, dp=dp) as mesh:
        yield mesh


SP = pytest.mark.parametrize("sp", [False, True], ids=["", "sp"])


def seq_groups(mesh, sp: bool) -> int:
    return mesh.tp_size if sp else 1


def perturbed(config):
    params = init_params(config, seed=7, dtype=np.float64)
    rng = np.random.default_rng(8)
    return {k: v + 0.1 * rng.standard_normal(v.shape) for k, v in params.items()}


@SP
@pytest.mark.parametrize("config", [CONFIG, DROPPING], ids=["no-drop", "dropping"])
def test_loss_and_every_gradient_match_the_twin(comm, mesh, config, sp):
    if mesh is None or (sp and mesh.tp_size == 1):
        return agree(comm, True, "left over")
    dp = mesh.dp_size
    params = perturbed(config)
    idx, targets = reverse_batch(4 * dp, 8, 16, 3, 0)
    key = (11, 0) if config.dropout else None
    ref = ReferenceGPT(config, {k: v.copy() for k, v in params.items()}, moe_groups=dp,
                       moe_seq_groups=seq_groups(mesh, sp))
    ref_loss = float(ref.forward(idx, targets, key))
    ref.backward()
    model = GPT.from_full(config, params, mesh, sequence_parallel=sp)
    mi, mt = shard_rows((idx, targets), mesh.dp_rank, dp)
    loss = float(model.forward(mi, mt, key, first_row=mesh.dp_rank * mi.shape[0]))
    model.backward()
    model.finish_grads()
    loss = float(mesh.dp.allreduce(np.array([loss]), op="sum")[0]) / dp
    grads = model.full_grads()
    dropped = int(sum(b.mlp.moe.dropped.sum() for b in model.blocks))
    off = [n for n in grads if not rel_close(grads[n], ref.grads[n], 1e-10)]
    drops_as_configured = (dropped > 0) == (config.moe_capacity_factor < 1)
    agree(comm, not off and abs(loss - ref_loss) <= 1e-10 * abs(ref_loss) and drops_as_configured,
          f"loss {loss} vs {ref_loss}; gradients off {off}; dropped {dropped}")


@SP
def test_twenty_steps_follow_the_twin(comm, mesh, sp):
    if mesh is None or (sp and mesh.tp_size == 1):
        return agree(comm, True, "left over")
    cfg = TrainConfig(steps=20, batch=4 * mesh.dp_size, micro_batches=2, lr=1e-2, weight_decay=0.1, clip=1.0, seed=4)
    follows_the_twin(comm, DROPPING, cfg, mesh, sp, 1e-9, "")


def follows_the_twin(comm, config, cfg, mesh, sp, weight_rtol, label, **pipeline):
    """``train`` on ``mesh`` against ``train_reference`` routing as the ranks do: losses to 1e-10,
    the final weights to ``weight_rtol``, and the loss falls."""
    r = train_vs_twin(config, cfg, mesh, sp, weight_rtol, **pipeline)
    losses, ref_losses = r["losses"], r["ref_losses"]
    agree(comm, rel_close(losses, ref_losses, 1e-10) and not r["off"] and ref_losses[-1] < ref_losses[0] - 0.1,
          f"{label}: losses {losses[[0, -1]]} vs {ref_losses[[0, -1]]}; weights off {r['off']}")


def test_each_moe_layer_does_two_all_to_alls_each_way_and_one_allgather_of_counts(comm, mesh):
    if mesh is None:
        return agree(comm, True, "left over")
    model = GPT.from_full(CONFIG, perturbed(CONFIG), mesh)
    idx, targets = reverse_batch(4, 8, 16, 3, 0)
    got = {}
    for phase, run in (("forward", lambda: model.forward(idx, targets)), ("backward", model.backward)):
        with mesh.dp.record() as log:
            run()
        got[phase] = (sum(r.collective == "alltoall" for r in log), sum(r.collective == "allgather" for r in log))
    model.finish_grads()
    L = CONFIG.n_layer
    expected = {"forward": (2 * L, L), "backward": (2 * L, 0)} if mesh.dp_size > 1 else \
        {"forward": (0, 0), "backward": (0, 0)}
    agree(comm, got == expected, f"(all-to-alls, allgathers) {got}, expected {expected}")


def test_bad_input(comm, mesh):
    if mesh is None:
        return agree(comm, True, "left over")
    problems = []

    def expect(fn, match):
        try:
            fn()
            problems.append(f"no error ({match})")
        except (ValueError, TypeError) as e:
            if not re.search(match, str(e)):
                problems.append(f"{e} lacks {match!r}")

    expect(lambda: dataclasses.replace(CONFIG, moe_top_k=5), "top_k")
    expect(lambda: dataclasses.replace(CONFIG, moe_capacity_factor=0.0), "capacity")
    if mesh.dp_size == 4:
        three = dataclasses.replace(CONFIG, n_experts=6)
        expect(lambda: GPT.from_full(three, init_params(three), mesh), "divide")
    agree(comm, not problems, "; ".join(problems))


# -- in the pipeline ----------------------------------------------------------------------------------------
PIPED = dataclasses.replace(DROPPING, n_layer=4)  # interleaving 2 chunks on 2 stages needs 4 layers
PIPE_MESHES = [(1, 2, 1, False), (2, 2, 1, False), (1, 2, 2, True), (1, 2, 2, False)]  # (dp, pp, tp, sp)
SCHEDULES = [("gpipe", 1), ("1f1b", 1), ("interleaved", 2), ("zb-h1", 1), ("zb-h2", 1), ("zbv", 2)]
# the zero-bubble schedules (backward split in B and W, the all-to-alls in B): mesh -> the one world size
# that runs it, so that the launches at several sizes do not repeat them; each with experts over dp = 2 (their
# all-to-alls in B), zb-h1 with sequence parallelism too
ZERO_BUBBLE_MESHES = {"zb-h1": {(2, 2, 1, False): 4, (1, 2, 2, True): 5}, "zb-h2": {(2, 2, 1, False): 4},
                      "zbv": {(2, 2, 1, False): 5}}


@pytest.fixture(scope="module", params=PIPE_MESHES, ids=lambda m: "dp{}-pp{}-tp{}{}".format(*m[:3], "-sp" * m[3]))
def pipe_mesh(request, comm):
    dp, pp, tp, sp = request.param
    with carved_mesh(comm, tp=tp, dp=dp, pp=pp) as mesh:
        yield mesh, sp


@pytest.mark.parametrize("schedule, v", SCHEDULES, ids=[s for s, _ in SCHEDULES])
def test_pipelined_moe_follows_the_twin(comm, pipe_mesh, schedule, v):
    """Experts over dp in every stage's blocks, several micro-batches in flight through them (each
    forward's routing kept for its own backward), the balancing losses of every stage in the loss:
    20 steps with dropout, dropping and clipping equal the twin's (float64, 1e-10)."""
    mesh, sp = pipe_mesh
    if mesh is None:
        return agree(comm, True, "left over")
    if schedule in ZERO_BUBBLE_MESHES and \
            ZERO_BUBBLE_MESHES[schedule].get((mesh.dp_size, mesh.pp_size, mesh.tp_size, sp)) != comm.size:
        return agree(comm, True, "covered on another mesh or world size")
    if schedule not in ZERO_BUBBLE_MESHES and shown_at_four(comm):
        return agree(comm, True, "covered at 4 ranks")
    m = 2 * mesh.pp_size
    cfg = TrainConfig(steps=20, batch=m * mesh.dp_size, micro_batches=m, lr=1e-2, weight_decay=0.1, clip=1.0, seed=6)
    follows_the_twin(comm, PIPED, cfg, mesh, sp, 1e-10, schedule, schedule=schedule, virtual_stages=v)
