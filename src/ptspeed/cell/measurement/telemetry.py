"""What the node did during a measured window, sampled inside it: the GPU through NVML by a
background thread (SM clock, throttle reasons, power, temperature, other processes, every
~50 ms, and once at each edge of the window), and the energy of exactly the window: the GPU's
total-energy counter, or the CPU packages' through RAPL, read at the window's clock start and
stop (:meth:`GpuSampler.opened`, :meth:`GpuSampler.closed`).

NVML's power reading (``nvmlDeviceGetPowerUsage``) is an average over about a second on GPUs
since Ampere (GA100 excepted): a window shorter than that has its mean power from its energy
over its length, and no maximum (its samples would describe the warm-up before it).

NVML is the driver's own library (``libnvidia-ml.so.1``), called through ctypes, so that no
environment needs ``nvidia-ml-py``. Every field is read on its own: one a driver or GPU
cannot give (the energy counter before Volta, a renamed query) is named in
:attr:`GpuTelemetry.unreadable`, never silently empty. The thread holds the GIL for a few
microseconds per sample and its CPU time is measured (:attr:`GpuTelemetry.sampler_cpu_s`).

Standard library only.
"""

from __future__ import annotations

import ctypes
import statistics
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

NVML_LIBRARY = "libnvidia-ml.so.1"
SAMPLE_INTERVAL_S = 0.05
# NVML's power reading averages over about this long (Hopper, Ada, GA10x); a window's maximum
# power from its samples means something only past it.
NVML_POWER_AVERAGE_S = 1.0
# NVML's total-energy counter moves in steps, every 0.1 s on an H200 (driver 580: 30 steps of
# 70 J in 3 s of GEMMs at 700 W, scripts/gpu_window_study.py). A window's energy is off by up
# to one step at each edge: only a window of ten steps or more has its energy within 10 %.
NVML_ENERGY_STEP_S = 0.1
NVML_ENERGY_MIN_WINDOW_S = 10 * NVML_ENERGY_STEP_S
NVML_SUCCESS = 0
NVML_ERROR_INSUFFICIENT_SIZE = 7
NVML_CLOCK_SM = 1
NVML_TEMPERATURE_GPU = 0
MILLI = 1000.0
# nvmlClocksEventReason* (formerly ClocksThrottleReason*); the idle bit is left out: an idle
# GPU between steps is not a perturbation.
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
MAX_PROCESSES = 64
# NVML's query of the active clock reasons: its current name, then the name older drivers have.
REASON_QUERIES = (
    "nvmlDeviceGetCurrentClocksEventReasons",
    "nvmlDeviceGetCurrentClocksThrottleReasons",
)


def throttle_bits(names: str) -> int:
    """NVML's bits of comma-separated reason names."""
    bits = {name: bit for bit, name in THROTTLE_REASONS.items()}
    return sum(bits.get(name.strip(), 0) for name in names.split(",") if name.strip())


def throttle_names(bits: int) -> list[str]:
    return [name for bit, name in THROTTLE_REASONS.items() if bits & bit]


RAPL = Path("/sys/class/powercap")


class _ProcessInfo(ctypes.Structure):
    # nvmlProcessInfo_t of the _v2/_v3 queries: pid, usedGpuMemory, gpuInstanceId,
    # computeInstanceId.
    _fields_ = [
        ("pid", ctypes.c_uint),
        ("used_gpu_memory", ctypes.c_ulonglong),
        ("gpu_instance_id", ctypes.c_uint),
        ("compute_instance_id", ctypes.c_uint),
    ]


class NvmlError(Exception):
    """An NVML call that failed; the message names the call and its return code."""


class Nvml:
    """One GPU through the driver's NVML library; each method raises :class:`NvmlError`."""

    def __init__(self, library: Any, device: str) -> None:
        self._library = library
        self._call("nvmlInit_v2")
        self._handle = ctypes.c_void_p()
        if device.isdigit():
            self._call("nvmlDeviceGetHandleByIndex_v2", ctypes.c_uint(int(device)),
                       ctypes.byref(self._handle))  # fmt: skip
        else:
            self._call("nvmlDeviceGetHandleByUUID", device.encode(), ctypes.byref(self._handle))
        # Chosen once: the sampler asks every 50 ms.
        self._reasons_query = next(
            (name for name in REASON_QUERIES if getattr(library, name, None) is not None),
            REASON_QUERIES[-1],
        )

    @classmethod
    def open(cls, device: str, library: str = NVML_LIBRARY) -> Nvml:
        """NVML for ``device`` (nvidia-smi's index or UUID: ptspeed.cell.provenance.smi_id)."""
        try:
            return cls(ctypes.CDLL(library), device)
        except OSError as error:
            raise NvmlError(f"{library}: {error}") from None

    def _call(self, name: str, *arguments: Any) -> None:
        function = getattr(self._library, name, None)
        if function is None:
            raise NvmlError(f"{name}: not in this driver's NVML")
        answer = function(*arguments)
        if answer != NVML_SUCCESS:
            raise NvmlError(f"{name}: NVML error {answer}")

    def _unsigned(self, name: str, *arguments: Any, kind: Any = ctypes.c_uint) -> int:
        value = kind()
        self._call(name, self._handle, *arguments, ctypes.byref(value))
        return int(value.value)

    def sm_clock_mhz(self) -> float:
        return float(self._unsigned("nvmlDeviceGetClockInfo", NVML_CLOCK_SM))

    def max_sm_clock_mhz(self) -> float:
        return float(self._unsigned("nvmlDeviceGetMaxClockInfo", NVML_CLOCK_SM))

    def temperature_c(self) -> float:
        return float(self._unsigned("nvmlDeviceGetTemperature", NVML_TEMPERATURE_GPU))

    def power_w(self) -> float:
        return self._unsigned("nvmlDeviceGetPowerUsage") / MILLI

    def power_limit_w(self) -> float:
        return self._unsigned("nvmlDeviceGetEnforcedPowerLimit") / MILLI

    def energy_j(self) -> float:
        """The GPU's total-energy counter since the driver loaded (Volta and later)."""
        name = "nvmlDeviceGetTotalEnergyConsumption"
        return self._unsigned(name, kind=ctypes.c_ulonglong) / MILLI

    def throttle_reasons(self) -> list[str]:
        """The active clock event reasons (under the query's older name where the driver's
        NVML lacks the newer one)."""
        return throttle_names(self._unsigned(self._reasons_query, kind=ctypes.c_ulonglong))

    def process_ids(self) -> list[int]:
        """The compute processes on the GPU."""
        for name in ("nvmlDeviceGetComputeRunningProcesses_v3",
                     "nvmlDeviceGetComputeRunningProcesses_v2"):  # fmt: skip
            if getattr(self._library, name, None) is None:
                continue
            count = ctypes.c_uint(MAX_PROCESSES)
            infos = (_ProcessInfo * MAX_PROCESSES)()
            self._call(name, self._handle, ctypes.byref(count), infos)
            return [int(infos[i].pid) for i in range(count.value)]
        raise NvmlError("nvmlDeviceGetComputeRunningProcesses_v2/_v3: not in this driver's NVML")


@dataclass
class GpuTelemetry:
    """A window's GPU samples, summarised."""

    samples: int = 0
    sm_clock_mhz: list[float] = field(default_factory=list)
    max_sm_clock_mhz: float | None = None
    temperature_c_max: float | None = None
    power_w: list[float] = field(default_factory=list)
    power_limit_w: float | None = None
    throttle_reasons: list[str] = field(default_factory=list)
    process_ids: list[list[int]] = field(default_factory=list)
    energy_j: float | None = None
    window_s: float | None = None
    sampler_cpu_s: float | None = None
    unreadable: dict[str, str] = field(default_factory=dict)

    def median_sm_clock_mhz(self) -> float | None:
        return statistics.median(self.sm_clock_mhz) if self.sm_clock_mhz else None

    def mean_power_w(self) -> float | None:
        """The window's mean power: its energy over its length (NVML's own reading averages
        over a second, longer than many windows); the samples' mean where there is no energy
        and the window outlasts that second; else None."""
        if self.energy_j is not None and self.window_s:
            return self.energy_j / self.window_s
        if self.window_s is not None and self.window_s < NVML_POWER_AVERAGE_S:
            return None
        return statistics.fmean(self.power_w) if self.power_w else None

    def max_power_w(self) -> float | None:
        """The highest power sampled in the window; None for a window shorter than NVML's
        power average, whose samples would describe the time before it."""
        if self.window_s is None or self.window_s < NVML_POWER_AVERAGE_S:
            return None
        return max(self.power_w, default=None)


class GpuSampler:
    """Samples one GPU every ``interval_s`` on a thread between :meth:`start` and
    :meth:`stop`; the measured window lies between :meth:`opened` and :meth:`closed`, whose
    energy counter readings give its energy and whose samples alone describe it."""

    def __init__(
        self,
        nvml: Nvml,
        interval_s: float = SAMPLE_INTERVAL_S,
        clock: Callable[[], float] = time.perf_counter,
    ) -> None:
        self._nvml = nvml
        self._interval_s = interval_s
        self._clock = clock
        self._stopping = threading.Event()
        self._thread = threading.Thread(target=self._run, name="ptspeed-gpu-sampler", daemon=True)
        self._lock = threading.Lock()
        self.telemetry = GpuTelemetry()
        self._window: list[float] = []  # the clock at the window's start and stop
        self._energy: list[float | None] = []  # the counter there

    def start(self) -> None:
        self.telemetry.max_sm_clock_mhz = self._read("max SM clock", self._nvml.max_sm_clock_mhz)
        self.telemetry.power_limit_w = self._read("power limit", self._nvml.power_limit_w)
        self._thread.start()

    def opened(self) -> None:
        """The window's clock starts now: read the energy counter and take a sample."""
        self._edge()

    def closed(self) -> None:
        """The window's clock stopped: read the energy counter and take a sample."""
        self._edge()

    def stop(self) -> GpuTelemetry:
        self._stopping.set()
        self._thread.join()
        telemetry = self.telemetry
        if len(self._window) == 2:
            telemetry.window_s = self._window[1] - self._window[0]
        if len(self._energy) != 2 or None in self._energy:
            return telemetry
        if telemetry.window_s is not None and telemetry.window_s < NVML_ENERGY_MIN_WINDOW_S:
            telemetry.unreadable["energy"] = (
                f"a {telemetry.window_s:.3g} s window is shorter than "
                f"{NVML_ENERGY_MIN_WINDOW_S:g} s: NVML's energy counter moves in steps of about "
                f"{NVML_ENERGY_STEP_S:g} s"
            )
        else:
            telemetry.energy_j = self._energy[1] - self._energy[0]  # type: ignore[operator]
        return telemetry

    def _edge(self) -> None:
        self._energy.append(self._read("energy", self._nvml.energy_j))
        with self._lock:
            self._window.append(self._clock())
        self._sample(edge=True)

    def _run(self) -> None:
        begun = time.thread_time()
        while not self._stopping.wait(self._interval_s):
            self._sample()
        self.telemetry.sampler_cpu_s = time.thread_time() - begun

    def _sample(self, edge: bool = False) -> None:
        """One sample, kept only when it was taken inside the window (or at one of its edges)."""
        nvml = self._nvml
        with self._lock:
            inside = edge or len(self._window) == 1
        readings = (
            self._read("SM clock", nvml.sm_clock_mhz),
            self._read("power", nvml.power_w),
            self._read("temperature", nvml.temperature_c),
            self._read("throttle reasons", nvml.throttle_reasons) or [],
            self._read("processes", nvml.process_ids),
        )
        with self._lock:
            if edge or (inside and len(self._window) == 1):  # not closed while reading
                self._keep(*readings)

    def _keep(
        self, clock: float | None, power: float | None, temperature: float | None,
        reasons: list[str], processes: list[int] | None,
    ) -> None:  # fmt: skip
        telemetry = self.telemetry
        telemetry.samples += 1
        _append(telemetry.sm_clock_mhz, clock)
        _append(telemetry.power_w, power)
        if temperature is not None:
            telemetry.temperature_c_max = max(temperature, telemetry.temperature_c_max or 0.0)
        telemetry.throttle_reasons = list(dict.fromkeys([*telemetry.throttle_reasons, *reasons]))
        _append(telemetry.process_ids, processes)

    def _read(self, what: str, read: Callable[[], Any]) -> Any:
        if what in self.telemetry.unreadable:
            return None
        try:
            return read()
        except NvmlError as error:
            self.telemetry.unreadable[what] = str(error)
            return None


def _append(values: list[Any], value: Any) -> None:
    if value is not None:
        values.append(value)


# --- the CPU packages' energy ---------------------------------------------------------------


@dataclass(frozen=True)
class RaplReading:
    """The packages' energy counters (µJ) and where they wrap; or why there are none."""

    counters: dict[Path, tuple[int, int]]
    why_not: str = ""

    def joules_since(self, earlier: RaplReading) -> float | None:
        if self.why_not or earlier.why_not or self.counters.keys() != earlier.counters.keys():
            return None
        total = 0
        for zone, (now, wraps_at) in self.counters.items():
            then = earlier.counters[zone][0]
            total += now - then if now >= then else now + wraps_at - then
        return total / 1e6


def read_rapl(root: Path = RAPL) -> RaplReading:
    """The energy counters of the CPU packages (``intel-rapl:N``, the top-level zones)."""
    zones = sorted(root.glob("intel-rapl:[0-9]*")) if root.is_dir() else []
    zones = [zone for zone in zones if zone.name.count(":") == 1]
    if not zones:
        return RaplReading({}, f"no RAPL zones in {root} (a VM or a non-Intel/AMD CPU)")
    counters = {}
    for zone in zones:
        try:
            energy = int((zone / "energy_uj").read_text())
            wraps_at = int((zone / "max_energy_range_uj").read_text())
        except (OSError, ValueError) as error:
            reason = getattr(error, "strerror", None) or str(error)
            return RaplReading({}, f"{zone / 'energy_uj'}: {reason} (root only since Linux 5.10)")
        counters[zone] = (energy, wraps_at)
    return RaplReading(counters)
