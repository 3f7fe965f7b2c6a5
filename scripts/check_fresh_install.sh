#!/usr/bin/env bash
# Run the README's two set-up commands on a fresh Debian 12 or Ubuntu 24.04 that has only python3 (as root).
#
#   scripts/check_fresh_install.sh bookworm                                # Debian 12
#   scripts/check_fresh_install.sh noble -- tests/test_setup_commands.py   # Ubuntu 24.04; pytest gets the paths after --
#
# The first run debootstraps a minimal system into /srv/tserve-fresh/<suite>/base and installs python3 alone.
# Each run copies that base to /srv/tserve-fresh/<suite>/root, copies this working tree (tracked and untracked
# files, not ignored ones) to /src/triton-serve in it, and there runs the README's first command until the
# example repository answers on port 8000 (HTTP GET and a tritonclient inference), stops it with SIGINT, and runs
# the README's second command. The chroot lives in its own mount and PID namespaces: its mounts and processes
# end with it. Where this machine's network re-signs TLS, the CA bundles named by PIP_CERT and
# NODE_EXTRA_CA_CERTS here are copied in and named the same way there (pip's and npm's only change).
# Needs debootstrap (apt-get install debootstrap); no container runtime.
set -euo pipefail

repo="$(cd "$(dirname "$(readlink -f "${BASH_SOURCE[0]}")")/.." && pwd)"
suite="${1:-}"
shift || true
if [[ "${1:-}" == "--" ]]; then
    shift
fi
pytest_paths=("$@")
work="/srv/tserve-fresh/$suite"
base="$work/base"
root="$work/root"
wait_limit_s=7200  # the first command downloads several GB of wheels before it serves

case "$suite" in
    bookworm)
        mirror=http://deb.debian.org/debian
        sources="deb $mirror bookworm main
deb $mirror bookworm-updates main
deb http://deb.debian.org/debian-security bookworm-security main" ;;
    noble)
        mirror=http://archive.ubuntu.com/ubuntu
        sources="deb $mirror noble main restricted universe multiverse
deb $mirror noble-updates main restricted universe multiverse
deb $mirror noble-security main restricted universe multiverse" ;;
    *) echo "usage: $0 bookworm|noble [-- PYTEST_PATH...]" >&2; exit 2 ;;
esac

step() { echo "==> $(date +%T) $*"; }

# Run bash -c COMMAND inside chroot ROOT with its own /proc, /sys and /dev, in private mount and PID namespaces.
in_chroot() {
    local chroot_root=$1 command=$2 variable environment=()
    cp /etc/resolv.conf "$chroot_root/etc/resolv.conf"
    for variable in PIP_CERT NODE_EXTRA_CA_CERTS; do
        if [[ -f ${!variable:-} ]]; then
            mkdir -p "$chroot_root/etc/host-ca"
            cp "${!variable}" "$chroot_root/etc/host-ca/$variable.pem"
            environment+=("$variable=/etc/host-ca/$variable.pem")
        fi
    done
    unshare --mount --pid --fork --propagation private -- bash -euc '
        root=$1 command=$2
        shift 2
        mount -t proc proc "$root/proc"
        mount --rbind /sys "$root/sys"
        mount --rbind /dev "$root/dev"
        exec chroot "$root" /usr/bin/env -i HOME=/root TERM=dumb "$@" \
            PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin bash -euc "$command"' \
        _ "$chroot_root" "$command" "${environment[@]}"
}

make_base() {
    local script=() keyring=(--no-check-gpg)
    [[ -e /usr/share/debootstrap/scripts/$suite ]] || script=(/usr/share/debootstrap/scripts/gutsy)
    if [[ $suite == noble && -e /usr/share/keyrings/ubuntu-archive-keyring.gpg ]]; then
        keyring=(--keyring=/usr/share/keyrings/ubuntu-archive-keyring.gpg)
    elif [[ $suite == bookworm ]]; then
        keyring=()
    fi
    step "debootstrap --variant=minbase $suite $base"
    rm -rf "$base.partial"
    debootstrap "${keyring[@]}" --variant=minbase "$suite" "$base.partial" "$mirror" "${script[@]}" >/dev/null
    printf '%s\n' "$sources" >"$base.partial/etc/apt/sources.list"
    # What an installed system or a container image has and debootstrap leaves out.
    printf '127.0.0.1 localhost\n::1 localhost ip6-localhost ip6-loopback\n' >"$base.partial/etc/hosts"
    step "apt-get install python3 (alone), then the package lists are dropped as container images do"
    in_chroot "$base.partial" 'apt-get update -q >/dev/null
        DEBIAN_FRONTEND=noninteractive apt-get install -y -q python3 >/dev/null
        apt-get clean; rm -rf /var/lib/apt/lists/*'
    mv "$base.partial" "$base"
}

readme_setup_commands() {
    # The lines of the bash blocks in the README's "## Set-up" section.
    awk '/^## /{section = $0; next} section == "## Set-up" && /^```/{inside = !inside; next}
         section == "## Set-up" && inside' "$repo/README.md"
}

mapfile -t commands < <(readme_setup_commands)
if ((${#commands[@]} != 2)); then
    echo "check_fresh_install.sh: expected two commands in README.md's Set-up section, found ${#commands[@]}" >&2
    exit 1
fi
for port in 8000 8001 8002; do
    if (exec 3<>"/dev/tcp/127.0.0.1/$port") 2>/dev/null; then
        echo "check_fresh_install.sh: port $port is in use here; the chroot shares this machine's network" >&2
        exit 1
    fi
done
mkdir -p "$work"
exec 9>"$work/lock"
if ! flock --nonblock 9; then
    echo "check_fresh_install.sh: another check of $suite is running" >&2
    exit 1
fi
[[ -x $base/usr/bin/python3 ]] || make_base
if grep -q " $root/" /proc/mounts; then
    echo "check_fresh_install.sh: something is mounted under $root; unmount it first" >&2
    exit 1
fi
step "fresh root $root from $base"
rm -rf "$root"
cp -a "$base" "$root"
mkdir -p "$root/src/triton-serve"
git -C "$repo" ls-files -z --cached --others --exclude-standard \
    | tar -C "$repo" --null --ignore-failed-read -T - -cf - 2>/dev/null | tar -C "$root/src/triton-serve" -xf -

printf '%s\n' "${commands[0]}" >"$root/root/serve-command"
printf '%s\n' "${commands[1]}${pytest_paths[*]:+ ${pytest_paths[*]}}" >"$root/root/test-command"
cat >"$root/root/probe.py" <<'EOF'
"""Ask the served example repository for add_sub's config over HTTP, then run one tritonclient inference."""
import json
import urllib.request

import numpy as np
import tritonclient.http as httpclient

with urllib.request.urlopen("http://localhost:8000/v2/models/add_sub/config", timeout=10) as reply:
    print("GET /v2/models/add_sub/config:", reply.status, json.loads(reply.read())["name"])
client = httpclient.InferenceServerClient("localhost:8000")
inputs = [httpclient.InferInput(name, [1, 16], "INT32") for name in ("INPUT0", "INPUT1")]
for tensor in inputs:
    tensor.set_data_from_numpy(np.arange(16, dtype=np.int32).reshape(1, 16))
result = client.infer("add_sub", inputs)
assert (result.as_numpy("OUTPUT0") == 2 * np.arange(16)).all(), result.as_numpy("OUTPUT0")
print("tritonclient infer add_sub: OUTPUT0 =", result.as_numpy("OUTPUT0").tolist())
EOF

step "in the chroot: $(. "$root/etc/os-release"; echo "$PRETTY_NAME"), $(chroot "$root" python3 --version)"
in_chroot "$root" "
    cd /src/triton-serve
    echo \"\$ \$(cat /root/serve-command)\"
    started=\$(date +%s)
    setsid bash /root/serve-command >/root/serve.log 2>&1 &
    serving=\$!
    until [[ -x .venv/bin/python ]] && .venv/bin/python /root/probe.py >/root/probe.log 2>&1; do
        if ! kill -0 \$serving 2>/dev/null || (( \$(date +%s) - started > $wait_limit_s )); then
            wait \$serving && status=0 || status=\$?
            tail -n 40 /root/serve.log; echo \"first command ended (exit \$status) or timed out before serving\"
            exit 1
        fi
        sleep 10
    done
    cat /root/probe.log
    echo \"first command: serving after \$(( \$(date +%s) - started )) s\"
    grep -E '^==> ' /root/serve.log || true
    kill -INT -- -\$serving
    wait \$serving && status=0 || status=\$?
    echo \"first command stopped by SIGINT: exit \$status\"
    echo \"versions: \$(.venv/bin/python --version), pip \$(.venv/bin/python -m pip --version | cut -d' ' -f2),\" \
        \"node \$(node --version), kubectl: \$(command -v kubectl >/dev/null && kubectl version --client | head -n 1 || echo none)\"
    du -sh .venv pa-venv .npm-tools
    echo \"\$ \$(cat /root/test-command)\"
    started=\$(date +%s)
    bash /root/test-command >/root/test.log 2>&1 && status=0 || status=\$?
    tail -n 30 /root/test.log
    echo \"second command: exit \$status after \$(( \$(date +%s) - started )) s\"
    exit \$status
"
