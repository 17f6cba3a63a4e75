"""The model layer on device arrays: one step of each parallel model on CuPy against NumPy.

    mpiexec -n 2 python bench/gpu_models.py [--backend cupy|numpy] [--json FILE]

Run by bench/gpu_check.sh on a lent GPU machine (``--backend numpy`` is the same run on host arrays,
which the tests use to keep this script working without a device). Each rank uses device
``rank % count``. On 2 ranks: the GPT with tp = 2 and sequence parallelism, the GPT with dp = 2 and
experts, the GPT with tp = 2, sequence parallelism and experts, the GPT in a 2-stage 1F1B pipeline
(dense and with experts), ZeroGPT at stage 3 over dp = 2 (dense and with experts), ZeRO stage 1
in the 2-stage pipeline — each from the same
full float64 parameters on the backend and on NumPy, one training step's loss and every full
gradient (or, for ZeRO, the parameters after one step) compared: relative error to 1e-10.
Exit status 1 when any error is above it.
"""
from __future__ import annotations

import argparse
import sys

import numpy as np

import pycollect as pc
from pycollect.models import GPT, GPTConfig, PipelinedGPT, init_params
from pycollect.models.data import reverse_batch, shard_rows
from pycollect.parallel import ProcessMesh
from pycollect.tools.report import run_header, write_json
from pycollect.zero import ZeroGPT, ZeroPipelinedGPT

CONFIG = GPTConfig(vocab_size=16, block_size=8, n_layer=2, n_head=4, n_embd=16, ffn=32, dropout=0.1)
MOE = GPTConfig(**{**CONFIG.to_dict(), "n_experts": 4, "moe_top_k": 2})


def host(a):
    return a.get() if hasattr(a, "get") else np.asarray(a)


def rel(a, b) -> float:
    a, b = host(a).astype(np.float64), host(b).astype(np.float64)
    return float(np.linalg.norm(a - b) / max(np.linalg.norm(b), 1e-300))


def on(xp, arrays: dict) -> dict:
    return {k: xp.asarray(v) for k, v in arrays.items()}


def gpt_step(config, params, mesh, xp, **kw):
    model = GPT.from_full(config, on(xp, params), mesh, **kw)
    idx, targets = shard_rows(reverse_batch(4 * mesh.dp_size, 8, 16, 1, 0), mesh.dp_rank, mesh.dp_size)
    loss = float(model.forward(xp.asarray(idx), xp.asarray(targets), (3, 0), first_row=mesh.dp_rank * 4))
    model.backward()
    model.finish_grads()
    return loss, model.full_grads()


def pipeline_step(config, params, mesh, xp):
    model = PipelinedGPT.from_full(config, on(xp, params), mesh, microbatches=2)
    idx, targets = reverse_batch(4, 8, 16, 1, 0)
    loss = model.step(xp.asarray(idx), xp.asarray(targets), (3, 0))
    return loss, model.full_grads()


def zero_step(config, params, mesh, xp):
    z = ZeroGPT(config, on(xp, params), mesh, 3, lr=1e-2)
    idx, targets = shard_rows(reverse_batch(4 * mesh.dp_size, 8, 16, 1, 0), mesh.dp_rank, mesh.dp_size)
    loss = z.step(xp.asarray(idx), xp.asarray(targets), (3, 0), first_row=mesh.dp_rank * 4)
    return loss, z.full_params()


def zero_pipeline_step(config, params, mesh, xp):
    z = ZeroPipelinedGPT(config, on(xp, params), mesh, 1, microbatches=2, lr=1e-2, max_grad_norm=0.5)
    idx, targets = reverse_batch(4, 8, 16, 1, 0)
    loss = z.step(xp.asarray(idx), xp.asarray(targets), (3, 0))
    full = z.full_params()
    z.free()
    return loss, full


def main(argv) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--backend", choices=("cupy", "numpy"), default="cupy")
    p.add_argument("--json", default="results/gpu-models.json")
    args = p.parse_args(argv)
    world = pc.Communicator()
    if args.backend == "cupy":
        import cupy as xp
        xp.cuda.Device(world.rank % xp.cuda.runtime.getDeviceCount()).use()
    else:
        xp = np
    sp_step = lambda c, p, m, x: gpt_step(c, p, m, x, sequence_parallel=True)  # noqa: E731
    cases = {
        "gpt tp2 sp": (CONFIG, dict(tp=world.size), sp_step),
        "gpt dp2 experts": (MOE, dict(dp=world.size), gpt_step),
        "gpt tp2 sp experts": (MOE, dict(tp=world.size), sp_step),
        "pipeline pp2 1f1b": (CONFIG, dict(pp=world.size), pipeline_step),
        "pipeline pp2 experts": (MOE, dict(pp=world.size), pipeline_step),
        "zero stage 3 dp2": (CONFIG, dict(dp=world.size), zero_step),
        "zero stage 3 experts": (MOE, dict(dp=world.size), zero_step),
        "zero 1 pipeline pp2": (CONFIG, dict(pp=world.size), zero_pipeline_step),
    }
    records, worst = [], 0.0
    for name, (config, shape, run) in cases.items():
        params = init_params(config, seed=2, dtype=np.float64)
        mesh = ProcessMesh(world, **shape)
        got_loss, got = run(config, params, mesh, xp)
        ref_loss, ref = run(config, params, mesh, np)
        err = max([abs(got_loss - ref_loss) / abs(ref_loss)] + [rel(got[n], ref[n]) for n in ref])
        worst = max(worst, err)
        records.append({"case": name, "loss": got_loss, "numpy_loss": ref_loss, "max_rel_err": err})
        mesh.free()
        if world.rank == 0:
            print(f"{name:20s} loss {got_loss:.6f} (numpy {ref_loss:.6f}) max relative error {err:.2e}")
    if world.rank == 0:
        header = run_header(world, sys.argv, backend=args.backend)
        print("wrote", write_json(args.json, "gpu_models", header, records, worst=worst))
    return 0 if worst <= 1e-10 else 1


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
