"""Reruns of perturbed trials: which trials the workflow runs again, and what a trial number is.

The workflow runs the configured ``trials`` of every cell (trial numbers ``0 .. trials-1``).
Once they have all run, each ok trial is judged (:mod:`ptspeed.analysis.conditions`); a
perturbed one is run again as a new record beside it, and a rerun judged perturbed again runs
again, up to ``conditions.reruns`` times. Attempt ``a`` of trial ``t`` is trial number
``t + a x trials``: a rerun is an ordinary record of its cell at a path of the usual layout,
the old record stays, and :func:`rerun_columns` tells the two apart in the tables.

One judgement: a trial's verdict is the one that decided its rerun. Round ``a`` is judged
against the run's median trial of rounds ``0 .. a`` (:func:`ptspeed.analysis.conditions.
judge_runs` judges each round so, in the workflow's judgement and in the final tables alike),
so the tables count exactly the trials the reruns left: a quiet attempt of each configured
trial. A rerun perturbed again by a rule that also flagged the attempt it repeats is not run
again (:func:`stopped_reruns`): a rule that flags a trial however often it runs describes the
rule, or a machine that stays so, not a passing load; the report says so once.

Rounds, not trials, wait on each other: the judgement of round ``a`` needs every trial of
rounds ``0 .. a`` (a trial is judged against the run's median trial too), so a round's reruns
start together, baseline and candidate trials alternating by priority as in the first round.
Pure; no torch.
"""

from __future__ import annotations

import dataclasses
from typing import Any

import pandas as pd

from ptspeed.analysis.conditions import reason_kinds
from ptspeed.plan.layout import Cell
from ptspeed.plan.settings import Settings

RERUN_COLUMNS = ["rerun_of", "attempt"]


def trial_limit(settings: Settings) -> int | None:
    """One past the highest trial number the config can produce, reruns included (None: the
    config names no trials)."""
    if settings.trials is None:
        return None
    return settings.trials * (1 + settings.conditions.reruns)


def attempt_of(trial: int, trials: int) -> int:
    """0 for a configured trial, ``a`` for its ``a``-th rerun."""
    return trial // trials


def reruns_due(runs: pd.DataFrame, settings: Settings, attempt: int) -> list[Cell]:
    """The cells of the next round: a rerun of every trial of round ``attempt`` that ``runs``
    (judged, :func:`ptspeed.analysis.conditions.judge_runs`) marks perturbed, while the
    config's reruns last, but for those whose every rule flagged the attempt they repeat too
    (:func:`stopped_reruns`)."""
    trials = settings.trials
    if trials is None or attempt >= settings.conditions.reruns:
        return []
    stopped = {(key, trial) for key, trial, _ in stopped_reruns(runs, settings)}
    due = []
    for cell, trial, kinds in _perturbed_trials(runs, trials):
        if attempt_of(trial, trials) == attempt and kinds and (cell.key, trial) not in stopped:
            due.append(dataclasses.replace(cell, trial=cell.trial + trials))
    return due


def stopped_reruns(
    runs: pd.DataFrame, settings: Settings | None
) -> list[tuple[str, int, list[str]]]:
    """The reruns perturbed again by the same rule: (cell key, trial number, the rules that
    flagged both it and the attempt it repeats), for each rerun all of whose rules did."""
    trials = settings.trials if settings is not None else None
    if trials is None or "record_path" not in runs.columns:
        return []
    flagged = {(cell.key, trial): kinds for cell, trial, kinds in _perturbed_trials(runs, trials)}
    stopped = []
    for (key, trial), kinds in flagged.items():
        earlier = flagged.get((key, trial - trials), []) if trial >= trials else []
        if kinds and earlier and not set(kinds) - set(earlier):
            stopped.append((key, trial, kinds))
    return stopped


def stopped_sentence(runs: pd.DataFrame, settings: Settings | None) -> str:
    """One sentence on the reruns stopped because the same rule flagged them again ('' for
    none): how many, and by which rules."""
    stopped = stopped_reruns(runs, settings)
    if not stopped:
        return ""
    counts: dict[str, int] = {}
    for _, _, kinds in stopped:
        for kind in kinds:
            counts[kind] = counts.get(kind, 0) + 1
    rules = ", ".join(f"{kind}: {n}" for kind, n in counts.items())
    return (
        f"{len(stopped)} rerun{'s were' if len(stopped) != 1 else ' was'} perturbed again by the "
        f"rule that flagged the trial {'they' if len(stopped) != 1 else 'it'} repeated ({rules}) "
        "and not run again: a rule that flags a trial however often it runs describes the rule "
        "(or a machine that stays so), not a passing load; those trials are not counted."
    )


def _perturbed_trials(runs: pd.DataFrame, trials: int) -> list[tuple[Cell, int, list[str]]]:
    """Each judged ok trial of a known cell: (its cell, its trial number, the rules that
    flagged it: [] where quiet)."""
    found = []
    reasons = runs["perturbed_reason"] if "perturbed_reason" in runs.columns else [""] * len(runs)
    columns = zip(runs["record_path"], runs["trial"], runs["perturbed"], reasons, strict=True)
    for path, trial, perturbed, reason in columns:
        cell = Cell.from_path(str(path))
        if cell is None or pd.isna(perturbed) or pd.isna(trial):
            continue
        flagged = perturbed is True or str(perturbed).lower() == "true"
        found.append((cell, int(trial), reason_kinds(reason) if flagged else []))
    return found


def rerun_columns(runs: pd.DataFrame, settings: Settings | None) -> pd.DataFrame:
    """``runs`` with ``attempt`` (0: a configured trial) and ``rerun_of`` (the configured trial
    a rerun repeats; blank for the configured trials themselves; without settings or their
    trials, every trial a configured one)."""
    runs = runs.copy()
    numbers = pd.to_numeric(runs["trial"], errors="coerce").astype("Int64")
    trials = settings.trials if settings is not None else None
    if trials is None:
        runs["attempt"] = pd.array([0 if pd.notna(n) else pd.NA for n in numbers], "Int64")
        runs["rerun_of"] = pd.array([pd.NA] * len(runs), "Int64")
        return runs
    runs["attempt"] = numbers // trials
    runs["rerun_of"] = (numbers % trials).where(runs["attempt"] > 0)
    return runs


def rerun_count(attempts: Any) -> int:
    """How many of a cell's records are reruns, from their ``attempt`` values."""
    return int(sum(1 for a in attempts if pd.notna(a) and int(a) > 0))
