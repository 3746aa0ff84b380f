"""The cell record: the one JSON document every benchmark cell writes, whatever happens.

Every field is declared once, here, with its meaning in the field's ``help`` metadata.
:mod:`ptspeed.cell.schema` derives the JSON Schema from these dataclasses, so the documentation,
the schema and the writer cannot drift apart.

This module must import under Python 3.10 without torch: the cell watchdog uses it.
"""

from __future__ import annotations

import dataclasses
import functools
import json
import os
import typing
from dataclasses import dataclass, field
from datetime import datetime, timezone
from typing import Any, Optional

from ptspeed.cell.files import write_atomic
from ptspeed.models import DEFAULT_IMAGE_SIZE, DEFAULT_SEQ_LEN

# 2: the numerics check's snapshot comparison (loss, gradients, update; eager_error and
# eager_spread_error replace eager_fp32_error and eager_reseeded_error), warm-up and compiler
# cache metrics, the settings in force in provenance.
SCHEMA_VERSION = 2

STATUSES = ("ok", "unsupported", "failed", "oom", "timeout", "numerics_mismatch")


def _doc(text: str, default: Any = dataclasses.MISSING) -> Any:
    if default is dataclasses.MISSING:
        return field(metadata={"help": text})
    if isinstance(default, (list, dict)):
        return field(default_factory=lambda: type(default)(default), metadata={"help": text})
    return field(default=default, metadata={"help": text})


@dataclass
class CellSpec:
    """What was asked for: one point of the benchmark matrix."""

    model: str = _doc(
        "The model's name: a zoo name ('resnet50'), a configured name ('llama-small'), or a "
        "reference as source takes it."
    )
    variant: str = _doc("Variant name as configured, e.g. 'compile'.")
    knobs: str = _doc("The knob string the variant stands for, e.g. 'compile+amp=bf16'.")
    mode: str = _doc("'train' (forward, backward, optimizer step) or 'infer' (forward only).")
    batch_size: int = _doc("Samples per step.")
    source: str = _doc(
        "Where the model comes from when model is a configured name: torchvision:<name>, "
        "transformers:<model_type>, timm:<name> or module:attribute; '' when model says.",
        "",
    )
    shape: str = _doc(
        "A transformers model's shape, e.g. 'layers=2,hidden=128,heads=2,vocab=1000'; '' for "
        "its config's defaults.",
        "",
    )
    image_size: int = _doc("Image side in pixels (image models).", DEFAULT_IMAGE_SIZE)
    seq_len: int = _doc("Sequence length in tokens (text models).", DEFAULT_SEQ_LEN)
    env: str = _doc("Name of the PyTorch environment the cell ran in.", "host")
    platform: str = _doc(
        "The cluster's GPU type the cell was planned for (config platforms); '' for a run on "
        "one machine.",
        "",
    )
    trial: int = _doc("Trial index; trials are independent processes.", 0)
    seed: int = _doc("Seed for weights and synthetic data.", 0)
    warmup_steps: int = _doc("Steps run before measuring (the first holds compilation).", 3)
    measured_steps: int = _doc("Steps whose times make the throughput.", 10)
    numerics_steps: int = _doc(
        "Steps checked against eager (after the knob's one-off calls); 0: no check.", 2
    )
    numerics_by_first_trial: bool = _doc(
        "Leave the numerics gate to the cell's first trial, which runs the same seeded "
        "computation (the workflow's later trials and reruns): the steps run as there, nothing "
        "is copied or compared; aggregation gives this trial the first trial's verdict and "
        "still holds its late loss against eager's (the late check).",
        False,
    )
    device: str = _doc("Requested device: 'auto', 'cpu' or 'cuda'.", "auto")
    threads: int = _doc("CPU threads for torch (0: torch's default).", 0)
    timeout_s: float = _doc(
        "Wall-clock limit of the cell; past it the cell is a 'timeout'.", 1800.0
    )
    fault: str = _doc("Injected fault for testing the suite itself ('' in real runs).", "")
    compiler_cache: str = _doc(
        "Directory of the compiler's cache for this cell (TORCHINDUCTOR_CACHE_DIR); '' for the "
        "torch default. Trials of a cell share it: the first compiles cold, the others warm.",
        "",
    )
    compiler_cache_cold: bool = _doc(
        "Empty compiler_cache before the cell, so that it compiles cold.", False
    )
    profile_steps: int = _doc(
        "Steps run under torch.profiler after the measured window and everything that reads it "
        "(see profile); 0: none. The workflow profiles each cell's first trial (config profile).",
        0,
    )
    profile_trace: str = _doc(
        "Where the profiled steps' trace is kept (gzipped Chrome trace JSON, which Perfetto and "
        "TensorBoard open); '' keeps none.",
        "",
    )
    retried_from_batch_size: Optional[int] = _doc(
        "The configured batch size, when it ran out of memory and this record is of the retry at "
        "half of it (config oom_retry); null when not retried.",
        None,
    )

    @property
    def model_reference(self) -> str:
        """What names the model to :func:`ptspeed.models.get_model`."""
        return self.source or self.model


@dataclass
class Metrics:
    """What was measured. Times in seconds; absent values are null.

    In a distributed cell (world_size > 1) every process trains on its own batch of
    cell.batch_size samples: the throughput is global, and the times and peak memory are the
    largest over the processes, except step_times_s (those of rank 0).
    """

    throughput_samples_per_s: Optional[float] = _doc(
        "world_size x batch_size x measured_steps / wall time of the measured steps (samples/s "
        "over all processes; batch_size is per process); modelpar/pipeline: batch_size x "
        "measured_steps / the slowest stage's wall time (the batch goes through every stage).",
        None,
    )
    measured_wall_s: Optional[float] = _doc("Wall time of the measured steps (synchronised).", None)
    step_time_p50_s: Optional[float] = _doc("Median measured step time.", None)
    step_time_p90_s: Optional[float] = _doc("90th percentile of measured step times.", None)
    step_time_mean_s: Optional[float] = _doc("Mean measured step time.", None)
    step_times_s: list[float] = _doc("Every measured step's time, in order.", [])
    first_step_s: Optional[float] = _doc(
        "Time of the first step, compilation included (synchronised).", None
    )
    warmup_s: Optional[float] = _doc(
        "Time of all warm-up steps, the first and the numerics check's copies included.", None
    )
    warmup_steps_run: Optional[int] = _doc(
        "Warm-up steps run: at least cell.warmup_steps, more when the knob's one-off work and the "
        "check steps need them, or when a warm-up step still compiled.",
        None,
    )
    one_off_steps: Optional[int] = _doc(
        "Steps that held one-off work of a knob (CUDA graph capture, cudagraph trees' recording, "
        "compilation and recompilations): all of them ended before the measured window.",
        None,
    )
    compiler_cache: str = _doc(
        "'cold' when the cell's compiler cache directory started empty, 'warm' when it held an "
        "earlier trial's artefacts, '' when the cell does not compile or has no cache of its own.",
        "",
    )
    peak_memory_bytes: Optional[int] = _doc("Peak memory while stepping (see memory_kind).", None)
    memory_kind: str = _doc(
        "'cuda_allocator_peak' (torch.cuda.max_memory_allocated) or 'process_peak_rss'.", ""
    )
    loss_first: Optional[float] = _doc("Loss of the first step (train mode).", None)
    loss_last: Optional[float] = _doc(
        "Loss of the last measured step (train mode); null when not finite (see non_finite_loss).",
        None,
    )
    late_loss: Optional[float] = _doc(
        "Loss of step late_loss_step (train mode), which the late check holds against the eager "
        "cell's loss at the same step; null when not finite (see non_finite_loss).",
        None,
    )
    amp_scale_before: Optional[float] = _doc(
        "GradScaler's loss scale just before the measured window (fp16 AMP; null otherwise).",
        None,
    )
    amp_scale_after: Optional[float] = _doc("Its loss scale just after the window.", None)
    amp_skipped_steps: Optional[int] = _doc(
        "Optimizer steps GradScaler skipped inside the window (an fp16 overflow halves the "
        "scale; a step that did no update is faster): log2 of the scale's fall, a lower bound "
        "should the scale also have grown (once per 2000 good steps); null without GradScaler.",
        None,
    )
    late_loss_step: Optional[int] = _doc(
        "The step (counted from 1) of late_loss: eager's last, cell.warmup_steps (at least 1) + "
        "cell.measured_steps, which a cell with a longer warm-up also runs (train mode).",
        None,
    )
    non_finite_loss: str = _doc(
        "'nan', 'inf' or '-inf' when the first, last or late loss was not finite (JSON cannot "
        "hold it); '' otherwise.",
        "",
    )
    flops_per_sample: Optional[float] = _doc(
        "Model FLOPs per sample of one step, counted on the eager fp32 model (torch >= 2.1).", None
    )
    achieved_flops_per_s: Optional[float] = _doc(
        "flops_per_sample x throughput_samples_per_s.", None
    )
    world_size: int = _doc(
        "Processes that trained together (ddp/fsdp; the stages of modelpar/pipeline); 1 otherwise.",
        1,
    )
    batch_size_per_process: Optional[int] = _doc(
        "Samples per step in each process (cell.batch_size); the global batch is world_size x it.",
        None,
    )
    distributed_backend: str = _doc(
        "Process group backend of a distributed cell: 'nccl' (CUDA) or 'gloo' (CPU); '' otherwise.",
        "",
    )
    fsdp_wrap_policy: str = _doc(
        "How FSDP split the model into units, e.g. 'per block: BertLayer (12 units)'; '' "
        "without fsdp.",
        "",
    )
    stage_split: str = _doc(
        "How modelpar/pipeline cut the model's layers into stages, by layer index, name and "
        "parameters, e.g. '0-7 stem..layer3.0 8.5M | 8-17 layer3.1..fc 17.0M'; '' otherwise.",
        "",
    )
    attn_implementation: str = _doc(
        "The attention implementation the model ran with, as transformers reports it "
        "(model.config._attn_implementation): 'sdpa' (torch's scaled_dot_product_attention) or "
        "'eager'; the attn knob's, else transformers' default for this torch. '' for models "
        "without one.",
        "",
    )
    compiled_graphs: Optional[int] = _doc(
        "Graphs torch.compile compiled during the cell (Dynamo's stats/unique_graphs, "
        "recompilations included); null for cells that do not compile or where torch does not "
        "count them.",
        None,
    )
    graph_breaks: Optional[int] = _doc(
        "Graph breaks Dynamo met while compiling (each splits a frame into graphs with Python "
        "between them); null as for compiled_graphs.",
        None,
    )
    graph_break_reasons: list[str] = _doc(
        "The first five distinct graph-break reasons, each by its first line.", []
    )
    recompilations: Optional[int] = _doc(
        "Compilations of code already compiled, after a guard failed (a new shape, a changed "
        "constant): torch 2.0 counts guard failures, later versions the compilations with a "
        "recompile reason (of the last 64 compilations); null as for compiled_graphs.",
        None,
    )
    recompile_reasons: list[str] = _doc(
        "The first five distinct reasons for a recompilation (the guard that failed).", []
    )
    compile_time_by_phase_s: dict[str, float] = _doc(
        "Seconds spent in each timed phase of the compiler over the cell "
        "(torch._dynamo.utils.compile_times: e.g. Dynamo's _compile, the backend call, "
        "Inductor's code generation; which phases depends on the torch version). Phases nest, "
        "so their sum is not the total; first_step_s holds the first compilation whole.",
        {},
    )
    rank_measured_wall_s: list[float] = _doc(
        "Each process's wall time of the measured steps, by rank (distributed cells); "
        "measured_wall_s is the largest. A rank's own throughput is batch_size x measured_steps "
        "/ its time.",
        [],
    )


@dataclass
class Conditions:
    """What else ran while the trial measured, sampled at its measured window's start and end
    (never inside it; see ptspeed.cell.measurement.conditions). Whether the trial was perturbed is
    judged from these values when the tables are made (config conditions), not here. Null: not
    measured (a trial that ended before its window, an older record) or not readable here
    (see not_readable)."""

    window_s: Optional[float] = _doc(
        "Wall time between the two samples (the measured window).", None
    )
    window_started_unix_s: Optional[float] = _doc(
        "When the measured window started (Unix time, seconds).", None
    )
    affinity_cpus: int = _doc("CPUs the cell's process may run on (os.sched_getaffinity).", 0)
    node_cpus: int = _doc("Logical CPUs of the node (os.cpu_count).", 0)
    pinned: Optional[bool] = _doc("Whether the cell's CPUs are fewer than the node's.", None)
    busy_cpu_s: Optional[float] = _doc(
        "Non-idle CPU time of the cell's CPUs over the window, every process's (/proc/stat; "
        "steal included).",
        None,
    )
    own_cpu_s: Optional[float] = _doc(
        "CPU time of the cell's own processes inside the window: every process of its session "
        "(the worker's threads, its DataLoader and compile workers, torchrun's ranks), a "
        "process reaped in the window counted for its time there only; at most what the "
        "cell's CPUs give in the window (past it: clamped, other_cpu_s null, not_readable "
        "says why).",
        None,
    )
    other_cpu_s: Optional[float] = _doc(
        "busy_cpu_s - own_cpu_s: CPU time other processes (and the hypervisor's steal) took on "
        "the cell's CPUs; accurate to a few cpu_tick_s.",
        None,
    )
    steal_cpu_s: Optional[float] = _doc(
        "CPU time the hypervisor gave to other guests on the cell's CPUs (/proc/stat steal).",
        None,
    )
    cpu_tick_s: Optional[float] = _doc("Resolution of the CPU times (1 / USER_HZ).", None)
    load_average_start: Optional[float] = _doc("1-minute load average at the start.", None)
    load_average_end: Optional[float] = _doc("1-minute load average at the end.", None)
    cpu_governors: Optional[str] = _doc(
        "cpufreq scaling governor(s) of the cell's CPUs; null where cpufreq is absent (most "
        "VMs and containers).",
        None,
    )
    cpu_mhz_min: Optional[float] = _doc(
        "Lowest clock of the cell's CPUs at the two samples (cpufreq).", None
    )
    cpu_mhz_max: Optional[float] = _doc("Highest, likewise.", None)
    cpu_mhz_limit: Optional[float] = _doc("Their maximum clock (cpuinfo_max_freq).", None)
    gpu_source: str = _doc(
        "'nvml': sampled in the window every ~50 ms through the driver's NVML; 'nvidia-smi': "
        "where NVML could not be opened, at the window's two ends only; '' off CUDA or "
        "unreadable.",
        "",
    )
    gpu_samples: int = _doc("GPU samples taken during the window (NVML).", 0)
    gpu_sm_mhz_min: Optional[float] = _doc("Lowest SM clock over the window's samples.", None)
    gpu_sm_mhz_median: Optional[float] = _doc("Median SM clock over them (NVML).", None)
    gpu_sm_mhz_max: Optional[float] = _doc("Highest SM clock over them.", None)
    gpu_sm_mhz_limit: Optional[float] = _doc("The GPU's maximum SM clock.", None)
    gpu_temperature_c_max: Optional[float] = _doc("Highest GPU temperature (°C).", None)
    gpu_power_w_max: Optional[float] = _doc("Highest power draw (W).", None)
    gpu_power_w_mean: Optional[float] = _doc("Mean power draw over the samples (W).", None)
    gpu_power_limit_w: Optional[float] = _doc("Enforced power limit (W).", None)
    gpu_throttle_reasons: str = _doc(
        "Clock throttle (event) reasons active in any sample (NVML's names, idle left out), "
        "comma-separated.",
        "",
    )
    gpu_other_processes: Optional[int] = _doc(
        "Most compute processes on the GPU at a sample that are not the cell's.", None
    )
    energy_j: Optional[float] = _doc(
        "Energy of the window (J): the GPU's total-energy counter (NVML) on CUDA, the CPU "
        "packages' counters (RAPL) on the CPU; null when not measured.",
        None,
    )
    energy_source: str = _doc("'nvml', 'rapl', or '' when not measured.", "")
    energy_not_measured: str = _doc("Why energy_j is null ('' when measured).", "")
    rank_energy_j: list[Optional[float]] = _doc(
        "A ddp/fsdp/staged cell's energy_j of each rank (its own GPU), rank 0 first; [] for "
        "one process. Their sum is energy_j.",
        [],
    )
    rank_gpu_sm_mhz_median: list[Optional[float]] = _doc(
        "Each rank's median SM clock over its window's samples.", []
    )
    rank_gpu_samples: list[int] = _doc("Each rank's GPU samples in its window.", [])
    sampler_cpu_s: Optional[float] = _doc(
        "CPU time the in-window GPU sampling thread took (its cost to the cell).", None
    )
    sampling_s: Optional[float] = _doc("What taking the two samples cost (seconds).", None)
    probe_cpu_gemm_s_before: Optional[float] = _doc(
        "The machine-speed probe just before the window (ptspeed.cell.measurement.probe): seconds "
        "of its fixed CPU GEMM work (see probe_work: since issue 36 the median of repeated runs of "
        "it, one run before), on probe_threads threads; null: not probed (an older record, a rank "
        "that does not report).",
        None,
    )
    probe_cpu_gemm_s_after: Optional[float] = _doc("The same just after the window.", None)
    probe_cpu_memory_s_before: Optional[float] = _doc(
        "Seconds of the probe's fixed CPU memory pass just before the window.", None
    )
    probe_cpu_memory_s_after: Optional[float] = _doc("The same just after the window.", None)
    probe_gpu_gemm_s_before: Optional[float] = _doc(
        "Seconds of the probe's fixed GEMM on the cell's GPU just before the window (CUDA "
        "events); null off CUDA.",
        None,
    )
    probe_gpu_gemm_s_after: Optional[float] = _doc("The same just after the window.", None)
    probe_gpu_sm_mhz_before: Optional[float] = _doc(
        "The GPU's SM clock just after the probe's GEMM before the window (NVML).", None
    )
    probe_gpu_sm_mhz_after: Optional[float] = _doc("The same after the window.", None)
    probe_threads: Optional[int] = _doc("torch threads the CPU probe ran on.", None)
    probe_cost_s: Optional[float] = _doc(
        "Wall time of both probes (outside the window; what they added to the cell).", None
    )
    probe_work: str = _doc(
        "The probe's fixed work and the build that ran it, e.g. 'median of 5 repetitions: CPU: "
        "16 x fp32 GEMM 256^2, …; torch 2.0.1+cpu, BLAS mkl': probes are compared only where it "
        "and the environment are the same.",
        "",
    )
    not_readable: str = _doc("What could not be read here, '; '-separated.", "")


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

    checked: bool = _doc("Whether a comparison was made.", False)
    reason: str = _doc("Why not, when checked is false (or what could not be compared).", "")
    compared: str = _doc("The quantities compared, e.g. 'loss, gradients, update' or 'output'.", "")
    precision: str = _doc("Precision of the variant: fp32, tf32, bf16 or fp16.", "")
    reference: str = _doc(
        "'fp64', else 'eager <precision>': the step the errors are measured against.",
        "",
    )
    tolerance: Optional[float] = _doc("Relative error accepted for this precision.", None)
    check_steps: int = _doc(
        "Steps checked, each from its own snapshot: the first numerics_steps after the knob's "
        "one-off work, and one more after the measured window.",
        0,
    )
    first_check_step: Optional[int] = _doc(
        "Index (from 0) of the first checked step: after the knob's one-off calls.", None
    )
    worst_quantity: str = _doc("The quantity with the largest error relative to its bound.", "")
    errors: dict[str, Optional[float]] = _doc(
        "Largest relative error of each quantity over the check steps (null: non-finite).", {}
    )
    allowed_errors: dict[str, Optional[float]] = _doc("The bound of each quantity.", {})
    eager_error: Optional[float] = _doc(
        "Eager's error at the variant's precision against fp64, for the worst quantity.", None
    )
    eager_spread_error: Optional[float] = _doc(
        "How far eager moves, for the worst quantity, when the snapshot's weights are perturbed "
        "by one fp32 rounding unit (and its random ops reseeded, for variants that draw their "
        "own random numbers).",
        None,
    )
    allowed_error: Optional[float] = _doc("The bound of the worst quantity.", None)
    max_relative_error: Optional[float] = _doc("The error of the worst quantity.", None)
    variant_values: list[Optional[float]] = _doc(
        "The variant's loss (train) or output sample norm (infer) at each check step; "
        "null: non-finite.",
        [],
    )
    reference_values: list[Optional[float]] = _doc(
        "Eager's at the variant's precision, likewise.", []
    )
    fp64_values: list[Optional[float]] = _doc("Eager fp64's, likewise ([] when not run).", [])
    passed: Optional[bool] = _doc("Every quantity within its bound.", None)


@dataclass
class Provenance:
    """Where and with what the numbers were made."""

    torch: str = _doc("torch.__version__ ('' where torch was not imported).", "")
    cuda: str = _doc("CUDA version torch was built with ('' for a CPU build).", "")
    cudnn: str = _doc("cuDNN version ('' when unavailable).", "")
    device_name: str = _doc("GPU name, or the CPU model on CPU.", "")
    device_index: Optional[int] = _doc("CUDA device index used, null on CPU.", None)
    cuda_visible_devices: str = _doc("CUDA_VISIBLE_DEVICES as the cell saw it.", "")
    gpu_assignment: str = _doc(
        "How the cell's GPUs were chosen: the ids claimed and the node's pool ('' on CPU).", ""
    )
    gpu_driver: str = _doc("NVIDIA driver version ('' without a GPU).", "")
    cpu_model: str = _doc("CPU model name.", "")
    cpu_count: int = _doc("Logical CPUs of the machine.", 0)
    torch_threads: int = _doc("torch.get_num_threads() during the cell.", 0)
    python: str = _doc("Python version.", "")
    packages: dict[str, str] = _doc(
        "Versions of torch, torchvision, transformers, numpy, triton.", {}
    )
    nccl: str = _doc("NCCL version torch was built with ('' without CUDA).", "")
    tf32_matmul: Optional[bool] = _doc(
        "torch.backends.cuda.matmul.allow_tf32 in force during the cell (null off CUDA).", None
    )
    tf32_cudnn: Optional[bool] = _doc(
        "torch.backends.cudnn.allow_tf32 in force during the cell (null off CUDA).", None
    )
    cudnn_benchmark: Optional[bool] = _doc(
        "torch.backends.cudnn.benchmark in force during the cell (null off CUDA).", None
    )
    float32_matmul_precision: str = _doc(
        "torch.get_float32_matmul_precision(): 'highest', 'high' or 'medium'.", ""
    )
    allocator_settings: dict[str, str] = _doc(
        "Allocator environment variables set for the cell (PYTORCH_CUDA_ALLOC_CONF, …).", {}
    )
    cleared_host_variables: dict[str, str] = _doc(
        "Variables of the caller's environment that would change the measurement (CC, CXX, "
        "TORCHINDUCTOR_*, TRITON_*, CUDA_LAUNCH_BLOCKING, NVIDIA_TF32_OVERRIDE, LD_PRELOAD, …) "
        "and that the cell's worker started without, with their values.",
        {},
    )
    kept_host_variables: dict[str, str] = _doc(
        "The site's NCCL_* variables, kept for the cell (a job may need them for the fabric).",
        {},
    )
    gpu_state: str = _doc(
        "The GPU's SM clock, its maximum, power draw and limit and temperature at the start "
        "(nvidia-smi; '' without a GPU).",
        "",
    )
    git_commit: str = _doc("Commit of the suite's code ('' outside a checkout).", "")
    git_dirty: Optional[bool] = _doc(
        "Whether the checkout had uncommitted changes or untracked files.", None
    )
    hostname: str = _doc("Host name.", "")
    slurm_job_id: str = _doc("SLURM_JOB_ID of the cell's job ('' outside SLURM).", "")
    slurm_partition: str = _doc(
        "SLURM_JOB_PARTITION: the partition the cell's job ran in ('' outside SLURM).", ""
    )
    slurm_node: str = _doc(
        "SLURMD_NODENAME: the SLURM node the cell's job ran on ('' outside SLURM).", ""
    )
    container_image: str = _doc("Container image (name or digest), '' outside containers.", "")
    container_digest: str = _doc(
        "Digest (sha256:…) of the container image, '' outside containers or when unknown.", ""
    )
    platform: str = _doc("OS and architecture.", "")
    os_release: str = _doc(
        "The operating system as /etc/os-release names it (PRETTY_NAME): inside a container, "
        "the image's.",
        "",
    )


@dataclass
class Profile:
    """Where a step's time goes: cell.profile_steps steps run under torch.profiler (CPU and, on
    CUDA, kernel activity) after the measured window and after everything that reads it, never
    inside it (see ptspeed.cell.measurement.breakdown for the kinds and how they are summed)."""

    profiled: bool = _doc("Whether the steps ran under the profiler and were broken down.", False)
    reason: str = _doc("Why not, when profiled is false ('' otherwise).", "")
    steps: int = _doc("Steps profiled.", 0)
    activities: str = _doc("What the profiler recorded: 'cpu' or 'cpu, cuda'.", "")
    timeline: str = _doc(
        "What time_by_kind_s partitions: 'cpu' (the stepping thread's time: each op's self time "
        "by the op's kind, 'host' the time outside any op) or 'gpu' (the device's time inside "
        "the step: each kernel and copy by its kind, 'idle' the time no kernel ran).",
        "",
    )
    step_time_s: Optional[float] = _doc(
        "Mean time of a profiled step (the profiler's own cost included; synchronised on CUDA).",
        None,
    )
    time_by_kind_s: dict[str, float] = _doc(
        "Seconds per profiled step by kind of work: matmul, attention, elementwise, norm, "
        "reduction, copy, optimizer, compiled, collective, idle (CUDA), host (CPU), other.",
        {},
    )
    sum_error: Optional[float] = _doc("(sum of time_by_kind_s - step_time_s) / step_time_s.", None)
    sums: Optional[bool] = _doc("Whether |sum_error| is within tolerance.", None)
    tolerance: Optional[float] = _doc("The largest |sum_error| accepted.", None)
    kernels_per_step: Optional[float] = _doc(
        "CUDA: kernels launched per step; CPU: leaf ops (ops that call no other op) per step, "
        "'host' ones left out (a compiled region's fused kernels are not recorded one by one).",
        None,
    )
    copies_per_step: Optional[float] = _doc(
        "Copies per step: CUDA memcpy/memset and copy kernels; CPU copy leaf ops.", None
    )
    ops_by_kind: dict[str, float] = _doc(
        "Per step, by kind: CUDA kernels and copies; CPU leaf ops.", {}
    )
    other_threads_s: Optional[float] = _doc(
        "CPU: seconds per step of top-level ops on threads other than the stepping one (not in "
        "time_by_kind_s).",
        None,
    )
    trace: str = _doc("The kept trace (cell.profile_trace) or '' when none was kept.", "")
    notes: str = _doc("What the breakdown noticed, '; '-separated.", "")


@dataclass
class Record:
    """One benchmark cell's outcome. Written once, atomically, for every cell."""

    cell: CellSpec = _doc("What was asked for.")
    status: str = _doc("One of: " + ", ".join(STATUSES) + ".")
    reason: str = _doc("Why, for any status but 'ok' ('' when ok).", "")
    detail: str = _doc("Extra diagnostics, e.g. the end of a traceback.", "")
    metrics: Metrics = _doc("What was measured.", None)
    numerics: NumericsCheck = _doc("Comparison with the eager fp32 reference.", None)
    provenance: Provenance = _doc("Software and hardware.", None)
    conditions: Conditions = _doc("What else ran during the measured window.", None)
    profile: Profile = _doc("Where a step's time goes, from profiled steps after the window.", None)
    started_at: str = _doc("UTC start time, ISO 8601.", "")
    finished_at: str = _doc("UTC end time, ISO 8601.", "")
    duration_s: Optional[float] = _doc("Wall time of the whole cell process.", None)
    schema_version: int = _doc("Version of this record layout.", SCHEMA_VERSION)

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
