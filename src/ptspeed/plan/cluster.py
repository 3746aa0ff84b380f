"""Cells as SLURM jobs: the config's ``cluster`` block turned into the resources that
snakemake-executor-plugin-slurm reads from each job, and the checks a site imposes.

The plugin maps job resources to sbatch flags: ``slurm_partition`` to ``-p``,
``slurm_account`` to ``-A``, ``constraint`` to ``-C``, ``qos`` to ``--qos``, ``runtime`` to
``-t``, ``mem_mb`` to ``--mem``, ``cpus_per_task`` to ``--cpus-per-task``, ``nodes`` to
``--nodes``, ``gpu`` (with ``gpu_model``) to ``--gpus=[type:]N`` and ``gres`` to ``--gres``. The
plugin rejects ``--gres`` and ``--gpus`` in ``slurm_extra``, and GPU types with a ``-`` in
``gpu_model`` and ``gres``; such a type travels as ``--gpus-per-node`` in ``slurm_extra``, the
same request for a job of one node.
"""

from __future__ import annotations

import re

from ptspeed.errors import ConfigError
from ptspeed.plan.settings import Cluster, Settings

SLURM_RESOURCE_OF_KEY = {
    "partition": "slurm_partition",
    "account": "slurm_account",
    "constraint": "constraint",
    "qos": "qos",
}
REQUIRABLE_KEYS = ("account", "partition")
# The keys each platform may set in place of the cluster block's.
PLATFORM_KEYS = ("partition",)
GPU_REQUESTS = ("gpus", "gres")
# The GPU types snakemake-executor-plugin-slurm passes in gpu_model and gres (utils.py).
PLUGIN_GPU_TYPE = re.compile(r"^[A-Za-z0-9_.]+$")


def slurm_resources(cluster: Cluster) -> dict[str, str]:
    """The cell job's scheduler resources for the keys that are set. Unset keys are left out
    rather than passed empty: the plugin turns an empty constraint or qos into ``-C ''`` or
    ``--qos=''``, which sbatch rejects."""
    return {
        resource: str(getattr(cluster, key))
        for key, resource in SLURM_RESOURCE_OF_KEY.items()
        if getattr(cluster, key)
    }


def check_cluster(settings: Settings, jobs_go_to_scheduler: bool) -> None:
    """Raise :class:`ConfigError` when cells are about to be submitted to a site that requires
    an account or partition the config does not name, for the cluster block or for every
    platform (a platform's partition stands in for the cluster's). Local runs are never
    refused."""
    if not jobs_go_to_scheduler:
        return
    cluster, platforms = settings.cluster, settings.platforms
    for key in REQUIRABLE_KEYS:
        if not getattr(cluster, f"{key}_required") or getattr(cluster, key):
            continue
        lacking = [name for name, entry in platforms.items() if not getattr(entry, key, "")]
        if platforms and key in PLATFORM_KEYS and not lacking:
            continue
        where = f" (platform {lacking[0]} sets none)" if platforms and key in PLATFORM_KEYS else ""
        per_platform = f" or as platforms.<name>.{key}" if key in PLATFORM_KEYS else ""
        raise ConfigError(
            f"cluster.{key}: this site requires a SLURM {key} "
            f"(cluster.{key}_required: true) but none is set{where}; "
            f"name it as cluster.{key}{per_platform} in the config file"
        )


def gpu_request(count: int, gres_type: str, how: str) -> dict[str, int | str]:
    """The job resources that ask SLURM for a cell's ``count`` GPUs of type ``gres_type`` (''
    for any), by ``--gpus`` or, where ``how`` is ``gres`` (select/cons_res sites), ``--gres``.
    Every key is present; a blank one is left out by the plugin."""
    request: dict[str, int | str] = {"gpu": 0, "gpu_model": "", "gres": "", "slurm_extra": ""}
    typed = f"{gres_type}:{count}" if gres_type else str(count)
    plugin_takes_type = not gres_type or PLUGIN_GPU_TYPE.match(gres_type)
    if how == "gres":
        if not plugin_takes_type:
            raise ConfigError(
                f"platforms: gres_type {gres_type!r} cannot travel as --gres (the slurm executor "
                "takes letters, digits, _ and . there); use cluster.gpu_request: gpus"
            )
        return {**request, "gres": f"gpu:{typed}"}
    if not plugin_takes_type:
        return {**request, "slurm_extra": f"--gpus-per-node={typed}"}
    return {**request, "gpu": count, "gpu_model": gres_type}


def check_gpu_limit(limit: int | None, cuda: bool, jobs_go_to_scheduler: bool) -> None:
    """Raise :class:`ConfigError` when a ``--resources gpu=N`` below one GPU would meet CUDA
    cell jobs on a cluster: Snakemake lowers each job's request to that limit, so the job is
    submitted without a GPU and its GPU step fails inside SLURM."""
    if jobs_go_to_scheduler and cuda and limit is not None and limit < 1:
        raise ConfigError(
            f"resources: gpu={limit} would submit CUDA cell jobs without a GPU (profiles/default "
            "sets it, and --profile applies that profile too); run with --workflow-profile "
            "profiles/slurm, or give --resources gpu=N with N at least 1"
        )


def cpus_per_cell(
    threads: int,
    cluster: Cluster,
    jobs_go_to_scheduler: bool,
    cores: int,
    gpus: int = 0,
    gpu_limit: int | None = None,
) -> int:
    """CPUs of one cell: ``threads`` when set; else a cluster job's ``cluster.cpus_per_task``;
    else, for a cell of ``gpus`` GPUs on a node whose cells share ``gpu_limit`` GPUs
    (``--resources gpu=N``), its GPUs' share of the node's ``cores``, so that N one-GPU cells
    run side by side; else all ``cores``."""
    if threads:
        return threads
    if jobs_go_to_scheduler:
        return cluster.cpus_per_task
    if gpus and gpu_limit:
        return max(cores * gpus // gpu_limit, 1)
    return max(cores, 1)
