"""The environment a cell's worker starts with: what of the caller's environment would change
the measurement is cleared and named in the record, and inside an Apptainer container with the
driver bound by ``--nv`` the driver's libcuda is made linkable for Triton.

The caller's environment reaches the cell whole: a venv inherits it, and Apptainer forwards
everything but HOME, PATH and LD_LIBRARY_PATH. A compiler module's ``CC``/``CXX`` (inductor and
Triton compile with them), ``TORCHINDUCTOR_*``, ``TORCHDYNAMO_*``, ``TRITON_*``,
``CUDA_LAUNCH_BLOCKING``, ``NVIDIA_TF32_OVERRIDE`` or ``LD_PRELOAD`` set on a login node
silently change what a cell measures or break its compilation, so the worker starts without
them. ``NCCL_*`` is a site's fabric setting that a job may need: kept, and named in the record.
Inside an Apptainer image, a name the image's own environment sets (its Docker ``ENV``, a
definition file's ``%environment``: ``/.singularity.d/env/*.sh``) has the image's value, which
wins over the caller's: it is how the image finds its tools (``TRITON_PTXAS_PATH``, ``CC``,
``LIBRARY_PATH`` for libcuda), part of the environment as built, and is kept.

Standard library only: the watchdog (``ptspeed.launch``) calls it before torch is imported.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import tempfile
from collections.abc import Mapping
from pathlib import Path

CLEARED_NAMES = frozenset({
    "CC", "CXX", "CFLAGS", "CXXFLAGS", "CPPFLAGS", "LDFLAGS", "LIBRARY_PATH", "LD_PRELOAD",
    "CUDA_LAUNCH_BLOCKING", "NVIDIA_TF32_OVERRIDE", "TORCH_ALLOW_TF32_CUBLAS_OVERRIDE",
    "CUBLAS_WORKSPACE_CONFIG", "CUDA_CACHE_DISABLE", "PYTORCH_JIT", "TORCH_LOGS",
})  # fmt: skip
CLEARED_PREFIXES = ("TORCHINDUCTOR_", "TORCHDYNAMO_", "TORCH_COMPILE_", "TRITON_")
KEPT_PREFIXES = ("NCCL_",)
# How the watchdog tells its worker (whose environment no longer has them) what it cleared.
CLEARED_VARIABLE = "PTSPEED_CLEARED_VARIABLES"
# Where Apptainer keeps the image's environment scripts, sourced at every start.
APPTAINER_ENV_SCRIPTS = Path("/.singularity.d/env")
_EXPORTED = re.compile(r"^\s*(?:export\s+)?([A-Za-z_][A-Za-z0-9_]*)=", re.MULTILINE)
# Where `apptainer exec --nv` binds the driver's libraries (and puts them on LD_LIBRARY_PATH
# only: they are not in the container's ld cache).
APPTAINER_DRIVER_LIBS = Path("/.singularity.d/libs")


def cleared(
    environ: Mapping[str, str], image_scripts: Path = APPTAINER_ENV_SCRIPTS
) -> dict[str, str]:
    """The variables of ``environ`` that the worker starts without, with their values (the
    names an Apptainer image's own environment sets are its, and stay)."""
    image_names = image_variables(image_scripts)
    return {
        name: value
        for name, value in environ.items()
        if (name in CLEARED_NAMES or name.startswith(CLEARED_PREFIXES)) and name not in image_names
    }


def image_variables(scripts: Path = APPTAINER_ENV_SCRIPTS) -> frozenset[str]:
    """The names the image's environment scripts assign ({} outside an Apptainer image)."""
    if not scripts.is_dir():
        return frozenset()
    names: set[str] = set()
    for script in sorted(scripts.glob("*.sh")):
        try:
            names.update(_EXPORTED.findall(script.read_text(errors="replace")))
        except OSError:
            continue
    return frozenset(names)


def kept(environ: Mapping[str, str]) -> dict[str, str]:
    """The site's variables that change what is measured but are kept (NCCL's)."""
    return {name: value for name, value in environ.items() if name.startswith(KEPT_PREFIXES)}


def worker_environment(
    environ: Mapping[str, str],
    driver_libs: Path = APPTAINER_DRIVER_LIBS,
    image_scripts: Path = APPTAINER_ENV_SCRIPTS,
) -> dict[str, str]:
    """``environ`` without what :func:`cleared` names (listed in ``CLEARED_VARIABLE``), with
    what Triton needs to link against the driver bound into an Apptainer container."""
    removed = cleared(environ, image_scripts)
    worker = {name: value for name, value in environ.items() if name not in removed}
    worker[CLEARED_VARIABLE] = json.dumps(removed, sort_keys=True)
    worker.update(triton_libcuda(driver_libs))
    return worker


def cleared_in_this_process() -> dict[str, str]:
    """What the watchdog cleared for this worker; in the watchdog itself, what it clears."""
    if CLEARED_VARIABLE in os.environ:
        return dict(json.loads(os.environ[CLEARED_VARIABLE]))
    return cleared(os.environ)


def triton_libcuda(
    driver_libs: Path = APPTAINER_DRIVER_LIBS, link_dir: Path | None = None
) -> dict[str, str]:
    """Variables that let Triton link ``-lcuda`` against the driver Apptainer bound into
    ``driver_libs``; {} elsewhere. Triton 2.0 (torch 2.0) looks for libcuda with ``whereis``,
    which never searches there, and links with ``-lcuda``, which needs an unversioned
    ``libcuda.so`` in a directory on ``LIBRARY_PATH``; Triton 2.1 and later read
    ``TRITON_LIBCUDA_PATH``. ``--nv`` may bind ``libcuda.so.1`` alone, so the unversioned name
    is a link in ``link_dir`` (this user's, in the node's temporary directory)."""
    found = sorted(driver_libs.glob("libcuda.so*")) if driver_libs.is_dir() else []
    if not found:
        return {}
    directory = link_dir or Path(tempfile.gettempdir()) / f"ptspeed-libcuda-{os.getuid()}"
    directory.mkdir(parents=True, exist_ok=True)
    partial = directory / f".libcuda.so.{os.getpid()}"
    partial.unlink(missing_ok=True)
    partial.symlink_to(found[0])
    partial.replace(directory / "libcuda.so")  # atomic: cells starting together agree
    return {"LIBRARY_PATH": str(directory), "TRITON_LIBCUDA_PATH": str(directory)}


def link_against_libcuda(directory: Path, environ: Mapping[str, str]) -> str:
    """Link a shared object with ``-lcuda`` as Triton 2.0 builds its launcher (the system's C
    compiler, no -L of its own: ``whereis`` finds nothing in a container), in ``directory``
    and under ``environ``; '' when it links, else the compiler's complaint."""
    compiler = shutil.which("gcc") or shutil.which("cc") or shutil.which("clang")
    if compiler is None:
        return "no C compiler (gcc, cc or clang) on PATH"
    source = directory / "launcher.c"
    source.write_text("int cuInit(unsigned int); int launch(void) { return cuInit(0); }\n")
    command = [compiler, str(source), "-shared", "-fPIC", "-lcuda", "-o", str(directory / "l.so")]
    done = subprocess.run(command, env=dict(environ), capture_output=True, text=True, check=False)
    return "" if done.returncode == 0 else (done.stderr.strip() or f"exit {done.returncode}")
