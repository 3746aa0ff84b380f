"""The cells that run in an Apptainer image: the command that starts the image's python
(:data:`CELL_PYTHON`), the apptainer-args of the cell rules (no option that isolates the cells
of a node from each other; ``--nv`` on CUDA; the binds they need), and the launcher of a
brought image's probe.

This module needs no torch and no Snakemake.
"""

from __future__ import annotations

import os
import shlex
from collections.abc import Iterable, Mapping
from pathlib import Path

from ptspeed.errors import ConfigError

# How a cell's command starts the image's python: Apptainer passes the host's variables in, so
# the ones that would bring the host's Python in (PYTHONHOME, a startup file, a user site) go;
# PYTHONPATH is the cell rule's own (the suite's src/). The image's python is a venv's, which
# ignores the user site anyway (the bound $HOME's ~/.local).
CELL_PYTHON = "env -u PYTHONHOME -u PYTHONSTARTUP PYTHONNOUSERSITE=1"

# Options (and the variables Apptainer reads as those options) that break what the cells share
# on a node: each container's own /tmp hides the GPU claims of the others (and is a 64 MiB
# tmpfs), and a clean environment drops CUDA_VISIBLE_DEVICES and what ptspeed passes in.
PRIVATE_TMP = "gives every cell its own /tmp (64 MiB), where the cells of a node claim their GPUs"
CLEAN_ENVIRONMENT = (
    "drops CUDA_VISIBLE_DEVICES (the GPUs SLURM gave the job) and what ptspeed passes to the cell"
)
ISOLATING_OPTIONS = {
    "--contain": PRIVATE_TMP,
    "-c": PRIVATE_TMP,
    "--containall": f"{PRIVATE_TMP} and {CLEAN_ENVIRONMENT}",
    "-C": f"{PRIVATE_TMP} and {CLEAN_ENVIRONMENT}",
    "--cleanenv": CLEAN_ENVIRONMENT,
    "-e": CLEAN_ENVIRONMENT,
}
ISOLATING_VARIABLES = {
    f"{prefix}_{name}": f"--{name.lower()}"
    for prefix in ("APPTAINER", "SINGULARITY")
    for name in ("CONTAIN", "CONTAINALL", "CLEANENV")
}
TRUE_VALUES = frozenset({"1", "true", "yes", "on"})


def cell_apptainer_args(
    given: str,
    device_class: str,
    binds: Iterable[Path],
    environ: Mapping[str, str] = os.environ,
) -> str:
    """The apptainer-args of the cells: ``given`` (a profile's or the command line's) refused
    in one line where it isolates the cells from each other, with ``--nv`` on CUDA and a bind
    of each of ``binds`` (Snakemake binds the working directory alone, as home); raises
    :class:`ConfigError`. Applying it twice changes nothing."""
    arguments = shlex.split(given)
    for argument in arguments:
        option = argument.partition("=")[0]
        if option in ISOLATING_OPTIONS:
            raise ConfigError(_isolating(f"apptainer-args: {option}", ISOLATING_OPTIONS[option]))
    for variable, option in ISOLATING_VARIABLES.items():
        if environ.get(variable, "").lower() in TRUE_VALUES:
            raise ConfigError(_isolating(f"{variable} (= {option})", ISOLATING_OPTIONS[option]))
    if device_class == "cuda" and "--nv" not in arguments:
        arguments.append("--nv")
    bound = {arguments[i + 1] for i, a in enumerate(arguments[:-1]) if a in ("--bind", "-B")}
    for path in binds:
        if str(path) not in bound:
            arguments += ["--bind", str(path)]
            bound.add(str(path))
    return shlex.join(arguments)


def _isolating(what: str, why: str) -> str:
    return (
        f"{what} {why}: drop it (ptspeed binds the results and its sources into each cell's "
        "container itself)"
    )


def outside(workdir: Path, paths: Iterable[Path]) -> list[Path]:
    """Each of ``paths``, resolved (a link to scratch is followed), that the working directory
    does not hold: what a cell's container must bind besides it."""
    home = workdir.resolve()
    found = []
    for path in paths:
        resolved = (workdir / path).resolve()
        if resolved != home and home not in resolved.parents and resolved not in found:
            found.append(resolved)
    return found


def brought_probe_launcher(binary: str, image: str, binds: Iterable[Path]) -> list[str]:
    """``apptainer exec`` of a brought image as a cell's python starts in it (CELL_PYTHON),
    with ``binds`` (the suite's sources) visible."""
    bound = [option for path in binds for option in ("--bind", str(path))]
    return [binary, "exec", *bound, image, *shlex.split(CELL_PYTHON)]
