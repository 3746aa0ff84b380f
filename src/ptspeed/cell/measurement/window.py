"""A cell's measured window: the timed steps, and what is read just outside them.

:meth:`MeasuredWindow.begin` reads GradScaler's loss scale and the warm-up's peak memory, runs
the machine-speed probe, resets the peak memory count, takes the node's first sample and waits
for every process of the cell; :meth:`~MeasuredWindow.run` times the steps (nothing else runs
between its clocks); :meth:`~MeasuredWindow.end` takes the node's second sample, the loss scale,
the window's peak memory and the second probe, and returns a :class:`WindowResult`. Last of
all, after whatever reads the window, :meth:`~MeasuredWindow.profile` runs the profiled steps.

The window runs the step and the sampling it is given: an injected fault wraps them before
(:mod:`ptspeed.cell.faults`), so that nothing here tells a test from a real cell.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import torch

from ptspeed.cell.measurement import conditions, probe, profiling
from ptspeed.cell.measurement.reference import loss_scale
from ptspeed.cell.measurement.timing import TimingResult, make_timer, timed_loop
from ptspeed.cell.memory import Peak, PeakMemory
from ptspeed.cell.record import CellSpec, Profile
from ptspeed.cell.record_window import Conditions
from ptspeed.cell.steps import Step


@dataclass(frozen=True)
class WindowResult:
    """What the window measured: its timings, its last output and the one it kept (None where
    none was asked), the node's conditions, the peak memory and GradScaler's scale at both ends."""

    timing: TimingResult
    last_output: Any
    kept_output: Any
    conditions: Conditions
    peak_memory: Peak
    scale_before: float | None
    scale_after: float | None

    def scaler_skips(self) -> dict[str, Any]:
        return scaler_skips(self.scale_before, self.scale_after)


class MeasuredWindow:
    """The window of ``step`` (a :class:`~ptspeed.cell.steps.Step`, whose scaler and optimizer
    it reads) on ``device``; ``reports``: whether this process probes and profiles (rank 0 of a
    distributed cell); ``barrier``: the cell's processes meet; ``sample``: how the node is
    sampled at both ends (:func:`ptspeed.cell.measurement.conditions.begin`)."""

    def __init__(
        self,
        spec: CellSpec,
        device: torch.device,
        step: Step,
        reports: bool,
        barrier: Callable[[], None],
        sample: Callable[[Any], conditions.Window] = conditions.begin,
    ) -> None:
        self._spec = spec
        self._device = device
        self._step = step
        self._reports = reports
        self._barrier = barrier
        self._sample = sample
        self._probe = probe.WindowProbe(device, reports)
        self._memory = PeakMemory(device)
        self._timer = make_timer(torch, device)
        self._telemetry: conditions.Window | None = None
        self._scale_before: float | None = None
        self._outputs: tuple[TimingResult, Any, Any] | None = None

    def begin(self) -> None:
        self._scale_before = loss_scale(self._step)  # reads the device: before the window
        # The machine's speed just outside the window, its buffers kept out of the peak memory.
        self._memory.pause()
        self._probe.start()
        self._memory.resume()
        self._telemetry = self._sample(self._device)  # samples outside the timed loop
        # Every rank has sampled (a /proc scan, nvidia-smi: up to a second, unequal): the
        # clocks start together, or the early ranks' first step would wait out the others.
        self._barrier()

    def run(self, step: Callable[[], Any], steps: int, keep: int = -1) -> None:
        """Time ``steps`` calls of ``step``, keeping output number ``keep`` (0-based)."""
        self._outputs = timed_loop(self._timer, step, steps, keep=keep, edges=self._telemetry)

    def end(self) -> WindowResult:
        if self._telemetry is None or self._outputs is None:
            raise RuntimeError("the measured window ends after begin() and run()")
        window_conditions = self._telemetry.end()
        scale_after = loss_scale(self._step)
        peak = self._memory.stop()
        self._probe.stop()
        self._probe.note(window_conditions)
        timing, last_output, kept_output = self._outputs
        return WindowResult(
            timing,
            last_output,
            kept_output,
            window_conditions,
            peak,
            self._scale_before,
            scale_after,
        )

    def profile(self, step: Callable[[], Any]) -> Profile:
        """A few more steps under the profiler (``spec.profile_steps``): after the window and
        after everything that reads it, since the profiler slows the steps."""
        profile = profiling.profile_steps(
            self._spec, step, self._step.optimizer, self._device, self._reports
        )
        self._barrier()
        return profile


def scaler_skips(before: float | None, after: float | None) -> dict[str, Any]:
    """GradScaler's scale around the window and the steps it skipped there (each skip halves
    the scale; a growth, once per 2000 good steps, would hide one: a lower bound)."""
    if before is None or after is None or before <= 0 or after <= 0:
        return {}
    skipped = max(0, round(math.log2(before / after)))
    return {"amp_scale_before": before, "amp_scale_after": after, "amp_skipped_steps": skipped}
