#!/usr/bin/env bash
# Builds build/gpu-wheelhouse/: the wheels that scripts/gpu_check.sh installs on the device machine, which has no
# package index. Run it here, before asking for that machine; docs/installing.md ("GPU checks") says how the
# two scripts are used.
#
# The device machine's Python (3.12) already holds torch (CUDA), transformers, onnxruntime (CPU build), numpy,
# grpcio, pytest, pytest-xdist, httpx, pluggy, prometheus-client, uvloop, nvidia-ml-py and cuda-bindings. The
# wheelhouse brings what it lacks: this project's wheels (the core and the plugins whose tests need a GPU), the
# core's web servers and the tritonclient test client with their dependencies, and the grpcio, protobuf and
# ml_dtypes versions the core and tritonclient accept, in case the machine's are outside them (pip installs one
# of these only where the machine's does not do). It does not bring onnxruntime-gpu or a CUDA build of XGBoost,
# hundreds of MB each, far over the 64 MiB that may travel: scripts/gpu_large_wheels.sh cuts those into parts.
#
# Environment: GPU_PYTHON_VERSION (3.12: the device's Python; set 3.11 etc. for a dry run on another Python),
# GPU_WHEELHOUSE (build/gpu-wheelhouse), PYTHON (python3: runs pip here).
set -euo pipefail
cd "$(dirname "$0")/.."

PYTHON_VERSION=${GPU_PYTHON_VERSION:-3.12}
WHEELHOUSE=${GPU_WHEELHOUSE:-build/gpu-wheelhouse}
PYTHON=${PYTHON:-python3}
LIMIT_BYTES=$((64 * 1024 * 1024))  # the device tool's limit on what travels: working tree plus carried paths

# Plugins whose tests need a GPU (python: it serves the example add_sub model of the CUDA shared memory test and
# of scripts/gpu_scaling.sh, whose batched variant needs batching; openai: bench/run_llm.py --cuda streams through
# --openai-port).
PLUGINS=(onnx torch fil transformers tensorrt python batching openai)
# What the device lacks, by name and by the ranges this project and tritonclient accept; --no-deps below, so a
# dependency missing here makes gpu_check.sh's offline install fail (the dry run in docs/installing.md finds it).
THIRD_PARTY=(
    "starlette>=0.40,<2" "uvicorn>=0.30,<1" "httptools>=0.6,<1" "hypercorn>=0.17,<1"  # the core's servers
    h2 hyperframe priority wsproto "hpack>=4,<5"                                      # hypercorn's, and the core's
    "tritonclient>=2.50" "python-rapidjson>=0.9.1" "geventhttpclient>=2.3.3" gevent "greenlet<3.4" zope.event
    zope.interface brotli                                                             # tritonclient[http,grpc]
    "grpcio>=1.81.1,<2" "protobuf>=6.31,<7" "ml_dtypes<=0.5.4"                       # versions both accept
)

rm -rf "$WHEELHOUSE"
mkdir -p "$WHEELHOUSE"
echo "== third-party wheels for CPython $PYTHON_VERSION, manylinux x86_64"
"$PYTHON" -m pip download --quiet --no-deps --only-binary=:all: --python-version "$PYTHON_VERSION" \
    --implementation cp --platform manylinux_2_28_x86_64 --platform manylinux_2_27_x86_64 \
    --platform manylinux_2_24_x86_64 --platform manylinux_2_17_x86_64 --platform manylinux2014_x86_64 \
    --platform manylinux1_x86_64 -c scripts/constraints.txt -d "$WHEELHOUSE" "${THIRD_PARTY[@]}"

echo "== this project's wheels: the core and plugins ${PLUGINS[*]}"
sources=(.)
for plugin in "${PLUGINS[@]}"; do
    sources+=("plugins/$plugin")
done
"$PYTHON" -m pip wheel --quiet --no-deps -c scripts/constraints.txt -w "$WHEELHOUSE" "${sources[@]}"

# perf_analyzer for scripts/gpu_scaling.sh (scripts/perf_analyzer runs it with PERF_ANALYZER_HOME set): the binary
# from pa-venv, with the CUDA runtime and libb64 it links and the device machine lacks.
if [[ -x pa-venv/bin/perf_analyzer ]]; then
    echo "== perf_analyzer from pa-venv, with libcudart and libb64"
    mkdir -p "$WHEELHOUSE/perf_analyzer/lib"
    cp pa-venv/bin/perf_analyzer "$WHEELHOUSE/perf_analyzer/"
    cp -L pa-venv/lib/python3*/site-packages/nvidia/cuda_runtime/lib/libcudart.so.12 "$WHEELHOUSE/perf_analyzer/lib/"
    cp -L "$(ldconfig -p | awk '/libb64\.so\.0d / {print $NF; exit}')" "$WHEELHOUSE/perf_analyzer/lib/"
else
    echo "== no pa-venv/bin/perf_analyzer (scripts/install.sh makes it): scripts/gpu_scaling.sh will not run"
fi

echo "== contents"
(cd "$WHEELHOUSE" && ls -1 ./*.whl | sed 's|^\./||' | while read -r wheel; do
    printf '%10d  %s\n' "$(stat -c %s "$wheel")" "$wheel"
done)
wheelhouse_bytes=$(find "$WHEELHOUSE" -type f -printf '%s\n' | awk '{s += $1} END {print s + 0}')
# What travels besides the carried wheelhouse: tracked files and untracked files that git does not ignore.
tree_bytes=$( { git ls-files -z; git ls-files -z --others --exclude-standard; } \
    | xargs -0 -r stat -c %s -- 2>/dev/null | awk '{s += $1} END {print s + 0}')
total=$((wheelhouse_bytes + tree_bytes))
mib() { awk -v b="$1" 'BEGIN {printf "%.1f MiB", b / 1048576}'; }
echo "wheelhouse: $(find "$WHEELHOUSE" -name '*.whl' | wc -l) wheels, $(mib "$wheelhouse_bytes") in $WHEELHOUSE"
echo "working tree that travels with it: $(mib "$tree_bytes"); together $(mib "$total") of $(mib "$LIMIT_BYTES")"
if ((total > LIMIT_BYTES)); then
    echo "FAIL: over the device tool's 64 MiB limit; carry less (drop a wheel above) or ignore untracked files" >&2
    exit 1
fi
