"""The cell record's parts of the measured window: what was measured in it (:class:`Metrics`)
and what else ran while it was measured (:class:`Conditions`). :mod:`ptspeed.cell.record` holds
them in the record beside the rest.

This module must import under Python 3.10 without torch: the cell watchdog uses it.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Optional

from ptspeed.cell.record_fields import documented


@dataclass
class Metrics:
    """What was measured. Times in seconds; absent values are null.

    In a distributed cell (world_size > 1) every process trains on its own batch of
    cell.batch_size samples: the throughput is global, and the times and peak memory are the
    largest over the processes, except step_times_s (those of rank 0).
    """

    throughput_samples_per_s: Optional[float] = documented(
        "world_size x batch_size x measured_steps / wall time of the measured steps (samples/s "
        "over all processes; batch_size is per process); modelpar/pipeline: batch_size x "
        "measured_steps / the slowest stage's wall time (the batch goes through every stage).",
        None,
    )
    measured_wall_s: Optional[float] = documented(
        "Wall time of the measured steps (synchronised).", None
    )
    step_time_p50_s: Optional[float] = documented("Median measured step time.", None)
    step_time_p90_s: Optional[float] = documented("90th percentile of measured step times.", None)
    step_time_mean_s: Optional[float] = documented("Mean measured step time.", None)
    step_times_s: list[float] = documented("Every measured step's time, in order.", [])
    first_step_s: Optional[float] = documented(
        "Time of the first step, compilation included (synchronised).", None
    )
    warmup_s: Optional[float] = documented(
        "Time of all warm-up steps, the first and the numerics check's copies included.", None
    )
    warmup_steps_run: Optional[int] = documented(
        "Warm-up steps run: at least cell.warmup_steps, more when the knob's one-off work and the "
        "check steps need them, or when a warm-up step still compiled.",
        None,
    )
    one_off_steps: Optional[int] = documented(
        "Steps that held one-off work of a knob (CUDA graph capture, cudagraph trees' recording, "
        "compilation and recompilations): all of them ended before the measured window.",
        None,
    )
    compiler_cache: str = documented(
        "'cold' when the cell's compiler cache directory started empty, 'warm' when it held an "
        "earlier trial's artefacts, '' when the cell does not compile or has no cache of its own.",
        "",
    )
    peak_memory_bytes: Optional[int] = documented(
        "Peak memory while stepping (see memory_kind).", None
    )
    memory_kind: str = documented(
        "'cuda_allocator_peak' (torch.cuda.max_memory_allocated) or 'process_peak_rss'.", ""
    )
    loss_first: Optional[float] = documented("Loss of the first step (train mode).", None)
    loss_last: Optional[float] = documented(
        "Loss of the last measured step (train mode); null when not finite (see non_finite_loss).",
        None,
    )
    late_loss: Optional[float] = documented(
        "Loss of step late_loss_step (train mode), which the late check holds against the eager "
        "cell's loss at the same step; null when not finite (see non_finite_loss).",
        None,
    )
    amp_scale_before: Optional[float] = documented(
        "GradScaler's loss scale just before the measured window (fp16 AMP; null otherwise).",
        None,
    )
    amp_scale_after: Optional[float] = documented("Its loss scale just after the window.", None)
    amp_skipped_steps: Optional[int] = documented(
        "Optimizer steps GradScaler skipped inside the window (an fp16 overflow halves the "
        "scale; a step that did no update is faster): log2 of the scale's fall, a lower bound "
        "should the scale also have grown (once per 2000 good steps); null without GradScaler.",
        None,
    )
    late_loss_step: Optional[int] = documented(
        "The step (counted from 1) of late_loss: eager's last, cell.warmup_steps (at least 1) + "
        "cell.measured_steps, which a cell with a longer warm-up also runs (train mode).",
        None,
    )
    non_finite_loss: str = documented(
        "'nan', 'inf' or '-inf' when the first, last or late loss was not finite (JSON cannot "
        "hold it); '' otherwise.",
        "",
    )
    flops_per_sample: Optional[float] = documented(
        "Model FLOPs per sample of one step, counted on the eager fp32 model (torch >= 2.1).", None
    )
    achieved_flops_per_s: Optional[float] = documented(
        "flops_per_sample x throughput_samples_per_s.", None
    )
    world_size: int = documented(
        "Processes that trained together (ddp/fsdp; the stages of modelpar/pipeline); 1 otherwise.",
        1,
    )
    batch_size_per_process: Optional[int] = documented(
        "Samples per step in each process (cell.batch_size); the global batch is world_size x it.",
        None,
    )
    distributed_backend: str = documented(
        "Process group backend of a distributed cell: 'nccl' (CUDA) or 'gloo' (CPU); '' otherwise.",
        "",
    )
    fsdp_wrap_policy: str = documented(
        "How FSDP split the model into units, e.g. 'per block: BertLayer (12 units)'; '' "
        "without fsdp.",
        "",
    )
    stage_split: str = documented(
        "How modelpar/pipeline cut the model's layers into stages, by layer index, name and "
        "parameters, e.g. '0-7 stem..layer3.0 8.5M | 8-17 layer3.1..fc 17.0M'; '' otherwise.",
        "",
    )
    attn_implementation: str = documented(
        "The attention implementation the model ran with, as transformers reports it "
        "(model.config._attn_implementation): 'sdpa' (torch's scaled_dot_product_attention) or "
        "'eager'; the attn knob's, else transformers' default for this torch. '' for models "
        "without one.",
        "",
    )
    compiled_graphs: Optional[int] = documented(
        "Graphs torch.compile compiled during the cell (Dynamo's stats/unique_graphs, "
        "recompilations included); null for cells that do not compile or where torch does not "
        "count them.",
        None,
    )
    graph_breaks: Optional[int] = documented(
        "Graph breaks Dynamo met while compiling (each splits a frame into graphs with Python "
        "between them); null as for compiled_graphs.",
        None,
    )
    graph_break_reasons: list[str] = documented(
        "The first five distinct graph-break reasons, each by its first line.", []
    )
    recompilations: Optional[int] = documented(
        "Compilations of code already compiled, after a guard failed (a new shape, a changed "
        "constant): torch 2.0 counts guard failures, later versions the compilations with a "
        "recompile reason (of the last 64 compilations); null as for compiled_graphs.",
        None,
    )
    recompile_reasons: list[str] = documented(
        "The first five distinct reasons for a recompilation (the guard that failed).", []
    )
    compile_time_by_phase_s: dict[str, float] = documented(
        "Seconds spent in each timed phase of the compiler over the cell "
        "(torch._dynamo.utils.compile_times: e.g. Dynamo's _compile, the backend call, "
        "Inductor's code generation; which phases depends on the torch version). Phases nest, "
        "so their sum is not the total; first_step_s holds the first compilation whole.",
        {},
    )
    rank_measured_wall_s: list[float] = documented(
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

    window_s: Optional[float] = documented(
        "Wall time between the two samples (the measured window).", None
    )
    window_started_unix_s: Optional[float] = documented(
        "When the measured window started (Unix time, seconds).", None
    )
    affinity_cpus: int = documented("CPUs the cell's process may run on (os.sched_getaffinity).", 0)
    node_cpus: int = documented("Logical CPUs of the node (os.cpu_count).", 0)
    pinned: Optional[bool] = documented("Whether the cell's CPUs are fewer than the node's.", None)
    busy_cpu_s: Optional[float] = documented(
        "Non-idle CPU time of the cell's CPUs over the window, every process's (/proc/stat; "
        "steal included).",
        None,
    )
    own_cpu_s: Optional[float] = documented(
        "CPU time of the cell's own processes inside the window: every process of its session "
        "(the worker's threads, its DataLoader and compile workers, torchrun's ranks), a "
        "process reaped in the window counted for its time there only; at most what the "
        "cell's CPUs give in the window (past it: clamped, other_cpu_s null, not_readable "
        "says why).",
        None,
    )
    other_cpu_s: Optional[float] = documented(
        "busy_cpu_s - own_cpu_s: CPU time other processes (and the hypervisor's steal) took on "
        "the cell's CPUs; accurate to a few cpu_tick_s.",
        None,
    )
    steal_cpu_s: Optional[float] = documented(
        "CPU time the hypervisor gave to other guests on the cell's CPUs (/proc/stat steal).",
        None,
    )
    cpu_tick_s: Optional[float] = documented("Resolution of the CPU times (1 / USER_HZ).", None)
    load_average_start: Optional[float] = documented("1-minute load average at the start.", None)
    load_average_end: Optional[float] = documented("1-minute load average at the end.", None)
    cpu_governors: Optional[str] = documented(
        "cpufreq scaling governor(s) of the cell's CPUs; null where cpufreq is absent (most "
        "VMs and containers).",
        None,
    )
    cpu_mhz_min: Optional[float] = documented(
        "Lowest clock of the cell's CPUs at the two samples (cpufreq).", None
    )
    cpu_mhz_max: Optional[float] = documented("Highest, likewise.", None)
    cpu_mhz_limit: Optional[float] = documented("Their maximum clock (cpuinfo_max_freq).", None)
    gpu_source: str = documented(
        "'nvml': sampled in the window every ~50 ms through the driver's NVML; 'nvidia-smi': "
        "where NVML could not be opened, at the window's two ends only; '' off CUDA or "
        "unreadable.",
        "",
    )
    gpu_samples: int = documented("GPU samples taken during the window (NVML).", 0)
    gpu_sm_mhz_min: Optional[float] = documented("Lowest SM clock over the window's samples.", None)
    gpu_sm_mhz_median: Optional[float] = documented("Median SM clock over them (NVML).", None)
    gpu_sm_mhz_max: Optional[float] = documented("Highest SM clock over them.", None)
    gpu_sm_mhz_limit: Optional[float] = documented("The GPU's maximum SM clock.", None)
    gpu_temperature_c_max: Optional[float] = documented("Highest GPU temperature (°C).", None)
    gpu_power_w_max: Optional[float] = documented("Highest power draw (W).", None)
    gpu_power_w_mean: Optional[float] = documented("Mean power draw over the samples (W).", None)
    gpu_power_limit_w: Optional[float] = documented("Enforced power limit (W).", None)
    gpu_throttle_reasons: str = documented(
        "Clock throttle (event) reasons active in any sample (NVML's names, idle left out), "
        "comma-separated.",
        "",
    )
    gpu_other_processes: Optional[int] = documented(
        "Most compute processes on the GPU at a sample that are not the cell's.", None
    )
    energy_j: Optional[float] = documented(
        "Energy of the window (J): the GPU's total-energy counter (NVML) on CUDA, the CPU "
        "packages' counters (RAPL) on the CPU; null when not measured.",
        None,
    )
    energy_source: str = documented("'nvml', 'rapl', or '' when not measured.", "")
    energy_not_measured: str = documented("Why energy_j is null ('' when measured).", "")
    rank_energy_j: list[Optional[float]] = documented(
        "A ddp/fsdp/staged cell's energy_j of each rank (its own GPU), rank 0 first; [] for "
        "one process. Their sum is energy_j.",
        [],
    )
    rank_gpu_sm_mhz_median: list[Optional[float]] = documented(
        "Each rank's median SM clock over its window's samples.", []
    )
    rank_gpu_samples: list[int] = documented("Each rank's GPU samples in its window.", [])
    sampler_cpu_s: Optional[float] = documented(
        "CPU time the in-window GPU sampling thread took (its cost to the cell).", None
    )
    sampling_s: Optional[float] = documented("What taking the two samples cost (seconds).", None)
    probe_cpu_gemm_s_before: Optional[float] = documented(
        "The machine-speed probe just before the window (ptspeed.cell.measurement.probe): seconds "
        "of its fixed CPU GEMM work (see probe_work: since issue 36 the median of repeated runs of "
        "it, one run before), on probe_threads threads; null: not probed (an older record, a rank "
        "that does not report).",
        None,
    )
    probe_cpu_gemm_s_after: Optional[float] = documented("The same just after the window.", None)
    probe_cpu_memory_s_before: Optional[float] = documented(
        "Seconds of the probe's fixed CPU memory pass just before the window.", None
    )
    probe_cpu_memory_s_after: Optional[float] = documented("The same just after the window.", None)
    probe_gpu_gemm_s_before: Optional[float] = documented(
        "Seconds of the probe's fixed GEMM on the cell's GPU just before the window (CUDA "
        "events); null off CUDA.",
        None,
    )
    probe_gpu_gemm_s_after: Optional[float] = documented("The same just after the window.", None)
    probe_gpu_sm_mhz_before: Optional[float] = documented(
        "The GPU's SM clock just after the probe's GEMM before the window (NVML).", None
    )
    probe_gpu_sm_mhz_after: Optional[float] = documented("The same after the window.", None)
    probe_threads: Optional[int] = documented("torch threads the CPU probe ran on.", None)
    probe_cost_s: Optional[float] = documented(
        "Wall time of both probes (outside the window; what they added to the cell).", None
    )
    probe_work: str = documented(
        "The probe's fixed work and the build that ran it, e.g. 'median of 5 repetitions: CPU: "
        "16 x fp32 GEMM 256^2, …; torch 2.0.1+cpu, BLAS mkl': probes are compared only where it "
        "and the environment are the same.",
        "",
    )
    not_readable: str = documented("What could not be read here, '; '-separated.", "")
