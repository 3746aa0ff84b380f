"""Step timers and the summary of their times.

A timer is a small class with a ``step()`` context manager and a ``result()`` method. On CUDA
the step is bracketed by CUDA events (read only after a final synchronise, so the host never
waits inside the measured loop); on CPU by ``time.perf_counter``. The wall time of the whole
measured loop is read with the device synchronised at both ends: throughput comes from it,
never from a sum of asynchronous launch times.
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any, Protocol

Clock = Callable[[], float]
MILLISECONDS_PER_SECOND = 1000.0


class WindowEdges(Protocol):
    """Told when the measured window's clock starts and stops."""

    def opened(self) -> None: ...

    def closed(self) -> None: ...


@dataclass(frozen=True)
class TimingResult:
    step_times_s: list[float]
    wall_s: float

    @property
    def p50_s(self) -> float:
        return percentile(self.step_times_s, 50)

    @property
    def p90_s(self) -> float:
        return percentile(self.step_times_s, 90)

    @property
    def mean_s(self) -> float:
        return sum(self.step_times_s) / len(self.step_times_s)

    def throughput(self, samples_per_step: int) -> float:
        return samples_per_step * len(self.step_times_s) / self.wall_s


def percentile(values: list[float], q: float) -> float:
    """Linear-interpolated percentile (numpy's default method), ``q`` in [0, 100]."""
    if not values:
        raise ValueError("percentile of no values")
    ordered = sorted(values)
    position = (len(ordered) - 1) * q / 100.0
    low, high = math.floor(position), math.ceil(position)
    return ordered[low] + (ordered[high] - ordered[low]) * (position - low)


class CpuTimer:
    """Times steps on the host clock. ``clock`` is injectable for tests."""

    def __init__(self, clock: Clock = time.perf_counter) -> None:
        self._clock = clock
        self._times: list[float] = []
        self._start = self._stop = 0.0

    def synchronize(self) -> None:
        """Nothing to wait for on the host."""

    def begin(self, edges: WindowEdges | None = None) -> None:
        self.synchronize()
        if edges is not None:
            edges.opened()
        self._start = self._clock()

    def end(self, edges: WindowEdges | None = None) -> None:
        self.synchronize()
        self._stop = self._clock()
        if edges is not None:
            edges.closed()

    @contextmanager
    def step(self) -> Iterator[None]:
        started = self._clock()
        try:
            yield
        finally:
            self._times.append(self._clock() - started)

    def result(self) -> TimingResult:
        return TimingResult(step_times_s=list(self._times), wall_s=self._stop - self._start)


class CudaTimer(CpuTimer):
    """Times steps with CUDA events; the loop's wall time is read between synchronisations."""

    def __init__(self, torch_module: Any, device: Any, clock: Clock = time.perf_counter) -> None:
        super().__init__(clock)
        self._torch = torch_module
        self._device = device
        self._events: list[tuple[Any, Any]] = []

    def synchronize(self) -> None:
        self._torch.cuda.synchronize(self._device)

    @contextmanager
    def step(self) -> Iterator[None]:
        start = self._torch.cuda.Event(enable_timing=True)
        stop = self._torch.cuda.Event(enable_timing=True)
        start.record()
        try:
            yield
        finally:
            stop.record()
            self._events.append((start, stop))

    def result(self) -> TimingResult:
        self.synchronize()
        times = [a.elapsed_time(b) / MILLISECONDS_PER_SECOND for a, b in self._events]
        return TimingResult(step_times_s=times, wall_s=self._stop - self._start)


def make_timer(torch_module: Any, device: Any) -> CpuTimer:
    if device.type == "cuda":
        return CudaTimer(torch_module, device)
    return CpuTimer()


def timed_loop(
    timer: CpuTimer,
    step: Callable[[], Any],
    steps: int,
    keep: int = -1,
    edges: WindowEdges | None = None,
) -> tuple[TimingResult, Any, Any]:
    """Run ``step`` ``steps`` times under ``timer``; return the timings, the last output and
    output number ``keep`` (0-based; None when out of range). ``edges`` hears the window's
    clock start (after the device is synchronised) and stop (right after the clock is read),
    so that what it measures (energy) is of exactly the window.

    An earlier output than the last is copied when it comes, outside the step's own timing but
    inside the window: one scalar copy queued on the device, no synchronisation. It is a copy
    because a CUDA graph's replay (and cudagraph trees') overwrites its static outputs in place.
    """
    output = kept = None
    timer.begin(edges)
    for index in range(steps):
        with timer.step():
            output = step()
        if index == keep:
            kept = output if index == steps - 1 else _copy(output)
    timer.end(edges)
    return timer.result(), output, kept


def _copy(output: Any) -> Any:
    """A tensor's copy (detached), anything else as it is."""
    return output.detach().clone() if hasattr(output, "clone") else output
