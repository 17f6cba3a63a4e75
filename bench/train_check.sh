#!/usr/bin/env bash
# How far a mesh's training drifts from its single-process twin: `pycollect train --check` on the meshes
# README.md's "--check" paragraph speaks of, each writing its JSON (per-step losses; "check": the largest
# relative differences of the losses and of the final weights, the tolerance, passed) into OUT.
# A FAIL is recorded, not fatal: the text task's training is chaotic (see README.md).
# Usage: bash bench/train_check.sh [OUT] [TAG]   (4 ranks; a few minutes on 2 cores)
set -uo pipefail
out=${1:-bench/results}
tag=${2:-$(date -u +%Y-%m-%d)}
run() {   # name, then train's flags
    local name=$1; shift
    env OMP_NUM_THREADS=1 OPENBLAS_NUM_THREADS=1 MPIR_CVAR_ENABLE_HEAVY_YIELD=1 \
        mpiexec -n 4 python -m pycollect train --check --every 1000 --json "$out/$tag-train-check-$name.json" "$@" \
        | grep -E "^check|^wrote" || true
}
run tp2-dp2-f64-500 --tp 2 --dp 2 --steps 500 --dtype float64
run tp2-dp2-f32-20 --tp 2 --dp 2 --steps 20 --dtype float32
run tp2-dp2-f32-500 --tp 2 --dp 2 --steps 500 --dtype float32
run pp2-dp2-zero2-f64-200 --pp 2 --dp 2 --zero 2 --micro-batches 4 --steps 200 --dtype float64
run dp4-zero3-f64-200 --dp 4 --zero 3 --steps 200 --dtype float64
run tp2-dp2-experts4-f64-200 --tp 2 --dp 2 --experts 4 --steps 200 --dtype float64
run tp2-dp2-experts4-f32-200 --tp 2 --dp 2 --experts 4 --steps 200 --dtype float32
for steps in 20 40 100; do
    run tp2-dp2-sp-text-f64-$steps --tp 2 --dp 2 --sequence-parallel --task text --text README.md --steps $steps \
        --dtype float64
    run tp2-dp2-sp-text-f32-$steps --tp 2 --dp 2 --sequence-parallel --task text --text README.md --steps $steps \
        --dtype float32
done
