"""The device class the cells of a run use: the config's ``device``, with ``auto`` resolved on
this machine (cuda when ``nvidia-smi -L`` lists a GPU, else cpu).

This module needs no torch and no Snakemake.
"""

from __future__ import annotations

import shutil
import subprocess


def detect_device_class(requested: str) -> str:
    """``requested`` itself unless it is ``auto``; then cuda where nvidia-smi lists a GPU."""
    if requested != "auto":
        return requested
    smi = shutil.which("nvidia-smi")
    if smi is None:
        return "cpu"
    listed = subprocess.run([smi, "-L"], capture_output=True, text=True, check=False)
    return "cuda" if listed.returncode == 0 and "GPU" in listed.stdout else "cpu"
