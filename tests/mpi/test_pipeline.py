"""Pipeline parallelism under MPI: the GPT in 3D (dp, pp, tp) against the single-process run, the
point-to-point traffic of a step, and the errors raised before any message.

Meshes (dp, pp, tp) in (1,1,1) (1,2,1) (1,4,1) (2,2,1) (1,2,2) (2,2,2), carved from the world where
they fit; schedules gpipe, 1f1b and interleaved (2 chunks per stage), and the zero-bubble ones
(zb-h1, zb-h2 with m = p + 1, zbv: each backward split in B and W) on every mesh without tensor
parallelism and zb-h1, zbv on dp2-pp2-tp2, each mesh at one world size (gpipe, the simplest order, not on
dp2-pp2-tp2). 20 AdamW steps with dropout,
clipping and weight decay: the loss of every step and the final full weights equal ReferenceGPT's
trained on the same data, float64 to 1e-10 relative.
"""
import dataclasses
import re

import numpy as np
import pytest

from helpers import (agree, carve_group, carved_mesh, rel_close, release_group, shown_at_four, train_vs_twin,
                     verdicts)
from pycollect.models import GPTConfig, PipelinedGPT, init_params
from pycollect.models.data import reverse_batch
from pycollect.training import TrainConfig
from pycollect.parallel import Pipeline, ProcessMesh
from pycollect.parallel.pipeline import MESSAGE
from pycollect.pipeline import simulate

CONFIG = GPTConfig(vocab_size=16, block_size=8, n_layer=8, n_head=4, n_embd=16, ffn=32, dropout=0.1)
MESHES = [(1, 1, 1), (1, 2, 1), (1, 4, 1), (2, 2, 1), (1, 2, 2), (2, 2, 2)]  # (dp, pp, tp)
SCHEDULES = [("gpipe", 1, 0), ("1f1b", 1, 0), ("interleaved", 2, 0), ("interleaved", 2, 1), ("interleaved-mcore", 2, 0),
             ("zb-h1", 1, 0), ("zb-h2", 1, 1), ("zbv", 2, 0)]
ODD = {(1, 2, 1), (1, 4, 1), (2, 2, 2)}  # meshes that also run the orders new with Megatron-Core (rows 4 and 5)
# the zero-bubble schedules (backward split in B and W): mesh -> the one world size that runs it, so that
# the launches at several sizes do not repeat them; every mesh of a schedule runs 20 steps. pp2-tp2 is left
# to the files with experts (zb-h1) and ZeRO (zb-h2), dp2-pp2-tp2 to zb-h1 and zbv: tensor-parallel cases
# cost 2-4 s a launch on two cores
ZERO_BUBBLE_MESHES = {"zb-h1": {(1, 1, 1): 1, (1, 2, 1): 2, (1, 4, 1): 4, (2, 2, 1): 5, (2, 2, 2): 8},
                      "zb-h2": {(1, 1, 1): 1, (1, 2, 1): 3, (1, 4, 1): 5, (2, 2, 1): 4},
                      "zbv": {(1, 1, 1): 1, (1, 2, 1): 2, (1, 4, 1): 4, (2, 2, 1): 4, (2, 2, 2): 8}}


def mesh_id(m):
    return "dp{}-pp{}-tp{}".format(*m)


@pytest.fixture(scope="module", params=MESHES, ids=mesh_id)
def mesh(request, comm):
    dp, pp, tp = request.param
    with carved_mesh(comm, tp=tp, dp=dp, pp=pp) as mesh:
        yield mesh


@pytest.mark.parametrize("schedule, v, extra", SCHEDULES, ids=[s + "-m+1" * e for s, _, e in SCHEDULES])
def test_twenty_steps_in_3d_equal_the_single_process_run(comm, mesh, schedule, v, extra):
    if mesh is None:
        return agree(comm, True, "left over")
    shape = (mesh.dp_size, mesh.pp_size, mesh.tp_size)
    if schedule in ZERO_BUBBLE_MESHES and ZERO_BUBBLE_MESHES[schedule].get(shape) != comm.size:
        return agree(comm, True, "covered on other meshes")
    if schedule not in ZERO_BUBBLE_MESHES and (extra or schedule == "interleaved-mcore") and shape not in ODD:
        return agree(comm, True, "covered on other meshes")
    if schedule == "gpipe" and shape == (2, 2, 2):   # the simplest order, on every other mesh; 3 s a case at 8 ranks
        return agree(comm, True, "covered on other meshes")
    if schedule not in ZERO_BUBBLE_MESHES and shown_at_four(comm):
        return agree(comm, True, "covered at 4 ranks")
    m = max(2, mesh.pp_size) + extra  # extra: micro-batches that are not a multiple of pp (Megatron-Core's groups)
    cfg = TrainConfig(steps=20, batch=m * mesh.dp_size, micro_batches=m, lr=1e-2, weight_decay=0.1, clip=1.0,
                      seed=9)
    sp = mesh.tp_size > 1
    r = train_vs_twin(CONFIG, cfg, mesh, sp, schedule=schedule, virtual_stages=v)
    losses, ref_losses, off = r["losses"], r["ref_losses"], r["off"]
    agree(comm, rel_close(losses, ref_losses, 1e-10) and not off and ref_losses[-1] < ref_losses[0],
          f"{mesh_id((mesh.dp_size, mesh.pp_size, mesh.tp_size))} {schedule}: losses {losses[[0, -1]]} vs "
          f"{ref_losses[[0, -1]]}; weights off: {off}")


def test_point_to_point_traffic_of_one_step(comm, mesh):
    """Each stage sends one activation per micro-batch per chunk whose next model chunk is on another
    stage, and one gradient per chunk whose previous one is, each a header then B/m x T x C (x 1/tp
    with SP): interleaved, and zbv, whose last stage hands over between its two chunks in memory. The
    (micro, chunk) pairs held at most, from F to B or to the W of a split backward, are the simulator's."""
    with verdicts(comm) as check:  # left-over ranks agree too, with no verdict
        if mesh is None or CONFIG.n_layer < 2 * mesh.pp_size:  # left over, or too few layers
            return
        p, v, m = mesh.pp_size, 2, 2 * mesh.pp_size
        params = init_params(CONFIG, seed=1, dtype=np.float64)
        stage, last = mesh.pp_rank, p * v - 1
        t_local = 8 // mesh.tp_size if mesh.tp_size > 1 else 8
        for schedule in ("interleaved", "zbv"):
            model = PipelinedGPT.from_full(CONFIG, params, mesh, schedule=schedule, microbatches=m, virtual_stages=v,
                                           sequence_parallel=mesh.tp_size > 1)
            idx, targets = reverse_batch(m, 8, 16, 0, 0)
            with mesh.pp.record() as log:
                model.step(idx, targets)
            if schedule == "zbv":  # chunk 0 sends on unless at the bottom, back unless first; chunk 1 mirrored
                sends = 2 * m * ((stage != 0) + (stage != p - 1))
            else:
                chunks = [c * p + stage for c in range(v)]
                sends = m * (sum(k != last for k in chunks) + sum(k != 0 for k in chunks)) if p > 1 else 0
            payload = (idx.shape[0] // m) * t_local * CONFIG.n_embd
            sent = [r for r in log if r.collective == "send"]
            got = {"headers": sum(r.elements == MESSAGE for r in sent),
                   "payloads": sum(r.elements == payload for r in sent),
                   "others": len(sent) - sum(r.elements in (MESSAGE, payload) for r in sent)}
            check(got == {"headers": sends, "payloads": sends, "others": 0} and all(not r.blocking for r in sent),
                  f"{schedule} stage {stage}: {got}, expected {sends} of each")
            peak = simulate(schedule, p, m, v).peak_chunk_activations[stage]
            check(model.pipeline.peak_in_flight == peak,
                  f"{schedule} stage {stage}: held {model.pipeline.peak_in_flight} (micro, chunk) pairs, simulator {peak}")


def raises(fn, exc, match) -> str:
    try:
        fn()
    except exc as e:
        return "" if re.search(match, str(e)) else f"{exc.__name__} without {match!r}: {e}"
    except Exception as e:  # noqa: BLE001 - reported
        return f"{type(e).__name__} instead of {exc.__name__}: {e}"
    return f"no {exc.__name__} ({match!r})"


class Fake:
    """A chunk that only states what it sends and expects."""

    def __init__(self, inp, out):
        self._in, self._out = inp, out

    def input_spec(self):
        return self._in

    def output_spec(self):
        return self._out


def test_bad_input_is_refused_before_any_message(comm):
    n = comm.size
    pp = n if n <= 4 else 4
    group, sub = carve_group(comm, pp)
    problems = []
    if group is not None:
        mesh = ProcessMesh(group, pp=pp)
        params = init_params(CONFIG, seed=1, dtype=np.float64)
        few = dataclasses.replace(CONFIG, n_layer=max(1, pp - 1))
        problems += [
            raises(lambda: PipelinedGPT.from_full(few, init_params(few), mesh, microbatches=pp,
                                                  schedule="interleaved" if pp == 1 else "1f1b",
                                                  virtual_stages=2 if pp == 1 else 1), ValueError,
                   "more stages than layers"),
            raises(lambda: PipelinedGPT.from_full(CONFIG, params, mesh, layer_split=[8] + [0] * (pp - 1)),
                   ValueError, "without a layer" if pp > 1 else "x"),
            raises(lambda: PipelinedGPT.from_full(CONFIG, params, mesh, layer_split=[1] * pp), ValueError,
                   "summing to n_layer = 8"),
            raises(lambda: PipelinedGPT.from_full(CONFIG, params, mesh, schedule="zigzag"), ValueError, "zigzag"),
        ]
        if pp > 1:
            problems.append(raises(lambda: PipelinedGPT.from_full(CONFIG, params, mesh, schedule="interleaved",
                                                                  microbatches=pp - 1, virtual_stages=2),
                                   ValueError, rf"microbatches={pp - 1} micro-batches must be at least mesh.pp_size={pp}"))
        problems.append(raises(lambda: Pipeline([Fake(None, None)] * 2, mesh.pp, "zbv", pp, 2), TypeError,
                               r"splits each backward in B and W, but chunks\[0\] \(Fake\) has no backward_input"))
        for v in (1, 3):  # ZB-V is two chunks per stage placed V-wise, no other count
            vee = r"zbv: virtual_stages must be 2 \(two chunks per stage placed V-wise\), got virtual_stages=%d" % v
            problems.append(raises(lambda: PipelinedGPT.from_full(CONFIG, params, mesh, schedule="zbv", microbatches=pp,
                                                                  virtual_stages=v), ValueError, vee))
            problems.append(raises(lambda: Pipeline([Fake(None, None)] * v, mesh.pp, "zbv", pp, v), ValueError, vee))
        # messages are tagged by micro-batch, chunk and kind: more micro-batches than MPI's TAG_UB leaves room for
        # are refused where the pipeline is built (before, the last stage raised at the first tag past it, mid-run)
        tag_ub, mesh.pp.tag_ub, m = mesh.pp.tag_ub, 32767, 32768 // (2 * pp) + 1   # MPI's least
        problems.append(raises(lambda: Pipeline([Fake(None, None)], mesh.pp, "1f1b", m), ValueError,
                               rf"microbatches = {m} on {pp} stage\(s\) of 1 chunk\(s\) each need message tags up to "
                               rf"{2 * m * pp - 1} .* TAG_UB 32767: run at most {m - 1} micro-batches a run"))
        mesh.pp.tag_ub = tag_ub
        model = PipelinedGPT.from_full(CONFIG, params, mesh, microbatches=2)
        idx, targets = reverse_batch(3, 8, 16, 0, 0)
        problems.append(raises(lambda: model.step(idx, targets), ValueError, "3 rows does not divide"))
        # ids and targets checked on every stage before any message, as GPT.forward checks them (before, the
        # first stage raised in the embedding, the last in the loss, and the other stages waited for ever)
        idx, targets = reverse_batch(4, 8, 16, 0, 0)
        for what, args, error, words in (
                ("idx out of range", (idx + 99, targets), ValueError, r"step: idx holds values in \[99, 114\]"),
                ("idx float", (idx.astype(float), targets), TypeError, "step: idx has dtype float64"),
                ("targets negative", (idx, targets - 7), ValueError, "step: targets holds values in"),
                ("targets shape", (idx, targets[:, :6]), ValueError, r"targets has shape \(4, 6\), expected \(4, 8\)"),
                ("idx 1-d", (idx[0], targets[0]), ValueError, r"idx has shape \(8,\)"),
                ("first_row", (idx, targets, None, 1.5), ValueError, "first_row must be a non-negative integer")):
            problems.append(raises(lambda: model.step(*args), error, words))
        if pp > 1:  # activations no header carries: refused where the pipeline is built, on every stage
            for bad, words in ((((1,) * 9, "float64"), "9 dims of float64"), (((2, 8), "int64"), "2 dims of a dtype")):
                fakes = [Fake(None if s == 0 else bad, None if s == pp - 1 else bad) for s in range(pp)]
                problems.append(raises(lambda: Pipeline([fakes[mesh.pp_rank]], mesh.pp, "1f1b", 2), ValueError,
                                       rf"stage 0 chunk 0 to stage 1 chunk 0: an activation of {words}"))
        if pp > 1:  # the last stage expects float32 from the one before it, which sends float64
            spec = ((2, 8, 16), "float64")
            fakes = [Fake(None if s == 0 else (spec if s < pp - 1 else ((2, 8, 16), "float32")),
                          None if s == pp - 1 else spec) for s in range(pp)]
            problems.append(raises(lambda: Pipeline([fakes[mesh.pp_rank]], mesh.pp, "1f1b", 2), ValueError,
                                   rf"stage {pp - 2} chunk 0 sends float64\(2, 8, 16\) but stage {pp - 1} chunk 0 "
                                   r"expects float32\(2, 8, 16\)"))
        mesh.free()
        if problems and problems[1].startswith("no ValueError ('x')"):
            problems[1] = ""  # one stage: nothing can be empty
    release_group(group, sub)
    problems = [p for p in problems if p]
    agree(comm, not problems, "\n".join(problems))


class Lying(Fake):
    """A chunk of a two-stage pipeline whose forward (``lie="act"``) or backward (``"grad"``) returns float32
    where its spec says float64."""

    def __init__(self, stage, lie):
        spec = ((2, 4), "float64")
        super().__init__(None if stage == 0 else spec, spec if stage == 0 else None)
        self.stage, self.lie = stage, lie

    def forward(self, x, micro):
        if self.stage == 1:
            return np.float64(x.sum())   # the loss
        return np.zeros((2, 4), np.float32 if self.lie == "act" else np.float64)

    def backward(self, dy, micro):
        return None if self.stage == 0 else np.ones((2, 4), np.float32 if self.lie == "grad" else np.float64)


def test_a_chunk_that_sends_what_its_spec_does_not_say_raises_on_both_stages(comm):
    """A chunk whose output (or input gradient) is not what its spec, agreed at construction, says: its stage
    raises naming the chunk and the spec, and the neighbour raises on a refused header instead of waiting for
    ever (before, the receiver raised on the header and the sender waited for its gradient; with an output no
    header carries, the sender raised and the receiver waited). Errors caught: the ranks go on in step."""
    group, sub = carve_group(comm, 2)
    problems = []
    if group is not None:
        stage = group.rank
        for lie, sender in (("act", 0), ("grad", 1)):
            what = "activation" if lie == "act" else "gradient"
            said = "output_spec" if lie == "act" else "input_spec"
            words = (rf"stage {sender} chunk 0 made the {what} of micro-batch 0 as float32\(2, 4\), but its "
                     rf"{said}\(\) says float64\(2, 4\)" if stage == sender else
                     rf"stage {stage} chunk 0: stage {sender} refused to send the {what} of micro-batch 0")
            problems.append(raises(lambda: Pipeline([Lying(stage, lie)], group, "1f1b", 1).run(), ValueError, words))
        problems.append("" if np.isclose(group.allreduce(np.ones(1))[0], 2) else "not in step after the errors")
    release_group(group, sub)
    problems = [p for p in problems if p]
    agree(comm, not problems, "\n".join(problems))


class Counted(Fake):
    """A chunk of a two-stage pipeline, m = 2, whose gradients say their run and micro-batch (100 * run + micro);
    in run ``lie_run`` micro-batch 1's activation (``lie="act"``) or gradient (``"grad"``) is float32."""

    def __init__(self, stage, run, lie, lie_run=1):
        spec = ((2, 4), "float64")
        super().__init__(None if stage == 0 else spec, spec if stage == 0 else None)
        self.stage, self.run, self.lie, self.lie_run, self.got = stage, run, lie, lie_run, {}

    def dtype(self, kind, micro):
        return np.float32 if (self.run == self.lie_run and micro == 1 and self.lie == kind) else np.float64

    def forward(self, x, micro):
        if self.stage == 1:
            return np.float64(x.sum())
        return np.full((2, 4), 10.0 * self.run + micro, self.dtype("act", micro))

    def backward(self, dy, micro):
        if self.stage == 0:
            self.got[micro] = float(dy[0, 0])
            return None
        return np.full((2, 4), 100.0 * self.run + micro, self.dtype("grad", micro))


def test_a_run_that_raised_leaves_no_message_to_the_next(comm):
    """Run 1 raises on both stages (a chunk lies about micro-batch 1) after the last stage sent micro-batch 0's
    gradient, which stage 0 never received: runs 2 and 3, of new pipelines and of one pipeline run again, get
    their own gradients (before, stage 0 took run 1's in run 2, and every later run was one behind, silently)."""
    group, sub = carve_group(comm, 2)
    problems = []
    if group is not None:
        stage = group.rank
        for lie in ("act", "grad"):
            for reuse in (False, True):
                chunk = Counted(stage, 1, lie)
                pipe = Pipeline([chunk], group, "1f1b", 2)
                problems.append(raises(pipe.run, ValueError, "micro-batch 1"))
                for run in (2, 3):
                    chunk.run, chunk.got = run, {}
                    if not reuse:
                        pipe = Pipeline([chunk], group, "1f1b", 2)
                    pipe.run()
                    want = {0: 100.0 * run, 1: 100.0 * run + 1} if stage == 0 else {}
                    if chunk.got != want:
                        problems.append(f"{lie}, reuse {reuse}, run {run}: stage {stage} got {chunk.got}, want {want}")
        problems.append("" if np.isclose(group.allreduce(np.ones(1))[0], 2) else "not in step after the errors")
    release_group(group, sub)
    problems = [p for p in problems if p]
    agree(comm, not problems, "\n".join(problems))


def test_stages_that_differ_in_schedule_or_microbatches_are_refused(comm):
    """Stages built with other micro-batch counts or schedules: ValueError on every stage where the pipeline is
    built (before, one stage waited for ever, or returned its losses first)."""
    group, sub = carve_group(comm, 2)
    problems = []
    if group is not None:
        stage = group.rank
        spec = ((2, 4), "float64")
        fake = Fake(None if stage == 0 else spec, spec if stage == 0 else None)
        for first, others in ((("1f1b", 2), ("1f1b", 4)), (("gpipe", 2), ("1f1b", 2))):   # (schedule, m)
            problems.append(raises(lambda: Pipeline([fake], group, *(first if stage == 0 else others)), ValueError,
                                   "the ranks' schedule, microbatches or virtual_stages differ"))
    release_group(group, sub)
    problems = [p for p in problems if p]
    agree(comm, not problems, "\n".join(problems))


def test_a_stage_whose_chunk_specs_cannot_be_read_stops_every_stage(comm):
    """A chunk's input_spec() that raises (a dtype NumPy does not know) on the last stage alone: it raised there
    before the specs' allgather and the other stages waited in it (found by a helper). An xp that is no module is
    refused where the pipeline is built (it was taken, and run() failed on one stage)."""
    from helpers import refused_alone
    last = comm.rank == comm.size - 1

    class Chunk:
        params: dict = {}

        def forward(self, x, micro):
            return x

        def backward(self, dy, micro):
            return dy

        def input_spec(self):
            return None if comm.rank == 0 else ((2, 4), "notadtype" if last else "float64")

        def output_spec(self):
            return None if last else ((2, 4), "float64")

    if comm.size == 1:
        return agree(comm, True, "a pipeline of one stage reads no specs of others")
    refused_alone(comm, lambda: Pipeline([Chunk()], comm, "1f1b", 2), ["could not be read", "notadtype"],
                  ["could not read their chunks' specs"])
    refused_alone(comm, lambda: Pipeline([Chunk()], comm, "1f1b", 2, xp="numpy" if last else None),
                  ["xp must be the numpy or cupy module"])
