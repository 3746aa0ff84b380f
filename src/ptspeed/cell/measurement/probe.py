"""The machine's own speed beside each trial: a fixed, small workload just outside the window.

A cell runs :func:`measure` just before its measured window and again just after it (never
inside: the timed loop runs nothing of this), and :func:`note` writes both into the record's
conditions. The work is the same in every cell, every torch version and every run:

* a fixed GEMM on the CPU (:data:`CPU_GEMM_SIZE` square fp32 matrices, :data:`CPU_GEMM_REPEATS`
  products, on the cell's torch threads);
* a memory pass on the CPU (:data:`MEMORY_BYTES` copied :data:`MEMORY_REPEATS` times, beyond
  the L2 caches of common CPUs);
* on CUDA, a fixed GEMM on the cell's GPU (:data:`GPU_GEMM_SIZE` square fp16 matrices,
  :data:`GPU_GEMM_REPEATS` products, timed with CUDA events) and the GPU's SM clock just after
  it (NVML).

Each figure is the wall time of the whole fixed work (seconds; lower is faster), one untimed
repetition first so that allocation and first-call costs stay out. The whole work, not its
fastest repetition, is timed on purpose: a machine that time-slices the cell with another guest
or process gives every repetition a share of the loss, and only the total sees it. The
precision is the probe's own (fp32 on the CPU, fp16 on the GPU), whatever the variant switched
on (TF32, autocast), so that every variant's probe does the same work.

The spread of a run's probes says what the machine did from trial to trial
(:mod:`ptspeed.analysis.conditions` judges a trial far from the run's median perturbed), and
their shift between two runs what the machine did between them
(:mod:`ptspeed.analysis.compare`). Measured on the 2-core development VM: about 25 ms of CPU
work per end with 1 thread, 40 ms with 2 (see config/README.md). In a distributed cell only
the reporting process (rank 0) probes, so that ranks sharing a node do not probe one another.
Standard library and torch only.
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from typing import Any

import torch

from ptspeed.cell.measurement import telemetry
from ptspeed.cell.provenance import smi_id
from ptspeed.cell.record import Conditions

CPU_GEMM_SIZE = 256
CPU_GEMM_REPEATS = 96
MEMORY_BYTES = 16 * 1024 * 1024
MEMORY_REPEATS = 16
GPU_GEMM_SIZE = 4096
GPU_GEMM_REPEATS = 20
BYTES_PER_FLOAT32 = 4
WORK = (
    f"CPU: {CPU_GEMM_REPEATS} x fp32 GEMM {CPU_GEMM_SIZE}^2, {MEMORY_REPEATS} x copy of "
    f"{MEMORY_BYTES // 2**20} MiB; CUDA: {GPU_GEMM_REPEATS} x fp16 GEMM {GPU_GEMM_SIZE}^2"
)


@dataclass(frozen=True)
class ProbeTimes:
    """One end's probe: seconds of each fixed work (None: not run), the GPU's clock after it."""

    cpu_gemm_s: float
    cpu_memory_s: float
    gpu_gemm_s: float | None = None
    gpu_sm_mhz: float | None = None
    cost_s: float = 0.0
    threads: int = 0


def measure(device: Any) -> ProbeTimes:
    """Run the fixed work once on the CPU and, on a CUDA ``device``, on its GPU."""
    begun = time.perf_counter()
    with torch.no_grad():
        gemm_s = _cpu_gemm()
        memory_s = _memory_pass()
        gpu_s, clock = (None, None)
        if getattr(device, "type", "") == "cuda":
            gpu_s, clock = _gpu_gemm(device)
    return ProbeTimes(
        cpu_gemm_s=gemm_s,
        cpu_memory_s=memory_s,
        gpu_gemm_s=gpu_s,
        gpu_sm_mhz=clock,
        cost_s=time.perf_counter() - begun,
        threads=torch.get_num_threads(),
    )


def note(conditions: Conditions, before: ProbeTimes | None, after: ProbeTimes | None) -> None:
    """Write both ends' probes into ``conditions`` (a process that did not probe: nothing)."""
    if before is None or after is None:
        return
    conditions.probe_cpu_gemm_s_before = before.cpu_gemm_s
    conditions.probe_cpu_gemm_s_after = after.cpu_gemm_s
    conditions.probe_cpu_memory_s_before = before.cpu_memory_s
    conditions.probe_cpu_memory_s_after = after.cpu_memory_s
    conditions.probe_gpu_gemm_s_before = before.gpu_gemm_s
    conditions.probe_gpu_gemm_s_after = after.gpu_gemm_s
    conditions.probe_gpu_sm_mhz_before = before.gpu_sm_mhz
    conditions.probe_gpu_sm_mhz_after = after.gpu_sm_mhz
    conditions.probe_threads = before.threads
    conditions.probe_cost_s = before.cost_s + after.cost_s
    conditions.probe_work = WORK


def larger_peak(
    warmup: tuple[int | None, str], window: tuple[int | None, str]
) -> tuple[int | None, str]:
    """The peak memory of the warm-up and window together, from the peak read before the first
    probe and the one read, after a reset past that probe, before the second: the probes' own
    buffers are in neither."""
    peaks = [peak for peak in (warmup[0], window[0]) if peak is not None]
    return (max(peaks) if peaks else None), window[1]


def _cpu_gemm() -> float:
    generator = torch.Generator().manual_seed(0)
    a = torch.rand(CPU_GEMM_SIZE, CPU_GEMM_SIZE, generator=generator)
    b = torch.rand(CPU_GEMM_SIZE, CPU_GEMM_SIZE, generator=generator)
    out = torch.empty(CPU_GEMM_SIZE, CPU_GEMM_SIZE)
    torch.mm(a, b, out=out)  # untimed: first-call costs
    begun = time.perf_counter()
    for _ in range(CPU_GEMM_REPEATS):
        torch.mm(a, b, out=out)
    return time.perf_counter() - begun


def _memory_pass() -> float:
    source = torch.ones(MEMORY_BYTES // BYTES_PER_FLOAT32)
    target = torch.empty_like(source)
    target.copy_(source)  # untimed: the pages are touched once
    begun = time.perf_counter()
    for _ in range(MEMORY_REPEATS):
        target.copy_(source)
    return time.perf_counter() - begun


def _gpu_gemm(device: Any) -> tuple[float, float | None]:
    size = (GPU_GEMM_SIZE, GPU_GEMM_SIZE)
    generator = torch.Generator(device=device).manual_seed(0)
    a = torch.rand(size, device=device, dtype=torch.float16, generator=generator)
    b = torch.rand(size, device=device, dtype=torch.float16, generator=generator)
    out = torch.empty(size, device=device, dtype=torch.float16)
    torch.mm(a, b, out=out)  # untimed: cuBLAS's handle and workspace
    start = torch.cuda.Event(enable_timing=True)
    stop = torch.cuda.Event(enable_timing=True)
    torch.cuda.synchronize(device)
    start.record()
    for _ in range(GPU_GEMM_REPEATS):
        torch.mm(a, b, out=out)
    stop.record()
    stop.synchronize()
    clock = _sm_clock_mhz(device.index if device.index is not None else 0)
    del a, b, out
    return start.elapsed_time(stop) / 1000.0, clock


def _sm_clock_mhz(index: int) -> float | None:
    """The GPU's SM clock just after the GEMM (NVML); None where NVML cannot be opened."""
    try:
        return telemetry.Nvml.open(smi_id(index)).sm_clock_mhz()
    except telemetry.NvmlError:
        return None
