"""A cell's numerics gate, run by its first trial, stands for its later trials.

The trials of a cell run the same seeded computation (same weights, batches and steps), so the
workflow runs the numerics gate (:mod:`ptspeed.cell.reference`: eager fp64 and fp32 steps from
snapshots of the check steps, about half of a warm compiled trial's time on the CPU) in the
cell's first trial only; the later trials and reruns record ``cell.numerics_by_first_trial``
and leave their numerics not checked. Aggregation then gives each such trial its cell's verdict:

* a gate trial (one that ran the gate itself) that failed it makes every ok later trial of the
  cell ``numerics_mismatch``, its reason naming the failed trial, so that no trial of a wrong
  variant enters a median or a speedup;
* the loss's bound and the precision the gate found (:data:`GATE_LOSS_BOUND`,
  ``numerics_precision``) are copied to the later trials, whose late check
  (:mod:`ptspeed.analysis.late_numerics`) allows what the gate allowed, as it does for the
  gate trial itself.

Where no trial of the cell ran the gate (its first trial failed before it), the later trials
keep their numerics not checked and get the late check alone. Pure: no I/O, no torch.
"""

from __future__ import annotations

import pandas as pd

from ptspeed.analysis.columns import CELL_KEYS, FIRST_TRIAL_FLAG
from ptspeed.analysis.late_numerics import GATE_LOSS_BOUND, NUMERICS_MISMATCH

_CELL = [*CELL_KEYS, "seed"]  # a cell's trials: the same place, sizes and seed


def share_first_trial_gate(runs: pd.DataFrame) -> pd.DataFrame:
    """``runs`` with each later trial given its cell's gate verdict, bound and precision."""
    runs = runs.copy()
    later = runs[FIRST_TRIAL_FLAG].fillna(False).astype(bool)
    gates = runs[~later & runs["numerics_passed"].notna()]
    for key, cell_gates in gates.groupby(_CELL, dropna=False):
        in_cell = later & _matches(runs, key)
        if not in_cell.any():
            continue
        _copy_gate_values(runs, in_cell, cell_gates)
        failed = cell_gates[cell_gates["numerics_passed"] == False]  # noqa: E712 (nullable)
        if not failed.empty:
            first = failed.iloc[0]
            why = f"numerics gate failed in trial {first['trial']} of this cell: {first['reason']}"
            turned = in_cell & (runs["status"] == "ok")
            runs.loc[turned, "status"] = NUMERICS_MISMATCH
            runs.loc[turned, "reason"] = why
    return runs


def _matches(runs: pd.DataFrame, key: tuple) -> pd.Series:
    mask = pd.Series(True, index=runs.index)
    for column, value in zip(_CELL, key, strict=True):
        mask &= runs[column].isna() if pd.isna(value) else runs[column] == value
    return mask


def _copy_gate_values(runs: pd.DataFrame, rows: pd.Series, gates: pd.DataFrame) -> None:
    bound = gates[GATE_LOSS_BOUND].max()
    if pd.notna(bound):
        runs.loc[rows & runs[GATE_LOSS_BOUND].isna(), GATE_LOSS_BOUND] = bound
    precisions = gates["numerics_precision"].dropna()
    precisions = precisions[precisions != ""]
    if not precisions.empty:
        empty = runs["numerics_precision"].fillna("") == ""
        runs.loc[rows & empty, "numerics_precision"] = precisions.iloc[0]
