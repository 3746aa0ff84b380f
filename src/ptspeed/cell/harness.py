"""Run one benchmark cell in this process and return its record.

The order of a cell: refuse a GPU that the build has no code for (:mod:`ptspeed.cell.gpu_code`);
build the model and a synthetic batch from the seed; apply the variant's
process-wide switches (TF32, cuDNN autotuning, memory fraction); start the device's libraries
the same way in every torch version; warm up (the first step, which holds compilation, timed
on its own; then the knob's one-off calls, the check steps and any step that still compiles,
all before the measured window); time the measured steps (:mod:`ptspeed.cell.measurement.window`,
the probes, node samples and peak memory at its ends); count FLOPs on a meta-device copy;
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
    prepare_device,
    resolve_device,
    torch_version,
    use_compiler_cache,
)
from ptspeed.cell.faults import slowed_sampling, slowed_steps, window_load, wrong_outputs
from ptspeed.cell.gpu_code import device_reason
from ptspeed.cell.measurement import conditions, numerics
from ptspeed.cell.measurement.reference import (
    CheckCapture,
    Snapshot,
    check_numerics,
    host_copy,
    momentum_buffers,
)
from ptspeed.cell.measurement.timing import make_timer
from ptspeed.cell.measurement.warmup import Warmup, WarmupPlan, loss_of, warm_up
from ptspeed.cell.measurement.window import MeasuredWindow, WindowResult
from ptspeed.cell.memory import is_out_of_memory, release_memory, reset_peak_memory
from ptspeed.cell.provenance import collect, collect_base, note_backend_settings, python_version
from ptspeed.cell.record import CellSpec, Profile, Record, utc_now
from ptspeed.cell.record_window import Conditions, Metrics
from ptspeed.cell.steps import Step, batch_supplier, build_model, make_step, to_device
from ptspeed.cell.variants import compiler
from ptspeed.cell.variants.knobs import Knobs, parse_knobs
from ptspeed.cell.variants.support import unsupported_for_model
from ptspeed.errors import Unsupported
from ptspeed.models import Batch, ModelSpec, Sizes, check_spec_sizes, get_model

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
    """How the cell takes part: alone in this process. Each process of a ddp/fsdp cell takes
    part through an object of the same interface, one per rank."""

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
        modelpar/pipeline cell has its own (the parallelism package's stages)."""
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
    cell = CellInputs(spec, model_spec, knobs, host_batch, device, placement)
    run = _measure_variant(cell, model)
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
    record.numerics = _guarded_numerics(cell, run)
    if record.numerics.passed is False:
        record.status = "numerics_mismatch"
        record.reason = numerics.mismatch_reason(record.numerics)


@dataclass(frozen=True)
class CellInputs:
    """What a cell measures, but its model (which the caller frees before the references)."""

    spec: CellSpec
    model_spec: ModelSpec
    knobs: Knobs
    host_batch: Batch
    device: torch.device
    placement: SingleProcess


@dataclass(frozen=True)
class PreparedStep:
    """The wrapped model's step and what goes with it: the check steps' capture, the fault this
    process injects, the attention implementation and whether cuDNN computes part of it."""

    step: Step
    capture: CheckCapture
    fault: str
    attention: str
    runs_cudnn: bool


def _prepare_step(cell: CellInputs, model: Any) -> PreparedStep:
    spec, model_spec, placement = cell.spec, cell.model_spec, cell.placement
    parameter_names = [name for name, _ in model.named_parameters()]
    attention = model_spec.attention(model) if model_spec.attention else ""
    model, step_knobs = placement.wrap(model, cell.knobs, cell.device, model_spec.blocks)
    fault = placement.fault(spec.fault)
    step = placement.make_step(model_spec, model, step_knobs, spec.mode, cell.device, fault=fault)
    copies = not spec.numerics_by_first_trial
    capture = CheckCapture(
        model, step, placement, spec.mode, cell.device, parameter_names, copies=copies
    )
    return PreparedStep(step, capture, fault, attention, runs_cudnn(model))


def _measure_variant(cell: CellInputs, model: Any) -> VariantRun:
    spec, device, placement = cell.spec, cell.device, cell.placement
    prepared = _prepare_step(cell, model)
    step, fault = prepared.step, prepared.fault
    plan = WarmupPlan.of(spec, step.one_off_calls, checks=_wants_check(spec, cell.knobs))
    total_steps = plan.longest + spec.measured_steps + 1
    next_batch = batch_supplier(cell.host_batch, cell.knobs, device, total_steps)

    def plain_step() -> Any:
        return step(next_batch())  # nothing else on the timed path of a real cell

    cell_step = wrong_outputs(plain_step, fault, plan.checked_until)
    reset_peak_memory(device)
    # The steps draw random numbers (dropout, detection samplers): start them from the same
    # state as the eager references, whatever the loader drew before.
    torch.manual_seed(spec.seed)
    placement.barrier()
    warmup = warm_up(
        plan, cell_step, prepared.capture, make_timer(torch, device), fault, placement.barrier
    )
    placement.barrier()
    sample = slowed_sampling(conditions.begin, fault)
    window = MeasuredWindow(spec, device, step, placement.reports, placement.barrier, sample)
    # Only train mode's late check reads a kept output: an infer cell keeps none, whose copy
    # (a whole output, inside the window) would count in its peak memory.
    late_position = plan.late_index - warmup.steps_run if spec.mode == "train" else -1
    with window_load(fault):
        window.begin()
        window.run(slowed_steps(cell_step, fault), spec.measured_steps, keep=late_position)
        measured = window.end()
    # Read before the post-window step, which a CUDA graph's replay writes over the outputs.
    losses = _losses(warmup, measured, plan.late_index) if spec.mode == "train" else {}
    checks = warmup.checks
    if plan.check_count and prepared.capture.copies:
        # One more step, after the measured window, checked from its own snapshot: a variant
        # that went wrong during the measurement (a recompilation mid-run) is caught here.
        checks = [*checks, *_checked_step(prepared.capture, cell_step)]
    profile = window.profile(plain_step)
    metrics = _metrics(cell, warmup, measured, prepared.attention)
    metrics = dataclasses.replace(metrics, **losses, **measured.scaler_skips())
    window_conditions = placement.combine_telemetry(measured.conditions)
    return VariantRun(
        metrics, checks, plan.check_from, window_conditions, prepared.runs_cudnn, profile
    )


def _metrics(cell: CellInputs, warmup: Warmup, measured: WindowResult, attention: str) -> Metrics:
    """The window's and the warm-up's metrics over every process of the cell."""
    timing, batch_size = measured.timing, cell.spec.batch_size
    memory_bytes, memory_kind = measured.peak_memory
    metrics = Metrics(
        throughput_samples_per_s=timing.throughput(batch_size),
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
        batch_size_per_process=batch_size,
        fsdp_wrap_policy=getattr(cell.placement, "wrap_policy", ""),
        attn_implementation=attention,
    )
    return cell.placement.combine(metrics)


def _losses(warmup: Warmup, measured: WindowResult, late_index: int) -> dict[str, Any]:
    """The train-mode loss metrics: the first, the last and the late check's (the loss of step
    ``late_index``, from the warm-up or the measured window); a non-finite one named apart."""
    last_loss = loss_of(measured.last_output)
    late_loss = warmup.late_loss if late_index < warmup.steps_run else loss_of(measured.kept_output)
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
    capture: CheckCapture, run_step: Callable[[], Any]
) -> list[tuple[Snapshot, numerics.StepValues]]:
    snapshot = capture.before()
    values = capture.after(snapshot, run_step())
    return [] if values is None else [(snapshot, values)]


def _guarded_numerics(cell: CellInputs, run: VariantRun) -> numerics.NumericsCheck:
    """The numerics check; a reference that cannot run leaves the numerics not checked, with
    the reason, and never costs the measured result."""
    spec, model_spec, knobs, device = cell.spec, cell.model_spec, cell.knobs, cell.device
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
        check = check_numerics(
            spec, model_spec, knobs, cell.host_batch, run.checks, device, precision
        )
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
