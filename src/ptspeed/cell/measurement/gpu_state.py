"""The GPU's state over a trial's measured window, for its
:class:`~ptspeed.cell.record_window.Conditions`: the clocks, temperature, power, throttle
reasons and other processes on it, from :mod:`ptspeed.cell.measurement.telemetry`'s NVML
sampler through the window (:func:`note_telemetry`), or from ``nvidia-smi`` at the window's two
ends where NVML cannot be opened (:func:`gpu_sample`, :func:`note_gpu`).

Standard library only; every read that fails leaves its value null and says so in
``not_readable``.
"""

from __future__ import annotations

import contextlib
import os
import subprocess
from dataclasses import dataclass, field
from typing import Any

from ptspeed.cell.measurement import telemetry
from ptspeed.cell.provenance import smi_id
from ptspeed.cell.record_window import Conditions

# nvidia-smi's throttle-reason fields: named clocks_event_reasons.* by newer drivers,
# clocks_throttle_reasons.* by older ones; a field the driver does not know fails the query.
SMI_REASON_FAMILIES = ("clocks_event_reasons.", "clocks_throttle_reasons.")
SMI_REASONS = tuple(n for n in telemetry.THROTTLE_REASONS.values() if n != "display_clock_setting")
SMI_FIELDS = ("clocks.sm", "clocks.max.sm", "temperature.gpu", "power.draw", "power.limit")
SMI_TIMEOUT_S = 10


@dataclass
class GpuSample:
    """The GPU at one moment, as nvidia-smi shows it (``source``; '' where unread)."""

    sm_clock_mhz: float | None = None
    max_sm_clock_mhz: float | None = None
    temperature_c: float | None = None
    power_w: float | None = None
    power_limit_w: float | None = None
    throttle_reasons: list[str] = field(default_factory=list)
    process_ids: list[int] | None = None
    source: str = ""


def gpu_sampler(index: int, unavailable: dict[str, None]) -> telemetry.GpuSampler | None:
    """A started sampler of torch's GPU ``index``; None, saying why, where NVML cannot open."""
    try:
        sampler = telemetry.GpuSampler(telemetry.Nvml.open(smi_id(index)))
    except telemetry.NvmlError as error:
        unavailable[f"NVML ({error}): GPU state from nvidia-smi at the window's ends"] = None
        return None
    sampler.start()
    return sampler


def gpu_sample(index: int, unavailable: dict[str, None]) -> GpuSample:
    """The GPU ``index`` at one moment, through nvidia-smi; an empty sample, saying why, where
    it cannot be read."""
    sample = _smi_sample(index, unavailable)
    if sample is None:
        unavailable["GPU state (no NVML, no nvidia-smi)"] = None
        return GpuSample()
    return sample


def note_telemetry(conditions: Conditions, gpu: telemetry.GpuTelemetry) -> None:
    """The GPU over the window's samples: clocks, power, temperature, every throttle reason
    seen in any sample, the most other processes; what could not be read, named."""
    conditions.gpu_source = "nvml"
    conditions.gpu_samples = gpu.samples
    conditions.gpu_sm_mhz_min = min(gpu.sm_clock_mhz, default=None)
    conditions.gpu_sm_mhz_median = gpu.median_sm_clock_mhz()
    conditions.gpu_sm_mhz_max = max(gpu.sm_clock_mhz, default=None)
    conditions.gpu_sm_mhz_limit = gpu.max_sm_clock_mhz
    conditions.gpu_temperature_c_max = gpu.temperature_c_max
    conditions.gpu_power_w_max = gpu.max_power_w()
    conditions.gpu_power_w_mean = gpu.mean_power_w()
    conditions.gpu_power_limit_w = gpu.power_limit_w
    conditions.gpu_throttle_reasons = ", ".join(gpu.throttle_reasons)
    conditions.gpu_other_processes = _other_processes(gpu.process_ids)
    conditions.sampler_cpu_s = gpu.sampler_cpu_s
    unreadable = [f"GPU {what} ({why})" for what, why in gpu.unreadable.items()]
    if gpu.power_w and conditions.gpu_power_w_max is None:
        unreadable.append(
            f"GPU power (a {gpu.window_s or 0:.3g} s window is shorter than NVML's "
            f"{telemetry.NVML_POWER_AVERAGE_S:g} s power average: no maximum, mean power from "
            "the window's energy alone)"
        )
    conditions.not_readable = "; ".join(filter(None, [conditions.not_readable, *unreadable]))


def _smi(gpu: str, *query: str) -> list[str] | None:
    try:
        done = subprocess.run(
            ["nvidia-smi", f"--id={gpu}", *query, "--format=csv,noheader,nounits"],
            capture_output=True,
            text=True,
            timeout=SMI_TIMEOUT_S,
            check=True,
        )
    except (OSError, subprocess.SubprocessError):
        return None
    return [line.strip() for line in done.stdout.splitlines() if line.strip()]


def _smi_sample(index: int, unavailable: dict[str, None]) -> GpuSample | None:
    """The GPU at one moment through nvidia-smi (no NVML): its throttle reasons under
    whichever name the driver knows, or none, saying so."""
    gpu = smi_id(index)
    for family in SMI_REASON_FAMILIES:
        fields = [*SMI_FIELDS, *(family + reason for reason in SMI_REASONS)]
        lines = _smi(gpu, f"--query-gpu={','.join(fields)}")
        if lines:
            break
    else:
        lines = _smi(gpu, f"--query-gpu={','.join(SMI_FIELDS)}")
        if lines:
            unavailable["GPU throttle reasons (nvidia-smi knows neither query)"] = None
    if not lines:
        return None
    values = [value.strip() for value in lines[0].split(",")]
    numbers = [_number(value) for value in values[: len(SMI_FIELDS)]]
    reasons = values[len(SMI_FIELDS) :]
    states = zip(SMI_REASONS, reasons, strict=False)
    active = [name for name, value in states if value.lower() == "active"]
    apps = _smi(gpu, "--query-compute-apps=pid")
    return GpuSample(
        *numbers,
        throttle_reasons=active,
        process_ids=[int(p) for p in apps if p.isdigit()] if apps is not None else None,
        source="nvidia-smi",
    )


def _number(text: str) -> float | None:
    with contextlib.suppress(ValueError):
        return float(text)
    return None


def note_gpu(conditions: Conditions, start: GpuSample | None, stop: GpuSample | None) -> None:
    """The GPU at the window's two ends (nvidia-smi, where NVML could not be opened)."""
    samples = [s for s in (start, stop) if s is not None and s.source]
    if not samples:
        return
    clocks = [s.sm_clock_mhz for s in samples if s.sm_clock_mhz is not None]
    conditions.gpu_source = samples[0].source
    conditions.gpu_sm_mhz_min = min(clocks, default=None)
    conditions.gpu_sm_mhz_max = max(clocks, default=None)
    conditions.gpu_sm_mhz_limit = _largest(s.max_sm_clock_mhz for s in samples)
    conditions.gpu_temperature_c_max = _largest(s.temperature_c for s in samples)
    conditions.gpu_power_w_max = _largest(s.power_w for s in samples)
    conditions.gpu_power_limit_w = _largest(s.power_limit_w for s in samples)
    reasons = dict.fromkeys(r for s in samples for r in s.throttle_reasons)
    conditions.gpu_throttle_reasons = ", ".join(reasons)
    listed = [s.process_ids for s in samples if s.process_ids is not None]
    conditions.gpu_other_processes = _other_processes(listed)


def _largest(values: Any) -> float | None:
    present = [v for v in values if v is not None]
    return max(present) if present else None


def _other_processes(listed: list[list[int]]) -> int | None:
    """The most processes on the GPU at a sample (``listed``: each sample's pids) that are not
    this cell's (its session's); where the cell itself is not among them (a PID namespace: a
    container), all but one."""
    if not listed:
        return None
    session = os.getsid(0)
    counts = []
    for pids in listed:
        ours = [pid for pid in pids if _session_of(pid) == session]
        counts.append(len(pids) - len(ours) if ours else max(0, len(pids) - 1))
    return max(counts)


def _session_of(pid: int) -> int | None:
    try:
        return os.getsid(pid)
    except OSError:
        return None
