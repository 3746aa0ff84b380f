"""Two result sets compared (:mod:`ptspeed.analysis.compare`) as text: the machine's lines, the
rule with its numbers, the table of cells and the speedups' cross-check, for a terminal, a
Markdown file and the report's "Against an earlier run".

Numbers pass through :mod:`ptspeed.render.formatting`, as everywhere on the page.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from typing import Any

import pandas as pd

from ptspeed.analysis.change_verdict import FASTER, NOT_COMPARABLE, SAME, SLOWER, Rule
from ptspeed.analysis.columns import unused_sizes
from ptspeed.analysis.machine_change import MACHINE_CHANGE, Machine, MachineKey
from ptspeed.plan.layout import PLACE_PATTERN, SIZE_KEYS, platform_directory, size_label
from ptspeed.render.formatting import (
    format_int,
    format_rate,
    format_speedup_interval,
    is_blank,
    markdown_table,
)

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
CROSS_CHECK_HEADERS = ["speedup", "old [interval]", "new [interval]", "new in old", "old in new"]


# --- the rule and the machine ------------------------------------------------------------------


def rule_sentence(rule: Rule) -> str:
    """The rule of :mod:`ptspeed.analysis.compare` in one sentence, with its numbers."""
    return (
        "a cell is called slower (-) or faster (+) when its ratio divided by its "
        f"environment's machine ratio is beyond the minimum effect {rule.min_effect:.0%} "
        "and its interval (the trials', the machine's and the "
        f"±{rule.aa_spread:.0%} two runs of identical code differ by, added in quadrature) "
        "excludes no change; a cell measured slower than before is never called faster, nor "
        "one measured faster slower; and no change is called in windows under "
        f"{rule.min_window_s:g} s"
    )


def rule_line(rule: Rule, source: str) -> str:
    """The rule to print before a comparison, saying where its defaults came from."""
    return f"rule: {rule_sentence(rule)} (defaults from {source})"


def machine_label(key: MachineKey) -> str:
    """E.g. ``"torch-2.0 (torch 2.0.1), cpu, 1 thread"``, ``"torch-2.0, cuda, a100"``."""
    if not key.kind:
        return f"{key.env or 'no environment'}, no probe"
    parts = [key.env + (f" (torch {key.torch})" if key.torch else ""), key.kind]
    if key.kind == "cpu" and key.threads is not None:
        parts.append(f"{key.threads} thread{'s' if key.threads != 1 else ''}")
    return ", ".join([*parts, *([key.platform] if key.platform else [])])


def machine_lines(machines: Mapping[MachineKey, Machine]) -> list[str]:
    """What the machine did, to print before the cells: per machine key each run's median
    probe and the ratio of its speed, the changed keys first, each saying what it means for
    the cells."""
    probed = {key: m for key, m in machines.items() if key.kind}
    unprobed = [side for side, n in (("old", "old_trials"), ("new", "new_trials"))
                if not any(getattr(m, n) for m in probed.values())]  # fmt: skip
    lines = [_machine_line(m) for m in sorted(probed.values(), key=lambda m: not m.changed())]
    if unprobed:
        lines.append(
            f"no machine-speed probe in {' and '.join(unprobed)} (records from before probes): "
            "a change of the machine cannot be told from a change of the code"
        )
    return lines


def _machine_line(machine: Machine) -> str:
    old = _probe(machine.old_probe_s, machine.old_trials)
    new = _probe(machine.new_probe_s, machine.new_trials)
    head = f"machine in {machine_label(machine.key)}: probe {old} in old, {new} in new"
    ratio = machine.ratio
    if ratio is None:
        return head + ": not probed alike on both sides, its cells judged without it"
    speed = format_speedup_interval(
        ratio.estimate, ratio.low, ratio.high, ratio.achieved_confidence
    )
    if machine.changed():
        return (
            f"MACHINE CHANGED between the runs: {head}; its speed {speed} in new. Its cells "
            "are judged by their ratio divided by the machine's"
        )
    return f"{head}; speed {speed}: unchanged (within {MACHINE_CHANGE:.0%} or not significant)"


def _probe(seconds: float, trials: int) -> str:
    return "—" if math.isnan(seconds) else f"{seconds * 1e3:.1f} ms (n={trials})"


# --- the cells -------------------------------------------------------------------------------


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


def display_rows(compared: pd.DataFrame) -> list[list[str]]:
    """The comparison as text: every rate with its ok trials, every ratio with its interval."""
    return [
        [
            row["mark"],
            format_rate(row["old_samples_per_s"], row["old_trials"]),
            format_rate(row["new_samples_per_s"], row["new_trials"]),
            format_speedup_interval(
                row["ratio"], row["ratio_low"], row["ratio_high"], row["ratio_confidence"]
            ),
            "" if is_blank(row["p_value"]) else f"{row['p_value']:.3g}",
            "" if is_blank(row["corrected_ratio"]) else f"{row['corrected_ratio']:.2f}",
            cell_label(row),
            row["change"],
        ]
        for row in compared.to_dict("records")
    ]


def cell_label(row: Mapping[str, Any]) -> str:
    """A cell as its records' path names it, e.g. ``torch-2.0/mlp/eager/train/b8``."""
    place = {key: row[key] for key in ("env", "model", "variant", "mode")}
    platform = platform_directory(row.get("platform") or "")
    used = [key for key in SIZE_KEYS if key not in unused_sizes(row["model"])]
    sizes = {key: _size(row[key]) for key in SIZE_KEYS}
    return PLACE_PATTERN.format(**place, platform=platform, size=size_label(sizes, used))


def _size(value: Any) -> str:
    """A size as the layout writes it: ``64``, also where the table holds it as 64.0."""
    if is_blank(value):
        return "?"
    return format_int(value) if isinstance(value, (int, float)) else str(value)


# --- the speedups' cross-check ------------------------------------------------------------------


def cross_check_rows(checked: pd.DataFrame) -> list[list[str]]:
    """The cross-check as text: each speedup with its interval, and which checks hold."""
    return [
        [
            f"{row['comparison']}: {row['model']} ({row['mode']})",
            format_speedup_interval(
                row["old_speedup"], row["old_low"], row["old_high"], row["old_confidence"]
            ),
            format_speedup_interval(
                row["new_speedup"], row["new_low"], row["new_high"], row["new_confidence"]
            ),
            "yes" if row["new_inside_old"] else "NO",
            "yes" if row["old_inside_new"] else "NO",
        ]
        for row in checked.to_dict("records")
    ]


def cross_check_line(checked: pd.DataFrame) -> str:
    """E.g. ``"speedups: 17 of 18 cross-checks hold (each run's speedup inside the other's
    interval)"``."""
    held = int(checked["new_inside_old"].sum() + checked["old_inside_new"].sum())
    return (
        f"speedups: {held} of {2 * len(checked)} cross-checks hold (each run's speedup inside "
        "the other's interval)"
    )


# --- tables ------------------------------------------------------------------------------------


def as_text(headers: Sequence[str], rows: Sequence[Sequence[str]]) -> str:
    """A fixed-width table for a terminal, the last column left unpadded."""
    widths = [max(len(r[i]) for r in [headers, *rows]) for i in range(len(headers) - 1)]
    lines = []
    for cells in [headers, *rows]:
        padded = [cell.ljust(width) for cell, width in zip(cells, widths, strict=False)]
        lines.append("  ".join([*padded, cells[-1]]).rstrip())
    return "\n".join(lines) + "\n"


def as_markdown(headers: Sequence[str], rows: Sequence[Sequence[str]]) -> str:
    """A Markdown table; the marks' column is headed ``mark``."""
    return markdown_table(["mark", *headers[1:]], rows)
