"""The warm-up before a cell's measured window: the first step timed on its own (it holds
compilation), the knob's one-off calls, the numerics check steps captured, and more steps while
a step still compiles or GradScaler skipped a check step."""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import torch

from ptspeed.cell.measurement import numerics
from ptspeed.cell.measurement.reference import CheckCapture, Snapshot
from ptspeed.cell.measurement.timing import CpuTimer
from ptspeed.cell.record import CellSpec

# A warm-up step that still compiled is followed by more, at most this many beyond the plan.
MAX_EXTRA_WARMUP_STEPS = 10
# Check steps GradScaler may skip (fp16 overflow while it finds its scale) before giving up.
MAX_SCALER_SKIPS = 8


@dataclass(frozen=True)
class WarmupPlan:
    """How the warm-up goes: at least the configured steps; the knob's one-off calls, then the
    check steps, all before the measured window; more while a step still compiles."""

    planned: int
    check_from: int
    check_count: int
    longest: int
    late_index: int

    @classmethod
    def of(cls, spec: CellSpec, one_off_calls: int, checks: bool) -> WarmupPlan:
        count = spec.numerics_steps if checks else 0
        planned = max(spec.warmup_steps, one_off_calls + count, 1)
        longest = planned + MAX_EXTRA_WARMUP_STEPS + MAX_SCALER_SKIPS
        return cls(planned, one_off_calls, count, longest, late_loss_index(spec))

    @property
    def checked_until(self) -> int:
        """Index of the first step after the check steps (where the ``late`` fault starts)."""
        return self.check_from + self.check_count


def late_loss_index(spec: CellSpec) -> int:
    """The step (0-based) whose loss the late check compares: the last step of eager, which
    runs the configured warm-up (at least one step) and the measured steps. Every cell of the
    same configuration runs it, whether its warm-up was longer (a knob's one-off calls, a
    recompilation) or not, so its loss follows the same number of updates in each."""
    return max(spec.warmup_steps, 1) + spec.measured_steps - 1


@dataclass
class Warmup:
    first_step_s: float
    first_loss: float | None
    late_loss: float | None
    wall_s: float
    steps_run: int
    one_off_steps: int
    checks: list[tuple[Snapshot, numerics.StepValues]]


def warm_up(
    plan: WarmupPlan,
    run_step: Callable[[], Any],
    capture: CheckCapture,
    timer: CpuTimer,
    fault: str,
    barrier: Callable[[], None] = lambda: None,
) -> Warmup:
    """Run the warm-up: the first step timed on its own, the check steps captured, and extra
    steps while compilation goes on (a recompilation) or GradScaler skipped a check step.
    ``barrier`` (the ranks') comes between the first step's snapshot, which one rank may take
    alone, and its clock."""
    checks: list[tuple[Snapshot, numerics.StepValues]] = []
    check_until, planned = plan.checked_until, plan.planned
    last_compiling, index, first_step_s, first_loss, late_loss = -1, 0, 0.0, None, None
    while index < planned:
        snapshot = capture.before() if plan.check_from <= index < check_until else None
        events = compile_events()
        if index == 0:
            barrier()
            timer.begin()
            _inject_fault(fault)
        output = run_step()
        if index == 0:
            timer.end()
            first_step_s = timer.result().wall_s
            first_loss = loss_of(output)
        if index == plan.late_index:  # a warm-up that ran past eager's last step
            late_loss = loss_of(output)
        if compile_events() != events:
            last_compiling = index
            planned = max(planned, min(index + 2, plan.planned + MAX_EXTRA_WARMUP_STEPS))
        if snapshot is not None:
            values = capture.after(snapshot, output)
            if values is None and check_until < plan.checked_until + MAX_SCALER_SKIPS:
                check_until += 1  # GradScaler skipped the step (overflow): check the next
                planned = max(planned, check_until)
            elif values is not None:
                checks.append((snapshot, values))
        index += 1
    timer.end()
    return Warmup(
        first_step_s=first_step_s,
        first_loss=first_loss,
        late_loss=late_loss,
        wall_s=timer.result().wall_s,
        steps_run=index,
        one_off_steps=max(1, plan.check_from, last_compiling + 1),
        checks=checks,
    )


def loss_of(output: Any) -> float | None:
    if isinstance(output, torch.Tensor) and output.numel() == 1:
        return float(output.float().item())
    return None


def compile_events() -> int:
    """How many frames and graphs the compiler has compiled so far in this process (0 where
    the torch version has no compiler): a change across a step means the step compiled."""
    try:
        from torch._dynamo.utils import counters
    except ImportError:
        return 0
    return sum(counters["frames"].values()) + sum(counters["aot_autograd"].values())


def _inject_fault(fault: str) -> None:
    """Faults for testing the suite itself; recorded in the cell spec, never silent."""
    if fault == "error":
        raise RuntimeError("injected fault: error in the first step")
    if fault == "oom":
        raise RuntimeError(
            "[enforce fail at alloc_cpu.cpp] DefaultCPUAllocator: can't allocate memory "
            "(injected fault)"
        )
    if fault == "hang":
        while True:
            time.sleep(1)
    if fault == "crash":
        import os
        import signal

        os.kill(os.getpid(), signal.SIGKILL)
