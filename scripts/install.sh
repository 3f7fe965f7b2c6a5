#!/usr/bin/env bash
# Install triton-serve for development on Debian, as root: core + plugins (editable), perf_analyzer, optionally Triton.
#
#   scripts/install.sh                 # core[test] and every plugins/*/[test] into python3, plus <repo>/pa-venv
#   scripts/install.sh --with-triton   # also <repo>/triton-venv and <repo>/tritonserver (real Triton 2.51, benchmarks only)
#
# Safe to re-run: each step skips what is already in place.
set -euo pipefail
shopt -s nullglob

repo="$(cd "$(dirname "$(readlink -f "${BASH_SOURCE[0]}")")/.." && pwd)"
cd "$repo"

with_triton=false
for arg in "$@"; do
    case "$arg" in
        --with-triton) with_triton=true ;;
        -h|--help) sed -n '2,7p' "$0" | sed 's/^# \{0,1\}//'; exit 0 ;;
        *) echo "install.sh: unknown argument '$arg' (try --help)" >&2; exit 2 ;;
    esac
done

export PIP_ROOT_USER_ACTION=ignore  # installing into the root interpreter is the point here

step() { echo "==> $*"; }

install_debian_packages() {
    local pkg missing=()
    for pkg in "$@"; do
        dpkg-query -W -f='${Status}' "$pkg" 2>/dev/null | grep -q "ok installed" || missing+=("$pkg")
    done
    if ((${#missing[@]} == 0)); then
        return
    fi
    step "apt-get install ${missing[*]}"
    local known=true
    for pkg in "${missing[@]}"; do
        apt-cache policy "$pkg" | grep -q "Candidate: [^(]" || known=false
    done
    # Update the package lists only when they lack a package or are too old to fetch it.
    if ! $known || ! apt_install "${missing[@]}"; then
        apt-get update -q
        apt_install "${missing[@]}"
    fi
}

apt_install() {
    DEBIAN_FRONTEND=noninteractive apt-get install -y -q --no-install-recommends "$@"
}

install_python_packages() {
    local project targets=(-e ".[test]")
    for project in plugins/*/pyproject.toml; do
        targets+=(-e "${project%/pyproject.toml}[test]")
    done
    step "python3 -m pip install ${targets[*]}"
    python3 -m pip install -q -c scripts/constraints.txt "${targets[@]}"
}

install_perf_analyzer() {
    # tritonclient 2.51.0 ships the last perf_analyzer that runs on glibc 2.36; its own venv keeps it
    # from replacing the newer tritonclient the tests use.
    if ! scripts/perf_analyzer --version >/dev/null 2>&1; then
        step "creating pa-venv (perf_analyzer 2.51.0)"
        python3 -m venv pa-venv
        pa-venv/bin/pip install -q tritonclient==2.51.0 nvidia-cuda-runtime-cu12
    fi
    local version
    version="$(scripts/perf_analyzer --version 2>&1)"
    echo "perf_analyzer: $repo/scripts/perf_analyzer ($version)"
}

install_azurite() {
    # azurite, the Azure Blob Storage emulator that plugins/storage's tests run, from npm into <repo>/.npm-tools.
    if [[ ! -x .npm-tools/node_modules/.bin/azurite-blob ]]; then
        step "npm install azurite into .npm-tools"
        npm install --prefix .npm-tools --no-audit --no-fund --loglevel=error azurite@3
    fi
}

install_triton() {
    # The nvidia-pytriton wheel carries a real tritonserver 2.51.0 with the Python backend.
    if [[ ! -x tritonserver/bin/tritonserver || ! -x tritonserver/backends/python/triton_python_backend_stub ]]; then
        step "creating triton-venv and tritonserver/ (Triton 2.51.0 from nvidia-pytriton)"
        python3 -m venv triton-venv
        triton-venv/bin/pip install -q nvidia-pytriton numpy
        local version site
        version="$(triton-venv/bin/python -c 'import sys; print("%d.%d" % sys.version_info[:2])')"
        site="triton-venv/lib/python$version/site-packages"
        rm -rf tritonserver
        cp -r "$site/pytriton/tritonserver" tritonserver
        cp "$site/pytriton/tritonserver/python_backend_stubs/$version/triton_python_backend_stub" \
            tritonserver/backends/python/
    fi
    echo "tritonserver: $repo/tritonserver/bin/tritonserver (libraries in $repo/triton-venv, see bench/README.md)"
}

install_debian_packages libb64-0d
# kubectl (its `kustomize`) for tests/test_deploy_manifests.py; a kubectl already installed by another
# package (Google Cloud's, say) stays, as Debian's kubernetes-client would clash with it.
command -v kubectl >/dev/null || install_debian_packages kubernetes-client
# Node.js and npm for azurite; a Node.js that brings its own npm (NodeSource's) stays, as Debian's npm
# package would clash with it.
command -v npm >/dev/null || install_debian_packages nodejs npm
install_python_packages
install_azurite
install_perf_analyzer
if $with_triton; then
    install_triton
fi
