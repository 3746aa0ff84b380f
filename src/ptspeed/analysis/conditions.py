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
* its machine-speed probe (:mod:`ptspeed.cell.measurement.probe`, just outside the window)
  was off the median of its like probes by more than ``max_probe_deviation`` at **both** ends
  of the window, in the same direction (slower or faster): probes are like where the same
  work ran in the same environment and build, on the same platform, device and CPU threads
  (:func:`~ptspeed.analysis.trial_readings.probe_group`: a probe times the build's BLAS as
  much as the machine), where at least :data:`MIN_PROBED_TRIALS` trials probed. A group whose
  own probes spread wider than the threshold allows (a build or a machine noisier than the one
  the default was measured on, :data:`PROBE_SPREAD`) is judged by
  :data:`PROBE_SPREAD_MULTIPLIER` times that spread instead (:class:`ProbeNorm`), so that its
  quiet trials are not all flagged. One slow end alone is a passing moment outside the window,
  not a slow machine through it.

What each rule reads of a trial's row (its CPU shares, its probe's ends and group) is
:mod:`ptspeed.analysis.trial_readings`.

One judgement: the trials of round ``a`` (:mod:`ptspeed.analysis.reruns`: configured trials
are round 0, their reruns round 1, …) are judged against the run's median trial of rounds
``0 .. a``, the records the workflow had when it judged that round and decided its reruns
(``workflow/scripts/judge_trials.py``), so that the tables count exactly what the reruns replaced.

:func:`judge_runs` adds ``perturbed`` (true, false, or blank where nothing could be judged: a
trial that is not ok or recorded no conditions) and ``perturbed_reason`` to the runs frame.
Perturbed trials stay in runs and the summary, marked (:func:`perturbed_counts`), and leave the
speedups unless ``keep_perturbed`` (:func:`counted_in_speedups`). Pure; no torch.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import numpy as np
import pandas as pd

from ptspeed.analysis.trial_readings import (
    PROBE_COLUMNS,
    blank,
    other_cpu_share,
    probe_ends,
    probe_group,
    steal_share,
)
from ptspeed.cell.record_window import Conditions
from ptspeed.plan.schema import section_with_defaults
from ptspeed.plan.settings import Settings

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
# A group of like probes spread wider than max_probe_deviation allows is judged by this many
# times its own robust spread (1.4826 x the median absolute deviation of log(end / median),
# the standard deviation where the spread is normal): about 3 in 1,000 quiet ends lie beyond
# 3 of them, and a trial is flagged only where both its ends do.
PROBE_SPREAD_MULTIPLIER = 3.0
MAD_TO_SD = 1.4826


@dataclass(frozen=True)
class ProbeSpread:
    """What the probe measured on a quiet machine (:func:`quiet_spread`): the evidence for the
    default ``max_probe_deviation``, stated in the report's method. ``largest``: the largest
    deviation from the median of the *nearer* end of a trial's two (the one the rule judges by:
    it flags a trial only where both ends are off); ``spread``: the robust spread of the ends."""

    machine: str
    build: str
    threads: str
    load: str
    trials: int
    largest: float
    spread: float


# Measured with scripts/probe_spread.py (the mlp cell, 45 trials one at a time) on the 2-core
# AMD EPYC VM of issue 36, shared with other sessions' tests: the trials beside which other
# processes took at most QUIET_SHARE of the CPUs (one of its two busy, which left a one-thread
# cell its own). tests/fixtures/probes/amd-measured-host.csv holds them; a test recomputes
# these figures from it.
QUIET_SHARE = 0.55
PROBE_SPREAD = ProbeSpread(
    machine="a 2-core AMD EPYC VM (KVM)",
    build="torch 2.14.1, MKL",
    threads="1",
    load=f"other processes took at most {QUIET_SHARE:.0%} of its CPUs beside them",
    trials=20,
    largest=0.088,
    spread=0.018,
)


def quiet_spread(
    rows: list[dict[str, Any]], max_other_share: float = QUIET_SHARE
) -> tuple[int, float, float]:
    """(trials, largest, spread) of the probed ok trials beside which other processes took at
    most ``max_other_share`` of the CPUs, against the median of their ends (one group: pass
    like probes): how many, the largest deviation of a trial's nearer end, and the ends'
    robust spread (:data:`MAD_TO_SD` x their median absolute log deviation)."""
    quiet = [
        probe_ends(row)
        for row in rows
        if row.get("status") == "ok" and other_cpu_share(row) <= max_other_share
    ]
    quiet = [ends for ends in quiet if not any(math.isnan(end) for end in ends)]
    if not quiet:
        return 0, math.nan, math.nan
    median = float(np.median([end for ends in quiet for end in ends]))
    logs = [[abs(math.log(end / median)) for end in ends] for ends in quiet]
    largest = math.expm1(max(min(pair) for pair in logs))
    spread = MAD_TO_SD * float(np.median([value for pair in logs for value in pair]))
    return len(quiet), largest, spread


# The runs columns the probe's judgement reads: the layout of tests/fixtures/probes/.
PROBE_FIXTURE_COLUMNS = [
    "env",
    "model",
    "variant",
    "mode",
    "trial",
    "status",
    "platform",
    "torch",
    "window_s",
    "affinity_cpus",
    "other_cpu_s",
    "steal_cpu_s",
    *(f"{column}_{end}" for kind in ("cpu", "cuda") for column in PROBE_COLUMNS[kind]
      for end in ("before", "after")),
    "probe_gpu_sm_mhz_after",
    "probe_threads",
    "probe_work",
]  # fmt: skip


def judge_runs(runs: pd.DataFrame, run: Settings | None = None) -> pd.DataFrame:
    """``runs`` with ``perturbed`` and ``perturbed_reason`` set for every ok trial, each round's
    trials against the run's typical trial of the rounds up to theirs (:func:`judgement_rounds`),
    by the ``run``'s thresholds (without settings, the schema's defaults)."""
    thresholds = (
        run.conditions.to_mapping()
        if run is not None
        else section_with_defaults(None, "conditions")
    )
    runs = runs.copy()
    rows = runs.to_dict("records")
    verdicts: list[tuple[Any, str]] = [(pd.NA, "")] * len(rows)
    rounds = judgement_rounds(runs, run)
    for attempt in sorted(set(rounds)):
        pool = [row for row, a in zip(rows, rounds, strict=True) if a <= attempt]
        judged = {
            **thresholds,
            "_typical_cpu_left": _typical_cpu_left(pool, thresholds["min_window_s"]),
            "_probe_norms": probe_norms(pool),
        }
        for position, (row, a) in enumerate(zip(rows, rounds, strict=True)):
            if a == attempt and row["status"] == "ok":
                verdicts[position] = _judge(row, judged)
    runs["perturbed"] = pd.array([v[0] for v in verdicts], dtype="boolean")
    runs["perturbed_reason"] = [v[1] for v in verdicts]
    return runs


def judgement_rounds(runs: pd.DataFrame, run: Settings | None) -> list[int]:
    """Each row's round (0: a configured trial, ``a``: its ``a``-th rerun, trial number //
    ``trials``); all 0 without settings or their trials (one judgement over every row)."""
    trials = run.trials if run is not None else None
    if "trial" not in runs.columns or trials is None:
        return [0] * len(runs)
    numbers = pd.to_numeric(runs["trial"], errors="coerce")
    return [0 if pd.isna(n) else int(n) // trials for n in numbers]


def _judge(row: Mapping[str, Any], thresholds: Mapping[str, Any]) -> tuple[Any, str]:
    """(perturbed, why) of one ok trial; (NA, '') where it recorded nothing to judge."""
    if blank(row.get("window_s")):
        return pd.NA, ""
    reasons = [reason for rule in RULES if (reason := rule(row, thresholds))]
    return bool(reasons), "; ".join(reasons)


def _cpu_share(row: Mapping[str, Any], thresholds: Mapping[str, Any]) -> str:
    share = _judged_share(row, thresholds["min_window_s"])
    limit = thresholds["max_other_cpu_share"]
    if math.isnan(share):
        return ""
    return f"other processes took {share:.0%} of its CPUs (> {limit:.0%})" if share > limit else ""


def _judged_share(row: Mapping[str, Any], min_window_s: float) -> float:
    """The other processes' CPU share of an ok trial whose window is long enough, else NaN."""
    window = row.get("window_s")
    if row.get("status") != "ok" or blank(window) or float(window) < min_window_s:
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
    if blank(highest) or blank(limit) or not limit:
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
    if blank(skipped) or int(skipped) <= 0:
        return ""
    return f"GradScaler skipped {int(skipped)} optimizer step(s) in the window (fp16 overflow)"


def _gpu_neighbours(row: Mapping[str, Any], thresholds: Mapping[str, Any]) -> str:
    others, limit = row.get("gpu_other_processes"), thresholds["max_other_gpu_processes"]
    if blank(others) or int(others) <= limit:
        return ""
    return f"{int(others)} other process(es) on its GPU"


def _stolen(row: Mapping[str, Any], thresholds: Mapping[str, Any]) -> str:
    window, limit = row.get("window_s"), thresholds["max_steal_share"]
    if blank(window) or float(window) < thresholds["min_window_s"]:
        return ""
    share = steal_share(row)
    if math.isnan(share) or share <= limit:
        return ""
    return f"the hypervisor took {share:.1%} of its CPUs (steal, > {limit:.1%})"


@dataclass(frozen=True)
class ProbeNorm:
    """A group of like probes: their median (seconds, over both ends of every trial) and their
    robust spread (:data:`MAD_TO_SD` x the median absolute log deviation of an end from it)."""

    median_s: float
    spread: float
    trials: int

    def tolerance(self, max_deviation: float) -> float:
        """How far (a fraction) an end may lie from the median: ``max_deviation``, or
        :data:`PROBE_SPREAD_MULTIPLIER` times the group's own spread where that is wider."""
        return max(max_deviation, math.expm1(PROBE_SPREAD_MULTIPLIER * self.spread))


def probe_norms(rows: list[dict[str, Any]]) -> dict[tuple[Any, ...], ProbeNorm]:
    """Per :func:`probe_group` of the ok trials that probed at both ends, where at least
    :data:`MIN_PROBED_TRIALS` did: its :class:`ProbeNorm`."""
    groups: dict[tuple[Any, ...], list[float]] = {}
    for row in rows:
        ends = probe_ends(row) if row.get("status") == "ok" else (math.nan, math.nan)
        if not any(math.isnan(end) for end in ends):
            groups.setdefault(probe_group(row), []).extend(ends)
    norms = {}
    for group, ends in groups.items():
        if len(ends) < 2 * MIN_PROBED_TRIALS:
            continue
        median = float(np.median(ends))
        spread = MAD_TO_SD * float(np.median([abs(math.log(end / median)) for end in ends]))
        norms[group] = ProbeNorm(median, spread, len(ends) // 2)
    return norms


def _probe_off(row: Mapping[str, Any], thresholds: Mapping[str, Any]) -> str:
    """Both ends off the like probes' median beyond the tolerance, in the same direction."""
    norm = thresholds.get("_probe_norms", {}).get(probe_group(row))
    before, after = probe_ends(row)
    if norm is None or math.isnan(before) or math.isnan(after):
        return ""
    limit = thresholds["max_probe_deviation"]
    allowed = math.log1p(norm.tolerance(limit))
    logs = [math.log(end / norm.median_s) for end in (before, after)]
    nearest = min(logs, key=abs)
    if min(logs) <= allowed and max(logs) >= -allowed:
        return ""
    how = f"{math.expm1(abs(nearest)):.0%} {'slower' if nearest > 0 else 'faster'}"
    why = (
        f"{PROBE_SPREAD_MULTIPLIER:g} × their spread {norm.spread:.0%}"
        if norm.tolerance(limit) > limit
        else "max_probe_deviation"
    )
    return (
        f"the node ran {how} than in the run's like trials at both ends of its window "
        f"(machine-speed probe {before * 1e3:.1f} and {after * 1e3:.1f} ms against their median "
        f"{norm.median_s * 1e3:.1f} ms, > {norm.tolerance(limit):.0%} off: {why})"
    )


def counted_in_speedups(runs: pd.DataFrame, keep_perturbed: bool) -> pd.Series:
    """Which rows a speedup may use: all but the perturbed, unless ``keep_perturbed``."""
    if keep_perturbed or "perturbed" not in runs.columns:
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
    for prefix, kind in REASON_KINDS.items():
        if reason.startswith(prefix):
            return kind
    return "other processes on its GPU" if "on its GPU" in reason else reason


def reason_kinds(reason: Any) -> list[str]:
    """The rules a ``perturbed_reason`` names, each once, in its order."""
    parts = reason.split("; ") if isinstance(reason, str) and reason else []
    return list(dict.fromkeys(_reason_kind(part) for part in parts))


def mostly_perturbed(runs: pd.DataFrame) -> str:
    """One sentence for the top of the report where most judged trials were perturbed, naming
    the rules that flagged them, else ''."""
    if "perturbed" not in runs.columns:
        return ""
    judged = runs[runs["perturbed"].notna()]
    count = int(judged["perturbed"].astype(bool).sum()) if len(judged) else 0
    if not len(judged) or count <= MOSTLY * len(judged):
        return ""
    counts = perturbed_counts(
        judged["perturbed"].to_numpy(dtype=object),
        judged["perturbed_reason"].to_numpy(dtype=object),
    )
    by_rule = [part.rsplit(": ", 1) for part in counts["perturbed_reasons"].split("; ") if part]
    named = ", ".join(
        f"{n} by {kind} ({KIND_MEANINGS.get(kind, 'see the Method')})" for kind, n in by_rule
    )
    return (
        f"Most trials of this run were perturbed: {count} of {len(judged)} judged trials, "
        f"{named} (see Perturbed trials, and the Method for each rule). Its throughputs and "
        "speedups rest on the trials left."
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
# Each rule's reason begins with its prefix; the kind names the rule in counts and the report.
REASON_KINDS = {
    "other processes took": "other processes",
    "other processes left": "other processes",
    "CPU clock": "CPU clock",
    "GPU SM clock": "GPU SM clock",
    "GPU throttled": "GPU throttled",
    "GradScaler skipped": "GradScaler",
    "the hypervisor took": "steal",
    "the node ran": "machine-speed probe",
}
KIND_MEANINGS = {
    "other processes": "other processes used their CPUs",
    "CPU clock": "their CPU clock was held down",
    "GPU SM clock": "their GPU clock was held down",
    "GPU throttled": "their GPU throttled",
    "other processes on its GPU": "other processes used their GPU",
    "GradScaler": "GradScaler skipped optimizer steps in their window",
    "steal": "the hypervisor gave their CPUs to other guests",
    "machine-speed probe": "their machine-speed probe was off its like probes' median",
}
