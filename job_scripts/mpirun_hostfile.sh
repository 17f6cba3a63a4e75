#!/bin/bash
# pycollect across the hosts of a hostfile, without Slurm: `pycollect info`, the tier benchmark,
# the collective sweep.
#   PYCOLLECT_HOSTFILE=hosts PYCOLLECT_PPN=4 job_scripts/mpirun_hostfile.sh
#       Open MPI: mpirun --hostfile hosts --map-by ppr:4:node -n 4*hosts (hosts: "nodeA slots=4")
#   PYCOLLECT_MPI_FLAVOR=mpich PYCOLLECT_HOSTFILE=hosts PYCOLLECT_PPN=4 job_scripts/mpirun_hostfile.sh
#       MPICH/hydra: mpiexec -f hosts -ppn 4 -n 4*hosts (hosts: "nodeA" or "nodeA:4")
# Writes JSON, CSV and PNG files into ${PYCOLLECT_RESULTS:-results}/<timestamp>/ (relative to the
# current directory). Variables: job_scripts/README.md.
set -euo pipefail

FLAVOR="${PYCOLLECT_MPI_FLAVOR:-openmpi}"
HOSTFILE="${PYCOLLECT_HOSTFILE:?set PYCOLLECT_HOSTFILE to a file naming one host per line}"
PPN="${PYCOLLECT_PPN:-1}"
# Hosts: the first word of each line that is not a comment, without ":slots" (MPICH's form).
NODES=$(sed -e 's/#.*//' "$HOSTFILE" | awk '{ split($1, h, ":"); if (h[1] != "") print h[1] }' | sort -u | wc -l)
[ "$NODES" -gt 0 ] || { echo "ERROR: $HOSTFILE names no host" >&2; exit 2; }
NP="${PYCOLLECT_NP:-$((PPN * NODES))}"

export OMP_NUM_THREADS="${OMP_NUM_THREADS:-1}" OPENBLAS_NUM_THREADS="${OPENBLAS_NUM_THREADS:-1}"
PY=$(command -v "${PYCOLLECT_PYTHON:-python3}")       # the same path must hold pycollect on every host
OUT="${PYCOLLECT_RESULTS:-results}/$(date +%Y%m%d-%H%M%S)-$$"
mkdir -p "$OUT"
read -r -a MPIRUN_ARGS <<< "${PYCOLLECT_MPIRUN_ARGS:-}"
read -r -a TIERS_ARGS <<< "${PYCOLLECT_TIERS_ARGS:-}"
: "${PYCOLLECT_SWEEP_ARGS=--algorithm all}"       # unset: every algorithm beside MPI's own
read -r -a SWEEP_ARGS <<< "$PYCOLLECT_SWEEP_ARGS"

case "$FLAVOR" in
    openmpi)
        # Open MPI passes on only the variables named with -x.
        LAUNCH=("${PYCOLLECT_MPIRUN:-mpirun}" --hostfile "$HOSTFILE" --map-by "ppr:$PPN:node" -n "$NP")
        for name in $(compgen -e); do
            case "$name" in
                PATH|LD_LIBRARY_PATH|PYTHONPATH|VIRTUAL_ENV|OMP_NUM_THREADS|OPENBLAS_NUM_THREADS|PYCOLLECT_*|UCX_*|CUDA_*)
                    LAUNCH+=(-x "$name") ;;
            esac
        done ;;
    mpich)
        # Hydra passes on the whole environment.
        LAUNCH=("${PYCOLLECT_MPIRUN:-mpiexec}" -f "$HOSTFILE" -ppn "$PPN" -n "$NP") ;;
    *)
        echo "ERROR: PYCOLLECT_MPI_FLAVOR must be openmpi or mpich, not '$FLAVOR'" >&2
        exit 2 ;;
esac

launch() {
    "${LAUNCH[@]}" "${MPIRUN_ARGS[@]}" "$PY" -m pycollect "$@"
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

echo "$NP ranks, $PPN per host on $NODES host(s) of $HOSTFILE: ${LAUNCH[*]:0:7}; results in $OUT"
step info --json "$OUT/info.json"            # exits 3 when MPI's world size is not the launcher's
outputs tiers
step bench tiers "${TIERS_ARGS[@]}" "${FILES[@]}"
outputs sweep
step bench "${PYCOLLECT_COLLECTIVE:-all}" "${SWEEP_ARGS[@]}" "${FILES[@]}"
echo "results in $OUT:"
ls -l "$OUT"
