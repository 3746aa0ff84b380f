"""Provenance: the software and hardware every number was made with.

:func:`collect_base` needs no torch (the watchdog uses it for records of cells that never
finished); :func:`collect` adds what only the imported torch knows.
"""

from __future__ import annotations

import importlib.metadata
import os
import platform
import socket
import subprocess
import sys
from pathlib import Path
from typing import Any

from ptspeed.cell import hostenv
from ptspeed.cell.record import Provenance

PACKAGES = ("torch", "torchvision", "transformers", "numpy", "triton", "pytorch-triton")
# Environment variables that change how the caching allocators behave.
ALLOCATOR_VARIABLES = (
    "PYTORCH_CUDA_ALLOC_CONF",
    "PYTORCH_ALLOC_CONF",
    "PYTORCH_NO_CUDA_MEMORY_CACHING",
    "PYTORCH_CUDA_ALLOC_SYNC",
)
GPU_STATE_QUERY = "clocks.sm,clocks.max.sm,power.draw,power.limit,temperature.gpu"
# Set by the workflow's container runtimes (ptspeed.envs.engine_calls): the image and its digest,
# and the commit of the mounted checkout (an image has no git to ask).
# Set by the launcher (ptspeed.launch.gpus) for a CUDA cell: the GPUs it claimed, from which pool.
ASSIGNMENT_VARIABLE = "PTSPEED_GPU_ASSIGNMENT"
CONTAINER_IMAGE_VARIABLE = "PTSPEED_CONTAINER_IMAGE"
CONTAINER_DIGEST_VARIABLE = "PTSPEED_CONTAINER_DIGEST"
GIT_COMMIT_VARIABLE = "PTSPEED_GIT_COMMIT"
CONTAINER_VARIABLES = (CONTAINER_IMAGE_VARIABLE, "APPTAINER_CONTAINER", "SINGULARITY_CONTAINER")
SOURCE_DIR = Path(__file__).resolve().parent


def collect_base() -> Provenance:
    commit, dirty = git_state()
    return Provenance(
        cpu_model=_cpu_model(),
        cpu_count=os.cpu_count() or 0,
        python=platform.python_version(),
        packages=_package_versions(),
        git_commit=commit,
        git_dirty=dirty,
        hostname=socket.gethostname(),
        slurm_job_id=os.environ.get("SLURM_JOB_ID", ""),
        slurm_partition=os.environ.get("SLURM_JOB_PARTITION", ""),
        slurm_node=os.environ.get("SLURMD_NODENAME", ""),
        container_image=_container_image(),
        container_digest=_container_digest(),
        platform=f"{platform.system()} {platform.release()} {platform.machine()}",
        os_release=os_release(),
        cuda_visible_devices=os.environ.get("CUDA_VISIBLE_DEVICES", ""),
        gpu_assignment=os.environ.get(ASSIGNMENT_VARIABLE, ""),
        allocator_settings={v: os.environ[v] for v in ALLOCATOR_VARIABLES if v in os.environ},
        cleared_host_variables=hostenv.cleared_in_this_process(),
        kept_host_variables=hostenv.kept(os.environ),
    )


def collect(torch: Any, device: Any) -> Provenance:
    provenance = collect_base()
    provenance.torch = torch.__version__
    provenance.cuda = torch.version.cuda or ""
    cudnn = torch.backends.cudnn.version() if torch.backends.cudnn.is_available() else None
    provenance.cudnn = str(cudnn) if cudnn else ""
    provenance.torch_threads = torch.get_num_threads()
    if device.type == "cuda":
        index = device.index if device.index is not None else torch.cuda.current_device()
        provenance.device_index = index
        provenance.device_name = torch.cuda.get_device_name(index)
        provenance.gpu_driver = nvidia_driver_version()
        provenance.gpu_state = _gpu_state(index)
        provenance.nccl = _nccl_version(torch)
    else:
        provenance.device_name = provenance.cpu_model
    note_backend_settings(provenance, torch, device)
    return provenance


def note_backend_settings(provenance: Provenance, torch: Any, device: Any) -> None:
    """The process-wide switches in force: TF32, cuDNN autotuning (CUDA), matmul precision."""
    provenance.float32_matmul_precision = _float32_matmul_precision(torch)
    if device.type == "cuda":
        provenance.tf32_matmul = bool(torch.backends.cuda.matmul.allow_tf32)
        provenance.tf32_cudnn = bool(torch.backends.cudnn.allow_tf32)
        provenance.cudnn_benchmark = bool(torch.backends.cudnn.benchmark)


def _float32_matmul_precision(torch: Any) -> str:
    getter = getattr(torch, "get_float32_matmul_precision", None)
    return getter() if getter is not None else ""


def smi_id(index: int) -> str:
    """nvidia-smi's name for torch's device ``index``: nvidia-smi ignores
    CUDA_VISIBLE_DEVICES, whose entries (indices or UUIDs) say which GPU torch's index is."""
    listed = os.environ.get("CUDA_VISIBLE_DEVICES", "").split(",")
    visible = [entry.strip() for entry in listed if entry.strip()]
    return visible[index] if index < len(visible) else str(index)


def _nccl_version(torch: Any) -> str:
    try:
        version = torch.cuda.nccl.version()
    except (AttributeError, RuntimeError):
        return ""
    return ".".join(map(str, version)) if isinstance(version, tuple) else str(version)


def _gpu_state(index: int) -> str:
    """Clocks, power and temperature of GPU ``index`` as nvidia-smi reports them."""
    query = f"--query-gpu={GPU_STATE_QUERY}"
    output = _run(["nvidia-smi", f"--id={smi_id(index)}", query, "--format=csv,noheader"])
    if not output:
        return ""
    values = [value.strip() for value in output.splitlines()[0].split(",")]
    names = ("sm_clock", "max_sm_clock", "power_draw", "power_limit", "temperature_c")
    return ", ".join(f"{name} {value}" for name, value in zip(names, values, strict=False))


def _cpu_model() -> str:
    try:
        for line in Path("/proc/cpuinfo").read_text(encoding="utf-8").splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


def _package_versions() -> dict[str, str]:
    versions = {}
    for name in PACKAGES:
        try:
            versions[name] = importlib.metadata.version(name)
        except importlib.metadata.PackageNotFoundError:
            continue
    return versions


def _container_image() -> str:
    for variable in CONTAINER_VARIABLES:
        if os.environ.get(variable):
            return os.environ[variable]
    return ""


def _container_digest() -> str:
    """The digest the runtime passed in, else the one a digest-pinned image name carries."""
    if os.environ.get(CONTAINER_DIGEST_VARIABLE):
        return os.environ[CONTAINER_DIGEST_VARIABLE]
    name, separator, digest = _container_image().rpartition("@")
    return digest if separator and name and digest.startswith("sha256:") else ""


def os_release(path: Path = Path("/etc/os-release")) -> str:
    """PRETTY_NAME of the operating system (of the image, in a container), '' if unknown."""
    try:
        lines = path.read_text(encoding="utf-8").splitlines()
    except OSError:
        return ""
    for line in lines:
        name, _, value = line.partition("=")
        if name == "PRETTY_NAME":
            return value.strip().strip('"')
    return ""


def _run(command: list[str], cwd: Path | None = None) -> str | None:
    try:
        done = subprocess.run(
            command, cwd=cwd, capture_output=True, text=True, timeout=10, check=True
        )
    except (OSError, subprocess.SubprocessError):
        return None
    return done.stdout.strip()


def git_state() -> tuple[str, bool | None]:
    """The suite's commit and whether the checkout has uncommitted changes (None: unknown)."""
    if os.environ.get(GIT_COMMIT_VARIABLE):
        return os.environ[GIT_COMMIT_VARIABLE], None
    commit = _run(["git", "rev-parse", "HEAD"], cwd=SOURCE_DIR)
    if not commit:
        return "", None
    status = _run(["git", "status", "--porcelain"], cwd=SOURCE_DIR)
    return commit, bool(status) if status is not None else None


def nvidia_driver_version() -> str:
    """The NVIDIA driver's version as nvidia-smi prints it, '' without one."""
    output = _run(["nvidia-smi", "--query-gpu=driver_version", "--format=csv,noheader"])
    return output.splitlines()[0].strip() if output else ""


def python_version() -> tuple[int, int]:
    return sys.version_info[:2]
