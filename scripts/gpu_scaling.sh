#!/usr/bin/env bash
# The 16-core scaling figures, on the device machine after scripts/gpu_check.sh (docs/installing.md, "GPU
# checks"): bench/run_add_sub.py at c=64 (batched and plain add_sub, HTTP binary and gRPC, short windows), once
# per --frontend-processes value, ours only (there is no Triton there). It reuses gpu_check.sh's virtual
# environment, making it if it is missing, and runs the perf_analyzer that scripts/gpu_wheelhouse.sh copied.
# Each value's table goes to $OUT/scaling-N.txt (else build/gpu-check) and to stdout; about 40 s per value.
#
# Environment: GPU_SCALING_FRONTENDS ("0 4 16"), GPU_CHECK_VENV (/tmp/gpu-check-venv), GPU_WHEELHOUSE
# (build/gpu-wheelhouse).
set -uo pipefail
cd "$(dirname "$0")/.."

FRONTENDS=${GPU_SCALING_FRONTENDS:-0 4 16}
VENV=${GPU_CHECK_VENV:-/tmp/gpu-check-venv}
WHEELHOUSE=${GPU_WHEELHOUSE:-build/gpu-wheelhouse}
DEST=${OUT:-build/gpu-check}
mkdir -p "$DEST"
export PERF_ANALYZER_HOME=$WHEELHOUSE/perf_analyzer

if [[ ! -x $VENV/bin/triton-serve ]]; then
    echo "---- no $VENV: gpu_check.sh makes it (no checks run)"
    GPU_CHECK_ONLY='^$' OUT=$(mktemp -d) bash scripts/gpu_check.sh >/dev/null 2>&1
    [[ -x $VENV/bin/triton-serve ]] || { echo "FAIL: the offline install did not make $VENV"; exit 1; }
fi
scripts/perf_analyzer --version >/dev/null 2>&1 || { echo "FAIL: $PERF_ANALYZER_HOME/perf_analyzer does not run"; exit 1; }
echo "==== gpu_scaling.sh on $(nproc) CPUs: $(uptime)"
status=0
for frontends in $FRONTENDS; do
    echo "---- --frontend-processes=$frontends"
    timeout -k 10 150 "$VENV/bin/python" bench/run_add_sub.py --variants batched plain --protocols http-binary grpc \
        --concurrency 64 --measurement-interval 1500 --max-trials 4 --attempts 1 \
        --ours-flags="--frontend-processes=$frontends" >"$DEST/scaling-$frontends.txt" 2>&1 || status=1
    grep -E '^\|' "$DEST/scaling-$frontends.txt" || tail -n 5 "$DEST/scaling-$frontends.txt"
done
echo "==== done: $(uptime)"
exit "$status"
