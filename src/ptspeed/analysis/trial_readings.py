"""What a trial's runs row says of the conditions it ran under, read for the judgement of
perturbed trials (:mod:`ptspeed.analysis.conditions`) and the comparison of two runs: the
share of its CPUs' time other processes and the hypervisor took over its window, and its
machine-speed probe (:mod:`ptspeed.cell.measurement.probe`) at each end of the window, with
the group of like probes it is compared within. Pure; no torch.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from typing import Any

import numpy as np
import pandas as pd

PROBE_COLUMNS = {
    "cpu": ("probe_cpu_gemm_s", "probe_cpu_memory_s"),
    "cuda": ("probe_gpu_gemm_s",),
}


def other_cpu_share(row: Mapping[str, Any]) -> float:
    """The share of the trial's CPUs' time other processes took over its window (NaN: unknown)."""
    return _share_of_cpus(row, "other_cpu_s")


def steal_share(row: Mapping[str, Any]) -> float:
    """The share of the trial's CPUs' time the hypervisor gave other guests over its window
    (NaN: unknown)."""
    return _share_of_cpus(row, "steal_cpu_s")


def _share_of_cpus(row: Mapping[str, Any], column: str) -> float:
    """The CPU seconds of ``column`` as a share of what the trial's CPUs gave over its window
    (``column / (window_s x affinity_cpus)``, at least 0; NaN: unknown)."""
    seconds, window, cpus = row.get(column), row.get("window_s"), row.get("affinity_cpus")
    if any(blank(v) for v in (seconds, window, cpus)) or not window or not cpus:
        return math.nan
    return max(0.0, float(seconds)) / (float(window) * float(cpus))


def probe_kind(row: Mapping[str, Any]) -> str:
    """'cuda' where the trial probed a GPU, 'cpu' where only the CPU, '' where it did not
    probe."""
    for kind in ("cuda", "cpu"):
        if not blank(row.get(f"{PROBE_COLUMNS[kind][0]}_before")):
            return kind
    return ""


def probe_ends(row: Mapping[str, Any]) -> tuple[float, float]:
    """The trial's machine-speed probe in seconds at each end of its window (before, after;
    lower: a faster machine): the GPU's GEMM on CUDA, the CPU's GEMM and memory pass together
    on the CPU; NaN where it did not probe."""
    kind = probe_kind(row)
    if not kind:
        return math.nan, math.nan
    ends = []
    for end in ("before", "after"):
        values = [row.get(f"{column}_{end}") for column in PROBE_COLUMNS[kind]]
        total = math.nan if any(blank(v) for v in values) else sum(float(v) for v in values)
        ends.append(total if total > 0 else math.nan)
    return ends[0], ends[1]


def probe_s(row: Mapping[str, Any]) -> float:
    """The trial's machine-speed probe in seconds, the mean of its two ends
    (:func:`probe_ends`); NaN where it did not probe."""
    ends = probe_ends(row)
    return math.nan if any(math.isnan(end) for end in ends) else float(np.mean(ends))


def probe_group(row: Mapping[str, Any]) -> tuple[Any, ...]:
    """What a probe is compared within: (platform, device kind, the CPU probe's threads — a
    GPU's probe does not depend on them —, the probe's work as run: its fixed work in the
    trial's environment and build). A probe times the BLAS and copy loops of the build that
    runs it (torch 1.13's GEMM took 3.7 times torch 2.0's on an AMD EPYC VM, issue 36), so
    probes of two environments or builds are never compared."""
    kind = probe_kind(row)
    threads = row.get("probe_threads") if kind == "cpu" else None
    platform = row.get("platform")
    return (
        "" if blank(platform) else str(platform),
        kind,
        None if blank(threads) else int(threads),
        f"{row.get('probe_work') or ''} in {_build(row)}",
    )


def _build(row: Mapping[str, Any]) -> str:
    """The trial's environment and torch (its version names the wheel, and so its BLAS)."""
    env, torch_version = row.get("env"), row.get("torch")
    return f"{'' if blank(env) else env} (torch {'' if blank(torch_version) else torch_version})"


def blank(value: Any) -> bool:
    """Whether a runs row's value is missing (None, NA or NaN)."""
    return value is None or value is pd.NA or (isinstance(value, float) and math.isnan(value))
