"""Bad input to the model layer, MoE, ZeRO and nn on a communicator of one: every refusal names the function and
the argument, and nothing is written into the caller's arrays or the optimizer's state (the same checks under
mpiexec at several world sizes: tests/mpi/test_moe.py, test_zero.py, test_zero_checkpoint.py)."""
import hashlib
import json
import os
import re

import numpy as np
import pytest

import pycollect as pc
from pycollect import nn
from pycollect.models import GPT, GPTConfig, PipelinedGPT, ReferenceGPT, init_params
from pycollect.moe import MoEBranch, MoELayer, reference_moe
from pycollect.parallel import ProcessMesh
from pycollect.parallel.attention import ParallelAttention, ParallelBlock
from pycollect.parallel.data import DataParallel
from pycollect.parallel.tensor import ColumnParallelLinear, ParallelMLP, RowParallelLinear
from pycollect.parallel.vocab import VocabParallelCrossEntropy, VocabParallelEmbedding
from pycollect.zero import ZeroAdamW, ZeroGPT, load_checkpoint, save_checkpoint
from pycollect.zero.checkpoint import METADATA, CheckpointError

CONFIG = dict(vocab_size=16, block_size=8, n_layer=2, n_head=2, n_embd=8)
C, F, E = 6, 10, 4


@pytest.fixture(scope="module")
def comm():
    c = pc.Communicator()
    yield c
    c.free()


@pytest.fixture(scope="module")
def mesh(comm):
    return ProcessMesh(comm)


def moe_full(seed=0):
    rng = np.random.default_rng(seed)
    return {"router": rng.normal(size=(C, E)), "w1": rng.normal(size=(E, C, F)), "b1": rng.normal(size=(E, F)),
            "w2": rng.normal(size=(E, F, C)), "b2": rng.normal(size=(E, C))}


def linear_full(c_in=4, c_out=6, seed=0):
    rng = np.random.default_rng(seed)
    return {"w": rng.normal(size=(c_in, c_out)), "b": rng.normal(size=c_out)}


def block_full(c=8, seed=0):
    rng = np.random.default_rng(seed)
    return {"ln1_w": np.ones(c), "ln1_b": np.zeros(c), "w_qkv": rng.normal(size=(c, 3 * c)), "b_qkv": np.zeros(3 * c),
            "w_proj": rng.normal(size=(c, c)), "b_proj": np.zeros(c), "ln2_w": np.ones(c), "ln2_b": np.zeros(c),
            "w1": rng.normal(size=(c, 4 * c)), "b1": np.zeros(4 * c), "w2": rng.normal(size=(4 * c, c)),
            "b2": np.zeros(c)}


def mlp_full(c=8):
    return {k: block_full(c)[k] for k in ("w1", "b1", "w2", "b2")}


def attn_full(c=8):
    return {k: block_full(c)[k] for k in ("w_qkv", "b_qkv", "w_proj", "b_proj")}


def small_gpt(mesh, **kw):
    config = GPTConfig(**CONFIG)
    return GPT.from_full(config, init_params(config, dtype=np.float64), mesh, **kw)


# -- 1. boolean options are True or False, nothing else --------------------------------------------------
def bool_options(comm, mesh):
    """(call with the option set to ``value``, the message's prefix) for every boolean option of these layers."""
    config = GPTConfig(**CONFIG)
    params = init_params(config, dtype=np.float64)
    x = np.random.default_rng(0).normal(size=(4, C))
    rng = np.random.default_rng(1)
    w, b = rng.normal(size=(4, 6)), rng.normal(size=6)
    emb = {"wte": rng.normal(size=(16, 8)), "wpe": rng.normal(size=(8, 8))}
    grad_opt = ZeroAdamW({"a": np.ones(3)}, comm, stage=1)
    return {
        "GPTConfig moe_dropless": (lambda v: GPTConfig(**CONFIG, n_experts=4, moe_dropless=v), "GPTConfig: moe_dropless"),
        "MoELayer.from_full drop_tokens": (lambda v: MoELayer.from_full(moe_full(), drop_tokens=v),
                                           "MoELayer.from_full: drop_tokens"),
        "MoELayer drop_tokens": (lambda v: MoELayer(C, F, E, drop_tokens=v), "MoELayer: drop_tokens"),
        "reference_moe drop_tokens": (lambda v: reference_moe(moe_full(), x, drop_tokens=v),
                                      "reference_moe: drop_tokens"),
        "MoEBranch sequence_parallel": (lambda v: MoEBranch(MoELayer.from_full(moe_full()), sequence_parallel=v),
                                        "MoEBranch: sequence_parallel"),
        "GPT.from_full sequence_parallel": (lambda v: GPT.from_full(config, params, mesh, sequence_parallel=v),
                                            "GPT.from_full: sequence_parallel"),
        "PipelinedGPT.from_full sequence_parallel": (
            lambda v: PipelinedGPT.from_full(config, params, mesh, sequence_parallel=v),
            "PipelinedGPT.from_full: sequence_parallel"),
        "ColumnParallelLinear.from_full gather_output": (
            lambda v: ColumnParallelLinear.from_full(linear_full(), comm, gather_output=v),
            "ColumnParallelLinear.from_full: gather_output"),
        "ColumnParallelLinear.from_full sequence_parallel": (
            lambda v: ColumnParallelLinear.from_full(linear_full(), comm, sequence_parallel=v),
            "ColumnParallelLinear.from_full: sequence_parallel"),
        "ColumnParallelLinear equal_shards": (lambda v: ColumnParallelLinear(w, b, comm, equal_shards=v),
                                              "ColumnParallelLinear: equal_shards"),
        "RowParallelLinear.from_full input_is_parallel": (
            lambda v: RowParallelLinear.from_full(linear_full(), comm, input_is_parallel=v),
            "RowParallelLinear.from_full: input_is_parallel"),
        "RowParallelLinear sequence_parallel": (lambda v: RowParallelLinear(w, b, comm, sequence_parallel=v),
                                                "RowParallelLinear: sequence_parallel"),
        "ParallelMLP.from_full sequence_parallel": (
            lambda v: ParallelMLP.from_full(mlp_full(), comm, sequence_parallel=v),
            "ParallelMLP.from_full: sequence_parallel"),
        "ParallelAttention.from_full sequence_parallel": (
            lambda v: ParallelAttention.from_full(attn_full(), 2, comm, sequence_parallel=v),
            "ParallelAttention.from_full: sequence_parallel"),
        "ParallelBlock.from_full sequence_parallel": (
            lambda v: ParallelBlock.from_full(block_full(), 2, comm, sequence_parallel=v),
            "ParallelBlock.from_full: sequence_parallel"),
        "VocabParallelEmbedding.from_full sequence_parallel": (
            lambda v: VocabParallelEmbedding.from_full(emb, comm, sequence_parallel=v),
            "VocabParallelEmbedding.from_full: sequence_parallel"),
        "VocabParallelEmbedding equal_shards": (
            lambda v: VocabParallelEmbedding(emb["wte"], emb["wpe"], comm, equal_shards=v),
            "VocabParallelEmbedding: equal_shards"),
        "VocabParallelCrossEntropy equal_shards": (lambda v: VocabParallelCrossEntropy(comm, equal_shards=v),
                                                   "VocabParallelCrossEntropy: equal_shards"),
        "DataParallel average": (lambda v: DataParallel({"g": np.zeros(3)}, comm, average=v), "DataParallel: average"),
        "DataParallel progress": (lambda v: DataParallel({"g": np.zeros(3)}, comm, progress=v),
                                  "DataParallel: progress"),
        "Linear.create bias": (lambda v: nn.Linear.create(3, 4, bias=v), "Linear.create: bias"),
        "ZeroAdamW.grad_ready copy": (lambda v: grad_opt.grad_ready("a", np.ones(3), copy=v),
                                      "ZeroAdamW.grad_ready: copy"),
    }


def full_grads_of(comm):
    """Layers whose ``full_grads(sum_partial)`` takes a boolean, each after one forward and backward."""
    rng = np.random.default_rng(2)
    moe = MoELayer.from_full(moe_full())
    col = ColumnParallelLinear.from_full(linear_full(), comm)
    row = RowParallelLinear.from_full(linear_full(), comm)
    mlp = ParallelMLP.from_full(mlp_full(), comm)
    attn = ParallelAttention.from_full(attn_full(), 2, comm)
    block = ParallelBlock.from_full(block_full(), 2, comm)
    emb = VocabParallelEmbedding.from_full({"wte": rng.normal(size=(16, 8)), "wpe": rng.normal(size=(8, 8))}, comm)
    return {"MoELayer": moe, "ColumnParallelLinear": col, "RowParallelLinear": row, "ParallelMLP": mlp,
            "ParallelAttention": attn, "ParallelBlock": block, "VocabParallelEmbedding": emb}


@pytest.mark.parametrize("value", ["no", "", 1, 0, None, 1.0, [True]], ids=repr)
def test_boolean_options_refuse_what_is_not_true_or_false(comm, mesh, value):
    """A string ("no" is truthy), an int, None...: TypeError naming the function and the option, on every option
    (before, ``drop_tokens="no"`` and ``moe_dropless="no"`` computed as True, silently)."""
    problems = []
    for name, (call, prefix) in bool_options(comm, mesh).items():
        try:
            call(value)
            problems.append(f"{name}: {value!r} taken")
        except TypeError as e:
            if not str(e).startswith(f"{prefix} must be True or False, got {value!r}"):
                problems.append(f"{name}: {e}")
    for name, layer in full_grads_of(comm).items():
        try:
            layer.full_grads(sum_partial=value)
            problems.append(f"{name}.full_grads: {value!r} taken")
        except TypeError as e:
            if not str(e).startswith(f"{name}.full_grads: sum_partial must be True or False, got {value!r}"):
                problems.append(f"{name}.full_grads: {e}")
    assert not problems, problems


@pytest.mark.parametrize("value", [True, False, np.True_, np.False_], ids=repr)
def test_boolean_options_take_python_and_numpy_bools(comm, mesh, value):
    problems = []
    for name, (call, _) in bool_options(comm, mesh).items():
        if name == "ZeroAdamW.grad_ready copy":
            continue   # one gradient per step: checked below
        try:
            call(value)
        except Exception as e:  # noqa: BLE001 (any refusal is the failure)
            problems.append(f"{name}: {type(e).__name__}: {e}")
    opt = ZeroAdamW({"a": np.ones(3)}, comm, stage=2)
    opt.grad_ready("a", np.ones(3), copy=value)
    opt.step()
    for name, layer in full_grads_of(comm).items():
        layer.full_grads(sum_partial=value)
    assert not problems, problems
    config = GPTConfig(**CONFIG, n_experts=4, moe_dropless=value)
    assert config.moe_dropless is bool(value)   # a Python bool: the config's repr is what ranks agree on
    assert MoELayer.from_full(moe_full(), drop_tokens=value).drop_tokens is bool(value)


def test_moe_dropless_no_was_dropless():
    """The audit's case: moe_dropless="no" meant dropless; the MoE layer's drop_tokens="no" meant dropping."""
    with pytest.raises(TypeError, match="GPTConfig: moe_dropless must be True or False, got 'no'"):
        GPTConfig(**CONFIG, n_experts=4, moe_dropless="no")
    with pytest.raises(TypeError, match="MoELayer.from_full: drop_tokens must be True or False, got 'no'"):
        MoELayer.from_full(moe_full(), drop_tokens="no")


@pytest.mark.parametrize("eps", [True, 0, -1e-5, float("nan"), float("inf"), "1e-5"], ids=repr)
def test_config_eps_is_a_positive_finite_number(eps):
    with pytest.raises(ValueError, match=re.escape(f"GPTConfig: eps must be a positive finite number, got {eps!r}")):
        GPTConfig(**CONFIG, eps=eps)


# -- 2. ZeroAdamW: read-only parameters, no_decay, stage --------------------------------------------------
def read_only(a):
    a = np.array(a, dtype=np.float64)
    a.flags.writeable = False
    return a


@pytest.mark.parametrize("stage", [0, 1, 2])
def test_zero_refuses_read_only_parameters_before_any_state(comm, stage):
    """A read-only parameter at stages 0 to 2 (each step writes into the parameters) is refused where the
    optimizer is built, naming it (before: taken, and step() raised numpy's "assignment destination is
    read-only" after t, the master weights and the moments had moved)."""
    b = np.ones(2)
    with pytest.raises(ValueError, match=f"ZeroAdamW: parameter 'a' is read-only; at stage {stage} each step "
                                         f"writes the updated values into the parameters"):
        ZeroAdamW({"b": b, "a": read_only([1.0, 2.0, 3.0])}, comm, stage=stage, lr=0.1)
    assert np.array_equal(b, np.ones(2))


def test_zero_stage_3_takes_read_only_parameters(comm):
    """Stage 3 keeps only its shard: the caller's arrays are read once, never written."""
    a = read_only([1.0, 2.0, 3.0])
    opt = ZeroAdamW({"a": a}, comm, stage=3, lr=0.1)
    assert opt.step({"a": np.ones(3)}) and opt.t == 1
    assert np.array_equal(a, [1.0, 2.0, 3.0])


def test_zero_refuses_read_only_owned_parameters(comm):
    with pytest.raises(ValueError, match=r"ZeroAdamW: owned_params\['e'\] is read-only; each step writes"):
        ZeroAdamW({"a": np.ones(3)}, comm, stage=3, owned_params={"e": read_only([1.0])},
                  owned_grads={"e": np.zeros(1)})


@pytest.mark.parametrize("no_decay", ["a", "ab", b"a", 5], ids=repr)
def test_zero_no_decay_is_a_collection_of_names(comm, no_decay):
    """A string was iterated by its characters: ``no_decay="ab"`` exempted parameters 'a' and 'b'."""
    with pytest.raises(TypeError, match=re.escape(f"ZeroAdamW: no_decay must be a collection of parameter names, "
                                                  f"got {no_decay!r}")):
        ZeroAdamW({"a": np.ones(3), "b": np.ones(2)}, comm, no_decay=no_decay)
    assert ZeroAdamW({"a": np.ones(3), "b": np.ones(2)}, comm, no_decay={"a"}).no_decay == {"a"}


def test_zero_no_decay_reads_an_iterator_once(comm):
    """A generator of names was read twice (checked, then kept): the second read found it empty, and no parameter
    was exempt from weight decay."""
    opt = ZeroAdamW({"a": np.ones(3), "b": np.ones(2)}, comm, no_decay=(n for n in ["a"]))
    assert opt.no_decay == {"a"}


@pytest.mark.parametrize("stage", [1.0, 2.5, "1", True, np.True_, None], ids=repr)
def test_zero_stage_is_an_integer(comm, mesh, stage):
    with pytest.raises(ValueError, match=re.escape(f"ZeroAdamW: stage must be one of (0, 1, 2, 3), got {stage!r}")):
        ZeroAdamW({"a": np.ones(3)}, comm, stage=stage)
    config = GPTConfig(**CONFIG)
    with pytest.raises(ValueError, match=re.escape(f"ZeroGPT: stage must be one of (0, 1, 2, 3), got {stage!r}")):
        ZeroGPT(config, init_params(config, dtype=np.float64), mesh, stage)


def test_zero_stage_takes_numpy_integers(comm):
    opt = ZeroAdamW({"a": np.ones(3)}, comm, stage=np.int64(2))
    assert opt.stage == 2 and type(opt.stage) is int


# -- 3. and 4. load_checkpoint -----------------------------------------------------------------------------
@pytest.fixture
def saved(comm, tmp_path):
    opt = ZeroAdamW({"a": np.ones((3, 4)), "b": np.ones(5)}, comm, stage=1, lr=0.1)
    opt.step({"a": np.ones((3, 4)), "b": np.ones(5)})
    path = str(tmp_path / "ck")
    save_checkpoint(opt, path)
    return path


@pytest.mark.parametrize("stage", [0, 1, 2])
def test_load_checks_every_target_before_writing_any(comm, saved, stage):
    """params={"a": writeable, "b": read-only}: CheckpointError naming 'b', and 'a' untouched (before: 'a' held the
    checkpoint's values, then numpy's "assignment destination is read-only")."""
    a, b = np.full((3, 4), -7.0), read_only(np.full(5, -7.0))
    with pytest.raises(CheckpointError, match=re.escape(
            f"load_checkpoint({saved!r}): params['b'] is read-only; at stage {stage} the load writes the saved "
            f"values into params")):
        load_checkpoint(saved, comm, stage, params={"a": a, "b": b})
    assert np.all(a == -7.0) and np.all(b == -7.0)
    with pytest.raises(CheckpointError, match=re.escape("params['b'] must be a NumPy or CuPy array, got list")):
        load_checkpoint(saved, comm, stage, params={"a": a, "b": [0.0] * 5})
    assert np.all(a == -7.0)


def test_load_at_stage_3_only_reads_params(comm, saved):
    a, b = read_only(np.full((3, 4), -7.0)), read_only(np.full(5, -7.0))
    opt = load_checkpoint(saved, comm, 3, params={"a": a, "b": b})
    assert opt.t == 1 and np.all(a == -7.0)


def test_load_with_a_refused_override_writes_nothing(comm, saved):
    """An override the optimizer refuses (lr=-1) used to raise after the caller's params held the saved values."""
    a, b = np.full((3, 4), -7.0), np.full(5, -7.0)
    with pytest.raises(ValueError, match="ZeroAdamW: lr must be a finite number >= 0.0, got -1"):
        load_checkpoint(saved, comm, 1, params={"a": a, "b": b}, lr=-1)
    assert np.all(a == -7.0) and np.all(b == -7.0)
    opt = load_checkpoint(saved, comm, 1, params={"a": a, "b": b})   # a good load fills and keeps them
    assert opt.params["a"] is a and not np.all(a == -7.0)
    opt.step({"a": np.ones((3, 4)), "b": np.ones(5)})
    assert np.array_equal(a, opt.full_state()["master"]["a"])   # updated in place


def resign(path, edit):
    """Edit the metadata and recompute its own checksum (the format's: sha256 of the canonical JSON of the rest)."""
    file = os.path.join(path, METADATA)
    with open(file) as f:
        meta = json.load(f)
    edit(meta)
    rest = {k: v for k, v in meta.items() if k != "sha256"}
    meta["sha256"] = hashlib.sha256(json.dumps(rest, sort_keys=True, separators=(",", ":"),
                                               allow_nan=False).encode()).hexdigest()
    with open(file, "w") as f:
        json.dump(meta, f)


@pytest.mark.parametrize("field, value, reason", [
    ("lr", -1, "lr must be a finite number >= 0.0, got -1"),
    ("betas", [1.5, 2], "betas must be two numbers in [0, 1), got [1.5, 2]"),
    ("betas", [-0.1, 0.5], "betas must be two numbers in [0, 1), got [-0.1, 0.5]"),
    ("eps", 0, "eps must be a finite number > 0.0, got 0"),
    ("weight_decay", -5, "weight_decay must be a finite number >= 0.0, got -5"),
    ("max_grad_norm", -1, "max_grad_norm must be a finite number > 0.0, got -1"),
])
def test_hyperparameters_out_of_range_are_a_checkpoint_error(comm, saved, field, value, reason):
    """docs/errors.md: other fields of the metadata that are wrong raise CheckpointError naming DIR/checkpoint.json
    (before: ``ValueError: ZeroAdamW: lr must be ...`` from the optimizer, after every rank file had been read)."""
    resign(saved, lambda m: m["hyperparameters"].__setitem__(field, value))
    params = {"a": np.full((3, 4), -7.0), "b": np.full(5, -7.0)}
    file = os.path.join(saved, METADATA)
    with pytest.raises(CheckpointError, match=re.escape(f"load_checkpoint({saved!r}): {file}: hyperparameters: "
                                                        f"{reason}")):
        load_checkpoint(saved, comm, 1, params=params)
    assert all(np.all(p == -7.0) for p in params.values())


def test_load_stage_is_an_integer(comm, saved):
    with pytest.raises(CheckpointError, match=re.escape("stage must be one of (0, 1, 2, 3), got 1.0")):
        load_checkpoint(saved, comm, 1.0)
    resign(saved, lambda m: m.__setitem__("stage", 1.0))
    with pytest.raises(CheckpointError, match=re.escape(f"{METADATA}: stage must be one of (0, 1, 2, 3), got 1.0")):
        load_checkpoint(saved, comm, 1)


# -- 5. the model layer's messages -------------------------------------------------------------------------
def test_gpt_refuses_a_sequence_of_no_tokens(mesh):
    """T = 0 failed inside the attention's softmax with numpy's "zero-size array to reduction operation maximum";
    refused as the single-process twin refuses it (B = 0 stays a batch of no rows: loss 0)."""
    model = small_gpt(mesh)
    empty = np.zeros((2, 0), np.int64)
    message = r"idx has T = 0 tokens; a sequence needs at least one \(up to block_size = 8\)"
    with pytest.raises(ValueError, match="GPT.forward: " + message):
        model.forward(empty, empty)
    config = GPTConfig(**CONFIG)
    with pytest.raises(ValueError, match="PipelinedGPT.step: " + message):
        PipelinedGPT.from_full(config, init_params(config, dtype=np.float64), mesh).step(empty, empty)
    with pytest.raises(ValueError, match="ReferenceGPT.forward: " + message):
        ReferenceGPT(config, init_params(config, dtype=np.float64)).forward(empty, empty)
    no_rows = np.zeros((0, 4), np.int64)
    assert float(model.forward(no_rows, no_rows)) == 0.0


def test_gpt_names_token_ids_that_are_not_arrays(mesh):
    model = small_gpt(mesh)
    ids = np.zeros((1, 2), np.int64)
    with pytest.raises(TypeError, match=r"GPT.forward: idx must be a NumPy or CuPy array, got list"):
        model.forward([[1, 2]], ids)
    with pytest.raises(TypeError, match=r"GPT.forward: targets must be a NumPy or CuPy array, got tuple"):
        model.forward(ids, ((1, 2),))


@pytest.mark.parametrize("params", [None, [("wte", np.zeros(3))], "params"], ids=repr)
def test_models_name_params_that_are_not_a_dict(mesh, params):
    config = GPTConfig(**CONFIG)
    kind = type(params).__name__
    with pytest.raises(TypeError, match=f"GPT.from_full: params must be a dict name -> array .*, got {kind}"):
        GPT.from_full(config, params, mesh)
    with pytest.raises(TypeError, match=f"PipelinedGPT.from_full: params must be a dict name -> array .*, got {kind}"):
        PipelinedGPT.from_full(config, params, mesh)
    with pytest.raises(TypeError, match=f"ReferenceGPT: params must be a dict name -> array, got {kind}"):
        ReferenceGPT(config, params)


def dy_cases(comm):
    """(layer after a forward, a good dy, its name) for the layers whose backward takes an array dy."""
    rng = np.random.default_rng(3)
    moe = MoELayer.from_full(moe_full(), top_k=2)
    moe.forward(rng.normal(size=(9, C)))
    col = ColumnParallelLinear.from_full(linear_full(), comm)
    col.forward(np.ones((3, 4)))
    row = RowParallelLinear.from_full(linear_full(), comm)
    row.forward(np.ones((3, 4)))
    mlp = ParallelMLP.from_full(mlp_full(), comm)
    mlp.forward(rng.normal(size=(2, 3, 8)))
    lin = nn.Linear(*linear_full().values())
    lin.forward(np.ones((3, 4)))
    return [(moe, np.zeros((9, C)), "MoELayer"), (col, np.ones((3, 6)), "ColumnParallelLinear"),
            (row, np.ones((3, 6)), "RowParallelLinear"), (mlp, np.ones((2, 3, 8)), "RowParallelLinear"),
            (lin, np.ones((3, 6)), "Linear")]


def test_backward_names_a_dy_that_is_not_an_array_and_keeps_the_forward(comm):
    """dy as a list: AttributeError 'list' object has no attribute 'shape' before; now a TypeError naming the layer
    and dy, and the forward's cache stays for a backward with an array."""
    for layer, dy, name in dy_cases(comm):
        with pytest.raises(TypeError, match=f"{name}.backward: dy must be a NumPy or CuPy array, got list"):
            layer.backward(dy.tolist())
        layer.backward(dy)


@pytest.mark.parametrize("aux_grad, error", [("1", TypeError), (True, TypeError), (None, TypeError),
                                             (np.array([1.0]), TypeError), (float("nan"), ValueError),
                                             (float("inf"), ValueError), (np.float32("nan"), ValueError)], ids=repr)
def test_moe_backward_aux_grad_is_a_finite_number(aux_grad, error):
    """aux_grad="1" raised "can't multiply sequence by non-int of type 'float'"; NaN gave NaN router gradients."""
    layer = MoELayer.from_full(moe_full(), top_k=2)
    x, dy = np.random.default_rng(4).normal(size=(2, 9, C))
    layer.forward(x)
    with pytest.raises(error, match=r"MoELayer.backward: aux_grad must be a finite number, got "):
        layer.backward(dy, aux_grad=aux_grad)
    assert not any(g.any() for g in layer.grads.values())
    twin = MoELayer.from_full(moe_full(), top_k=2)
    twin.forward(x)
    # the refused call left the forward: the same as a layer that never saw it; a 0-d array and NumPy floats pass
    for a, b in ((layer, 0.5), (twin, np.asarray(0.5))):
        a.backward(dy, aux_grad=b)
    assert all(np.array_equal(layer.grads[k], twin.grads[k]) for k in layer.grads)


def test_token_ids_and_mappings_name_what_is_not_an_array(comm):
    """The embeddings' ids and the communication pairs said "expected a NumPy or CuPy array, got list", naming
    neither the call nor the argument."""
    from pycollect.parallel.mappings import allgather_along, copy_to_group, reduce_from_group
    emb = nn.Embedding(np.zeros((5, 3)), np.zeros((4, 3)))
    cases = [(lambda: emb.forward([[0, 1]]), "Embedding.forward: idx"),
             (lambda: nn.CrossEntropy().forward(np.zeros((2, 4)), [0, 1]), "CrossEntropy.forward: targets"),
             (lambda: VocabParallelEmbedding.from_full({"wte": np.zeros((4, 3)), "wpe": np.zeros((2, 3))}, comm)
              .forward([[0]]), "VocabParallelEmbedding.forward: idx"),
             (lambda: copy_to_group(comm).forward([1.0]), "copy_to_group.forward: x"),
             (lambda: copy_to_group(comm).backward([1.0]), "copy_to_group.backward: dy"),
             (lambda: reduce_from_group(comm).forward([1.0]), "reduce_from_group.forward: x"),
             (lambda: reduce_from_group(comm).backward([1.0]), "reduce_from_group.backward: dy"),
             (lambda: allgather_along([1.0], 0, comm), "allgather_along: x")]
    for call, named in cases:
        with pytest.raises(TypeError, match=re.escape(f"{named} must be a NumPy or CuPy array, got list")):
            call()


def test_single_process_adamw_refuses_a_str_no_decay_and_read_only_parameters():
    """As ZeroAdamW: "ab" was the names "a" and "b", a generator was read twice (nothing exempt), and a read-only
    parameter failed inside step() after t and the earlier parameters' moments had moved."""
    from pycollect.optim import AdamW
    params, grads = {"a": np.ones(3), "b": np.ones(2)}, {"a": np.ones(3), "b": np.ones(2)}
    with pytest.raises(TypeError, match="AdamW: no_decay must be a collection of parameter names, got 'ab'"):
        AdamW(params, grads, no_decay="ab")
    assert AdamW(params, grads, no_decay=(n for n in ["b"])).no_decay == {"b"}
    b = np.ones(2)
    b.flags.writeable = False
    with pytest.raises(ValueError, match="AdamW: parameter 'b' is read-only"):
        AdamW({"a": np.ones(3), "b": b}, grads)
