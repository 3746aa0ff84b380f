"""Compare two result sets cell by cell, in the manner of ``asv compare``.

Two runs (two machines, before and after a change) each give a ``runs.csv``. Cells are matched
on platform, environment, model, variant, mode and sizes; for each cell present on both sides
the ratio new / old of throughput is given as the report's speedups are
(:func:`ptspeed.analysis.ranks.speedup`: the Hodges–Lehmann ratio, its exact interval with the
confidence it achieves, and the Mann–Whitney p-value), and a mark:

* ``+`` faster, ``-`` slower: by the rule below;
* `` `` (blank) no change called: none measured, one within the minimum effect, one the
  machine's own change explains, one within what two runs of identical code differ by, or too
  few trials to tell;
* ``x`` not comparable: absent from one side, or without ok trials there.

Trials judged perturbed (``perturbed`` in runs.csv) are left out unless kept, as the speedups
leave them out.

**The machine.** Every trial probes the machine's speed just outside its window
(:mod:`ptspeed.cell.measurement.probe`; :func:`ptspeed.analysis.trial_readings.probe_s`). The
probe runs in the cell's environment, so it times that build's BLAS as well as the machine (on one
AMD CPU the GEMM probe took 60–145 ms under torch 1.13 and 19–39 ms under torch 2.0): probes
are compared only with like probes, per :class:`MachineKey` (platform, device kind, CPU
threads, probe work, environment and its torch build), never pooled across environments. Per
key, the machine's ratio ``m [m_low, m_high]`` is the Hodges–Lehmann ratio new / old of the
probes' speeds (1 / probe_s) over the trials the cells count (:func:`machine_changes`); 1 [1, 1]
where either side did not probe alike.

**The rule.** With ``r [r_low, r_high]`` a cell's ratio, ``t`` the minimum effect and ``a`` the
A/A spread (:data:`AA_SPREAD`), the cell's change beyond the machine's is ``c = r / m``, with
an interval whose half-widths (log scale) are those of ``r``, of ``m`` and ``log(1 + a)``
added in quadrature (:func:`corrected`): the trials' noise, the probe's, and the runs' own.

* ``-`` slower: ``c < 1 - t`` and ``c``'s whole interval below 1; ``+`` faster: ``c > 1 + t``
  and its whole interval above 1. So a real regression is called whether the machine got
  faster (``r`` near 1, ``c`` below), slower or stayed the same;
* the machine explains: ``r`` is significant and beyond ``t`` but ``c`` within ``t`` (a
  machine slower by 20 % and every cell with it): no change, the words say so;
* the machine vetoes: a cell significantly slower than before (``r_high < 1``) is never called
  faster, nor one significantly faster (``r_low > 1``) slower. A loaded machine slows its probe
  more than its cells (on the development VM one spinning process per CPU slowed the probe
  x0.48, the mlp cells x0.66), so a cell that lost less than the probe is no evidence of
  faster code, nor one that gained less than it of slower. The price: a regression smaller
  than a machine's gain in the other direction (machine x1.12, code x0.90, cell x1.01) reads
  as such a cell and is not called;
* between runs: trials of one run share what the run fixes (the machine that day, the files
  cached), which the trials' interval cannot see: ``a`` in ``c``'s interval is that spread. A
  change beyond ``t`` whose interval reaches 1 only through it is no change, and the words say
  to repeat the runs;
* never faster or slower where either side's median measured window is shorter than
  ``min_window_s``: windows that short are not judged for load either, and two runs of
  identical code on the development VM once differed by x0.91 [0.89–0.97] in 0.4 s windows
  with the probe unchanged; ``change`` says so and asks for longer windows.

:data:`AA_SPREAD` (5 %) is measured: two runs of identical code on the development VM with 2 s
windows (README's A/A table; tests/test_probe.py, ``PTSPEED_AA=1``) gave cell ratios x0.98,
x0.99 and x1.01 and probe ratios x0.98 and x0.96; the root mean square of their logs is 2.3 %,
so 95 % of such ratios lie within ±1.96 x 2.3 % = ±4.5 %, rounded up to 5 %. It includes the
trials' own noise (a ratio of two medians of 5), so adding it to the trials' interval is
cautious. A machine whose A/A runs differ more (measure it: ``PTSPEED_AA=1``) passes its own
(``aa_spread``, ``--aa-spread``).

The minimum effect ``t`` (``compare.min_effect``, 5 %) is the smallest change worth a mark; by
default it is no smaller than the A/A spread, so an estimate beyond it is beyond what identical
runs showed (a smaller one still needs its interval clear of the A/A spread).
``conditions.max_probe_deviation`` (15 %) is a different test: it drops a single trial
whose probe is far from its run's median, a bound wide enough for the probe's own noise within
an environment; the smaller machine changes it lets through are not taken for code, because
``m`` is measured on the very trials each cell counts and ``c`` divides it out, its interval
widened by ``m``'s. Where the probe is as noisy as on issue 36's AMD VM (torch 1.13's GEMM
probe 60–145 ms within one quiet run), ``m``'s interval is wide (x0.87–1.32 from 16 and 6
trials) and so is ``c``'s: smaller changes go uncalled there, the words saying the probe's
noise is why.

Defaults (:func:`run_defaults`): the minimum effect (``compare.min_effect``), the window
(``conditions.min_window_s``) and ``keep_perturbed`` are the compared run's own, from the
``config.json`` its workflow wrote beside its tables (the new run's, else the old run's),
else the config schema's.

The text (:mod:`ptspeed.render.comparison`) says first, per machine key, each run's probe and
whether the machine changed between the runs (:data:`MACHINE_CHANGE`), then the rule with its
numbers, then the cells. Where both result sets have a
``speedups.csv`` beside their ``runs.csv``, :func:`cross_check_speedups` checks each
comparison's speedup of one run against the other's interval, both ways: two runs of one matrix
on one machine should agree.

The parts: the runs read and the defaults in :mod:`ptspeed.analysis.compare_inputs`
(:func:`~ptspeed.analysis.compare_inputs.run_defaults`); the machine in
:mod:`ptspeed.analysis.machine_change` (:class:`~ptspeed.analysis.machine_change.MachineKey`,
:func:`~ptspeed.analysis.machine_change.machine_changes`,
:data:`~ptspeed.analysis.machine_change.MACHINE_CHANGE`); the rule in
:mod:`ptspeed.analysis.change_verdict` (:data:`~ptspeed.analysis.change_verdict.AA_SPREAD`,
:func:`~ptspeed.analysis.change_verdict.corrected`).
"""

from __future__ import annotations

import math
import statistics
from collections.abc import Mapping
from typing import Any

import pandas as pd

from ptspeed.analysis import ranks
from ptspeed.analysis.change_verdict import (
    AA_SPREAD,
    NOT_COMPARABLE,
    SLOWER,
    Rule,
    corrected,
    judged,
)
from ptspeed.analysis.columns import ALPHA, CELL_KEYS, CONFIDENCE
from ptspeed.analysis.compare_inputs import defaults_of, known_rows, plain_value
from ptspeed.analysis.conditions import counted_in_speedups
from ptspeed.analysis.machine_change import (
    Machine,
    MachineKey,
    machine_changes,
    machine_key,
    machine_of,
)
from ptspeed.analysis.summary import status_counts
from ptspeed.errors import InputError
from ptspeed.plan.layout import SIZE_KEYS

COMPARE_COLUMNS = [
    "mark",
    *CELL_KEYS,
    "old_samples_per_s",
    "old_trials",
    "new_samples_per_s",
    "new_trials",
    "ratio",
    "ratio_low",
    "ratio_high",
    "ratio_confidence",
    "p_value",
    "significant",
    "machine_ratio",
    "machine_low",
    "machine_high",
    "machine_confidence",
    "corrected_ratio",
    "corrected_low",
    "corrected_high",
    "change",
]


def compare_runs(
    old: pd.DataFrame,
    new: pd.DataFrame,
    threshold: float | None = None,
    keep_perturbed: bool = False,
    min_window_s: float | None = None,
    aa_spread: float = AA_SPREAD,
) -> pd.DataFrame:
    """One row per cell of either side (sorted by cell), columns :data:`COMPARE_COLUMNS`.

    ``ratio`` is new / old median throughput over the ok trials (the perturbed ones left out
    unless ``keep_perturbed``); above 1 means faster; ``corrected_ratio`` divides it by its
    environment's machine. ``threshold`` (the minimum effect) and ``min_window_s`` default to
    the config schema's; :func:`~ptspeed.analysis.compare_inputs.run_defaults` gives a
    run's own.
    """
    schema = defaults_of(None, "")
    threshold = schema.min_effect if threshold is None else threshold
    min_window_s = schema.min_window_s if min_window_s is None else min_window_s
    if not 0.0 <= threshold < 1.0:
        raise InputError(f"threshold must lie in [0, 1), got {threshold}")
    if not 0.0 <= aa_spread < 1.0:
        raise InputError(f"aa_spread must lie in [0, 1), got {aa_spread}")
    rule = Rule(threshold, aa_spread, min_window_s)
    old_cells, new_cells = cells_of(old, keep_perturbed), cells_of(new, keep_perturbed)
    machines = machine_changes(old, new, keep_perturbed)
    keys = sorted(old_cells.keys() | new_cells.keys(), key=_sort_key)
    rows = [_compared(key, old_cells.get(key), new_cells.get(key), rule, machines) for key in keys]
    return pd.DataFrame(rows, columns=COMPARE_COLUMNS)


def cells_of(
    runs: pd.DataFrame, keep_perturbed: bool = False
) -> dict[tuple[Any, ...], dict[str, Any]]:
    """Per cell: its ok throughputs (finite, positive; not perturbed unless ``keep_perturbed``)
    with their windows' lengths and machine keys, and all its statuses. Rows whose cell is
    unknown (an unreadable file outside the workflow's layout) cannot be matched and are left
    out."""
    # Only the same platform is compared across runs; a run without platforms is one unnamed.
    known = known_rows(runs)
    rates = pd.to_numeric(known["throughput_samples_per_s"], errors="coerce")
    rates = rates.where(counted_in_speedups(known, keep_perturbed))
    cells: dict[tuple[Any, ...], dict[str, Any]] = {}
    columns = [known[key].tolist() for key in CELL_KEYS]
    machines = [machine_key(row) for row in known.to_dict("records")]
    windows = (
        pd.to_numeric(known["window_s"], errors="coerce")
        if "window_s" in known.columns
        else pd.Series(math.nan, index=known.index)
    )
    trials = zip(*columns, known["status"], rates, machines, windows, strict=True)
    for *key, status, rate, machine, window in trials:
        cell = cells.setdefault(
            tuple(plain_value(v) for v in key),
            {"rates": [], "statuses": [], "machines": [], "windows": []},
        )
        cell["statuses"].append(status)
        if status == "ok" and math.isfinite(rate) and rate > 0:
            cell["rates"].append(float(rate))
            cell["machines"].append(machine)
            cell["windows"].append(float(window))
    return cells


def _sort_key(key: tuple[Any, ...]) -> tuple[Any, ...]:
    # Blanks last; numbers before text, so that a stray text size never meets an int.
    return tuple((v is None, isinstance(v, str), 0 if v is None else v) for v in key)


def _compared(
    key: tuple[Any, ...],
    old: Mapping[str, Any] | None,
    new: Mapping[str, Any] | None,
    rule: Rule,
    machines: Mapping[MachineKey, Machine],
) -> dict[str, Any]:
    row: dict[str, Any] = {
        **dict(zip(CELL_KEYS, key, strict=True)),
        **_side("old", old),
        **_side("new", new),
        **dict.fromkeys(COMPARE_COLUMNS[COMPARE_COLUMNS.index("ratio") :], math.nan),
        "significant": False,
    }
    absent = _why_not_comparable(old, new)
    if absent:
        return {**row, "mark": NOT_COMPARABLE, "change": absent}
    assert old is not None and new is not None
    ratio = ranks.speedup(old["rates"], new["rates"], CONFIDENCE, ALPHA)
    row.update(ratio.columns("ratio"))
    machine = machine_of(old, new, machines)
    if machine is not None and machine.ratio is not None:
        m = machine.ratio
        row.update(
            machine_ratio=m.estimate,
            machine_low=m.low,
            machine_high=m.high,
            machine_confidence=m.achieved_confidence,
        )
    if not math.isnan(ratio.low):
        c, low, high = corrected(ratio, machine, rule.aa_spread)
        row.update(corrected_ratio=c, corrected_low=low, corrected_high=high)
    mark, change = judged(ratio, rule, machine, _shortest_window(old, new))
    return {**row, "mark": mark, "change": change}


def _shortest_window(old: Mapping[str, Any], new: Mapping[str, Any]) -> float:
    """The shorter of the two sides' median measured windows (seconds; inf where unknown)."""
    medians = [
        statistics.median(known)
        for cell in (old, new)
        if (known := [w for w in cell.get("windows", []) if math.isfinite(w)])
    ]
    return min(medians, default=math.inf)


def _side(prefix: str, cell: Mapping[str, Any] | None) -> dict[str, Any]:
    rates = cell["rates"] if cell else []
    median = statistics.median(rates) if rates else math.nan
    return {f"{prefix}_samples_per_s": median, f"{prefix}_trials": len(rates)}


def _why_not_comparable(old: Mapping[str, Any] | None, new: Mapping[str, Any] | None) -> str:
    reasons = []
    for name, cell in (("old", old), ("new", new)):
        if cell is None:
            reasons.append(f"not in {name}")
        elif not cell["rates"]:
            reasons.append(f"no ok trials in {name} ({status_counts(pd.Series(cell['statuses']))})")
    return "; ".join(reasons)


def regressions(compared: pd.DataFrame) -> pd.DataFrame:
    """The cells that got significantly slower by more than the threshold."""
    return compared[compared["mark"] == SLOWER]


# --- speedups, both ways ---------------------------------------------------------------------

SPEEDUP_KEYS = ["comparison", "model", "mode", *SIZE_KEYS]
# A speedups.csv column and its name in the cross-check, after old_ or new_.
_PARTS = {
    "speedup": "speedup",
    "speedup_low": "low",
    "speedup_high": "high",
    "speedup_confidence": "confidence",
}
CROSS_CHECK_COLUMNS = [
    *SPEEDUP_KEYS,
    *(f"{side}_{part}" for side in ("old", "new") for part in _PARTS.values()),
    "new_inside_old",
    "old_inside_new",
]


def cross_check_speedups(old: pd.DataFrame, new: pd.DataFrame) -> pd.DataFrame:
    """Per speedup measured in both (comparison, model, mode, sizes): both estimates and
    intervals, and whether each lies inside the other's interval (columns
    :data:`CROSS_CHECK_COLUMNS`)."""

    def side(frame: pd.DataFrame, prefix: str) -> pd.DataFrame:
        frame = frame[pd.to_numeric(frame["speedup"], errors="coerce").notna()]
        names = {column: f"{prefix}_{part}" for column, part in _PARTS.items()}
        return frame[[*SPEEDUP_KEYS, *_PARTS]].rename(columns=names)

    both = side(old, "old").merge(side(new, "new"), on=SPEEDUP_KEYS, how="inner")
    both["new_inside_old"] = both["new_speedup"].between(both["old_low"], both["old_high"])
    both["old_inside_new"] = both["old_speedup"].between(both["new_low"], both["new_high"])
    return both[CROSS_CHECK_COLUMNS].reset_index(drop=True)
