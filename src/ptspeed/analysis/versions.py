"""PyTorch 1.13 → 2.0 → today: the same cell's median throughput in each torch version.

Owns :func:`version_table`: the cells (model, variant, mode, sizes) that the summary holds in
environments of at least two torch versions, each environment's median throughput of its ok
trials side by side, oldest torch first, with its ratio to the oldest version measured in that
row; and :func:`torch_versions`, which environment has which torch (from the records). Pure;
no torch.
"""

from __future__ import annotations

import math
import re
from collections import Counter
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import pandas as pd

from ptspeed.analysis.columns import SIZE_KEYS, platform_column

# A platform's cells are set side by side with the same platform's only.
ROW_KEYS = ["platform", "model", "variant", "mode", *SIZE_KEYS]


@dataclass(frozen=True)
class VersionRow:
    """One cell across environments: only those with an ok trial have a rate."""

    cell: Mapping[str, Any]  # ROW_KEYS
    rates: Mapping[str, float]  # env -> median samples/s of its ok trials
    trials: Mapping[str, int]  # env -> ok trials
    ratios: Mapping[str, float]  # env -> its rate / the rate of this row's oldest env


@dataclass(frozen=True)
class VersionTable:
    envs: list[str]  # oldest torch first (ties by name)
    torch: Mapping[str, str]  # env -> torch version
    rows: list[VersionRow]


def torch_versions(runs: pd.DataFrame) -> dict[str, str]:
    """Each environment's torch version: the one most of its ok records state."""
    ok = runs[(runs["status"] == "ok") & runs["torch"].map(_is_text).astype(bool)]
    versions = {}
    for env, group in ok.groupby("env", sort=True):
        versions[str(env)] = Counter(group["torch"]).most_common(1)[0][0]
    return versions


def version_table(summary: pd.DataFrame, torch: Mapping[str, str]) -> VersionTable | None:
    """The cells measured (a median over ok trials) in environments of two or more torch
    versions (``torch``: env -> version, :func:`torch_versions`); None where there are none.
    Rows in the order of model, variant, mode and sizes."""
    summary = summary.assign(platform=platform_column(summary))
    rates = pd.to_numeric(summary["median_samples_per_s"], errors="coerce")
    measured = summary[summary["env"].isin(list(torch)) & rates.notna()]
    order = sorted(torch, key=lambda env: (version_key(torch[env]), env))
    rows = [
        _row(cell, order)
        for _, cell in measured.groupby(ROW_KEYS, sort=True, dropna=False)
        if len({torch[env] for env in cell["env"]}) >= 2
    ]
    if not rows:
        return None
    shown = {env for row in rows for env in row.rates}
    envs = [env for env in order if env in shown]
    return VersionTable(envs, {env: torch[env] for env in envs}, rows)


def _row(cell: pd.DataFrame, order: list[str]) -> VersionRow:
    by_env = {row["env"]: row for row in cell.to_dict("records")}
    envs = [env for env in order if env in by_env]
    rates = {env: float(by_env[env]["median_samples_per_s"]) for env in envs}
    oldest = rates[envs[0]]
    return VersionRow(
        cell={key: by_env[envs[0]][key] for key in ROW_KEYS},
        rates=rates,
        trials={env: int(by_env[env]["ok_trials"]) for env in envs},
        ratios={env: rate / oldest if oldest > 0 else math.nan for env, rate in rates.items()},
    )


def version_key(version: str) -> tuple[int, ...]:
    """``"2.14.1+cpu"`` -> ``(2, 14, 1)``: the release's numbers, local label dropped."""
    return tuple(int(part) for part in re.findall(r"\d+", version.split("+")[0]))


def _is_text(value: Any) -> bool:
    return isinstance(value, str) and bool(value.strip())
