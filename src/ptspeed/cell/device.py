"""The device a cell runs on: which one, the process-wide switches of its variant (TF32, cuDNN
autotuning, memory fraction, the compiler's cache), starting its libraries before the first
timed step, and its peak memory."""

from __future__ import annotations

import contextlib
import os
import resource
import shutil
from pathlib import Path

import torch

from ptspeed.cell.knobs import Knobs
from ptspeed.cell.record import CellSpec
from ptspeed.errors import Unsupported

INDUCTOR_CACHE_VARIABLE = "TORCHINDUCTOR_CACHE_DIR"
KIB = 1024


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
        raise Unsupported("device cuda requested but torch sees no CUDA device")
    device = torch.device(requested)
    if device.type != "cuda":
        return device
    if device.index is None:
        device = torch.device("cuda", torch.cuda.current_device())
    # The current device is where CUDA events, streams, graph captures and new tensors without
    # a device go: cuda:N must be it, or per-step times are read on device 0's idle stream.
    torch.cuda.set_device(device)
    return device


def torch_version() -> tuple[int, int]:
    major, minor = torch.__version__.split(".")[:2]
    return int(major), int("".join(ch for ch in minor if ch.isdigit()) or 0)


def reset_peak_memory(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)
        torch.cuda.reset_peak_memory_stats(device)
        return
    # Writing 5 to clear_refs resets the kernel's peak RSS (VmHWM) to the current RSS.
    with contextlib.suppress(OSError):
        Path("/proc/self/clear_refs").write_text("5", encoding="ascii")


def peak_memory(device: torch.device) -> tuple[int | None, str]:
    if device.type == "cuda":
        return torch.cuda.max_memory_allocated(device), "cuda_allocator_peak"
    try:
        for line in Path("/proc/self/status").read_text(encoding="ascii").splitlines():
            if line.startswith("VmHWM:"):
                return int(line.split()[1]) * KIB, "process_peak_rss"
    except OSError:
        pass
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * KIB, "process_peak_rss"
