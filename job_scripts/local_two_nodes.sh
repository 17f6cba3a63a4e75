#!/bin/bash
# Two simulated nodes on one machine (MPICH only): `pycollect info`, the tier benchmark, the
# collective sweep. MPIR_CVAR_NUM_CLIQUES=2 splits the ranks into two "nodes" and UCX_TLS=tcp,self
# sends the traffic between them over loopback TCP, a real slow second tier.
#   job_scripts/local_two_nodes.sh                        # 4 ranks, nodes (0,2) and (1,3)
#   CLIQUES_BY_BLOCK=1 job_scripts/local_two_nodes.sh     # nodes (0,1) and (2,3)
# Writes JSON, CSV and PNG files into ${PYCOLLECT_RESULTS:-results}/<timestamp>/ (relative to the
# current directory), and fails unless MPI made two nodes. Variables: job_scripts/README.md.
set -euo pipefail

NP="${PYCOLLECT_NP:-4}"
export MPIR_CVAR_NUM_CLIQUES=2 UCX_TLS="${UCX_TLS:-tcp,self}"
if [ "${CLIQUES_BY_BLOCK:-${MPIR_CVAR_CLIQUES_BY_BLOCK:-0}}" = 1 ]; then
    export MPIR_CVAR_CLIQUES_BY_BLOCK=1
else
    unset MPIR_CVAR_CLIQUES_BY_BLOCK
fi
# With more ranks than cores, waiting ranks sleep instead of spinning (at 100-500 us a message).
if [ "$NP" -gt "$(nproc)" ]; then
    export MPIR_CVAR_ENABLE_HEAVY_YIELD="${MPIR_CVAR_ENABLE_HEAVY_YIELD:-1}"
fi
export OMP_NUM_THREADS="${OMP_NUM_THREADS:-1}" OPENBLAS_NUM_THREADS="${OPENBLAS_NUM_THREADS:-1}"
PY=$(command -v "${PYCOLLECT_PYTHON:-python3}")
OUT="${PYCOLLECT_RESULTS:-results}/$(date +%Y%m%d-%H%M%S)-$$"
mkdir -p "$OUT"
read -r -a TIERS_ARGS <<< "${PYCOLLECT_TIERS_ARGS:-}"
: "${PYCOLLECT_SWEEP_ARGS=--algorithm all}"       # unset: every algorithm beside MPI's own
read -r -a SWEEP_ARGS <<< "$PYCOLLECT_SWEEP_ARGS"

launch() {
    "${PYCOLLECT_MPIEXEC:-mpiexec}" -n "$NP" "$PY" -m pycollect "$@"
}
# NAME -> --json OUT/NAME.json --csv OUT/NAME.csv --plot OUT/NAME.png (no plot with PYCOLLECT_PLOTS=0)
outputs() {
    FILES=(--json "$OUT/$1.json" --csv "$OUT/$1.csv")
    [ "${PYCOLLECT_PLOTS:-1}" = 0 ] || FILES+=(--plot "$OUT/$1.png")
}
step() {
    local t0=$SECONDS
    echo "== $(date +%T) pycollect $*"
    launch "$@"
    echo "== done in $((SECONDS - t0)) s"
}

echo "$NP ranks on 2 cliques (by block: ${CLIQUES_BY_BLOCK:-0}), UCX_TLS=$UCX_TLS; results in $OUT"
step info --json "$OUT/info.json"
# A launcher that ignores the cliques (not MPICH) would leave one node: say so instead of benchmarking.
"$PY" - "$OUT/info.json" <<'EOF'
import json, sys
node_of = json.load(open(sys.argv[1]))["header"]["node_of"]
if len(set(node_of)) != 2:
    sys.exit(f"ERROR: expected two simulated nodes, MPI made {len(set(node_of))} (node of each rank: {node_of}); "
             "MPIR_CVAR_NUM_CLIQUES needs MPICH's mpiexec")
print("node of each rank:", node_of)
EOF
outputs tiers
step bench tiers "${TIERS_ARGS[@]}" "${FILES[@]}"
outputs sweep
step bench "${PYCOLLECT_COLLECTIVE:-all}" "${SWEEP_ARGS[@]}" "${FILES[@]}"
echo "results in $OUT:"
ls -l "$OUT"
