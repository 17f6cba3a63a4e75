#!/usr/bin/env bash
# GPU check for a lent machine (one GPU, no internet, a few minutes): install what is missing from
# wheels, the CuPy tests under mpiexec at 1, 2 and 4 ranks, the model layer on CuPy against NumPy
# (bench/gpu_models.py: GPT with tp + SP, experts, pipelines, ZeRO stage 3 and ZeRO in a pipeline), then the allreduce
# sweep on CuPy and on NumPy buffers.
#
#   bash bench/gpu_check.sh [WHEEL_DIR]        # WHEEL_DIR defaults to .whl (relative to the repository)
#
# One log (gpu-check.log, every step's output in turn) and the two sweeps' JSON go to ${OUT:-results}
# (four files: a lent machine sends back at most eight). Every step is capped with `timeout` and the whole run stays
# under ${BUDGET_S:-290} seconds; a summary of step statuses ends the output, and the exit status
# is 1 if any step failed. PYTHON picks the interpreter (default python3).
#
# Only what is missing is installed (see missing() below). The lent H200 image already holds
# Python 3.12, numpy, ml_dtypes, mpi4py, CuPy (cupy-cuda13x), pytest, hypothesis and
# pytest-timeout, but no MPI library for mpi4py: carry the MPICH wheel (13 MB). WHEEL_DIR is then a
# folder of the repository that .git/info/exclude ignores, named in the run's `carry`:
#
#   pip download -d .whl --no-deps --only-binary=:all: --python-version 3.12 --implementation cp \
#       --platform manylinux_2_28_x86_64 --platform manylinux_2_17_x86_64 --platform manylinux2014_x86_64 \
#       --platform manylinux1_x86_64 mpich==5.0.2 mpi4py==4.1.2
#
# For a bare machine, everything (far more than 64 MiB: CuPy and the CUDA wheels are large):
#
#   pip download -d .whl --only-binary=:all: --python-version 3.12 --implementation cp \
#       --abi cp312 --abi abi3 --abi none \
#       --platform manylinux_2_28_x86_64 --platform manylinux_2_17_x86_64 --platform manylinux2014_x86_64 \
#       mpi4py mpich numpy ml_dtypes cupy-cuda12x "cuda-toolkit[cudart,nvrtc,cublas]==12.*" \
#       pytest hypothesis pytest-timeout setuptools wheel
#
# The cuda-toolkit wheels (CUDA runtime, NVRTC for CuPy's kernels, cuBLAS) are only needed where the
# machine has no CUDA 12 toolkit; they are installed with CuPy when a cuda_toolkit wheel is in
# WHEEL_DIR. The PyPI MPICH wheel is not CUDA-aware, so device buffers are staged through host
# memory (the tests also force that mode with PYCOLLECT_CUDA_AWARE=0).
set -u

REPO=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
cd "$REPO" || exit 1
WHEELS=${1:-.whl}
OUT_DIR=${OUT:-results}
PY=${PYTHON:-python3}
mkdir -p "$OUT_DIR"
OUT_DIR=$(cd "$OUT_DIR" && pwd)
LOG="$OUT_DIR/gpu-check.log"
STEP_LOGS=$(mktemp -d)
: >"$LOG"
DEADLINE=$((SECONDS + ${BUDGET_S:-290}))

export PIP_DISABLE_PIP_VERSION_CHECK=1 PIP_ROOT_USER_ACTION=ignore PIP_BREAK_SYSTEM_PACKAGES=1
export PYTHONPATH="$REPO${PYTHONPATH:+:$PYTHONPATH}"   # works even if the editable install does not
export OMP_NUM_THREADS=1 OPENBLAS_NUM_THREADS=1 PYTHONUNBUFFERED=1

NAMES=() STATUSES=() TIMES=() FAILED=0

# step NAME CAP_SECONDS [optional] -- COMMAND...: run COMMAND under `timeout` (CAP or the time left,
# whichever is less), append its output to the log, print its tail. An optional step never fails the run.
step() {
    local name=$1 cap=$2 optional=0
    shift 2
    if [ "$1" = optional ]; then optional=1; shift; fi
    [ "$1" = -- ] && shift
    local log="$STEP_LOGS/$name.log" left=$((DEADLINE - SECONDS)) start=$SECONDS rc status
    local limit=$((cap < left ? cap : left))
    echo "== $name (limit ${limit}s): $*"
    if [ "$limit" -lt 5 ]; then
        rc=125
        echo "no time left" >"$log"
    else
        timeout --kill-after=5 "$limit" "$@" >"$log" 2>&1
        rc=$?
    fi
    tail -n 12 "$log"
    { echo "===== $name: $* (rc=$rc, $((SECONDS - start)) s)"; cat "$log"; echo; } >>"$LOG"
    case $rc in
        0) status=ok ;;
        124|137) status="TIMEOUT after ${limit}s" ;;
        125) status="SKIPPED (no time left)" ;;
        *) status="FAILED (rc=$rc)" ;;
    esac
    if [ "$rc" -ne 0 ]; then
        if [ "$optional" = 1 ]; then status="$status, optional"; else FAILED=1; fi
    fi
    NAMES+=("$name") STATUSES+=("$status") TIMES+=($((SECONDS - start)))
    return "$rc"
}

# A test step counts only if pytest ran tests: a module that skips (no usable device) is a failure here.
tests_ran() {
    local log=$1
    if grep -qE "[0-9]+ passed" "$log" && ! grep -qE "[0-9]+ (failed|error)" "$log"; then
        return 0
    fi
    echo "no test passed on this GPU (skipped or failed): see $LOG"
    return 1
}

# The packages missing, as pip names them: CuPy counts as present in any flavour (the H200 image has
# cupy-cuda13x, and a second cupy package would break it), MPICH as present if mpi4py loads an MPI.
missing() {
    "$PY" - <<'PYEOF'
import importlib.metadata as md
import importlib.util
import subprocess
import sys


def have(dist, module):
    try:
        md.version(dist)
        return True
    except md.PackageNotFoundError:
        return importlib.util.find_spec(module) is not None


need = [d for d, m in (("numpy", "numpy"), ("ml_dtypes", "ml_dtypes"), ("mpi4py", "mpi4py"),
                       ("pytest", "pytest"), ("hypothesis", "hypothesis"),
                       ("pytest-timeout", "pytest_timeout")) if not have(d, m)]
if importlib.util.find_spec("cupy") is None:
    need.append("cupy-cuda12x")
if "mpi4py" in need or subprocess.run([sys.executable, "-c", "from mpi4py import MPI"],
                                      capture_output=True).returncode != 0:
    need.append("mpich")
print(" ".join(need))
PYEOF
}

install() {
    local pkgs
    read -r -a pkgs <<<"$(missing)"
    if [ "${#pkgs[@]}" -eq 0 ]; then
        echo "everything is installed already"
    elif [ -d "$WHEELS" ]; then
        if [[ " ${pkgs[*]} " == *" cupy-cuda12x "* ]] && ls "$WHEELS"/cuda_toolkit-*.whl >/dev/null 2>&1; then
            pkgs+=("cuda-toolkit[cudart,nvrtc,cublas]")
        fi
        echo "from $WHEELS: ${pkgs[*]}"
        "$PY" -m pip install --no-index --find-links "$WHEELS" "${pkgs[@]}" || return
    else
        echo "no wheel directory $WHEELS; plain pip: ${pkgs[*]}"
        "$PY" -m pip install --retries 1 --timeout 15 "${pkgs[@]}" || return
    fi
    "$PY" -m pip list 2>/dev/null | grep -iE "^(numpy|ml.dtypes|mpi4py|mpich|cupy[-a-z0-9]*|pytest[-a-z]*|hypothesis) " || true
    "$PY" -c "from mpi4py import MPI; print(MPI.Get_library_version().splitlines()[0])"
}

editable() {
    "$PY" -m pip install --no-deps --no-build-isolation -e "$REPO" \
        || echo "editable install failed: using PYTHONPATH=$REPO"
    "$PY" -c "import pycollect; print('pycollect', pycollect.__version__, 'from', pycollect.__file__)"
}

device_info() {
    "$PY" - <<'PYEOF'
import sys

import cupy
import mpi4py
from mpi4py import MPI

print("python", sys.version.split()[0], "| cupy", cupy.__version__, "| mpi4py", mpi4py.__version__)
print(MPI.Get_library_version().splitlines()[0])
print("device count", cupy.cuda.runtime.getDeviceCount())
props = cupy.cuda.runtime.getDeviceProperties(0)
name = props["name"].decode() if isinstance(props["name"], bytes) else props["name"]
print("device 0:", name, "| runtime", cupy.cuda.runtime.runtimeGetVersion(),
      "| driver", cupy.cuda.runtime.driverGetVersion())
x = cupy.arange(10, dtype=cupy.float32)
print("a kernel compiles and runs:", float((x * 2).sum()) == 90.0)   # needs NVRTC
assert cupy.cuda.is_available()
PYEOF
}

echo "# gpu_check in $REPO; wheels: $WHEELS; results: $OUT_DIR; $(date -u +%FT%TZ)"
export REPO WHEELS PY
export -f missing install editable device_info
step install 120 -- bash -c install
step editable 40 optional -- bash -c editable
# mpiexec of the mpich wheel sits beside this Python's scripts; else whatever PATH has
MPIEXEC=$("$PY" -c "import os, sysconfig; p = os.path.join(sysconfig.get_path('scripts'), 'mpiexec'); print(p if os.path.exists(p) else '')" 2>/dev/null)
MPIEXEC=${MPIEXEC:-mpiexec}
echo "mpiexec: $MPIEXEC ($(command -v "$MPIEXEC" || echo 'not found'))"
step nvidia-smi 20 -- nvidia-smi -L
step device-count 30 -- "$PY" -c "import cupy; print(cupy.cuda.runtime.getDeviceCount())"
step device-info 60 -- bash -c device_info
for n in 1 2 4; do
    step "tests-$n" 90 -- env PYCOLLECT_UNDER_MPI=1 MPIEXEC_TIMEOUT=120 "$MPIEXEC" -n "$n" \
        "$PY" -m pytest tests/mpi/test_cupy.py -q -x -rs -p no:cacheprovider -o timeout=0 -o faulthandler_timeout=60
    if [ "${STATUSES[-1]}" = ok ] && ! tests_ran "$STEP_LOGS/tests-$n.log"; then
        STATUSES[-1]="FAILED (nothing passed: skipped?)"
        FAILED=1
    fi
done
step models-cupy 60 optional -- env MPIEXEC_TIMEOUT=90 "$MPIEXEC" -n 2 "$PY" bench/gpu_models.py --backend cupy \
    --json "$OUT_DIR/gpu-models.json"
step sweep-cupy 90 -- env MPIEXEC_TIMEOUT=120 "$MPIEXEC" -n 2 "$PY" bench/collectives.py \
    --collectives allreduce --algorithms all --sizes 8,32K,1M,64M --backend cupy --json "$OUT_DIR/gpu-allreduce-cupy.json"
step sweep-numpy 60 -- env MPIEXEC_TIMEOUT=120 "$MPIEXEC" -n 2 "$PY" bench/collectives.py \
    --collectives allreduce --algorithms all --sizes 8,32K,1M,64M --backend numpy --json "$OUT_DIR/gpu-allreduce-numpy.json"

rm -rf "$STEP_LOGS"
{
    echo
    echo "== summary ($SECONDS s in all; log and JSON in $OUT_DIR)"
    for i in "${!NAMES[@]}"; do
        printf '  %-14s %5ss  %s\n' "${NAMES[$i]}" "${TIMES[$i]}" "${STATUSES[$i]}"
    done
} | tee -a "$LOG"
if [ "$FAILED" -ne 0 ]; then
    echo "GPU CHECK FAILED" | tee -a "$LOG"
    exit 1
fi
echo "GPU CHECK PASSED" | tee -a "$LOG"
