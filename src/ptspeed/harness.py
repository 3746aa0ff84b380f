"""Run one benchmark cell in this process and return its record.

The order of a cell: build the model and a synthetic batch from the seed; count FLOPs on the
eager fp32 model; apply the variant's knobs; run the warm-up (the first step, which holds
compilation, timed on its own); time the measured steps; then, for any variant other than
eager fp32, rebuild the model from the same initial weights and compare the leading steps
with an eager fp32 run. Any exception becomes a record with a status, never a crash.
"""

from __future__ import annotations

import contextlib
import gc
import math
import resource
import time
import traceback
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from ptspeed import numerics
from ptspeed.knobs import Knobs, parse_knobs, unsupported_reason
from ptspeed.models import Batch, ModelSpec, Sizes, get_model
from ptspeed.provenance import collect, collect_base, python_version
from ptspeed.record import CellSpec, Metrics, Record, utc_now
from ptspeed.steps import batch_supplier, make_step, to_device
from ptspeed.timing import make_timer, timed_loop

WRONG_OUTPUT_SCALE = 1.1
KIB = 1024
TRACEBACK_LINES_KEPT = 25


class Unsupported(Exception):
    """This torch or device cannot run the cell; the message says why."""


@dataclass
class VariantRun:
    metrics: Metrics
    leading_values: list[Any]


class SingleProcess:
    """How the cell takes part: alone in this process. :class:`ptspeed.distributed.Rank` is
    the same interface for one process of a ddp/fsdp cell."""

    reports = True  # whether this process checks numerics (rank 0 only)

    def device(self, requested: str) -> torch.device:
        return resolve_device(requested)

    def threads(self, requested: int) -> int:
        return requested

    def fault(self, fault: str) -> str:
        return fault

    def wrap(self, model: Any, knobs: Knobs, device: torch.device) -> tuple[Any, Knobs]:
        """The model to step and the knobs still to apply to it (see steps.make_step)."""
        if knobs.parallel:
            raise RuntimeError(f"{knobs.parallel} runs under torchrun (ptspeed.runner), not alone")
        return model, knobs

    def barrier(self) -> None:
        """Nothing to wait for."""

    def combine(self, metrics: Metrics) -> Metrics:
        return metrics


def run_cell(spec: CellSpec, placement: SingleProcess | None = None) -> Record:
    """Run ``spec`` here and return its record, whatever happens."""
    record = Record(cell=spec, status="ok", started_at=utc_now())
    begun = time.perf_counter()
    try:
        _run(spec, record, placement or SingleProcess())
    except Unsupported as exc:
        record.status, record.reason = "unsupported", str(exc)
    except BaseException as exc:
        if isinstance(exc, KeyboardInterrupt):
            raise
        record.status = "oom" if is_out_of_memory(exc) else "failed"
        record.reason = _describe(exc, spec)
        record.detail = _traceback_tail(exc)
    record.finished_at = utc_now()
    record.duration_s = time.perf_counter() - begun
    return record


def _run(spec: CellSpec, record: Record, placement: SingleProcess) -> None:
    record.provenance = collect_base()
    device = placement.device(spec.device)
    threads = placement.threads(spec.threads)
    if threads:
        torch.set_num_threads(threads)
    record.provenance = collect(torch, device)
    knobs = parse_knobs(spec.knobs)
    model_spec = get_model(spec.model)
    reason = unsupported_reason(
        knobs, device.type, torch_version(), python_version(), model_spec.image_model
    )
    if reason:
        raise Unsupported(reason)
    if knobs.memory_fraction is not None:
        torch.cuda.set_per_process_memory_fraction(knobs.memory_fraction, device)
    sizes = Sizes(spec.batch_size, spec.image_size, spec.seq_len)
    host_batch = model_spec.make_batch(sizes, torch.Generator().manual_seed(spec.seed))
    model = _build(model_spec, sizes, spec.seed, device)
    initial_state = {k: v.detach().to("cpu", copy=True) for k, v in model.state_dict().items()}
    flops = count_flops_per_sample(model_spec, model, host_batch, spec.mode, device)
    model.load_state_dict(initial_state)

    run = _measure_variant(spec, model_spec, model, knobs, host_batch, device, placement)
    record.metrics = run.metrics
    if flops is not None and run.metrics.throughput_samples_per_s:
        record.metrics.flops_per_sample = flops
        record.metrics.achieved_flops_per_s = flops * run.metrics.throughput_samples_per_s
    del model
    _release_memory(device)
    if not placement.reports:
        return
    record.numerics = _check_numerics(
        spec, model_spec, knobs, host_batch, initial_state, run, device
    )
    if record.numerics.passed is False:
        record.status = "numerics_mismatch"
        record.reason = numerics.mismatch_reason(record.numerics)


def _build(model_spec: ModelSpec, sizes: Sizes, seed: int, device: torch.device) -> Any:
    torch.manual_seed(seed)
    return model_spec.build(sizes).to(device)


def _measure_variant(
    spec: CellSpec,
    model_spec: ModelSpec,
    model: Any,
    knobs: Knobs,
    host_batch: Batch,
    device: torch.device,
    placement: SingleProcess,
) -> VariantRun:
    scale = WRONG_OUTPUT_SCALE if spec.fault == "numerics" else 1.0
    model, step_knobs = placement.wrap(model, knobs, device)
    step = make_step(model_spec, model, step_knobs, spec.mode, device, output_scale=scale)
    total_steps = spec.warmup_steps + spec.measured_steps
    next_batch = batch_supplier(host_batch, knobs, device, total_steps)
    _reset_peak_memory(device)
    # The steps draw random numbers (dropout, detection samplers): start them from the same
    # state as the eager references, whatever FLOP counting and the loader drew before.
    torch.manual_seed(spec.seed)

    timer = make_timer(torch, device)
    placement.barrier()
    timer.begin()
    _inject_fault(placement.fault(spec.fault))
    first_output = step(next_batch())
    timer.end()
    first_step_s = timer.result().wall_s
    leading = [_numerics_value(first_output, spec.mode)]
    for index in range(1, spec.warmup_steps):
        output = step(next_batch())
        if index < spec.numerics_steps:
            leading.append(_numerics_value(output, spec.mode))
    timer.end()
    warmup_s = timer.result().wall_s

    placement.barrier()
    timing, last_output = timed_loop(
        make_timer(torch, device), lambda: step(next_batch()), spec.measured_steps
    )
    memory_bytes, memory_kind = _peak_memory(device)
    metrics = Metrics(
        throughput_samples_per_s=timing.throughput(spec.batch_size),
        measured_wall_s=timing.wall_s,
        step_time_p50_s=timing.p50_s,
        step_time_p90_s=timing.p90_s,
        step_time_mean_s=timing.mean_s,
        step_times_s=timing.step_times_s,
        first_step_s=first_step_s,
        warmup_s=warmup_s,
        peak_memory_bytes=memory_bytes,
        memory_kind=memory_kind,
        batch_size_per_process=spec.batch_size,
    )
    metrics = placement.combine(metrics)
    if spec.mode == "train":
        metrics.loss_first = finite_or_none(leading[0])
        metrics.loss_last = finite_or_none(float(last_output.float().item()))
    return VariantRun(metrics=metrics, leading_values=leading[: spec.numerics_steps])


def _numerics_value(output: Any, mode: str) -> Any:
    """What the numerics check compares: the loss (train) or a detached fp32 output (infer)."""
    if mode == "train":
        return float(output.double().item())  # not .float(): keep the fp64 run exact
    if isinstance(output, torch.Tensor):
        return output.detach().double().cpu()
    return None


def _check_numerics(
    spec: CellSpec,
    model_spec: ModelSpec,
    knobs: Knobs,
    host_batch: Batch,
    initial_state: dict[str, Any],
    run: VariantRun,
    device: torch.device,
) -> numerics.NumericsCheck:
    if knobs.is_eager_fp32 and not spec.fault:
        return numerics.not_checked("eager fp32 is the reference itself")
    if spec.numerics_steps == 0:
        return numerics.not_checked("numerics_steps is 0")
    if spec.mode == "infer" and model_spec.ragged_output:
        return numerics.not_checked("outputs have data-dependent shapes (detections)")

    def eager(dtype: torch.dtype, rng_seed: int = spec.seed) -> list[Any]:
        return _eager_values(spec, model_spec, host_batch, initial_state, device, dtype, rng_seed)

    fp32 = eager(torch.float32)
    try:
        fp64 = eager(torch.float64)
    except Exception:
        fp64 = None
    # A compiled graph draws its own dropout masks: eager under another seed shows how much
    # the loss moves with the masks alone. Inference runs in eval mode, without dropout.
    reseeded = eager(torch.float32, spec.seed + 1) if spec.mode == "train" else None
    precision = knobs.precision(device.type)
    return numerics.compare(run.leading_values, fp32, fp64, precision, spec.mode, reseeded)


def _eager_values(
    spec: CellSpec,
    model_spec: ModelSpec,
    host_batch: Batch,
    initial_state: dict[str, Any],
    device: torch.device,
    dtype: torch.dtype,
    rng_seed: int,
) -> list[Any]:
    """The leading steps' values of an eager run in ``dtype`` from the cell's initial state,
    random ops (dropout) seeded with ``rng_seed``."""
    sizes = Sizes(spec.batch_size, spec.image_size, spec.seq_len)
    model = _build(model_spec, sizes, spec.seed, device)
    model.load_state_dict(initial_state)
    model.to(dtype)
    step = make_step(model_spec, model, Knobs(), spec.mode, device)
    batch = {
        name: tensor.to(dtype) if tensor.is_floating_point() else tensor
        for name, tensor in to_device(host_batch, device, channels_last=False).items()
    }
    torch.manual_seed(rng_seed)  # with spec.seed: the state the variant's steps start from
    try:
        return [_numerics_value(step(batch), spec.mode) for _ in range(spec.numerics_steps)]
    finally:
        del model, step, batch
        _release_memory(device)


def count_flops_per_sample(
    model_spec: ModelSpec, model: Any, host_batch: Batch, mode: str, device: torch.device
) -> float | None:
    """FLOPs of one eager fp32 step per sample, where this torch can count them (>= 2.1)."""
    try:
        from torch.utils.flop_counter import FlopCounterMode
    except ImportError:
        return None
    batch = to_device(host_batch, device, channels_last=False)
    batch_size = len(next(iter(batch.values())))
    model.train(mode == "train")
    try:
        with FlopCounterMode(display=False) as counter:
            if mode == "train":
                model_spec.loss(model, batch).backward()
            else:
                with torch.no_grad():
                    model_spec.infer(model, batch)
    except Exception:
        return None
    finally:
        model.zero_grad(set_to_none=True)
    return counter.get_total_flops() / batch_size


def resolve_device(requested: str) -> torch.device:
    if requested == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    if requested.startswith("cuda") and not torch.cuda.is_available():
        raise Unsupported("device cuda requested but torch sees no CUDA device")
    return torch.device(requested)


def torch_version() -> tuple[int, int]:
    major, minor = torch.__version__.split(".")[:2]
    return int(major), int("".join(ch for ch in minor if ch.isdigit()) or 0)


def is_out_of_memory(exc: BaseException) -> bool:
    oom_type = getattr(torch.cuda, "OutOfMemoryError", None)
    if isinstance(exc, MemoryError) or (oom_type is not None and isinstance(exc, oom_type)):
        return True
    message = str(exc).lower()
    return "out of memory" in message or "can't allocate memory" in message


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


def _reset_peak_memory(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)
        torch.cuda.reset_peak_memory_stats(device)
        return
    # Writing 5 to clear_refs resets the kernel's peak RSS (VmHWM) to the current RSS.
    with contextlib.suppress(OSError):
        Path("/proc/self/clear_refs").write_text("5", encoding="ascii")


def _peak_memory(device: torch.device) -> tuple[int | None, str]:
    if device.type == "cuda":
        return torch.cuda.max_memory_allocated(device), "cuda_allocator_peak"
    try:
        for line in Path("/proc/self/status").read_text(encoding="ascii").splitlines():
            if line.startswith("VmHWM:"):
                return int(line.split()[1]) * KIB, "process_peak_rss"
    except OSError:
        pass
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * KIB, "process_peak_rss"


def _release_memory(device: torch.device) -> None:
    gc.collect()
    if device.type == "cuda":
        torch.cuda.empty_cache()


def _describe(exc: BaseException, spec: CellSpec) -> str:
    message = " ".join(str(exc).split())[:500] or type(exc).__name__
    if is_out_of_memory(exc):
        return f"out of memory at batch_size {spec.batch_size}: {message}"
    return f"{type(exc).__name__}: {message}"


def _traceback_tail(exc: BaseException) -> str:
    lines = traceback.format_exception(type(exc), exc, exc.__traceback__)
    return "".join(lines)[-TRACEBACK_LINES_KEPT * 120 :]


def finite_or_none(value: float | None) -> float | None:
    return value if value is not None and math.isfinite(value) else None
