"""Cell records in, four tidy tables out: runs, steps, summary and speedups.

The entry point of aggregation (workflow/scripts/aggregate.py, the workflow's aggregate rule):

* :func:`load_tables` reads record files into the *runs* frame, one row per file, and the
  *steps* frame, one row per measured step of an ``ok`` record. A file that cannot be read as a
  record becomes a row with status ``unreadable``, and a listed path with no file a row with
  status ``missing``, instead of an exception: one bad file never hides the rest of a run, and
  the report can name what is absent (:mod:`ptspeed.analysis.records`). Train-mode trials then
  get the late numerics check (:mod:`ptspeed.analysis.late_numerics`): a late loss that strays
  from the same environment's eager cell makes the trial ``numerics_mismatch``, as does a
  failed numerics gate in the cell's first trial for its later trials
  (:mod:`ptspeed.analysis.first_trial_gate`). Where the path
  follows the workflow's layout (``records/<env>/<model>/<variant>/<mode>/<size>/trial<N>.json``)
  such rows carry the cell.
* :func:`ptspeed.analysis.summary.summary_table` groups the runs by cell (environment, model,
  variant, mode, sizes) and gives trial counts, the median throughput of the ``ok`` trials with
  its confidence interval, and a noise flag with its reason.
* :func:`ptspeed.analysis.speedups.speedups` pairs the summary rows each configured comparison
  needs, gives each speedup (the Hodges–Lehmann ratio of the ok trials) its exact interval with
  the confidence it achieves and a p-value (:func:`ptspeed.analysis.ranks.speedup`), and judges
  the published figures of ``config/claims.yaml`` (:mod:`ptspeed.analysis.claims`).

This module owns the readers of aggregation's inputs (:func:`load_tables`, :func:`read_mapping`,
:func:`records_listed_in`); the tables' columns and :func:`ptspeed.analysis.columns.read_table`
are :mod:`ptspeed.analysis.columns`. Nothing here imports torch.
"""

from __future__ import annotations

from collections.abc import Iterable
from pathlib import Path
from typing import Any

import pandas as pd
import yaml

from ptspeed.analysis.columns import CELL_KEYS, RUNS_COLUMNS, STEPS_COLUMNS, typed_runs, typed_steps
from ptspeed.analysis.conditions import judge_runs
from ptspeed.analysis.energy import JOULES_PER_SAMPLE, joules_per_sample
from ptspeed.analysis.first_trial_gate import share_first_trial_gate
from ptspeed.analysis.late_numerics import check_late_losses
from ptspeed.analysis.records import read_row, step_rows
from ptspeed.analysis.reruns import rerun_columns
from ptspeed.plan.schema import settings_from
from ptspeed.plan.settings import Settings


def load_tables(
    paths: Iterable[str | Path], settings: Settings | None = None
) -> tuple[pd.DataFrame, pd.DataFrame]:
    """The runs frame (:data:`RUNS_COLUMNS`, one row per path, in the order given) and the steps
    frame (:data:`STEPS_COLUMNS`, one row per measured step of each ``ok`` record).

    Train-mode trials then get the late numerics check against their environment's eager cell
    (:func:`ptspeed.analysis.late_numerics.check_late_losses`): a trial that fails it becomes
    ``numerics_mismatch`` and its steps leave the steps frame, as do the later trials of a cell
    whose first trial failed its numerics gate
    (:func:`ptspeed.analysis.first_trial_gate.share_first_trial_gate`). Every ok trial is then
    judged quiet or perturbed from its recorded conditions with the ``settings``' thresholds
    (:func:`ptspeed.analysis.conditions.judge_runs`).

    A path with no file gives a row with status ``missing``; a file that cannot be opened, is not
    JSON, or is not a record gives a row with status ``unreadable``; both reasons name the path.
    With ``settings`` (the effective config's), a record of another cell than the config asks for
    at its path (:func:`ptspeed.analysis.staleness.stale_reason`) gives a row with status ``stale``.
    """
    rows, steps = [], []
    for path in map(Path, paths):
        row, step_times = read_row(path, settings)
        rows.append(row)
        if row["status"] == "ok":
            steps.extend(step_rows(row, step_times))
    runs = typed_runs(pd.DataFrame(rows, columns=RUNS_COLUMNS))
    runs[JOULES_PER_SAMPLE] = joules_per_sample(runs)
    read_ok = runs["status"] == "ok"
    runs = check_late_losses(share_first_trial_gate(runs))
    runs = rerun_columns(judge_runs(runs, settings), settings)
    steps = typed_steps(pd.DataFrame(steps, columns=STEPS_COLUMNS))
    return runs, _steps_of_ok_trials(steps, runs[read_ok & (runs["status"] != "ok")])


def _steps_of_ok_trials(steps: pd.DataFrame, failed: pd.DataFrame) -> pd.DataFrame:
    """The steps of trials still ok after the numerics checks of aggregation (``failed``: the
    trials read ok that they turned ``numerics_mismatch``)."""
    if failed.empty or steps.empty:
        return steps
    keys = [*CELL_KEYS, "trial"]
    dropped = set(failed[keys].itertuples(index=False, name=None))
    kept = [key not in dropped for key in steps[keys].itertuples(index=False, name=None)]
    return steps[kept].reset_index(drop=True)


def load_records(paths: Iterable[str | Path]) -> pd.DataFrame:
    """The runs frame of :func:`load_tables`."""
    return load_tables(paths)[0]


def read_mapping(path: str | Path) -> dict[str, Any]:
    """A YAML (or JSON) file whose top level is a mapping; an empty file is ``{}``."""
    try:
        data = yaml.safe_load(Path(path).read_text(encoding="utf-8"))
    except yaml.YAMLError as error:
        raise ValueError(f"{path}: not YAML or JSON ({error})") from error
    if data is None:
        return {}
    if not isinstance(data, dict):
        raise ValueError(f"{path}: top level is not a mapping")
    return data


def read_settings(path: str | Path) -> Settings:
    """The settings of an effective config file (``results/config.json``), the schema's
    defaults filling what an older one lacks; :class:`ValueError` naming the file for a mapping
    that is not a ptspeed config."""
    try:
        return settings_from(read_mapping(path))
    except (KeyError, TypeError, AttributeError) as error:
        raise ValueError(
            f"{path}: not a ptspeed config ({type(error).__name__}: {error})"
        ) from None


def records_listed_in(path: str | Path) -> list[str]:
    """The record paths in a list file, one per line (blank lines and ``#`` comments skipped)."""
    lines = Path(path).read_text(encoding="utf-8").splitlines()
    return [line.strip() for line in lines if line.strip() and not line.lstrip().startswith("#")]
