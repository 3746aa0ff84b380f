"""The layout of the aggregated tables: their columns, their types, and reading them back.

Owns the column lists of the four tables (:data:`RUNS_COLUMNS`, :data:`STEPS_COLUMNS`,
:data:`SUMMARY_COLUMNS`, :data:`SPEEDUP_COLUMNS`) and the keys that name a cell
(:data:`CELL_KEYS`, the sizes among them :data:`ptspeed.plan.layout.SIZE_KEYS`), the compiler's
statistics the summary and speedups carry per cell (:data:`COMPILER_COLUMNS`); the statuses a
runs row can have beyond a record's own
(``stale``, ``missing``, ``unreadable``); the confidence and significance levels the tables'
intervals and tests are computed at; the conversions that give the runs and steps frames their
column types (:func:`typed_runs`, :func:`typed_steps`); the sizes a model does not use, which
its rows leave blank (:func:`unused_sizes`); and :func:`read_table`, which reads a table's CSV
back with those types. Pure but for :func:`read_table`; no torch.
"""

from __future__ import annotations

import dataclasses
import math
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd

from ptspeed.analysis import breakdown
from ptspeed.analysis.conditions import (
    CONDITION_COLUMNS,
    CONDITION_INT_COLUMNS,
    CONDITION_TEXT_COLUMNS,
    JUDGEMENT_COLUMNS,
)
from ptspeed.analysis.energy import (
    JOULES_PER_SAMPLE,
    SPEEDUP_ENERGY_COLUMNS,
    SUMMARY_ENERGY_COLUMNS,
)
from ptspeed.analysis.late_numerics import GATE_LOSS_BOUND, LATE_COLUMNS
from ptspeed.analysis.reruns import RERUN_COLUMNS
from ptspeed.analysis.staleness import STALE
from ptspeed.cell.record import STATUSES, CellSpec
from ptspeed.cell.record_window import Metrics
from ptspeed.models import REGISTRY
from ptspeed.plan.layout import DEFAULT_SIZES, SIZE_KEYS

UNREADABLE = "unreadable"
MISSING = "missing"
ALL_STATUSES = (*STATUSES, STALE, MISSING, UNREADABLE)
MISSING_REASON = "no record (the cell did not run or its record was removed)"

CELL_FIELDS = [f.name for f in dataclasses.fields(CellSpec)]
# Per-step and per-rank lists stay in the records (steps.csv holds the step times).
LIST_METRICS = ("step_times_s", "rank_measured_wall_s")
# Metrics the harness is adding (issue 11), read from the records that carry them before
# record_window.Metrics names them; their type decides the column's. Harmless once it does.
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
    "slurm_job_id",
    "slurm_partition",
    "slurm_node",
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
    GATE_LOSS_BOUND,
    *LATE_COLUMNS,
    *PROVENANCE_COLUMNS,
    "started_at",
    "duration_s",
    *CONDITION_COLUMNS,
    JOULES_PER_SAMPLE,
    *JUDGEMENT_COLUMNS,
    *RERUN_COLUMNS,
    *breakdown.RUN_COLUMNS,
]

CELL_KEYS = ["platform", "env", "model", "variant", "mode", "batch_size", "image_size", "seq_len"]
# What torch.compile did in a cell (ptspeed.cell.variants.compiler), as the summary carries it: the
# median of each count over the cell's ok trials (blank where no trial counted: cells that do
# not compile) and its first graph-break reasons; the speedups carry each side's.
COMPILER_COUNTS = ["compiled_graphs", "graph_breaks", "recompilations"]
COMPILER_REASONS = "graph_break_reasons"
COMPILER_COLUMNS = [*(f"median_{name}" for name in COMPILER_COUNTS), COMPILER_REASONS]
SIDES = ("baseline", "candidate")
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
    *SUMMARY_ENERGY_COLUMNS,
    *COMPILER_COLUMNS,
    "reasons",
    "retried_from_batch_size",
    "perturbed_trials",
    "perturbed_reasons",
    "reruns",
    *breakdown.SUMMARY_COLUMNS,
]
# Each column of the speedups table and whether it holds text (the rest are numbers).
_SPEEDUP_COLUMN_IS_TEXT = {
    "comparison": True,
    "title": True,
    "platform": True,
    "model": True,
    "mode": True,
    **dict.fromkeys(SIZE_KEYS, False),
    "baseline_env": True,
    "baseline_variant": True,
    "candidate_env": True,
    "candidate_variant": True,
    "baseline_samples_per_s": False,
    "candidate_samples_per_s": False,
    "baseline_trials": False,
    "candidate_trials": False,
    "baseline_statuses": True,
    "candidate_statuses": True,
    "baseline_perturbed_trials": False,
    "candidate_perturbed_trials": False,
    "baseline_perturbed_reasons": True,
    "candidate_perturbed_reasons": True,
    "baseline_reruns": False,
    "candidate_reruns": False,
    "baseline_uncounted": True,
    "candidate_uncounted": True,
    **{
        f"{side}_{column}": column == COMPILER_REASONS
        for side in SIDES
        for column in COMPILER_COLUMNS
    },
    "speedup": False,
    "speedup_low": False,
    "speedup_high": False,
    "speedup_confidence": False,
    "p_value": False,
    "significant": False,
    **dict.fromkeys(SPEEDUP_ENERGY_COLUMNS, False),
    "claim": True,
    "published_speedup": False,
    "published_baseline": False,
    "published_candidate": False,
    "claim_device": True,
    "claim_precision": True,
    "measured_device": True,
    "measured_precision": True,
    "verdict": True,
    "verdict_reason": True,
    **breakdown.speedup_columns(),
}
SPEEDUP_COLUMNS = list(_SPEEDUP_COLUMN_IS_TEXT)

# The confidence of the tables' intervals and the significance level of their tests.
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
    "profile_steps",
    "threads",
    "retried_from_batch_size",
    "attempt",
    "rerun_of",
    "peak_memory_bytes",
    "device_index",
    "cpu_count",
    "torch_threads",
    "world_size",
    "batch_size_per_process",
    "amp_skipped_steps",
    *CONDITION_INT_COLUMNS,
]
# Lists and mappings of a record's metrics (graph-break reasons, compile time by phase) are
# written as one text cell (ptspeed.analysis.records.metric_cell), items apart by LIST_SEPARATOR.
LIST_SEPARATOR = "; "
_TEXT_METRICS = [
    name
    for name, kind in _METRIC_TYPES.items()
    if kind == "str" or kind.startswith(("list", "dict"))
]
_FLOAT_COLUMNS = [
    "timeout_s",
    *(c for c in METRIC_COLUMNS if c not in (*_INT_COLUMNS, *_TEXT_METRICS)),
    "numerics_max_relative_error",
    "numerics_tolerance",
    GATE_LOSS_BOUND,
    *LATE_COLUMNS[:-1],
    "duration_s",
    JOULES_PER_SAMPLE,
    *breakdown.RUN_FLOAT_COLUMNS,
    *(
        c
        for c in CONDITION_COLUMNS
        if c not in (*CONDITION_INT_COLUMNS, *CONDITION_TEXT_COLUMNS, "pinned")
    ),
]
# A later trial of a cell, whose numerics gate its first trial ran (CellSpec).
FIRST_TRIAL_FLAG = "numerics_by_first_trial"
_FLAG_COLUMNS = [
    "numerics_passed",
    "pinned",
    "perturbed",
    FIRST_TRIAL_FLAG,
    *breakdown.RUN_FLAG_COLUMNS,
]
_TEXT_COLUMNS = [
    c for c in RUNS_COLUMNS if c not in (*_INT_COLUMNS, *_FLOAT_COLUMNS, *_FLAG_COLUMNS)
]

SUMMARY_TEXT_COLUMNS = [
    "env",
    "model",
    "variant",
    "mode",
    "statuses",
    "noisy_reason",
    "memory_kind",
    "energy_not_measured",
    COMPILER_REASONS,
    "reasons",
    "retried_from_batch_size",
    "perturbed_reasons",
    *breakdown.SUMMARY_TEXT_COLUMNS,
]
SPEEDUP_TEXT_COLUMNS = [c for c, is_text in _SPEEDUP_COLUMN_IS_TEXT.items() if is_text]
TEXT_COLUMNS = sorted({*_TEXT_COLUMNS, *SUMMARY_TEXT_COLUMNS, *SPEEDUP_TEXT_COLUMNS})


def typed_runs(runs: pd.DataFrame) -> pd.DataFrame:
    """The runs frame with each column of its type: integers, floats, booleans, text."""
    # Records are checked for shape, not for value types: coerce so that one odd value
    # becomes NaN (or text) in its cell instead of breaking every median or sort.
    runs = runs.copy()
    for column in _INT_COLUMNS:
        runs[column] = _as_int(runs[column])
    for column in _FLOAT_COLUMNS:
        runs[column] = _as_float_column(runs[column])
    for column in _FLAG_COLUMNS:
        runs[column] = _as_boolean(runs[column])
    for column in _TEXT_COLUMNS:
        runs[column] = _as_text(runs[column])
    return runs


def typed_steps(steps: pd.DataFrame) -> pd.DataFrame:
    """The steps frame with each column of its type."""
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
    (a CUDA version '11.7' or a commit '1234567' must not turn into a number). The sizes a
    row's model does not use read blank, also from tables written before they were."""
    text_columns = {column: str for column in TEXT_COLUMNS}
    table = pd.read_csv(path, dtype=text_columns, keep_default_na=False, na_values=[""])
    # copy(): one block per type (read_csv leaves a block per column, and a frame of that many
    # blocks warns of fragmentation on every column a reader adds).
    return blank_unused_sizes(table).copy()


def unused_sizes(model: Any) -> tuple[str, ...]:
    """The sizes beyond the batch that ``model`` does not use (``REGISTRY[model].uses``): its
    cells leave them blank. None for a model the registry does not know."""
    entry = REGISTRY.get(model) if isinstance(model, str) else None
    return () if entry is None else tuple(key for key in DEFAULT_SIZES if key not in entry.uses)


def blank_unused_sizes(table: pd.DataFrame) -> pd.DataFrame:
    """``table`` with the sizes each row's model does not use blank (NaN)."""
    if "model" not in table.columns:
        return table
    unused = {model: unused_sizes(model) for model in table["model"].dropna().unique()}
    blanked = {}
    for key in DEFAULT_SIZES:
        blank = table["model"].map(lambda model, key=key: key in unused.get(model, ()))
        if key in table.columns and blank.any():
            blanked[key] = table[key].mask(blank.astype(bool))
    return table.assign(**blanked) if blanked else table


def platform_column(frame: pd.DataFrame) -> pd.Series:
    """The frame's platforms, '' where there are none (tables from before platforms)."""
    if "platform" not in frame.columns:
        return pd.Series("", index=frame.index, dtype=object)
    return frame["platform"].fillna("").astype(str)
