"""Where a profiled step's time goes: the events of a torch.profiler trace, by kind of work.

Pure (the standard library only): it reads the events of a Chrome trace as
``torch.profiler``'s ``export_chrome_trace`` writes them (the same layout in torch 1.13.1,
2.0.1 and today: ``cpu_op`` / ``user_annotation`` events on the CPU threads; ``kernel`` /
``Kernel``, ``gpu_memcpy`` / ``Memcpy``, ``gpu_memset`` / ``Memset`` on the GPU, each kernel
tied by its ``correlation`` to the ``cuda_runtime`` / ``Runtime`` call that launched it).

Each profiled step runs inside a :data:`STEP_ANNOTATION` range
(:mod:`ptspeed.cell.measurement.profiling`); the step time is the mean duration of those ranges.
Two partitions of it, one per timeline:

* **CPU** (a cell on the CPU): the events of the thread that ran the steps form a tree
  (nesting by time). Every event's *self* time (its duration minus its children's) goes to one
  kind: its own name's (:func:`~ptspeed.cell.measurement.work_kinds.classify_op`), or, for a
  name that says nothing (an allocation, a view), the kind of the op it runs inside; inside the
  optimizer's step everything is ``optimizer``; inside a compiled region (Inductor's generated
  code, whose fused C++ kernels the profiler does not record one by one) what is not an op of
  its own is ``compiled``. The step range's own self time (Python and the framework between
  ops) is ``host``. Self times telescope: the kinds sum to the step time exactly when the
  events nest properly; :data:`SUM_TOLERANCE` bounds what rounding and ill-nested events may
  leave.
* **GPU** (a cell on CUDA): each kernel, copy and memset inside a step range goes to a kind
  by its name (:func:`~ptspeed.cell.measurement.work_kinds.classify_kernel`), or by the op
  that launched it where its name says nothing (and ``optimizer`` when launched inside the
  optimizer's step). Overlapping device work is counted once (the earlier-starting one keeps
  the overlap); the time the GPU does nothing inside the range is ``idle`` (host overhead: a
  launch-bound step). The kinds sum to the step time by construction, but for events that
  cross the range's ends.

Counts per step: on the CPU the leaf ops (ops that call no other op) by kind, on CUDA the
kernels and copies by kind.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from ptspeed.cell.measurement.work_kinds import KINDS, classify_kernel, classify_op

STEP_ANNOTATION = "ptspeed.profiled_step#"
# torch 2.0.1's torch.compile loses torch's own profiling hook on the optimizer's step
# (work_kinds.OPTIMIZER_PREFIX), so the profiled steps also wrap it in OPTIMIZER_ANNOTATION.
OPTIMIZER_ANNOTATION = "Optimizer.step#ptspeed"
# Relative difference allowed between the kinds' sum and the step time.
SUM_TOLERANCE = 0.01

_GPU_CATEGORIES = ("kernel", "gpu_memcpy", "memcpy", "gpu_memset", "memset")
_RUNTIME_CATEGORIES = ("cuda_runtime", "runtime", "cuda_driver")
_CPU_CATEGORIES = ("cpu_op", "user_annotation", "operator", "cpu_instant_event")


@dataclass
class Breakdown:
    """One profiled run's step time by kind (seconds per step) and its counts per step."""

    timeline: str  # "cpu" or "gpu": which partition the kinds are
    steps: int
    step_time_s: float
    time_by_kind_s: dict[str, float]
    counts_by_kind: dict[str, float]
    kernels_per_step: float  # GPU kernels; on the CPU leaf ops that compute (not "host")
    copies_per_step: float
    other_threads_s: float = 0.0  # CPU: op time per step on other threads (not in the kinds)
    notes: list[str] = field(default_factory=list)

    @property
    def sum_error(self) -> float:
        """(sum of the kinds − step time) / step time."""
        total = sum(self.time_by_kind_s.values())
        return (total - self.step_time_s) / self.step_time_s if self.step_time_s > 0 else 0.0

    @property
    def sums(self) -> bool:
        return abs(self.sum_error) <= SUM_TOLERANCE


@dataclass
class _Event:
    name: str
    category: str
    start: float  # microseconds
    end: float
    thread: Any
    args: Mapping[str, Any]
    parent: _Event | None = None
    children: list[_Event] = field(default_factory=list)
    kind: str = "other"
    own: str | None = None  # the kind its own name says
    in_optimizer: bool = False
    in_compiled: bool = False

    @property
    def duration(self) -> float:
        return self.end - self.start


def trace_events(trace: Mapping[str, Any] | Sequence[Any]) -> list[Mapping[str, Any]]:
    """The complete ("X") events of a Chrome trace (its ``traceEvents``, or a list of them)."""
    events = trace.get("traceEvents", []) if isinstance(trace, Mapping) else trace
    return [e for e in events if isinstance(e, Mapping) and e.get("ph") == "X" and "dur" in e]


def breakdown(trace: Mapping[str, Any] | Sequence[Any]) -> Breakdown:
    """The step time by kind of a trace whose steps ran in :data:`STEP_ANNOTATION` ranges:
    the GPU partition where the trace has device events, else the CPU one. Raises
    ``ValueError`` for a trace without a step range."""
    events = [_event(e) for e in trace_events(trace)]
    # The CPU's ranges (torch >= 2.0 also draws each on the GPU's timeline, gpu_user_annotation).
    steps = [
        e for e in events if e.name.startswith(STEP_ANNOTATION) and e.category in _CPU_CATEGORIES
    ]
    if not steps:
        raise ValueError(f"the trace has no {STEP_ANNOTATION}N range")
    steps.sort(key=lambda e: e.start)
    step_thread = steps[0].thread
    cpu = [e for e in events if e.category in _CPU_CATEGORIES or e.category in _RUNTIME_CATEGORIES]
    for thread in {e.thread for e in cpu}:
        _nest([e for e in cpu if e.thread == thread])
    gpu = [e for e in events if e.category in _GPU_CATEGORIES]
    if gpu:
        return _gpu_breakdown(steps, cpu, gpu)
    return _cpu_breakdown(steps, [e for e in cpu if e.thread == step_thread], cpu, step_thread)


def _event(raw: Mapping[str, Any]) -> _Event:
    start = float(raw.get("ts", 0.0))
    args = raw.get("args") if isinstance(raw.get("args"), Mapping) else {}
    return _Event(
        name=str(raw.get("name", "")),
        category=str(raw.get("cat", "")).lower(),
        start=start,
        end=start + float(raw.get("dur", 0.0)),
        thread=(raw.get("pid"), raw.get("tid")),
        args=args,
    )


def _nest(events: list[_Event]) -> None:
    """Give each event of one thread its parent (the innermost event that holds its start) and
    its kind."""
    events.sort(key=lambda e: (e.start, -e.duration))
    stack: list[_Event] = []
    for event in events:
        while stack and stack[-1].end <= event.start:
            stack.pop()
        parent = stack[-1] if stack else None
        if parent is not None:
            event.parent = parent
            parent.children.append(event)
        _set_kind(event)
        stack.append(event)


def _set_kind(event: _Event) -> None:
    parent = event.parent
    event.in_optimizer = bool(parent and parent.in_optimizer)
    event.in_compiled = bool(parent and parent.in_compiled)
    own = classify_op(event.name)
    if event.name.startswith(STEP_ANNOTATION):
        own = "host"
    if own == "optimizer":
        event.in_optimizer = True
    if own == "compiled":
        event.in_compiled = True
    if event.category in _RUNTIME_CATEGORIES:
        own = None  # a launch counts as the op that launches
    event.own = own
    if event.in_optimizer:
        event.kind = "optimizer"
    elif event.in_compiled and own in (None, "host"):
        event.kind = "compiled"
    elif own is not None:
        event.kind = own
    else:
        event.kind = parent.kind if parent is not None else "other"


def _self_time(event: _Event) -> float:
    inside = sum(min(c.end, event.end) - c.start for c in event.children)
    return max(0.0, event.duration - inside)


def _within(event: _Event, ranges: Sequence[_Event]) -> bool:
    return any(r.start <= event.start < r.end for r in ranges)


def _cpu_breakdown(
    steps: Sequence[_Event], thread_events: Sequence[_Event], cpu: Sequence[_Event], thread: Any
) -> Breakdown:
    count = len(steps)
    step_time_us = sum(s.duration for s in steps) / count
    times = dict.fromkeys(KINDS, 0.0)
    counts = dict.fromkeys(KINDS, 0.0)
    notes = []
    for step in steps:
        for event in _subtree(step):
            times[event.kind] += _self_time(event) / 1e6 / count
            if _counted(event):
                counts[event.kind] += 1.0 / count
    outside = [e for e in thread_events if e.parent is None and e not in steps]
    overlapping = [e for e in outside if _within(e, steps)]
    if overlapping:
        notes.append(f"{len(overlapping)} events cross a step range's start")
    elsewhere = [e for e in cpu if e.thread != thread and e.parent is None and _within(e, steps)]
    other_threads_s = sum(e.duration for e in elsewhere) / 1e6 / count
    compute = sum(v for k, v in counts.items() if k != "host")
    return Breakdown(
        timeline="cpu",
        steps=count,
        step_time_s=step_time_us / 1e6,
        time_by_kind_s=_nonzero(times, keep=("host",)),
        counts_by_kind=_rounded(_nonzero(counts)),
        kernels_per_step=round(compute, 3),
        copies_per_step=round(counts["copy"], 3),
        other_threads_s=other_threads_s,
        notes=notes,
    )


def _counted(event: _Event) -> bool:
    """Whether an event counts as one op of its kind: an op whose name says what work it does
    (not a view, an allocation or bookkeeping) and that calls no op saying the same (``relu``
    counts once, as its ``clamp_min``), or the innermost call into a compiled region (whose
    fused kernels the profiler does not see one by one)."""
    if event.own in (None, "host"):
        return False
    if event.own != "compiled" and event.category not in ("cpu_op", "operator"):
        return False
    return all(d.own != event.own for c in event.children for d in _subtree(c))


def _subtree(root: _Event) -> Iterable[_Event]:
    pending = [root]
    while pending:
        event = pending.pop()
        yield event
        pending.extend(event.children)


def _gpu_breakdown(
    steps: Sequence[_Event], cpu: Sequence[_Event], gpu: Sequence[_Event]
) -> Breakdown:
    count = len(steps)
    launches = {
        e.args.get("correlation"): e
        for e in cpu
        if e.category in _RUNTIME_CATEGORIES and e.args.get("correlation") is not None
    }
    times = dict.fromkeys(KINDS, 0.0)
    counts = dict.fromkeys(KINDS, 0.0)
    kernels = copies = 0
    for step in steps:
        inside = sorted(
            (e for e in gpu if e.end > step.start and e.start < step.end), key=lambda e: e.start
        )
        covered_until = step.start
        busy = 0.0
        for event in inside:
            kind = _device_kind(event, launches.get(event.args.get("correlation")))
            start, end = max(event.start, covered_until), min(event.end, step.end)
            if end > start:
                times[kind] += (end - start) / 1e6 / count
                busy += end - start
                covered_until = end
            counts[kind] += 1.0 / count
            if event.category == "kernel":
                kernels += 1
            if kind == "copy":
                copies += 1
        times["idle"] += max(0.0, step.duration - busy) / 1e6 / count
    return Breakdown(
        timeline="gpu",
        steps=count,
        step_time_s=sum(s.duration for s in steps) / count / 1e6,
        time_by_kind_s=_nonzero(times, keep=("idle",)),
        counts_by_kind=_rounded(_nonzero(counts)),
        kernels_per_step=kernels / count,
        copies_per_step=copies / count,
    )


def _device_kind(event: _Event, launch: _Event | None) -> str:
    """A GPU event's kind: the optimizer's where the optimizer launched it, else what its name
    says, else what the op that launched it computes (an ``aten::mm`` inside a compiled region
    launches a GEMM), else compiler-generated inside a compiled region."""
    if launch is not None and launch.in_optimizer:
        return "optimizer"
    kind = classify_kernel(event.name, event.category)
    if kind is None and launch is not None:
        kind = _launcher_kind(launch) or ("compiled" if launch.in_compiled else launch.kind)
    return kind if kind is not None and kind != "host" else "other"


def _launcher_kind(launch: _Event) -> str | None:
    """The kind of the innermost op around a launch whose name says what it computes; None
    where a compiled region (or nothing) comes first."""
    op = launch.parent
    while op is not None and op.own in (None, "host"):
        op = op.parent
    return op.own if op is not None and op.own != "compiled" else None


def _rounded(counts: Mapping[str, float]) -> dict[str, float]:
    return {kind: round(value, 3) for kind, value in counts.items()}


def _nonzero(values: Mapping[str, float], keep: Sequence[str] = ()) -> dict[str, float]:
    return {k: v for k, v in values.items() if v > 0 or k in keep}
