"""The cell record: round trips, the derived JSON Schema, validation, atomic writes."""

from __future__ import annotations

import dataclasses
import json
import math
import os
import re
import socket
import stat
import subprocess
import sys
from pathlib import Path

import pytest
from helpers import fill, small_disk
from jsonschema import Draft202012Validator
from jsonschema.exceptions import ValidationError

from ptspeed.cell.files import write_atomic
from ptspeed.cell.record import (
    STATUSES,
    CellSpec,
    NumericsCheck,
    Provenance,
    Record,
    read_record,
    write_record,
)
from ptspeed.cell.record_window import Metrics
from ptspeed.cell.schema import json_schema
from ptspeed.errors import WriteFailed


def full_record() -> Record:
    """A record with every nested part set to something other than its default."""
    return Record(
        cell=CellSpec(
            model="mlp", variant="amp", knobs="amp=bf16", mode="train", batch_size=4, fault=""
        ),
        status="ok",
        metrics=Metrics(
            throughput_samples_per_s=123.5,
            measured_wall_s=0.25,
            step_time_p50_s=0.125,
            step_times_s=[0.125, 0.125],
            peak_memory_bytes=1 << 20,
            memory_kind="process_peak_rss",
            loss_first=2.5,
            loss_last=2.0,
            attn_implementation="sdpa",
            compiled_graphs=2,
            graph_breaks=1,
            graph_break_reasons=["call_function BuiltinVariable(float)"],
            compile_time_by_phase_s={"_compile": 0.5},
        ),
        numerics=NumericsCheck(
            checked=True,
            compared="loss",
            precision="bf16",
            reference="fp64",
            tolerance=3e-2,
            max_relative_error=1e-4,
            variant_values=[2.5, 2.0],
            passed=True,
        ),
        provenance=Provenance(torch="2.14.1", packages={"torch": "2.14.1"}, git_dirty=False),
        started_at="2024-01-01T00:00:00+00:00",
        duration_s=1.5,
    )


def files_in(directory: Path) -> list[str]:
    return sorted(p.name for p in directory.iterdir())


def test_round_trip_through_dict_and_json(tmp_path: Path) -> None:
    record = full_record()
    assert Record.from_dict(record.to_dict()) == record
    write_record(record, tmp_path / "cell.json")
    assert read_record(tmp_path / "cell.json") == record


def test_from_dict_fills_absent_fields_with_defaults() -> None:
    data = full_record().to_dict()
    del data["detail"], data["metrics"]["loss_last"]
    record = Record.from_dict(data)
    assert record.detail == ""
    assert record.metrics.loss_last is None


def test_schema_is_valid_draft_2020_12() -> None:
    schema = json_schema()
    Draft202012Validator.check_schema(schema)
    assert schema["$schema"] == "https://json-schema.org/draft/2020-12/schema"
    assert schema["properties"]["status"]["enum"] == list(STATUSES)


PUBLISHED_SCHEMA = Path(__file__).parent / "fixtures" / "record.schema.json"


def test_the_schema_is_the_published_one() -> None:
    """The record layout readers rely on (the report, compare.py, other people's scripts) is
    the committed file, not whatever the dataclasses say today: a change to a field fails here
    until the file is regenerated (``python -m ptspeed schema > tests/fixtures/
    record.schema.json``) and, where old records no longer read, SCHEMA_VERSION is raised."""
    published = json.loads(PUBLISHED_SCHEMA.read_text(encoding="utf-8"))
    assert json_schema() == published
    assert published["properties"]["schema_version"]["type"] == "integer"


def test_a_record_written_by_hand_reads_and_validates() -> None:
    """A record as another tool would write it, spelled out here rather than derived from the
    dataclasses: every part present, nothing extra."""
    data = {
        "cell": {
            "model": "mlp", "source": "", "shape": "", "variant": "eager", "knobs": "eager",
            "mode": "train", "batch_size": 4, "image_size": 224, "seq_len": 128, "env": "host",
            "platform": "",
            "trial": 0, "seed": 0, "warmup_steps": 3, "measured_steps": 10, "numerics_steps": 2,
            "device": "cpu", "threads": 0, "timeout_s": 1800.0, "fault": "",
            "compiler_cache": "", "compiler_cache_cold": False, "numerics_by_first_trial": False,
            "profile_steps": 0, "profile_trace": "", "retried_from_batch_size": None,
        },
        "status": "failed", "reason": "RuntimeError: boom", "detail": "",
        "metrics": {
            "throughput_samples_per_s": None, "measured_wall_s": None, "step_time_p50_s": None,
            "step_time_p90_s": None, "step_time_mean_s": None, "step_times_s": [],
            "first_step_s": None, "warmup_s": None, "warmup_steps_run": None,
            "one_off_steps": None, "compiler_cache": "", "peak_memory_bytes": None,
            "memory_kind": "", "loss_first": None, "loss_last": None, "late_loss": None,
            "amp_scale_before": None, "amp_scale_after": None, "amp_skipped_steps": None,
            "late_loss_step": None, "non_finite_loss": "",
            "flops_per_sample": None, "achieved_flops_per_s": None, "world_size": 1,
            "batch_size_per_process": None, "distributed_backend": "", "fsdp_wrap_policy": "",
            "stage_split": "", "attn_implementation": "", "compiled_graphs": None,
            "graph_breaks": None, "graph_break_reasons": [], "recompilations": None,
            "recompile_reasons": [], "compile_time_by_phase_s": {}, "rank_measured_wall_s": [],
        },
        "numerics": {
            "checked": False, "reason": "", "compared": "", "precision": "", "reference": "",
            "tolerance": None, "check_steps": 0, "first_check_step": None, "worst_quantity": "",
            "errors": {}, "allowed_errors": {}, "eager_error": None, "eager_spread_error": None,
            "allowed_error": None, "max_relative_error": None, "variant_values": [],
            "reference_values": [], "fp64_values": [], "passed": None,
        },
        "provenance": {
            "torch": "", "cuda": "", "cudnn": "", "device_name": "", "device_index": None,
            "cuda_visible_devices": "", "gpu_assignment": "", "gpu_driver": "",
            "cpu_model": "", "cpu_count": 0, "torch_threads": 0, "python": "", "packages": {},
            "nccl": "", "tf32_matmul": None, "tf32_cudnn": None, "cudnn_benchmark": None,
            "float32_matmul_precision": "", "allocator_settings": {},
            "cleared_host_variables": {}, "kept_host_variables": {}, "gpu_state": "",
            "git_commit": "", "git_dirty": None, "hostname": "", "slurm_job_id": "",
            "slurm_partition": "", "slurm_node": "", "container_image": "",
            "container_digest": "", "platform": "", "os_release": "",
        },
        "conditions": {
            "window_s": None, "window_started_unix_s": None, "affinity_cpus": 0, "node_cpus": 0,
            "pinned": None, "busy_cpu_s": None, "own_cpu_s": None, "other_cpu_s": None,
            "steal_cpu_s": None, "cpu_tick_s": None, "load_average_start": None,
            "load_average_end": None, "cpu_governors": None, "cpu_mhz_min": None,
            "cpu_mhz_max": None, "cpu_mhz_limit": None, "gpu_source": "", "gpu_samples": 0,
            "gpu_sm_mhz_min": None, "gpu_sm_mhz_median": None, "gpu_sm_mhz_max": None,
            "gpu_sm_mhz_limit": None, "gpu_temperature_c_max": None, "gpu_power_w_max": None,
            "gpu_power_w_mean": None, "gpu_power_limit_w": None, "gpu_throttle_reasons": "",
            "gpu_other_processes": None, "energy_j": None, "energy_source": "",
            "energy_not_measured": "", "rank_energy_j": [], "rank_gpu_sm_mhz_median": [],
            "rank_gpu_samples": [], "sampler_cpu_s": None, "sampling_s": None,
            "probe_cpu_gemm_s_before": None, "probe_cpu_gemm_s_after": None,
            "probe_cpu_memory_s_before": None, "probe_cpu_memory_s_after": None,
            "probe_gpu_gemm_s_before": None, "probe_gpu_gemm_s_after": None,
            "probe_gpu_sm_mhz_before": None, "probe_gpu_sm_mhz_after": None,
            "probe_threads": None, "probe_cost_s": None, "probe_work": "",
            "not_readable": "",
        },
        "profile": {
            "profiled": False, "reason": "", "steps": 0, "activities": "", "timeline": "",
            "step_time_s": None, "time_by_kind_s": {}, "sum_error": None, "sums": None,
            "tolerance": None, "kernels_per_step": None, "copies_per_step": None,
            "ops_by_kind": {}, "other_threads_s": None, "trace": "", "notes": "",
        },
        "started_at": "", "finished_at": "", "duration_s": None, "schema_version": 2,
    }  # fmt: skip
    Draft202012Validator(json_schema()).validate(data)
    assert Record.from_dict(data).to_dict() == data


@pytest.mark.parametrize("status", STATUSES)
def test_written_records_of_every_status_validate(tmp_path: Path, status: str) -> None:
    record = dataclasses.replace(full_record(), status=status, reason="because")
    write_record(record, tmp_path / "cell.json")
    data = json.loads((tmp_path / "cell.json").read_text(encoding="utf-8"))
    Draft202012Validator(json_schema()).validate(data)


@pytest.mark.parametrize(
    ("path", "value"),
    [
        (("status",), "crashed"),
        (("cell", "batch_size"), "four"),
        (("metrics", "step_times_s"), [0.1, None]),
        (("provenance", "unexpected"), 1),
        (("numerics", "passed"), "yes"),
    ],
)
def test_schema_rejects_malformed_records(path: tuple[str, ...], value: object) -> None:
    data = full_record().to_dict()
    target = data
    for key in path[:-1]:
        target = target[key]
    target[path[-1]] = value
    with pytest.raises(ValidationError):
        Draft202012Validator(json_schema()).validate(data)


def test_schema_rejects_a_record_missing_a_field() -> None:
    data = full_record().to_dict()
    del data["reason"]
    with pytest.raises(ValidationError, match="reason"):
        Draft202012Validator(json_schema()).validate(data)


def test_wrong_status_is_rejected_at_construction() -> None:
    with pytest.raises(ValueError, match=r"^status: 'crashed' is not one of ok, unsupported"):
        Record(cell=full_record().cell, status="crashed")


def test_write_atomic_replaces_the_whole_file(tmp_path: Path) -> None:
    target = tmp_path / "out" / "cell.json"
    write_atomic(target, "old\n")
    write_atomic(target, "new\n")
    assert target.read_text(encoding="utf-8") == "new\n"
    assert files_in(target.parent) == ["cell.json"]


def test_failed_serialisation_keeps_the_old_file(tmp_path: Path) -> None:
    target = tmp_path / "cell.json"
    write_record(full_record(), target)
    before = target.read_bytes()
    broken = full_record()
    broken.metrics.loss_last = math.nan
    with pytest.raises(ValueError, match="JSON compliant"):
        write_record(broken, target)
    assert target.read_bytes() == before
    assert files_in(tmp_path) == ["cell.json"]


def test_write_failing_midway_leaves_no_temp_file(tmp_path: Path) -> None:
    target = tmp_path / "cell.json"
    write_atomic(target, "old\n")
    # A lone surrogate cannot be encoded: the write fails after the temp file was created.
    with pytest.raises(UnicodeEncodeError):
        write_atomic(target, '{"reason": "\ud800"}')
    assert target.read_text(encoding="utf-8") == "old\n"
    assert files_in(tmp_path) == ["cell.json"]


def test_failed_rename_leaves_no_temp_file(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    target = tmp_path / "cell.json"
    write_atomic(target, "old\n")

    def refuse(src: str, dst: object) -> None:
        raise OSError("rename refused")

    monkeypatch.setattr("ptspeed.cell.record.os.replace", refuse)
    with pytest.raises(OSError, match="rename refused"):
        write_atomic(target, "new\n")
    assert target.read_text(encoding="utf-8") == "old\n"
    assert files_in(tmp_path) == ["cell.json"]


# --- the mode of written files, leftovers of killed writers, a full disk --------------------


@pytest.mark.parametrize(("umask", "mode"), [(0o022, 0o644), (0o002, 0o664), (0o077, 0o600)])
def test_written_files_honour_the_umask(tmp_path: Path, umask: int, mode: int) -> None:
    previous = os.umask(umask)
    try:
        write_record(full_record(), tmp_path / "cell.json")
        write_atomic(tmp_path / "runs.csv", "a,b\n")
    finally:
        os.umask(previous)
    assert stat.S_IMODE((tmp_path / "cell.json").stat().st_mode) == mode
    assert stat.S_IMODE((tmp_path / "runs.csv").stat().st_mode) == mode


def test_leftovers_of_dead_writers_are_removed_and_live_ones_kept(tmp_path: Path) -> None:
    dead = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"],
                          capture_output=True, text=True, check=True)  # fmt: skip
    host = re.sub(r"[^A-Za-z0-9-]", "-", socket.gethostname())
    left_by_dead = tmp_path / f".trial0.json.{host}.{dead.stdout.strip()}.abc123.tmp"
    being_written = tmp_path / f".trial0.json.{host}.{os.getppid()}.def456.tmp"
    other_host = tmp_path / f".trial0.json.elsewhere.{dead.stdout.strip()}.ghi789.tmp"
    other_record = tmp_path / f".trial1.json.{host}.{dead.stdout.strip()}.jkl012.tmp"
    for path in (left_by_dead, being_written, other_host, other_record):
        path.write_text('{"cell": {"mod', encoding="utf-8")
    write_record(full_record(), tmp_path / "trial0.json")
    assert read_record(tmp_path / "trial0.json") == full_record()
    assert not left_by_dead.exists()
    # a writer still alive, another host's writer (its pid says nothing here), another target
    assert being_written.exists() and other_host.exists() and other_record.exists()


def test_a_full_disk_fails_the_write_in_one_line_and_leaves_nothing(tmp_path: Path) -> None:
    with small_disk(tmp_path / "disk") as disk:
        kept = disk / "trial0.json"
        write_record(full_record(), kept)
        before = kept.read_bytes()
        fill(disk)
        with pytest.raises(WriteFailed) as failed:
            write_record(full_record(), disk / "trial1.json")
        assert str(failed.value) == f"cannot write {disk / 'trial1.json'}: No space left on device"
        assert files_in(disk) == ["filler", "trial0.json"]
        assert kept.read_bytes() == before
