"""Record files into runs rows: reading and checking a record, flattening it, stand-in rows.

Owns what one listed path becomes (:func:`read_row`): the flattened record (:func:`flatten_data`),
or, instead of an exception, a ``missing`` row for a path with no file, an ``unreadable`` one for
a file that is not a record (:class:`RecordError`), and a ``stale`` one for a record of another
cell than the config asks for at its path, each on the cell its path names
(:func:`ptspeed.plan.layout.cell_from_path`); and the per-step rows of a record
(:func:`step_rows`). Every row leaves blank the sizes its model does not use
(:func:`without_unused_sizes`). Reads files; no torch.
"""

from __future__ import annotations

import dataclasses
import json
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from ptspeed.analysis import breakdown
from ptspeed.analysis.columns import (
    CELL_COLUMNS,
    CELL_FIELDS,
    CELL_KEYS,
    LIST_SEPARATOR,
    METRIC_COLUMNS,
    MISSING,
    MISSING_REASON,
    NUMERICS_FIELDS,
    PACKAGE_COLUMNS,
    PROVENANCE_COLUMNS,
    UNREADABLE,
    unused_sizes,
)
from ptspeed.analysis.conditions import CONDITION_COLUMNS
from ptspeed.analysis.late_numerics import GATE_LOSS_BOUND, recorded_late_check
from ptspeed.analysis.staleness import STALE, stale_reason
from ptspeed.cell.record import STATUSES, CellSpec, NumericsCheck, Provenance, Record
from ptspeed.cell.record_window import Conditions, Metrics
from ptspeed.plan.layout import cell_from_path
from ptspeed.plan.settings import Settings


class RecordError(ValueError):
    """A file that exists but is not a cell record."""


def read_row(path: Path, settings: Settings | None = None) -> tuple[dict[str, Any], list[Any]]:
    """The runs row of one listed path and its step times: a stand-in row (``missing``,
    ``unreadable``, ``stale``, with the reason) and no steps where it holds no usable record.
    The sizes its model does not use are blank (:func:`without_unused_sizes`)."""
    row, step_times = _read_row(path, settings)
    return without_unused_sizes(row), step_times


def without_unused_sizes(row: dict[str, Any]) -> dict[str, Any]:
    """``row`` with the sizes its model does not use (:func:`unused_sizes`) set to None: a
    record's cell holds every size, CellSpec's defaults where the model takes none (bert-base
    an image size of 224), and a path's cell the same."""
    return {**row, **dict.fromkeys(unused_sizes(row.get("model")))}


def _read_row(path: Path, settings: Settings | None) -> tuple[dict[str, Any], list[Any]]:
    try:
        data = _parse_record(path)
    except FileNotFoundError:
        return _stand_in_row(path, MISSING, f"{path}: {MISSING_REASON}"), []
    except (OSError, UnicodeDecodeError, ValueError) as error:
        return _stand_in_row(path, UNREADABLE, f"{path}: {error}"), []
    row = flatten_data(data)
    stale = stale_reason(row, cell_from_path(path), settings) if settings is not None else ""
    if stale:
        return _stale_row(path, row, stale), []
    step_times = (data.get("metrics") or {}).get("step_times_s")
    return {"record_path": str(path), **row}, _as_list(step_times)


def _stale_row(path: Path, row: Mapping[str, Any], why: str) -> dict[str, Any]:
    """A record of another cell than the config asks for: counted as a trial of the cell its
    path names (else of the cell it recorded), measuring nothing."""
    cell = cell_from_path(path) or {key: row[key] for key in CELL_COLUMNS}
    reason = f"{path}: stale record, not counted ({why}); it recorded status {row['status']}"
    return {"record_path": str(path), **cell, "status": STALE, "reason": reason}


def _stand_in_row(path: Path, status: str, reason: str) -> dict[str, Any]:
    return {"record_path": str(path), **cell_from_path(path), "status": status, "reason": reason}


def _late_loss(metrics: Mapping[str, Any], cell: Mapping[str, Any]) -> dict[str, Any]:
    """``late_loss`` and ``late_loss_step``; a record written before they were (whose late
    check compared the last loss) gives its last step's."""
    if metrics.get("late_loss_step") is not None:
        return {"late_loss": metrics.get("late_loss"), "late_loss_step": metrics["late_loss_step"]}
    warmup, measured = metrics.get("warmup_steps_run"), cell.get("measured_steps")
    step = warmup + measured if isinstance(warmup, int) and isinstance(measured, int) else None
    return {"late_loss": metrics.get("loss_last"), "late_loss_step": step}


def _parse_record(path: Path) -> dict[str, Any]:
    """The record's JSON, checked as :meth:`Record.from_dict` would check it.

    Checked here rather than built with ``Record.from_dict``, which resolves type hints on every
    call (1.4 ms a record: 14 s for a 10,000-record run).
    """
    with open(path, encoding="utf-8") as handle:
        try:
            data = json.load(handle)
        except json.JSONDecodeError as error:
            raise RecordError(f"not JSON ({error})") from error
    if not isinstance(data, dict):
        raise RecordError(f"not a record: top level is {type(data).__name__}, not an object")
    missing = [key for key in ("cell", "status") if key not in data]
    if missing:
        raise RecordError(f"not a record: missing {', '.join(missing)}")
    if not isinstance(data["status"], str) or data["status"] not in STATUSES:
        raise RecordError(
            f"not a record: status {data['status']!r} is not one of {', '.join(STATUSES)}"
        )
    for name in _PARTS:
        part = data.get(name)
        if not isinstance(part, dict) and (name == "cell" or part is not None):
            raise RecordError(f"not a record: '{name}' is not an object")
    lacking = [key for key in _REQUIRED_CELL_KEYS if key not in data["cell"]]
    if lacking:
        raise RecordError(f"not a record: cell lacks {', '.join(lacking)}")
    return data


def _field_defaults(cls: type) -> dict[str, Any]:
    defaults = {}
    for f in dataclasses.fields(cls):
        if f.default is not dataclasses.MISSING:
            defaults[f.name] = f.default
        elif f.default_factory is not dataclasses.MISSING:
            defaults[f.name] = f.default_factory()
    return defaults


_PARTS = {
    "cell": CellSpec,
    "metrics": Metrics,
    "numerics": NumericsCheck,
    "provenance": Provenance,
    "conditions": Conditions,
}
_DEFAULTS = {name: _field_defaults(cls) for name, cls in _PARTS.items()}
_CELL_DEFAULTS = _DEFAULTS["cell"]
_REQUIRED_CELL_KEYS = [name for name in CELL_FIELDS if name not in _CELL_DEFAULTS]


def flatten_data(data: Mapping[str, Any]) -> dict[str, Any]:
    """One runs row (without ``record_path``) from a record's checked JSON."""
    parts = {name: {**_DEFAULTS[name], **(data.get(name) or {})} for name in _PARTS}
    cell, metrics, numerics, provenance, conditions = (parts[name] for name in _PARTS)
    packages = provenance.get("packages")
    packages = packages if isinstance(packages, dict) else {}
    late = _late_loss(metrics, cell)
    return {
        **{column: cell.get(name) for name, column in zip(CELL_FIELDS, CELL_COLUMNS, strict=True)},
        "status": data["status"],
        "reason": data.get("reason", ""),
        **{key: metric_cell(metrics.get(key)) for key in METRIC_COLUMNS},
        **late,
        **{f"numerics_{key}": numerics.get(key) for key in NUMERICS_FIELDS},
        GATE_LOSS_BOUND: _allowed_loss_error(numerics.get("allowed_errors")),
        # A non-finite loss is recorded as its text ('nan', 'inf'), the number left null.
        "late_check": recorded_late_check(metrics["non_finite_loss"] or late["late_loss"]),
        **{key: provenance.get(key) for key in PROVENANCE_COLUMNS if key not in PACKAGE_COLUMNS},
        **{key: packages.get(key, "") for key in PACKAGE_COLUMNS},
        "started_at": data.get("started_at", ""),
        "duration_s": data.get("duration_s"),
        **{key: conditions.get(key) for key in CONDITION_COLUMNS},
        **breakdown.run_columns(data.get("profile")),
    }


def _allowed_loss_error(allowed_errors: Any) -> Any:
    """The loss's bound in the cell's own numerics gate (None where it checked no loss)."""
    return allowed_errors.get("loss") if isinstance(allowed_errors, Mapping) else None


def metric_cell(value: Any) -> Any:
    """A metric as one cell of runs.csv: a list joined with :data:`LIST_SEPARATOR`, a mapping
    as "key=value" pairs so joined (numbers to 3 significant digits); scalars as they are."""
    if isinstance(value, list):
        return LIST_SEPARATOR.join(map(str, value))
    if isinstance(value, dict):
        return LIST_SEPARATOR.join(
            f"{key}={item:.3g}" if isinstance(item, float) else f"{key}={item}"
            for key, item in value.items()
        )
    return value


def flatten_record(record: Record) -> dict[str, Any]:
    """One runs row (without ``record_path``) from a record."""
    return flatten_data(record.to_dict())


def _as_list(value: Any) -> list[Any]:
    return value if isinstance(value, list) else []


def step_rows(row: Mapping[str, Any], step_times: Sequence[Any]) -> list[dict[str, Any]]:
    """The steps rows of a runs row: its cell and trial, each step's index and time."""
    cell = {key: row[key] for key in (*CELL_KEYS, "trial")}
    return [{**cell, "step": step, "step_time_s": t} for step, t in enumerate(step_times)]
