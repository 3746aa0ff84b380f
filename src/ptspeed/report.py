"""The report: the aggregated tables rendered as one self-contained HTML page and Markdown.

The page is a list of :class:`Section` objects, each a title, a short text and tables of
already formatted strings; both templates render any section the same way. To grow the report,
write a function that returns a :class:`Section` and add it to :data:`SECTION_BUILDERS`.

Every number on the page is a value of the aggregated CSVs passed through one of the
``format_*`` functions below, so the page and the tables cannot disagree, and every measured
throughput is shown with its number of ok trials.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import jinja2
import pandas as pd

from ptspeed.aggregate import RUNS_COLUMNS, SPEEDUP_COLUMNS, SUMMARY_COLUMNS, UNREADABLE
from ptspeed.record import write_atomic

REPO_TEMPLATES_DIR = Path(__file__).resolve().parents[2] / "report" / "templates"
HTML_TEMPLATE = "index.html.j2"
MARKDOWN_TEMPLATE = "report.md.j2"
BLANK = "—"
BYTES_PER_MIB = 1024 * 1024


# --- formatting ----------------------------------------------------------------------------------


def is_blank(value: Any) -> bool:
    """True for None, NA, NaN and the empty string."""
    if value is None or value is pd.NA or (isinstance(value, str) and not value.strip()):
        return True
    return isinstance(value, float) and math.isnan(value)


def format_text(value: Any) -> str:
    return BLANK if is_blank(value) else str(value)


def format_int(value: Any) -> str:
    return BLANK if is_blank(value) else str(int(value))


def format_rate(samples_per_s: Any, trials: Any) -> str:
    """A throughput with its number of ok trials, e.g. ``"185.3 (n=3)"``."""
    n = 0 if is_blank(trials) else int(trials)
    value = BLANK if is_blank(samples_per_s) or n == 0 else f"{float(samples_per_s):.1f}"
    return f"{value} (n={n})"


def format_samples_per_s(value: Any) -> str:
    return BLANK if is_blank(value) else f"{float(value):.1f}"


def format_speedup(speedup: Any) -> str:
    """A ratio as ``"×1.48 (+48%)"``."""
    if is_blank(speedup):
        return BLANK
    ratio = float(speedup)
    return f"×{ratio:.2f} ({(ratio - 1) * 100:+.0f}%)"


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


def format_mib(value_bytes: Any) -> str:
    return BLANK if is_blank(value_bytes) else f"{float(value_bytes) / BYTES_PER_MIB:.1f} MiB"


def format_fraction_as_percent(value: Any) -> str:
    return BLANK if is_blank(value) else f"{float(value) * 100:.1f}%"


# --- page structure ------------------------------------------------------------------------------


@dataclass(frozen=True)
class Table:
    """Formatted cells; ``numeric`` holds the indexes of right-aligned columns."""

    headers: Sequence[str]
    rows: Sequence[Sequence[str]]
    numeric: frozenset[int] = frozenset()


@dataclass(frozen=True)
class Block:
    """One table with an optional heading and note above it."""

    table: Table
    heading: str = ""
    note: str = ""


@dataclass(frozen=True)
class Section:
    id: str
    title: str
    intro: str
    blocks: Sequence[Block] = field(default_factory=list)


@dataclass(frozen=True)
class ReportInputs:
    runs: pd.DataFrame
    summary: pd.DataFrame
    speedups: pd.DataFrame
    config: Mapping[str, Any]
    claims: Mapping[str, Any]


# --- sections ------------------------------------------------------------------------------------

SEED_HEADERS = [
    "model",
    "mode",
    "batch",
    "baseline samples/s",
    "candidate samples/s",
    "speedup",
    "published",
    "verdict",
]


def seed_section(inputs: ReportInputs) -> Section:
    frame = inputs.speedups
    blocks = [
        _comparison_block(frame[frame["comparison"] == name], inputs.claims)
        for name in dict.fromkeys(frame["comparison"])
    ]
    return Section(
        id="seed-table",
        title="The seed table, measured",
        intro=(
            "Median throughput over the ok trials of each side (n = ok trials); "
            "speedup = candidate median / baseline median."
        ),
        blocks=blocks,
    )


def _comparison_block(rows: pd.DataFrame, claims: Mapping[str, Any]) -> Block:
    first = rows.iloc[0]
    table = Table(
        headers=SEED_HEADERS,
        rows=[_seed_row(row) for row in rows.to_dict("records")],
        numeric=frozenset({2, 3, 4, 5}),
    )
    sides = (
        f"baseline {first['baseline_env']}/{first['baseline_variant']} → "
        f"candidate {first['candidate_env']}/{first['candidate_variant']}"
    )
    return Block(
        table=table, heading=format_text(first["title"]), note=_claim_note(sides, first, claims)
    )


def _claim_note(sides: str, row: Mapping[str, Any], claims: Mapping[str, Any]) -> str:
    group = row["claim"]
    if is_blank(group):
        return f"{sides}. No published claim."
    source = claims.get(group, {})
    details = ", ".join(format_text(source.get(k)) for k in ("source", "setup") if source.get(k))
    return f"{sides}. Published: {group}" + (f" ({details})." if details else ".")


def _seed_row(row: Mapping[str, Any]) -> list[str]:
    return [
        format_text(row["model"]),
        format_text(row["mode"]),
        format_int(row["batch_size"]),
        format_rate(row["baseline_samples_per_s"], row["baseline_trials"]),
        format_rate(row["candidate_samples_per_s"], row["candidate_trials"]),
        format_speedup(row["speedup"]),
        format_published(
            row["published_speedup"], row["published_baseline"], row["published_candidate"]
        ),
        format_verdict(row["verdict"], row["verdict_reason"]),
    ]


SUMMARY_HEADERS = [
    "env",
    "model",
    "variant",
    "mode",
    "batch",
    "image",
    "seq",
    "trials",
    "median samples/s",
    "min–max samples/s",
    "cv",
    "first step",
    "peak memory",
]


def summary_section(inputs: ReportInputs) -> Section:
    table = Table(
        headers=SUMMARY_HEADERS,
        rows=[_summary_row(row) for row in inputs.summary.to_dict("records")],
        numeric=frozenset(range(4, 13)),
    )
    return Section(
        id="summary",
        title="Every cell",
        intro=(
            "One row per environment, model, variant, mode and size. Statistics use the ok "
            "trials; cv is the standard deviation over the mean of their throughputs."
        ),
        blocks=[Block(table=table)],
    )


def _summary_row(row: Mapping[str, Any]) -> list[str]:
    low, high = row["min_samples_per_s"], row["max_samples_per_s"]
    spread = BLANK if is_blank(low) else f"{format_samples_per_s(low)}–{format_samples_per_s(high)}"
    return [
        *(format_text(row[k]) for k in ("env", "model", "variant", "mode")),
        *(format_int(row[k]) for k in ("batch_size", "image_size", "seq_len")),
        f"{format_int(row['trials'])} ({format_text(row['statuses'])})",
        format_rate(row["median_samples_per_s"], row["ok_trials"]),
        spread,
        format_fraction_as_percent(row["cv"]),
        format_seconds(row["median_first_step_s"]),
        format_mib(row["median_peak_memory_bytes"]),
    ]


FAILURE_HEADERS = ["env", "model", "variant", "mode", "trial", "status", "reason"]


def failures_section(inputs: ReportInputs) -> Section:
    runs = inputs.runs
    not_ok = runs[runs["status"] != "ok"]
    table = Table(
        headers=FAILURE_HEADERS,
        rows=[_failure_row(row) for row in not_ok.to_dict("records")],
        numeric=frozenset({4}),
    )
    return Section(
        id="failures",
        title="Failures and unsupported cells",
        intro="Every record whose status is not ok, with its reason.",
        blocks=[Block(table=table)],
    )


def _failure_row(row: Mapping[str, Any]) -> list[str]:
    return [
        *(format_text(row[k]) for k in ("env", "model", "variant", "mode")),
        format_int(row["trial"]),
        format_text(row["status"]),
        format_text(row["reason"]),
    ]


ENVIRONMENT_FIELDS = {
    "torch": "torch",
    "cuda": "cuda",
    "device": "device_name",
    "cpu": "cpu_model",
    "threads": "torch_threads",
    "container image": "container_image",
}


def environments_section(inputs: ReportInputs) -> Section:
    runs = inputs.runs
    readable = runs[(runs["status"] != UNREADABLE) & runs["env"].notna()]
    configured = inputs.config.get("environments") or {}
    rows = [
        _environment_row(env, (configured.get(env) or {}).get("kind"), records)
        for env, records in readable.groupby("env", sort=True)
    ]
    table = Table(headers=["env", "kind", "records", *ENVIRONMENT_FIELDS], rows=rows)
    return Section(
        id="environments",
        title="Environments",
        intro="What each environment really was, as its records report it.",
        blocks=[Block(table=table)],
    )


def _environment_row(env: str, kind: Any, records: pd.DataFrame) -> list[str]:
    values = [_distinct(records[column]) for column in ENVIRONMENT_FIELDS.values()]
    return [env, format_text(kind), str(len(records)), *values]


def _distinct(values: pd.Series) -> str:
    texts = [format_int(v) if isinstance(v, float) else str(v) for v in values if not is_blank(v)]
    return ", ".join(dict.fromkeys(texts)) or BLANK


SECTION_BUILDERS: list[Callable[[ReportInputs], Section]] = [
    seed_section,
    summary_section,
    failures_section,
    environments_section,
]


def build_sections(inputs: ReportInputs) -> list[Section]:
    return [build(inputs) for build in SECTION_BUILDERS]


# --- rendering -----------------------------------------------------------------------------------


def render(
    runs: pd.DataFrame,
    summary: pd.DataFrame,
    speedups: pd.DataFrame,
    config: Mapping[str, Any],
    claims: Mapping[str, Any],
    out_dir: str | Path,
    templates_dir: str | Path | None = None,
) -> list[Path]:
    """Write ``index.html`` and ``report.md`` into ``out_dir``; return their paths.

    Raises ValueError when a table lacks a column the report shows (extra columns are fine).
    """
    check_columns(runs, RUNS_COLUMNS, "runs")
    check_columns(summary, SUMMARY_COLUMNS, "summary")
    check_columns(speedups, SPEEDUP_COLUMNS, "speedups")
    inputs = ReportInputs(runs, summary, speedups, config, claims)
    sections = build_sections(inputs)
    environment = template_environment(templates_dir)
    outputs = {"index.html": HTML_TEMPLATE, "report.md": MARKDOWN_TEMPLATE}
    written = []
    for filename, template in outputs.items():
        text = environment.get_template(template).render(sections=sections)
        path = Path(out_dir) / filename
        write_atomic(path, text)
        written.append(path)
    return written


def check_columns(frame: pd.DataFrame, required: Sequence[str], name: str) -> None:
    missing = [column for column in required if column not in frame.columns]
    if missing:
        raise ValueError(f"{name} table lacks columns: {', '.join(missing)}")


def template_environment(templates_dir: str | Path | None = None) -> jinja2.Environment:
    """Jinja environment over ``templates_dir`` (default: the repository's report/templates)."""
    directory = Path(templates_dir) if templates_dir is not None else REPO_TEMPLATES_DIR
    if not (directory / HTML_TEMPLATE).is_file():
        raise FileNotFoundError(f"no report templates in {directory}")
    environment = jinja2.Environment(
        loader=jinja2.FileSystemLoader(directory),
        autoescape=jinja2.select_autoescape(enabled_extensions=("html.j2",)),
        undefined=jinja2.StrictUndefined,
        keep_trailing_newline=True,
        trim_blocks=True,
        lstrip_blocks=True,
    )
    environment.filters["md"] = markdown_cell
    return environment


def markdown_cell(text: Any) -> str:
    """Text safe inside a Markdown table cell: no pipes or line breaks."""
    return " ".join(str(text).split()).replace("|", "\\|")
