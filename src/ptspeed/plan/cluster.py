"""Cells as SLURM jobs: the config's ``cluster`` block turned into the resources that
snakemake-executor-plugin-slurm reads from each job, and the checks a site imposes.

The plugin maps job resources to sbatch flags: ``slurm_partition`` to ``-p``,
``slurm_account`` to ``-A``, ``constraint`` to ``-C``, ``qos`` to ``--qos``, ``runtime`` to
``-t``, ``mem_mb`` to ``--mem``, ``cpus_per_task`` to ``--cpus-per-task`` and ``gpu`` to
``--gpus``. GPUs cannot travel in ``slurm_extra``: the plugin rejects ``--gres`` and ``--gpus``
there, so a GPU cell asks through the ``gpu`` resource.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from ptspeed.errors import ConfigError

SLURM_RESOURCE_OF_KEY = {
    "partition": "slurm_partition",
    "account": "slurm_account",
    "constraint": "constraint",
    "qos": "qos",
}
REQUIRABLE_KEYS = ("account", "partition")


def slurm_resources(cluster: Mapping[str, Any]) -> dict[str, str]:
    """The cell job's scheduler resources for the keys that are set. Unset keys are left out
    rather than passed empty: the plugin turns an empty constraint or qos into ``-C ''`` or
    ``--qos=''``, which sbatch rejects."""
    return {
        resource: str(cluster[key])
        for key, resource in SLURM_RESOURCE_OF_KEY.items()
        if cluster.get(key)
    }


def check_cluster(cluster: Mapping[str, Any], jobs_go_to_scheduler: bool) -> None:
    """Raise :class:`ConfigError` when cells are about to be submitted to a site that requires
    an account or partition the config does not name. Local runs are never refused."""
    if not jobs_go_to_scheduler:
        return
    for key in REQUIRABLE_KEYS:
        if cluster.get(f"{key}_required") and not cluster.get(key):
            raise ConfigError(
                f"cluster.{key}: this site requires a SLURM {key} "
                f"(cluster.{key}_required: true) but none is set; "
                f"name it as cluster.{key} in the config file"
            )


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


def cpus_per_cell(threads: int, cluster: Mapping[str, Any], jobs_go_to_scheduler: bool) -> int:
    """CPUs of one cell: ``threads`` when set; else a cluster job's ``cluster.cpus_per_task``;
    else 0, which leaves the choice to the caller (all cores given to Snakemake)."""
    if threads:
        return threads
    return int(cluster["cpus_per_task"]) if jobs_go_to_scheduler else 0
