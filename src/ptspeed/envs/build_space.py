"""Room for an Apptainer build: the free space, and what the user's quota leaves, where a build
unpacks the image and keeps its layers, and where a SIF is written; a build that cannot fit is
refused in one line before it starts.

This module needs no torch and no Snakemake.
"""

from __future__ import annotations

import os
import shutil
import subprocess
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path

from ptspeed.errors import ContainerError

# Making a SIF of an engine's image writes the image's docker archive (about its size) and then
# the SIF beside it (compressed, at most about as much again) before the archive goes.
SIF_ROOM_PER_IMAGE_BYTE = 2
# One conversion at a time per image directory, so that two archives never need room at once.
SIF_LOCK = ".sif-conversion.lock"
# What a build from the definition or a registry unpacks, where the size is not known before:
# a CUDA/cuDNN runtime base and a torch venv (the images here are 5 to 10 GB).
UNKNOWN_IMAGE_BYTES = 10 * 10**9
# quota(1) counts space in blocks of 1 KiB.
QUOTA_BLOCK_BYTES = 1024


def check_room_for_sif(env: str, directory: Path, image_bytes: int) -> None:
    """Refuse to start a conversion that the disk of ``directory`` cannot hold: a full disk
    midway leaves a failed multi-GB write and an engine error instead of this one line."""
    needed = SIF_ROOM_PER_IMAGE_BYTE * image_bytes
    free = shutil.disk_usage(directory).free
    if free < needed:
        raise ContainerError(
            f"images: making {env}.sif needs about {_gigabytes(needed)} free in {directory} "
            f"(the image's docker archive, then the SIF); {_gigabytes(free)} are free: free "
            "space there, or set containers.image_dir to a directory on a larger disk"
        )


@dataclass(frozen=True)
class BuildPlace:
    """A directory an Apptainer build writes to besides its target, and why."""

    variable: str
    path: Path
    role: str


def build_places(
    environ: Mapping[str, str] = os.environ, command: str = "apptainer"
) -> list[BuildPlace]:
    """Where ``command build`` unpacks the root filesystem (APPTAINER_TMPDIR, else
    SINGULARITY_TMPDIR, else TMPDIR, else /tmp: often a small tmpfs) and keeps the layers
    (APPTAINER_CACHEDIR/cache, else SINGULARITY_CACHEDIR/cache, else the configuration
    directory's cache: ~/.apptainer/cache, often under a home quota). Apptainer reads both
    names, the APPTAINER_ one first; SingularityCE's singularity reads SINGULARITY_* alone,
    and keeps its configuration in ~/.singularity."""
    prefixes = ("SINGULARITY",) if command == "singularity" else ("APPTAINER", "SINGULARITY")

    def first(name: str) -> tuple[str, str]:
        """(variable, value) of the first of the names that is set; (the main name, '')."""
        names = [f"{prefix}_{name}" for prefix in prefixes]
        return next(((n, environ[n]) for n in names if environ.get(n)), (names[0], ""))

    tmp_variable, temporary = first("TMPDIR")
    cache_variable, cache = first("CACHEDIR")
    if not cache:
        configuration = first("CONFIGDIR")[1] or str(Path.home() / f".{command}")
        cache = configuration
    return [
        BuildPlace(tmp_variable, Path(temporary or environ.get("TMPDIR") or "/tmp"),
                   "where it unpacks the image"),
        BuildPlace(cache_variable, Path(cache) / "cache", "where it keeps the layers"),
    ]  # fmt: skip


@dataclass(frozen=True)
class Room:
    """What a build may write on one filesystem: its free space, or what the user's quota
    leaves where that is less; ``note`` says where the quota could not be read."""

    free: int
    quota_left: int | None = None
    note: str = ""

    @property
    def bytes(self) -> int:
        return self.free if self.quota_left is None else min(self.free, self.quota_left)

    def describe(self) -> str:
        if self.quota_left is not None and self.quota_left < self.free:
            return f"{_gigabytes(self.quota_left)} left of your quota"
        return f"{_gigabytes(self.free)} free"


def room_at(path: Path, quota: str | None = None) -> Room:
    """The room at ``path``: the disk's free space and, where ``quota`` (the quota command;
    default: the one on PATH) answers for its filesystem, what the user's quota leaves."""
    existing = _existing(path)
    free = shutil.disk_usage(existing).free
    command = quota or shutil.which("quota")
    if command is None:
        return Room(free, note=f"{existing}: no `quota` command here to read your quota")
    mount = _mount_point(existing)
    try:
        done = subprocess.run(
            [command, "--no-wrap", "--verbose", "--filesystem-list", str(mount)],
            capture_output=True, text=True, check=False, timeout=30,
        )  # fmt: skip
    except (OSError, subprocess.TimeoutExpired) as error:
        return Room(free, note=f"{existing}: `quota` did not answer ({error})")
    return Room(free, quota_left(done.stdout))


def quota_left(report: str) -> int | None:
    """Bytes left under the user's block limit in ``quota --no-wrap --verbose`` output (1 KiB
    blocks; the hard limit, else the soft one); None where no limit is set or no filesystem
    is listed (quota prints only an error for a filesystem without quotas)."""
    for line in report.splitlines():
        fields = line.split()
        if len(fields) >= 4 and fields[1].rstrip("*").isdigit() and fields[2].isdigit():
            used, soft, hard = int(fields[1].rstrip("*")), int(fields[2]), int(fields[3])
            limit = hard or soft
            return max(0, limit - used) * QUOTA_BLOCK_BYTES if limit else None
    return None


def _mount_point(path: Path) -> Path:
    path = path.resolve()
    while not os.path.ismount(path) and path != path.parent:
        path = path.parent
    return path


def check_build_space(
    env: str,
    image_bytes: int | None,
    environ: Mapping[str, str] = os.environ,
    command: str = "apptainer",
    quota: str | None = None,
) -> list[str]:
    """Refuse a build that the temporary directory and layer cache of ``command`` cannot hold
    (``image_bytes`` each; unknown: UNKNOWN_IMAGE_BYTES) on their disks or under the user's
    quota there, in one line naming both variables; two places on one filesystem need room
    for both. Returns a note for each filesystem whose quota could not be read."""
    needed = image_bytes or UNKNOWN_IMAGE_BYTES
    places = build_places(environ, command)
    by_disk: dict[int, list[BuildPlace]] = {}
    for place in places:
        by_disk.setdefault(_existing(place.path).stat().st_dev, []).append(place)
    rooms = {device: room_at(group[0].path, quota) for device, group in by_disk.items()}
    notes = [f"{room.note}: the check counts the disk's free space only"
             for room in rooms.values() if room.note]  # fmt: skip
    short = [device for device, group in by_disk.items()
             if rooms[device].bytes < needed * len(group)]  # fmt: skip
    if not short:
        return notes
    described = "; ".join(
        f"{place.variable} ({place.path}, {place.role}): {rooms[device].describe()}"
        for device in short
        for place in by_disk[device]
    )
    raise ContainerError(
        f"images: building {env}.sif needs about {_gigabytes(needed)} in each of {command}'s "
        f"temporary directory and layer cache; {described}: set {places[0].variable} and "
        f"{places[1].variable} to directories on a disk with room"
    )


def _existing(path: Path) -> Path:
    """``path`` or its nearest existing parent (a cache not made yet is made there)."""
    while not path.exists() and path != path.parent:
        path = path.parent
    return path


def _gigabytes(size: int) -> str:
    return f"{size / 1e9:.1f} GB"
