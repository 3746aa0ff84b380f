"""The report's number and text formatters: every value shown on the page passes through one.

Each ``format_*`` function turns one cell of an aggregated CSV (a float, an int, a string, or
a blank: None, NA, NaN, "") into the text the tables show; a blank becomes :data:`BLANK`.
Measured values carry the number of ok trials they came from (``n=``), intervals their
coverage where it falls short of the requested 95 %.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from typing import Any

import pandas as pd

from ptspeed.analysis import stats
from ptspeed.analysis.columns import CONFIDENCE

BLANK = "—"
BYTES_PER_MIB = 1024 * 1024


def is_blank(value: Any) -> bool:
    """True for None, NA, NaN and the empty string."""
    if value is None or value is pd.NA or (isinstance(value, str) and not value.strip()):
        return True
    return isinstance(value, float) and math.isnan(value)


def is_true(value: Any) -> bool:
    """A boolean CSV cell: True, or the text 'True' (a column with blanks reads as text)."""
    return value is True or (isinstance(value, str) and value.strip().lower() == "true")


def format_text(value: Any) -> str:
    return BLANK if is_blank(value) else str(value)


def format_int(value: Any) -> str:
    return BLANK if is_blank(value) else str(int(value))


def format_batch(batch_size: Any, retried_from: Any = None) -> str:
    """A batch size, and the one it was retried from after running out of memory:
    ``"8 (retried from 16)"``."""
    if is_blank(retried_from):
        return format_int(batch_size)
    origins = [format_int(float(v)) for v in str(retried_from).split(",") if v.strip()]
    return f"{format_int(batch_size)} (retried from {', '.join(origins)})"


def format_samples_per_s(value: Any) -> str:
    return BLANK if is_blank(value) else f"{float(value):.1f}"


def format_rate(samples_per_s: Any, trials: Any) -> str:
    """A throughput with its number of ok trials, e.g. ``"185.3 (n=3)"``."""
    n = 0 if is_blank(trials) else int(trials)
    value = BLANK if is_blank(samples_per_s) or n == 0 else f"{float(samples_per_s):.1f}"
    return f"{value} (n={n})"


def format_rate_interval(median: Any, low: Any, high: Any, confidence: Any, trials: Any) -> str:
    """A median throughput with its interval and ok trials, e.g. ``"110.0 [100.0–120.0] (n=9)"``.

    The interval's coverage is shown when it falls short of the requested 95 % (few trials:
    ``"[100.0–120.0, 75%]"``); one trial has no interval.
    """
    n = 0 if is_blank(trials) else int(trials)
    if is_blank(median) or n == 0:
        return f"{BLANK} (n={n})"
    if is_blank(low) or is_blank(high) or is_blank(confidence) or float(confidence) <= 0:
        return f"{format_samples_per_s(median)} [no interval] (n={n})"
    coverage = "" if float(confidence) >= CONFIDENCE else f", {float(confidence):.0%}"
    interval = f"{format_samples_per_s(low)}–{format_samples_per_s(high)}{coverage}"
    return f"{format_samples_per_s(median)} [{interval}] (n={n})"


def format_speedup(speedup: Any) -> str:
    """A ratio as ``"×1.48 (+48%)"``."""
    if is_blank(speedup):
        return BLANK
    ratio = float(speedup)
    return f"×{ratio:.2f} ({(ratio - 1) * 100:+.0f}%)"


def format_speedup_interval(speedup: Any, low: Any, high: Any, confidence: Any = None) -> str:
    """A ratio with its interval, e.g. ``"×1.50 (+50%) [1.25–1.80]"``; where the interval's
    achieved confidence falls short of the requested 95 % it is shown:
    ``"×1.34 (+34%) [1.10–1.52] 90%"``."""
    if is_blank(speedup):
        return BLANK
    if is_blank(low) or is_blank(high):
        return f"{format_speedup(speedup)} [no interval]"
    achieved = math.nan if is_blank(confidence) else float(confidence)
    note = stats.confidence_note(CONFIDENCE, achieved)
    interval = f"{format_speedup(speedup)} [{float(low):.2f}–{float(high):.2f}]"
    return f"{interval} {note}" if note else interval


def format_published(speedup: Any, baseline: Any, candidate: Any) -> str:
    """The published figure, e.g. ``"×1.48 (+48%); 125.0 → 185.0 samples/s"``."""
    parts = [] if is_blank(speedup) else [format_speedup(speedup)]
    if not is_blank(baseline) and not is_blank(candidate):
        rates = f"{format_samples_per_s(baseline)} → {format_samples_per_s(candidate)}"
        parts.append(f"{rates} samples/s")
    return "; ".join(parts) or BLANK


def format_verdict(verdict: Any, reason: Any) -> str:
    return format_text(verdict) if is_blank(reason) else f"{verdict}: {reason}"


def format_seconds(value: Any) -> str:
    return BLANK if is_blank(value) else f"{float(value):.2f} s"


def format_compile_time(total: Any, cold: Any = None, warm: Any = None) -> str:
    """The first step's one-off cost beyond eager's, e.g. ``"12.30 s"``; with the compiler
    cache's kinds apart where records give them: ``"12.30 s (cold 30.10 s, warm 3.20 s)"``."""
    if is_blank(total):
        return BLANK
    kinds = [
        f"{kind} {format_seconds(value)}"
        for kind, value in (("cold", cold), ("warm", warm))
        if not is_blank(value)
    ]
    return format_seconds(total) + (f" ({', '.join(kinds)})" if kinds else "")


def format_compiler_counts(graphs: Any, breaks: Any, recompilations: Any) -> str:
    """What the compiler did, as ``graphs / graph breaks / recompilations``: ``"3 / 2 / 0"``
    (medians over ok trials, so also ``"1.5 / 0 / 0"``); blank for a cell that did not compile."""
    counts = (graphs, breaks, recompilations)
    if all(is_blank(count) for count in counts):
        return BLANK
    return " / ".join(BLANK if is_blank(count) else f"{float(count):g}" for count in counts)


def format_mib(value_bytes: Any) -> str:
    return BLANK if is_blank(value_bytes) else f"{float(value_bytes) / BYTES_PER_MIB:.1f} MiB"


def format_fraction_as_percent(value: Any) -> str:
    return BLANK if is_blank(value) else format_percent(value, 1)


def format_percent(fraction: float, digits: int = 0) -> str:
    """A fraction as a percentage with ``digits`` decimals: ``0.05`` → ``"5%"``."""
    return f"{float(fraction):.{digits}%}"


def format_percentages(fractions: Mapping[str, float], digits: int = 1) -> str:
    """Named fractions as percentages: ``{"fp32": 0.005, "bf16": 0.05}`` → ``"fp32 0.5%, bf16
    5.0%"``."""
    return ", ".join(f"{name} {format_percent(value, digits)}" for name, value in fractions.items())


def format_number(value: float, spec: str = "g") -> str:
    """A number in a format spec, by default its shortest form: ``3.0`` → ``"3"``."""
    return format(value, spec)


def plural(count: int, noun: str) -> str:
    """``1 rerun``, ``2 reruns``, ``0 reruns``."""
    return f"{count} {noun}{'' if count == 1 else 's'}"


def markdown_table(headers: Sequence[str], rows: Sequence[Sequence[str]]) -> str:
    """A Markdown table of text cells (pipes escaped, line breaks folded)."""

    def line(cells: Sequence[str]) -> str:
        return (
            "| " + " | ".join(" ".join(c.split()).replace("|", "\\|") or " " for c in cells) + " |"
        )

    rule = "|" + "|".join(" --- " for _ in headers) + "|"
    return "\n".join([line(headers), rule, *map(line, rows)]) + "\n"
