"""GPU assignment on one node: each GPU cell gets GPUs no other running cell holds.

Snakemake counts GPUs (``--resources gpu=N``) but never says which ones a job may use, so two
GPU cells started side by side would both run on GPU 0 and spoil each other's numbers. The
watchdog of a GPU cell therefore claims its GPUs here before it starts the worker, and hands
them to the worker through ``CUDA_VISIBLE_DEVICES``.

A claim is an exclusive ``flock`` on one lock file per GPU in a directory shared by the cells
of the node. The kernel drops the lock when the holder exits, however it exits, so a killed
cell never leaves a GPU taken.

The pool of GPUs to claim from is, in order of precedence:

1. ``CUDA_VISIBLE_DEVICES`` when it is set: an allocation made by SLURM or by the user is
   respected, and only those devices are handed out (by their ids as written there);
2. ``PTSPEED_GPU_COUNT``: a device count given by hand (and how tests inject one);
3. the GPUs ``nvidia-smi -L`` lists.

Inside a SLURM job the lock files live in a directory of that job: SLURM renumbers the
devices of each job from 0, so "GPU 0" of two jobs can be two different devices.

This module needs no torch (the watchdog does not import it).
"""

from __future__ import annotations

import contextlib
import fcntl
import os
import re
import shutil
import subprocess
import tempfile
import time
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import IO

from ptspeed.cell.provenance import ASSIGNMENT_VARIABLE
from ptspeed.cell.variants.knobs import parse_knobs
from ptspeed.errors import ConfigError, GpuRequestError

VISIBLE_DEVICES_VARIABLE = "CUDA_VISIBLE_DEVICES"
COUNT_VARIABLE = "PTSPEED_GPU_COUNT"
LOCK_DIR_VARIABLE = "PTSPEED_GPU_LOCK_DIR"
DEVICE_ORDER_VARIABLE = "CUDA_DEVICE_ORDER"
# What the worker puts in its record (Provenance.gpu_assignment).
POLL_INTERVAL_S = 0.2
NVIDIA_SMI_TIMEOUT_S = 30


@dataclass(frozen=True)
class GpuPool:
    """The GPUs a cell on this node may be given, and where that list came from."""

    ids: tuple[str, ...]
    source: str

    def describe(self) -> str:
        shown = ",".join(self.ids) if self.ids else "none"
        return f"{len(self.ids)} GPU(s) [{shown}] from {self.source}"


@dataclass(frozen=True)
class GpuClaim:
    """GPUs held for one cell until the claim's context ends."""

    ids: tuple[str, ...]
    pool: GpuPool

    @property
    def visible_devices(self) -> str:
        return ",".join(self.ids)

    def describe(self) -> str:
        return f"claimed [{self.visible_devices}] of {self.pool.describe()}"


def node_pool(environ: dict[str, str] | None = None) -> GpuPool:
    """The GPUs of this node (or of this job's allocation) that cells may claim."""
    environ = dict(os.environ) if environ is None else environ
    visible = environ.get(VISIBLE_DEVICES_VARIABLE)
    if visible is not None:
        ids = tuple(part.strip() for part in visible.split(",") if part.strip())
        # CUDA stops at the first invalid entry, and "-1" or "" hides every device.
        ids = tuple(_until_invalid(ids))
        source = "SLURM's allocation" if "SLURM_JOB_ID" in environ else VISIBLE_DEVICES_VARIABLE
        return GpuPool(ids, f"{source} ({VISIBLE_DEVICES_VARIABLE}={visible})")
    count = environ.get(COUNT_VARIABLE)
    if count is not None:
        if not count.isdigit():
            raise GpuRequestError(
                f"{COUNT_VARIABLE}: {count!r} is not a number of GPUs (0, 1, 2, ...)"
            )
        return GpuPool(tuple(str(i) for i in range(int(count))), COUNT_VARIABLE)
    return GpuPool(tuple(str(i) for i in range(_nvidia_smi_count())), "nvidia-smi -L")


def _until_invalid(ids: tuple[str, ...]) -> Iterator[str]:
    for device in ids:
        if device.startswith("-"):
            return
        yield device


def _nvidia_smi_count() -> int:
    smi = shutil.which("nvidia-smi")
    if smi is None:
        return 0
    try:
        listed = subprocess.run(
            [smi, "-L"], capture_output=True, text=True, check=False, timeout=NVIDIA_SMI_TIMEOUT_S
        )
    except (OSError, subprocess.TimeoutExpired):
        return 0
    if listed.returncode != 0:
        return 0
    return sum(1 for line in listed.stdout.splitlines() if line.startswith("GPU "))


def lock_dir(environ: dict[str, str] | None = None) -> Path:
    """Where the per-GPU lock files of this node (or SLURM job) live."""
    environ = dict(os.environ) if environ is None else environ
    base = environ.get(LOCK_DIR_VARIABLE) or str(
        Path(tempfile.gettempdir()) / f"ptspeed-gpus-{os.getuid()}"
    )
    job = environ.get("SLURM_JOB_ID")
    return Path(base) / f"slurm-job-{job}" if job else Path(base)


@contextlib.contextmanager
def claim_gpus(
    count: int,
    wait_s: float,
    pool: GpuPool | None = None,
    locks: Path | None = None,
) -> Iterator[GpuClaim]:
    """Hold ``count`` GPUs of ``pool`` that no other cell holds, for the ``with`` block.

    Raises :class:`GpuRequestError` at once when the pool has fewer than ``count`` GPUs, and
    after ``wait_s`` seconds when they stay taken (more GPU cells were started than the node
    has GPUs: ``--resources gpu=N`` larger than the node's count).
    """
    pool = node_pool() if pool is None else pool
    if count < 1:
        raise GpuRequestError(f"gpus: {count} must be at least 1")
    if count > len(pool.ids):
        raise GpuRequestError(f"this cell needs {count} GPU(s); the node has {pool.describe()}")
    locks = lock_dir() if locks is None else locks
    locks.mkdir(parents=True, exist_ok=True)
    deadline = time.monotonic() + wait_s
    while True:
        held = _try_claim(pool, count, locks)
        if held is not None:
            break
        if time.monotonic() >= deadline:
            raise GpuRequestError(
                f"no {count} free GPU(s) within {wait_s:g} s: all of {pool.describe()} are "
                f"held by other cells (is --resources gpu=N larger than the node's GPU count?)"
            )
        time.sleep(POLL_INTERVAL_S)
    try:
        yield GpuClaim(tuple(held), pool)
    finally:
        for handle in held.values():
            handle.close()


def _try_claim(pool: GpuPool, count: int, locks: Path) -> dict[str, IO[bytes]] | None:
    """All-or-nothing: lock ``count`` free GPUs, or release what was taken and return None."""
    held: dict[str, IO[bytes]] = {}
    for device in pool.ids:
        handle = open(locks / f"gpu-{_file_safe(device)}.lock", "ab")  # noqa: SIM115
        try:
            fcntl.flock(handle, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            handle.close()
            continue
        held[device] = handle
        if len(held) == count:
            return held
    for handle in held.values():
        handle.close()
    return None


def _file_safe(device: str) -> str:
    return re.sub(r"[^A-Za-z0-9._-]", "_", device)


@contextlib.contextmanager
def gpu_environment(device: str, count: int, wait_s: float) -> Iterator[dict[str, str]]:
    """The environment variables that pin a cell's worker to its claimed GPUs, held for the
    ``with`` block: ``CUDA_VISIBLE_DEVICES`` and a description for the record.

    Only ``device == "cuda"`` claims: a cell given ``cuda:N`` was pinned by hand and a CPU cell
    needs nothing. A node that lists no GPUs at all hands out nothing and says so; the worker
    then finds out whether torch sees a device.
    """
    if device != "cuda":
        yield {}
        return
    pool = node_pool()
    if not pool.ids:
        yield {
            ASSIGNMENT_VARIABLE: (
                f"not assigned: the node lists no GPUs ({VISIBLE_DEVICES_VARIABLE}, "
                f"{COUNT_VARIABLE} and nvidia-smi -L give none)"
            )
        }
        return
    with claim_gpus(count, wait_s, pool) as claim:
        # The watchdog is the cell's own process: its worker inherits the CPUs.
        os.sched_setaffinity(0, cpu_share(sorted(os.sched_getaffinity(0)), pool, claim.ids))
        yield {
            # CUDA numbers GPUs fastest first unless told otherwise; nvidia-smi and SLURM by
            # PCI bus: without this, the claimed index names another GPU on mixed nodes.
            DEVICE_ORDER_VARIABLE: "PCI_BUS_ID",
            VISIBLE_DEVICES_VARIABLE: claim.visible_devices,
            ASSIGNMENT_VARIABLE: claim.describe(),
        }


def cpu_share(cpus: list[int], pool: GpuPool, claimed: tuple[str, ...]) -> list[int]:
    """The CPUs of the cell holding ``claimed`` GPUs of ``pool``: ``cpus`` (the node's, or the
    job's) cut into one equal slice per GPU of the pool, and the slices of the claimed GPUs, so
    that cells side by side on one node never share a CPU. All of ``cpus`` where there are
    fewer CPUs than GPUs."""
    per_gpu = len(cpus) // max(len(pool.ids), 1)
    if per_gpu == 0:
        return cpus
    positions = sorted(pool.ids.index(gpu) for gpu in claimed)
    return [cpu for p in positions for cpu in cpus[p * per_gpu : (p + 1) * per_gpu]]


def check_variant_gpus(variants: Mapping[str, str], limit: int | None) -> None:
    """Raise :class:`ConfigError` for a variant whose cells need more GPUs than the run may
    use at once (``--resources gpu=N`` on one machine): Snakemake would lower the job's
    request to N, and the cell would then take GPUs other cells were promised."""
    if limit is None:
        return
    if limit < 1:
        raise ConfigError(
            f"resources: gpu={limit} runs no CUDA cell; on a GPU node give --resources gpu=N "
            "(N = its GPUs) or use --workflow-profile profiles/gpu-node"
        )
    for name, knobs in variants.items():
        needed = parse_knobs(knobs).world_size
        if needed > limit:
            raise ConfigError(
                f"variants.{name}: each cell needs {needed} GPUs ({knobs!r}) but this run may use "
                f"{limit} (--resources gpu={limit}); raise it or lower procs="
            )
