#!/usr/bin/env bash
# The GPU checks, as one script for the device machine (docs/installing.md, "GPU checks"). Run it there from the
# repository root with build/gpu-wheelhouse carried (scripts/gpu_wheelhouse.sh builds it here):
#     bash scripts/gpu_check.sh
# It makes a virtual environment over the machine's Python (its torch, CUDA libraries and the rest stay
# visible), installs this project and what the machine lacks from the wheelhouse with no package index, prints
# what the machine has (nvidia-smi, torch.cuda, ONNX Runtime's providers, XGBoost's build, cuda-python, NVML),
# then runs each check under its own timeout, printing PASS, FAIL or SKIP and why:
#   KIND_GPU on ONNX Runtime, on torch, on FIL (XGBoost); CUDA shared memory; GPU metrics; then every other
#   test marked `gpu`, one pytest run per test folder (a folder's conftest imports its plugin's packages).
# Every `gpu`-marked test runs exactly once: the named checks are `pytest -m gpu` over their test files.
# A check whose packages the machine lacks is SKIPped, naming them. The checks share a time budget
# (GPU_CHECK_BUDGET_S, 420 s): one that would start with under 30 s left is SKIPped, so the whole script ends
# within about 8 minutes. It writes gpu_check.log and gpu_check.xml (JUnit: a testcase per check, then every
# pytest run's own) to $OUT when set, else to build/gpu-check. Exit status 1 if any check FAILed, else 0.
#
# Environment: GPU_CHECK_PYTHON (python3: the machine's Python, which holds torch), GPU_WHEELHOUSE
# (build/gpu-wheelhouse), GPU_LARGE_PARTS (/tmp/gpu-large: the parts of scripts/gpu_large_wheels.sh, where
# earlier calls brought them), GPU_CHECK_VENV (/tmp/gpu-check-venv), GPU_CHECK_BUDGET_S (420), GPU_CHECK_ONLY (an
# extended regular expression: only the checks whose names match it run, e.g. 'torch|metrics' for a rerun).
set -uo pipefail
cd "$(dirname "$0")/.."

PYTHON=${GPU_CHECK_PYTHON:-python3}
WHEELHOUSE=${GPU_WHEELHOUSE:-build/gpu-wheelhouse}
VENV=${GPU_CHECK_VENV:-/tmp/gpu-check-venv}
BUDGET_S=${GPU_CHECK_BUDGET_S:-420}
ONLY=${GPU_CHECK_ONLY:-}
DEST=${OUT:-build/gpu-check}
REPORT=scripts/gpu_check_report.py
mkdir -p "$DEST"
# Each pytest run's output and JUnit XML stay here; only the log and the merged XML go to $DEST ($OUT brings
# back 8 files at most).
GPU_CHECK_RESULTS=$(mktemp -d /tmp/gpu-check.XXXXXX)
export GPU_CHECK_RESULTS PYTHONUNBUFFERED=1 PIP_DISABLE_PIP_VERSION_CHECK=1 PIP_NO_INPUT=1
exec > >(tee "$DEST/gpu_check.log") 2>&1
tee_pid=$!
started=$SECONDS

finish() {
    "${PY:-$PYTHON}" "$REPORT" summary "$DEST/gpu_check.xml"
    local status=$?
    rm -rf "$GPU_CHECK_RESULTS"  # each run's output is in the log, its JUnit XML in gpu_check.xml
    echo "gpu_check.sh: exit status $status after $((SECONDS - started)) s; log $DEST/gpu_check.log"
    exec >&- 2>&-
    wait "$tee_pid"
    exit "$status"
}

# whether a check is chosen by GPU_CHECK_ONLY
chosen() {
    [[ -z $ONLY || $1 =~ $ONLY ]]
}

# seconds a check may take: its own limit, cut to what is left of the budget; fails when under 30 s are left
slot_for() {
    local left=$((BUDGET_S - (SECONDS - started)))
    ((left >= 30)) || return 1
    echo $(($1 < left ? $1 : left))
}

# run_pytest NAME LIMIT_S PATH...: `pytest -m gpu PATH...` under a timeout, judged from its JUnit XML
run_pytest() {
    local name=$1 limit=$2 slot
    shift 2
    chosen "$name" || return 0
    local slug=${name//[^A-Za-z0-9]/-}
    if ! slot=$(slot_for "$limit"); then
        "$PY" "$REPORT" record "$name" SKIP "no time left in the ${BUDGET_S} s budget"
        return
    fi
    echo
    echo "---- $name: pytest -m gpu $* (timeout ${slot} s)"
    timeout -k 10 "$slot" "$PY" -m pytest -m gpu -q -rs -p no:cacheprovider \
        --junitxml="$GPU_CHECK_RESULTS/junit-$slug.xml" "$@" 2>&1 | tee "$GPU_CHECK_RESULTS/$slug.out"
    local rc=${PIPESTATUS[0]}
    "$PY" "$REPORT" judge "$name" "$GPU_CHECK_RESULTS/junit-$slug.xml" "$GPU_CHECK_RESULTS/$slug.out" "$rc"
}

echo "==== gpu_check.sh $(date -u +%FT%TZ) on $(uname -n), $(nproc) CPUs; commit $(git rev-parse --short HEAD 2>/dev/null || echo '?')"

echo "---- setup: virtual environment $VENV over $("$PYTHON" -c 'import sys; print(sys.executable, sys.version.split()[0])')"
setup() {
    [[ -d $WHEELHOUSE ]] || { echo "no $WHEELHOUSE: run scripts/gpu_wheelhouse.sh here and carry it"; return 1; }
    rm -rf "$VENV"
    # Without ensurepip (some distributions leave it out) the machine's own pip installs into the new venv.
    if timeout 120 "$PYTHON" -m venv --system-site-packages "$VENV"; then
        PIP=("$VENV/bin/python" -m pip)
    else
        rm -rf "$VENV"
        timeout 60 "$PYTHON" -m venv --system-site-packages --without-pip "$VENV" || return 1
        PIP=("$PYTHON" -m pip --python "$VENV/bin/python")
    fi
    # --system-site-packages sees the base Python's packages only. Where the machine's Python is itself a
    # virtual environment (the device's torch lives in one), its site-packages are added after the new ones.
    local host_sites
    host_sites=$("$PYTHON" -c 'import site, sys; print("\n".join(site.getsitepackages()) if sys.prefix != sys.base_prefix else "")')
    local own_site
    own_site=$("$VENV/bin/python" -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])')
    while read -r site_dir; do
        [[ -n $site_dir ]] && echo "import site; site.addsitedir('$site_dir')" >>"$own_site/_gpu_check_host.pth"
    done <<<"$host_sites"
    # The core and the test client with their dependencies (those the machine has are kept), then the
    # plugins without theirs: tensorrt, xgboost and the like are not carried; their checks SKIP.
    timeout 240 "${PIP[@]}" install -q --no-index --no-compile --find-links "$WHEELHOUSE" \
        "$WHEELHOUSE"/triton_serve-*.whl "tritonclient[http,grpc]" || return 1
    timeout 120 "${PIP[@]}" install -q --no-index --no-compile --no-deps \
        "$WHEELHOUSE"/triton_serve_*.whl || return 1
    "${PIP[@]}" list 2>/dev/null | grep -iE "^(triton|torch |onnx|numpy |grpcio |protobuf |tritonclient|starlette|uvicorn|hypercorn|pytest |pytest-xdist|xgboost|nvidia-ml-py|cuda-)" || true
}
if setup; then
    PY=$VENV/bin/python
    "$PY" "$REPORT" record "setup (offline install)" PASS "$(ls "$WHEELHOUSE"/*.whl | wc -l) wheels from $WHEELHOUSE"
else
    PY=$PYTHON
    "$PY" "$REPORT" record "setup (offline install)" FAIL "the virtual environment or the offline install failed (above)"
    finish
fi

# onnxruntime-gpu and a CUDA XGBoost (with LightGBM and Treelite), where earlier device calls brought the parts
# scripts/gpu_large_wheels.sh cut: unpacked into the environment's own site-packages, with the machine's nvidia-*
# library wheels linked beside them, as `pip install onnxruntime-gpu[cuda,cudnn]` lays them out. Without the
# parts, the ONNX Runtime and FIL checks skip as before.
add_large_wheels() {
    local own_site digest parts
    own_site=$("$PY" -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])')
    mapfile -t parts < <(ls "$LARGE"/part-* 2>/dev/null | sort -V)
    ((${#parts[@]})) || { echo "no parts in $LARGE beside its SHA256"; return 1; }
    digest=$(cat "${parts[@]}" | sha256sum | cut -d' ' -f1)
    if [[ $digest != "$(cat "$LARGE/SHA256")" ]]; then
        echo "${#parts[@]} parts in $LARGE do not make the archive SHA256 names: one is missing or was cut short"
        return 1
    fi
    cat "${parts[@]}" | xz -d | tar xf - -C "$own_site" || return 1
    local nvidia
    nvidia=$("$PYTHON" -c 'import glob, site; print(next(iter(glob.glob(site.getsitepackages()[0] + "/nvidia")), ""))')
    [[ -z $nvidia || -e $own_site/nvidia ]] || ln -s "$nvidia" "$own_site/nvidia"
    "$PY" -m pip list 2>/dev/null | grep -iE "^(onnxruntime-gpu|xgboost|lightgbm|treelite) " || true
}
LARGE=${GPU_LARGE_PARTS:-/tmp/gpu-large}
if [[ -f $LARGE/SHA256 ]]; then
    echo "---- onnxruntime-gpu and the CUDA XGBoost from $LARGE"
    if add_large_wheels; then
        "$PY" "$REPORT" record "large wheels (onnxruntime-gpu, CUDA XGBoost)" PASS "unpacked from $LARGE"
    else
        "$PY" "$REPORT" record "large wheels (onnxruntime-gpu, CUDA XGBoost)" FAIL "not unpacked (above)"
    fi
fi

echo
echo "---- what this machine has"
if command -v nvidia-smi >/dev/null; then
    timeout 30 nvidia-smi || echo "nvidia-smi failed (exit $?)"
else
    echo "nvidia-smi: not on the PATH"
fi
timeout 120 "$PY" - <<'EOF' || echo "(the facts above stopped early: exit $?)"
import importlib, platform
from triton_serve.plugin import visible_gpu_ids
print(f"python {platform.python_version()}; visible_gpu_ids() -> {visible_gpu_ids()}")
def fact(title, read):
    try:
        print(f"{title}: {read()}")
    except Exception as error:  # a fact that cannot be read is shown as such
        print(f"{title}: unavailable ({type(error).__name__}: {error})")
def torch_facts():
    import torch
    text = f"{torch.__version__}, CUDA {torch.version.cuda}, is_available={torch.cuda.is_available()}"
    for index in range(torch.cuda.device_count()):
        props = torch.cuda.get_device_properties(index)
        text += f"; cuda:{index} {props.name}, capability {props.major}.{props.minor}, {props.total_memory / 2**30:.0f} GiB"
    return text
def cuda_python():
    from cuda.bindings import runtime
    error, count = runtime.cudaGetDeviceCount()
    return f"cudaGetDeviceCount -> {error}, {count}"
def nvml():
    import pynvml
    pynvml.nvmlInit()
    try:
        return f"driver {pynvml.nvmlSystemGetDriverVersion()}, {pynvml.nvmlDeviceGetCount()} device(s)"
    finally:
        pynvml.nvmlShutdown()
fact("torch", torch_facts)
fact("onnxruntime", lambda: (lambda ort: f"{ort.__version__}, providers {ort.get_available_providers()}")(importlib.import_module("onnxruntime")))
fact("xgboost", lambda: (lambda xgb: f"{xgb.__version__}, USE_CUDA={xgb.build_info().get('USE_CUDA')}")(importlib.import_module("xgboost")))
fact("cuda-python", cuda_python)
fact("nvidia-ml-py", nvml)
for name in ("transformers", "tensorrt", "lightgbm", "treelite", "tritonclient", "grpc", "google.protobuf"):
    fact(name, lambda: getattr(importlib.import_module(name), "__version__", "present"))
EOF

# The named checks: each is the gpu-marked tests of its file.
declare -A NAMED=(
    [plugins/onnx/tests/test_gpu.py]="KIND_GPU on ONNX Runtime"
    [plugins/torch/tests/test_gpu.py]="KIND_GPU on torch"
    [plugins/fil/tests/test_gpu.py]="KIND_GPU on FIL (XGBoost)"
    [tests/test_shared_memory.py]="CUDA shared memory"
)
run_pytest "KIND_GPU on ONNX Runtime" 150 plugins/onnx/tests/test_gpu.py
run_pytest "KIND_GPU on torch" 180 plugins/torch/tests/test_gpu.py
run_pytest "KIND_GPU on FIL (XGBoost)" 150 plugins/fil/tests/test_gpu.py
run_pytest "CUDA shared memory" 150 tests/test_shared_memory.py

echo
if ! chosen "GPU metrics"; then
    :
elif slot=$(slot_for 120); then
    echo "---- GPU metrics: scripts/gpu_metrics_check.py (timeout ${slot} s)"
    timeout -k 10 "$slot" "$PY" scripts/gpu_metrics_check.py 2>&1 | tee "$GPU_CHECK_RESULTS/metrics.out"
    rc=${PIPESTATUS[0]}
    last=$(tail -n 1 "$GPU_CHECK_RESULTS/metrics.out")
    case $rc in
        0) "$PY" "$REPORT" record "GPU metrics" PASS "${last#PASS: }" ;;
        77) "$PY" "$REPORT" record "GPU metrics" SKIP "${last#SKIP: }" ;;
        124 | 137) "$PY" "$REPORT" record "GPU metrics" FAIL "timed out (killed)" ;;
        *) "$PY" "$REPORT" record "GPU metrics" FAIL "exit $rc: ${last#FAIL: }" ;;
    esac
else
    "$PY" "$REPORT" record "GPU metrics" SKIP "no time left in the ${BUDGET_S} s budget"
fi

# Every other gpu-marked test, one run per test folder.
declare -A OTHERS=()
while read -r file; do
    [[ -n $file && -z ${NAMED[$file]:-} ]] && OTHERS[$(dirname "$file")]+=" $file"
done < <(grep -rlE --include='test_*.py' 'pytest\.mark\.gpu\b' tests plugins | grep -v '/build/' | sort)
for folder in $(printf '%s\n' "${!OTHERS[@]}" | sort); do
    # shellcheck disable=SC2086  # the file list splits on spaces: paths here have none
    run_pytest "gpu tests in $folder" 240 ${OTHERS[$folder]}
done

finish
