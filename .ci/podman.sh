#!/usr/bin/env bash
# Podman for the container test (tests/test_containers.py, run when PTSPEED_CONTAINER_BUILD=1):
#   1. Debian's podman, buildah, debootstrap and what runc needs (and nix-bin);
#   2. /etc/containers/containers.conf for a machine without systemd (runc, cgroupfs, file
#      events, explicit ulimits: podman's defaults ask for more open files than the host allows);
#   3. a minimal Debian bookworm base image made with debootstrap. No Docker Hub here, so it
#      stands in for the NVIDIA CUDA base through docker/Dockerfile's BASE_IMAGE argument.
# Idempotent (a second run changes nothing and takes seconds); every step is bounded in time.
# Prints the base image reference on its last line.
set -euo pipefail

BASE_IMAGE=${PTSPEED_CI_BASE_IMAGE:-localhost/ptspeed/debian-base:bookworm}
MIRROR=${PTSPEED_DEBIAN_MIRROR:-http://deb.debian.org/debian}
CONF=/etc/containers/containers.conf
# nix-bin is not for podman: it gives tests/test_containers.py `nix-instantiate --parse`.
PACKAGES=(podman buildah debootstrap runc conmon fuse-overlayfs slirp4netns uidmap
    containernetworking-plugins catatonit nix-bin)

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
    local missing=() package
    for package in "${PACKAGES[@]}"; do
        dpkg-query -W -f='${Status}' "$package" 2>/dev/null | grep -q "ok installed" \
            || missing+=("$package")
    done
    if ((${#missing[@]} == 0)); then
        return
    fi
    log "installing ${missing[*]}"
    timeout 5m apt-get update -qq
    DEBIAN_FRONTEND=noninteractive timeout 10m \
        apt-get install -y -qq --no-install-recommends "${missing[@]}"
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

check_runs() {
    timeout 2m podman run --rm --network none "$BASE_IMAGE" true
}

install_packages
write_containers_conf
build_base_image
check_runs
echo "$BASE_IMAGE"
