"""Where each step's time goes, in the tables: the profiled steps' time by kind of work.

Owns the breakdown's columns in the runs table (:data:`RUN_COLUMNS`: a record's ``profile``
flattened, one ``time_<kind>_s`` column per kind of
:data:`ptspeed.cell.measurement.work_kinds.KINDS`), in the summary (:data:`SUMMARY_COLUMNS`: the
median of each over the cell's profiled ok trials, the unperturbed ones where there are any;
the workflow profiles the first trial and its reruns) and in the speedups
(:func:`side_columns`: each side's, and :data:`SENTENCE`, the sentence that names the biggest
changes, :func:`explain`). Pure; no torch.
"""

from __future__ import annotations

import math
import statistics
from collections.abc import Iterable, Mapping
from typing import Any

from ptspeed.cell.measurement.breakdown import SUM_TOLERANCE
from ptspeed.cell.measurement.work_kinds import KINDS

KIND_COLUMNS = [f"time_{kind}_s" for kind in KINDS]
KIND_LABELS = {
    "matmul": "matmul/conv",
    "attention": "attention",
    "elementwise": "elementwise",
    "norm": "normalisation",
    "reduction": "reductions/softmax",
    "copy": "copies",
    "optimizer": "optimizer",
    "compiled": "compiler-generated",
    "collective": "collectives",
    "idle": "GPU idle",
    "host": "Python/framework",
    "other": "other",
}
COUNT_COLUMNS = ["kernels_per_step", "copies_per_step", "elementwise_ops_per_step"]
RUN_FLAG_COLUMNS = ["profiled", "profile_sums"]
RUN_TEXT_COLUMNS = ["profile_reason", "profile_timeline", "trace", "profile_notes"]
RUN_FLOAT_COLUMNS = ["profile_step_s", "profile_sum_error", *KIND_COLUMNS, *COUNT_COLUMNS]
RUN_COLUMNS = [
    "profiled",
    "profile_reason",
    "profile_timeline",
    "profile_step_s",
    *KIND_COLUMNS,
    "profile_sum_error",
    "profile_sums",
    *COUNT_COLUMNS,
    "trace",
    "profile_notes",
]
SUMMARY_TEXT_COLUMNS = ["profile_timeline", "trace", "profile_notes"]
SUMMARY_COLUMNS = [
    "profiled_trials",
    "profile_timeline",
    "profile_step_s",
    *KIND_COLUMNS,
    "profile_sum_error",
    *COUNT_COLUMNS,
    "trace",
    "profile_notes",
]
SUMMARY_INPUTS = [*RUN_COLUMNS]
# What each side of a speedup carries, and the sentence that compares them.
SIDE_COLUMNS = [
    "profile_timeline", "profile_step_s", *KIND_COLUMNS, *COUNT_COLUMNS, "trace", "profile_notes",
]  # fmt: skip
SIDE_TEXT_COLUMNS = ("profile_timeline", "trace", "profile_notes")
SENTENCE = "breakdown"
# Kinds the sentence names at most, and the smallest change it names (a share of the step).
NAMED_KINDS = 3
SMALLEST_NAMED_SHARE = 0.02
PERTURBED_NOTE = "profiled in a trial judged perturbed: its times are a loaded machine's"
TOLERANCE_NOTE = f"the kinds sum to the profiled step time within {SUM_TOLERANCE:.0%}"


def run_columns(profile: Any) -> dict[str, Any]:
    """A record's ``profile`` (a mapping, or absent in older records) as runs columns."""
    found = profile if isinstance(profile, Mapping) else {}
    times = found.get("time_by_kind_s") if isinstance(found.get("time_by_kind_s"), Mapping) else {}
    counts = found.get("ops_by_kind") if isinstance(found.get("ops_by_kind"), Mapping) else {}
    profiled = found.get("profiled") is True
    return {
        "profiled": profiled if found else None,
        "profile_reason": str(found.get("reason") or ""),
        "profile_timeline": str(found.get("timeline") or ""),
        "profile_step_s": found.get("step_time_s"),
        **{f"time_{kind}_s": _number(times.get(kind, 0.0)) if profiled else None for kind in KINDS},
        "profile_sum_error": found.get("sum_error"),
        "profile_sums": found.get("sums"),
        "kernels_per_step": found.get("kernels_per_step"),
        "copies_per_step": found.get("copies_per_step"),
        "elementwise_ops_per_step": _number(counts.get("elementwise", 0.0)) if profiled else None,
        "trace": str(found.get("trace") or ""),
        "profile_notes": str(found.get("notes") or ""),
    }


def summarise(trials: Mapping[str, Any], ok: Any) -> dict[str, Any]:
    """A cell's summary columns: the medians over its ok trials that were profiled and not
    judged perturbed; where every profiled trial ran perturbed, over those, saying so in
    ``profile_notes`` (their times are a loaded machine's)."""
    profiled = [_is_true(flag) for flag in trials["profiled"]]
    perturbed = [_is_true(flag) for flag in trials.get("perturbed", [False] * len(profiled))]
    candidates = [
        i for i, (good, flag) in enumerate(zip(ok, profiled, strict=True)) if good and flag
    ]
    quiet = [i for i in candidates if not perturbed[i]]
    chosen = quiet or candidates
    if not chosen:
        return {
            column: ("" if column in SUMMARY_TEXT_COLUMNS else math.nan)
            for column in SUMMARY_COLUMNS
        } | {"profiled_trials": 0}
    numbers = ["profile_step_s", *KIND_COLUMNS, "profile_sum_error", *COUNT_COLUMNS]
    row: dict[str, Any] = {column: _median(trials[column][i] for i in chosen) for column in numbers}
    texts = {
        column: _first_text(trials[column][i] for i in chosen) for column in SUMMARY_TEXT_COLUMNS
    }
    if not quiet:
        texts["profile_notes"] = "; ".join(filter(None, [PERTURBED_NOTE, texts["profile_notes"]]))
    return {"profiled_trials": len(chosen), **row, **texts}


def _is_true(flag: Any) -> bool:
    """A flag of the runs table (a bool, numpy's, or a nullable boolean's NA) that is True."""
    return type(flag).__name__ in ("bool", "bool_") and bool(flag)


def side_columns(prefix: str, row: Mapping[str, Any] | None) -> dict[str, Any]:
    """A speedup side's breakdown, as its summary row says (blank without one)."""
    found = row or {}
    return {
        f"{prefix}_{column}": found.get(column, "" if column in SIDE_TEXT_COLUMNS else math.nan)
        for column in SIDE_COLUMNS
    }


def speedup_columns() -> dict[str, bool]:
    """The speedups table's breakdown columns, each with whether it holds text."""
    sides = {
        f"{side}_{column}": column in SIDE_TEXT_COLUMNS
        for side in ("baseline", "candidate")
        for column in SIDE_COLUMNS
    }
    return {**sides, SENTENCE: True}


def side(row: Mapping[str, Any], prefix: str = "") -> dict[str, Any]:
    """One side's breakdown from a row (a summary row, or a speedups row with ``prefix``):
    ``{"timeline", "step_s", "times" (kind -> seconds), "kernels", "copies", "trace"}``; empty
    when it was not profiled."""
    step = _number(row.get(f"{prefix}profile_step_s"))
    if step is None:
        return {}
    times = {kind: _number(row.get(f"{prefix}time_{kind}_s")) or 0.0 for kind in KINDS}
    return {
        "timeline": str(row.get(f"{prefix}profile_timeline") or ""),
        "step_s": step,
        "times": times,
        "kernels": _number(row.get(f"{prefix}kernels_per_step")),
        "copies": _number(row.get(f"{prefix}copies_per_step")),
        "trace": str(row.get(f"{prefix}trace") or ""),
        "perturbed": PERTURBED_NOTE in str(row.get(f"{prefix}profile_notes") or ""),
    }


def explain(base: Mapping[str, Any], cand: Mapping[str, Any]) -> str:
    """The sentence that names the biggest changes from ``base`` to ``cand`` (each a
    :func:`side`), e.g. ``"elementwise −62 % (4.1 → 1.6 ms), compiler-generated new (2.0 ms),
    matmul/conv +1 %; ops per step 412 → 96"``; '' when either side was not profiled."""
    if not base or not cand:
        return ""
    if base["timeline"] != cand["timeline"]:
        return (
            f"not comparable: the baseline's breakdown is of the {base['timeline'] or '?'} time, "
            f"the candidate's of the {cand['timeline'] or '?'} time"
        )
    scale = max(base["step_s"], cand["step_s"], 1e-12)
    changes = sorted(
        (
            (abs(cand["times"][kind] - base["times"][kind]), kind)
            for kind in KINDS
            if base["times"][kind] or cand["times"][kind]
        ),
        reverse=True,
    )
    named = [
        _change(kind, base["times"][kind], cand["times"][kind])
        for size, kind in changes[:NAMED_KINDS]
        if size / scale >= SMALLEST_NAMED_SHARE
    ]
    parts = [", ".join(named)] if named else ["no kind changes by 2 % of the step or more"]
    counted = "kernels" if base["timeline"] == "gpu" else "ops"
    if base["kernels"] is not None and cand["kernels"] is not None:
        parts.append(f"{counted} per step {_count(base['kernels'])} → {_count(cand['kernels'])}")
    loaded = [
        name for name, side in (("baseline", base), ("candidate", cand)) if side.get("perturbed")
    ]
    if loaded:
        parts.append(f"{' and '.join(loaded)} profiled on a perturbed trial (times inflated)")
    return "; ".join(parts)


def _change(kind: str, before: float, after: float) -> str:
    label = KIND_LABELS[kind]
    if before <= 0:
        return f"{label} new ({_ms(after)})"
    if after <= 0:
        return f"{label} gone (was {_ms(before)})"
    relative = (after - before) / before
    sign = "+" if relative >= 0 else "−"
    before_ms = _ms(before).removesuffix(" ms")
    return f"{label} {sign}{abs(relative):.0%} ({before_ms} → {_ms(after)})".replace("%", " %")


def _ms(seconds: float) -> str:
    milliseconds = seconds * 1e3
    digits = 2 if milliseconds < 1 else 1 if milliseconds < 100 else 0
    return f"{milliseconds:.{digits}f} ms"


def _count(value: float) -> str:
    return f"{value:.0f}" if abs(value - round(value)) < 0.05 or value >= 100 else f"{value:.1f}"


def _number(value: Any) -> float | None:
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        return None
    return float(value) if math.isfinite(value) else None


def _median(values: Iterable[Any]) -> float:
    numbers = [n for n in map(_number, values) if n is not None]
    return statistics.median(numbers) if numbers else math.nan


def _first_text(values: Iterable[Any]) -> str:
    return next((v for v in values if isinstance(v, str) and v), "")
