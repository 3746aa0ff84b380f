"""The cell record: the one JSON document every benchmark cell writes, whatever happens.

Every field is declared once, here or, for the measured window's metrics and conditions, in
:mod:`ptspeed.cell.record_window`, with its meaning in the field's ``help`` metadata
(:func:`ptspeed.cell.record_fields.documented`). :mod:`ptspeed.cell.schema` derives the JSON
Schema from these dataclasses, so the documentation, the schema and the writer cannot drift
apart.

This module must import under Python 3.10 without torch: the cell watchdog uses it.
"""

from __future__ import annotations

import dataclasses
import functools
import json
import os
import typing
from dataclasses import dataclass
from datetime import datetime, timezone
from typing import Any, Optional

from ptspeed.cell.files import write_atomic
from ptspeed.cell.record_fields import documented
from ptspeed.cell.record_window import Conditions, Metrics
from ptspeed.models import DEFAULT_IMAGE_SIZE, DEFAULT_SEQ_LEN

# 2: the numerics check's snapshot comparison (loss, gradients, update; eager_error and
# eager_spread_error replace eager_fp32_error and eager_reseeded_error), warm-up and compiler
# cache metrics, the settings in force in provenance.
SCHEMA_VERSION = 2

STATUSES = ("ok", "unsupported", "failed", "oom", "timeout", "numerics_mismatch")


@dataclass
class CellSpec:
    """What was asked for: one point of the benchmark matrix."""

    model: str = documented(
        "The model's name: a zoo name ('resnet50'), a configured name ('llama-small'), or a "
        "reference as source takes it."
    )
    variant: str = documented("Variant name as configured, e.g. 'compile'.")
    knobs: str = documented("The knob string the variant stands for, e.g. 'compile+amp=bf16'.")
    mode: str = documented("'train' (forward, backward, optimizer step) or 'infer' (forward only).")
    batch_size: int = documented("Samples per step.")
    source: str = documented(
        "Where the model comes from when model is a configured name: torchvision:<name>, "
        "transformers:<model_type>, timm:<name> or module:attribute; '' when model says.",
        "",
    )
    shape: str = documented(
        "A transformers model's shape, e.g. 'layers=2,hidden=128,heads=2,vocab=1000'; '' for "
        "its config's defaults.",
        "",
    )
    image_size: int = documented("Image side in pixels (image models).", DEFAULT_IMAGE_SIZE)
    seq_len: int = documented("Sequence length in tokens (text models).", DEFAULT_SEQ_LEN)
    env: str = documented("Name of the PyTorch environment the cell ran in.", "host")
    platform: str = documented(
        "The cluster's GPU type the cell was planned for (config platforms); '' for a run on "
        "one machine.",
        "",
    )
    trial: int = documented("Trial index; trials are independent processes.", 0)
    seed: int = documented("Seed for weights and synthetic data.", 0)
    warmup_steps: int = documented("Steps run before measuring (the first holds compilation).", 3)
    measured_steps: int = documented("Steps whose times make the throughput.", 10)
    numerics_steps: int = documented(
        "Steps checked against eager (after the knob's one-off calls); 0: no check.", 2
    )
    numerics_by_first_trial: bool = documented(
        "Leave the numerics gate to the cell's first trial, which runs the same seeded "
        "computation (the workflow's later trials and reruns): the steps run as there, nothing "
        "is copied or compared; aggregation gives this trial the first trial's verdict and "
        "still holds its late loss against eager's (the late check).",
        False,
    )
    device: str = documented("Requested device: 'auto', 'cpu' or 'cuda'.", "auto")
    threads: int = documented("CPU threads for torch (0: torch's default).", 0)
    timeout_s: float = documented(
        "Wall-clock limit of the cell; past it the cell is a 'timeout'.", 1800.0
    )
    fault: str = documented("Injected fault for testing the suite itself ('' in real runs).", "")
    compiler_cache: str = documented(
        "Directory of the compiler's cache for this cell (TORCHINDUCTOR_CACHE_DIR); '' for the "
        "torch default. Trials of a cell share it: the first compiles cold, the others warm.",
        "",
    )
    compiler_cache_cold: bool = documented(
        "Empty compiler_cache before the cell, so that it compiles cold.", False
    )
    profile_steps: int = documented(
        "Steps run under torch.profiler after the measured window and everything that reads it "
        "(see profile); 0: none. The workflow profiles each cell's first trial (config profile).",
        0,
    )
    profile_trace: str = documented(
        "Where the profiled steps' trace is kept (gzipped Chrome trace JSON, which Perfetto and "
        "TensorBoard open); '' keeps none.",
        "",
    )
    retried_from_batch_size: Optional[int] = documented(
        "The configured batch size, when it ran out of memory and this record is of the retry at "
        "half of it (config oom_retry); null when not retried.",
        None,
    )

    @property
    def model_reference(self) -> str:
        """What names the model to :func:`ptspeed.models.get_model`."""
        return self.source or self.model


@dataclass
class NumericsCheck:
    """The variant's check steps compared with eager steps from the same snapshot.

    Check steps are the first numerics_steps steps after the knob's one-off work; before each,
    the model, optimizer and random state are copied, and eager fp64 and eager at the variant's
    precision run one step from that copy (see ptspeed.cell.measurement.numerics). Compared: the
    loss, gradients and update (train) or the output (infer). Each quantity passes within
    allowed_errors[q] = max(tolerance, 5 x eager's error at the variant's precision, 3 x eager's
    spread under a one-ulp perturbation of the weights and, for variants with their own random
    numbers, other dropout masks). The scalar fields describe the worst quantity
    (largest error / allowed).
    """

    checked: bool = documented("Whether a comparison was made.", False)
    reason: str = documented("Why not, when checked is false (or what could not be compared).", "")
    compared: str = documented(
        "The quantities compared, e.g. 'loss, gradients, update' or 'output'.", ""
    )
    precision: str = documented("Precision of the variant: fp32, tf32, bf16 or fp16.", "")
    reference: str = documented(
        "'fp64', else 'eager <precision>': the step the errors are measured against.",
        "",
    )
    tolerance: Optional[float] = documented("Relative error accepted for this precision.", None)
    check_steps: int = documented(
        "Steps checked, each from its own snapshot: the first numerics_steps after the knob's "
        "one-off work, and one more after the measured window.",
        0,
    )
    first_check_step: Optional[int] = documented(
        "Index (from 0) of the first checked step: after the knob's one-off calls.", None
    )
    worst_quantity: str = documented(
        "The quantity with the largest error relative to its bound.", ""
    )
    errors: dict[str, Optional[float]] = documented(
        "Largest relative error of each quantity over the check steps (null: non-finite).", {}
    )
    allowed_errors: dict[str, Optional[float]] = documented("The bound of each quantity.", {})
    eager_error: Optional[float] = documented(
        "Eager's error at the variant's precision against fp64, for the worst quantity.", None
    )
    eager_spread_error: Optional[float] = documented(
        "How far eager moves, for the worst quantity, when the snapshot's weights are perturbed "
        "by one fp32 rounding unit (and its random ops reseeded, for variants that draw their "
        "own random numbers).",
        None,
    )
    allowed_error: Optional[float] = documented("The bound of the worst quantity.", None)
    max_relative_error: Optional[float] = documented("The error of the worst quantity.", None)
    variant_values: list[Optional[float]] = documented(
        "The variant's loss (train) or output sample norm (infer) at each check step; "
        "null: non-finite.",
        [],
    )
    reference_values: list[Optional[float]] = documented(
        "Eager's at the variant's precision, likewise.", []
    )
    fp64_values: list[Optional[float]] = documented("Eager fp64's, likewise ([] when not run).", [])
    passed: Optional[bool] = documented("Every quantity within its bound.", None)


@dataclass
class Provenance:
    """Where and with what the numbers were made."""

    torch: str = documented("torch.__version__ ('' where torch was not imported).", "")
    cuda: str = documented("CUDA version torch was built with ('' for a CPU build).", "")
    cudnn: str = documented("cuDNN version ('' when unavailable).", "")
    device_name: str = documented("GPU name, or the CPU model on CPU.", "")
    device_index: Optional[int] = documented("CUDA device index used, null on CPU.", None)
    cuda_visible_devices: str = documented("CUDA_VISIBLE_DEVICES as the cell saw it.", "")
    gpu_assignment: str = documented(
        "How the cell's GPUs were chosen: the ids claimed and the node's pool ('' on CPU).", ""
    )
    gpu_driver: str = documented("NVIDIA driver version ('' without a GPU).", "")
    cpu_model: str = documented("CPU model name.", "")
    cpu_count: int = documented("Logical CPUs of the machine.", 0)
    torch_threads: int = documented("torch.get_num_threads() during the cell.", 0)
    python: str = documented("Python version.", "")
    packages: dict[str, str] = documented(
        "Versions of torch, torchvision, transformers, numpy, triton.", {}
    )
    nccl: str = documented("NCCL version torch was built with ('' without CUDA).", "")
    tf32_matmul: Optional[bool] = documented(
        "torch.backends.cuda.matmul.allow_tf32 in force during the cell (null off CUDA).", None
    )
    tf32_cudnn: Optional[bool] = documented(
        "torch.backends.cudnn.allow_tf32 in force during the cell (null off CUDA).", None
    )
    cudnn_benchmark: Optional[bool] = documented(
        "torch.backends.cudnn.benchmark in force during the cell (null off CUDA).", None
    )
    float32_matmul_precision: str = documented(
        "torch.get_float32_matmul_precision(): 'highest', 'high' or 'medium'.", ""
    )
    allocator_settings: dict[str, str] = documented(
        "Allocator environment variables set for the cell (PYTORCH_CUDA_ALLOC_CONF, …).", {}
    )
    cleared_host_variables: dict[str, str] = documented(
        "Variables of the caller's environment that would change the measurement (CC, CXX, "
        "TORCHINDUCTOR_*, TRITON_*, CUDA_LAUNCH_BLOCKING, NVIDIA_TF32_OVERRIDE, LD_PRELOAD, …) "
        "and that the cell's worker started without, with their values.",
        {},
    )
    kept_host_variables: dict[str, str] = documented(
        "The site's NCCL_* variables, kept for the cell (a job may need them for the fabric).",
        {},
    )
    gpu_state: str = documented(
        "The GPU's SM clock, its maximum, power draw and limit and temperature at the start "
        "(nvidia-smi; '' without a GPU).",
        "",
    )
    git_commit: str = documented("Commit of the suite's code ('' outside a checkout).", "")
    git_dirty: Optional[bool] = documented(
        "Whether the checkout had uncommitted changes or untracked files.", None
    )
    hostname: str = documented("Host name.", "")
    slurm_job_id: str = documented("SLURM_JOB_ID of the cell's job ('' outside SLURM).", "")
    slurm_partition: str = documented(
        "SLURM_JOB_PARTITION: the partition the cell's job ran in ('' outside SLURM).", ""
    )
    slurm_node: str = documented(
        "SLURMD_NODENAME: the SLURM node the cell's job ran on ('' outside SLURM).", ""
    )
    container_image: str = documented(
        "Container image (name or digest), '' outside containers.", ""
    )
    container_digest: str = documented(
        "Digest (sha256:…) of the container image, '' outside containers or when unknown.", ""
    )
    platform: str = documented("OS and architecture.", "")
    os_release: str = documented(
        "The operating system as /etc/os-release names it (PRETTY_NAME): inside a container, "
        "the image's.",
        "",
    )


@dataclass
class Profile:
    """Where a step's time goes: cell.profile_steps steps run under torch.profiler (CPU and, on
    CUDA, kernel activity) after the measured window and after everything that reads it, never
    inside it (see ptspeed.cell.measurement.breakdown for the kinds and how they are summed)."""

    profiled: bool = documented(
        "Whether the steps ran under the profiler and were broken down.", False
    )
    reason: str = documented("Why not, when profiled is false ('' otherwise).", "")
    steps: int = documented("Steps profiled.", 0)
    activities: str = documented("What the profiler recorded: 'cpu' or 'cpu, cuda'.", "")
    timeline: str = documented(
        "What time_by_kind_s partitions: 'cpu' (the stepping thread's time: each op's self time "
        "by the op's kind, 'host' the time outside any op) or 'gpu' (the device's time inside "
        "the step: each kernel and copy by its kind, 'idle' the time no kernel ran).",
        "",
    )
    step_time_s: Optional[float] = documented(
        "Mean time of a profiled step (the profiler's own cost included; synchronised on CUDA).",
        None,
    )
    time_by_kind_s: dict[str, float] = documented(
        "Seconds per profiled step by kind of work: matmul, attention, elementwise, norm, "
        "reduction, copy, optimizer, compiled, collective, idle (CUDA), host (CPU), other.",
        {},
    )
    sum_error: Optional[float] = documented(
        "(sum of time_by_kind_s - step_time_s) / step_time_s.", None
    )
    sums: Optional[bool] = documented("Whether |sum_error| is within tolerance.", None)
    tolerance: Optional[float] = documented("The largest |sum_error| accepted.", None)
    kernels_per_step: Optional[float] = documented(
        "CUDA: kernels launched per step; CPU: leaf ops (ops that call no other op) per step, "
        "'host' ones left out (a compiled region's fused kernels are not recorded one by one).",
        None,
    )
    copies_per_step: Optional[float] = documented(
        "Copies per step: CUDA memcpy/memset and copy kernels; CPU copy leaf ops.", None
    )
    ops_by_kind: dict[str, float] = documented(
        "Per step, by kind: CUDA kernels and copies; CPU leaf ops.", {}
    )
    other_threads_s: Optional[float] = documented(
        "CPU: seconds per step of top-level ops on threads other than the stepping one (not in "
        "time_by_kind_s).",
        None,
    )
    trace: str = documented("The kept trace (cell.profile_trace) or '' when none was kept.", "")
    notes: str = documented("What the breakdown noticed, '; '-separated.", "")


@dataclass
class Record:
    """One benchmark cell's outcome. Written once, atomically, for every cell."""

    cell: CellSpec = documented("What was asked for.")
    status: str = documented("One of: " + ", ".join(STATUSES) + ".")
    reason: str = documented("Why, for any status but 'ok' ('' when ok).", "")
    detail: str = documented("Extra diagnostics, e.g. the end of a traceback.", "")
    metrics: Metrics = documented("What was measured.", None)
    numerics: NumericsCheck = documented("Comparison with the eager fp32 reference.", None)
    provenance: Provenance = documented("Software and hardware.", None)
    conditions: Conditions = documented("What else ran during the measured window.", None)
    profile: Profile = documented(
        "Where a step's time goes, from profiled steps after the window.", None
    )
    started_at: str = documented("UTC start time, ISO 8601.", "")
    finished_at: str = documented("UTC end time, ISO 8601.", "")
    duration_s: Optional[float] = documented("Wall time of the whole cell process.", None)
    schema_version: int = documented("Version of this record layout.", SCHEMA_VERSION)

    def __post_init__(self) -> None:
        if self.status not in STATUSES:
            raise ValueError(f"status: {self.status!r} is not one of {', '.join(STATUSES)}")
        self.metrics = self.metrics or Metrics()
        self.numerics = self.numerics or NumericsCheck()
        self.provenance = self.provenance or Provenance()
        self.conditions = self.conditions or Conditions()
        self.profile = self.profile or Profile()

    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> Record:
        return _from_dict(cls, data)


@functools.cache
def _type_hints(cls: type) -> dict[str, Any]:
    return typing.get_type_hints(cls)


def _from_dict(cls: type, data: dict[str, Any]) -> Any:
    hints = _type_hints(cls)
    kwargs = {}
    for f in dataclasses.fields(cls):
        if f.name not in data:
            continue
        value = data[f.name]
        hint = hints[f.name]
        if dataclasses.is_dataclass(hint) and isinstance(value, dict):
            value = _from_dict(hint, value)
        kwargs[f.name] = value
    return cls(**kwargs)


def utc_now() -> str:
    """The current UTC time as the records write it (ISO 8601, seconds)."""
    return datetime.now(timezone.utc).isoformat(timespec="seconds")


def write_record(record: Record, path: str | os.PathLike[str]) -> None:
    write_atomic(path, json.dumps(record.to_dict(), indent=2, allow_nan=False) + "\n")


def read_record(path: str | os.PathLike[str]) -> Record:
    with open(path, encoding="utf-8") as handle:
        return Record.from_dict(json.load(handle))
