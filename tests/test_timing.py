"""Timers and their summaries: exact with a fake clock, within tolerance with the real one."""

from __future__ import annotations

import time
from collections.abc import Iterator
from typing import Any

import numpy as np
import pytest
import torch
from hypothesis import given
from hypothesis import strategies as st

from ptspeed.cell.measurement.timing import (
    CpuTimer,
    CudaTimer,
    TimingResult,
    percentile,
    timed_loop,
)

BUSY_STEP_S = 0.020
BUSY_TOLERANCE = 0.25
LOAD_ALLOWANCE = 4  # other work on a shared 2-core machine stretches a busy step


class ListClock:
    """A clock that returns the given readings in order, and fails when read too often."""

    def __init__(self, readings: list[float]) -> None:
        self._readings: Iterator[float] = iter(readings)

    def __call__(self) -> float:
        return next(self._readings)


def test_cpu_timer_with_a_fake_clock_is_exact() -> None:
    # begin, (start, stop) per step for three steps, end
    timer = CpuTimer(clock=ListClock([10.0, 10.5, 11.0, 11.0, 12.0, 12.25, 12.5, 13.0]))
    outputs = iter(["a", "b", "c"])
    result, last, kept = timed_loop(timer, lambda: next(outputs), steps=3, keep=1)
    assert (last, kept) == ("c", "b")
    assert result.step_times_s == [0.5, 1.0, 0.25]
    assert result.wall_s == 3.0
    assert result.throughput(samples_per_step=4) == 4.0
    assert result.p50_s == 0.5
    assert result.mean_s == pytest.approx(1.75 / 3)


@pytest.mark.parametrize("keep", [-1, 3])
def test_no_output_is_kept_out_of_range(keep: int) -> None:
    assert timed_loop(CpuTimer(), lambda: 1, steps=3, keep=keep)[2] is None


def test_the_last_output_kept_is_the_last_output_itself() -> None:
    last = torch.ones(())
    outputs = iter([torch.zeros(()), last])
    assert timed_loop(CpuTimer(), lambda: next(outputs), steps=2, keep=1)[2] is last


def test_the_kept_output_is_a_copy_of_a_static_one() -> None:
    """A CUDA graph's replay writes its loss into the same tensor each step: the kept output
    is that step's value, not the last step's."""
    static = torch.zeros(())

    def replay() -> torch.Tensor:
        static.add_(1.0)
        return static

    _, last, kept = timed_loop(CpuTimer(), replay, steps=4, keep=1)
    assert (float(last), float(kept)) == (4.0, 2.0)


def test_step_time_is_recorded_even_when_the_step_raises() -> None:
    timer = CpuTimer(clock=ListClock([1.0, 3.0]))
    with pytest.raises(RuntimeError), timer.step():
        raise RuntimeError("boom")
    assert timer.result().step_times_s == [2.0]


def test_timing_result_summaries() -> None:
    result = TimingResult(step_times_s=[4.0, 1.0, 3.0, 2.0], wall_s=12.0)
    assert result.p50_s == 2.5
    assert result.p90_s == pytest.approx(3.7)
    assert result.mean_s == 2.5
    assert result.throughput(samples_per_step=6) == 2.0


class FakeEvent:
    def __init__(self, log: list[str], at: Iterator[float], enable_timing: bool) -> None:
        assert enable_timing
        self._log, self._at, self.time_ms = log, at, 0.0

    def record(self) -> None:
        self._log.append("record")
        self.time_ms = next(self._at)

    def elapsed_time(self, other: FakeEvent) -> float:
        assert self._log[-1] == "synchronize", "events read before a synchronise"
        return other.time_ms - self.time_ms


class FakeCuda:
    """Just enough of ``torch.cuda`` for :class:`CudaTimer`: events at given milliseconds."""

    def __init__(self, event_times_ms: list[float]) -> None:
        self.log: list[str] = []
        times = iter(event_times_ms)
        self.Event = lambda enable_timing: FakeEvent(self.log, times, enable_timing)

    def synchronize(self, device: Any) -> None:
        self.log.append("synchronize")


def test_cuda_timer_reads_events_after_synchronising() -> None:
    fake_torch = type("FakeTorch", (), {})()
    fake_torch.cuda = FakeCuda([0.0, 5.0, 5.0, 15.0])
    timer = CudaTimer(fake_torch, device="cuda:0", clock=ListClock([100.0, 100.5]))
    result, _, _ = timed_loop(timer, lambda: None, steps=2)
    assert result.step_times_s == [0.005, 0.010]
    assert result.wall_s == 0.5
    # one synchronise at each end of the loop, none between the steps, one before reading
    assert fake_torch.cuda.log == ["synchronize", *["record"] * 4, "synchronize", "synchronize"]


def test_percentile_of_nothing_is_an_error() -> None:
    with pytest.raises(ValueError, match="no values"):
        percentile([], 50)


@given(
    st.lists(st.floats(-1e6, 1e6), min_size=1, max_size=50),
    st.floats(0, 100),
)
def test_percentile_matches_numpy(values: list[float], q: float) -> None:
    expected = float(np.percentile(np.array(values), q))
    assert percentile(values, q) == pytest.approx(expected, rel=1e-9, abs=1e-9)


def busy_wait(seconds: float) -> None:
    deadline = time.perf_counter() + seconds
    while time.perf_counter() < deadline:
        pass


def test_a_step_of_known_duration_is_measured_within_tolerance() -> None:
    steps = 7
    result, _, _ = timed_loop(CpuTimer(), lambda: busy_wait(BUSY_STEP_S), steps)
    assert len(result.step_times_s) == steps
    # A busy wait never ends early; on a loaded machine a step may be preempted and run long,
    # so only the lower bound is tight.
    assert BUSY_STEP_S <= result.p50_s <= BUSY_STEP_S * (1 + BUSY_TOLERANCE) * LOAD_ALLOWANCE
    assert result.wall_s >= sum(result.step_times_s)
    assert result.throughput(1) == pytest.approx(steps / result.wall_s)
