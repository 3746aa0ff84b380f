"""Published claims beside measured speedups: the figures a claim gives, and the verdict.

Owns :func:`published_figures` (a model's published speedup, baseline and candidate from the
parsed ``config/claims.yaml``) and :func:`verdict` (consistent with, below or above the claim,
measured without a claim, or not measured and why), with the context a verdict states: where
the claim was made, where it was measured, and the confidence its interval achieves. Pure.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from typing import Any

from ptspeed.analysis import ranks, stats
from ptspeed.analysis.columns import ALPHA, CONFIDENCE, SIDES

MEASURED = "measured"
NOT_MEASURED = "not measured"
CLAIM_VERDICTS = {
    "consistent": "consistent with the claim",
    "below": "below the claim",
    "above": "above the claim",
}


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

    Against a claim: consistent with the claim (the published speedup inside the measured
    interval), below the claim (the whole interval below the published speedup: the speedup
    falls short of it), above the claim (the whole interval above it), or not measured and why
    (a side without counted trials, :func:`empty_sides`; a claim made on a GPU checked by a
    CPU run). Without a claim: measured.
    """
    empty = empty_sides(row)
    if empty:
        return NOT_MEASURED, empty
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
    other_gpu = claimed_on_another_gpu(claims[group], row)
    if other_gpu:
        return NOT_MEASURED, other_gpu
    if math.isnan(row.get("speedup_low", math.nan)):
        return MEASURED, "too few ok trials for an interval"
    achieved = row.get("speedup_confidence", math.nan)
    ratio = ranks.Ratio(
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
    outcome = ranks.compare_to_claim(ratio, row["published_speedup"])
    return CLAIM_VERDICTS[outcome], _claim_context(claims[group], row, achieved)


def empty_sides(row: Mapping[str, Any]) -> str:
    """Why a speedups row has no speedup, from its sides without counted trials: ``"no ok
    trials: baseline (torch-1.13/eager: failed:5)"``, or where a side's ok trials were all
    judged perturbed ``"all 15 ok trials perturbed: baseline (torch-1.13/eager: machine-speed
    probe: 15)"``; '' where both sides counted trials."""
    none_ok, all_perturbed = [], []
    for side in SIDES:
        if row[f"{side}_trials"] and not math.isnan(row[f"{side}_samples_per_s"]):
            continue
        cell = f"{row[f'{side}_env']}/{row[f'{side}_variant']}"
        perturbed = _count(row.get(f"{side}_perturbed_trials"))
        if perturbed:
            reasons = _text(row.get(f"{side}_perturbed_reasons")) or "see Perturbed trials"
            all_perturbed.append(f"all {perturbed} ok trials perturbed: {side} ({cell}: {reasons})")
        else:
            statuses = _text(row.get(f"{side}_statuses")) or "no records"
            none_ok.append(f"{side} ({cell}: {statuses})")
    parts = (["no ok trials: " + ", ".join(none_ok)] if none_ok else []) + all_perturbed
    return "; ".join(parts)


def _count(value: Any) -> int:
    try:
        number = float(value)
    except (TypeError, ValueError):
        return 0
    return int(number) if math.isfinite(number) else 0


def _text(value: Any) -> str:
    return value if isinstance(value, str) else ""


def claimed_on_another_gpu(group: Mapping[str, Any], row: Mapping[str, Any]) -> str:
    """Why a claim made on one GPU model (the group's ``gpu``, e.g. A100) is not judged by a
    row measured on another; '' where it is measured on that model (or names none)."""
    model = str(group.get("gpu") or "")
    measured = str(row.get("measured_device") or "")
    if not model or not measured or model.lower() in measured.lower():
        return ""
    platform = f"platform {row['platform']} " if row.get("platform") else ""
    claimed = group.get("device") or model
    return f"claimed on {claimed}; {platform}measured on {measured}: another GPU"


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
