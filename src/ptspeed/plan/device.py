"""The device class the cells of a run use: the config's ``device``, with ``auto`` resolved
where the cells run. On this machine that is ``nvidia-smi -L`` (cuda when it lists a GPU, else
cpu); under a cluster executor the cells run on other nodes than the one that plans them, so
``auto`` is read from the config (platforms are GPU types: cuda) or refused.

This module needs no torch and no Snakemake.
"""

from __future__ import annotations

import shutil
import subprocess

from ptspeed.errors import ConfigError


def detect_device_class(requested: str) -> str:
    """``requested`` itself unless it is ``auto``; then cuda where nvidia-smi lists a GPU."""
    if requested != "auto":
        return requested
    smi = shutil.which("nvidia-smi")
    if smi is None:
        return "cpu"
    listed = subprocess.run([smi, "-L"], capture_output=True, text=True, check=False)
    return "cuda" if listed.returncode == 0 and "GPU" in listed.stdout else "cpu"


def device_class_for_jobs(requested: str, declares_platforms: bool) -> str:
    """The device class of cells that run as cluster jobs: ``requested`` unless it is ``auto``;
    then cuda where the config lists platforms (each is a GPU type of the cluster). Without
    platforms, ``auto`` would be decided on the node that submits (a login node, often without
    a GPU), not on the nodes that run the cells: :class:`ConfigError`."""
    if requested != "auto":
        return requested
    if declares_platforms:
        return "cuda"
    raise ConfigError(
        "device: auto cannot be decided for cluster jobs on the node that submits them (it "
        "would plan the GPU nodes' cells from this node's devices); set device: cuda or "
        "device: cpu (e.g. --config device=cuda), or list the cluster's GPU types as platforms"
    )
