"""The device a cell runs on: which one, the process-wide switches of its variant (TF32, cuDNN
autotuning, memory fraction, the compiler's cache), starting its libraries before the first
timed step."""

from __future__ import annotations

import os
import re
import shutil
from pathlib import Path

import torch

from ptspeed.cell.record import CellSpec
from ptspeed.cell.variants.knobs import Knobs
from ptspeed.errors import Unsupported

INDUCTOR_CACHE_VARIABLE = "TORCHINDUCTOR_CACHE_DIR"
# Present where the NVIDIA kernel driver is loaded (and in a container that shares /proc).
NVIDIA_DRIVER = Path("/proc/driver/nvidia/version")


def apply_backend_settings(knobs: Knobs, device: torch.device) -> None:
    """The knobs that are process-wide switches: TF32, cuDNN autotuning, the memory fraction."""
    if knobs.tf32 is not None:
        torch.backends.cuda.matmul.allow_tf32 = knobs.tf32
        torch.backends.cudnn.allow_tf32 = knobs.tf32
    if knobs.cudnn_benchmark is not None:
        torch.backends.cudnn.benchmark = knobs.cudnn_benchmark
    if knobs.memory_fraction is not None:
        torch.cuda.set_per_process_memory_fraction(knobs.memory_fraction, device)


def use_compiler_cache(spec: CellSpec, knobs: Knobs) -> str:
    """Point inductor's cache at the cell's own directory; 'cold' or 'warm' as it starts."""
    if not spec.compiler_cache or knobs.compile_mode is None:
        return ""
    directory = Path(spec.compiler_cache)
    if spec.compiler_cache_cold and directory.exists():
        shutil.rmtree(directory)
    directory.mkdir(parents=True, exist_ok=True)
    os.environ[INDUCTOR_CACHE_VARIABLE] = str(directory.resolve())
    return "warm" if any(directory.iterdir()) else "cold"


def prepare_device(device: torch.device) -> None:
    """Start the device and its libraries the same way in every torch version before the first
    timed step (CUDA context, cuBLAS, cuDNN, autograd), so that no version's first step pays for
    them alone."""
    weights = torch.randn(64, 64, device=device, requires_grad=True)
    (weights @ weights).sum().backward()
    images = torch.randn(1, 3, 16, 16, device=device, requires_grad=True)
    filters = torch.randn(4, 3, 3, 3, device=device)
    torch.nn.functional.conv2d(images, filters).sum().backward()
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def resolve_device(requested: str) -> torch.device:
    """The device to run on, with its index: APIs such as set_per_process_memory_fraction
    refuse a CUDA device without one."""
    if requested == "auto":
        requested = "cuda" if torch.cuda.is_available() else "cpu"
    if requested.startswith("cuda") and not torch.cuda.is_available():
        raise _why_no_cuda()
    device = torch.device(requested)
    if device.type != "cuda":
        return device
    if device.index is None:
        device = torch.device("cuda", torch.cuda.current_device())
    # The current device is where CUDA events, streams, graph captures and new tensors without
    # a device go: cuda:N must be it, or per-step times are read on device 0's idle stream.
    torch.cuda.set_device(device)
    return device


def _why_no_cuda() -> Exception:
    """Unsupported where the node has no NVIDIA driver (or torch no CUDA); where it has one that
    this torch's CUDA cannot use (a wheel built for a newer CUDA than the driver), a failure
    naming both: that is the environment's fault, not the variant's."""
    if torch.version.cuda is None:
        return Unsupported(f"device cuda requested but torch {torch.__version__} has no CUDA")
    if not NVIDIA_DRIVER.exists():
        return Unsupported("device cuda requested but torch sees no CUDA device")
    try:
        torch.cuda.init()
        why = "torch.cuda.is_available() is False"
    except Exception as error:  # the driver's own words: "too old (found version 12020)" …
        why = " ".join(str(error).split())
    return RuntimeError(
        f"torch {torch.__version__} (built for CUDA {torch.version.cuda}) cannot use this "
        f"node's NVIDIA driver {_driver_version()}: {why}"
    )


def _driver_version() -> str:
    """The kernel driver's version, as /proc/driver/nvidia/version names it."""
    try:
        text = NVIDIA_DRIVER.read_text(encoding="utf-8", errors="replace")
    except OSError:
        return "(version unreadable)"
    found = re.search(r"Kernel Module\s+(\S+)", text)
    return found.group(1) if found else "(version unknown)"


def torch_version() -> tuple[int, int]:
    major, minor = torch.__version__.split(".")[:2]
    return int(major), int("".join(ch for ch in minor if ch.isdigit()) or 0)
