#!/usr/bin/env bash
# Builds build/gpu-large/: onnxruntime-gpu and a CUDA build of XGBoost (with LightGBM and Treelite, which the fil
# tests import) for the device machine, cut into parts small enough to travel one per device call. Together they
# are about 290 MiB compressed, over the 64 MiB one call may carry, so they go over several calls while the
# machine stays warm, and scripts/gpu_check.sh puts them together there (docs/installing.md, "GPU checks").
#
# The wheels are unpacked into one tree (what pip would install into site-packages), tarred and compressed with
# xz (about 20% smaller than the wheels), then split: part-0 (GPU_LARGE_FIRST_MIB, 19) is small enough to travel
# beside build/gpu-wheelhouse, the others are GPU_LARGE_PART_MIB (55) each. SHA256 holds the archive's digest,
# which gpu_check.sh checks before it unpacks. It takes about 3 minutes on 2 cores (xz).
#
# Environment: GPU_PYTHON_VERSION (3.12), GPU_LARGE (build/gpu-large), PYTHON (python3: runs pip here),
# ORT_GPU_VERSION (1.31.1: built for CUDA 13, as the device's torch is), XGBOOST_VERSION, LIGHTGBM_VERSION,
# TREELITE_VERSION (those of .venv where it has them).
set -euo pipefail
cd "$(dirname "$0")/.."

PYTHON_VERSION=${GPU_PYTHON_VERSION:-3.12}
DEST=${GPU_LARGE:-build/gpu-large}
PYTHON=${PYTHON:-python3}
FIRST_MIB=${GPU_LARGE_FIRST_MIB:-19}
PART_MIB=${GPU_LARGE_PART_MIB:-55}

installed() {  # the version .venv has of a distribution, else the fallback given
    .venv/bin/python -c "import importlib.metadata as m; print(m.version('$1'))" 2>/dev/null || echo "$2"
}
WHEELS=(
    "onnxruntime-gpu==${ORT_GPU_VERSION:-1.31.1}"
    "xgboost==${XGBOOST_VERSION:-$(installed xgboost-cpu 3.2.0)}"  # the PyPI xgboost wheel is the CUDA build
    "lightgbm==${LIGHTGBM_VERSION:-$(installed lightgbm 4.7.0)}"
    "treelite==${TREELITE_VERSION:-$(installed treelite 4.8.1)}"
)

work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
echo "== ${WHEELS[*]} for CPython $PYTHON_VERSION, manylinux x86_64"
"$PYTHON" -m pip download --quiet --no-deps --only-binary=:all: --python-version "$PYTHON_VERSION" \
    --implementation cp --platform manylinux_2_28_x86_64 --platform manylinux_2_27_x86_64 \
    --platform manylinux_2_17_x86_64 --platform manylinux2014_x86_64 -d "$work/wheels" "${WHEELS[@]}"
mkdir "$work/site"
for wheel in "$work"/wheels/*.whl; do
    "$PYTHON" -m zipfile -e "$wheel" "$work/site"
done
echo "== compressing $(du -sm "$work/site" | cut -f1) MiB"
tar cf - -C "$work/site" . | xz -6 -T0 >"$work/site.tar.xz"

rm -rf "$DEST"
mkdir -p "$DEST"
(cd "$work" && sha256sum site.tar.xz | cut -d' ' -f1) >"$DEST/SHA256"
head -c $((FIRST_MIB * 1048576)) "$work/site.tar.xz" >"$DEST/part-0"
tail -c +$((FIRST_MIB * 1048576 + 1)) "$work/site.tar.xz" | split -b $((PART_MIB * 1048576)) -d -a 1 - "$DEST/part-x"
count=1
for piece in "$DEST"/part-x*; do
    mv "$piece" "$DEST/part-$count"
    count=$((count + 1))
done
ls -l "$DEST"
echo "== $count parts. On the device, one run each, back to back (the machine stays warm 30 s):"
echo "   carry [\"build/gpu-wheelhouse\", \"build/gpu-large/part-0\", \"build/gpu-large/SHA256\"], then [\"build/gpu-large/part-K\"],"
echo "   each with the command: mkdir -p /tmp/gpu-large && cp build/gpu-large/* /tmp/gpu-large/"
echo "   and last, in the same call as the last part or the next: bash scripts/gpu_check.sh (it finds /tmp/gpu-large)"
