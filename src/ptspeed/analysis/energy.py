"""Energy per sample: each ok trial's window energy (``energy_j``: NVML's counter on CUDA,
summed over ranks; RAPL on the CPU) over the samples its window processed, summarised like
throughput (the median with its distribution-free interval), and compared like it (the
Hodges–Lehmann ratio candidate / baseline with its exact interval: below 1, the candidate
spends less energy per sample). Pure; no torch.
"""

from __future__ import annotations

import math
from collections.abc import Iterable
from typing import Any

import numpy as np
import pandas as pd

from ptspeed.analysis import ranks, stats

JOULES_PER_SAMPLE = "joules_per_sample"
SUMMARY_ENERGY_COLUMNS = [
    "median_joules_per_sample",
    "joules_low",
    "joules_high",
    "energy_not_measured",
]
SPEEDUP_ENERGY_COLUMNS = ["energy_ratio", "energy_ratio_low", "energy_ratio_high"]


def joules_per_sample(runs: pd.DataFrame) -> pd.Series:
    """Each trial's window energy over its samples (throughput x measured wall time); NaN
    where energy was not measured."""
    samples = runs["throughput_samples_per_s"] * runs["measured_wall_s"]
    energy = pd.to_numeric(runs["energy_j"], errors="coerce")
    return (energy / samples.where(samples > 0)).astype(float)


def summarise(values: Iterable[Any], why_not: Iterable[Any], confidence: float) -> dict[str, Any]:
    """The summary columns of one cell's ok trials' joules per sample (and, where none was
    measured, the distinct reasons)."""
    measured = [float(v) for v in values if v is not None and not pd.isna(v) and v > 0]
    if not measured:
        reasons = dict.fromkeys(str(r) for r in why_not if isinstance(r, str) and r)
        return {
            "median_joules_per_sample": math.nan,
            "joules_low": math.nan,
            "joules_high": math.nan,
            "energy_not_measured": "; ".join(reasons),
        }
    interval = stats.summarise(measured, confidence)
    return {
        "median_joules_per_sample": interval.median,
        "joules_low": interval.low,
        "joules_high": interval.high,
        "energy_not_measured": "",
    }


def ratio(baseline: list[float], candidate: list[float], confidence: float) -> dict[str, Any]:
    """The energy ratio candidate / baseline per sample, with its interval; NaN unless both
    sides measured energy in every counted trial."""
    if not baseline or not candidate or not all(np.isfinite([*baseline, *candidate])):
        return dict.fromkeys(SPEEDUP_ENERGY_COLUMNS, math.nan)
    columns = ranks.speedup(baseline, candidate, confidence).columns("energy_ratio")
    return {name: columns[name] for name in SPEEDUP_ENERGY_COLUMNS}
