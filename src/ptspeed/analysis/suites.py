"""Suite figures: what PyTorch's dynamo dashboard gives per suite, per comparison and platform.

A suite is a set of models of the config (``models.<name>.suite``, which
:mod:`ptspeed.plan.suites` sets for each member). For each suite, comparison and platform:

- **pass rate**: the models whose both sides ran ok (an ok record ran and passed the numerics
  gate) over the suite's models;
- **geometric-mean speedup** of the passing models' speedups (each the Hodges–Lehmann ratio of
  the speedups table), with an interval from a percentile bootstrap over the models (seeded:
  the same table gives the same interval). It says how much the figure depends on which models
  the suite holds, not how noisy each model's trials were (their own intervals say that);
- **median compile time** of the candidate's cells (the summary's ``compile_time_s``: its
  first step beyond eager's);
- **memory ratio**: the geometric mean over models of candidate / baseline peak memory (below
  1: the candidate needs less);
- **failures** by reason: every record of the suite's cells in the comparison that is not ok,
  counted by status and reason, the reason's numbers left out.

Pure; no torch.
"""

from __future__ import annotations

import math
import random
import re
from collections import Counter
from collections.abc import Mapping, Sequence
from typing import Any

import pandas as pd

from ptspeed.analysis.columns import CONFIDENCE, SIZE_KEYS
from ptspeed.analysis.stats import quantile
from ptspeed.plan.settings import Settings

BOOTSTRAP_RESAMPLES = 2000
BOOTSTRAP_SEED = 0
SHOWN_REASON_CHARS = 160
# The numbers of a reason (a loss, an error, a step), which differ from model to model: a
# reason is grouped with the numbers left out ("loss differs from eager fp64 by N").
NUMBER = re.compile(r"(?<![\w.])[-+]?\d+(?:\.\d+)?(?:e[-+]?\d+)?")
SUITE_COLUMNS = [
    "suite",
    "comparison",
    "title",
    "platform",
    "mode",
    "models",
    "passed",
    "pass_rate",
    "geomean_speedup",
    "geomean_low",
    "geomean_high",
    "median_compile_time_s",
    "memory_ratio",
    "failures",
]


def suite_members(settings: Settings) -> dict[str, list[str]]:
    """Each suite's models, in the config's order."""
    suites: dict[str, list[str]] = {}
    for model, entry in settings.models.items():
        if entry.suite:
            suites.setdefault(entry.suite, []).append(model)
    return suites


def suite_figures(
    speedups: pd.DataFrame,
    summary: pd.DataFrame,
    runs: pd.DataFrame,
    settings: Settings,
) -> pd.DataFrame:
    """One row per suite, comparison, platform and mode, columns :data:`SUITE_COLUMNS`."""
    rows = []
    for suite, members in suite_members(settings).items():
        chosen = speedups[speedups["model"].isin(members)]
        for keys, group in chosen.groupby(
            ["comparison", "platform", "mode"], sort=False, dropna=False
        ):
            rows.append(_suite_row(suite, members, keys, group, summary, runs))
    return pd.DataFrame(rows, columns=SUITE_COLUMNS)


def _suite_row(
    suite: str,
    members: Sequence[str],
    keys: tuple[Any, ...],
    group: pd.DataFrame,
    summary: pd.DataFrame,
    runs: pd.DataFrame,
) -> dict[str, Any]:
    comparison, platform, mode = keys
    first = group.iloc[0]
    sides = {
        side: (first[f"{side}_env"], first[f"{side}_variant"]) for side in ("baseline", "candidate")
    }
    passing = group[group["speedup"].map(_positive)]
    low, high = geomean_interval(passing["speedup"].tolist())
    return {
        "suite": suite,
        "comparison": comparison,
        "title": first["title"],
        "platform": platform,
        "mode": mode,
        "models": len(members),
        "passed": len(passing),
        "pass_rate": len(passing) / len(members),
        "geomean_speedup": geomean(passing["speedup"].tolist()),
        "geomean_low": low,
        "geomean_high": high,
        "median_compile_time_s": _median_compile_time(summary, group, sides["candidate"]),
        "memory_ratio": _memory_ratio(summary, group, sides),
        "failures": _failures(runs, members, platform, mode, sides.values()),
    }


def geomean(values: Sequence[float]) -> float:
    """exp(mean(log values)); NaN for none."""
    if not values:
        return math.nan
    return math.exp(sum(math.log(v) for v in values) / len(values))


def geomean_interval(
    values: Sequence[float],
    confidence: float = CONFIDENCE,
    resamples: int = BOOTSTRAP_RESAMPLES,
    seed: int = BOOTSTRAP_SEED,
) -> tuple[float, float]:
    """The percentile bootstrap interval of the geometric mean of ``values`` (resampling the
    values with replacement, ``resamples`` times, from a seeded generator); NaN, NaN with
    fewer than two values."""
    if len(values) < 2:
        return math.nan, math.nan
    logs = [math.log(v) for v in values]
    draw = random.Random(seed)
    means = [sum(draw.choices(logs, k=len(logs))) / len(logs) for _ in range(resamples)]
    tail = (1 - confidence) / 2
    return math.exp(quantile(means, tail)), math.exp(quantile(means, 1 - tail))


def _blank(value: Any) -> bool:
    return value is None or value == "" or (isinstance(value, float) and math.isnan(value))


def _positive(value: Any) -> bool:
    return isinstance(value, (int, float)) and math.isfinite(value) and value > 0


def _cells(summary: pd.DataFrame, group: pd.DataFrame, side: tuple[str, str]) -> pd.DataFrame:
    """The summary rows of ``side`` (env, variant) at the sizes and models of ``group``."""
    keys = ["platform", "model", "mode", *SIZE_KEYS]
    wanted = group[keys].assign(env=side[0], variant=side[1])
    return summary.merge(wanted, on=[*keys, "env", "variant"], how="inner")


def _median_compile_time(
    summary: pd.DataFrame, group: pd.DataFrame, candidate: tuple[str, str]
) -> float:
    times = _cells(summary, group, candidate)["compile_time_s"].dropna()
    return float(times.median()) if len(times) else math.nan


def _memory_ratio(
    summary: pd.DataFrame, group: pd.DataFrame, sides: Mapping[str, tuple[str, str]]
) -> float:
    memory = "median_peak_memory_bytes"
    base = _cells(summary, group, sides["baseline"]).set_index("model")[memory]
    cand = _cells(summary, group, sides["candidate"]).set_index("model")[memory]
    ratios = (cand / base).dropna()
    return geomean([r for r in ratios if _positive(r)])


def _failures(
    runs: pd.DataFrame,
    members: Sequence[str],
    platform: Any,
    mode: Any,
    sides: Any,
) -> str:
    """``3× unsupported: reason; 1× failed: reason``, most frequent first; '' for none."""
    pairs = set(sides)
    mine = runs[runs["model"].isin(members) & (runs["mode"] == mode) & (runs["status"] != "ok")]
    if "platform" in runs.columns:
        place = mine["platform"]
        mine = mine[place.isna() | (place == "") if _blank(platform) else place == platform]
    counts: Counter[str] = Counter()
    for row in mine.itertuples():
        if (row.env, row.variant) in pairs:
            reason = str(row.reason if isinstance(row.reason, str) else "")
            reason = NUMBER.sub("N", reason.replace(f"model {row.model}: ", ""))
            counts[f"{row.status}: {reason[:SHOWN_REASON_CHARS]}"] += 1
    return "; ".join(f"{n}× {what}" for what, n in counts.most_common())
