"""The conditions a trial's measured window ran under: what else used the node, its clocks.

:func:`begin` samples the node just before the measured window and :meth:`Window.end` just
after it (never inside: the timed loop runs nothing of this), and the two samples make a
:class:`~ptspeed.cell.record.Conditions`: the CPU time other processes took on the cell's CPUs
(``/proc/stat``'s non-idle time of those CPUs minus the CPU time of the cell's own processes:
every process of the cell's session, which the watchdog starts for the worker, so torch's
intra-op threads, DataLoader workers, compile workers and torchrun's ranks all count as the
cell's), the load average, the CPU frequency governor and clock range (``cpufreq``; absent in
most VMs and containers: null), whether the cell was pinned, and on CUDA the GPU's clocks,
temperature, power, throttle reasons and other processes on it (NVML through ``pynvml``
where importable, else ``nvidia-smi``). Whether that makes the trial perturbed is judged on
the host (:mod:`ptspeed.analysis.conditions`), so a changed threshold re-judges old records.

Standard library only (``pynvml`` optional); every read that fails leaves its value null and
says so in ``not_readable``.
"""

from __future__ import annotations

import contextlib
import os
import subprocess
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from ptspeed.cell.provenance import smi_id
from ptspeed.cell.record import Conditions

PROC = Path("/proc")
CPUFREQ = "/sys/devices/system/cpu/cpu{}/cpufreq/{}"
KHZ_PER_MHZ = 1000.0
MILLIWATTS_PER_WATT = 1000.0
# /proc/stat's columns after the CPU name: user nice system idle iowait irq softirq steal
# (guest and guest_nice are already inside user and nice).
_IDLE_COLUMNS = (3, 4)
_STEAL_COLUMN = 7
_STAT_COLUMNS = 8
# /proc/PID/stat after the command's closing parenthesis: state is field 3, session 6,
# utime 14, stime 15, cutime 16, cstime 17 (1-based, as proc(5) numbers them).
_SESSION_FIELD, _TIMES_FIELDS = 3, slice(11, 15)
# NVML's throttle reasons (nvmlClocksThrottleReason*) and nvidia-smi's names for them; the
# idle reason is left out (an idle GPU at the window's end is not a perturbation).
THROTTLE_REASONS = {
    0x2: "applications_clocks_setting",
    0x4: "sw_power_cap",
    0x8: "hw_slowdown",
    0x10: "sync_boost",
    0x20: "sw_thermal_slowdown",
    0x40: "hw_thermal_slowdown",
    0x80: "hw_power_brake_slowdown",
    0x100: "display_clock_setting",
}
SMI_THROTTLE_PREFIX = "clocks_throttle_reasons."
SMI_FIELDS = (
    "clocks.sm",
    "clocks.max.sm",
    "temperature.gpu",
    "power.draw",
    "power.limit",
    *(SMI_THROTTLE_PREFIX + name for name in THROTTLE_REASONS.values()),
)
SMI_TIMEOUT_S = 10


@dataclass
class _GpuSample:
    sm_clock_mhz: float | None = None
    max_sm_clock_mhz: float | None = None
    temperature_c: float | None = None
    power_w: float | None = None
    power_limit_w: float | None = None
    throttle_reasons: list[str] = field(default_factory=list)
    process_ids: list[int] | None = None
    source: str = ""


@dataclass
class _Sample:
    monotonic_s: float
    unix_s: float
    busy_ticks: int | None
    steal_ticks: int | None
    own_ticks: int | None
    load_average: float | None
    cpu_mhz: list[float]
    gpu: _GpuSample | None


@dataclass
class Window:
    """The first sample of a measured window; :meth:`end` takes the second and compares."""

    cpus: list[int]
    gpu_index: int | None
    start: _Sample
    cost_s: float
    unavailable: dict[str, None] = field(default_factory=dict)

    def end(self) -> Conditions:
        begun = time.perf_counter()
        stop = _sample(self.cpus, self.gpu_index, self.unavailable, start=False)
        conditions = _compare(self, stop)
        conditions.sampling_s = self.cost_s + time.perf_counter() - begun
        return conditions


def begin(device: Any) -> Window:
    """Sample the node before a measured window on ``device`` (a torch.device)."""
    begun = time.perf_counter()
    cpus = sorted(os.sched_getaffinity(0))
    gpu_index = device.index if getattr(device, "type", "") == "cuda" else None
    unavailable: dict[str, None] = {}
    start = _sample(cpus, gpu_index, unavailable, start=True)
    return Window(cpus, gpu_index, start, time.perf_counter() - begun, unavailable)


def _sample(cpus: list[int], gpu: int | None, unavailable: dict[str, None], start: bool) -> _Sample:
    """One sample. At the start the node's counters are read last, at the end first, so that
    the sampling itself stays outside the window they bracket."""
    gpu_sample = _gpu_sample(gpu, unavailable) if gpu is not None and start else None
    own = _session_ticks(unavailable) if start else None
    busy, steal = _cpu_ticks(cpus, unavailable)
    monotonic_s, unix_s = time.monotonic(), time.time()
    if not start:
        own = _session_ticks(unavailable)
        gpu_sample = _gpu_sample(gpu, unavailable) if gpu is not None else None
    return _Sample(
        monotonic_s=monotonic_s,
        unix_s=unix_s,
        busy_ticks=busy,
        steal_ticks=steal,
        own_ticks=own,
        load_average=_load_average(unavailable),
        cpu_mhz=_cpu_mhz(cpus, unavailable),
        gpu=gpu_sample,
    )


def _compare(window: Window, stop: _Sample) -> Conditions:
    start = window.start
    tick_s = 1.0 / os.sysconf("SC_CLK_TCK")
    busy = _difference(start.busy_ticks, stop.busy_ticks, tick_s)
    own = _difference(start.own_ticks, stop.own_ticks, tick_s)
    limits = _cpu_limits_mhz(window.cpus)
    conditions = Conditions(
        window_s=stop.monotonic_s - start.monotonic_s,
        window_started_unix_s=start.unix_s,
        affinity_cpus=len(window.cpus),
        node_cpus=os.cpu_count() or 0,
        pinned=len(window.cpus) < (os.cpu_count() or 0),
        busy_cpu_s=busy,
        own_cpu_s=own,
        other_cpu_s=busy - own if busy is not None and own is not None else None,
        steal_cpu_s=_difference(start.steal_ticks, stop.steal_ticks, tick_s),
        cpu_tick_s=tick_s,
        load_average_start=start.load_average,
        load_average_end=stop.load_average,
        cpu_governors=_governors(window.cpus),
        cpu_mhz_min=min([*start.cpu_mhz, *stop.cpu_mhz], default=None),
        cpu_mhz_max=max([*start.cpu_mhz, *stop.cpu_mhz], default=None),
        cpu_mhz_limit=max(limits, default=None),
    )
    _note_gpu(conditions, start.gpu, stop.gpu)
    conditions.not_readable = "; ".join(window.unavailable)
    return conditions


def _difference(start: int | None, stop: int | None, tick_s: float) -> float | None:
    return (stop - start) * tick_s if start is not None and stop is not None else None


def _cpu_ticks(cpus: list[int], unavailable: dict[str, None]) -> tuple[int | None, int | None]:
    """Non-idle and steal ticks of ``cpus`` since boot, from /proc/stat's per-CPU lines."""
    wanted = {f"cpu{cpu}" for cpu in cpus}
    busy = steal = 0
    try:
        lines = (PROC / "stat").read_text(encoding="ascii").splitlines()
    except OSError as error:
        unavailable[f"/proc/stat ({error.strerror})"] = None
        return None, None
    for line in lines:
        name, *values = line.split()
        if name not in wanted:
            continue
        ticks = [int(v) for v in values[:_STAT_COLUMNS]]
        busy += sum(t for i, t in enumerate(ticks) if i not in _IDLE_COLUMNS)
        steal += ticks[_STEAL_COLUMN] if len(ticks) > _STEAL_COLUMN else 0
    return busy, steal


def _session_ticks(unavailable: dict[str, None]) -> int | None:
    """CPU ticks of every process in this process's session, its threads and reaped children
    included (utime + stime + cutime + cstime of each)."""
    session = os.getsid(0)
    total = 0
    for entry in PROC.iterdir():
        if not entry.name.isdigit():
            continue
        try:
            text = (entry / "stat").read_text(encoding="ascii", errors="replace")
        except OSError:
            continue  # gone since the listing
        fields = text.rpartition(")")[2].split()
        if len(fields) > _TIMES_FIELDS.stop and int(fields[_SESSION_FIELD]) == session:
            total += sum(int(v) for v in fields[_TIMES_FIELDS])
    if total == 0:
        unavailable["/proc/PID/stat"] = None
        return None
    return total


def _load_average(unavailable: dict[str, None]) -> float | None:
    try:
        return os.getloadavg()[0]
    except OSError:
        unavailable["load average"] = None
        return None


def _read(path: str) -> str | None:
    try:
        return Path(path).read_text(encoding="ascii").strip()
    except OSError:
        return None


def _cpu_mhz(cpus: list[int], unavailable: dict[str, None]) -> list[float]:
    values = [_read(CPUFREQ.format(cpu, "scaling_cur_freq")) for cpu in cpus]
    found = [float(v) / KHZ_PER_MHZ for v in values if v and v.isdigit()]
    if not found:
        unavailable["cpufreq"] = None
    return found


def _cpu_limits_mhz(cpus: list[int]) -> list[float]:
    values = [_read(CPUFREQ.format(cpu, "cpuinfo_max_freq")) for cpu in cpus]
    return [float(v) / KHZ_PER_MHZ for v in values if v and v.isdigit()]


def _governors(cpus: list[int]) -> str | None:
    found = dict.fromkeys(_read(CPUFREQ.format(cpu, "scaling_governor")) for cpu in cpus)
    names = [name for name in found if name]
    return ", ".join(names) if names else None


# --- the GPU ---------------------------------------------------------------------------------


def _gpu_sample(index: int, unavailable: dict[str, None]) -> _GpuSample:
    sample = _nvml_sample(index)
    if sample is None:
        sample = _smi_sample(index)
    if sample is None:
        unavailable["GPU state (no pynvml, no nvidia-smi)"] = None
        return _GpuSample()
    return sample


def _nvml_sample(index: int) -> _GpuSample | None:
    try:
        import pynvml
    except ImportError:
        return None
    try:
        pynvml.nvmlInit()
        gpu = smi_id(index)
        handle = (
            pynvml.nvmlDeviceGetHandleByIndex(int(gpu))
            if gpu.isdigit()
            else pynvml.nvmlDeviceGetHandleByUUID(gpu)
        )
        return _nvml_read(pynvml, handle)
    except Exception:  # an NVML without this query or device: fall back to nvidia-smi
        return None


def _nvml_read(pynvml: Any, handle: Any) -> _GpuSample:
    sm = pynvml.NVML_CLOCK_SM
    reasons = pynvml.nvmlDeviceGetCurrentClocksThrottleReasons(handle)
    processes = pynvml.nvmlDeviceGetComputeRunningProcesses(handle)
    return _GpuSample(
        sm_clock_mhz=float(pynvml.nvmlDeviceGetClockInfo(handle, sm)),
        max_sm_clock_mhz=float(pynvml.nvmlDeviceGetMaxClockInfo(handle, sm)),
        temperature_c=float(pynvml.nvmlDeviceGetTemperature(handle, pynvml.NVML_TEMPERATURE_GPU)),
        power_w=pynvml.nvmlDeviceGetPowerUsage(handle) / MILLIWATTS_PER_WATT,
        power_limit_w=pynvml.nvmlDeviceGetEnforcedPowerLimit(handle) / MILLIWATTS_PER_WATT,
        throttle_reasons=[name for bit, name in THROTTLE_REASONS.items() if reasons & bit],
        process_ids=[int(p.pid) for p in processes],
        source="nvml",
    )


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


def _smi_sample(index: int) -> _GpuSample | None:
    gpu = smi_id(index)
    # An nvidia-smi that lacks the throttle fields refuses the whole query: ask without them.
    lines = _smi(gpu, f"--query-gpu={','.join(SMI_FIELDS)}") or _smi(
        gpu, f"--query-gpu={','.join(SMI_FIELDS[:5])}"
    )
    if not lines:
        return None
    values = [value.strip() for value in lines[0].split(",")]
    numbers = [_number(value) for value in values[:5]]
    active = [
        name
        for name, value in zip(THROTTLE_REASONS.values(), values[5:], strict=False)
        if value.lower() == "active"
    ]
    apps = _smi(gpu, "--query-compute-apps=pid")
    return _GpuSample(
        *numbers,
        throttle_reasons=active,
        process_ids=[int(p) for p in apps if p.isdigit()] if apps is not None else None,
        source="nvidia-smi",
    )


def _number(text: str) -> float | None:
    with contextlib.suppress(ValueError):
        return float(text)
    return None


def _note_gpu(conditions: Conditions, start: _GpuSample | None, stop: _GpuSample | None) -> None:
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
    conditions.gpu_other_processes = _other_processes(samples)


def _largest(values: Any) -> float | None:
    present = [v for v in values if v is not None]
    return max(present) if present else None


def _other_processes(samples: list[_GpuSample]) -> int | None:
    """The most processes on the GPU that are not this cell's (its session's); where the cell
    itself is not among them (a PID namespace: a container), all but one."""
    listed = [s.process_ids for s in samples if s.process_ids is not None]
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
