"""The conditions a trial's measured window ran under: what else used the node, its clocks.

:func:`begin` samples the node just before the measured window and :meth:`Window.end` just
after it (never inside: the timed loop runs nothing of this), and the two samples make a
:class:`~ptspeed.cell.record_window.Conditions`: the CPU time other processes took on the
cell's CPUs (``/proc/stat``'s non-idle time of those CPUs minus the cell's own CPU time,
below), the load average, the CPU frequency governor and clock range (``cpufreq``; absent in
most VMs and containers: null), whether the cell was pinned, and on CUDA the GPU's clocks,
temperature, power, throttle reasons and other processes on it
(:mod:`ptspeed.cell.measurement.gpu_state`: sampled through the window by
:mod:`ptspeed.cell.measurement.telemetry`'s NVML thread, else ``nvidia-smi`` at its two ends),
and the window's energy. Whether that makes the trial perturbed is judged on the host
(:mod:`ptspeed.analysis.conditions`), so a changed threshold re-judges old records.

The cell's own processes are those of its session: the watchdog starts each worker in a
session of its own (``start_new_session=True`` in :mod:`ptspeed.launch.watchdog`), so torch's
intra-op threads, DataLoader workers, compile workers and torchrun's ranks count as the cell's
and nothing else does. Their CPU time inside the window, from each process's utime + stime +
cutime + cstime (``/proc/PID/stat``): for a process of the session at the end, the change since
the start (a process born in the window: all of it); less, for each process gone by the end
whose ticks went to the session (a reaped process's whole life joins its parent's cutime and
cstime, whatever the child's session), its ticks at the start, since only what it spent after
them lies inside the window. The figure can be no more than the cell's CPUs give in the window
nor than they were busy (rounding aside); past that it is clamped, ``other_cpu_s`` is left null
and ``not_readable`` says why, so that no trial is judged quiet on its strength.

Standard library only; every read that fails leaves its value null and
says so in ``not_readable``.
"""

from __future__ import annotations

import os
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from ptspeed.cell.measurement import gpu_state, telemetry
from ptspeed.cell.record_window import Conditions

PROC = Path("/proc")
CPUFREQ = "/sys/devices/system/cpu/cpu{}/cpufreq/{}"
KHZ_PER_MHZ = 1000.0
# /proc/stat's columns after the CPU name: user nice system idle iowait irq softirq steal
# (guest and guest_nice are already inside user and nice).
_IDLE_COLUMNS = (3, 4)
_STEAL_COLUMN = 7
_STAT_COLUMNS = 8
# /proc/PID/stat after the command's closing parenthesis: state is field 3, parent 4, session
# 6, utime 14, stime 15, cutime 16, cstime 17, start time 22 (1-based, as proc(5) numbers them).
_PARENT_FIELD, _SESSION_FIELD, _TIMES_FIELDS, _START_TIME_FIELD = 1, 3, slice(11, 15), 19
# Each CPU's /proc/stat counters and each process's utime and stime are whole ticks, read at
# both ends of the window: the own CPU time is trusted up to this many ticks past its bounds
# per CPU and per process that ran.
_ROUNDING_TICKS = 2


@dataclass(frozen=True)
class _Process:
    """A process as /proc/PID/stat shows it. Its start time tells it from a later process given
    the same pid; ticks: utime + stime + cutime + cstime."""

    parent: int
    session: int
    start_time: int
    ticks: int


@dataclass
class _Sample:
    monotonic_s: float
    unix_s: float
    busy_ticks: int | None
    steal_ticks: int | None
    processes: dict[int, _Process] | None
    load_average: float | None
    cpu_mhz: list[float]
    gpu: gpu_state.GpuSample | None


@dataclass
class Window:
    """The first sample of a measured window; :meth:`end` takes the second and compares."""

    cpus: list[int]
    gpu_index: int | None
    session: int
    start: _Sample
    cost_s: float
    unavailable: dict[str, None] = field(default_factory=dict)
    sampler: telemetry.GpuSampler | None = None
    rapl_edges: list[telemetry.RaplReading] = field(default_factory=list)

    def opened(self) -> None:
        """The window's clock starts: its energy counts from here (the GPU's, or the CPU
        packages' where the cell runs on the CPU)."""
        if self.sampler is not None:
            self.sampler.opened()
        elif self.gpu_index is None:
            self.rapl_edges.append(telemetry.read_rapl())

    def closed(self) -> None:
        """The window's clock stopped: its energy counts to here."""
        if self.sampler is not None:
            self.sampler.closed()
        elif self.gpu_index is None:
            self.rapl_edges.append(telemetry.read_rapl())

    def end(self) -> Conditions:
        begun = time.perf_counter()
        snapshot_gpu = self.gpu_index if self.sampler is None else None
        stop = _sample(self.cpus, snapshot_gpu, self.unavailable, start=False)
        gpu = self.sampler.stop() if self.sampler is not None else None
        conditions = _compare(self, stop)
        if gpu is not None:
            gpu_state.note_telemetry(conditions, gpu)
        _note_energy(conditions, gpu, *(self.rapl_edges[:2] or [None, None]))
        conditions.sampling_s = self.cost_s + time.perf_counter() - begun
        return conditions


def begin(device: Any) -> Window:
    """Sample the node before a measured window on ``device`` (a torch.device): on CUDA a
    thread samples the GPU through NVML until :meth:`Window.end` (nvidia-smi at both ends where
    NVML cannot be opened); on the CPU the packages' energy counters are read."""
    begun = time.perf_counter()
    cpus = sorted(os.sched_getaffinity(0))
    gpu_index = device.index if getattr(device, "type", "") == "cuda" else None
    unavailable: dict[str, None] = {}
    sampler = gpu_state.gpu_sampler(gpu_index, unavailable) if gpu_index is not None else None
    snapshot_gpu = gpu_index if sampler is None else None
    start = _sample(cpus, snapshot_gpu, unavailable, start=True)
    session = os.getsid(0)
    cost_s = time.perf_counter() - begun
    return Window(cpus, gpu_index, session, start, cost_s, unavailable, sampler)


def _sample(cpus: list[int], gpu: int | None, unavailable: dict[str, None], start: bool) -> _Sample:
    """One sample. At the start the node's counters are read last, at the end first, so that
    the sampling itself stays outside the window they bracket."""
    gpu_sample = gpu_state.gpu_sample(gpu, unavailable) if gpu is not None and start else None
    processes = _processes(unavailable) if start else None
    busy, steal = _cpu_ticks(cpus, unavailable)
    monotonic_s, unix_s = time.monotonic(), time.time()
    if not start:
        processes = _processes(unavailable)
        gpu_sample = gpu_state.gpu_sample(gpu, unavailable) if gpu is not None else None
    return _Sample(
        monotonic_s=monotonic_s,
        unix_s=unix_s,
        busy_ticks=busy,
        steal_ticks=steal,
        processes=processes,
        load_average=_load_average(unavailable),
        cpu_mhz=_cpu_mhz(cpus, unavailable),
        gpu=gpu_sample,
    )


def _compare(window: Window, stop: _Sample) -> Conditions:
    start = window.start
    tick_s = 1.0 / os.sysconf("SC_CLK_TCK")
    busy = _difference(start.busy_ticks, stop.busy_ticks, tick_s)
    own_ticks = _own_ticks(start.processes, stop.processes, window.session)
    own = sum(own_ticks) * tick_s if own_ticks is not None else None
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
    gpu_state.note_gpu(conditions, start.gpu, stop.gpu)
    counters = len(window.cpus) + sum(1 for ticks in own_ticks or [] if ticks)
    doubt = _distrust_impossible_own(conditions, _ROUNDING_TICKS * counters * tick_s)
    conditions.not_readable = "; ".join([*window.unavailable, *([doubt] if doubt else [])])
    return conditions


def _difference(start: int | None, stop: int | None, tick_s: float) -> float | None:
    return (stop - start) * tick_s if start is not None and stop is not None else None


def _own_ticks(
    start: dict[int, _Process] | None, stop: dict[int, _Process] | None, session: int
) -> list[int] | None:
    """The CPU ticks the cell's processes (``session``'s) took between the two samples, one
    term per process of the session and per process reaped into it (see the module
    docstring for why these terms)."""
    if start is None or stop is None:
        return None
    terms = [
        process.ticks - (start[pid].ticks if _lives_on(pid, start, stop) else 0)
        for pid, process in stop.items()
        if process.session == session
    ]
    terms += [-start[pid].ticks for pid in start if _reaped_into(session, pid, start, stop)]
    return terms


def _lives_on(pid: int, start: dict[int, _Process], stop: dict[int, _Process]) -> bool:
    """Whether the process ``pid`` of the first sample is still there at the second."""
    later = stop.get(pid)
    return pid in start and later is not None and later.start_time == start[pid].start_time


def _reaped_into(
    session: int, pid: int, start: dict[int, _Process], stop: dict[int, _Process]
) -> bool:
    """Whether a process gone by the end left its ticks with a process of ``session``: its
    parent's cutime and cstime, or, where the parent is gone too, its parent's in turn."""
    if _lives_on(pid, start, stop):
        return False
    seen = {pid}
    ancestor = start[pid].parent
    while ancestor in start and ancestor not in seen and not _lives_on(ancestor, start, stop):
        seen.add(ancestor)
        ancestor = start[ancestor].parent
    return _lives_on(ancestor, start, stop) and stop[ancestor].session == session


def _distrust_impossible_own(conditions: Conditions, slack_s: float) -> str:
    """Why the own CPU time cannot be right ('' where it can); where it cannot, it is clamped
    to what is possible and other_cpu_s, which would rest on it, is left unknown."""
    own, busy, window_s = conditions.own_cpu_s, conditions.busy_cpu_s, conditions.window_s
    cpus = conditions.affinity_cpus
    if own is None or window_s is None:
        return ""
    doubt = _own_doubt(own, busy, window_s, cpus, slack_s)
    if doubt:
        possible = min(window_s * cpus, busy if busy is not None else window_s * cpus)
        conditions.own_cpu_s = min(max(own, 0.0), possible)
        conditions.other_cpu_s = None
    return doubt


def _own_doubt(
    own_s: float, busy_s: float | None, window_s: float, cpus: int, slack_s: float
) -> str:
    if own_s > window_s * cpus + slack_s:
        given = f"what {cpus} CPU(s) give in {window_s:.2f} s"
        return f"own CPU time {own_s:.2f} s exceeds {given}: not trusted"
    if busy_s is not None and own_s > busy_s + slack_s:
        busy = f"the {busy_s:.2f} s its CPUs were busy"
        return f"own CPU time {own_s:.2f} s exceeds {busy}: not trusted"
    if own_s < -slack_s:
        return f"own CPU time {own_s:.2f} s is below zero: not trusted"
    return ""


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


def _processes(unavailable: dict[str, None]) -> dict[int, _Process] | None:
    """Every process of the node (of this PID namespace) by pid, from /proc/PID/stat."""
    table = {}
    for entry in PROC.iterdir():
        if entry.name.isdigit() and (process := _read_process(entry)) is not None:
            table[int(entry.name)] = process
    if os.getpid() not in table:
        unavailable["/proc/PID/stat"] = None
        return None
    return table


def _read_process(entry: Path) -> _Process | None:
    try:
        text = (entry / "stat").read_text(encoding="ascii", errors="replace")
    except OSError:
        return None  # gone since the listing
    fields = text.rpartition(")")[2].split()
    if len(fields) <= _START_TIME_FIELD:
        return None
    return _Process(
        parent=int(fields[_PARENT_FIELD]),
        session=int(fields[_SESSION_FIELD]),
        start_time=int(fields[_START_TIME_FIELD]),
        ticks=sum(int(v) for v in fields[_TIMES_FIELDS]),
    )


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


def _note_energy(
    conditions: Conditions,
    gpu: telemetry.GpuTelemetry | None,
    rapl_start: telemetry.RaplReading | None,
    rapl_stop: telemetry.RaplReading | None,
) -> None:
    """The window's energy: the GPU's counter on CUDA, the CPU packages' (RAPL) on the CPU;
    else not measured, with the reason."""
    if gpu is not None and gpu.energy_j is not None:
        conditions.energy_j, conditions.energy_source = gpu.energy_j, "nvml"
    elif gpu is not None:
        conditions.energy_not_measured = gpu.unreadable.get("energy", "no energy counter")
    elif rapl_start is not None and rapl_stop is not None:
        joules = rapl_stop.joules_since(rapl_start)
        if joules is None:
            conditions.energy_not_measured = rapl_start.why_not or rapl_stop.why_not
        else:
            conditions.energy_j, conditions.energy_source = joules, "rapl"
    else:
        conditions.energy_not_measured = "no NVML on this GPU (nvidia-smi reads no energy)"
