#!/usr/bin/env bash
# Every Debian package CI needs, installed in one step (one `apt-get update`, one
# `apt-get install` of whatever is missing), so that a new machine pays for apt once, in a stage
# of its own whose limit holds there, and no later stage waits on apt:
#   packages.sh [GROUP...]   install the missing packages of GROUP (default: all of them)
#   packages.sh --list       print every package, one a line (e.g. to purge them)
# Groups: browser (the report's browser test), podman (podman.sh: builds, the Apptainer
# emulator, nix-instantiate, a registry), slurm (slurm.sh: a two-node cluster).
# podman.sh and slurm.sh call it for their own group, so each still runs alone.
set -euo pipefail

declare -A GROUPS_PACKAGES=(
    [browser]="chromium fonts-dejavu-core"
    [podman]="podman buildah debootstrap runc conmon fuse-overlayfs slirp4netns uidmap
        containernetworking-plugins catatonit nix-bin docker-registry"
    [slurm]="slurmctld slurmd slurm-client munge"
)
# Limits for a new machine: the update fetches every index; the install downloads and unpacks
# about 400 MB (chromium is most of it).
UPDATE_LIMIT=${PTSPEED_APT_UPDATE_LIMIT:-5m}
INSTALL_LIMIT=${PTSPEED_APT_INSTALL_LIMIT:-12m}

log() { printf 'packages.sh: %s\n' "$*" >&2; }

installed() {
    dpkg-query -W -f='${Status}' "$1" 2>/dev/null | grep -q "ok installed"
}

if [[ ${1:-} == --list ]]; then
    for group in "${!GROUPS_PACKAGES[@]}"; do
        read -r -a packages <<<"${GROUPS_PACKAGES[$group]//$'\n'/ }"
        printf '%s\n' "${packages[@]}"
    done | sort
    exit 0
fi

groups=("$@")
((${#groups[@]})) || groups=("${!GROUPS_PACKAGES[@]}")
missing=()
for group in "${groups[@]}"; do
    [[ -v GROUPS_PACKAGES[$group] ]] || {
        log "unknown group $group; the groups are ${!GROUPS_PACKAGES[*]}"
        exit 2
    }
    read -r -a packages <<<"${GROUPS_PACKAGES[$group]//$'\n'/ }"
    for package in "${packages[@]}"; do
        installed "$package" || missing+=("$package")
    done
done
if ((${#missing[@]} == 0)); then
    exit 0
fi
log "installing ${missing[*]}"
begun=$SECONDS
export DEBIAN_FRONTEND=noninteractive
timeout "$UPDATE_LIMIT" apt-get -o DPkg::Lock::Timeout=120 update -qq
timeout "$INSTALL_LIMIT" apt-get -o DPkg::Lock::Timeout=120 install -y -qq \
    --no-install-recommends "${missing[@]}" >/dev/null
log "installed ${#missing[@]} packages in $((SECONDS - begun)) s"
