"""Reruns of perturbed trials: which trials the workflow runs again, and what a trial number is.

The workflow runs the configured ``trials`` of every cell (trial numbers ``0 .. trials-1``).
Once they have all run, each ok trial is judged (:mod:`ptspeed.analysis.conditions`); a
perturbed one is run again as a new record beside it, and a rerun judged perturbed again runs
again, up to ``conditions.reruns`` times. Attempt ``a`` of trial ``t`` is trial number
``t + a x trials``: a rerun is an ordinary record of its cell at a path of the usual layout,
the old record stays, and :func:`rerun_columns` tells the two apart in the tables.

Rounds, not trials, wait on each other: the judgement of round ``a`` needs every trial of
rounds ``0 .. a`` (a trial is judged against the run's median trial too), so a round's reruns
start together, baseline and candidate trials alternating by priority as in the first round.
Pure; no torch.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from typing import Any

import pandas as pd

from ptspeed.analysis.conditions import settings
from ptspeed.plan.layout import Cell

RERUN_COLUMNS = ["rerun_of", "attempt"]


def max_reruns(config: Mapping[str, Any] | None) -> int:
    """How many times a perturbed trial may run again (``conditions.reruns``)."""
    return int(settings(config)["reruns"])


def trial_limit(config: Mapping[str, Any]) -> int:
    """One past the highest trial number the config can produce, reruns included."""
    return int(config["trials"]) * (1 + max_reruns(config))


def attempt_of(trial: int, trials: int) -> int:
    """0 for a configured trial, ``a`` for its ``a``-th rerun."""
    return trial // trials


def reruns_due(runs: pd.DataFrame, config: Mapping[str, Any], attempt: int) -> list[Cell]:
    """The cells of the next round: a rerun of every trial of round ``attempt`` that ``runs``
    (judged, :func:`ptspeed.analysis.conditions.judge_runs`) marks perturbed, while the
    config's reruns last."""
    if attempt >= max_reruns(config):
        return []
    trials = int(config["trials"])
    due = []
    for path, trial, perturbed in runs[["record_path", "trial", "perturbed"]].itertuples(
        index=False, name=None
    ):
        cell = Cell.from_path(str(path))
        if cell is None or pd.isna(perturbed) or not perturbed:
            continue
        if attempt_of(int(trial), trials) == attempt:
            due.append(dataclasses.replace(cell, trial=cell.trial + trials))
    return due


def rerun_columns(runs: pd.DataFrame, config: Mapping[str, Any] | None) -> pd.DataFrame:
    """``runs`` with ``attempt`` (0: a configured trial) and ``rerun_of`` (the configured trial
    a rerun repeats; blank for the configured trials themselves)."""
    runs = runs.copy()
    trials = (config or {}).get("trials")
    numbers = pd.to_numeric(runs["trial"], errors="coerce").astype("Int64")
    if not isinstance(trials, int) or trials < 1:
        runs["attempt"] = pd.array([0 if pd.notna(n) else pd.NA for n in numbers], "Int64")
        runs["rerun_of"] = pd.array([pd.NA] * len(runs), "Int64")
        return runs
    runs["attempt"] = numbers // trials
    runs["rerun_of"] = (numbers % trials).where(runs["attempt"] > 0)
    return runs


def rerun_count(attempts: Any) -> int:
    """How many of a cell's records are reruns, from their ``attempt`` values."""
    return int(sum(1 for a in attempts if pd.notna(a) and int(a) > 0))
