"""The cell record: round trips, the derived JSON Schema, validation, atomic writes."""

from __future__ import annotations

import dataclasses
import json
import math
from pathlib import Path

import pytest
from jsonschema import Draft202012Validator
from jsonschema.exceptions import ValidationError

from ptspeed.record import (
    STATUSES,
    CellSpec,
    Metrics,
    NumericsCheck,
    Provenance,
    Record,
    json_schema,
    read_record,
    write_atomic,
    write_record,
)


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


def test_schema_requires_every_field_of_every_part() -> None:
    schema = json_schema()
    assert schema["required"] == [f.name for f in dataclasses.fields(Record)]
    for name, cls in (("cell", CellSpec), ("metrics", Metrics), ("provenance", Provenance)):
        assert schema["properties"][name]["required"] == [f.name for f in dataclasses.fields(cls)]
        assert all(p["description"] for p in schema["properties"][name]["properties"].values())


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

    monkeypatch.setattr("ptspeed.record.os.replace", refuse)
    with pytest.raises(OSError, match="rename refused"):
        write_atomic(target, "new\n")
    assert target.read_text(encoding="utf-8") == "old\n"
    assert files_in(tmp_path) == ["cell.json"]
