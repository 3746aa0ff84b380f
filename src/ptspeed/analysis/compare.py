"""Compare two result sets cell by cell, in the manner of ``asv compare``.

Two runs (two machines, before and after a change) each give a ``runs.csv``. Cells are matched
on environment, model, variant, mode and sizes; for each cell present on both sides the ratio
new / old of throughput is given as the report's speedups are
(:func:`ptspeed.analysis.ranks.speedup`: the Hodges–Lehmann ratio, its exact interval with the
confidence it achieves, and the Mann–Whitney p-value), and a mark:

* ``+`` significantly faster: the change is significant and the ratio above ``1 + threshold``;
* ``-`` significantly slower: significant and the ratio below ``1 - threshold``;
* `` `` (blank) no significant change, or one within the threshold, or too few trials to test;
* ``x`` not comparable: absent from one side, or without ok trials there.

A cell counts as a regression (``-``) only when both the test and the interval say so and the
drop exceeds the threshold, so that noise alone does not fail a CI job. Trials judged perturbed
(``perturbed`` in runs.csv) are left out unless kept, as the speedups leave them out.

The machine is accounted for. Every trial since issue 31 probes the machine's speed just
outside its window (:mod:`ptspeed.cell.measurement.probe`;
:func:`ptspeed.analysis.conditions.probe_s`). Per probe group (platform, device, CPU threads, probe
work: :func:`ptspeed.analysis.conditions.probe_group`) the machine's ratio ``m`` is the
Hodges–Lehmann ratio new / old of the probes' speeds (1 / probe_s) over the same trials the
cells count, with its exact interval ``[m_low, m_high]`` (:func:`machine_changes`). The rule,
with ``r [r_low, r_high]`` a cell's ratio and ``t`` the threshold (the minimum effect):

* ``-`` slower: the change is significant, both ``r`` and ``r / m`` are below ``1 - t``, and
  ``r_high < min(1, m_low)``: the cell's whole interval lies below the machine's and below no
  change, so neither noise nor the machine's own change can explain it;
* ``+`` faster: significant, ``r`` and ``r / m`` above ``1 + t`` and ``r_low > max(1, m_high)``;
* otherwise unchanged; a significant change beyond the threshold that the machine explains says
  so in ``change``;
* and never faster or slower where either side's median measured window is shorter than
  ``conditions.min_window_s`` (0.5 s): windows that short are not judged for load either, and
  two runs of identical code on the development VM once differed by x0.91 [0.89–0.97] in 0.4 s
  windows with the probe unchanged; ``change`` says so and asks for longer windows.

A loaded machine slows a probe and a cell by different amounts (on the development VM one
spinning process per CPU slowed the probe x0.48 and the mlp cells x0.66): a cell that merely
lost less than the probe is not called faster, nor one that gained less than the probe slower.

Where a side has no probes (records from before them) ``m`` is 1 with an interval [1, 1], the
rule above without the machine. :func:`machine_lines` says first, per group, each run's probe
and whether the machine changed between the runs (:data:`MACHINE_CHANGE`).

Where both result sets have a ``speedups.csv`` beside their ``runs.csv``,
:func:`cross_check_speedups` checks each comparison's speedup of one run against the other's
interval, both ways: two runs of one matrix on one machine should agree.
"""

from __future__ import annotations

import math
import statistics
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pandas as pd

from ptspeed.analysis import ranks, stats
from ptspeed.analysis.columns import (
    ALPHA,
    CELL_KEYS,
    CONFIDENCE,
    platform_column,
    read_table,
    unused_sizes,
)
from ptspeed.analysis.conditions import counted_in_speedups, probe_group, probe_s, settings
from ptspeed.analysis.summary import status_counts
from ptspeed.errors import InputError
from ptspeed.plan.layout import (
    PLACE_PATTERN,
    SIZE_KEYS,
    platform_directory,
    runs_csv_of,
    size_label,
)

FASTER, SLOWER, SAME, NOT_COMPARABLE = "+", "-", " ", "x"
DEFAULT_THRESHOLD = 0.05
# The machine changed between the runs when its probe's ratio is significant and beyond this
# (one thread's probe varies by about 3 % within a quiet run on the development VM).
MACHINE_CHANGE = 0.03
# Tables from before platforms have no platform column: they are one unnamed platform.
REQUIRED_COLUMNS = [
    *(key for key in CELL_KEYS if key != "platform"),
    "status",
    "throughput_samples_per_s",
]
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
    "change",
]


def read_runs(path: str | Path) -> pd.DataFrame:
    """The runs table of a result set, checked for the columns a comparison needs."""
    csv = runs_csv_of(path)
    try:
        runs = read_table(csv)
    except (pd.errors.ParserError, pd.errors.EmptyDataError, UnicodeDecodeError) as error:
        raise InputError(f"{csv}: not a runs table ({error})") from error
    missing = [column for column in REQUIRED_COLUMNS if column not in runs.columns]
    if missing:
        raise InputError(f"{csv}: not a runs table, lacks columns: {', '.join(missing)}")
    return runs


# --- comparing -----------------------------------------------------------------------------------


def compare_runs(
    old: pd.DataFrame,
    new: pd.DataFrame,
    threshold: float = DEFAULT_THRESHOLD,
    keep_perturbed: bool = False,
    min_window_s: float | None = None,
) -> pd.DataFrame:
    """One row per cell of either side (sorted by cell), columns :data:`COMPARE_COLUMNS`.

    ``ratio`` is new / old median throughput over the ok trials (the perturbed ones left out
    unless ``keep_perturbed``); above 1 means faster. A cell whose median measured window is
    shorter than ``min_window_s`` on either side (default: the configuration's
    ``conditions.min_window_s``) is never called faster or slower.
    """
    if not 0.0 <= threshold < 1.0:
        raise InputError(f"threshold must lie in [0, 1), got {threshold}")
    if min_window_s is None:
        min_window_s = float(settings(None)["min_window_s"])
    old_cells, new_cells = cells_of(old, keep_perturbed), cells_of(new, keep_perturbed)
    machines = machine_changes(old, new, keep_perturbed)
    keys = sorted(old_cells.keys() | new_cells.keys(), key=_sort_key)
    rows = [
        _compared(key, old_cells.get(key), new_cells.get(key), threshold, machines, min_window_s)
        for key in keys
    ]
    return pd.DataFrame(rows, columns=COMPARE_COLUMNS)


def cells_of(
    runs: pd.DataFrame, keep_perturbed: bool = False
) -> dict[tuple[Any, ...], dict[str, Any]]:
    """Per cell: its ok throughputs (finite, positive; not perturbed unless ``keep_perturbed``)
    with their windows' lengths and probe groups, and all its statuses. Rows whose cell is
    unknown (an unreadable file outside the workflow's layout) cannot be matched and are left
    out."""
    # Only the same platform is compared across runs; a run without platforms is one unnamed.
    known = _known(runs)
    rates = pd.to_numeric(known["throughput_samples_per_s"], errors="coerce")
    rates = rates.where(
        counted_in_speedups(known, {"conditions": {"keep_perturbed": keep_perturbed}})
    )
    cells: dict[tuple[Any, ...], dict[str, Any]] = {}
    columns = [known[key].tolist() for key in CELL_KEYS]
    groups = [probe_group(row) for row in known.to_dict("records")]
    windows = (
        pd.to_numeric(known["window_s"], errors="coerce")
        if "window_s" in known.columns
        else pd.Series(math.nan, index=known.index)
    )
    trials = zip(*columns, known["status"], rates, groups, windows, strict=True)
    for *key, status, rate, group, window in trials:
        cell = cells.setdefault(
            tuple(_plain(v) for v in key),
            {"rates": [], "statuses": [], "groups": [], "windows": []},
        )
        cell["statuses"].append(status)
        if status == "ok" and math.isfinite(rate) and rate > 0:
            cell["rates"].append(float(rate))
            cell["groups"].append(group)
            cell["windows"].append(float(window))
    return cells


def _known(runs: pd.DataFrame) -> pd.DataFrame:
    """The rows whose cell is known, with their platform (a run without platforms: one
    unnamed)."""
    known = runs[runs["env"].notna()]
    return known.assign(platform=platform_column(known))


# --- the machine -----------------------------------------------------------------------------


def probe_speeds(
    runs: pd.DataFrame, keep_perturbed: bool = False
) -> dict[tuple[Any, ...], list[float]]:
    """Per probe group, the machine's speed (1 / probe_s) of each ok trial a cell counts
    (the perturbed left out unless ``keep_perturbed``); trials without probes in no group."""
    known = _known(runs)
    counted = counted_in_speedups(known, {"conditions": {"keep_perturbed": keep_perturbed}})
    speeds: dict[tuple[Any, ...], list[float]] = {}
    for row, use in zip(known.to_dict("records"), counted, strict=True):
        seconds = probe_s(row) if use and row.get("status") == "ok" else math.nan
        if math.isfinite(seconds) and seconds > 0:
            speeds.setdefault(probe_group(row), []).append(1.0 / seconds)
    return speeds


@dataclass(frozen=True)
class Machine:
    """One probe group's machine in both runs: each run's median probe (seconds) and trials,
    and the ratio new / old of its speed (None where a side did not probe)."""

    group: tuple[Any, ...]
    old_probe_s: float
    old_trials: int
    new_probe_s: float
    new_trials: int
    ratio: ranks.Ratio | None

    def changed(self) -> bool:
        """The probe's change is significant and beyond :data:`MACHINE_CHANGE`."""
        ratio = self.ratio
        return (
            ratio is not None and ratio.significant and abs(ratio.estimate - 1.0) > MACHINE_CHANGE
        )

    def bounds(self) -> tuple[float, float, float]:
        """(m, m_low, m_high): the machine's ratio and interval; where it has no interval,
        the estimate for both ends; where it was not probed on both sides, 1, 1, 1."""
        if self.ratio is None or math.isnan(self.ratio.estimate):
            return 1.0, 1.0, 1.0
        m = self.ratio.estimate
        low, high = self.ratio.low, self.ratio.high
        return (m, m, m) if math.isnan(low) else (m, low, high)


def machine_changes(
    old: pd.DataFrame, new: pd.DataFrame, keep_perturbed: bool = False
) -> dict[tuple[Any, ...], Machine]:
    """Per probe group of either run, its :class:`Machine`."""
    old_speeds, new_speeds = probe_speeds(old, keep_perturbed), probe_speeds(new, keep_perturbed)
    machines = {}
    for group in sorted(old_speeds.keys() | new_speeds.keys(), key=_group_key):
        before, after = old_speeds.get(group, []), new_speeds.get(group, [])
        ratio = ranks.speedup(before, after, CONFIDENCE, ALPHA) if before and after else None
        machines[group] = Machine(
            group,
            1.0 / statistics.median(before) if before else math.nan,
            len(before),
            1.0 / statistics.median(after) if after else math.nan,
            len(after),
            ratio,
        )
    return machines


def _group_key(group: tuple[Any, ...]) -> tuple[Any, ...]:
    return tuple("" if v is None else str(v) for v in group)


def _machine_of(
    old: Mapping[str, Any], new: Mapping[str, Any], machines: Mapping[tuple[Any, ...], Machine]
) -> Machine | None:
    """The machine a cell ran on in both runs: its probe group where it is one and the same
    on both sides and both probed; None otherwise."""
    groups = set(old.get("groups", [])) | set(new.get("groups", []))
    if len(groups) != 1:
        return None
    machine = machines.get(groups.pop())
    return machine if machine is not None and machine.ratio is not None else None


def group_label(group: tuple[Any, ...]) -> str:
    """E.g. ``"cpu, 1 thread"``, ``"cuda (a100)"``."""
    platform, kind, threads, _ = group
    if not kind:
        return "no probe"
    label = kind + (f", {threads} thread{'s' if threads != 1 else ''}" if kind == "cpu" else "")
    return label + (f" ({platform})" if platform else "")


def machine_lines(machines: Mapping[tuple[Any, ...], Machine]) -> list[str]:
    """What the machine did, to print before the cells: per probe group each run's median
    probe and the ratio of its speed, the changed groups first, each saying what it means for
    the cells."""
    probed = {g: m for g, m in machines.items() if g[1]}
    unprobed = [side for side, n in (("old", "old_trials"), ("new", "new_trials"))
                if not any(getattr(m, n) for m in probed.values())]  # fmt: skip
    lines = []
    for machine in sorted(probed.values(), key=lambda m: not m.changed()):
        lines.append(_machine_line(machine))
    if unprobed:
        lines.append(
            f"no machine-speed probe in {' and '.join(unprobed)} (records from before probes): "
            "a change of the machine cannot be told from a change of the code"
        )
    return lines


def _machine_line(machine: Machine) -> str:
    def probe(seconds: float, trials: int) -> str:
        return "—" if math.isnan(seconds) else f"{seconds * 1e3:.1f} ms (n={trials})"

    old = probe(machine.old_probe_s, machine.old_trials)
    new = probe(machine.new_probe_s, machine.new_trials)
    head = f"machine ({group_label(machine.group)}): probe {old} in old, {new} in new"
    ratio = machine.ratio
    if ratio is None:
        return head + ": not probed on both sides, its cells judged without it"
    speed = _ratio(ratio.estimate, ratio.low, ratio.high, ratio.achieved_confidence)
    if machine.changed():
        return (
            f"MACHINE CHANGED between the runs: {head}; it ran x{speed} as fast in new. No cell "
            "of it is called faster or slower unless its change exceeds the machine's (ratio / "
            "machine beyond the threshold, interval outside the machine's)"
        )
    return f"{head}; speed x{speed}: unchanged (within {MACHINE_CHANGE:.0%} or not significant)"


def _plain(value: Any) -> Any:
    """A key part that compares equal across the two tables (NaN != NaN would split cells)."""
    if value is None or value is pd.NA or (isinstance(value, float) and math.isnan(value)):
        return None
    return int(value) if isinstance(value, float) and value.is_integer() else value


def _sort_key(key: tuple[Any, ...]) -> tuple[Any, ...]:
    # Blanks last; numbers before text, so that a stray text size never meets an int.
    return tuple((v is None, isinstance(v, str), 0 if v is None else v) for v in key)


def _compared(
    key: tuple[Any, ...],
    old: Mapping[str, Any] | None,
    new: Mapping[str, Any] | None,
    threshold: float,
    machines: Mapping[tuple[Any, ...], Machine] | None = None,
    min_window_s: float = 0.0,
) -> dict[str, Any]:
    row: dict[str, Any] = {
        **dict(zip(CELL_KEYS, key, strict=True)),
        **_side("old", old),
        **_side("new", new),
        "ratio": math.nan,
        "ratio_low": math.nan,
        "ratio_high": math.nan,
        "ratio_confidence": math.nan,
        "p_value": math.nan,
        "significant": False,
        "machine_ratio": math.nan,
        "machine_low": math.nan,
        "machine_high": math.nan,
        "machine_confidence": math.nan,
        "corrected_ratio": math.nan,
    }
    absent = _why_not_comparable(old, new)
    if absent:
        return {**row, "mark": NOT_COMPARABLE, "change": absent}
    assert old is not None and new is not None
    ratio = ranks.speedup(old["rates"], new["rates"], CONFIDENCE, ALPHA)
    row.update(ratio.columns("ratio"))
    machine = _machine_of(old, new, machines or {})
    if machine is not None and machine.ratio is not None:
        row.update(
            {
                "machine_ratio": machine.ratio.estimate,
                "machine_low": machine.ratio.low,
                "machine_high": machine.ratio.high,
                "machine_confidence": machine.ratio.achieved_confidence,
                "corrected_ratio": ratio.estimate / machine.ratio.estimate,
            }
        )
    mark, change = _judged(ratio, threshold, machine, _shortest_window(old, new), min_window_s)
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


def _judged(
    ratio: ranks.Ratio,
    threshold: float,
    machine: Machine | None = None,
    window_s: float = math.inf,
    min_window_s: float = 0.0,
) -> tuple[str, str]:
    """The mark and its words by the rule of the module docstring (``window_s``: the shorter
    side's median measured window)."""
    if math.isnan(ratio.low):
        return SAME, "too few ok trials for a test (2 per side needed)"
    if not ratio.significant:
        floor = ranks.smallest_p_value(ratio.n_baseline, ratio.n_candidate)
        if floor >= ratio.alpha:
            return SAME, (
                f"too few ok trials to detect a change ({ratio.n_baseline} and "
                f"{ratio.n_candidate}: p >= {floor:.2g} whatever they measure)"
            )
        return SAME, "no significant change"
    m, m_low, m_high = machine.bounds() if machine is not None else (1.0, 1.0, 1.0)
    corrected = ratio.estimate / m
    beyond = abs(ratio.estimate - 1.0) > threshold and abs(corrected - 1.0) > threshold
    slower = beyond and corrected < 1.0 and ratio.high < min(1.0, m_low)
    faster = beyond and corrected > 1.0 and ratio.low > max(1.0, m_high)
    if (slower or faster) and window_s < min_window_s:
        return SAME, (
            f"{'slower' if slower else 'faster'} by the numbers, but its windows "
            f"({window_s:.2f} s) are shorter than the {min_window_s:g} s a change is called on "
            "(conditions.min_window_s): lengthen steps.measured"
        )
    if slower:
        return SLOWER, "slower"
    if faster:
        return FASTER, "faster"
    if abs(ratio.estimate - 1.0) > threshold:
        return SAME, (
            f"x{ratio.estimate:.2f}, as the machine's own change explains (its probe x{m:.2f} "
            f"[{m_low:.2f}–{m_high:.2f}]; ratio / machine x{corrected:.2f})"
        )
    return SAME, f"significant, but within the {threshold:.0%} threshold"


def regressions(compared: pd.DataFrame) -> pd.DataFrame:
    """The cells that got significantly slower by more than the threshold."""
    return compared[compared["mark"] == SLOWER]


def verdict_line(compared: pd.DataFrame) -> str:
    """E.g. ``"12 cells: 1 faster, 2 slower, 8 unchanged, 1 not comparable"``."""
    counts = compared["mark"].value_counts()
    parts = [
        f"{counts.get(FASTER, 0)} faster",
        f"{counts.get(SLOWER, 0)} slower",
        f"{counts.get(SAME, 0)} unchanged",
        f"{counts.get(NOT_COMPARABLE, 0)} not comparable",
    ]
    return f"{len(compared)} cells: " + ", ".join(parts)


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


def speedups_beside(runs_path: str | Path) -> Path | None:
    """The speedups.csv beside a result set's runs.csv, if there is one."""
    candidate = runs_csv_of(runs_path).with_name("speedups.csv")
    return candidate if candidate.is_file() else None


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


def cross_check_rows(checked: pd.DataFrame) -> list[list[str]]:
    """The cross-check as text: each speedup with its interval, and which checks hold."""
    return [
        [
            f"{row['comparison']}: {row['model']} ({row['mode']})",
            _ratio(row["old_speedup"], row["old_low"], row["old_high"], row["old_confidence"]),
            _ratio(row["new_speedup"], row["new_low"], row["new_high"], row["new_confidence"]),
            "yes" if row["new_inside_old"] else "NO",
            "yes" if row["old_inside_new"] else "NO",
        ]
        for row in checked.to_dict("records")
    ]


CROSS_CHECK_HEADERS = ["speedup", "old [interval]", "new [interval]", "new in old", "old in new"]


def cross_check_line(checked: pd.DataFrame) -> str:
    """E.g. ``"speedups: 17 of 18 cross-checks hold (each run's speedup inside the other's
    interval)"``."""
    held = int(checked["new_inside_old"].sum() + checked["old_inside_new"].sum())
    return (
        f"speedups: {held} of {2 * len(checked)} cross-checks hold (each run's speedup inside "
        "the other's interval)"
    )


# --- showing -------------------------------------------------------------------------------------

DISPLAY_HEADERS = [
    "",
    "old samples/s",
    "new samples/s",
    "ratio [interval, 95% unless stated]",
    "p",
    "/ machine",
    "cell",
    "change",
]


def display_rows(compared: pd.DataFrame) -> list[list[str]]:
    """The comparison as text: every rate with its ok trials, every ratio with its interval."""
    return [
        [
            row["mark"],
            _rate(row["old_samples_per_s"], row["old_trials"]),
            _rate(row["new_samples_per_s"], row["new_trials"]),
            _ratio(row["ratio"], row["ratio_low"], row["ratio_high"], row["ratio_confidence"]),
            "" if math.isnan(row["p_value"]) else f"{row['p_value']:.3g}",
            "" if math.isnan(row["corrected_ratio"]) else f"{row['corrected_ratio']:.2f}",
            cell_label(row),
            row["change"],
        ]
        for row in compared.to_dict("records")
    ]


def cell_label(row: Mapping[str, Any]) -> str:
    place = {key: row[key] for key in ("env", "model", "variant", "mode")}
    platform = platform_directory(row.get("platform") or "")
    used = [key for key in SIZE_KEYS if key not in unused_sizes(row["model"])]
    size = size_label({k: _integer(row[k]) for k in SIZE_KEYS}, used)
    return PLACE_PATTERN.format(**place, platform=platform, size=size)


def _integer(value: Any) -> str:
    """A size as the layout writes it: ``64``, also where the table holds it as 64.0."""
    plain = _plain(value)
    return "?" if plain is None else str(plain)


def _rate(median: float, trials: int) -> str:
    return f"{'—' if math.isnan(median) else f'{median:.1f}'} (n={trials})"


def _ratio(ratio: float, low: float, high: float, achieved: float) -> str:
    """E.g. ``"1.34 [1.10–1.52] 90%"``: the level is shown where it falls short of 95 %."""
    if math.isnan(ratio):
        return "—"
    if math.isnan(low):
        return f"{ratio:.2f} [no interval]"
    note = stats.confidence_note(CONFIDENCE, achieved)
    return f"{ratio:.2f} [{low:.2f}–{high:.2f}]" + (f" {note}" if note else "")


def as_text(headers: Sequence[str], rows: Sequence[Sequence[str]]) -> str:
    """A fixed-width table for a terminal, the last column left unpadded."""
    widths = [max(len(r[i]) for r in [headers, *rows]) for i in range(len(headers) - 1)]
    lines = []
    for cells in [headers, *rows]:
        padded = [cell.ljust(width) for cell, width in zip(cells, widths, strict=False)]
        lines.append("  ".join([*padded, cells[-1]]).rstrip())
    return "\n".join(lines) + "\n"


def as_markdown(headers: Sequence[str], rows: Sequence[Sequence[str]]) -> str:
    def line(cells: Sequence[str]) -> str:
        return "| " + " | ".join(c.replace("|", "\\|") or " " for c in cells) + " |"

    rule = "|" + "|".join(" --- " for _ in headers) + "|"
    return "\n".join([line(["mark", *headers[1:]]), rule, *map(line, rows)]) + "\n"
