"""Perturbed trials: each ok trial judged quiet or perturbed from the conditions it recorded.

A cell records what else ran during its measured window
(:mod:`ptspeed.cell.measurement.conditions`); this module judges it with the config's
``conditions`` thresholds (defaults in the config schema), so a changed threshold re-judges old
records without rerunning. A trial is perturbed when

* other processes took more than ``max_other_cpu_share`` of its CPUs' time over the window
  (``other_cpu_s / (window_s x affinity_cpus)``), or left it less than ``min_cpu_left_ratio``
  of the CPU share they left the run's typical trial (1 - that share, against its median over
  the run's judged trials: a burst beside some trials, whatever the machine's steady
  background); windows shorter than ``min_window_s``, which /proc/stat's 10 ms ticks cannot
  resolve, are not judged by CPU, nor trials without ``other_cpu_s`` (also where the cell
  did not trust its own CPU time: see ``not_readable``);
* the highest CPU clock (cpufreq) seen at the window's start and end, or the GPU's median SM
  clock over the samples taken in the window, was below ``min_clock_fraction`` of its maximum;
* a GPU throttle reason of ``throttle_reasons`` was active; or
* more than ``max_other_gpu_processes`` processes that are not the cell's used its GPU;
* GradScaler skipped optimizer steps inside the window (fp16 overflow: steps without update);
* the hypervisor took more than ``max_steal_share`` of its CPUs' time over the window (steal:
  ``steal_cpu_s / (window_s x affinity_cpus)``; windows under ``min_window_s`` not judged so);
* its machine-speed probe (:mod:`ptspeed.cell.measurement.probe`, just outside the window:
  :func:`probe_s`) was more than ``max_probe_deviation`` slower or faster than the run's median
  trial's (``median / probe_s - 1``, the node's speed against the run's other trials), among
  the run's trials whose probe did the same work (:func:`probe_group`: platform, device, CPU
  threads, probe work), where at least :data:`MIN_PROBED_TRIALS` of them probed.

:func:`judge_runs` adds ``perturbed`` (true, false, or blank where nothing could be judged: a
trial that is not ok or recorded no conditions) and ``perturbed_reason`` to the runs frame.
Perturbed trials stay in runs and the summary, marked (:func:`perturbed_counts`), and leave the
speedups unless ``keep_perturbed`` (:func:`counted_in_speedups`). Pure; no torch.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Mapping
from typing import Any

import numpy as np
import pandas as pd

from ptspeed.cell.record import Conditions
from ptspeed.plan.schema import fill_defaults, load_schema

# Per-rank lists stay in the records.
CONDITION_COLUMNS = [
    f.name for f in dataclasses.fields(Conditions) if not str(f.type).startswith("list")
]
CONDITION_TEXT_COLUMNS = [
    f.name for f in dataclasses.fields(Conditions) if f.type in ("str", "Optional[str]")
]
CONDITION_INT_COLUMNS = [
    "affinity_cpus",
    "node_cpus",
    "gpu_samples",
    "gpu_other_processes",
    "probe_threads",
]
JUDGEMENT_COLUMNS = ["perturbed", "perturbed_reason"]
# A run where more than this share of the judged trials was perturbed says so at the top.
MOSTLY = 0.5
# Fewer probed trials in a group give no median to judge a trial's probe against.
MIN_PROBED_TRIALS = 3
PROBE_COLUMNS = {
    "cpu": ("probe_cpu_gemm_s", "probe_cpu_memory_s"),
    "cuda": ("probe_gpu_gemm_s",),
}


def settings(config: Mapping[str, Any] | None) -> dict[str, Any]:
    """The ``conditions`` thresholds of ``config``, the schema's defaults filling the gaps."""
    given = (config or {}).get("conditions")
    filled: dict[str, Any] = {"conditions": dict(given) if isinstance(given, Mapping) else {}}
    schema = load_schema()
    fill_defaults(filled, {"properties": {"conditions": schema["properties"]["conditions"]}})
    return filled["conditions"]


def judge_runs(runs: pd.DataFrame, config: Mapping[str, Any] | None = None) -> pd.DataFrame:
    """``runs`` with ``perturbed`` and ``perturbed_reason`` set for every ok trial."""
    thresholds = settings(config)
    runs = runs.copy()
    rows = runs.to_dict("records")
    thresholds["_typical_cpu_left"] = _typical_cpu_left(rows, thresholds["min_window_s"])
    thresholds["_typical_probe_s"] = typical_probe_s(rows)
    verdicts = [_judge(row, thresholds) if row["status"] == "ok" else (pd.NA, "") for row in rows]
    runs["perturbed"] = pd.array([v[0] for v in verdicts], dtype="boolean")
    runs["perturbed_reason"] = [v[1] for v in verdicts]
    return runs


def _judge(row: Mapping[str, Any], thresholds: Mapping[str, Any]) -> tuple[Any, str]:
    """(perturbed, why) of one ok trial; (NA, '') where it recorded nothing to judge."""
    if _blank(row.get("window_s")):
        return pd.NA, ""
    reasons = [reason for rule in RULES if (reason := rule(row, thresholds))]
    return bool(reasons), "; ".join(reasons)


def other_cpu_share(row: Mapping[str, Any]) -> float:
    """The share of the trial's CPUs' time other processes took over its window (NaN: unknown)."""
    other, window, cpus = row.get("other_cpu_s"), row.get("window_s"), row.get("affinity_cpus")
    if any(_blank(v) for v in (other, window, cpus)) or not window or not cpus:
        return math.nan
    return max(0.0, float(other)) / (float(window) * float(cpus))


def _cpu_share(row: Mapping[str, Any], thresholds: Mapping[str, Any]) -> str:
    share = _judged_share(row, thresholds["min_window_s"])
    limit = thresholds["max_other_cpu_share"]
    if math.isnan(share):
        return ""
    return f"other processes took {share:.0%} of its CPUs (> {limit:.0%})" if share > limit else ""


def _judged_share(row: Mapping[str, Any], min_window_s: float) -> float:
    """The other processes' CPU share of an ok trial whose window is long enough, else NaN."""
    window = row.get("window_s")
    if row.get("status") != "ok" or _blank(window) or float(window) < min_window_s:
        return math.nan
    return other_cpu_share(row)


def _typical_cpu_left(rows: list[dict[str, Any]], min_window_s: float) -> float:
    """The median CPU share other processes left the run's judged trials (NaN: none)."""
    shares = [_judged_share(row, min_window_s) for row in rows]
    left = [1.0 - share for share in shares if not math.isnan(share)]
    return float(np.median(left)) if left else math.nan


def _cpu_left(row: Mapping[str, Any], thresholds: Mapping[str, Any]) -> str:
    share = _judged_share(row, thresholds["min_window_s"])
    typical, ratio = thresholds["_typical_cpu_left"], thresholds["min_cpu_left_ratio"]
    if math.isnan(share) or math.isnan(typical) or 1.0 - share >= ratio * typical:
        return ""
    return (
        f"other processes left it {1.0 - share:.0%} of its CPUs (< {ratio:.0%} of the "
        f"{typical:.0%} they left the run's median trial)"
    )


def _clock_reason(what: str, highest: Any, limit: Any, fraction: float) -> str:
    if _blank(highest) or _blank(limit) or not limit:
        return ""
    if float(highest) >= fraction * float(limit):
        return ""
    return f"{what} clock {float(highest):.0f} MHz < {fraction:.0%} of its {float(limit):.0f} MHz"


def _cpu_clock(row: Mapping[str, Any], thresholds: Mapping[str, Any]) -> str:
    fraction = thresholds["min_clock_fraction"]
    return _clock_reason("CPU", row.get("cpu_mhz_max"), row.get("cpu_mhz_limit"), fraction)


def _gpu_clock(row: Mapping[str, Any], thresholds: Mapping[str, Any]) -> str:
    """The median SM clock over the window's samples (NVML); records from before, or from
    nvidia-smi's two idle snapshots, have only the higher of those."""
    fraction = thresholds["min_clock_fraction"]
    clock = row.get("gpu_sm_mhz_median")
    if clock is None or pd.isna(clock):
        clock = row.get("gpu_sm_mhz_max")
    return _clock_reason("GPU SM", clock, row.get("gpu_sm_mhz_limit"), fraction)


def _throttled(row: Mapping[str, Any], thresholds: Mapping[str, Any]) -> str:
    active = row.get("gpu_throttle_reasons")
    names = [n.strip() for n in active.split(",")] if isinstance(active, str) else []
    judged = [name for name in names if name in thresholds["throttle_reasons"]]
    return f"GPU throttled ({', '.join(judged)})" if judged else ""


def _scaler_skipped(row: Mapping[str, Any], thresholds: Mapping[str, Any]) -> str:
    """fp16 steps GradScaler skipped in the window did no optimizer update (and ran faster)."""
    skipped = row.get("amp_skipped_steps")
    if _blank(skipped) or int(skipped) <= 0:
        return ""
    return f"GradScaler skipped {int(skipped)} optimizer step(s) in the window (fp16 overflow)"


def _gpu_neighbours(row: Mapping[str, Any], thresholds: Mapping[str, Any]) -> str:
    others, limit = row.get("gpu_other_processes"), thresholds["max_other_gpu_processes"]
    if _blank(others) or int(others) <= limit:
        return ""
    return f"{int(others)} other process(es) on its GPU"


def steal_share(row: Mapping[str, Any]) -> float:
    """The share of the trial's CPUs' time the hypervisor gave other guests over its window
    (NaN: unknown)."""
    steal, window, cpus = row.get("steal_cpu_s"), row.get("window_s"), row.get("affinity_cpus")
    if any(_blank(v) for v in (steal, window, cpus)) or not window or not cpus:
        return math.nan
    return max(0.0, float(steal)) / (float(window) * float(cpus))


def _stolen(row: Mapping[str, Any], thresholds: Mapping[str, Any]) -> str:
    window, limit = row.get("window_s"), thresholds["max_steal_share"]
    if _blank(window) or float(window) < thresholds["min_window_s"]:
        return ""
    share = steal_share(row)
    if math.isnan(share) or share <= limit:
        return ""
    return f"the hypervisor took {share:.1%} of its CPUs (steal, > {limit:.1%})"


def probe_kind(row: Mapping[str, Any]) -> str:
    """'cuda' where the trial probed a GPU, 'cpu' where only the CPU, '' where it did not
    probe."""
    for kind in ("cuda", "cpu"):
        if not _blank(row.get(f"{PROBE_COLUMNS[kind][0]}_before")):
            return kind
    return ""


def probe_s(row: Mapping[str, Any]) -> float:
    """The trial's machine-speed probe in seconds (lower: a faster machine), the mean of its
    two ends: the GPU's GEMM on CUDA, the CPU's GEMM and memory pass together on the CPU; NaN
    where it did not probe."""
    kind = probe_kind(row)
    if not kind:
        return math.nan
    ends = []
    for end in ("before", "after"):
        values = [row.get(f"{column}_{end}") for column in PROBE_COLUMNS[kind]]
        if any(_blank(v) for v in values):
            return math.nan
        ends.append(sum(float(v) for v in values))
    return float(np.mean(ends)) if min(ends) > 0 else math.nan


def probe_group(row: Mapping[str, Any]) -> tuple[Any, ...]:
    """What a probe is compared within: platform, device kind, the CPU probe's threads (a
    GPU's probe does not depend on them) and the probe's work."""
    kind = probe_kind(row)
    threads = row.get("probe_threads") if kind == "cpu" else None
    platform = row.get("platform")
    return (
        "" if _blank(platform) else str(platform),
        kind,
        None if _blank(threads) else int(threads),
        str(row.get("probe_work") or ""),
    )


def typical_probe_s(rows: list[dict[str, Any]]) -> dict[tuple[Any, ...], float]:
    """The median probe of the run's ok trials per :func:`probe_group`, where at least
    :data:`MIN_PROBED_TRIALS` probed."""
    groups: dict[tuple[Any, ...], list[float]] = {}
    for row in rows:
        seconds = probe_s(row) if row.get("status") == "ok" else math.nan
        if not math.isnan(seconds):
            groups.setdefault(probe_group(row), []).append(seconds)
    return {
        group: float(np.median(values))
        for group, values in groups.items()
        if len(values) >= MIN_PROBED_TRIALS
    }


def _probe_off(row: Mapping[str, Any], thresholds: Mapping[str, Any]) -> str:
    seconds = probe_s(row)
    typical = thresholds.get("_typical_probe_s", {}).get(probe_group(row))
    if math.isnan(seconds) or typical is None:
        return ""
    speed, limit = typical / seconds, thresholds["max_probe_deviation"]
    if abs(speed - 1.0) <= limit:
        return ""
    how = f"{1.0 - speed:.0%} slower" if speed < 1.0 else f"{speed - 1.0:.0%} faster"
    return (
        f"the node ran {how} than in the run's other trials (machine-speed probe "
        f"{seconds * 1e3:.0f} ms against their median {typical * 1e3:.0f} ms, > {limit:.0%} off)"
    )


def _blank(value: Any) -> bool:
    return value is None or value is pd.NA or (isinstance(value, float) and math.isnan(value))


def counted_in_speedups(runs: pd.DataFrame, config: Mapping[str, Any] | None) -> pd.Series:
    """Which rows a speedup may use: all but the perturbed, unless ``keep_perturbed``."""
    if settings(config)["keep_perturbed"] or "perturbed" not in runs.columns:
        return pd.Series(True, index=runs.index)
    return ~runs["perturbed"].astype("boolean").fillna(False).astype(bool)


def perturbed_counts(perturbed: np.ndarray, reasons: np.ndarray) -> dict[str, Any]:
    """A cell's ``perturbed_trials`` and ``perturbed_reasons`` (each distinct reason with how
    many trials had it), from its trials' judgements."""
    flags = [v is True or v is np.True_ for v in perturbed]
    seen: dict[str, int] = {}
    for flag, reason in zip(flags, reasons, strict=True):
        parts = str(reason).split("; ") if flag and isinstance(reason, str) else []
        for kind in dict.fromkeys(_reason_kind(part) for part in parts):
            seen[kind] = seen.get(kind, 0) + 1
    return {
        "perturbed_trials": sum(flags),
        "perturbed_reasons": "; ".join(f"{kind}: {n}" for kind, n in seen.items()),
    }


def _reason_kind(reason: str) -> str:
    """The rule a reason comes from, without its numbers ("other processes took 78% …" →
    "other processes")."""
    for kind in (
        "other processes took",
        "other processes left",
        "CPU clock",
        "GPU SM clock",
        "GPU throttled",
        "the hypervisor took",
        "the node ran",
    ):
        if reason.startswith(kind):
            return _KINDS.get(kind, kind)
    return "other processes on its GPU" if "on its GPU" in reason else reason


def mostly_perturbed(runs: pd.DataFrame) -> str:
    """One sentence for the top of the report where most judged trials were perturbed, else
    ''."""
    if "perturbed" not in runs.columns:
        return ""
    judged = runs["perturbed"].dropna()
    count = int(judged.sum()) if len(judged) else 0
    if not len(judged) or count <= MOSTLY * len(judged):
        return ""
    return (
        f"Most trials of this run were perturbed ({count} of {len(judged)} judged trials ran "
        "while other processes used their CPUs or their clocks were held down; see Perturbed "
        "trials): its throughputs and speedups do not describe a quiet machine."
    )


RULES = (
    _cpu_share,
    _cpu_left,
    _cpu_clock,
    _gpu_clock,
    _throttled,
    _gpu_neighbours,
    _scaler_skipped,
    _stolen,
    _probe_off,
)
_KINDS = {
    "other processes took": "other processes",
    "other processes left": "other processes",
    "the hypervisor took": "steal",
    "the node ran": "machine-speed probe",
}
