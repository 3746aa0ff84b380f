"""The machine's own speed beside each trial: a fixed, small workload just outside the window.

A cell runs :func:`measure` just before its measured window and again just after it (never
inside: the timed loop runs nothing of this), and :func:`note` writes both into the record's
conditions. The work is the same in every cell, every torch version and every run:

* a GEMM on the CPU: a repetition is :data:`CPU_GEMMS` products of :data:`CPU_GEMM_SIZE`
  square fp32 matrices, on the cell's torch threads;
* a memory pass on the CPU: a repetition copies :data:`MEMORY_BYTES` :data:`MEMORY_COPIES`
  times (beyond the L2 caches of common CPUs, within their L3: a pass of twice the buffer,
  which straddles no cache's size on the CPUs the suite runs on);
* on CUDA, a GEMM on the cell's GPU: a repetition is :data:`GPU_GEMMS` products of
  :data:`GPU_GEMM_SIZE` square fp16 matrices (about 6 ms on an H200 at 700 TFLOP/s, 30 ms
  for the timed repetitions), timed with CUDA events, after the GPU has run the same
  repetitions for at least :data:`GPU_WARMUP_S` and until two in a row agree within
  :data:`GPU_SETTLED` (past the clocks' ramp from idle: a 4 ms probe from idle, as before
  issue 36, timed the ramp), and the GPU's SM clock just after it (NVML).

The constants are :mod:`ptspeed.cell.measurement.probe_work`'s (torch-free, for the report).

Each work is repeated: one untimed repetition first (allocation, first-call costs, the pages
touched), then :data:`REPETITIONS` timed ones, and each figure is the **median** repetition's
wall time (seconds; lower is faster). The median of short repetitions, not one long run: a
hiccup of the scheduler or a one-off page fault moves one repetition and not the median, while
a machine that is slower throughout (lower clocks, another guest or process time-slicing the
cell's CPUs) slows every repetition and so the median. The precision is the probe's own (fp32
on the CPU, fp16 on the GPU), whatever the variant switched on (TF32, autocast), so that every
variant's probe does the same work.

The work is fixed; what runs it is not: a probe times the BLAS and copy loops of the build that
runs it (on an AMD EPYC VM, torch 1.13's GEMM took 3.7 times torch 2.0's, issue 36), so
:func:`note` writes the build (torch version, BLAS) beside the work in ``probe_work``, and
probes are only ever compared with probes of the same environment and build
(:func:`ptspeed.analysis.trial_readings.probe_group`). The spread of a run's like probes says
what the machine did from trial to trial (:mod:`ptspeed.analysis.conditions` judges a trial whose
probe is far from its like probes' median perturbed), and their shift between two runs what the
machine did between them (:mod:`ptspeed.analysis.compare`). See
:data:`ptspeed.analysis.conditions.PROBE_SPREAD` for what the probe measured on a quiet
machine. In a distributed cell only the reporting process (rank 0) probes, so that ranks
sharing a node do not probe one another. Standard library and torch only.
"""

from __future__ import annotations

import re
import statistics
import time
from collections.abc import Callable
from dataclasses import dataclass
from functools import lru_cache
from typing import Any

import torch

from ptspeed.cell.measurement import telemetry
from ptspeed.cell.measurement.probe_work import (
    BYTES_PER_FLOAT32,
    CPU_GEMM_SIZE,
    CPU_GEMMS,
    GPU_GEMM_SIZE,
    GPU_GEMMS,
    GPU_SETTLED,
    GPU_WARMUP_MAX_S,
    GPU_WARMUP_S,
    MEMORY_BYTES,
    MEMORY_COPIES,
    REPETITIONS,
    WORK,
)
from ptspeed.cell.provenance import smi_id
from ptspeed.cell.record_window import Conditions


@dataclass(frozen=True)
class ProbeTimes:
    """One end's probe: the median repetition's seconds of each work (None: not run), the
    GPU's clock after it, what the whole end cost and the threads it ran on."""

    cpu_gemm_s: float
    cpu_memory_s: float
    gpu_gemm_s: float | None = None
    gpu_sm_mhz: float | None = None
    cost_s: float = 0.0
    threads: int = 0


def measure(device: Any) -> ProbeTimes:
    """Run the fixed work on the CPU and, on a CUDA ``device``, on its GPU."""
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
    conditions.probe_work = f"{WORK}; {build()}"


class WindowProbe:
    """The probe just before a measured window (:meth:`start`) and just after it (:meth:`stop`),
    run where ``runs`` (the reporting process), and :meth:`note` to write both."""

    def __init__(self, device: Any, runs: bool) -> None:
        self._device = device
        self._runs = runs
        self._before: ProbeTimes | None = None
        self._after: ProbeTimes | None = None

    def start(self) -> None:
        self._before = measure(self._device) if self._runs else None

    def stop(self) -> None:
        self._after = measure(self._device) if self._runs else None

    def note(self, conditions: Conditions) -> None:
        note(conditions, self._before, self._after)


@lru_cache(maxsize=1)
def build() -> str:
    """What runs the probe's work: ``"torch 2.0.1+cpu, BLAS mkl"`` (the BLAS as the build
    states it, ``unknown`` where it does not)."""
    found = re.search(r"BLAS_INFO=(\w+)", torch.__config__.show())
    return f"torch {torch.__version__}, BLAS {found[1] if found else 'unknown'}"


def median_repetition(repetition: Callable[[], float], repetitions: int = REPETITIONS) -> float:
    """The median of ``repetitions`` timed runs of ``repetition`` (each returns its seconds),
    after one untimed run."""
    repetition()
    return statistics.median(repetition() for _ in range(repetitions))


def _timed(work: Callable[[], Any]) -> Callable[[], float]:
    def repetition() -> float:
        begun = time.perf_counter()
        work()
        return time.perf_counter() - begun

    return repetition


def _cpu_gemm() -> float:
    generator = torch.Generator().manual_seed(0)
    a = torch.rand(CPU_GEMM_SIZE, CPU_GEMM_SIZE, generator=generator)
    b = torch.rand(CPU_GEMM_SIZE, CPU_GEMM_SIZE, generator=generator)
    out = torch.empty(CPU_GEMM_SIZE, CPU_GEMM_SIZE)

    def gemms() -> None:
        for _ in range(CPU_GEMMS):
            torch.mm(a, b, out=out)

    return median_repetition(_timed(gemms))


def _memory_pass() -> float:
    source = torch.ones(MEMORY_BYTES // BYTES_PER_FLOAT32)
    target = torch.empty_like(source)

    def copies() -> None:
        for _ in range(MEMORY_COPIES):
            target.copy_(source)

    return median_repetition(_timed(copies))


def _gpu_gemm(device: Any) -> tuple[float, float | None]:
    size = (GPU_GEMM_SIZE, GPU_GEMM_SIZE)
    generator = torch.Generator(device=device).manual_seed(0)
    a = torch.rand(size, device=device, dtype=torch.float16, generator=generator)
    b = torch.rand(size, device=device, dtype=torch.float16, generator=generator)
    out = torch.empty(size, device=device, dtype=torch.float16)
    start = torch.cuda.Event(enable_timing=True)
    stop = torch.cuda.Event(enable_timing=True)

    def repetition() -> float:
        start.record()
        for _ in range(GPU_GEMMS):
            torch.mm(a, b, out=out)
        stop.record()
        stop.synchronize()
        return start.elapsed_time(stop) / 1000.0

    # Warm-up (cuBLAS's handle and workspace, then the clocks' ramp from idle): the same
    # repetitions, untimed, for GPU_WARMUP_S at least and until two in a row agree.
    torch.cuda.synchronize(device)
    warm_up_gpu(repetition, time.perf_counter)
    seconds = statistics.median(repetition() for _ in range(REPETITIONS))
    clock = _sm_clock_mhz(device.index if device.index is not None else 0)
    return seconds, clock  # the buffers go with the closure


def warm_up_gpu(repetition: Callable[[], float], clock: Callable[[], float]) -> int:
    """Run ``repetition`` (it returns its seconds) for :data:`GPU_WARMUP_S` of ``clock`` at
    least, then until two in a row agree within :data:`GPU_SETTLED`, for
    :data:`GPU_WARMUP_MAX_S` at most; return how many ran."""
    begun = clock()
    last, runs = repetition(), 1
    while clock() - begun < GPU_WARMUP_MAX_S:
        seconds = repetition()
        runs += 1
        settled = abs(seconds - last) <= GPU_SETTLED * max(seconds, last)
        if settled and clock() - begun >= GPU_WARMUP_S:
            break
        last = seconds
    return runs


def _sm_clock_mhz(index: int) -> float | None:
    """The GPU's SM clock just after the GEMM (NVML); None where NVML cannot be opened."""
    try:
        return telemetry.Nvml.open(smi_id(index)).sm_clock_mhz()
    except telemetry.NvmlError:
        return None
