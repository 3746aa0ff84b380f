"""The summary table: one row per cell, with trial counts and throughput statistics.

Owns :func:`summary_table` (the runs grouped by cell: counts by status, the median throughput of
the ``ok`` trials with its distribution-free interval, a noise flag with its reason, first steps,
compile times, what the compiler did, and memory) and the helpers the report and compare share
with it (:func:`status_counts`, :func:`noise_reason`, :func:`coefficient_of_variation`). Pure;
no torch.
"""

from __future__ import annotations

import math
from collections import Counter
from collections.abc import Iterable, Mapping, Sequence
from typing import Any

import numpy as np
import pandas as pd

from ptspeed.analysis import breakdown, energy, stats
from ptspeed.analysis.columns import (
    ALL_STATUSES,
    CELL_KEYS,
    COMPILER_COUNTS,
    COMPILER_REASONS,
    CONFIDENCE,
    LIST_SEPARATOR,
    MISSING,
    SIZE_KEYS,
    SUMMARY_COLUMNS,
    UNREADABLE,
)
from ptspeed.analysis.conditions import perturbed_counts
from ptspeed.analysis.energy import JOULES_PER_SAMPLE
from ptspeed.analysis.reruns import rerun_count
from ptspeed.analysis.staleness import STALE


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
    ``compile_time_warm_s`` are the same over those trials alone. ``median_compiled_graphs``,
    ``median_graph_breaks`` and ``median_recompilations`` are the medians of what the compiler
    recorded in the ok trials (NaN for cells that do not compile), ``graph_break_reasons`` the
    first :data:`REASONS_SHOWN` distinct reasons among them. ``perturbed_trials`` counts
    the ok trials judged perturbed (:mod:`ptspeed.analysis.conditions`; they stay in these
    statistics) and ``perturbed_reasons`` says by what.
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
    "perturbed",
    "perturbed_reason",
    "attempt",
    JOULES_PER_SAMPLE,
    "energy_not_measured",
    *COMPILER_COUNTS,
    COMPILER_REASONS,
    *breakdown.SUMMARY_INPUTS,
]
COMPILER_CACHES = ("cold", "warm")
# Graph-break reasons a summary row keeps (a record keeps
# ptspeed.cell.variants.compiler.REASONS_KEPT).
REASONS_SHOWN = 3


def _first_steps(trials: Mapping[str, np.ndarray]) -> dict[str, Any]:
    """Whether the cell is eager, and its median first step over the ok trials: all of them,
    then those that found a cold or a warm compiler cache."""
    ok = trials["status"] == "ok"
    caches = trials["compiler_cache"]
    medians = {
        f"_first_step_{cache}": _median_of(trials["first_step_s"][ok & (caches == cache)])
        for cache in COMPILER_CACHES
    }
    # Stand-in rows (missing, unreadable, stale) have no knobs: the recorded trials decide.
    known = [knobs for knobs in trials["knobs"] if isinstance(knobs, str) and knobs]
    is_eager = bool(known) and all(knobs == "eager" for knobs in known)
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
        **energy.summarise(
            trials[JOULES_PER_SAMPLE][ok], trials["energy_not_measured"][ok], CONFIDENCE
        ),
        **_compiler_stats(trials, ok),
        "reasons": _joined_reasons(trials["status"][~ok], trials["reason"][~ok]),
        # Out-of-memory retries ran at half the configured batch: their own rows, labelled.
        "retried_from_batch_size": ", ".join(
            str(int(v)) for v in dict.fromkeys(_finite_numbers(trials["retried_from_batch_size"]))
        ),
        **perturbed_counts(trials["perturbed"][ok], trials["perturbed_reason"][ok]),
        "reruns": rerun_count(trials["attempt"]),
        **breakdown.summarise(trials, ok),
    }


def _compiler_stats(trials: Mapping[str, np.ndarray], ok: np.ndarray) -> dict[str, Any]:
    """What the compiler did in the ok trials: the median of each count (NaN where no trial
    counted, as in cells that do not compile) and the first distinct graph-break reasons."""
    medians = {f"median_{name}": _median_of(trials[name][ok]) for name in COMPILER_COUNTS}
    reasons = (
        reason
        for text in _distinct_texts(trials[COMPILER_REASONS][ok])
        for reason in text.split(LIST_SEPARATOR)
    )
    shown = list(dict.fromkeys(reasons))[:REASONS_SHOWN]
    return {**medians, COMPILER_REASONS: LIST_SEPARATOR.join(shown)}


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
