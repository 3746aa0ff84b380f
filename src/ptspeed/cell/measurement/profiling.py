"""The profiled steps of a cell: a few more steps under torch.profiler, after the measured window.

Why after the window, in the same process (and only in a cell's first trial, as the workflow
asks): the profiler costs time per op (a 10-30 % slower step on the CPU), so it must never
run inside a measured window, and a dedicated trial would pay a whole model build and
compilation again for a few steps. After the window and after what reads it (the post-window
check step, the losses, peak memory), the steps are the same steady-state steps the window
timed; the throughput is measured before they start, so it cannot change (scripts/bench_harness
``--profile`` measures that it does not).

Each step runs inside a ``ptspeed.profiled_step#N`` range, synchronised on CUDA before the
range ends, and the optimizer's step inside an ``Optimizer.step#ptspeed`` range (torch 2.0.1's
torch.compile drops torch's own). The trace is exported as Chrome trace JSON, broken down by
:func:`ptspeed.cell.measurement.breakdown.breakdown`, and kept gzipped at ``cell.profile_trace``.
Whatever goes wrong here costs the breakdown only, never the measured result: the record's
profile says why.
"""

from __future__ import annotations

import contextlib
import gzip
import json
import os
import shutil
import tempfile
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import torch

from ptspeed.cell.measurement.breakdown import (
    OPTIMIZER_ANNOTATION,
    STEP_ANNOTATION,
    SUM_TOLERANCE,
    breakdown,
)
from ptspeed.cell.record import CellSpec, Profile


def profile_steps(
    spec: CellSpec,
    run_step: Callable[[], Any],
    optimizer: Any,
    device: torch.device,
    reports: bool = True,
) -> Profile:
    """Run ``spec.profile_steps`` more steps (``run_step``), under the profiler where this
    process ``reports`` (rank 0 of a distributed cell; the other ranks run the same steps
    unprofiled, so that their collectives still meet), and return what they show."""
    if spec.profile_steps <= 0:
        return Profile(reason="not asked (profile_steps is 0)")
    if not reports:
        for _ in range(spec.profile_steps):
            run_step()
        _synchronise(device)
        return Profile(reason="profiled on rank 0 only")
    try:
        trace = _profiled_trace(spec.profile_steps, run_step, optimizer, device)
    except Exception as exc:
        _synchronise(device)
        return Profile(reason=f"the profiler could not run: {type(exc).__name__}: {exc}"[:500])
    return _profile_of(spec, trace, device)


def _profile_of(spec: CellSpec, trace_path: Path, device: torch.device) -> Profile:
    activities = "cpu, cuda" if device.type == "cuda" else "cpu"
    try:
        with open(trace_path, encoding="utf-8") as handle:
            parts = breakdown(json.load(handle))
        kept = keep_trace(trace_path, spec.profile_trace) if spec.profile_trace else ""
    except (OSError, ValueError) as exc:
        why = f"the trace could not be read or kept: {type(exc).__name__}: {exc}"[:500]
        return Profile(steps=spec.profile_steps, activities=activities, reason=why)
    finally:
        shutil.rmtree(trace_path.parent, ignore_errors=True)
    notes = list(parts.notes)
    if device.type == "cuda" and parts.timeline != "gpu":
        notes.append("the trace holds no GPU activity (CUPTI unavailable?): the CPU's time")
    if not parts.sums:
        notes.append(
            f"the kinds sum to {parts.sum_error:+.1%} of the step time (tolerance "
            f"{SUM_TOLERANCE:.0%})"
        )
    return Profile(
        profiled=True,
        steps=parts.steps,
        activities=activities,
        timeline=parts.timeline,
        step_time_s=parts.step_time_s,
        time_by_kind_s=parts.time_by_kind_s,
        sum_error=parts.sum_error,
        sums=parts.sums,
        tolerance=SUM_TOLERANCE,
        kernels_per_step=parts.kernels_per_step,
        copies_per_step=parts.copies_per_step,
        ops_by_kind=parts.counts_by_kind,
        other_threads_s=parts.other_threads_s if parts.timeline == "cpu" else None,
        trace=kept,
        notes="; ".join(notes),
    )


def _profiled_trace(
    steps: int, run_step: Callable[[], Any], optimizer: Any, device: torch.device
) -> Path:
    """Run ``steps`` steps under the profiler; the path of their Chrome trace (in a temporary
    directory of its own, which the caller removes)."""
    from torch.profiler import ProfilerActivity, profile, record_function

    activities = [ProfilerActivity.CPU]
    if device.type == "cuda":
        activities.append(ProfilerActivity.CUDA)
    _synchronise(device)
    with (
        _annotated_optimizer(optimizer, record_function),
        profile(activities=activities, record_shapes=False) as profiler,
    ):
        for index in range(steps):
            with record_function(f"{STEP_ANNOTATION}{index}"):
                run_step()
                _synchronise(device)
    directory = Path(tempfile.mkdtemp(prefix="ptspeed-profile-"))
    path = directory / "trace.json"
    try:
        profiler.export_chrome_trace(str(path))
    except BaseException:
        shutil.rmtree(directory, ignore_errors=True)
        raise
    return path


@contextlib.contextmanager
def _annotated_optimizer(optimizer: Any, record_function: Any) -> Iterator[None]:
    """The optimizer's ``step`` inside an :data:`OPTIMIZER_ANNOTATION` range while the
    profiled steps run (an attribute of the instance, removed afterwards)."""
    if optimizer is None or not callable(getattr(optimizer, "step", None)):
        yield
        return
    had_own = "step" in vars(optimizer)
    original = vars(optimizer).get("step")
    bound = optimizer.step

    def step(*args: Any, **kwargs: Any) -> Any:
        with record_function(OPTIMIZER_ANNOTATION):
            return bound(*args, **kwargs)

    optimizer.step = step
    try:
        yield
    finally:
        if had_own:
            optimizer.step = original
        else:
            del optimizer.step


def keep_trace(source: Path, target: str) -> str:
    """Gzip the trace at ``source`` to ``target`` atomically; ``target``."""
    destination = Path(target)
    destination.parent.mkdir(parents=True, exist_ok=True)
    fd, temporary = tempfile.mkstemp(prefix=f".{destination.name}.", dir=destination.parent)
    try:
        with (
            os.fdopen(fd, "wb") as raw,
            gzip.GzipFile(fileobj=raw, mode="wb") as packed,
            open(source, "rb") as handle,
        ):
            shutil.copyfileobj(handle, packed)
        os.chmod(temporary, 0o644)
        os.replace(temporary, destination)
    except BaseException:
        Path(temporary).unlink(missing_ok=True)
        raise
    return str(destination)


def read_trace(path: str | os.PathLike[str]) -> dict[str, Any]:
    """A kept trace's JSON (gzipped or not)."""
    opener = gzip.open if str(path).endswith(".gz") else open
    with opener(path, "rt", encoding="utf-8") as handle:
        return json.load(handle)


def _synchronise(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)
