#!/bin/bash
# Sweep pycollect's collectives against MPI's own with mpiexec/mpirun.
#   NP=8 job_scripts/bench_mpirun.sh [bench/collectives.py options]
# Hosts: pass MPIEXEC_ARGS, e.g. MPIEXEC_ARGS="-hosts nodeA:4,nodeB:4" (MPICH) or "--host a:4,b:4" (Open MPI).
set -euo pipefail
cd "$(dirname "$0")/.."
export OMP_NUM_THREADS=1 OPENBLAS_NUM_THREADS=1
mkdir -p results
# shellcheck disable=SC2086
${MPIEXEC:-mpiexec} -n "${NP:-4}" ${MPIEXEC_ARGS:-} python3 bench/collectives.py \
    --json "results/bench-${NP:-4}ranks.json" "$@"
