#!/usr/bin/env bash
# Podman for the container test (tests/test_containers.py, run when PTSPEED_CONTAINER_BUILD=1):
#   1. Debian's podman, buildah, debootstrap and what runc needs (and nix-bin for
#      `nix-instantiate --parse`, docker-registry for a registry of the tests' own), by packages.sh;
#   2. /etc/containers/containers.conf for a machine without systemd (runc, cgroupfs, file
#      events, explicit ulimits: podman's defaults ask for more open files than the host allows);
#   3. a minimal Debian bookworm base image made with debootstrap. No Docker Hub here, so it
#      stands in for the NVIDIA CUDA base through docker/Dockerfile's BASE_IMAGE argument;
#   4. that base plus CPython 3.10 (the CUDA base's Ubuntu 22.04 has 3.10; Debian 12 has only
#      3.11, and torch 1.13.1 has no cp311 wheels): the machine's own pyenv build of 3.10,
#      compiled on Debian 12 against the libraries the base installs, copied to /usr/local.
#      A stand-in for CI only: on a real site the base is nvidia/cuda (docker/README.md).
# Idempotent (a second run changes nothing and takes seconds); every step is bounded in time.
# Prints the base image reference, then the Python 3.10 base's, one a line.
set -euo pipefail

BASE_IMAGE=${PTSPEED_CI_BASE_IMAGE:-localhost/ptspeed/debian-base:bookworm}
PYTHON_BASE_IMAGE=${PTSPEED_CI_PYTHON_BASE_IMAGE:-localhost/ptspeed/debian-python3.10:bookworm}
PYTHON_VERSION=3.10
OS_RELEASE_NAME="Debian GNU/Linux 12 (bookworm) + CPython $PYTHON_VERSION, ptspeed CI stand-in base"
# What a pyenv CPython links against (ldd of its binary and lib-dynload modules).
PYTHON_RUNTIME_PACKAGES=(libssl3 libffi8 libsqlite3-0 libbz2-1.0 liblzma5 zlib1g libreadline8
    libncursesw6 libuuid1 libgdbm6 libexpat1 libtirpc3 libcrypt1)
MIRROR=${PTSPEED_DEBIAN_MIRROR:-http://deb.debian.org/debian}
CONF=/etc/containers/containers.conf

log() { printf 'podman.sh: %s\n' "$*" >&2; }

capped() {
    local limit=$1 cap=16384
    if [[ $limit == unlimited ]] || ((limit > cap)); then
        echo "$cap"
    else
        echo "$limit"
    fi
}

install_packages() {
    bash "$(dirname "${BASH_SOURCE[0]}")/packages.sh" podman
}

write_containers_conf() {
    # Open files and processes: 16384 each, or the host's hard limit where that is lower. runc
    # cannot raise a limit here (root lacks CAP_SYS_RESOURCE in this VM), and podman's defaults
    # (1048576 files; for processes, above the 32768 that podman itself runs with) fail.
    local nofile nproc wanted
    nofile=$(capped "$(ulimit -Hn)")
    nproc=$(capped "$(ulimit -Hu)")
    wanted=$(
        cat <<EOF
# Written by ptspeed's .ci/podman.sh: podman on a VM without systemd.
[containers]
default_ulimits = ["nofile=${nofile}:${nofile}", "nproc=${nproc}:${nproc}"]
log_driver = "k8s-file"

[engine]
runtime = "runc"
cgroup_manager = "cgroupfs"
events_logger = "file"
EOF
    )
    if [[ -f $CONF && "$(cat "$CONF")" == "$wanted" ]]; then
        return
    fi
    mkdir -p "$(dirname "$CONF")"
    [[ -f $CONF ]] && cp "$CONF" "$CONF.before-ptspeed"
    printf '%s\n' "$wanted" >"$CONF"
    log "wrote $CONF"
}

build_base_image() {
    if timeout 1m podman image exists "$BASE_IMAGE"; then
        return
    fi
    local rootfs
    rootfs=$(mktemp -d /var/tmp/ptspeed-rootfs.XXXXXX)
    trap 'rm -rf "$rootfs"' RETURN
    log "debootstrap bookworm -> $BASE_IMAGE"
    timeout 10m debootstrap --variant=minbase bookworm "$rootfs" "$MIRROR" >/dev/null
    # What a registry image drops: apt lists and caches.
    rm -rf "$rootfs"/var/lib/apt/lists/* "$rootfs"/var/cache/apt/*.bin
    timeout 5m tar -C "$rootfs" -c . \
        | timeout 5m podman import --change 'CMD ["/bin/bash"]' - "$BASE_IMAGE" >/dev/null
}

pyenv_python_prefix() {
    local root
    root=$(pyenv root 2>/dev/null || echo "$HOME/.pyenv")
    find "$root/versions" -maxdepth 1 -name "$PYTHON_VERSION.*" 2>/dev/null | sort -V | tail -1
}

build_python_base_image() {
    if timeout 1m podman image exists "$PYTHON_BASE_IMAGE"; then
        return
    fi
    local prefix context
    prefix=$(pyenv_python_prefix)
    if [[ -z $prefix || ! -x $prefix/bin/python$PYTHON_VERSION ]]; then
        log "no pyenv CPython $PYTHON_VERSION on this machine (pyenv install $PYTHON_VERSION)"
        return 1
    fi
    context=$(mktemp -d /var/tmp/ptspeed-python.XXXXXX)
    trap 'rm -rf "$context"' RETURN
    # Without the test suite, and with an empty site-packages: the venvs bring their own pip
    # (ensurepip), and nothing the machine added to its own interpreter reaches the image.
    tar -C "$prefix" --exclude="lib/python$PYTHON_VERSION/test" \
        --exclude="lib/python$PYTHON_VERSION/site-packages/*" --exclude='__pycache__' \
        --exclude='bin/pip*' \
        -cf "$context/python.tar" bin include lib share
    cat >"$context/Containerfile" <<CONTAINERFILE
FROM $BASE_IMAGE
RUN apt-get update -qq && apt-get install -y -qq --no-install-recommends \\
        ${PYTHON_RUNTIME_PACKAGES[*]} >/dev/null && apt-get clean && rm -rf /var/lib/apt/lists/*
ADD python.tar /usr/local/
RUN ldconfig && python$PYTHON_VERSION -c 'import ssl, sqlite3, ctypes, lzma, bz2, venv'
# Says what it is, and lets a test tell this image's /etc/os-release from the Debian 12 host's.
RUN sed -i 's|^PRETTY_NAME=.*|PRETTY_NAME="$OS_RELEASE_NAME"|' /usr/lib/os-release
LABEL io.ptspeed.ci-stand-in="debootstrap bookworm + the CI machine's pyenv CPython $(basename "$prefix")"
CONTAINERFILE
    log "$BASE_IMAGE + CPython $(basename "$prefix") -> $PYTHON_BASE_IMAGE"
    timeout 10m podman build --network host -t "$PYTHON_BASE_IMAGE" "$context" >/dev/null
}

check_runs() {
    timeout 2m podman run --rm --network none "$BASE_IMAGE" true
}

install_packages
write_containers_conf
build_base_image
check_runs
build_python_base_image
echo "$BASE_IMAGE"
echo "$PYTHON_BASE_IMAGE"
