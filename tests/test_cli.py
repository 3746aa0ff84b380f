"""The command line and its watchdog: one record per cell whatever happens, bad input refused."""

from __future__ import annotations

import json
import time
from pathlib import Path

import pytest
from helpers import TINY_CELL, files_in, fill, ptspeed, read_valid_record, small_disk

from ptspeed.cell.schema import json_schema
from ptspeed.models import REGISTRY, accepted_references

HANG_TIMEOUT_S = 5
HANG_DEADLINE_S = 15


@pytest.mark.slow
def test_a_tiny_cell_writes_an_ok_record_atomically(tmp_path: Path) -> None:
    out = tmp_path / "records" / "cell.json"
    out.parent.mkdir()
    out.write_text("stale\n", encoding="utf-8")
    result = ptspeed("cell", *TINY_CELL, "--out", str(out))
    assert result.returncode == 0, result.stderr
    record = read_valid_record(out)
    assert record.status == "ok", record.reason
    assert record.cell.knobs == "eager" and record.cell.batch_size == 2
    assert record.provenance.torch  # the worker's own record, made where torch was imported
    assert len(record.metrics.step_times_s) == 2
    assert files_in(out.parent) == ["cell.json"]
    assert result.stderr.splitlines()[-1].startswith("mlp eager train batch 2: ok, ")


@pytest.mark.slow
def test_a_hung_cell_ends_as_a_timeout(tmp_path: Path) -> None:
    out = tmp_path / "cell.json"
    started = time.monotonic()
    result = ptspeed(
        "cell", *TINY_CELL, "--fault", "hang", "--timeout-s", str(HANG_TIMEOUT_S), "--out", str(out)
    )
    elapsed = time.monotonic() - started
    assert result.returncode == 0, result.stderr
    assert elapsed < HANG_DEADLINE_S
    record = read_valid_record(out)
    assert record.status == "timeout"
    assert record.reason == f"no result within the cell's limit of {HANG_TIMEOUT_S} s"
    assert record.provenance.python and record.duration_s >= HANG_TIMEOUT_S
    assert files_in(tmp_path) == ["cell.json"]


@pytest.mark.slow
def test_a_crashed_worker_ends_as_failed_naming_the_signal(tmp_path: Path) -> None:
    out = tmp_path / "cell.json"
    result = ptspeed("cell", *TINY_CELL, "--fault", "crash", "--out", str(out))
    assert result.returncode == 0, result.stderr
    record = read_valid_record(out)
    assert record.status == "failed"
    assert record.reason.startswith("worker killed by SIGKILL before writing a result")
    assert files_in(tmp_path) == ["cell.json"]


MODELS = accepted_references()
BAD_INPUT = [
    (["--model", "alexnet"], f"model: unknown 'alexnet' (accepted: {MODELS})"),
    (["--knobs", "turbo"], "knobs: unknown knob 'turbo' (accepted: eager, compile, backend"),
    (["--variant", "amp=fp8"], "knobs: amp=fp8 is not one of auto, fp16, bf16"),
    (["--batch-size", "0"], "batch_size: 0 must be from 1 to 65536"),
    (["--batch-size=-4"], "batch_size: -4 must be from 1 to 65536"),
    (["--model", "resnet50", "--image-size", "16"], "image_size: 16 is outside 32..2048"),
    (["--model", "bert-base", "--seq-len", "4"], "seq_len: 4 is outside 8..512 for bert-base"),
    (["--numerics-steps", "-1"], "numerics_steps: -1 must be from 0 to 100000"),
    (["--mode", "fit"], "mode: 'fit' is not one of train, infer"),
    (["--device", "tpu"], "device: 'tpu' is not one of auto, cpu, cuda or cuda:N"),
    (["--device", "0"], "device: '0' is not one of auto, cpu, cuda or cuda:N"),
    (["--batch-size", "two"], "argument --batch-size: invalid int value: 'two'"),
    (["--turbo"], "unrecognized arguments: --turbo"),
    (["--fault", "explode"], "fault: 'explode' is not one of '', error, oom, hang"),
    (["--measured-steps", "0"], "measured_steps: 0 must be from 1 to"),
    (["--timeout-s", "0"], "timeout_s: 0.0 must be positive"),
]


@pytest.mark.parametrize(
    ("args", "message"), BAD_INPUT, ids=[m.split(":")[0] for _, m in BAD_INPUT]
)
def test_bad_input_is_refused_with_one_line(tmp_path: Path, args: list[str], message: str) -> None:
    out = tmp_path / "records" / "cell.json"
    result = ptspeed("cell", "--model", "mlp", "--batch-size", "2", *args, "--out", str(out))
    assert result.returncode == 2
    lines = result.stderr.splitlines()
    assert len(lines) == 1, result.stderr
    assert lines[0].startswith(f"error: {message}")
    assert not out.parent.exists()


def test_missing_arguments_are_refused_with_one_line() -> None:
    result = ptspeed("cell", "--model", "mlp")
    assert result.returncode == 2
    assert result.stderr == "error: the following arguments are required: --batch-size, --out\n"


def test_schema_command_prints_the_record_schema() -> None:
    result = ptspeed("schema")
    assert result.returncode == 0
    assert json.loads(result.stdout) == json_schema()


def test_models_command_lists_every_model_with_its_sizes() -> None:
    result = ptspeed("models")
    assert result.returncode == 0
    *lines, families = result.stdout.splitlines()
    assert [line.split()[0] for line in lines] == list(REGISTRY)
    assert "image_size 32..2048" in lines[list(REGISTRY).index("resnet50")]
    assert families.startswith("and torchvision:<name>, transformers:<model_type>")


def test_models_command_lists_a_familys_names() -> None:
    result = ptspeed("models", "--family", "torchvision")
    assert result.returncode == 0, result.stderr
    names = result.stdout.splitlines()
    assert {"torchvision:resnet18", "torchvision:maskrcnn_resnet50_fpn"} <= set(names)
    assert "torchvision:raft_small" not in names  # optical flow: not trained here


@pytest.mark.slow
def test_a_full_disk_fails_the_cell_in_one_line_and_loses_nothing(tmp_path: Path) -> None:
    with small_disk(tmp_path / "disk") as disk:
        kept = disk / "trial0.json"
        kept.write_text('{"an earlier record": true}\n', encoding="utf-8")
        fill(disk)
        out = disk / "trial1.json"
        result = ptspeed("cell", *TINY_CELL, "--out", str(out))
        assert result.returncode == 1, result.stderr
        assert result.stderr.splitlines()[-1] == (
            f"error: no record written: cannot write {out}: No space left on device"
        )
        assert "Traceback" not in result.stderr
        assert files_in(disk) == ["filler", "trial0.json"]  # no partial record, no temporary
        assert kept.read_text(encoding="utf-8") == '{"an earlier record": true}\n'
