"""The speedups table: the configured comparisons, each with its speedup, interval and p-value.

Owns :func:`speedups` (one row per comparison, model and mode, plus a row for each model a
comparison's claim names that the matrix does not run), the choice of the size both sides are
compared at, the speedup of the ``ok`` trials with its exact interval
(:func:`ptspeed.analysis.ranks.speedup`), and where each side was measured. Claims and verdicts
are :mod:`ptspeed.analysis.claims`. Pure; no torch.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import pandas as pd

from ptspeed.analysis import breakdown, energy, ranks, stats
from ptspeed.analysis.claims import NOT_MEASURED, published_figures, verdict
from ptspeed.analysis.columns import (
    ALPHA,
    COMPILER_COLUMNS,
    COMPILER_REASONS,
    CONFIDENCE,
    SIZE_KEYS,
    SPEEDUP_COLUMNS,
    platform_column,
)
from ptspeed.analysis.conditions import counted_in_speedups, perturbed_counts, reason_kinds
from ptspeed.analysis.energy import JOULES_PER_SAMPLE
from ptspeed.analysis.late_numerics import precision_of
from ptspeed.plan.layout import configured_sizes
from ptspeed.plan.settings import Comparison, Settings, Side


@dataclass(frozen=True)
class _Trial:
    """One record of a side's cell, as its counted n's shortfall reads it."""

    number: int
    status: str
    counted: bool
    reason: str  # why perturbed ('' where quiet or not ok)


@dataclass
class _Side:
    """The ok trials of one cell, as a speedup reads them."""

    rates: list[float] = field(default_factory=list)
    joules: list[float] = field(default_factory=list)  # per sample, of the same trials
    perturbed: int = 0  # ok trials judged perturbed (left out of rates unless kept)
    reasons: list[str] = field(default_factory=list)  # the perturbed trials' reasons
    trials: list[_Trial] = field(default_factory=list)  # every trial of the cell, ok or not
    devices: dict[str, None] = field(default_factory=dict)
    precisions: dict[str, None] = field(default_factory=dict)


@dataclass(frozen=True)
class _Index:
    """Summary rows by (env, variant, model, mode), ok trials by that and the sizes."""

    cells: Mapping[tuple[Any, ...], list[dict[str, Any]]]
    sides: Mapping[tuple[Any, ...], _Side] | None


def speedups(
    summary: pd.DataFrame,
    settings: Settings,
    claims: Mapping[str, Any] | None = None,
    runs: pd.DataFrame | None = None,
) -> pd.DataFrame:
    """One row per comparison x model x mode (configuration order), columns :data:`SPEEDUP_COLUMNS`,
    then, per comparison, one row for each model its claim names that the matrix lacks.

    ``speedup`` is the Hodges–Lehmann ratio of the ok trials (the median of the pairwise
    candidate / baseline throughput ratios, :func:`ptspeed.analysis.ranks.speedup`); without
    ``runs`` it is the ratio of the summary's medians; NaN when either side has no ok trial.
    Published figures come from ``claims`` (the parsed ``claims.yaml``) through the comparison's
    ``claim`` key. Where the summary holds several sizes of one cell, the size set in
    the configuration for the settings' ``device`` is used, else the largest batch both sides share.
    Each side carries what the compiler did in its cell (``candidate_median_graph_breaks``
    and the rest of :data:`ptspeed.analysis.columns.COMPILER_COLUMNS`, from the summary).
    With ``runs`` (the per-trial records), each speedup gets its exact interval
    (``speedup_low``, ``speedup_high``), the confidence that interval achieves at the trials'
    n (``speedup_confidence``: below 0.95 where too few trials reach 0.95) and a Mann-Whitney
    p-value, and claims get a verdict.
    """
    claims = claims or {}
    sides = _side_index(runs, settings) if runs is not None else None
    index = _Index(_summary_index(summary), sides)
    rows = []
    for name, comparison in settings.comparisons.items():
        for platform in platform_names(settings):
            for model in settings.models:
                for mode in settings.modes:
                    place = (platform, model, mode)
                    rows.append(_speedup_row(index, settings, claims, name, comparison, place))
        rows.extend(_unmatrixed_claim_rows(settings, claims, name, comparison))
    return pd.DataFrame(rows, columns=SPEEDUP_COLUMNS)


def platform_names(settings: Settings) -> list[str]:
    """The platforms of a run ('' alone for a run without platforms)."""
    return list(settings.platforms) or [""]


def not_planned(settings: Settings) -> dict[tuple[str, str], str]:
    """Why each (platform, environment) pair the plan left out was left out: the effective
    config's ``platform_plan`` (ptspeed.plan.platforms)."""
    left_out = settings.platform_plan.get("cannot_run", ())
    return {(row["platform"], row["env"]): row["reason"] for row in left_out}


def _summary_index(summary: pd.DataFrame) -> dict[tuple[Any, ...], list[dict[str, Any]]]:
    index: dict[tuple[Any, ...], list[dict[str, Any]]] = {}
    for row in summary.to_dict("records"):
        key = (_platform_of(row), row["env"], row["variant"], row["model"], row["mode"])
        index.setdefault(key, []).append(row)
    return index


def _side_index(runs: pd.DataFrame, settings: Settings) -> dict[tuple[Any, ...], _Side]:
    counted = counted_in_speedups(runs, settings.conditions.keep_perturbed)
    runs = runs.assign(platform=platform_column(runs), _counted=counted.to_numpy())
    if "perturbed" not in runs.columns:
        runs = runs.assign(perturbed=pd.NA, perturbed_reason="")
    names = ["platform", "env", "variant", "model", "mode", *SIZE_KEYS, "throughput_samples_per_s"]
    names += ["knobs", "device_name", "device_index", "numerics_precision", JOULES_PER_SAMPLE]
    names += ["status", "trial", "_counted", "perturbed", "perturbed_reason"]
    index: dict[tuple[Any, ...], _Side] = {}
    for row in runs[runs["env"].notna()][names].itertuples(index=False, name=None):
        platform, env, variant, model, mode, *sizes = row[:8]
        rate, knobs, device_name, device_index, precision, joules = row[8:14]
        status, trial, is_counted, is_perturbed, reason = row[14:]
        if pd.isna(sizes[0]):
            continue
        side = index.setdefault((platform, env, variant, model, mode, *_size_key(sizes)), _Side())
        ok = status == "ok" and rate > 0 and math.isfinite(rate)
        perturbed = ok and not pd.isna(is_perturbed) and bool(is_perturbed)
        number = -1 if pd.isna(trial) else int(trial)
        side.trials.append(
            _Trial(number, str(status), bool(ok and is_counted), str(reason) if perturbed else "")
        )
        if not ok:
            continue
        side.perturbed += int(perturbed)
        if perturbed:
            side.reasons.append(str(reason))
        if not is_counted:
            continue
        side.rates.append(float(rate))
        side.joules.append(float(joules) if joules and not pd.isna(joules) else math.nan)
        device_class = "cpu" if pd.isna(device_index) else "cuda"
        side.devices[_device_label(device_name, device_class)] = None
        side.precisions[precision_of(precision, knobs, device_class)] = None
    return index


def _platform_of(row: Mapping[str, Any]) -> str:
    """A row's platform: '' for a run without platforms (and for tables from before them)."""
    platform = row.get("platform")
    return "" if platform is None or pd.isna(platform) else str(platform)


def _device_label(device_name: Any, device_class: str) -> str:
    return f"{device_name} ({device_class})" if isinstance(device_name, str) else device_class


def _speedup_row(
    index: _Index,
    settings: Settings,
    claims: Mapping[str, Any],
    name: str,
    comparison: Comparison,
    place: tuple[str, str, str],
) -> dict[str, Any]:
    platform, model, mode = place
    base_spec, cand_spec = comparison.sides
    base_rows = index.cells.get((platform, base_spec.env, base_spec.variant, model, mode), [])
    cand_rows = index.cells.get((platform, cand_spec.env, cand_spec.variant, model, mode), [])
    configured = configured_sizes(settings, model, settings.device) or {}
    size = _chosen_size(base_rows, cand_rows, configured)
    base, cand = _at_size(base_rows, size), _at_size(cand_rows, size)
    row = {
        **_comparison_fields(name, comparison, claims, model),
        "platform": platform,
        "mode": mode,
        **_size_columns(size),
        **_side("baseline", base),
        **_side("candidate", cand),
    }
    sides = _trial_sides(index, base_spec, cand_spec, place, size)
    row.update(
        _counted_trials("baseline", sides[0], settings)
        | _counted_trials("candidate", sides[1], settings)
    )
    row["speedup"] = _ratio(row["candidate_samples_per_s"], row["baseline_samples_per_s"])
    row.update(_interval(*sides, row["speedup"]))
    row.update(_measured_on(*sides))
    row["verdict"], row["verdict_reason"] = verdict(row, claims, settings.device)
    row[breakdown.SENTENCE] = breakdown.explain(
        breakdown.side(row, "baseline_"), breakdown.side(row, "candidate_")
    )
    left_out_pairs = not_planned(settings)
    left_out = [
        reason
        for spec in (base_spec, cand_spec)
        if (reason := left_out_pairs.get((platform, spec.env)))
    ]
    if left_out:
        row["verdict"], row["verdict_reason"] = NOT_MEASURED, "; ".join(dict.fromkeys(left_out))
    return row


def _comparison_fields(
    name: str, comparison: Comparison, claims: Mapping[str, Any], model: str
) -> dict[str, Any]:
    group = comparison.claim
    group_claims = claims.get(group) if isinstance(claims.get(group), Mapping) else {}
    return {
        "comparison": name,
        "title": comparison.title or name,
        "model": model,
        "baseline_env": comparison.baseline.env,
        "baseline_variant": comparison.baseline.variant,
        "candidate_env": comparison.candidate.env,
        "candidate_variant": comparison.candidate.variant,
        "claim": group,
        **published_figures(claims, group, model),
        "claim_device": str(group_claims.get("device") or ""),
        "claim_precision": str(group_claims.get("precision") or ""),
    }


def _unmatrixed_claim_rows(
    settings: Settings, claims: Mapping[str, Any], name: str, comparison: Comparison
) -> list[dict[str, Any]]:
    """Rows for the models a comparison's claim names but the matrix does not run."""
    group = comparison.claim
    group_claims = claims.get(group) if group else None
    claimed = group_claims.get("models") if isinstance(group_claims, Mapping) else None
    if not isinstance(claimed, Mapping):
        return []
    rows = []
    for model in claimed:
        if model in settings.models:
            continue
        row = {
            **_comparison_fields(name, comparison, claims, model),
            "platform": "",
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
    base_spec: Side,
    cand_spec: Side,
    place: tuple[str, str, str],
    size: tuple[int | None, ...] | None,
) -> tuple[_Side | None, _Side | None]:
    if index.sides is None or size is None:
        return None, None
    platform, model, mode = place
    base = index.sides.get((platform, base_spec.env, base_spec.variant, model, mode, *size))
    cand = index.sides.get((platform, cand_spec.env, cand_spec.variant, model, mode, *size))
    return base, cand


def _interval(base: _Side | None, cand: _Side | None, medians_ratio: float) -> dict[str, Any]:
    """The speedup of the ok trials with its interval, and their energy per sample's ratio;
    without trials, the ratio of medians."""
    if base is None or cand is None or not base.rates or not cand.rates:
        # Without trials, or a side without counted ones (all perturbed, none ok): no interval.
        return {
            "speedup": medians_ratio,
            "speedup_low": math.nan,
            "speedup_high": math.nan,
            "speedup_confidence": math.nan,
            "p_value": math.nan,
            "significant": False,
            **energy.ratio([], [], CONFIDENCE),
        }
    return {
        **ranks.speedup(base.rates, cand.rates, CONFIDENCE, ALPHA).columns("speedup"),
        **energy.ratio(base.joules, cand.joules, CONFIDENCE),
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


def _size_key(values: Sequence[Any]) -> tuple[int | None, ...]:
    """Sizes as a key: None for a blank one (a size the model does not use)."""
    return tuple(None if pd.isna(v) else int(v) for v in values)


def _size_of(row: Mapping[str, Any]) -> tuple[int | None, ...] | None:
    """A summary row's sizes (None without a batch size)."""
    values = [row[key] for key in SIZE_KEYS]
    return None if pd.isna(values[0]) else _size_key(values)


def _size_columns(size: tuple[int | None, ...] | None) -> dict[str, Any]:
    values = size or (None,) * len(SIZE_KEYS)
    return {key: pd.NA if v is None else v for key, v in zip(SIZE_KEYS, values, strict=True)}


def _sizes_of(rows: Sequence[Mapping[str, Any]]) -> set[tuple[int | None, ...]]:
    sizes = (_size_of(row) for row in rows)
    return {size for size in sizes if size is not None}


def _chosen_size(
    base: Sequence[Mapping[str, Any]],
    cand: Sequence[Mapping[str, Any]],
    configured: Mapping[str, Any],
) -> tuple[int | None, ...] | None:
    """The configured size both sides have (a size the model does not use, blank, matches
    any), else the largest they share, else the largest either has."""
    options = (_sizes_of(base) & _sizes_of(cand)) or (_sizes_of(base) | _sizes_of(cand))
    wanted = [
        size
        for size in options
        if all(size[i] in (None, configured[k]) for i, k in enumerate(SIZE_KEYS) if k in configured)
    ]
    candidates = wanted if configured and wanted else options
    return max(candidates, key=_size_order) if candidates else None


def _size_order(size: tuple[int | None, ...]) -> tuple[int, ...]:
    return tuple(-1 if v is None else v for v in size)


def _at_size(
    rows: Sequence[Mapping[str, Any]], size: tuple[int | None, ...] | None
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
        f"{prefix}_perturbed_trials": int(row.get("perturbed_trials") or 0)
        if row is not None
        else 0,
        f"{prefix}_perturbed_reasons": _text(row.get("perturbed_reasons")) if row else "",
        f"{prefix}_reruns": int(row.get("reruns") or 0) if row is not None else 0,
        f"{prefix}_uncounted": "",
        **_compiler_side(prefix, row),
        **breakdown.side_columns(prefix, row),
    }


def _compiler_side(prefix: str, row: Mapping[str, Any] | None) -> dict[str, Any]:
    """What the compiler did in a side's cell, as its summary row says (blank without one)."""
    found = row or {}
    return {
        f"{prefix}_{column}": found.get(column, "" if column == COMPILER_REASONS else math.nan)
        for column in COMPILER_COLUMNS
    }


def _counted_trials(prefix: str, side: _Side | None, settings: Settings) -> dict[str, Any]:
    """A side's median and trial count over the trials its speedup uses (the quiet ones,
    unless conditions.keep_perturbed), how many ok trials were perturbed and by what, and why
    fewer trials than configured were counted (:func:`uncounted`)."""
    if side is None:
        return {}
    median = stats.summarise(side.rates, CONFIDENCE).median if side.rates else math.nan
    kinds = perturbed_counts(
        np.array([True] * len(side.reasons), dtype=object), np.array(side.reasons, dtype=object)
    )
    return {
        f"{prefix}_samples_per_s": median,
        f"{prefix}_trials": len(side.rates),
        f"{prefix}_perturbed_trials": side.perturbed,
        f"{prefix}_perturbed_reasons": kinds["perturbed_reasons"],
        f"{prefix}_uncounted": uncounted(side.trials, settings),
    }


def uncounted(trials: Sequence[_Trial], settings: Settings) -> str:
    """Why a cell counted fewer trials than the config's ``trials``: per configured trial that
    none of its attempts (:mod:`ptspeed.analysis.reruns`) counts, what its last attempt was —
    perturbed, by which rule and why it was not run again, or its status; '' where every
    configured trial counts (or the config names no trials)."""
    configured = settings.trials
    if configured is None:
        return ""
    counted = {t.number % configured for t in trials if t.counted and t.number >= 0}
    if len(counted) >= configured or sum(t.counted for t in trials) >= configured:
        return ""
    attempts: dict[int, list[_Trial]] = {}
    for trial in sorted(trials, key=lambda t: t.number):
        if trial.number >= 0:
            attempts.setdefault(trial.number % configured, []).append(trial)
    outcomes: dict[str, int] = {}
    for slot in range(configured):
        if slot in counted:
            continue
        outcome = _slot_outcome(attempts.get(slot, []), configured, settings.conditions.reruns)
        outcomes[outcome] = outcomes.get(outcome, 0) + 1
    shown = "; ".join(f"{n} {outcome}" for outcome, n in outcomes.items())
    return f"{len(counted)} of {configured} trials counted ({shown})"


def _slot_outcome(attempts: Sequence[_Trial], configured: int, reruns: int) -> str:
    """What became of a configured trial none of whose attempts counts."""
    if not attempts:
        return "no record"
    last = attempts[-1]
    if last.status != "ok":
        return last.status
    if not last.reason:
        return "not counted"
    kinds = reason_kinds(last.reason)
    attempt = last.number // configured
    earlier = reason_kinds(attempts[-2].reason) if len(attempts) > 1 else []
    if earlier and not set(kinds) - set(earlier):
        why = "reruns stopped: the same rule flagged the rerun again"
    elif attempt >= reruns:
        why = f"reruns used up (conditions.reruns {reruns})" if reruns else "no reruns"
    else:
        why = "not rerun"
    return f"perturbed ({', '.join(kinds)}), {why}"


def _text(value: Any) -> str:
    return value if isinstance(value, str) else ""


def _ratio(numerator: float, denominator: float) -> float:
    if math.isnan(numerator) or math.isnan(denominator) or denominator == 0:
        return math.nan
    return numerator / denominator
