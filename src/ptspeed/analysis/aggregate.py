"""Cell records in, four tidy tables out: runs, steps, summary and speedups.

* :func:`load_tables` reads record files into the *runs* frame, one row per file, and the
  *steps* frame, one row per measured step of an ``ok`` record. A file that cannot be read as a
  record becomes a row with status ``unreadable``, and a listed path with no file a row with
  status ``missing``, instead of an exception: one bad file never hides the rest of a run, and
  the report can name what is absent. Train-mode trials then get the late numerics check
  (:mod:`ptspeed.analysis.late_numerics`): a last loss that strays from the same environment's eager
  cell makes the trial ``numerics_mismatch``. Where the path follows the workflow's layout
  (``records/<env>/<model>/<variant>/<mode>/<size>/trial<N>.json``) such rows carry the cell.
* :func:`summary_table` groups the runs by cell (environment, model, variant, mode, sizes) and gives
  trial counts, the median throughput of the ``ok`` trials with its confidence interval, and a
  noise flag with its reason.
* :func:`speedups` pairs the summary rows each configured comparison needs, gives each speedup
  (the Hodges–Lehmann ratio of the ok trials) its exact interval with the confidence it
  achieves and a p-value (:func:`ptspeed.analysis.stats.speedup`), and judges the published
  figures of ``config/claims.yaml``.

Everything here is pure except the readers (:func:`load_tables`, :func:`read_table`,
:func:`records_listed_in`, :func:`read_mapping`), and nothing imports torch.
"""

from __future__ import annotations

import dataclasses
import json
import math
from collections import Counter
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd
import yaml

from ptspeed.analysis import stats
from ptspeed.analysis.late_numerics import (
    LATE_COLUMNS,
    check_late_losses,
    precision_of,
    recorded_late_check,
)
from ptspeed.analysis.staleness import STALE, stale_reason
from ptspeed.cell.record import STATUSES, CellSpec, Metrics, NumericsCheck, Provenance, Record
from ptspeed.errors import ConfigError
from ptspeed.plan.layout import SIZE_KEYS, cell_from_path, configured_sizes

UNREADABLE = "unreadable"
MISSING = "missing"
ALL_STATUSES = (*STATUSES, STALE, MISSING, UNREADABLE)
MISSING_REASON = "no record (the cell did not run or its record was removed)"

CELL_FIELDS = [f.name for f in dataclasses.fields(CellSpec)]
# Per-step and per-rank lists stay in the records (steps.csv holds the step times).
LIST_METRICS = ("step_times_s", "rank_measured_wall_s")
# Metrics the harness is adding (issue 11), read from the records that carry them before
# record.Metrics names them; their type decides the column's. Harmless once it does.
_NEW_METRICS = {"compiler_cache": "str"}
_METRIC_TYPES = {
    **{f.name: f.type for f in dataclasses.fields(Metrics) if f.name not in LIST_METRICS},
    **{name: kind for name, kind in _NEW_METRICS.items() if name not in Metrics.__annotations__},
}
METRIC_COLUMNS = list(_METRIC_TYPES)
# A cell field named like a metric (compiler_cache: the cache directory the cell was given,
# beside the metric saying whether it was cold or warm) is prefixed with cell_ in the tables.
CELL_COLUMNS = [f"cell_{name}" if name in _METRIC_TYPES else name for name in CELL_FIELDS]
NUMERICS_FIELDS = ("passed", "max_relative_error", "tolerance", "precision")
NUMERICS_COLUMNS = [f"numerics_{name}" for name in NUMERICS_FIELDS]
PACKAGE_COLUMNS = ["torchvision", "transformers"]
PROVENANCE_COLUMNS = [
    "torch",
    "cuda",
    "cudnn",
    "device_name",
    "device_index",
    "gpu_driver",
    "cpu_model",
    "cpu_count",
    "torch_threads",
    "python",
    *PACKAGE_COLUMNS,
    "git_commit",
    "container_image",
    "container_digest",
    "cuda_visible_devices",
    "gpu_assignment",
    "hostname",
    # TF32 and cudnn.benchmark as the cell ran with them (absent from older records).
    "tf32_matmul",
    "tf32_cudnn",
    "cudnn_benchmark",
    "float32_matmul_precision",
]
RUNS_COLUMNS = [
    "record_path",
    *CELL_COLUMNS,
    "status",
    "reason",
    *METRIC_COLUMNS,
    *NUMERICS_COLUMNS,
    *LATE_COLUMNS,
    *PROVENANCE_COLUMNS,
    "started_at",
    "duration_s",
]

CELL_KEYS = ["env", "model", "variant", "mode", "batch_size", "image_size", "seq_len"]
STEPS_COLUMNS = [*CELL_KEYS, "trial", "step", "step_time_s"]
SUMMARY_COLUMNS = [
    *CELL_KEYS,
    "trials",
    "ok_trials",
    "statuses",
    "median_samples_per_s",
    "median_low",
    "median_high",
    "median_confidence",
    "min_samples_per_s",
    "max_samples_per_s",
    "cv",
    "noisy",
    "noisy_reason",
    "median_first_step_s",
    "compile_time_s",
    "compile_time_cold_s",
    "compile_time_warm_s",
    "median_peak_memory_bytes",
    "memory_kind",
    "reasons",
    "retried_from_batch_size",
]
SPEEDUP_COLUMNS = [
    "comparison",
    "title",
    "model",
    "mode",
    *SIZE_KEYS,
    "baseline_env",
    "baseline_variant",
    "candidate_env",
    "candidate_variant",
    "baseline_samples_per_s",
    "candidate_samples_per_s",
    "baseline_trials",
    "candidate_trials",
    "baseline_statuses",
    "candidate_statuses",
    "speedup",
    "speedup_low",
    "speedup_high",
    "speedup_confidence",
    "p_value",
    "significant",
    "claim",
    "published_speedup",
    "published_baseline",
    "published_candidate",
    "claim_device",
    "claim_precision",
    "measured_device",
    "measured_precision",
    "verdict",
    "verdict_reason",
]

MEASURED = "measured"
NOT_MEASURED = "not measured"
CLAIM_VERDICTS = {
    "consistent": "consistent with the claim",
    "below": "below the claim",
    "above": "above the claim",
}
CONFIDENCE = 0.95
ALPHA = 0.05

_INT_COLUMNS = [
    "batch_size",
    "image_size",
    "seq_len",
    "trial",
    "seed",
    "warmup_steps",
    "measured_steps",
    "numerics_steps",
    "threads",
    "retried_from_batch_size",
    "peak_memory_bytes",
    "device_index",
    "cpu_count",
    "torch_threads",
    "world_size",
    "batch_size_per_process",
]
_TEXT_METRICS = [name for name, kind in _METRIC_TYPES.items() if kind == "str"]
_FLOAT_COLUMNS = [
    "timeout_s",
    *(c for c in METRIC_COLUMNS if c not in (*_INT_COLUMNS, *_TEXT_METRICS)),
    "numerics_max_relative_error",
    "numerics_tolerance",
    *LATE_COLUMNS[:-1],
    "duration_s",
]
_TEXT_COLUMNS = [
    c for c in RUNS_COLUMNS if c not in (*_INT_COLUMNS, *_FLOAT_COLUMNS, "numerics_passed")
]


SUMMARY_TEXT_COLUMNS = [
    "env",
    "model",
    "variant",
    "mode",
    "statuses",
    "noisy_reason",
    "memory_kind",
    "reasons",
    "retried_from_batch_size",
]
SPEEDUP_TEXT_COLUMNS = [
    "comparison",
    "title",
    "model",
    "mode",
    "baseline_env",
    "baseline_variant",
    "candidate_env",
    "candidate_variant",
    "baseline_statuses",
    "candidate_statuses",
    "claim",
    "claim_device",
    "claim_precision",
    "measured_device",
    "measured_precision",
    "verdict",
    "verdict_reason",
]
TEXT_COLUMNS = sorted({*_TEXT_COLUMNS, *SUMMARY_TEXT_COLUMNS, *SPEEDUP_TEXT_COLUMNS})


class RecordError(ValueError):
    """A file that exists but is not a cell record."""


# --- runs and steps ------------------------------------------------------------------------------


def load_tables(
    paths: Iterable[str | Path], config: Mapping[str, Any] | None = None
) -> tuple[pd.DataFrame, pd.DataFrame]:
    """The runs frame (:data:`RUNS_COLUMNS`, one row per path, in the order given) and the steps
    frame (:data:`STEPS_COLUMNS`, one row per measured step of each ``ok`` record).

    Train-mode trials then get the late numerics check against their environment's eager cell
    (:func:`ptspeed.analysis.late_numerics.check_late_losses`): a trial that fails it becomes
    ``numerics_mismatch`` and its steps leave the steps frame.

    A path with no file gives a row with status ``missing``; a file that cannot be opened, is not
    JSON, or is not a record gives a row with status ``unreadable``; both reasons name the path.
    With ``config`` (the effective config), a record of another cell than the config asks for
    at its path (:func:`ptspeed.analysis.staleness.stale_reason`) gives a row with status ``stale``.
    """
    rows, steps = [], []
    for path in map(Path, paths):
        row, step_times = _read_row(path, config)
        rows.append(row)
        if row["status"] == "ok":
            steps.extend(_step_rows(row, step_times))
    runs = check_late_losses(_typed_runs(pd.DataFrame(rows, columns=RUNS_COLUMNS)))
    steps = _typed_steps(pd.DataFrame(steps, columns=STEPS_COLUMNS))
    return runs, _steps_of_ok_trials(steps, runs)


def _steps_of_ok_trials(steps: pd.DataFrame, runs: pd.DataFrame) -> pd.DataFrame:
    """The steps of trials still ok after the late numerics check."""
    failed = runs[(runs["late_check"].fillna("") != "") & (runs["status"] != "ok")]
    if failed.empty or steps.empty:
        return steps
    keys = [*CELL_KEYS, "trial"]
    dropped = set(failed[keys].itertuples(index=False, name=None))
    kept = [key not in dropped for key in steps[keys].itertuples(index=False, name=None)]
    return steps[kept].reset_index(drop=True)


def load_records(paths: Iterable[str | Path]) -> pd.DataFrame:
    """The runs frame of :func:`load_tables`."""
    return load_tables(paths)[0]


def _read_row(
    path: Path, config: Mapping[str, Any] | None = None
) -> tuple[dict[str, Any], list[Any]]:
    try:
        data = _parse_record(path)
    except FileNotFoundError:
        return _stand_in_row(path, MISSING, f"{path}: {MISSING_REASON}"), []
    except (OSError, UnicodeDecodeError, ValueError) as error:
        return _stand_in_row(path, UNREADABLE, f"{path}: {error}"), []
    row = flatten_data(data)
    stale = stale_reason(row, cell_from_path(path), config) if config is not None else ""
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


def _recorded_loss(metrics: Mapping[str, Any]) -> Any:
    """The last loss as recorded: a non-finite one is written as its text ('nan', 'inf')."""
    return metrics.get("non_finite_loss") or metrics.get("loss_last")


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


_PARTS = {"cell": CellSpec, "metrics": Metrics, "numerics": NumericsCheck, "provenance": Provenance}
_DEFAULTS = {name: _field_defaults(cls) for name, cls in _PARTS.items()}
_CELL_DEFAULTS = _DEFAULTS["cell"]
_REQUIRED_CELL_KEYS = [name for name in CELL_FIELDS if name not in _CELL_DEFAULTS]


def flatten_data(data: Mapping[str, Any]) -> dict[str, Any]:
    """One runs row (without ``record_path``) from a record's checked JSON."""
    parts = {name: {**_DEFAULTS[name], **(data.get(name) or {})} for name in _PARTS}
    cell, metrics, numerics, provenance = (parts[name] for name in _PARTS)
    packages = provenance.get("packages")
    packages = packages if isinstance(packages, dict) else {}
    return {
        **{column: cell.get(name) for name, column in zip(CELL_FIELDS, CELL_COLUMNS, strict=True)},
        "status": data["status"],
        "reason": data.get("reason", ""),
        **{key: metrics.get(key) for key in METRIC_COLUMNS},
        **{f"numerics_{key}": numerics.get(key) for key in NUMERICS_FIELDS},
        "late_check": recorded_late_check(_recorded_loss(data.get("metrics") or {})),
        **{key: provenance.get(key) for key in PROVENANCE_COLUMNS if key not in PACKAGE_COLUMNS},
        **{key: packages.get(key, "") for key in PACKAGE_COLUMNS},
        "started_at": data.get("started_at", ""),
        "duration_s": data.get("duration_s"),
    }


def flatten_record(record: Record) -> dict[str, Any]:
    """One runs row (without ``record_path``) from a record."""
    return flatten_data(record.to_dict())


def _as_list(value: Any) -> list[Any]:
    return value if isinstance(value, list) else []


def _step_rows(row: Mapping[str, Any], step_times: Sequence[Any]) -> list[dict[str, Any]]:
    cell = {key: row[key] for key in (*CELL_KEYS, "trial")}
    return [{**cell, "step": step, "step_time_s": t} for step, t in enumerate(step_times)]


def _typed_runs(runs: pd.DataFrame) -> pd.DataFrame:
    # Records are checked for shape, not for value types: coerce so that one odd value
    # becomes NaN (or text) in its cell instead of breaking every median or sort.
    runs = runs.copy()
    for column in _INT_COLUMNS:
        runs[column] = _as_int(runs[column])
    for column in _FLOAT_COLUMNS:
        runs[column] = _as_float_column(runs[column])
    runs["numerics_passed"] = _as_boolean(runs["numerics_passed"])
    for column in _TEXT_COLUMNS:
        runs[column] = _as_text(runs[column])
    return runs


def _typed_steps(steps: pd.DataFrame) -> pd.DataFrame:
    steps = steps.copy()
    for column in ("env", "model", "variant", "mode"):
        steps[column] = _as_text(steps[column])
    for column in (*SIZE_KEYS, "trial", "step"):
        steps[column] = _as_int(steps[column])
    steps["step_time_s"] = _as_float_column(steps["step_time_s"])
    return steps


def _as_int(values: pd.Series) -> pd.Series:
    numbers = _as_float_column(values).astype("Float64")
    return numbers.round().astype("Int64")


def _as_float_column(values: pd.Series) -> pd.Series:
    if pd.api.types.infer_dtype(values, skipna=True) not in _NUMERIC_KINDS:
        # A list or a dict where a number belongs is odd input, not a reason to fail.
        values = values.map(lambda v: v if isinstance(v, (int, float, str)) else None)
    numbers = pd.to_numeric(values, errors="coerce").astype(float)
    return numbers.where(np.isfinite(numbers))


# Per-value conversions cost seconds on 10,000 records: columns of the expected kind skip them.
_NUMERIC_KINDS = ("floating", "integer", "mixed-integer-float", "empty")


def _as_boolean(values: pd.Series) -> pd.Series:
    if pd.api.types.infer_dtype(values, skipna=True) not in ("boolean", "empty"):
        values = values.map(_bool_or_na)
    return values.astype("boolean")


def _as_text(values: pd.Series) -> pd.Series:
    if pd.api.types.infer_dtype(values, skipna=True) in ("string", "empty"):
        return values
    return values.map(_text_or_na)


def _bool_or_na(value: Any) -> Any:
    return value if isinstance(value, bool) else pd.NA


def _text_or_na(value: Any) -> Any:
    is_nan = isinstance(value, float) and math.isnan(value)
    return value if isinstance(value, str) or value is None or is_nan else str(value)


def read_table(path: str | Path) -> pd.DataFrame:
    """Read a CSV written by this module: empty fields are NaN, and text columns stay text
    (a CUDA version '11.7' or a commit '1234567' must not turn into a number)."""
    text_columns = {column: str for column in TEXT_COLUMNS}
    return pd.read_csv(path, dtype=text_columns, keep_default_na=False, na_values=[""])


# --- summary -------------------------------------------------------------------------------------


def summary_table(runs: pd.DataFrame) -> pd.DataFrame:
    """One row per cell (:data:`CELL_KEYS`) of the runs whose cell is known; columns
    :data:`SUMMARY_COLUMNS`. Missing and unreadable rows count as trials of their cell where the
    path named it.

    Throughput statistics use the ``ok`` trials only: the median with its distribution-free
    interval (:func:`ptspeed.analysis.stats.summarise`), minimum, maximum, and ``cv`` (sample
    standard deviation over the mean, NaN with fewer than two ok trials).

    ``compile_time_s`` is the one-off cost of a variant's first step, as the dynamo benchmark
    harness reports compilation latency: the median first step of its ok trials minus the
    median first step of the eager cell of the same environment, model, mode and sizes (NaN for
    eager itself or without an eager cell). Where records say which compiler cache a trial
    found (``compiler_cache``: ``cold`` or ``warm``), ``compile_time_cold_s`` and
    ``compile_time_warm_s`` are the same over those trials alone.
    """
    known = runs[~(runs["status"].isin([MISSING, UNREADABLE, STALE]) & runs["env"].isna())]
    if known.empty:
        return pd.DataFrame(columns=SUMMARY_COLUMNS)
    columns = {name: _values(known, name) for name in _SUMMARY_INPUTS}
    rows = []
    for positions in group_positions(known, CELL_KEYS):
        trials = {name: values[positions] for name, values in columns.items()}
        key = {name: trials[name][0] for name in CELL_KEYS}
        rows.append({**key, **_cell_stats(trials), **_first_steps(trials)})
    summary = pd.DataFrame(_with_compile_times(rows), columns=SUMMARY_COLUMNS)
    for column in SIZE_KEYS:
        summary[column] = summary[column].astype("Int64")
    return summary


_SUMMARY_INPUTS = [
    *CELL_KEYS,
    "status",
    "reason",
    "throughput_samples_per_s",
    "first_step_s",
    "peak_memory_bytes",
    "memory_kind",
    "retried_from_batch_size",
    "knobs",
    "compiler_cache",
]
COMPILER_CACHES = ("cold", "warm")


def _first_steps(trials: Mapping[str, np.ndarray]) -> dict[str, Any]:
    """Whether the cell is eager, and its median first step over the ok trials: all of them,
    then those that found a cold or a warm compiler cache."""
    ok = trials["status"] == "ok"
    caches = trials["compiler_cache"]
    medians = {
        f"_first_step_{cache}": _median_of(trials["first_step_s"][ok & (caches == cache)])
        for cache in COMPILER_CACHES
    }
    is_eager = all(knobs == "eager" for knobs in trials["knobs"])
    return {
        "_eager": is_eager,
        "_first_step_all": _median_of(trials["first_step_s"][ok]),
        **medians,
    }


def _with_compile_times(rows: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Each row's compile times: its median first steps minus its eager cell's."""
    place = ["env", "model", "mode", *SIZE_KEYS]
    eager = {tuple(r[k] for k in place): r["_first_step_all"] for r in rows if r["_eager"]}
    for row in rows:
        reference = math.nan if row["_eager"] else eager.get(tuple(row[k] for k in place), math.nan)
        for suffix, first_step in (("", "all"), *((f"_{c}", c) for c in COMPILER_CACHES)):
            row[f"compile_time{suffix}_s"] = row[f"_first_step_{first_step}"] - reference
    return rows


def _values(frame: pd.DataFrame, column: str) -> np.ndarray:
    """A column's values; blanks for a column older records lack (e.g. compiler_cache)."""
    if column in frame.columns:
        return frame[column].to_numpy(dtype=object)
    return np.full(len(frame), "", dtype=object)


def group_positions(frame: pd.DataFrame, keys: Sequence[str]) -> list[np.ndarray]:
    """Row positions of each group of ``frame`` by ``keys``, groups in sorted key order (missing
    key values last), rows in frame order. Faster than iterating a groupby's sub-frames."""
    if frame.empty:
        return []
    codes = frame.groupby(list(keys), sort=True, dropna=False).ngroup().to_numpy()
    order = np.argsort(codes, kind="stable")
    return np.split(order, np.flatnonzero(np.diff(codes[order])) + 1)


def _cell_stats(trials: Mapping[str, np.ndarray]) -> dict[str, Any]:
    ok = trials["status"] == "ok"
    rates = _finite_numbers(trials["throughput_samples_per_s"][ok])
    interval = stats.summarise(rates, CONFIDENCE) if rates else None
    return {
        "trials": len(trials["status"]),
        "ok_trials": int(ok.sum()),
        "statuses": _status_counts(trials["status"]),
        "median_samples_per_s": interval.median if interval else math.nan,
        "median_low": interval.low if interval else math.nan,
        "median_high": interval.high if interval else math.nan,
        "median_confidence": interval.achieved_confidence if interval else math.nan,
        "min_samples_per_s": min(rates) if rates else math.nan,
        "max_samples_per_s": max(rates) if rates else math.nan,
        "cv": interval.cv if interval else math.nan,
        "noisy": bool(interval and interval.noisy),
        "noisy_reason": noise_reason(interval) if interval and interval.noisy else "",
        "median_first_step_s": _median_of(trials["first_step_s"][ok]),
        "median_peak_memory_bytes": _median_of(trials["peak_memory_bytes"][ok]),
        "memory_kind": ", ".join(_distinct_texts(trials["memory_kind"][ok])),
        "reasons": _joined_reasons(trials["status"][~ok], trials["reason"][~ok]),
        # Out-of-memory retries ran at half the configured batch: their own rows, labelled.
        "retried_from_batch_size": ", ".join(
            str(int(v)) for v in dict.fromkeys(_finite_numbers(trials["retried_from_batch_size"]))
        ),
    }


def noise_reason(summary: stats.Summary) -> str:
    """Why a cell is flagged noisy, e.g. ``"cv 12.9% > 5%"``."""
    reasons = []
    if summary.cv > stats.NOISE_CV:
        reasons.append(f"cv {summary.cv:.1%} > {stats.NOISE_CV:.0%}")
    half_width = summary.relative_half_width
    if half_width > stats.NOISE_RELATIVE_HALF_WIDTH:
        limit = stats.NOISE_RELATIVE_HALF_WIDTH
        reasons.append(f"median interval ±{half_width:.1%} > ±{limit:.0%}")
    return "; ".join(reasons)


def _finite_numbers(values: Iterable[Any]) -> list[float]:
    numbers = (float(v) for v in values if v is not None and v is not pd.NA)
    return [v for v in numbers if math.isfinite(v)]


def _median_of(values: Iterable[Any]) -> float:
    numbers = sorted(_finite_numbers(values))
    return float(np.median(numbers)) if numbers else math.nan


def _distinct_texts(values: Iterable[Any]) -> list[str]:
    return list(dict.fromkeys(v for v in values if isinstance(v, str) and v))


def status_counts(statuses: pd.Series) -> str:
    """E.g. ``"ok:2 failed:1"``, statuses in the order of :data:`ALL_STATUSES`."""
    return _status_counts(statuses.dropna())


def _status_counts(statuses: Iterable[Any]) -> str:
    counts = Counter(str(s) for s in statuses)
    order = [s for s in ALL_STATUSES if s in counts] + sorted(set(counts) - set(ALL_STATUSES))
    return " ".join(f"{status}:{counts[status]}" for status in order)


def coefficient_of_variation(values: pd.Series) -> float:
    """Sample standard deviation / mean; NaN with fewer than two values or a zero mean."""
    values = values.dropna().astype(float)
    if len(values) < 2 or values.mean() == 0:
        return math.nan
    return float(values.std(ddof=1) / values.mean())


def _joined_reasons(statuses: Iterable[Any], reasons: Iterable[Any]) -> str:
    pairs = zip(statuses, reasons, strict=True)
    joined = [f"{status}: {text}" for status, text in pairs if isinstance(text, str) and text]
    return "; ".join(dict.fromkeys(joined))


# --- speedups ------------------------------------------------------------------------------------


@dataclass
class _Side:
    """The ok trials of one cell, as a speedup reads them."""

    rates: list[float] = field(default_factory=list)
    devices: dict[str, None] = field(default_factory=dict)
    precisions: dict[str, None] = field(default_factory=dict)


@dataclass(frozen=True)
class _Index:
    """Summary rows by (env, variant, model, mode), ok trials by that and the sizes."""

    cells: Mapping[tuple[Any, ...], list[dict[str, Any]]]
    sides: Mapping[tuple[Any, ...], _Side] | None


def speedups(
    summary: pd.DataFrame,
    config: Mapping[str, Any],
    claims: Mapping[str, Any] | None = None,
    runs: pd.DataFrame | None = None,
) -> pd.DataFrame:
    """One row per comparison x model x mode (configuration order), columns :data:`SPEEDUP_COLUMNS`,
    then, per comparison, one row for each model its claim names that the matrix lacks.

    ``speedup`` is the Hodges–Lehmann ratio of the ok trials (the median of the pairwise
    candidate / baseline throughput ratios, :func:`ptspeed.analysis.stats.speedup`); without
    ``runs`` it is the ratio of the summary's medians; NaN when either side has no ok trial.
    Published figures come from ``claims`` (the parsed ``claims.yaml``) through the comparison's
    ``claim`` key. Where the summary holds several sizes of one cell, the size set in
    the configuration for ``config['device']`` is used, else the largest batch both sides share.
    With ``runs`` (the per-trial records), each speedup gets its exact interval
    (``speedup_low``, ``speedup_high``), the confidence that interval achieves at the trials'
    n (``speedup_confidence``: below 0.95 where too few trials reach 0.95) and a Mann-Whitney
    p-value, and claims get a verdict.
    """
    check_speedup_config(config)
    claims = claims or {}
    index = _Index(_summary_index(summary), _side_index(runs) if runs is not None else None)
    rows = []
    for name, comparison in config["comparisons"].items():
        for model in config["models"]:
            for mode in config["modes"]:
                rows.append(_speedup_row(index, config, claims, name, comparison, model, mode))
        rows.extend(_unmatrixed_claim_rows(config, claims, name, comparison))
    return pd.DataFrame(rows, columns=SPEEDUP_COLUMNS)


def check_speedup_config(config: Mapping[str, Any]) -> None:
    """Raise :class:`ConfigError` unless ``config`` has what :func:`speedups` reads."""
    shapes = {"comparisons": Mapping, "models": (Mapping, list), "modes": list}
    for key, shape in shapes.items():
        if not isinstance(config.get(key), shape):
            raise ConfigError(f"config: '{key}' is missing or not a {_shape_name(shape)}")
    for name, comparison in config["comparisons"].items():
        for side in ("baseline", "candidate"):
            spec = comparison.get(side) if isinstance(comparison, Mapping) else None
            if not isinstance(spec, Mapping) or not {"env", "variant"} <= spec.keys():
                raise ConfigError(f"config: comparison '{name}': '{side}' needs env and variant")


def _shape_name(shape: type | tuple[type, ...]) -> str:
    kinds = shape if isinstance(shape, tuple) else (shape,)
    return " or ".join("mapping" if kind is Mapping else kind.__name__ for kind in kinds)


def _summary_index(summary: pd.DataFrame) -> dict[tuple[Any, ...], list[dict[str, Any]]]:
    index: dict[tuple[Any, ...], list[dict[str, Any]]] = {}
    for row in summary.to_dict("records"):
        key = (row["env"], row["variant"], row["model"], row["mode"])
        index.setdefault(key, []).append(row)
    return index


def _side_index(runs: pd.DataFrame) -> dict[tuple[Any, ...], _Side]:
    ok = runs[runs["status"] == "ok"]
    names = ["env", "variant", "model", "mode", *SIZE_KEYS, "throughput_samples_per_s"]
    names += ["knobs", "device_name", "device_index", "numerics_precision"]
    index: dict[tuple[Any, ...], _Side] = {}
    for row in ok[names].itertuples(index=False, name=None):
        env, variant, model, mode, *sizes = row[:7]
        rate, knobs, device_name, device_index, precision = row[7:]
        if any(pd.isna(v) for v in sizes) or not (rate > 0 and math.isfinite(rate)):
            continue
        side = index.setdefault((env, variant, model, mode, *map(int, sizes)), _Side())
        side.rates.append(float(rate))
        device_class = "cpu" if pd.isna(device_index) else "cuda"
        side.devices[_device_label(device_name, device_class)] = None
        side.precisions[precision_of(precision, knobs, device_class)] = None
    return index


def _device_label(device_name: Any, device_class: str) -> str:
    return f"{device_name} ({device_class})" if isinstance(device_name, str) else device_class


def _speedup_row(
    index: _Index,
    config: Mapping[str, Any],
    claims: Mapping[str, Any],
    name: str,
    comparison: Mapping[str, Any],
    model: str,
    mode: str,
) -> dict[str, Any]:
    base_spec, cand_spec = comparison["baseline"], comparison["candidate"]
    base_rows = index.cells.get((base_spec["env"], base_spec["variant"], model, mode), [])
    cand_rows = index.cells.get((cand_spec["env"], cand_spec["variant"], model, mode), [])
    configured = configured_sizes(config, model, config.get("device")) or {}
    size = _chosen_size(base_rows, cand_rows, configured)
    base, cand = _at_size(base_rows, size), _at_size(cand_rows, size)
    row = {
        **_comparison_fields(name, comparison, claims, model),
        "mode": mode,
        **dict(zip(SIZE_KEYS, size or (pd.NA,) * len(SIZE_KEYS), strict=True)),
        **_side("baseline", base),
        **_side("candidate", cand),
    }
    row["speedup"] = _ratio(row["candidate_samples_per_s"], row["baseline_samples_per_s"])
    sides = _trial_sides(index, base_spec, cand_spec, model, mode, size)
    row.update(_interval(*sides, row["speedup"]))
    row.update(_measured_on(*sides))
    row["verdict"], row["verdict_reason"] = verdict(row, claims, config.get("device", ""))
    return row


def _comparison_fields(
    name: str, comparison: Mapping[str, Any], claims: Mapping[str, Any], model: str
) -> dict[str, Any]:
    group = comparison.get("claim") or ""
    group_claims = claims.get(group) if isinstance(claims.get(group), Mapping) else {}
    return {
        "comparison": name,
        "title": comparison.get("title", name),
        "model": model,
        "baseline_env": comparison["baseline"]["env"],
        "baseline_variant": comparison["baseline"]["variant"],
        "candidate_env": comparison["candidate"]["env"],
        "candidate_variant": comparison["candidate"]["variant"],
        "claim": group,
        **published_figures(claims, group, model),
        "claim_device": str(group_claims.get("device") or ""),
        "claim_precision": str(group_claims.get("precision") or ""),
    }


def _unmatrixed_claim_rows(
    config: Mapping[str, Any], claims: Mapping[str, Any], name: str, comparison: Mapping[str, Any]
) -> list[dict[str, Any]]:
    """Rows for the models a comparison's claim names but the matrix does not run."""
    group = comparison.get("claim")
    group_claims = claims.get(group) if group else None
    claimed = group_claims.get("models") if isinstance(group_claims, Mapping) else None
    if not isinstance(claimed, Mapping):
        return []
    rows = []
    for model in claimed:
        if model in config["models"]:
            continue
        row = {
            **_comparison_fields(name, comparison, claims, model),
            "mode": "",
            **dict.fromkeys(SIZE_KEYS, pd.NA),
            **_side("baseline", None),
            **_side("candidate", None),
            **_interval(None, None, math.nan),
            **_measured_on(None, None),
            "verdict": NOT_MEASURED,
            "verdict_reason": f"{model} is not in the benchmark matrix (config models)",
        }
        rows.append(row)
    return rows


def _trial_sides(
    index: _Index,
    base_spec: Mapping[str, Any],
    cand_spec: Mapping[str, Any],
    model: str,
    mode: str,
    size: tuple[int, ...] | None,
) -> tuple[_Side | None, _Side | None]:
    if index.sides is None or size is None:
        return None, None
    base = index.sides.get((base_spec["env"], base_spec["variant"], model, mode, *size))
    cand = index.sides.get((cand_spec["env"], cand_spec["variant"], model, mode, *size))
    return base, cand


def _interval(base: _Side | None, cand: _Side | None, medians_ratio: float) -> dict[str, Any]:
    """The speedup of the ok trials with its interval; without trials, the ratio of medians."""
    if base is None or cand is None:
        return {
            "speedup": medians_ratio,
            "speedup_low": math.nan,
            "speedup_high": math.nan,
            "speedup_confidence": math.nan,
            "p_value": math.nan,
            "significant": False,
        }
    ratio = stats.speedup(base.rates, cand.rates, CONFIDENCE, ALPHA)
    return {
        "speedup": ratio.estimate,
        "speedup_low": ratio.low,
        "speedup_high": ratio.high,
        "speedup_confidence": ratio.achieved_confidence,
        "p_value": ratio.p_value,
        "significant": ratio.significant,
    }


def _measured_on(base: _Side | None, cand: _Side | None) -> dict[str, str]:
    sides = [side for side in (base, cand) if side is not None]
    devices = dict.fromkeys(d for side in sides for d in side.devices)
    precisions = [" / ".join(side.precisions) for side in sides]
    same = len(set(precisions)) == 1
    return {
        "measured_device": ", ".join(devices),
        "measured_precision": precisions[0] if same else " → ".join(precisions),
    }


def _size_of(row: Mapping[str, Any]) -> tuple[int, ...] | None:
    values = [row[key] for key in SIZE_KEYS]
    return None if any(pd.isna(v) for v in values) else tuple(int(v) for v in values)


def _sizes_of(rows: Sequence[Mapping[str, Any]]) -> set[tuple[int, ...]]:
    sizes = (_size_of(row) for row in rows)
    return {size for size in sizes if size is not None}


def _chosen_size(
    base: Sequence[Mapping[str, Any]],
    cand: Sequence[Mapping[str, Any]],
    configured: Mapping[str, Any],
) -> tuple[int, ...] | None:
    options = (_sizes_of(base) & _sizes_of(cand)) or (_sizes_of(base) | _sizes_of(cand))
    wanted = [
        size
        for size in options
        if all(size[i] == configured[k] for i, k in enumerate(SIZE_KEYS) if k in configured)
    ]
    candidates = wanted if configured and wanted else options
    return max(candidates) if candidates else None


def _at_size(
    rows: Sequence[Mapping[str, Any]], size: tuple[int, ...] | None
) -> Mapping[str, Any] | None:
    matches = [row for row in rows if size and _size_of(row) == size]
    return matches[0] if matches else None


def _side(prefix: str, row: Mapping[str, Any] | None) -> dict[str, Any]:
    ok_trials = int(row["ok_trials"]) if row is not None else 0
    median = float(row["median_samples_per_s"]) if row is not None and ok_trials else math.nan
    statuses = row["statuses"] if row is not None and isinstance(row["statuses"], str) else ""
    return {
        f"{prefix}_samples_per_s": median,
        f"{prefix}_trials": ok_trials,
        f"{prefix}_statuses": statuses,
    }


def _ratio(numerator: float, denominator: float) -> float:
    if math.isnan(numerator) or math.isnan(denominator) or denominator == 0:
        return math.nan
    return numerator / denominator


def published_figures(claims: Mapping[str, Any], group: str | None, model: str) -> dict[str, float]:
    """``published_speedup``, ``published_baseline``, ``published_candidate``; NaN when absent."""
    group_claims = claims.get(group, {}) if group else {}
    group_claims = group_claims if isinstance(group_claims, Mapping) else {}
    figures = (group_claims.get("models") or {}).get(model) or {}
    return {
        f"published_{key}": _as_float(figures.get(key))
        for key in ("speedup", "baseline", "candidate")
    }


def _as_float(value: Any) -> float:
    try:
        return float(value)
    except (TypeError, ValueError):
        return math.nan


def verdict(
    row: Mapping[str, Any], claims: Mapping[str, Any], device_class: str = ""
) -> tuple[str, str]:
    """``(verdict, reason)`` for a speedups row.

    Against a claim: consistent with / below / above the claim (the published speedup inside,
    above or below the measured interval), or not measured and why (a side without ok trials,
    a claim made on a GPU checked by a CPU run). Without a claim: measured.
    """
    missing = [
        f"{side} ({row[f'{side}_env']}/{row[f'{side}_variant']}: "
        f"{row.get(f'{side}_statuses') or 'no records'})"
        for side in ("baseline", "candidate")
        if row[f"{side}_trials"] == 0 or math.isnan(row[f"{side}_samples_per_s"])
    ]
    if missing:
        return NOT_MEASURED, "no ok trials: " + ", ".join(missing)
    group = row["claim"]
    if not group:
        return MEASURED, "no published claim for this comparison"
    if group not in claims:
        return NOT_MEASURED, f"claim group '{group}' not in claims"
    if math.isnan(row["published_speedup"]):
        return MEASURED, f"{row['model']} not in claims group '{group}'"
    claimed_on = claims[group].get("device_class")
    if claimed_on and device_class and claimed_on != device_class:
        measured = row.get("measured_device") or device_class
        return NOT_MEASURED, (
            f"claimed on {claims[group].get('device', claimed_on)}; this run measured on {measured}"
        )
    if math.isnan(row.get("speedup_low", math.nan)):
        return MEASURED, "too few ok trials for an interval"
    achieved = row.get("speedup_confidence", math.nan)
    ratio = stats.Ratio(
        estimate=row["speedup"],
        low=row["speedup_low"],
        high=row["speedup_high"],
        confidence=CONFIDENCE,
        achieved_confidence=achieved,
        method="",
        n_baseline=row["baseline_trials"],
        n_candidate=row["candidate_trials"],
        p_value=row["p_value"],
        significant=row["significant"],
        alpha=ALPHA,
    )
    outcome = stats.compare_to_claim(ratio, row["published_speedup"])
    return CLAIM_VERDICTS[outcome], _claim_context(claims[group], row, achieved)


def _claim_context(group: Mapping[str, Any], row: Mapping[str, Any], achieved: float) -> str:
    """Where the claim was made, beside where it was measured, and the confidence of the
    interval the verdict rests on where it falls short of :data:`CONFIDENCE`."""
    claimed = [str(p) for p in (group.get("device"), group.get("precision")) if p]
    measured = [str(row.get(k)) for k in ("measured_device", "measured_precision") if row.get(k)]
    parts = []
    if claimed:
        parts.append("claimed on " + ", ".join(claimed))
    if measured:
        parts.append("measured on " + ", ".join(measured))
    note = stats.confidence_note(CONFIDENCE, _as_float(achieved))
    if note:
        trials = f"{row['baseline_trials']} and {row['candidate_trials']} ok trials"
        parts.append(f"interval at {note} confidence ({trials} cannot reach {CONFIDENCE:.0%})")
    return "; ".join(parts)


# --- inputs --------------------------------------------------------------------------------------


def read_mapping(path: str | Path) -> dict[str, Any]:
    """A YAML (or JSON) file whose top level is a mapping; an empty file is ``{}``."""
    try:
        data = yaml.safe_load(Path(path).read_text(encoding="utf-8"))
    except yaml.YAMLError as error:
        raise ValueError(f"{path}: not YAML or JSON ({error})") from error
    if data is None:
        return {}
    if not isinstance(data, dict):
        raise ValueError(f"{path}: top level is not a mapping")
    return data


def records_listed_in(path: str | Path) -> list[str]:
    """The record paths in a list file, one per line (blank lines and ``#`` comments skipped)."""
    lines = Path(path).read_text(encoding="utf-8").splitlines()
    return [line.strip() for line in lines if line.strip() and not line.lstrip().startswith("#")]
