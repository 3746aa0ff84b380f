"""Cell records in, three tidy tables out: runs, summary and speedups.

* :func:`load_records` reads record files into the *runs* frame, one row per file. A file that
  cannot be read as a record becomes a row with status ``unreadable`` instead of an exception,
  so one corrupt file never hides the rest of a run.
* :func:`summarise` groups the runs by cell (environment, model, variant, mode, sizes) and gives
  trial counts and the median and spread of throughput over the ``ok`` trials.
* :func:`speedups` pairs the summary rows each configured comparison needs and attaches the
  published figures from ``config/claims.yaml``.

The speedups frame is one row per comparison x model x mode; interval columns such as
``speedup_low``/``speedup_high`` can be added alongside ``speedup`` without changing its rows.

Everything here is pure except the readers (:func:`load_records`, :func:`read_table`,
:func:`records_listed_in`, :func:`read_mapping`), and nothing imports torch.
"""

from __future__ import annotations

import dataclasses
import json
import math
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Any

import pandas as pd
import yaml

from ptspeed.record import STATUSES, CellSpec, Metrics, NumericsCheck, Provenance, Record

UNREADABLE = "unreadable"
ALL_STATUSES = (*STATUSES, UNREADABLE)

CELL_COLUMNS = [f.name for f in dataclasses.fields(CellSpec)]
METRIC_COLUMNS = [f.name for f in dataclasses.fields(Metrics) if f.name != "step_times_s"]
NUMERICS_FIELDS = ("passed", "max_relative_error", "tolerance")
NUMERICS_COLUMNS = [f"numerics_{name}" for name in NUMERICS_FIELDS]
PROVENANCE_COLUMNS = [
    "torch",
    "cuda",
    "device_name",
    "cpu_model",
    "torch_threads",
    "git_commit",
    "container_image",
    "hostname",
]
RUNS_COLUMNS = [
    "record_path",
    *CELL_COLUMNS,
    "status",
    "reason",
    *METRIC_COLUMNS,
    *NUMERICS_COLUMNS,
    *PROVENANCE_COLUMNS,
    "started_at",
    "duration_s",
]

CELL_KEYS = ["env", "model", "variant", "mode", "batch_size", "image_size", "seq_len"]
SIZE_KEYS = ["batch_size", "image_size", "seq_len"]
SUMMARY_COLUMNS = [
    *CELL_KEYS,
    "trials",
    "ok_trials",
    "statuses",
    "median_samples_per_s",
    "min_samples_per_s",
    "max_samples_per_s",
    "cv",
    "median_first_step_s",
    "median_peak_memory_bytes",
    "reasons",
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
    "speedup",
    "claim",
    "published_speedup",
    "published_baseline",
    "published_candidate",
    "verdict",
    "verdict_reason",
]

MEASURED = "measured"
NOT_MEASURED = "not measured"

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
    "peak_memory_bytes",
    "torch_threads",
]
_FLOAT_COLUMNS = [
    "timeout_s",
    *(c for c in METRIC_COLUMNS if c not in ("peak_memory_bytes", "memory_kind")),
    "numerics_max_relative_error",
    "numerics_tolerance",
    "duration_s",
]
_TEXT_COLUMNS = [
    c for c in RUNS_COLUMNS if c not in (*_INT_COLUMNS, *_FLOAT_COLUMNS, "numerics_passed")
]


SUMMARY_TEXT_COLUMNS = ["env", "model", "variant", "mode", "statuses", "reasons"]
SPEEDUP_TEXT_COLUMNS = [
    "comparison",
    "title",
    "model",
    "mode",
    "baseline_env",
    "baseline_variant",
    "candidate_env",
    "candidate_variant",
    "claim",
    "verdict",
    "verdict_reason",
]
TEXT_COLUMNS = sorted({*_TEXT_COLUMNS, *SUMMARY_TEXT_COLUMNS, *SPEEDUP_TEXT_COLUMNS})


class RecordError(ValueError):
    """A file that exists but is not a cell record."""


class ConfigError(ValueError):
    """A configuration without the keys aggregation needs."""


# --- runs ----------------------------------------------------------------------------------------


def load_records(paths: Iterable[str | Path]) -> pd.DataFrame:
    """The runs frame: one row per record file, in the order given, columns :data:`RUNS_COLUMNS`.

    A file that cannot be opened, is not JSON, or is not a record gives a row with status
    ``unreadable`` and a reason naming the file and the problem.
    """
    rows = [_row_of_file(Path(path)) for path in paths]
    return _typed_runs(pd.DataFrame(rows, columns=RUNS_COLUMNS))


def _row_of_file(path: Path) -> dict[str, Any]:
    try:
        record = _parse_record(path)
    except (OSError, UnicodeDecodeError, ValueError) as error:
        return {"record_path": str(path), "status": UNREADABLE, "reason": f"{path}: {error}"}
    return {"record_path": str(path), **flatten_record(record)}


def _parse_record(path: Path) -> Record:
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
    try:
        record = Record.from_dict(data)
    except (TypeError, ValueError, AttributeError) as error:
        raise RecordError(f"not a record: {error}") from error
    _check_parts(record)
    return record


def _check_parts(record: Record) -> None:
    expected = {
        "cell": CellSpec,
        "metrics": Metrics,
        "numerics": NumericsCheck,
        "provenance": Provenance,
    }
    for name, kind in expected.items():
        if not isinstance(getattr(record, name), kind):
            raise RecordError(f"not a record: '{name}' is not an object")


def flatten_record(record: Record) -> dict[str, Any]:
    """One runs row (without ``record_path``) from a record."""
    metrics = {k: v for k, v in dataclasses.asdict(record.metrics).items() if k in METRIC_COLUMNS}
    numerics = {f"numerics_{k}": getattr(record.numerics, k) for k in NUMERICS_FIELDS}
    provenance = {k: getattr(record.provenance, k) for k in PROVENANCE_COLUMNS}
    return {
        **dataclasses.asdict(record.cell),
        "status": record.status,
        "reason": record.reason,
        **metrics,
        **numerics,
        **provenance,
        "started_at": record.started_at,
        "duration_s": record.duration_s,
    }


def _typed_runs(runs: pd.DataFrame) -> pd.DataFrame:
    # Records are checked for shape, not for value types: coerce so that one odd value
    # becomes NaN (or text) in its cell instead of breaking every median or sort.
    runs = runs.copy()
    for column in _INT_COLUMNS:
        numbers = pd.to_numeric(runs[column], errors="coerce").astype("Float64")
        runs[column] = numbers.round().astype("Int64")
    for column in _FLOAT_COLUMNS:
        runs[column] = pd.to_numeric(runs[column], errors="coerce").astype(float)
    runs["numerics_passed"] = runs["numerics_passed"].map(_bool_or_na).astype("boolean")
    for column in _TEXT_COLUMNS:
        runs[column] = runs[column].map(_text_or_na)
    return runs


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


def summarise(runs: pd.DataFrame) -> pd.DataFrame:
    """One row per cell (:data:`CELL_KEYS`) of readable records; columns :data:`SUMMARY_COLUMNS`.

    Throughput statistics use the ``ok`` trials only; ``cv`` is the sample standard deviation over
    the mean, NaN with fewer than two ok trials.
    """
    readable = runs[runs["status"] != UNREADABLE]
    if readable.empty:
        return pd.DataFrame(columns=SUMMARY_COLUMNS)
    groups = readable.groupby(CELL_KEYS, sort=True, dropna=False)
    rows = [
        {**dict(zip(CELL_KEYS, key, strict=True)), **_cell_stats(group)} for key, group in groups
    ]
    return pd.DataFrame(rows, columns=SUMMARY_COLUMNS)


def _cell_stats(trials: pd.DataFrame) -> dict[str, Any]:
    ok = trials[trials["status"] == "ok"]
    rates = ok["throughput_samples_per_s"].dropna().astype(float)
    return {
        "trials": len(trials),
        "ok_trials": len(ok),
        "statuses": status_counts(trials["status"]),
        "median_samples_per_s": _median(rates),
        "min_samples_per_s": rates.min() if len(rates) else math.nan,
        "max_samples_per_s": rates.max() if len(rates) else math.nan,
        "cv": coefficient_of_variation(rates),
        "median_first_step_s": _median(ok["first_step_s"]),
        "median_peak_memory_bytes": _median(ok["peak_memory_bytes"]),
        "reasons": _joined_reasons(trials[trials["status"] != "ok"]),
    }


def status_counts(statuses: pd.Series) -> str:
    """E.g. ``"ok:2 failed:1"``, statuses in the order of :data:`ALL_STATUSES`."""
    counts = statuses.value_counts()
    order = [s for s in ALL_STATUSES if s in counts] + sorted(set(counts.index) - set(ALL_STATUSES))
    return " ".join(f"{status}:{counts[status]}" for status in order)


def coefficient_of_variation(values: pd.Series) -> float:
    """Sample standard deviation / mean; NaN with fewer than two values or a zero mean."""
    values = values.dropna().astype(float)
    if len(values) < 2 or values.mean() == 0:
        return math.nan
    return float(values.std(ddof=1) / values.mean())


def _median(values: pd.Series) -> float:
    values = pd.to_numeric(values, errors="coerce").dropna().astype(float)
    return float(values.median()) if len(values) else math.nan


def _joined_reasons(failed: pd.DataFrame) -> str:
    reasons = [f"{row.status}: {row.reason}" for row in failed.itertuples() if row.reason]
    return "; ".join(dict.fromkeys(reasons))


# --- speedups ------------------------------------------------------------------------------------


def speedups(
    summary: pd.DataFrame,
    config: Mapping[str, Any],
    claims: Mapping[str, Any] | None = None,
) -> pd.DataFrame:
    """One row per comparison x model x mode (configuration order), columns :data:`SPEEDUP_COLUMNS`.

    ``speedup`` is the candidate's median throughput over the baseline's, NaN when either side has
    no ok trial. Published figures come from ``claims`` (the parsed ``claims.yaml``) through the
    comparison's ``claim`` key. Where the summary holds several sizes of one cell, the size set in
    the configuration for ``config['device']`` is used, else the largest batch both sides share.
    """
    check_config(config)
    claims = claims or {}
    rows = [
        _speedup_row(summary, config, claims, name, comparison, model, mode)
        for name, comparison in config["comparisons"].items()
        for model in config["models"]
        for mode in config["modes"]
    ]
    return pd.DataFrame(rows, columns=SPEEDUP_COLUMNS)


def check_config(config: Mapping[str, Any]) -> None:
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


def _speedup_row(
    summary: pd.DataFrame,
    config: Mapping[str, Any],
    claims: Mapping[str, Any],
    name: str,
    comparison: Mapping[str, Any],
    model: str,
    mode: str,
) -> dict[str, Any]:
    base_spec, cand_spec = comparison["baseline"], comparison["candidate"]
    base_rows = _cell_rows(summary, base_spec, model, mode)
    cand_rows = _cell_rows(summary, cand_spec, model, mode)
    size = _chosen_size(base_rows, cand_rows, _configured_size(config, model))
    base, cand = _at_size(base_rows, size), _at_size(cand_rows, size)
    published = published_figures(claims, comparison.get("claim"), model)
    row = {
        "comparison": name,
        "title": comparison.get("title", name),
        "model": model,
        "mode": mode,
        **dict(zip(SIZE_KEYS, size or (pd.NA,) * len(SIZE_KEYS), strict=True)),
        "baseline_env": base_spec["env"],
        "baseline_variant": base_spec["variant"],
        "candidate_env": cand_spec["env"],
        "candidate_variant": cand_spec["variant"],
        **_side("baseline", base),
        **_side("candidate", cand),
        "claim": comparison.get("claim") or "",
        **published,
    }
    row["speedup"] = _ratio(row["candidate_samples_per_s"], row["baseline_samples_per_s"])
    row["verdict"], row["verdict_reason"] = verdict(row, claims)
    return row


def _cell_rows(
    summary: pd.DataFrame, spec: Mapping[str, Any], model: str, mode: str
) -> pd.DataFrame:
    match = (
        (summary["env"] == spec["env"])
        & (summary["variant"] == spec["variant"])
        & (summary["model"] == model)
        & (summary["mode"] == mode)
    )
    return summary[match]


def _configured_size(config: Mapping[str, Any], model: str) -> dict[str, Any]:
    """The sizes the configuration sets for ``model`` on its resolved device ({} if unresolved)."""
    sizes = config["models"][model] if isinstance(config["models"], Mapping) else None
    if not isinstance(sizes, Mapping):
        return {}
    if "batch_size" in sizes:
        return dict(sizes)
    device_sizes = sizes.get(config.get("device", ""))
    return dict(device_sizes) if isinstance(device_sizes, Mapping) else {}


def _size_of(row: Mapping[str, Any]) -> tuple[int, ...] | None:
    values = [row[key] for key in SIZE_KEYS]
    return None if any(pd.isna(v) for v in values) else tuple(int(v) for v in values)


def _sizes_of(rows: pd.DataFrame) -> set[tuple[int, ...]]:
    sizes = (_size_of(row) for row in rows.to_dict("records"))
    return {size for size in sizes if size is not None}


def _chosen_size(
    base: pd.DataFrame, cand: pd.DataFrame, configured: Mapping[str, Any]
) -> tuple[int, ...] | None:
    options = (_sizes_of(base) & _sizes_of(cand)) or (_sizes_of(base) | _sizes_of(cand))
    wanted = [
        size
        for size in options
        if all(size[i] == configured[k] for i, k in enumerate(SIZE_KEYS) if k in configured)
    ]
    candidates = wanted if configured and wanted else options
    return max(candidates) if candidates else None


def _at_size(rows: pd.DataFrame, size: tuple[int, ...] | None) -> Mapping[str, Any] | None:
    matches = [row for row in rows.to_dict("records") if size and _size_of(row) == size]
    return matches[0] if matches else None


def _side(prefix: str, row: Mapping[str, Any] | None) -> dict[str, Any]:
    ok_trials = int(row["ok_trials"]) if row is not None else 0
    median = float(row["median_samples_per_s"]) if row is not None and ok_trials else math.nan
    return {f"{prefix}_samples_per_s": median, f"{prefix}_trials": ok_trials}


def _ratio(numerator: float, denominator: float) -> float:
    if math.isnan(numerator) or math.isnan(denominator) or denominator == 0:
        return math.nan
    return numerator / denominator


def published_figures(claims: Mapping[str, Any], group: str | None, model: str) -> dict[str, float]:
    """``published_speedup``, ``published_baseline``, ``published_candidate``; NaN when absent."""
    group_claims = claims.get(group, {}) if group else {}
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


def verdict(row: Mapping[str, Any], claims: Mapping[str, Any]) -> tuple[str, str]:
    """``(verdict, reason)`` for a speedups row: ``measured`` or ``not measured`` and why."""
    missing = [
        f"{side} ({row[f'{side}_env']}/{row[f'{side}_variant']})"
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
        return NOT_MEASURED, f"{row['model']} not in claims group '{group}'"
    return MEASURED, ""


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
