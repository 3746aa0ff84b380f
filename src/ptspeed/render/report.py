"""The report: the aggregated tables rendered as one self-contained HTML page and Markdown.

The page is a list of :class:`Section` objects, each a title, a short text and blocks: tables of
already formatted strings, or charts (:mod:`ptspeed.render.figures`, embedded as PNG data URIs).
Both templates render any section the same way; the Markdown version carries the tables and names
the figures. To grow the report, write a function that returns a :class:`Section` and add it to
:data:`SECTION_BUILDERS`.

Every number on the page is a value of the aggregated CSVs passed through one of the
``format_*`` functions below, so the page and the tables cannot disagree, and every measured
value is shown with the number of ok trials it came from (``n=``).
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import jinja2
import pandas as pd

from ptspeed.analysis import late_numerics, ranks, stats
from ptspeed.analysis.columns import (
    ALPHA,
    CONFIDENCE,
    RUNS_COLUMNS,
    SPEEDUP_COLUMNS,
    STEPS_COLUMNS,
    SUMMARY_COLUMNS,
)
from ptspeed.analysis.summary import status_counts
from ptspeed.cell.numerics import EAGER_ERROR_MULTIPLIER, TOLERANCES
from ptspeed.cell.record import write_atomic
from ptspeed.render.figures import (
    FIRST_STEP,
    PEAK_MEMORY,
    THROUGHPUT,
    Chart,
    cell_dots,
    forest_plot,
    step_time_boxes,
)

REPO_TEMPLATES_DIR = Path(__file__).resolve().parents[3] / "report" / "templates"
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


def format_mib(value_bytes: Any) -> str:
    return BLANK if is_blank(value_bytes) else f"{float(value_bytes) / BYTES_PER_MIB:.1f} MiB"


def format_fraction_as_percent(value: Any) -> str:
    return BLANK if is_blank(value) else f"{float(value) * 100:.1f}%"


def format_flag(value: Any) -> str:
    return "yes" if is_true(value) else ""


# --- page structure ------------------------------------------------------------------------------


@dataclass(frozen=True)
class Table:
    """Formatted cells; ``numeric`` holds the indexes of right-aligned columns, ``wrap`` those of
    prose columns that may wrap (on a wide screen the others keep to one line)."""

    headers: Sequence[str]
    rows: Sequence[Sequence[str]]
    numeric: frozenset[int] = frozenset()
    wrap: frozenset[int] = frozenset()


@dataclass(frozen=True)
class Block:
    """One table or one chart, with an optional heading and note above it."""

    table: Table | None = None
    heading: str = ""
    note: str = ""
    chart: Chart | None = None


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
    steps: pd.DataFrame | None = None


def chart_block(draw: Callable[[], Chart | None], heading: str, nothing: str) -> Block:
    """A chart, or a note saying why there is none; a figure that fails to draw never stops
    the report."""
    try:
        chart = draw()
    except Exception as error:  # plotting odd data must not cost the tables
        return Block(heading=heading, note=f"Figure not drawn: {type(error).__name__}: {error}")
    if chart is None:
        return Block(heading=heading, note=f"Nothing to draw: {nothing}.")
    return Block(heading=heading, note=chart.note, chart=chart)


# --- sections ------------------------------------------------------------------------------------

SEED_HEADERS = [
    "model",
    "mode",
    "batch",
    "baseline samples/s",
    "candidate samples/s",
    "speedup [interval, 95% unless stated]",
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
            "Median throughput over the ok trials of each side (n = ok trials); speedup = the "
            "median of the candidate / baseline ratios of all trial pairs (Hodges–Lehmann), "
            "with its exact distribution-free interval: 95% where the trials allow it, else the "
            "confidence it has, shown beside it (e.g. 90% with 3 trials a side). A verdict "
            "compares the published speedup with that interval, on the device and precision "
            "named."
        ),
        blocks=blocks,
    )


def _comparison_block(rows: pd.DataFrame, claims: Mapping[str, Any]) -> Block:
    first = rows.iloc[0]
    table = Table(
        headers=SEED_HEADERS,
        rows=[_seed_row(row) for row in rows.to_dict("records")],
        numeric=frozenset({2, 3, 4, 5}),
        wrap=frozenset({6, 7}),
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
    source = claims.get(group) if isinstance(claims.get(group), Mapping) else {}
    details = ", ".join(format_text(source.get(k)) for k in ("source", "setup") if source.get(k))
    claimed_on = [
        f"{label} {format_text(row[column])}"
        for label, column in (("device", "claim_device"), ("precision", "claim_precision"))
        if not is_blank(row[column])
    ]
    note = f"{sides}. Published: {group}" + (f" ({details})" if details else "")
    return note + (f"; claimed on {', '.join(claimed_on)}." if claimed_on else ".")


def _seed_row(row: Mapping[str, Any]) -> list[str]:
    return [
        format_text(row["model"]),
        format_text(row["mode"]),
        format_int(row["batch_size"]),
        format_rate(row["baseline_samples_per_s"], row["baseline_trials"]),
        format_rate(row["candidate_samples_per_s"], row["candidate_trials"]),
        format_speedup_interval(
            row["speedup"], row["speedup_low"], row["speedup_high"], row["speedup_confidence"]
        ),
        format_published(
            row["published_speedup"], row["published_baseline"], row["published_candidate"]
        ),
        format_verdict(row["verdict"], row["verdict_reason"]),
    ]


CLAIM_HEADERS = ["claim", "source", "claimed on", "precision", "checked by", "verdicts"]


def claims_section(inputs: ReportInputs) -> Section:
    frame = inputs.speedups
    rows = [
        _claim_row(name, group, frame[frame["claim"] == name])
        for name, group in inputs.claims.items()
        if isinstance(group, Mapping)
    ]
    forest = chart_block(
        lambda: forest_plot(inputs.speedups), "Speedups", "no comparison has a measured speedup"
    )
    claims_table = Table(CLAIM_HEADERS, rows, wrap=frozenset({1, 2, 3, 5}))
    return Section(
        id="claims",
        title="Speedups against the published claims",
        intro=(
            "Every measured speedup with its interval (95%, or the lower confidence too few "
            "trials give, as the seed table states; n = ok trials of baseline/candidate); a "
            "published claim holds on this machine when its figure falls inside the interval."
        ),
        blocks=[forest, Block(table=claims_table, heading="Claims")],
    )


def _claim_row(name: str, group: Mapping[str, Any], rows: pd.DataFrame) -> list[str]:
    comparisons = list(dict.fromkeys(rows["comparison"]))
    verdicts = (
        "; ".join(
            f"{verdict}: {count}" for verdict, count in rows["verdict"].value_counts().items()
        )
        if comparisons
        else "not measured: no comparison in the configuration checks this claim"
    )
    return [
        name,
        format_text(group.get("source")),
        format_text(group.get("device")),
        format_text(group.get("precision")),
        ", ".join(comparisons) or BLANK,
        verdicts,
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
    "median samples/s [interval, 95% unless stated]",
    "min–max samples/s",
    "cv",
    "noisy",
    "first step",
    "compile time",
    "peak memory",
]


def summary_section(inputs: ReportInputs) -> Section:
    table = Table(
        headers=SUMMARY_HEADERS,
        rows=[_summary_row(row) for row in inputs.summary.to_dict("records")],
        numeric=frozenset({4, 5, 6, 8, 9, 10, 12, 13, 14}),
        wrap=frozenset({7}),
    )
    throughput = chart_block(
        lambda: cell_dots(inputs.summary, THROUGHPUT), "Throughput", "no cell has an ok trial"
    )
    return Section(
        id="summary",
        title="Every cell",
        intro=(
            "One row per environment, model, variant, mode and size. Statistics use the ok "
            "trials (n): the median with its distribution-free interval (its coverage shown "
            "where too few trials reach 95%), cv = standard deviation / mean. Compile time: the "
            "median first step beyond the median first step of the same environment's eager "
            "cell (cold and warm compiler caches apart where the records say which)."
        ),
        blocks=[throughput, Block(table=table)],
    )


def _summary_row(row: Mapping[str, Any]) -> list[str]:
    low, high = row["min_samples_per_s"], row["max_samples_per_s"]
    spread = BLANK if is_blank(low) else f"{format_samples_per_s(low)}–{format_samples_per_s(high)}"
    return [
        *(format_text(row[k]) for k in ("env", "model", "variant", "mode")),
        format_batch(row["batch_size"], row.get("retried_from_batch_size")),
        *(format_int(row[k]) for k in ("image_size", "seq_len")),
        f"{format_int(row['trials'])} ({format_text(row['statuses'])})",
        format_rate_interval(
            row["median_samples_per_s"],
            row["median_low"],
            row["median_high"],
            row["median_confidence"],
            row["ok_trials"],
        ),
        spread,
        format_fraction_as_percent(row["cv"]),
        format_flag(row["noisy"]),
        format_seconds(row["median_first_step_s"]),
        format_compile_time(
            row["compile_time_s"], row["compile_time_cold_s"], row["compile_time_warm_s"]
        ),
        format_mib(row["median_peak_memory_bytes"]),
    ]


def timing_section(inputs: ReportInputs) -> Section:
    steps = inputs.steps
    step_block = (
        chart_block(lambda: step_time_boxes(steps), "Step times", "no ok trial recorded steps")
        if steps is not None
        else Block(heading="Step times", note="Nothing to draw: no steps table was given.")
    )
    kinds = ", ".join(dict.fromkeys(k for k in inputs.summary["memory_kind"] if not is_blank(k)))
    return Section(
        id="timing",
        title="Step times, memory and compilation",
        intro=(
            "Distributions of the measured step times, and the median peak memory and first "
            "step (compilation included) over the ok trials of each cell; numbers are in the "
            "table above."
        ),
        blocks=[
            step_block,
            chart_block(
                lambda: cell_dots(inputs.summary, PEAK_MEMORY),
                "Peak memory",
                "no ok trial measured memory",
            ),
            Block(note=f"Memory measured as: {kinds or BLANK}."),
            chart_block(
                lambda: cell_dots(inputs.summary, FIRST_STEP),
                "Compile and first-step time",
                "no ok trial timed its first step",
            ),
        ],
    )


FAILURE_HEADERS = ["env", "model", "variant", "mode", "batch", "trial", "status", "reason"]
NOISY_HEADERS = ["env", "model", "variant", "mode", "batch", "median samples/s", "cv", "reason"]


def failures_section(inputs: ReportInputs) -> Section:
    runs = inputs.runs
    not_ok = runs[runs["status"] != "ok"]
    failures = Table(
        headers=FAILURE_HEADERS,
        rows=[_failure_row(row) for row in not_ok.to_dict("records")],
        numeric=frozenset({4, 5}),
        wrap=frozenset({7}),
    )
    summary = inputs.summary
    noisy = summary[summary["noisy"].map(is_true)] if len(summary) else summary
    noise = Table(
        headers=NOISY_HEADERS,
        rows=[_noisy_row(row) for row in noisy.to_dict("records")],
        numeric=frozenset({4, 5, 6}),
        wrap=frozenset({7}),
    )
    counts = status_counts(runs["status"]) or "none"
    return Section(
        id="failures",
        title="Failures, unsupported, missing and noisy cells",
        intro=(
            f"Records by status: {counts}. Every record whose status is not ok, with its reason "
            "(stale: a record of another cell than the configuration asks for, e.g. left by an "
            "older configuration; it is not counted)."
        ),
        blocks=[
            Block(table=failures),
            *_retried_blocks(runs),
            Block(
                table=noise,
                heading="Noisy cells",
                note=(
                    f"Cells whose trials vary too much to resolve a small speedup: cv above "
                    f"{stats.NOISE_CV:.0%} or a median interval wider than "
                    f"±{stats.NOISE_RELATIVE_HALF_WIDTH:.0%}."
                ),
            ),
        ],
    )


def _failure_row(row: Mapping[str, Any]) -> list[str]:
    reason = format_text(row["reason"])
    if not is_blank(row.get("fault")):
        reason += f" [injected fault: {row['fault']}]"
    return [
        *(format_text(row[k]) for k in ("env", "model", "variant", "mode")),
        format_batch(row["batch_size"], row.get("retried_from_batch_size")),
        format_int(row["trial"]),
        format_text(row["status"]),
        reason,
    ]


def _retried_blocks(runs: pd.DataFrame) -> list[Block]:
    """The trials run again at half the batch size after running out of memory (oom_retry)."""
    if "retried_from_batch_size" not in runs.columns:
        return []
    retried = runs[~runs["retried_from_batch_size"].map(is_blank)]
    if retried.empty:
        return []
    table = Table(
        headers=FAILURE_HEADERS,
        rows=[_failure_row(row) for row in retried.to_dict("records")],
        numeric=frozenset({5}),
        wrap=frozenset({4, 7}),
    )
    note = (
        "These trials ran out of memory at the configured batch size and ran again at half of "
        "it (oom_retry). They are summarised at the batch size they ran, apart from the "
        "configured one, and a speedup only pairs cells of the same batch size."
    )
    return [Block(table=table, heading="Retried at half the batch size", note=note)]


def _noisy_row(row: Mapping[str, Any]) -> list[str]:
    return [
        *(format_text(row[k]) for k in ("env", "model", "variant", "mode")),
        format_int(row["batch_size"]),
        format_rate_interval(
            row["median_samples_per_s"],
            row["median_low"],
            row["median_high"],
            row["median_confidence"],
            row["ok_trials"],
        ),
        format_fraction_as_percent(row["cv"]),
        format_text(row["noisy_reason"]),
    ]


BACKEND_SETTINGS = {
    "TF32 matmul": "tf32_matmul",
    "TF32 cuDNN": "tf32_cudnn",
    "cudnn.benchmark": "cudnn_benchmark",
    "float32 matmul precision": "float32_matmul_precision",
}


ENVIRONMENT_FIELDS = {
    "torch": "torch",
    "torchvision": "torchvision",
    "transformers": "transformers",
    "CUDA": "cuda",
    "cuDNN": "cudnn",
    "GPU": "gpu",
    **BACKEND_SETTINGS,
    "driver": "gpu_driver",
    "CPU": "cpu_model",
    "logical CPUs": "cpu_count",
    "threads": "torch_threads",
    "Python": "python",
    "container": "container_image",
    "container digest": "container_digest",
    "git commit": "git_commit",
    "host": "hostname",
}


def environments_section(inputs: ReportInputs) -> Section:
    runs = inputs.runs
    recorded = runs[~runs["status"].isin(["missing", "unreadable"]) & runs["env"].notna()]
    recorded = recorded.assign(gpu=recorded["device_name"].where(recorded["device_index"].notna()))
    environments = sorted(recorded["env"].unique())
    configured = inputs.config.get("environments") or {}
    kinds = [format_text((configured.get(env) or {}).get("kind")) for env in environments]
    groups = {env: recorded[recorded["env"] == env] for env in environments}
    fields = [
        [label, *(_distinct(groups[env][column]) for env in environments)]
        for label, column in ENVIRONMENT_FIELDS.items()
        if column in recorded.columns
    ]
    rows = [
        ["kind", *kinds],
        ["records", *(str(len(groups[env])) for env in environments)],
        # Backend settings only where some record states them (older records lack them).
        *(f for f in fields if f[0] not in BACKEND_SETTINGS or set(f[1:]) != {BLANK}),
    ]
    wrap = frozenset(range(1, len(environments) + 1))
    table = Table(headers=["", *environments], rows=rows if environments else [], wrap=wrap)
    return Section(
        id="environments",
        title="Environments",
        intro=(
            "What each environment really was, as its records report it (several values: the "
            "records disagree). GPU is blank for runs on the CPU. TF32 and cudnn.benchmark, "
            "where the records state them, are the settings each column ran with."
        ),
        blocks=[Block(table=table)],
    )


def _distinct(values: pd.Series) -> str:
    texts = [format_int(v) if isinstance(v, float) else str(v) for v in values if not is_blank(v)]
    return ", ".join(dict.fromkeys(texts)) or BLANK


def method_section(inputs: ReportInputs) -> Section:
    config = inputs.config
    steps = config.get("steps") if isinstance(config.get("steps"), Mapping) else {}
    tolerances = ", ".join(f"{name} {value:.0%}" for name, value in TOLERANCES.items())
    rows = [
        ["device class", format_text(config.get("device"))],
        ["trials per cell", f"{format_text(config.get('trials'))}, each its own process"],
        ["warm-up steps", f"{format_text(steps.get('warmup'))} (the first holds compilation)"],
        ["measured steps", format_text(steps.get("measured"))],
        ["numerics steps", f"{format_text(steps.get('numerics'))} leading steps checked"],
        ["cell timeout", f"{format_text(config.get('timeout_s'))} s"],
        ["throughput", "batch size × measured steps / their wall time, one value per trial"],
        [
            "median interval",
            f"distribution-free order-statistic (binomial) interval of the median, "
            f"{CONFIDENCE:.0%} requested; with 5 trials or fewer it is the range, shown with "
            "its actual coverage",
        ],
        [
            "speedup",
            "Hodges–Lehmann shift of log throughput (candidate − baseline), exponentiated: the "
            "median of the candidate / baseline ratios of all trial pairs",
        ],
        ["speedup interval", _speedup_interval_method(config)],
        ["significance", _significance_method(config)],
        [
            "noisy",
            f"cv > {stats.NOISE_CV:.0%} or median interval half-width > "
            f"{stats.NOISE_RELATIVE_HALF_WIDTH:.0%} of the median",
        ],
        [
            "verdict",
            "consistent with the claim: the published speedup lies in the interval; below / "
            "above the claim: the interval lies above / below it; not measured: the reason",
        ],
        [
            "numerics tolerance",
            "loss, gradients and update (train) or output (infer) of the first steps after the "
            "knob's one-off work, each against an eager fp64 step from the same snapshot "
            f"(relative error): tolerances {tolerances}; allowed = max(tolerance, "
            f"{EAGER_ERROR_MULTIPLIER:g} × eager's own error at that precision, 3 × how far eager "
            "moves when its weights move by one fp32 rounding unit and, for compiled and "
            "graph-captured variants, its dropout masks change)",
        ],
        ["late numerics check", _late_check_method()],
        ["TF32 and cudnn.benchmark", _backend_settings(inputs.runs)],
    ]
    return Section(
        id="method",
        title="Method",
        intro="How the numbers above were made.",
        blocks=[Block(table=Table(headers=["", "setting"], rows=rows, wrap=frozenset({1})))],
    )


def _configured_trials(config: Mapping[str, Any]) -> int | None:
    trials = config.get("trials")
    return trials if isinstance(trials, int) and not isinstance(trials, bool) and trials else None


def _speedup_interval_method(config: Mapping[str, Any]) -> str:
    needed = ranks.trials_for_confidence(CONFIDENCE)
    text = (
        "exact distribution-free (Moses) interval of that shift, the inversion of the "
        "Mann–Whitney test: from the k-th smallest to the k-th largest pairwise ratio, k the "
        f"largest rank whose exact coverage 1 − 2 P(U ≤ k − 1) reaches {CONFIDENCE:.0%}; "
        f"{needed} ok trials a side reach {CONFIDENCE:.0%}; with fewer the widest interval (all "
        "pairs) is shown with the confidence it has. Exact when both sides' noise has one shape "
        "(a shift of log throughput); it covers somewhat less where their spreads differ widely"
    )
    trials = _configured_trials(config)
    if trials is None or trials < 2:
        return text
    _, achieved = ranks.shift_interval_rank(trials, trials, CONFIDENCE)
    return text + f"; this run's {trials} trials a side give {achieved:.1%}"


def _significance_method(config: Mapping[str, Any]) -> str:
    text = (
        "two-sided Mann–Whitney U test (exact; the normal approximation with tie correction "
        f"where trials tie); significant when p < {ALPHA:g} and the interval excludes 1"
    )
    trials = _configured_trials(config)
    if trials is None:
        return text
    floor = ranks.smallest_p_value(trials, trials)
    text += (
        f"; with {trials} trials a side p cannot fall below 2 / C({2 * trials}, {trials}) "
        f"= {floor:.2g}"
    )
    return text + (", so no difference can be significant" if floor >= ALPHA else "")


def _late_check_method() -> str:
    bounds = late_numerics.LATE_TOLERANCES.items()
    tolerances = ", ".join(f"{name} {value:.1%}" for name, value in bounds)
    chaotic = ", ".join(
        f"{model} on {device} {value:.0%}"
        for (model, device), value in late_numerics.LATE_MODEL_ALLOWANCES.items()
    )
    return (
        "each train-mode variant's last loss against the same environment's eager cell "
        "(same model, sizes and seed: the same seeded trajectory); relative error allowed: the "
        f"largest of the precision's bound ({tolerances}), the model's where its training is "
        f"too chaotic for it ({chaotic}: only gross errors are caught there) and "
        f"{late_numerics.EAGER_SPREAD_MULTIPLIER:g} × the eager trials' own spread; a non-finite "
        "last loss always fails; a failing trial becomes numerics_mismatch and leaves the "
        "statistics"
    )


def _backend_settings(runs: pd.DataFrame) -> str:
    """What each environment's records say it ran with, e.g. ``"torch-2.0: TF32 matmul
    False, …"``; these settings are what each column's numbers were made with."""
    present = [c for c in BACKEND_SETTINGS.values() if c in runs.columns]
    recorded = runs[runs["env"].notna()]
    parts = []
    for env in sorted(recorded["env"].unique()):
        group = recorded[recorded["env"] == env]
        settings = [
            f"{label} {_distinct(group[column])}"
            for label, column in BACKEND_SETTINGS.items()
            if column in present and _distinct(group[column]) != BLANK
        ]
        if settings:
            parts.append(f"{env}: " + ", ".join(settings))
    if not parts:
        return "not recorded by these records (older cells); see each column's torch defaults"
    return (
        "each column ran with the settings its records state (also in Environments): "
        + "; ".join(parts)
    )


SECTION_BUILDERS: list[Callable[[ReportInputs], Section]] = [
    seed_section,
    claims_section,
    summary_section,
    timing_section,
    failures_section,
    environments_section,
    method_section,
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
    steps: pd.DataFrame | None = None,
) -> list[Path]:
    """Write ``index.html`` and ``report.md`` into ``out_dir``; return their paths.

    ``steps`` (the per-step table) feeds the step-time figure; without it the figure is
    replaced by a note. Raises ValueError when a table lacks a column the report shows (extra
    columns are fine).
    """
    check_columns(runs, RUNS_COLUMNS, "runs")
    check_columns(summary, SUMMARY_COLUMNS, "summary")
    check_columns(speedups, SPEEDUP_COLUMNS, "speedups")
    if steps is not None:
        check_columns(steps, STEPS_COLUMNS, "steps")
    inputs = ReportInputs(runs, summary, speedups, config, claims, steps)
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
