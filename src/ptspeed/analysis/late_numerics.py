"""The late numerics check: each train-mode variant's late loss against eager's, in aggregation.

A cell checks its variant against eager only over its leading steps (``numerics_steps``); a
variant that goes wrong later (a recompilation mid-run, a graph replayed with stale inputs)
would pass. Running a second reference per cell would double its cost, but the eager cell of
the same environment, model, mode, sizes and seed already ran the same seeded trajectory: same
weights, same batches, same optimizer. So aggregation holds each variant's
``metrics.late_loss`` against the median ``late_loss`` of that eager cell's ok trials. It is
the loss of step ``late_loss_step``, eager's last (the configured warm-up and measured steps):
a variant whose warm-up ran longer (TorchScript's profiling runs, a CUDA graph's capture, a
recompilation) recorded it inside its measured window, so both losses follow as many updates.

* relative error ``|late_loss - reference| / |reference|`` within the allowed error:
  ``late_check`` is ``passed``. The allowed error is the largest of the variant's precision's
  :data:`LATE_TOLERANCES`, :data:`EAGER_SPREAD_MULTIPLIER` times the eager trials' own
  spread ``(max - min) / median`` of their late losses (0 where eager is deterministic, as on
  the CPU; on a GPU nondeterministic kernels make it the measure of how far a correct
  trajectory wanders), and the loss's bound in the trial's own
  numerics gate (:data:`GATE_LOSS_BOUND`): a variant that draws its own random numbers (a
  compiled graph's dropout) follows other dropout masks than eager, a spread its gate measured
  at one step (3 x the loss's change when dropout is reseeded) and the late check allows too
  (torch 2.0's compiled bert-base, CPU default size: gate bound 3.8 %, last loss 2.8 % from
  eager's after 13 steps);
* beyond it, or a recorded loss that is not finite (NaN or infinite, in any cell, eager
  included): the trial's status becomes ``numerics_mismatch`` with the reason, so that it
  leaves the medians and speedups as a fast wrong answer must, and the report lists it among
  the failures;
* no ok eager trial to compare with, no recorded loss, or a precision without a tolerance:
  ``late_check`` says ``not checked: <why>`` and the trial stays ok.

A model with batch norm is ``not checked`` (its non-finite losses excepted), with the
reason: its trajectory is chaotic (:data:`BATCH_NORM_DRIFT`): a bound that no correct variant
exceeds would be too wide to catch a 10 % error. The cell's own check of a step after the
measured window, from the variant's own state, covers its first trial. A pipeline of several
micro-batches over such a model follows another trajectory by design too (each micro-batch
normalised with its own statistics, as GPipe does), and says so. Eager trials are the
reference themselves (``late_check`` is ``reference``). Infer-mode and non-ok trials are not
checked (``late_check`` blank).

The bounds come from measured spreads, not guesses: see :data:`LATE_TOLERANCES`.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from typing import Any

import pandas as pd

from ptspeed.cell.variants.knobs import parse_knobs
from ptspeed.errors import BadInput
from ptspeed.models import REGISTRY

NUMERICS_MISMATCH = "numerics_mismatch"
REFERENCE_KNOBS = "eager"
# The same trajectory, compared at the same step.
MATCH_KEYS = [
    "env",
    "model",
    "mode",
    "batch_size",
    "image_size",
    "seq_len",
    "seed",
    "late_loss_step",
    "measured_steps",
]
LATE_COLUMNS = ["late_reference_loss", "late_loss_error", "late_allowed_error", "late_check"]
# The runs column of the loss's bound in the trial's own numerics gate.
GATE_LOSS_BOUND = "numerics_allowed_loss_error"

LATE_TOLERANCES: Mapping[str, float] = {"fp32": 0.02, "tf32": 0.04, "bf16": 0.04, "fp16": 0.04}
"""Relative error of a variant's last loss against eager's that a correct variant stays within,
by the variant's precision; each is below the ``late`` fault's 10 % with room for the drift.

Measured on the CPU (torch 2.14.1, default CPU sizes, 3 warm-up + 10 measured steps, so 13
SGD steps on one seeded batch; seeds 0-2 for mlp at batch 32, seed 0 for the others): correct
fp32 variants' ``loss_last`` differed from eager's by 0 (mlp compile, 3 seeds), 0.31 %
(resnet50 compile) and 0.48 % (bert-base compile, whose dropout masks come from the compiled
graph's own random numbers); bf16 autocast by at most 7.8e-5 (mlp, 3 seeds) and 0.29 %
(bert-base; that cell ran with 1 thread, its eager with 2). fp32's 2 % is 4x the largest fp32
drift of a well-conditioned trajectory, bf16's 4 % 14x the largest bf16 one, and both leave
the 10 % fault at least 6 % away. tf32 and fp16 (CUDA only; fp16 with a GradScaler that may
skip early steps) could not be measured here and take bf16's bound.
"""

BATCH_NORM_DRIFT = (
    "batch norm makes the training trajectory chaotic (correct variants of ResNet-50 ended up "
    "to 53 % from eager); the cell's own check of a step after its measured window covers it"
)
"""Why a model with batch norm is not checked: how far correct variants ended from eager.

Measured on the CPU (torch 2.14.1, ResNet-50 at 64 px, 3 warm-up + 10 measured steps on one
repeated batch, seeds 0-2): channels_last (fp32) and bf16 autocast ended up to 53 % (batch 2),
32 % (batch 4) and 14 % (batch 8) from eager, while eager fp32 itself is 1.4 % (batch 8) to
3 % (batch 2) from fp64 after one step: batch norm over a handful of values (8 x 2 x 2 in the
last stage at batch 8) lets rounding differences grow step by step, and at batch 2 the loss
falls to about 0.02, where a relative error means little.
"""

EAGER_SPREAD_MULTIPLIER = 3.0
"""The allowed error is at least this times the eager trials' own relative spread of last
losses, as the cell's numerics check allows 3 x eager's spread."""

PASSED = "passed"
REFERENCE = "reference"
MISMATCH = "mismatch"
NOT_CHECKED = "not checked"


def recorded_late_check(loss: Any) -> str:
    """``late_check`` as far as the record alone tells: a mismatch for a non-finite loss, else
    ``""`` (to be decided against eager by :func:`check_late_losses`)."""
    shown = non_finite_loss(loss)
    return f"{MISMATCH}: a loss is not finite ({shown})" if shown else ""


def non_finite_loss(value: Any) -> str:
    """The recorded form of a non-finite loss (``"nan"``, ``"inf"``…), else ``""``: a float
    NaN or infinity (JSON ``NaN``/``Infinity``) or a text naming one. ``None`` (not recorded)
    is not a non-finite loss."""
    if isinstance(value, bool) or value is None:
        return ""
    if isinstance(value, (int, float)):
        return "" if math.isfinite(value) else str(float(value))
    if isinstance(value, str):
        try:
            number = float(value)
        except ValueError:
            return ""
        return "" if math.isfinite(number) else value
    return ""


def precision_of(recorded: Any, knobs: Any, device_class: str) -> str:
    """The precision a run computed in: as its numerics check recorded it, else from its knobs
    (eager fp32 is not checked, being the reference itself)."""
    if isinstance(recorded, str) and recorded:
        return recorded
    try:
        return parse_knobs(str(knobs)).precision(device_class)
    except BadInput:
        return "unknown"


def check_late_losses(runs: pd.DataFrame) -> pd.DataFrame:
    """``runs`` with :data:`LATE_COLUMNS` filled and late mismatches turned into
    ``numerics_mismatch`` trials (reason given). ``late_check`` may already hold a
    non-finite loss found while reading the record (:func:`non_finite_loss`)."""
    runs = runs.copy()
    for column in LATE_COLUMNS[:-1]:
        runs[column] = math.nan
    if "late_check" not in runs.columns:
        runs["late_check"] = ""
    train_ok = (runs["status"] == "ok") & (runs["mode"] == "train")
    recorded = runs["late_check"].astype(object)
    runs["late_check"] = recorded.where(train_ok & recorded.notna(), "")
    references = _reference_losses(runs[train_ok])
    rows = runs.loc[train_ok, _INPUTS].to_dict("records")
    outcomes = [_late_outcome(row, references.get(_key(row))) for row in rows]
    updates = pd.DataFrame(outcomes, index=runs.index[train_ok])
    for column in updates.columns:
        given = updates[column].notna()
        runs.loc[updates.index[given], column] = updates.loc[given, column]
    return runs


_INPUTS = [
    *MATCH_KEYS,
    "status",
    "reason",
    "knobs",
    "late_loss",
    "late_check",
    "numerics_precision",
    GATE_LOSS_BOUND,
    "device_index",
]


def _reference_losses(train_ok: pd.DataFrame) -> dict[tuple[Any, ...], tuple[float, float]]:
    """Per place (:data:`MATCH_KEYS`): the median late loss of its eager trials and their
    relative spread ``(max - min) / |median|`` (0 for one trial)."""
    eager = train_ok[(train_ok["knobs"] == REFERENCE_KNOBS) & train_ok["late_loss"].notna()]
    eager = eager[~eager["late_check"].fillna("").astype(str).str.startswith(MISMATCH)]
    grouped = eager.groupby(MATCH_KEYS, dropna=False)["late_loss"]
    references = {}
    for key, (median, low, high) in grouped.agg(["median", "min", "max"]).iterrows():
        spread = (high - low) / abs(median) if median else 0.0
        references[_plain_key(key)] = (float(median), float(spread))
    return references


def _key(row: Mapping[str, Any]) -> tuple[Any, ...]:
    return _plain_key(tuple(row[key] for key in MATCH_KEYS))


def _plain_key(key: tuple[Any, ...]) -> tuple[Any, ...]:
    return tuple(None if pd.isna(v) else v for v in key)


def allowed_error(precision: str, eager_spread: float, gate_bound: float = 0.0) -> float:
    """The bound of a variant's late-loss error (see the module's docstring).

    Raises:
        ValueError: for a precision without a tolerance.
    """
    if precision not in LATE_TOLERANCES:
        known = ", ".join(LATE_TOLERANCES)
        raise ValueError(f"no late tolerance for precision {precision!r} (known: {known})")
    return max(LATE_TOLERANCES[precision], EAGER_SPREAD_MULTIPLIER * eager_spread, gate_bound)


def _late_outcome(row: Mapping[str, Any], eager: tuple[float, float] | None) -> dict[str, Any]:
    recorded = str(row["late_check"] or "")
    if recorded.startswith(MISMATCH):  # a non-finite loss, found while reading the record
        why = recorded.removeprefix(f"{MISMATCH}: ")
        return _mismatch(row, recorded, f"late numerics check: {why}")
    reference, eager_spread = eager if eager is not None else (None, 0.0)
    if row["knobs"] == REFERENCE_KNOBS:
        return {"late_check": REFERENCE, "late_reference_loss": reference}
    if why := _batch_norm(row):
        return {"late_check": f"{NOT_CHECKED}: {why}"}
    if reference is None:
        return {"late_check": f"{NOT_CHECKED}: no ok eager trial of this environment, model, "
                "sizes, seed and step count"}  # fmt: skip
    loss = row["late_loss"]
    if pd.isna(loss):
        return {"late_check": f"{NOT_CHECKED}: no late loss recorded"}
    device_class = "cpu" if pd.isna(row["device_index"]) else "cuda"
    precision = precision_of(row["numerics_precision"], row["knobs"], device_class)
    if precision not in LATE_TOLERANCES:
        return {"late_check": f"{NOT_CHECKED}: no late tolerance for precision {precision}"}
    gate_bound = row[GATE_LOSS_BOUND]
    gate_bound = 0.0 if pd.isna(gate_bound) else float(gate_bound)
    allowed = allowed_error(precision, eager_spread, gate_bound)
    error = abs(loss - reference) / abs(reference) if reference else abs(loss)
    outcome = {
        "late_reference_loss": reference,
        "late_loss_error": error,
        "late_allowed_error": allowed,
        "late_check": PASSED,
    }
    if error <= allowed:
        return outcome
    why = (
        f"late numerics check: {_which_loss(row['late_loss_step'])} {loss:.6g} is {error:.2%} "
        f"from the eager cell's {reference:.6g} (allowed {allowed:.1%} at {precision})"
    )
    return {**outcome, **_mismatch(row, MISMATCH, why)}


def _which_loss(step: Any) -> str:
    return "the late loss" if pd.isna(step) else f"step {int(step)}'s loss"


def _batch_norm(row: Mapping[str, Any]) -> str:
    """Why a model with batch norm is not checked ('' for one without)."""
    entry = REGISTRY.get(str(row["model"]))
    if entry is None or not entry.batch_norm:
        return ""
    try:
        chunks = parse_knobs(str(row["knobs"])).chunks
    except BadInput:
        chunks = 1
    if chunks > 1:
        return f"batch norm over each of {chunks} micro-batches, not over the whole batch"
    return BATCH_NORM_DRIFT


def _mismatch(row: Mapping[str, Any], check: str, why: str) -> dict[str, Any]:
    reason = f"{row['reason']}; {why}" if isinstance(row["reason"], str) and row["reason"] else why
    return {"late_check": check, "status": NUMERICS_MISMATCH, "reason": reason}
