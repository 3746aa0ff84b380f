"""The GPU code of an environment, known on the host: what its realised build recorded, else
what the published build its lock pins carries (:func:`ptspeed.cell.gpu_code.published_code`).

``workflow/scripts/build_env.py`` writes ``<results>/envs/<env>.json`` when it realises a venv: its
interpreter and the code of its torch (:func:`probe_code`, one subprocess in the venv).
Standard library only: this runs in the orchestrating interpreter, which has no torch.
"""

from __future__ import annotations

import json
import os
import subprocess
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from ptspeed.cell.gpu_code import GpuCode, published_code
from ptspeed.envs.locks import locked_version
from ptspeed.errors import BadInput, EnvBuildError
from ptspeed.plan.settings import Settings

# The CUDA build that ``pip install torch==X`` gets from PyPI on Linux x86_64, by version.
PYPI_CUDA_TAGS = {"1.13.1": "cu117", "2.0.1": "cu117", "2.14.1": "cu130"}
GPU_CODE_KEY = "gpu_code"
PROBE_TIMEOUT_S = 300
SRC = Path(__file__).resolve().parents[2]  # the directory holding ptspeed/

# The oldest Python ptspeed's cells run on (pyproject.toml's requires-python).
CELL_MIN_PYTHON = (3, 10)
# Run by the environment's python: the cell side's own reading of its torch. Its first lines
# run on any Python 3, so that an image's older Python is named rather than a syntax error.
_PROBE = f"""\
import json, sys
if sys.version_info < {CELL_MIN_PYTHON}:
    sys.exit("its Python is %d.%d; ptspeed's cells need Python >= %d.%d"
             % (sys.version_info[:2] + {CELL_MIN_PYTHON}))
sys.path.insert(0, sys.argv[1])
import torch
from ptspeed.cell.gpu_code import GpuCode
print(json.dumps(GpuCode.from_torch(torch).to_json()))
"""


def environment_record_path(results_dir: str | os.PathLike[str], env: str) -> str:
    """Where build_env writes what it realised of ``env``: ``<results_dir>/envs/<env>.json``,
    spelt as given (not normalised: Snakemake matches a cell's input to rule build_env's output
    as text, and ``results: results/`` is spelt so there too)."""
    return f"{os.fspath(results_dir)}/envs/{env}.json"


def environment_code(
    results_dir: str | os.PathLike[str], env: str, requirements_lock_path: str | os.PathLike[str]
) -> GpuCode | None:
    """The GPU code of environment ``env``: recorded when it was realised, else that of the
    published torch its lock pins; None when neither is known."""
    recorded = recorded_code(environment_record_path(results_dir, env))
    if recorded is not None:
        return recorded
    pinned = pinned_torch(requirements_lock_path)
    return published_code(pinned) if pinned else None


def recorded_code(path: str | os.PathLike[str]) -> GpuCode | None:
    """The code in an environment record; None where there is no record, or one written
    before records held code (a bare interpreter path)."""
    try:
        data = json.loads(Path(path).read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None
    if not isinstance(data, dict) or data.get(GPU_CODE_KEY) is None:
        return None
    try:
        return GpuCode.from_json(data[GPU_CODE_KEY])
    except BadInput as error:
        raise BadInput(f"{path}: {error}") from None


def pinned_torch(requirements_lock_path: str | os.PathLike[str]) -> str | None:
    """The torch build a lock pins, with its local tag: '2.0.1+cu118' as pinned (by version or
    by a wheel's URL: :func:`ptspeed.envs.locks.locked_version`), a bare version as PyPI builds
    it (:data:`PYPI_CUDA_TAGS`); None when the lock pins no torch."""
    text = Path(requirements_lock_path).read_text(encoding="utf-8")
    version = locked_version(text, "torch")
    if version is None or "+" in version or version not in PYPI_CUDA_TAGS:
        return version
    return f"{version}+{PYPI_CUDA_TAGS[version]}"


def probe_code(
    python: str | os.PathLike[str], launcher: Sequence[str] = (), image: str = ""
) -> GpuCode:
    """The code of the torch that ``python`` imports (one subprocess, no GPU needed), started
    by ``launcher`` where given (``apptainer exec`` of ``image``: the python of an image)."""
    where = f" in {image}" if image else ""
    what = f"reading the GPU code of the torch of {python}{where}"
    environment = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "PYTHONHOME")}
    try:
        done = subprocess.run(
            [*launcher, os.fspath(python), "-c", _PROBE, str(SRC)],
            capture_output=True, text=True, timeout=PROBE_TIMEOUT_S, env=environment, check=False,
        )  # fmt: skip
    except (OSError, subprocess.TimeoutExpired) as error:
        raise EnvBuildError(f"{what} failed: {error}") from error
    lines = done.stdout.strip().splitlines()
    if done.returncode != 0 or not lines:
        last = (done.stderr.strip().splitlines() or ["no output"])[-1]
        raise EnvBuildError(f"{what} failed (exit {done.returncode}): {last}")
    try:
        return GpuCode.from_json(json.loads(lines[-1]))
    except ValueError as error:  # not JSON, or BadInput
        raise EnvBuildError(f"{what}: {error}") from error


def environment_record(python: str | os.PathLike[str], code: GpuCode) -> dict[str, Any]:
    """What build_env writes to ``<results>/envs/<env>.json``."""
    return {"python": os.fspath(python), GPU_CODE_KEY: code.to_json()}


def environment_codes(
    settings: Settings, workdir: str | os.PathLike[str]
) -> dict[str, GpuCode | None]:
    """:func:`environment_code` of every configured environment (relative paths under
    ``workdir``): what the planner knows of each before any cell runs (of an environment
    without a lock, an image a site brings, what its record says once it is read)."""
    results = Path(workdir) / settings.results
    codes = {}
    for env, spec in settings.environments.items():
        lock = spec.requirements
        if lock:
            codes[env] = environment_code(results, env, Path(workdir) / lock)
        else:
            codes[env] = recorded_code(environment_record_path(results, env))
    return codes
