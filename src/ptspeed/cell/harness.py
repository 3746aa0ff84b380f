"""Run one benchmark cell in this process and return its record.

The order of a cell: refuse a GPU that the build has no code for (:mod:`ptspeed.cell.gpu_code`);
build the model and a synthetic batch from the seed; apply the variant's
process-wide switches (TF32, cuDNN autotuning, memory fraction); start the device's libraries
the same way in every torch version; warm up (the first step, which holds compilation, timed
on its own; then the knob's one-off calls, the check steps and any step that still compiles,
all before the measured window); time the measured steps; count FLOPs on a meta-device copy;
then run eager fp64 and fp32 steps from the check steps' snapshots and judge the variant
(:mod:`ptspeed.cell.measurement.reference`, :mod:`ptspeed.cell.measurement.numerics`). Any
exception becomes a record with a status, never a crash.
"""

from __future__ import annotations

import dataclasses
import math
import time
import traceback
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import torch

from ptspeed.cell.device import (
    apply_backend_settings,
    peak_memory,
    prepare_device,
    reset_peak_memory,
    resolve_device,
    torch_version,
    use_compiler_cache,
)
from ptspeed.cell.faults import SLOW_SAMPLING, SLOW_SAMPLING_S, slowed_steps, window_load
from ptspeed.cell.gpu_code import device_reason
from ptspeed.cell.measurement import conditions, numerics, probe, profiling
from ptspeed.cell.measurement.memory import is_out_of_memory
from ptspeed.cell.measurement.reference import (
    CheckCapture,
    Snapshot,
    check_numerics,
    host_copy,
    loss_scale,
    momentum_buffers,
)
from ptspeed.cell.measurement.timing import make_timer, timed_loop
from ptspeed.cell.measurement.warmup import Warmup, WarmupPlan, loss_of, warm_up
from ptspeed.cell.provenance import collect, collect_base, note_backend_settings, python_version
from ptspeed.cell.record import CellSpec, Conditions, Metrics, Profile, Record, utc_now
from ptspeed.cell.steps import (
    Step,
    batch_supplier,
    build_model,
    make_step,
    release_memory,
    to_device,
)
from ptspeed.cell.variants import compiler
from ptspeed.cell.variants.knobs import Knobs, parse_knobs, unsupported_for_model
from ptspeed.errors import Unsupported
from ptspeed.models import Batch, ModelSpec, Sizes, check_spec_sizes, get_model

WRONG_OUTPUT_SCALE = 1.1
OUTPUT_FAULTS = ("numerics", "late")  # faults that change a step's returned value
TRACEBACK_LINES_KEPT = 25
GATE_IN_FIRST_TRIAL = "checked in the cell's first trial (the same seeded computation)"


@dataclass
class VariantRun:
    metrics: Metrics
    checks: list[tuple[Snapshot, numerics.StepValues]]
    check_from: int
    conditions: Conditions
    runs_cudnn: bool = False  # what the precision label depends on (cell_precision)
    profile: Profile | None = None


class SingleProcess:
    """How the cell takes part: alone in this process.
    :class:`ptspeed.cell.parallelism.distributed.Rank` is the same interface for one process of a
    ddp/fsdp cell."""

    reports = True  # whether this process checks numerics (rank 0 only)

    def device(self, requested: str) -> torch.device:
        return resolve_device(requested)

    def threads(self, requested: int) -> int:
        return requested

    def fault(self, fault: str) -> str:
        return fault

    def wrap(
        self, model: Any, knobs: Knobs, device: torch.device, blocks: tuple[str, ...] = ()
    ) -> tuple[Any, Knobs]:
        """The model to step and the knobs still to apply to it (see steps.make_step);
        ``blocks``: class names of the model's repeated blocks (units of FSDP)."""
        if knobs.parallel:
            raise RuntimeError(
                f"{knobs.parallel} runs under torchrun (ptspeed.launch.watchdog), not alone"
            )
        return model, knobs

    def make_step(
        self,
        model_spec: ModelSpec,
        model: Any,
        knobs: Knobs,
        mode: str,
        device: torch.device,
        fault: str = "",
    ) -> Step:
        """The step of the wrapped model (:func:`ptspeed.cell.steps.make_step`); a stage of a
        modelpar/pipeline cell has its own (:mod:`ptspeed.cell.parallelism.stages`)."""
        return make_step(model_spec, model, knobs, mode, device, fault=fault)

    def momentum(self, optimizer: torch.optim.Optimizer | None) -> list[torch.Tensor | None]:
        """The optimizer's momentum buffers on the host, in the model's parameter order."""
        return momentum_buffers(optimizer)

    def reported_output(self, sample: Any) -> Any:
        """An inference output's sample as the reporting process sees it."""
        return sample

    def barrier(self) -> None:
        """Nothing to wait for."""

    def full_state(self, model: Any) -> dict[str, Any]:
        """The model's parameters and buffers by name, copied to the host."""
        return host_copy(model.state_dict().items())

    def gradients(self, model: Any) -> dict[str, Any] | None:
        """The parameters' gradients by name, copied to the host."""
        return host_copy((n, p.grad) for n, p in model.named_parameters() if p.grad is not None)

    def combine(self, metrics: Metrics) -> Metrics:
        return metrics

    def combine_telemetry(self, conditions: Conditions) -> Conditions:
        """The window's telemetry over every process of the cell: this one's."""
        return conditions


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
    no_code = device_reason(torch, device, spec.fault)  # else "no kernel image" at the first step
    if no_code:
        raise Unsupported(no_code)
    knobs = parse_knobs(spec.knobs)
    model_spec = get_model(spec.model_reference, spec.shape)
    versions = torch_version(), python_version()
    reason = unsupported_for_model(knobs, device.type, *versions, model_spec)
    if reason:
        raise Unsupported(reason)
    apply_backend_settings(knobs, device)
    note_backend_settings(record.provenance, torch, device)  # what the cell ran with
    cache = use_compiler_cache(spec, knobs)
    sizes = Sizes(spec.batch_size, spec.image_size, spec.seq_len)
    check_spec_sizes(model_spec, sizes)
    host_batch = model_spec.make_batch(sizes, torch.Generator().manual_seed(spec.seed))
    model = build_model(model_spec, sizes, spec.seed, device, knobs.attn)
    prepare_device(device)
    if knobs.compile_mode is not None:
        compiler.reset()
    run = _measure_variant(spec, model_spec, model, knobs, host_batch, device, placement)
    record.metrics = run.metrics
    record.metrics.compiler_cache = cache
    record.conditions = run.conditions
    record.profile = run.profile
    if knobs.compile_mode is not None:
        record.metrics = dataclasses.replace(record.metrics, **compiler.collect())
    del model
    release_memory(device)
    if not placement.reports:
        return
    flops = count_flops_per_sample(model_spec, sizes, host_batch, spec.mode, device, knobs.attn)
    if flops is not None and run.metrics.throughput_samples_per_s:
        record.metrics.flops_per_sample = flops
        record.metrics.achieved_flops_per_s = flops * run.metrics.throughput_samples_per_s
    record.numerics = _guarded_numerics(spec, model_spec, knobs, host_batch, run, device)
    if record.numerics.passed is False:
        record.status = "numerics_mismatch"
        record.reason = numerics.mismatch_reason(record.numerics)


def _measure_variant(
    spec: CellSpec,
    model_spec: ModelSpec,
    model: Any,
    knobs: Knobs,
    host_batch: Batch,
    device: torch.device,
    placement: SingleProcess,
) -> VariantRun:
    parameter_names = [name for name, _ in model.named_parameters()]
    attention = model_spec.attention(model) if model_spec.attention else ""
    model, step_knobs = placement.wrap(model, knobs, device, model_spec.blocks)
    fault = placement.fault(spec.fault)
    step = placement.make_step(model_spec, model, step_knobs, spec.mode, device, fault=fault)
    capture = CheckCapture(
        model,
        step,
        placement,
        spec.mode,
        device,
        parameter_names,
        copies=not spec.numerics_by_first_trial,
    )
    plan = WarmupPlan.of(spec, step.one_off_calls, checks=_wants_check(spec, knobs))
    next_batch = batch_supplier(host_batch, knobs, device, plan.longest + spec.measured_steps + 1)
    reset_peak_memory(device)
    # The steps draw random numbers (dropout, detection samplers): start them from the same
    # state as the eager references, whatever the loader drew before.
    torch.manual_seed(spec.seed)

    def run_step(index: int) -> Any:
        return faulty_output(step(next_batch()), fault, index, plan.checked_until)

    timer = make_timer(torch, device)
    placement.barrier()
    warmup = warm_up(plan, run_step, capture, timer, fault, placement.barrier)
    placement.barrier()
    indices = iter(range(warmup.steps_run, warmup.steps_run + spec.measured_steps + 1))

    def measured_step() -> Any:
        if fault in OUTPUT_FAULTS:
            return run_step(next(indices))
        return step(next_batch())  # nothing else on the timed path of a real cell

    measured_step = slowed_steps(measured_step, fault)  # itself but for the slow-step fault
    # Only train mode's late check reads a kept output: an infer cell keeps none, whose copy
    # (a whole output, inside the window) would count in its peak memory.
    late_position = plan.late_index - warmup.steps_run if spec.mode == "train" else -1
    with window_load(fault):
        if fault == SLOW_SAMPLING:
            time.sleep(SLOW_SAMPLING_S)
        scale_before = loss_scale(step)  # reads the device: before the window
        # The machine's speed just outside the window, its buffers kept out of the peak memory.
        warmup_peak = peak_memory(device)
        probe_before = probe.measure(device) if placement.reports else None
        reset_peak_memory(device)
        window = conditions.begin(device)  # samples outside the timed loop, at both ends
        # Every rank has sampled (a /proc scan, nvidia-smi: up to a second, unequal): the
        # clocks start together, or the early ranks' first step would wait out the others.
        placement.barrier()
        timer = make_timer(torch, device)
        timing, last_output, late_output = timed_loop(
            timer, measured_step, spec.measured_steps, keep=late_position, edges=window
        )
        window_conditions = window.end()
        scale_after = loss_scale(step)
        window_peak = peak_memory(device)
        probe_after = probe.measure(device) if placement.reports else None
    probe.note(window_conditions, probe_before, probe_after)
    memory_bytes, memory_kind = probe.larger_peak(warmup_peak, window_peak)
    # Read before the post-window step, which a CUDA graph's replay writes over the outputs.
    losses = (
        _losses(warmup, last_output, late_output, plan.late_index) if spec.mode == "train" else {}
    )
    checks = warmup.checks
    if plan.check_count and capture.copies:
        # One more step, after the measured window, checked from its own snapshot: a variant
        # that went wrong during the measurement (a recompilation mid-run) is caught here.
        checks = [*checks, *_checked_step(capture, run_step, next(indices))]
    # Last of all: a few steps under the profiler, after everything that reads the window.
    profile = profiling.profile_steps(
        spec, lambda: step(next_batch()), step.optimizer, device, placement.reports
    )
    placement.barrier()
    metrics = Metrics(
        throughput_samples_per_s=timing.throughput(spec.batch_size),
        measured_wall_s=timing.wall_s,
        step_time_p50_s=timing.p50_s,
        step_time_mean_s=timing.mean_s,
        step_time_p90_s=timing.p90_s,
        step_times_s=timing.step_times_s,
        first_step_s=warmup.first_step_s,
        warmup_s=warmup.wall_s,
        warmup_steps_run=warmup.steps_run,
        one_off_steps=warmup.one_off_steps,
        peak_memory_bytes=memory_bytes,
        memory_kind=memory_kind,
        batch_size_per_process=spec.batch_size,
        fsdp_wrap_policy=getattr(placement, "wrap_policy", ""),
        attn_implementation=attention,
    )
    metrics = dataclasses.replace(
        placement.combine(metrics), **losses, **_scaler_skips(scale_before, scale_after)
    )
    window_conditions = placement.combine_telemetry(window_conditions)
    return VariantRun(
        metrics, checks, plan.check_from, window_conditions, runs_cudnn(model), profile
    )


def _scaler_skips(before: float | None, after: float | None) -> dict[str, Any]:
    """GradScaler's scale around the window and the steps it skipped there (each skip halves
    the scale; a growth, once per 2000 good steps, would hide one: a lower bound)."""
    if before is None or after is None or before <= 0 or after <= 0:
        return {}
    skipped = max(0, round(math.log2(before / after)))
    return {"amp_scale_before": before, "amp_scale_after": after, "amp_skipped_steps": skipped}


def _losses(warmup: Warmup, last_output: Any, late_output: Any, late_index: int) -> dict[str, Any]:
    """The train-mode loss metrics: the first, the last and the late check's (the loss of step
    ``late_index``, from the warm-up or the measured window); a non-finite one named apart."""
    last_loss = loss_of(last_output)
    late_loss = warmup.late_loss if late_index < warmup.steps_run else loss_of(late_output)
    losses = (warmup.first_loss, last_loss, late_loss)
    return {
        "loss_first": finite_or_none(warmup.first_loss),
        "loss_last": finite_or_none(last_loss),
        "late_loss": finite_or_none(late_loss),
        "late_loss_step": late_index + 1,
        "non_finite_loss": next(
            (str(x) for x in losses if x is not None and not math.isfinite(x)), ""
        ),
    }


def _wants_check(spec: CellSpec, knobs: Knobs) -> bool:
    return spec.numerics_steps > 0 and not (knobs.is_eager_fp32 and not spec.fault)


def _checked_step(
    capture: CheckCapture, run_step: Callable[[int], Any], index: int
) -> list[tuple[Snapshot, numerics.StepValues]]:
    snapshot = capture.before()
    values = capture.after(snapshot, run_step(index))
    return [] if values is None else [(snapshot, values)]


def faulty_output(output: Any, fault: str, index: int, checked_until: int) -> Any:
    """The step's output, made wrong by the ``numerics`` fault (every step) or the ``late``
    fault (every step after the check steps): tests of the suite only."""
    wrong = fault == OUTPUT_FAULTS[0] or (fault == OUTPUT_FAULTS[1] and index >= checked_until)
    if wrong and isinstance(output, torch.Tensor):
        return output * WRONG_OUTPUT_SCALE
    return output


def _guarded_numerics(
    spec: CellSpec,
    model_spec: ModelSpec,
    knobs: Knobs,
    host_batch: Batch,
    run: VariantRun,
    device: torch.device,
) -> numerics.NumericsCheck:
    """The numerics check; a reference that cannot run leaves the numerics not checked, with
    the reason, and never costs the measured result."""
    if not _wants_check(spec, knobs):
        why = (
            "numerics_steps is 0"
            if spec.numerics_steps == 0
            else "eager fp32 is the reference itself"
        )
        return numerics.not_checked(why)
    if spec.numerics_by_first_trial:
        return numerics.not_checked(GATE_IN_FIRST_TRIAL)
    if spec.mode == "infer" and model_spec.ragged_output:
        return numerics.not_checked("outputs have data-dependent shapes (detections)")
    try:
        precision = cell_precision(knobs, device, run.runs_cudnn)
        check = check_numerics(spec, model_spec, knobs, host_batch, run.checks, device, precision)
    except Exception as exc:
        release_memory(device)
        what = "out of memory" if is_out_of_memory(exc) else type(exc).__name__
        return numerics.not_checked(f"the eager reference could not run ({what}: {exc})"[:500])
    check.first_check_step = run.check_from
    return check


def cell_precision(knobs: Knobs, device: torch.device, runs_cudnn: bool) -> str:
    """The precision the variant computes in: its autocast dtype, else TF32 where CUDA has it
    switched on for what the model runs (matmuls; convolutions and RNNs, which cuDNN runs,
    only where the model has them: cuDNN's TF32 flag is on by default), else fp32."""
    precision = knobs.precision(device.type)
    tf32 = torch.backends.cuda.matmul.allow_tf32 or (runs_cudnn and torch.backends.cudnn.allow_tf32)
    if precision == "fp32" and device.type == "cuda" and tf32:
        return "tf32"
    return precision


def runs_cudnn(model: torch.nn.Module) -> bool:
    """Whether the model has layers cuDNN computes on CUDA: convolutions, RNNs."""
    kinds = (torch.nn.modules.conv._ConvNd, torch.nn.RNNBase)
    return any(isinstance(module, kinds) for module in model.modules())


def count_flops_per_sample(
    model_spec: ModelSpec,
    sizes: Sizes,
    host_batch: Batch,
    mode: str,
    device: torch.device,
    attn: str | None = None,
) -> float | None:
    """FLOPs of one eager fp32 step per sample, where this torch can count them (>= 2.1).

    Counted on a fresh eager model (with the cell's attention) after the measured window, so
    that nothing runs on the device before the first timed step in one torch version and not
    in another."""
    try:
        from torch.utils.flop_counter import FlopCounterMode
    except ImportError:
        return None
    model = build_model(model_spec, sizes, 0, device, attn)
    model.train(mode == "train")
    batch = to_device(host_batch, device, channels_last=False)
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
        del model, batch
        release_memory(device)
    return counter.get_total_flops() / sizes.batch_size


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
