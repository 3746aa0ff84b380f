"""A cell's memory: its peak while stepping (read and reset), memory given back between its
parts, and an out-of-memory error told apart, in any torch version and on any device."""

from __future__ import annotations

import contextlib
import gc
import resource
from pathlib import Path

import torch

KIB = 1024
Peak = tuple[int | None, str]  # bytes (None: unreadable) and what was read (memory_kind)


def reset_peak_memory(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)
        torch.cuda.reset_peak_memory_stats(device)
        return
    # Writing 5 to clear_refs resets the kernel's peak RSS (VmHWM) to the current RSS.
    with contextlib.suppress(OSError):
        Path("/proc/self/clear_refs").write_text("5", encoding="ascii")


def peak_memory(device: torch.device) -> Peak:
    if device.type == "cuda":
        return torch.cuda.max_memory_allocated(device), "cuda_allocator_peak"
    try:
        for line in Path("/proc/self/status").read_text(encoding="ascii").splitlines():
            if line.startswith("VmHWM:"):
                return int(line.split()[1]) * KIB, "process_peak_rss"
    except OSError:
        pass
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * KIB, "process_peak_rss"


def larger_peak(warmup: Peak, window: Peak) -> Peak:
    """The peak memory of the warm-up and window together, from the peak read before the first
    probe and the one read, after a reset past that probe, before the second: the probes' own
    buffers are in neither."""
    peaks = [peak for peak in (warmup[0], window[0]) if peak is not None]
    return (max(peaks) if peaks else None), window[1]


class PeakMemory:
    """The peak memory of the warm-up and the measured window together, without what runs
    between them (the machine-speed probe): :meth:`pause` reads the warm-up's peak, :meth:`resume`
    resets the count for the window, :meth:`stop` reads the window's and returns the larger."""

    def __init__(self, device: torch.device) -> None:
        self._device = device
        self._warmup: Peak = (None, "")

    def pause(self) -> None:
        self._warmup = peak_memory(self._device)

    def resume(self) -> None:
        reset_peak_memory(self._device)

    def stop(self) -> Peak:
        return larger_peak(self._warmup, peak_memory(self._device))


def release_memory(device: torch.device) -> None:
    gc.collect()
    if device.type == "cuda":
        torch.cuda.empty_cache()


def is_out_of_memory(exc: BaseException) -> bool:
    oom_type = getattr(torch.cuda, "OutOfMemoryError", None)
    if isinstance(exc, MemoryError) or (oom_type is not None and isinstance(exc, oom_type)):
        return True
    message = str(exc).lower()
    return "out of memory" in message or "can't allocate memory" in message
