"""A cell's numerics gate, run by its first trial, stands for its later trials.

The trials of a cell run the same seeded computation (same weights, batches and steps), so the
workflow runs the numerics gate (:mod:`ptspeed.cell.measurement.reference`: eager fp64 and fp32
steps from snapshots of the check steps, about half of a warm compiled trial's time on the CPU) in
the cell's first trial only; the later trials and reruns record ``cell.numerics_by_first_trial``
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
    gate = ~later & runs["numerics_passed"].notna()
    failed = gate & (runs["numerics_passed"] == False)  # noqa: E712 (nullable)
    precision = runs["numerics_precision"].astype(object).fillna("")  # all-NaN reads as float
    cell = [runs[key] for key in _CELL]

    def of_cell(values: pd.Series, where: pd.Series, how: str) -> pd.Series:
        """The cell's ``how`` of ``values`` over its rows ``where``, on every row of the cell."""
        return values.where(where).groupby(cell, dropna=False).transform(how)

    bound = of_cell(runs[GATE_LOSS_BOUND], gate, "max")
    runs[GATE_LOSS_BOUND] = runs[GATE_LOSS_BOUND].mask(later & runs[GATE_LOSS_BOUND].isna(), bound)
    gate_precision = of_cell(precision, gate & (precision != ""), "first")
    runs["numerics_precision"] = runs["numerics_precision"].mask(
        later & (precision == "") & gate_precision.notna(), gate_precision
    )
    failed_trial = of_cell(runs["trial"], failed, "first")
    failed_reason = of_cell(runs["reason"], failed, "first")
    turned = later & failed_trial.notna() & (runs["status"] == "ok")
    runs.loc[turned, "status"] = NUMERICS_MISMATCH
    runs.loc[turned, "reason"] = (
        "numerics gate failed in trial "
        + failed_trial[turned].astype(int).astype(str)
        + " of this cell: "
        + failed_reason[turned].astype(str)
    )
    return runs
