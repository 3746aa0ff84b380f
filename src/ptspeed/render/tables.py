"""The report's tables: a :class:`Column` per shown column, and the column lists of each table.

A column is a spec: its header, the function that formats its cell from one row (a mapping,
e.g. a record of an aggregated CSV), its alignment, whether its text may wrap and where its
text splits into a headline and a detail. A :class:`Table` is built from a list of columns
and the rows' mappings, so a header, its cells, its alignment and its wrapping cannot drift
apart; the templates read all of them from the columns.

Every table of the page fits a 1280 px window (tests/test_report_browser.py measures it):
headers wrap, prose columns wrap, and a table that would be wider is split (the summary's
throughput apart from its first steps and memory) rather than scrolled.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Literal

from ptspeed.analysis.columns import COMPILER_COUNTS
from ptspeed.analysis.trial_readings import other_cpu_share
from ptspeed.analysis.versions import VersionTable
from ptspeed.render.formatting import (
    BLANK,
    format_batch,
    format_compile_time,
    format_compiler_counts,
    format_fraction_as_percent,
    format_int,
    format_mib,
    format_published,
    format_rate,
    format_rate_interval,
    format_samples_per_s,
    format_seconds,
    format_speedup,
    format_speedup_interval,
    format_text,
    format_verdict,
    is_blank,
    is_true,
    plural,
)

Row = Mapping[str, Any]


@dataclass(frozen=True)
class Column:
    """One table column: ``value`` formats its cell from a row; ``align`` right for numbers;
    ``wrap`` for prose that may wrap (on a wide screen the other columns keep to one line);
    ``detail_after``: where a cell's text splits into its headline and a detail that the page
    shows smaller on a line of its own (a verdict, then its reason); the Markdown and the text
    of the cell stay whole."""

    header: str
    value: Callable[[Row], str]
    align: Literal["left", "right"] = "left"
    wrap: bool = False
    detail_after: str = ""


class LinkedText(str):
    """A cell's text with links under it (label, href relative to the page): the page shows
    them as anchors on a smaller line, the Markdown as ``[label](href)`` after the text."""

    links: tuple[tuple[str, str], ...]

    def __new__(cls, text: str, links: Iterable[tuple[str, str]] = ()) -> LinkedText:
        cell = super().__new__(cls, text)
        cell.links = tuple(links)
        return cell


@dataclass(frozen=True)
class Table:
    """Formatted cells, one per column in every row."""

    columns: Sequence[Column]
    rows: Sequence[Sequence[str]] = field(default_factory=list)

    def __post_init__(self) -> None:
        widths = {len(row) for row in self.rows} - {len(self.columns)}
        if widths:
            raise ValueError(f"{len(self.columns)} columns but rows of {sorted(widths)} cells")

    @classmethod
    def of(cls, columns: Sequence[Column], rows: Iterable[Row]) -> Table:
        """Each row's cells, as ``columns`` format them."""
        return cls(columns, [[column.value(row) for column in columns] for row in rows])

    @property
    def headers(self) -> list[str]:
        return headers(self.columns)


def headers(columns: Sequence[Column]) -> list[str]:
    return [column.header for column in columns]


def text(key: str) -> Callable[[Row], str]:
    """The row's ``key`` as text (blank: —)."""
    return lambda row: format_text(row[key])


def integer(key: str) -> Callable[[Row], str]:
    return lambda row: format_int(row[key])


def given(key: str) -> Callable[[Row], str]:
    """The row's ``key``, already formatted."""
    return lambda row: str(row[key])


def _batch(row: Row) -> str:
    return format_batch(row["batch_size"], row.get("retried_from_batch_size"))


def _median(row: Row) -> str:
    return format_rate_interval(
        row["median_samples_per_s"],
        row["median_low"],
        row["median_high"],
        row["median_confidence"],
        row["ok_trials"],
    )


def compiler_counts(prefix: str = "") -> Callable[[Row], str]:
    """A cell's compiler counts (the summary's medians; ``prefix``: a speedups side's)."""
    return lambda row: format_compiler_counts(
        *(row[f"{prefix}median_{name}"] for name in COMPILER_COUNTS)
    )


CELL_COLUMNS = [Column(key, text(key)) for key in ("env", "model", "variant", "mode")]
CV = Column("cv", lambda row: format_fraction_as_percent(row["cv"]), align="right")
COMPILER_HEADER = "graphs / breaks / recompiles"

# --- the seed table and the claims ---------------------------------------------------------------


def _speedup(row: Row) -> str:
    """The speedup with its interval and, after ``; ``, each side that counted fewer trials
    than configured and why (``baseline 3 of 5 trials counted (2 perturbed …)``)."""
    shown = format_speedup_interval(
        row["speedup"], row["speedup_low"], row["speedup_high"], row["speedup_confidence"]
    )
    short = [
        f"{side} {row[f'{side}_uncounted']}"
        for side in ("baseline", "candidate")
        if not is_blank(row.get(f"{side}_uncounted"))
    ]
    return "; ".join([shown, *short])


def _published(row: Row) -> str:
    return format_published(
        row["published_speedup"], row["published_baseline"], row["published_candidate"]
    )


def _side_rate(side: str) -> Column:
    def value(row: Row) -> str:
        return format_rate(row[f"{side}_samples_per_s"], row[f"{side}_trials"])

    return Column(f"{side} samples/s", value, align="right")


def _sides_compiler_counts(row: Row) -> str:
    """The candidate's compiler counts, after the baseline's where it compiled too."""
    baseline, candidate = compiler_counts("baseline_")(row), compiler_counts("candidate_")(row)
    return candidate if baseline == BLANK else f"{baseline} → {candidate}"


SPEEDUP_HEADER = "speedup [interval]"
_SEED_PLACE = [
    Column("model", text("model")),
    Column("mode", text("mode")),
    Column("batch", integer("batch_size"), align="right"),
]
_SEED_MEASURED = [
    _side_rate("baseline"),
    _side_rate("candidate"),
    Column(SPEEDUP_HEADER, _speedup, align="right", wrap=True, detail_after="; "),
]
_SEED_CLAIMED = [
    Column("published", _published, wrap=True, detail_after="; "),
    Column(
        "verdict",
        lambda row: format_verdict(row["verdict"], row["verdict_reason"]),
        wrap=True,
        detail_after=": ",
    ),
]
SEED_TABLE = [*_SEED_PLACE, *_SEED_MEASURED, *_SEED_CLAIMED]
# A comparison whose candidate compiled: what the compiler did, beside the speedup.
COMPILED_SEED_TABLE = [
    *_SEED_PLACE,
    *_SEED_MEASURED,
    Column(COMPILER_HEADER, _sides_compiler_counts, align="right", wrap=True),
    *_SEED_CLAIMED,
]
PLATFORM = Column("platform", text("platform"))


def seed_table_by_platform(compiled: bool) -> list[Column]:
    """The seed table of a run on several platforms: a row per model, mode and platform
    (:func:`rows_by_platform`), the platform after the batch; as narrow as one platform's."""
    columns = COMPILED_SEED_TABLE if compiled else SEED_TABLE
    return [*_SEED_PLACE, PLATFORM, *columns[len(_SEED_PLACE) :]]


def rows_by_platform(records: Sequence[Row], platforms: Sequence[str]) -> list[Row]:
    """Speedups rows of several platforms, each model and mode's platforms together, in the
    order of ``platforms``."""
    order = {platform: position for position, platform in enumerate(platforms)}
    places = list(dict.fromkeys((record["model"], record["mode"]) for record in records))
    return sorted(
        records,
        key=lambda r: (places.index((r["model"], r["mode"])), order.get(r["platform"], -1)),
    )


CLAIMS_TABLE = [
    Column("claim", given("claim")),
    Column("source", text("source"), wrap=True),
    Column("claimed on", text("device"), wrap=True),
    Column("precision", text("precision"), wrap=True),
    Column("checked by", lambda row: ", ".join(row["comparisons"]) or BLANK),
    Column("verdicts", given("verdicts"), wrap=True),
]

# --- every cell ----------------------------------------------------------------------------------


def _trials(row: Row) -> str:
    return f"{format_int(row['trials'])} ({format_text(row['statuses'])})"


def _spread(row: Row) -> str:
    low, high = row["min_samples_per_s"], row["max_samples_per_s"]
    return BLANK if is_blank(low) else f"{format_samples_per_s(low)}–{format_samples_per_s(high)}"


def _perturbed(row: Row) -> str:
    """Perturbed ok trials and by what, and how many reruns the cell got: ``"1 (other
    processes: 1); 1 rerun"``."""
    count = row.get("perturbed_trials")
    if is_blank(count):
        return BLANK
    reasons = row.get("perturbed_reasons")
    shown = format_int(count) + ("" if is_blank(reasons) or not count else f" ({reasons})")
    reruns = row.get("reruns")
    return shown if is_blank(reruns) or not reruns else f"{shown}; {plural(int(reruns), 'rerun')}"


def _cv(row: Row) -> str:
    """The cv, and whether it makes the cell noisy: ``"12.9% noisy"``."""
    cv = format_fraction_as_percent(row["cv"])
    return f"{cv} noisy" if is_true(row["noisy"]) else cv


def _compile_time(row: Row) -> str:
    return format_compile_time(
        row["compile_time_s"], row["compile_time_cold_s"], row["compile_time_warm_s"]
    )


# A cell's sizes: those its model does not use are blank (ptspeed.analysis.columns.unused_sizes).
SIZE_COLUMNS = [
    Column("batch", _batch, align="right"),
    Column("image", integer("image_size"), align="right"),
    Column("seq", integer("seq_len"), align="right"),
]
MEDIAN_HEADER = "median samples/s [interval]"
# Every cell, in two tables that each fit the page: its throughput, then its first step,
# compilation and memory.
SUMMARY_TABLE = [
    *CELL_COLUMNS,
    *SIZE_COLUMNS,
    Column("trials", _trials, wrap=True),
    Column(MEDIAN_HEADER, _median, align="right", wrap=True),
    Column("min–max samples/s", _spread, align="right"),
    Column("cv", _cv, align="right", detail_after=" "),
    Column("perturbed trials", _perturbed, wrap=True),
]
FIRST_STEP_TABLE = [
    *CELL_COLUMNS,
    *SIZE_COLUMNS,
    Column("first step", lambda row: format_seconds(row["median_first_step_s"]), align="right"),
    Column("compile time", _compile_time, align="right"),
    Column(COMPILER_HEADER, compiler_counts(), align="right"),
    Column("peak memory", lambda row: format_mib(row["median_peak_memory_bytes"]), align="right"),
]

# --- energy ------------------------------------------------------------------------------------


def _joules(row: Row) -> str:
    median, low, high = (row[k] for k in ("median_joules_per_sample", "joules_low", "joules_high"))
    if is_blank(median):
        return BLANK
    interval = "no interval" if is_blank(low) else f"{float(low):.3g}–{float(high):.3g}"
    return f"{float(median):.3g} J [{interval}]"


def _energy_ratio(row: Row) -> str:
    return format_speedup_interval(
        row["energy_ratio"], row["energy_ratio_low"], row["energy_ratio_high"]
    )


ENERGY_TABLE = [
    *CELL_COLUMNS,
    Column("batch", _batch, align="right"),
    Column("joules / sample [interval]", _joules, align="right"),
]
ENERGY_RATIO_TABLE = [
    Column("comparison", text("title")),
    Column("model", text("model")),
    Column("speedup", _speedup, align="right"),
    Column("energy / sample, candidate ÷ baseline", _energy_ratio, align="right"),
]

# --- suites --------------------------------------------------------------------------------------


def _pass_rate(row: Row) -> str:
    return f"{format_fraction_as_percent(row['pass_rate'])} ({row['passed']} of {row['models']})"


def _geomean(row: Row) -> str:
    return format_speedup_interval(row["geomean_speedup"], row["geomean_low"], row["geomean_high"])


def _memory_ratio(row: Row) -> str:
    ratio = row["memory_ratio"]
    return BLANK if is_blank(ratio) else f"×{float(ratio):.2f}"


SUITE_TABLE = [
    Column("suite", text("suite")),
    Column("comparison", text("title")),
    Column("platform", text("platform")),
    Column("mode", text("mode")),
    Column("pass rate", _pass_rate, align="right"),
    Column("geometric-mean speedup", _geomean, align="right"),
    Column("median compile time", lambda row: format_seconds(row["median_compile_time_s"])),
    Column("memory, candidate ÷ baseline", _memory_ratio, align="right"),
    Column("failures by reason", text("failures"), wrap=True),
]

# --- failures, retried and noisy cells -----------------------------------------------------------


def _reason(row: Row) -> str:
    reason = format_text(row["reason"])
    if not is_blank(row.get("fault")):
        reason += f" [injected fault: {row['fault']}]"
    return reason


def _record_columns(batch: Column) -> list[Column]:
    """The columns of a list of records, with ``batch`` as the batch size's column."""
    return [
        *CELL_COLUMNS,
        batch,
        Column("trial", integer("trial"), align="right"),
        Column("status", text("status")),
        Column("reason", _reason, wrap=True),
    ]


FAILURES_TABLE = _record_columns(Column("batch", _batch, align="right"))
# Every batch here reads "8 (retried from 16)": prose that may wrap.
RETRIED_TABLE = _record_columns(Column("batch", _batch, wrap=True))


def _other_share(row: Row) -> str:
    return format_fraction_as_percent(other_cpu_share(row))


PERTURBED_TABLE = [
    *CELL_COLUMNS,
    Column("batch", _batch, align="right"),
    Column("trial", integer("trial"), align="right"),
    Column("rerun of", integer("rerun_of"), align="right"),
    Column("samples/s", lambda row: format_samples_per_s(row["throughput_samples_per_s"])),
    Column("others' CPU share", _other_share, align="right"),
    Column("why perturbed", text("perturbed_reason"), wrap=True),
]

NOISY_TABLE = [
    *CELL_COLUMNS,
    Column("batch", integer("batch_size"), align="right"),
    Column("median samples/s", _median, align="right"),
    CV,
    Column("reason", text("noisy_reason"), wrap=True),
]

# --- across torch versions -----------------------------------------------------------------------


def version_columns(table: VersionTable) -> list[Column]:
    """The cell, then each environment's median samples/s, oldest torch first; beyond a row's
    oldest, with its ratio to it. Rows: :func:`version_rows`."""
    return [
        Column("model", text("model")),
        Column("variant", text("variant")),
        Column("mode", text("mode")),
        Column("batch", integer("batch_size"), align="right"),
        *(_version_rate(env, table.torch[env]) for env in table.envs),
    ]


def version_rows(table: VersionTable) -> list[dict[str, Any]]:
    return [
        {**row.cell, "rates": row.rates, "trials": row.trials, "ratios": row.ratios}
        for row in table.rows
    ]


def _version_rate(env: str, torch: str) -> Column:
    def value(row: Row) -> str:
        if env not in row["rates"]:
            return BLANK
        rate = format_rate(row["rates"][env], row["trials"][env])
        oldest = next(iter(row["rates"]))
        return rate if env == oldest else f"{rate} {format_speedup(row['ratios'][env])}"

    return Column(f"{env} (torch {torch}) samples/s", value, align="right")
