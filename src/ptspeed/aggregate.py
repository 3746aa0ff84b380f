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

from ptspeed import stats
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
    "median_low",
    "median_high",
    "median_confidence",
    "min_samples_per_s",
    "max_samples_per_s",
    "cv",
    "noisy",
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
    "speedup_low",
    "speedup_high",
    "p_value",
    "significant",
    "claim",
    "published_speedup",
    "published_baseline",
    "published_candidate",
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
    interval = stats.summarise(rates.tolist(), CONFIDENCE) if len(rates) else None
    return {
        "trials": len(trials),
        "ok_trials": len(ok),
        "statuses": status_counts(trials["status"]),
        "median_samples_per_s": _median(rates),
        "median_low": interval.low if interval else math.nan,
        "median_high": interval.high if interval else math.nan,
        "median_confidence": interval.achieved_confidence if interval else math.nan,
        "min_samples_per_s": rates.min() if len(rates) else math.nan,
        "max_samples_per_s": rates.max() if len(rates) else math.nan,
        "cv": coefficient_of_variation(rates),
        "noisy": bool(interval and interval.noisy),
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
    runs: pd.DataFrame | None = None,
) -> pd.DataFrame:
    """One row per comparison x model x mode (configuration order), columns :data:`SPEEDUP_COLUMNS`.

    ``speedup`` is the candidate's median throughput over the baseline's, NaN when either side has
    no ok trial. Published figures come from ``claims`` (the parsed ``claims.yaml``) through the
    comparison's ``claim`` key. Where the summary holds several sizes of one cell, the size set in
    the configuration for ``config['device']`` is used, else the largest batch both sides share.
    With ``runs`` (the per-trial records), each speedup gets its bootstrap interval and a
    Mann-Whitney p-value (:func:`ptspeed.stats.speedup`) and claims get a verdict.
    """
    check_config(config)
    claims = claims or {}
    rows = [
        _speedup_row(summary, runs, config, claims, name, comparison, model, mode)
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
    runs: pd.DataFrame | None,
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
    row.update(_interval(runs, base_spec, cand_spec, model, mode, size))
    row["verdict"], row["verdict_reason"] = verdict(row, claims, config.get("device", ""))
    return row


def _interval(
    runs: pd.DataFrame | None,
    base_spec: Mapping[str, Any],
    cand_spec: Mapping[str, Any],
    model: str,
    mode: str,
    size: tuple[int, ...] | None,
) -> dict[str, Any]:
    blank = {
        "speedup_low": math.nan,
        "speedup_high": math.nan,
        "p_value": math.nan,
        "significant": False,
    }
    if runs is None or size is None:
        return blank
    base = _ok_rates(runs, base_spec, model, mode, size)
    cand = _ok_rates(runs, cand_spec, model, mode, size)
    if not base or not cand:
        return blank
    ratio = stats.speedup(base, cand, confidence=CONFIDENCE)
    return {
        "speedup_low": ratio.low,
        "speedup_high": ratio.high,
        "p_value": ratio.p_value,
        "significant": ratio.significant,
    }


def _ok_rates(
    runs: pd.DataFrame, spec: Mapping[str, Any], model: str, mode: str, size: tuple[int, ...]
) -> list[float]:
    match = (
        (runs["status"] == "ok")
        & (runs["env"] == spec["env"])
        & (runs["variant"] == spec["variant"])
        & (runs["model"] == model)
        & (runs["mode"] == mode)
    )
    for key, value in zip(SIZE_KEYS, size, strict=True):
        match &= runs[key] == value
    rates = pd.to_numeric(runs.loc[match, "throughput_samples_per_s"], errors="coerce")
    return [float(v) for v in rates.dropna() if v > 0]


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


def verdict(
    row: Mapping[str, Any], claims: Mapping[str, Any], device_class: str = ""
) -> tuple[str, str]:
    """``(verdict, reason)`` for a speedups row.

    Against a claim: consistent with / below / above the claim (the published speedup inside,
    above or below the measured interval), or not measured and why (a side without ok trials,
    a claim made on a GPU checked by a CPU run). Without a claim: measured.
    """
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
        return MEASURED, f"{row['model']} not in claims group '{group}'"
    claimed_on = claims[group].get("device_class")
    if claimed_on and device_class and claimed_on != device_class:
        return NOT_MEASURED, (
            f"claimed on {claims[group].get('device', claimed_on)}; this run measured on "
            f"{device_class}"
        )
    if math.isnan(row.get("speedup_low", math.nan)):
        return MEASURED, "too few ok trials for an interval"
    ratio = stats.Ratio(
        estimate=row["speedup"],
        low=row["speedup_low"],
        high=row["speedup_high"],
        confidence=CONFIDENCE,
        method="",
        n_baseline=row["baseline_trials"],
        n_candidate=row["candidate_trials"],
        p_value=row["p_value"],
        significant=row["significant"],
        alpha=0.05,
    )
    outcome = stats.compare_to_claim(ratio, row["published_speedup"])
    return CLAIM_VERDICTS[outcome], _claim_context(claims[group])


def _claim_context(group: Mapping[str, Any]) -> str:
    """Where the claim was made, to set beside where it was measured."""
    parts = [group.get("device"), group.get("precision")]
    return "claimed on " + ", ".join(str(p) for p in parts if p) if any(parts) else ""


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
