"""Distributed variants (ddp, fsdp): knobs, what each torch can run, the launch through torchrun,
one record from several ranks, and failing ranks.

The fast tests run a rank in this process (world size 1, gloo) or check the pure parts; those
marked slow start real torchrun jobs of 2 CPU processes (1 thread each) through the watchdog,
which on a 2-core machine takes 10 to 40 s per cell, most of it three interpreters importing
torch.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest
import torch
from helpers import benchmark_python, with_sources

from ptspeed.cell.checks import check_cell
from ptspeed.cell.faults import SLOW_SAMPLING_S
from ptspeed.cell.harness import run_cell
from ptspeed.cell.parallelism.distributed import Rank
from ptspeed.cell.record import CellSpec, Record
from ptspeed.cell.variants.knobs import parse_knobs, threads_per_process
from ptspeed.cell.variants.support import unsupported_reason
from ptspeed.errors import BadInput
from ptspeed.launch.torchrun import (
    launcher_failures,
    merged_record,
    torchrun_command,
    write_rank_outcome,
)
from ptspeed.launch.watchdog import run_cell_in_worker
from ptspeed.models import Sizes, get_model

ROOT = Path(__file__).resolve().parents[1]
CELL_TIMEOUT_S = 300.0
FAILURE_BOUND_S = 150.0  # a failing rank ends its cell long before the cell's limit

# torchrun's failure summaries as torch 2.14.1 and 1.13.1 print them (rank 1 SIGKILLed; 2.14
# also lists rank 0, which torchrun itself terminated).
SUMMARY_2_14 = """\
crash.py FAILED
-------------------------------------------------------
Failures:
[1]:
  time      : 2026-11-30_20:08:10
  host      : localhost
  rank      : 0 (local_rank: 0)
  exitcode  : -15 (pid: 14854)  (SIGTERM)
  error_file: <N/A>
  traceback : Signal 15 (SIGTERM) received by PID 14854
-------------------------------------------------------
Root Cause (first observed failure):
[0]:
  time      : 2026-11-30_20:08:10
  host      : localhost
  rank      : 1 (local_rank: 1)
  exitcode  : -9 (pid: 14855)  (SIGKILL)
  error_file: <N/A>
  traceback : Signal 9 (SIGKILL) received by PID 14855
=======================================================
"""
SUMMARY_1_13 = """\
Failures:
  <NO_OTHER_FAILURES>
------------------------------------------------------
Root Cause (first observed failure):
[0]:
  time      : 2026-11-30_20:08:31
  host      : localhost
  rank      : 1 (local_rank: 1)
  exitcode  : -9 (pid: 18617)
  error_file: <N/A>
  traceback : Signal 9 (SIGKILL) received by PID 18617
"""


def cell(knobs: str, **fields: Any) -> CellSpec:
    """A tiny mlp cell on the CPU: 1 thread per process, one warm-up and two measured steps."""
    world_size = parse_knobs(knobs).world_size
    settings: dict[str, Any] = {
        "batch_size": 4,
        "warmup_steps": 1,
        "measured_steps": 2,
        "numerics_steps": 1,
        "device": "cpu",
        "threads": world_size,
        "timeout_s": CELL_TIMEOUT_S,
        **fields,
    }
    return CellSpec(model="mlp", variant=knobs, knobs=knobs, mode="train", **settings)


# --- knobs ------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("text", "world_size", "parallel", "offload"),
    [
        ("eager", 1, None, False),
        ("compile+amp", 1, None, False),
        ("ddp", 2, "ddp", False),
        ("ddp+procs=8", 8, "ddp", False),
        ("fsdp", 2, "fsdp", False),
        ("fsdp=offload+procs=3", 3, "fsdp", True),
        ("procs=1+ddp", 1, "ddp", False),
    ],
)
def test_world_size_of_knobs(text: str, world_size: int, parallel: str, offload: bool) -> None:
    knobs = parse_knobs(text)
    assert (knobs.world_size, knobs.parallel, knobs.cpu_offload) == (world_size, parallel, offload)


@pytest.mark.parametrize(
    ("text", "fragment"),
    [
        ("procs=2", "procs needs ddp or fsdp"),
        ("ddp+fsdp", "ddp and fsdp cannot be combined"),
        ("fsdp=offload+ddp", "ddp and fsdp cannot be combined"),
        ("ddp+procs=0", "procs=0 must be an integer from 1 to 64"),
        ("ddp+procs=65", "procs=65 must be an integer from 1 to 64"),
        ("fsdp=sharded", "fsdp=sharded is not one of offload"),
    ],
)
def test_bad_distributed_knobs_are_one_clear_line(text: str, fragment: str) -> None:
    with pytest.raises(BadInput) as caught:
        parse_knobs(text)
    assert str(caught.value).startswith("knobs: ") and fragment in str(caught.value)
    assert "\n" not in str(caught.value)


@pytest.mark.parametrize("fault", ["rank-error", "rank-crash"])
@pytest.mark.parametrize("knobs", ["eager", "ddp+procs=1"])
def test_rank_faults_need_several_processes(fault: str, knobs: str) -> None:
    with pytest.raises(BadInput, match=f"fault: {fault} needs a ddp or fsdp variant"):
        check_cell(cell(knobs, fault=fault))
    check_cell(cell("fsdp", fault=fault))


def reason(text: str, device: str, torch_version: tuple[int, int], python=(3, 10)) -> str:
    return unsupported_reason(parse_knobs(text), device, torch_version, python, False)


@pytest.mark.parametrize(
    ("text", "device", "torch_version", "fragment"),
    [
        # Tried with 2 gloo processes: FSDP fails on the CPU in 1.13.1 and 2.0.1.
        ("fsdp", "cpu", (1, 13), "fsdp on the CPU needs PyTorch >= 2.1"),
        ("fsdp", "cpu", (2, 0), "FSDP in 2.0 needs CUDA"),
        # FSDP pins offloaded shards (pin_memory), which fails without CUDA in 2.14.1 too.
        ("fsdp=offload", "cpu", (2, 14), "fsdp=offload needs a CUDA device"),
        ("fsdp=offload", "cpu", (1, 13), "fsdp=offload needs a CUDA device"),
        ("fsdp+amp=fp16", "cuda", (2, 14), "ShardedGradScaler"),
        ("fsdp+amp", "cuda", (1, 13), "ShardedGradScaler"),
        ("ddp+cudagraphs", "cuda", (2, 14), "cudagraphs with ddp"),
        ("fsdp+cudagraphs", "cuda", (2, 14), "cudagraphs with fsdp"),
        ("ddp+compile", "cpu", (1, 13), "torch.compile needs PyTorch >= 2.0"),
    ],
)
def test_unsupported_distributed_variants_are_named(
    text: str, device: str, torch_version: tuple[int, int], fragment: str
) -> None:
    assert fragment in reason(text, device, torch_version)


@pytest.mark.parametrize(
    ("text", "device", "torch_version"),
    [
        # Ran on the CPU with 2 gloo processes: ddp in 1.13.1, 2.0.1 and 2.14.1 (also with
        # amp=bf16, and with compile in 2.0.1 and 2.14.1); fsdp, fsdp+compile and fsdp+amp=bf16
        # in 2.14.1.
        ("ddp", "cpu", (1, 13)),
        ("ddp+amp=bf16", "cpu", (1, 13)),
        ("ddp+compile", "cpu", (2, 0)),
        ("fsdp", "cpu", (2, 14)),
        ("fsdp+compile+amp=bf16", "cpu", (2, 14)),
        ("fsdp=offload", "cuda", (1, 13)),
        ("fsdp+amp=bf16", "cuda", (2, 0)),
        ("ddp+amp=fp16+procs=8", "cuda", (2, 14)),
    ],
)
def test_supported_distributed_variants_have_no_reason(
    text: str, device: str, torch_version: tuple[int, int]
) -> None:
    assert reason(text, device, torch_version) == ""


@pytest.mark.filterwarnings("ignore:FSDP is switching to use `NO_SHARD`")
def test_fsdp_offload_really_needs_cuda_here(single_rank_group: None) -> None:
    """The evidence behind the fsdp=offload reason: when this fails, torch learned to offload
    on the CPU, and the reason must go."""
    if torch.cuda.is_available():
        pytest.skip("a CUDA device can pin memory")
    from torch.distributed.fsdp import CPUOffload, FullyShardedDataParallel

    torch.distributed.init_process_group("gloo")
    model = get_model("mlp").build(Sizes(batch_size=2))
    offloaded = FullyShardedDataParallel(
        model, device_id=torch.device("cpu"), cpu_offload=CPUOffload(offload_params=True)
    )
    with pytest.raises(RuntimeError, match=r"NVIDIA driver|CUDA|accelerator"):
        offloaded(torch.zeros(2, 1000))


# --- the pure launcher side -------------------------------------------------------------------


def test_the_torchrun_command_picks_a_free_port_and_speaks_torch_1_13() -> None:
    command = torchrun_command("python", 3, ["SPEC", "OUT"])
    assert command[:3] == ["python", "-m", "torch.distributed.run"]
    assert "--standalone" not in command  # fixed port 29400 in torch 1.13
    joined = " ".join(command)
    assert "--nproc_per_node 3" in joined and "--rdzv_endpoint localhost:0" in joined
    assert command[-5:] == ["-m", "ptspeed.launch.worker", "--rank", "SPEC", "OUT"]


@pytest.mark.parametrize(("requested", "world_size", "each"), [(2, 2, 1), (8, 3, 2), (1, 4, 1)])
def test_threads_are_shared_out_among_ranks(requested: int, world_size: int, each: int) -> None:
    assert threads_per_process(requested, world_size) == each
    assert threads_per_process(0, 1) == len(os.sched_getaffinity(0))


def test_launcher_failures_are_read_from_either_torch() -> None:
    assert launcher_failures(SUMMARY_2_14) == {0: -15, 1: -9}
    assert launcher_failures(SUMMARY_1_13) == {1: -9}
    assert launcher_failures("Traceback ...\nRuntimeError: boom\n") == {}


def outcome(tmp_path: Path, rank: int, status: str, reason: str = "", at: float | None = None):
    record = Record(cell=cell("ddp"), status=status, reason=reason)
    record.provenance.torch = "2.14.1"
    record.metrics.world_size = 2
    write_rank_outcome(tmp_path / "record.json", rank, record, at)


def merge(tmp_path: Path, launcher_output: str = "", world_size: int = 2) -> Record | None:
    return merged_record(cell("ddp"), tmp_path / "record.json", world_size, launcher_output, 1)


@pytest.mark.parametrize("status", ["ok", "unsupported", "numerics_mismatch"])
def test_finished_ranks_give_rank_0s_record(status: str, tmp_path: Path) -> None:
    outcome(tmp_path, 0, status, "rank 0's")
    outcome(tmp_path, 1, status)
    record = merge(tmp_path)
    assert (record.status, record.reason, record.metrics.world_size) == (status, "rank 0's", 2)


def test_a_rank_killed_by_a_signal_is_the_cause_not_its_peers_errors(tmp_path: Path) -> None:
    outcome(tmp_path, 0, "failed", "RuntimeError: Connection closed by peer", at=1.0)
    record = merge(tmp_path, SUMMARY_1_13)
    assert record.status == "failed"
    assert record.reason.startswith("rank 1 of 2: killed by SIGKILL")
    assert record.provenance.torch == "2.14.1"  # from the rank that wrote one


def test_the_first_rank_to_fail_is_the_cause(tmp_path: Path) -> None:
    outcome(tmp_path, 0, "failed", "RuntimeError: Connection closed by peer", at=2.5)
    outcome(tmp_path, 1, "oom", "out of memory at batch_size 4", at=2.25)
    record = merge(tmp_path, SUMMARY_2_14.replace("-9 (pid", "1 (pid"))
    assert record.status == "oom"
    assert record.reason == "rank 1 of 2: out of memory at batch_size 4"


def test_torchruns_own_termination_is_the_last_explanation(tmp_path: Path) -> None:
    outcome(tmp_path, 1, "ok")
    record = merge(tmp_path, "rank      : 0 (local_rank: 0)\n  exitcode  : -15 (pid: 1)")
    assert record.reason == "rank 0 of 2: killed by SIGTERM"


def test_missing_ranks_without_a_launcher_summary(tmp_path: Path) -> None:
    assert merge(tmp_path) is None  # the watchdog then reports torchrun's exit
    outcome(tmp_path, 0, "ok")
    record = merge(tmp_path, world_size=3)
    assert record.status == "failed"
    assert record.reason == "rank(s) 1, 2 of 3 wrote no result; torchrun exited with 1"


# --- a rank in this process (world size 1) ----------------------------------------------------


@pytest.mark.slow
@pytest.mark.filterwarnings("ignore:FSDP is switching to use `NO_SHARD`")
@pytest.mark.parametrize("knobs", ["ddp+procs=1", "fsdp+procs=1"])
def test_a_single_rank_measures_and_matches_eager(knobs: str, single_rank_group: None) -> None:
    spec = cell(knobs, warmup_steps=2, numerics_steps=2)
    record = run_cell(spec, Rank.from_environment(spec))
    assert record.status == "ok", record.reason
    metrics = record.metrics
    assert (metrics.world_size, metrics.distributed_backend) == (1, "gloo")
    assert metrics.rank_measured_wall_s == [metrics.measured_wall_s]
    assert metrics.throughput_samples_per_s == pytest.approx(4 * 2 / metrics.measured_wall_s)
    errors = record.numerics.errors
    assert record.numerics.passed and errors["loss"] < 1e-6 and errors["update"] < 1e-3
    # FSDP shards the gradients: its update, gathered whole, is what shows a wrong reduction.
    assert ("gradients" in errors) == knobs.startswith("ddp")
    if knobs.startswith("fsdp"):  # each block its own unit: the two Linear layers and the root
        assert (
            metrics.fsdp_wrap_policy == "transformer_auto_wrap_policy per block: Linear (3 units)"
        )


@pytest.mark.slow
def test_a_wrong_distributed_step_fails_the_numerics_gate(single_rank_group: None) -> None:
    spec = cell("ddp+procs=1", fault="numerics")
    record = run_cell(spec, Rank.from_environment(spec))
    assert record.status == "numerics_mismatch", record.reason


def test_a_distributed_variant_never_runs_alone_as_if_it_were_eager() -> None:
    record = run_cell(cell("ddp"))
    assert record.status == "failed"
    assert "ddp runs under torchrun" in record.reason


def test_fsdp_offload_on_the_cpu_is_unsupported_in_a_rank(single_rank_group: None) -> None:
    spec = cell("fsdp=offload+procs=1")
    record = run_cell(spec, Rank.from_environment(spec))
    assert record.status == "unsupported"
    assert "fsdp=offload needs a CUDA device" in record.reason


# --- real torchrun jobs of 2 processes --------------------------------------------------------


def run_job(spec: CellSpec, tmp_path: Path, python: str | None = None) -> tuple[Record, float]:
    begun = time.monotonic()
    out = tmp_path / f"{spec.variant}-{spec.fault or 'ok'}.json"
    record = run_cell_in_worker(spec, out, **({"python": python} if python else {}))
    assert Record.from_dict(json.loads(out.read_text())).status == record.status
    return record, time.monotonic() - begun


def assert_global_throughput(record: Record, spec: CellSpec) -> None:
    metrics = record.metrics
    assert record.status == "ok", f"{record.reason}\n{record.detail}"
    assert metrics.world_size == 2 and metrics.batch_size_per_process == spec.batch_size
    assert metrics.distributed_backend == "gloo"
    assert len(metrics.rank_measured_wall_s) == 2 and min(metrics.rank_measured_wall_s) > 0
    assert metrics.measured_wall_s == max(metrics.rank_measured_wall_s)
    global_samples = 2 * spec.batch_size * spec.measured_steps
    assert metrics.throughput_samples_per_s == pytest.approx(
        global_samples / metrics.measured_wall_s
    )
    assert record.numerics.checked and record.numerics.passed
    assert record.provenance.torch_threads == 1


@pytest.mark.slow
@pytest.mark.parametrize("knobs", ["ddp", "fsdp"])
def test_two_processes_train_like_eager_and_report_global_throughput(
    knobs: str, tmp_path: Path
) -> None:
    spec = cell(knobs)
    record, _ = run_job(spec, tmp_path)
    assert_global_throughput(record, spec)
    eager = run_cell(cell("eager", threads=1))
    assert record.metrics.loss_first == eager.metrics.loss_first  # the same first step
    assert record.numerics.variant_values == record.numerics.reference_values


@pytest.mark.slow
@pytest.mark.parametrize(
    ("fault", "reason"),
    [
        ("rank-error", "rank 1 of 2: RuntimeError: injected fault: error in the first step"),
        ("rank-crash", "rank 1 of 2: killed by SIGKILL"),
    ],
)
def test_a_failing_rank_is_one_failed_record_naming_it(
    fault: str, reason: str, tmp_path: Path
) -> None:
    record, took_s = run_job(cell("ddp", fault=fault), tmp_path)
    assert record.status == "failed"
    assert record.reason.startswith(reason)
    assert took_s < FAILURE_BOUND_S
    assert record.duration_s < FAILURE_BOUND_S


def descendants(pid: int) -> set[int]:
    children: dict[int, list[int]] = {}
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            fields = stat.read_text().rsplit(")", 1)[1].split()
        except OSError:
            continue
        children.setdefault(int(fields[1]), []).append(int(stat.parent.name))
    found, todo = set(), [pid]
    while todo:
        for child in children.get(todo.pop(), []):
            found.add(child)
            todo.append(child)
    return found


def rank_processes(pids: set[int]) -> set[int]:
    ranks = set()
    for pid in pids:
        try:
            arguments = (Path("/proc") / str(pid) / "cmdline").read_bytes().split(b"\0")
        except OSError:
            continue
        launched_rank = b"ptspeed.launch.worker\0--rank" in b"\0".join(arguments)
        if launched_rank and b"torch.distributed.run" not in arguments:  # not torchrun itself
            ranks.add(pid)
    return ranks


def wait_until(condition: Any, within_s: float) -> bool:
    deadline = time.monotonic() + within_s
    while time.monotonic() < deadline:
        if condition():
            return True
        time.sleep(0.2)
    return False


@pytest.mark.slow
def test_ranks_die_with_a_killed_watchdog(tmp_path: Path) -> None:
    out = tmp_path / "hang.json"
    arguments = ["--model", "mlp", "--variant", "ddp", "--batch-size", "4", "--device", "cpu"]
    arguments += ["--threads", "2", "--warmup-steps", "1", "--measured-steps", "1"]
    arguments += ["--numerics-steps", "1"]
    arguments += ["--fault", "hang", "--timeout-s", str(CELL_TIMEOUT_S), "--out", str(out)]
    watchdog = subprocess.Popen(
        [sys.executable, "-m", "ptspeed", "cell", *arguments],
        env=with_sources(),
        stderr=subprocess.DEVNULL,
    )
    try:
        assert wait_until(lambda: len(rank_processes(descendants(watchdog.pid))) == 2, 180)
        ranks = rank_processes(descendants(watchdog.pid))
        time.sleep(5)  # well into the run (importing torch, or the hang)
    finally:
        watchdog.kill()
        watchdog.wait()
    assert wait_until(lambda: not any(Path(f"/proc/{pid}").exists() for pid in ranks), 30)
    assert not out.exists()


@pytest.mark.slow
@pytest.mark.crossversion
def test_ddp_with_two_processes_under_torch_1_13(tmp_path: Path) -> None:
    spec = cell("ddp")
    record, _ = run_job(spec, tmp_path, python=benchmark_python("torch-1.13"))
    assert record.provenance.torch.startswith("1.13.1")
    assert_global_throughput(record, spec)


@pytest.mark.slow
def test_one_ranks_slow_sampling_does_not_reach_the_clocks(tmp_path: Path) -> None:
    """The last rank samples the node a second longer before its window (nvidia-smi can): the
    ranks' clocks start together after every rank has sampled, so neither the slowest rank's
    wall (the throughput's) nor the early rank's first measured step grows by it."""
    fields = {"batch_size": 64, "measured_steps": 20}
    quiet, _ = run_job(cell("ddp", **fields), tmp_path)
    slowed, _ = run_job(cell("ddp", fault="rank-slow-sampling", **fields), tmp_path)
    for record in (quiet, slowed):
        assert record.status == "ok", f"{record.reason}\n{record.detail}"
    assert slowed.cell.fault == "rank-slow-sampling"
    assert slowed.metrics.measured_wall_s < quiet.metrics.measured_wall_s + SLOW_SAMPLING_S / 2
    assert slowed.metrics.step_times_s[0] < SLOW_SAMPLING_S / 2
    # Each rank sampled its own node: the record keeps every rank's figures (on this CPU no
    # GPU samples and no RAPL: no energy, saying on how many ranks).
    conditions = quiet.conditions
    assert conditions.rank_gpu_samples == [0, 0]
    assert len(conditions.rank_energy_j) == 2 and conditions.energy_j is None
    assert conditions.energy_not_measured.startswith("measured on 0 of 2 ranks; this rank: ")


def test_fsdp_with_channels_last_is_unsupported() -> None:
    """Its flat parameters would hand the weights back in NCHW: every step would convert."""
    knobs = parse_knobs("fsdp+channels_last")
    why = unsupported_reason(knobs, "cuda", (2, 14), (3, 10), image_model=True)
    assert why.startswith("fsdp with channels_last: FSDP's flat parameters give the weights")
    ddp = parse_knobs("ddp+channels_last")
    assert unsupported_reason(ddp, "cuda", (2, 14), (3, 10), image_model=True) == ""
