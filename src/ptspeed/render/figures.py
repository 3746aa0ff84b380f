"""The report's figures: seaborn-styled matplotlib charts as self-contained PNG data URIs.

Each function takes an aggregated table (as read back from its CSV) and returns a
:class:`Chart`, or None when there is nothing to draw. Figures are drawn on
``matplotlib.figure.Figure`` objects with the Agg canvas, never through pyplot, so nothing
global is left behind and no display is needed.

Per-cell figures are one axes each: a bold heading row per model, mode and batch size, then one
row per environment / variant, its point or box coloured the same in every figure. One axes
rather than a panel per model keeps drawing fast (matplotlib's cost is per axes) and the figure
narrow enough for a phone; where values span more than a decade the axis is logarithmic, so
that every model's differences stay visible, labelled in plain numbers spaced so that no two
labels meet (:func:`log_axis`). Every row's label gives the number of trials it came from.

seaborn draws the points (``scatterplot``) and the boxes (``boxplot``); matplotlib draws the
intervals, which are given (seaborn's error bars are intervals it computes from raw values),
the forest plot's hollow points and claims, and the row labels.
"""

from __future__ import annotations

import base64
import io
import math
import warnings
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
import pandas as pd
import seaborn as sns
from matplotlib.axes import Axes
from matplotlib.backends.backend_agg import FigureCanvasAgg
from matplotlib.figure import Figure
from matplotlib.ticker import FuncFormatter, LogLocator, MaxNLocator, NullFormatter
from matplotlib.transforms import blended_transform_factory

from ptspeed.analysis.columns import SIDES
from ptspeed.plan.settings import Comparison

WIDTH_IN = 6.4
FONT = 9
CHAR_IN = 0.07  # about the width of a 9-point character, in inches
MAX_LABEL_SHARE = 0.55
DPI = 110
ROW_IN = 0.24
PAD_IN = 1.0
MAX_ROWS = 48
LOG_SPAN = 10.0
# A log axis's labels: at 1, 2 and 5 times each power of ten, or 1 and 3, or powers of ten
# alone, the first whose closest two labels (in decades) lie this far apart on the axes.
LOG_SUBS = (((1.0, 2.0, 5.0), math.log10(10 / 5)), ((1.0, 3.0), math.log10(10 / 3)), ((1.0,), 1.0))
LABEL_GAP_IN = 0.55
DIGIT_IN = 0.08  # about the width of a 9-point digit, in inches
TICK_PAD_IN = 0.15  # room between two tick labels
GROUP_KEYS = ["model", "mode", "batch_size", "image_size", "seq_len"]
CELL_KEYS = [*GROUP_KEYS, "env", "variant"]
CLAIM_COLOUR = "crimson"
BYTES_PER_MIB = 1024 * 1024


@dataclass(frozen=True)
class Chart:
    """One embedded figure: a PNG data URI, its alt text, and a note on what was left out."""

    alt: str
    data_uri: str
    note: str = ""


def series_label(env: Any, variant: Any) -> str:
    return f"{env} / {variant}"


def series_colours(labels: Sequence[str]) -> dict[str, tuple[float, float, float]]:
    """One colour per environment / variant, in order of first appearance."""
    distinct = list(dict.fromkeys(labels))
    palette = sns.color_palette("colorblind", max(len(distinct), 1))
    return {label: palette[i % len(palette)] for i, label in enumerate(distinct)}


# --- speedups ------------------------------------------------------------------------------------


def forest_plot(speedups: pd.DataFrame) -> Chart | None:
    """Each measured speedup with its interval, 1 (no change) and the published claims marked.

    matplotlib, not seaborn: the intervals are given (seaborn draws only those it computes from
    raw values)."""
    rows = speedups[pd.to_numeric(speedups["speedup"], errors="coerce").notna()]
    if rows.empty:
        return None
    shown = rows.head(MAX_ROWS)
    labels = [_forest_label(row) for row in shown.to_dict("records")]
    figure, ax = _figure(len(shown), labels)
    _draw_forest(ax, shown)
    _row_labels(ax, labels)
    ax.set_ylim(len(shown) - 0.5, -0.5)
    ax.tick_params(axis="x", labelsize=FONT)
    linear_axis(ax)
    # Right-aligned: centred under a narrow axes, the two lines ran off the figure's edge.
    ax.set_xlabel(
        "speedup = median candidate / baseline ratio, with its exact interval\n"
        "(95% where the trials allow); red diamond: the published claim",
        fontsize=FONT,
        loc="right",
    )
    alt = (
        "Forest plot: the speedup of each comparison and model as a point with its exact "
        "interval (95% where the trials allow, else the confidence the seed table states), a "
        "dashed line at no change, published claims as red diamonds."
    )
    return Chart(alt, _data_uri(figure), _left_out(len(rows), len(shown), "speedups"))


def _draw_forest(ax: Axes, speedups: pd.DataFrame) -> None:
    """A row per speedup, coloured by comparison: its point (hollow without an interval), its
    interval, the published claim; and a line at 1."""
    points = speedups.assign(
        _value=_numbers(speedups["speedup"]),
        _low=_numbers(speedups["speedup_low"]),
        _high=_numbers(speedups["speedup_high"]),
        _claim=_numbers(speedups["published_speedup"]),
        _series=speedups["comparison"].astype(str),
        _y=range(len(speedups)),
    )
    colours = series_colours(points["_series"].tolist())
    _intervals(ax, points, colours)
    edges = [colours[series] for series in points["_series"]]
    faces = [c if has else "none" for c, has in zip(edges, _has_interval(points), strict=True)]
    ax.scatter(points["_value"], points["_y"], s=25, facecolors=faces, edgecolors=edges, zorder=3)
    claimed = points[np.isfinite(points["_claim"])]
    ax.plot(claimed["_claim"], claimed["_y"], "D", color=CLAIM_COLOUR, markersize=5,
            linestyle="none", zorder=4)  # fmt: skip
    ax.axvline(1.0, color="grey", linestyle="--", linewidth=1)


def _forest_label(row: Mapping[str, Any]) -> str:
    counts = f"n={_count(row['baseline_trials'])}/{_count(row['candidate_trials'])}"
    platform = row.get("platform")
    on = f" on {platform}" if isinstance(platform, str) and platform else ""
    return f"{row['comparison']}: {row['model']}{on} ({row['mode']}, {counts})"


# --- per-cell values -----------------------------------------------------------------------------


@dataclass(frozen=True)
class DotSpec:
    """What a per-cell dot plot shows of each summary row."""

    value: str
    xlabel: str
    alt: str
    scale: float = 1.0
    low: str = ""
    high: str = ""


THROUGHPUT = DotSpec(
    value="median_samples_per_s",
    low="median_low",
    high="median_high",
    xlabel="median throughput (samples/s) with the interval of the median",
    alt=(
        "Dot plot grouped by model, mode and batch size: the median throughput of each "
        "environment and variant, with the confidence interval of the median as error bars."
    ),
)
PEAK_MEMORY = DotSpec(
    value="median_peak_memory_bytes",
    scale=1 / BYTES_PER_MIB,
    xlabel="median peak memory (MiB)",
    alt=(
        "Dot plot grouped by model, mode and batch size: the median peak memory of each "
        "environment and variant."
    ),
)
FIRST_STEP = DotSpec(
    value="median_first_step_s",
    xlabel="median first step, compilation included (s)",
    alt=(
        "Dot plot grouped by model, mode and batch size: the median time of the first step, "
        "compilation included, of each environment and variant."
    ),
)


def cell_dots(summary: pd.DataFrame, spec: DotSpec) -> Chart | None:
    """``spec.value`` of every cell with ok trials as a point (with its interval where ``spec``
    names one), labelled with the cell's ok trials."""
    frame = _with_series(summary).assign(
        _value=_numbers(summary[spec.value]) * spec.scale,
        _low=_numbers(summary[spec.low]) * spec.scale if spec.low else math.nan,
        _high=_numbers(summary[spec.high]) * spec.scale if spec.high else math.nan,
    )
    frame = frame[(frame["_value"] > 0) & (frame["ok_trials"].fillna(0) > 0)]
    if frame.empty:
        return None
    counts = [f"(n={_count(n)})" for n in frame["ok_trials"]]
    frame = frame.assign(_label=[f"{s} {n}" for s, n in zip(frame["_series"], counts, strict=True)])
    layout = _grouped_rows(frame)
    shown = layout.place(frame)
    colours = series_colours(frame["_series"].tolist())
    figure, ax = _figure(len(layout.labels), layout.labels)
    _intervals(ax, shown, colours)
    sns.scatterplot(data=shown, x="_value", y="_y", hue="_series", hue_order=list(colours),
                    palette=colours, s=36, linewidth=0, legend=False, zorder=3, ax=ax)  # fmt: skip
    _finish_rows(ax, layout, frame["_value"], spec.xlabel)
    note = _left_out(len(frame), len(shown), "cells")
    return Chart(spec.alt, _data_uri(figure), note)


# --- drift over the run ---------------------------------------------------------------------------

DRIFT_HEIGHT_IN = 2.4


def drift_plot(runs: pd.DataFrame, comparison: Comparison) -> Chart | None:
    """Each ok trial of a comparison's two sides at the minute its measured window started
    (from the run's first), its throughput relative to the median of its model's baseline
    trials: a machine that drifts shows as a slope, a perturbed trial (cross) as an outlier."""
    frame = _drift_points(runs, comparison)
    if frame.empty:
        return None
    colours = dict(zip(SIDES, sns.color_palette("colorblind", 2), strict=True))
    with sns.axes_style("whitegrid"):
        figure = Figure(figsize=(WIDTH_IN, DRIFT_HEIGHT_IN), dpi=DPI)
        FigureCanvasAgg(figure)
        ax = figure.add_subplot()
    sns.lineplot(data=frame, x="_minute", y="_relative", hue="_side", units="model",
                 estimator=None, palette=colours, linewidth=0.6, alpha=0.5, legend=False,
                 sort=True, ax=ax)  # fmt: skip
    sns.scatterplot(data=frame, x="_minute", y="_relative", hue="_side", style="_quiet",
                    markers={"quiet": "o", "perturbed": "X"}, palette=colours, s=30,
                    ax=ax)  # fmt: skip
    ax.legend(fontsize=FONT - 1, loc="best", frameon=False)
    ax.tick_params(labelsize=FONT)
    ax.set_xlabel("minutes since the run's first measured window", fontsize=FONT)
    ax.set_ylabel("throughput / baseline\nmedian (per model)", fontsize=FONT)
    figure.subplots_adjust(left=0.14, right=0.98, top=0.95, bottom=0.2)
    alt = (
        f"Time series of {comparison.title or 'the comparison'}: each ok trial of "
        "baseline and candidate at its start time, its throughput relative to its model's "
        "baseline median; perturbed trials as crosses."
    )
    return Chart(alt, _data_uri(figure))


def _drift_points(runs: pd.DataFrame, comparison: Comparison) -> pd.DataFrame:
    """The ok trials of both sides with a start time: minute, relative throughput, side."""
    ok = runs[(runs["status"] == "ok") & np.isfinite(_numbers(runs["window_started_unix_s"]))]
    parts = []
    for side, spec in zip(SIDES, comparison.sides, strict=True):
        chosen = ok[(ok["env"] == spec.env) & (ok["variant"] == spec.variant)]
        parts.append(chosen.assign(_side=side))
    frame = pd.concat(parts, ignore_index=True)
    rates = _numbers(frame["throughput_samples_per_s"])
    frame = frame.assign(_rate=rates)[rates > 0]
    if frame.empty:
        return frame
    baseline = frame[frame["_side"] == "baseline"].groupby("model")["_rate"].median()
    start = _numbers(ok["window_started_unix_s"]).min()
    perturbed = frame["perturbed"].map(lambda v: v is True or str(v).lower() == "true")
    return frame.assign(
        _minute=(_numbers(frame["window_started_unix_s"]) - start) / 60.0,
        _relative=frame["_rate"] / frame["model"].map(baseline),
        _quiet=np.where(perturbed, "perturbed", "quiet"),
    ).dropna(subset=["_relative"])


# --- step times ----------------------------------------------------------------------------------


def step_time_boxes(steps: pd.DataFrame) -> Chart | None:
    """Box plots of the measured step times of every cell, over all its ok trials; each box is
    labelled with its trials and steps."""
    frame = _with_series(steps).assign(_value=_numbers(steps["step_time_s"]) * 1000.0)
    frame = frame[frame["_value"] > 0]
    if frame.empty:
        return None
    cells = frame.groupby(CELL_KEYS, sort=False, dropna=False)
    first_rows = frame.loc[cells.head(1).index]
    trials, step_counts = cells["trial"].transform("nunique"), cells["_value"].transform("size")
    first_rows = first_rows.assign(
        _label=[
            f"{series} (n={trials[i]}, {step_counts[i]} steps)"
            for series, i in zip(first_rows["_series"], first_rows.index, strict=True)
        ]
    )
    layout = _grouped_rows(first_rows)
    shown = layout.place(first_rows)
    frame = frame.merge(shown[[*CELL_KEYS, "_row"]], on=CELL_KEYS)
    colours = series_colours(first_rows["_series"].tolist())
    figure, ax = _figure(len(layout.labels), layout.labels)
    with warnings.catch_warnings():
        # seaborn 0.13 hands matplotlib 3.11 the deprecated ``vert``: its problem, not the reader's.
        warnings.filterwarnings("ignore", message="vert: bool was deprecated")
        _boxes(ax, frame, layout.order, colours)
    _finish_rows(ax, layout, frame["_value"], "measured step time (ms)")
    alt = (
        "Box plots grouped by model, mode and batch size: the distribution of the measured "
        "step times of each environment and variant over all its ok trials."
    )
    note = _left_out(len(first_rows), len(shown), "cells")
    return Chart(alt, _data_uri(figure), note)


def _boxes(ax: Axes, frame: pd.DataFrame, order: list[str], colours: Mapping[str, Any]) -> None:
    sns.boxplot(
        data=frame,
        x="_value",
        y="_row",
        hue="_series",
        order=order,
        hue_order=list(colours),
        palette=colours,
        orient="h",
        dodge=False,
        fliersize=1.5,
        linewidth=0.8,
        width=0.7,
        legend=False,
        ax=ax,
    )


# --- shared --------------------------------------------------------------------------------------


def _intervals(ax: Axes, rows: pd.DataFrame, colours: Mapping[str, Any]) -> None:
    """The given intervals (``_low`` to ``_high`` around ``_value``, at ``_y``) as error bars,
    one artist per colour: matplotlib, since seaborn draws only intervals it computes itself."""
    rows = rows[_has_interval(rows)]
    for series, group in rows.groupby("_series", sort=False):
        below = (group["_value"] - group["_low"]).clip(lower=0)
        above = (group["_high"] - group["_value"]).clip(lower=0)
        ax.errorbar(group["_value"], group["_y"], xerr=[below, above], fmt="none",
                    ecolor=colours[series], capsize=2)  # fmt: skip


def _has_interval(rows: pd.DataFrame) -> pd.Series:
    return np.isfinite(rows["_low"]) & np.isfinite(rows["_high"])


@dataclass(frozen=True)
class RowLayout:
    """The rows of a grouped figure: y labels, which are headings, and which frame index each
    data row shows (``row_index`` is None on heading rows)."""

    labels: list[str]
    headings: list[int]
    row_index: list[Any]

    @property
    def order(self) -> list[str]:
        """The rows as seaborn's categories, top to bottom (heading rows hold no data)."""
        return [str(position) for position in range(len(self.labels))]

    def place(self, frame: pd.DataFrame) -> pd.DataFrame:
        """The shown rows of ``frame``, each with its position (``_y``) and category (``_row``)."""
        placed = [(p, index) for p, index in enumerate(self.row_index) if index is not None]
        positions = [p for p, _ in placed]
        shown = frame.loc[[index for _, index in placed]]
        return shown.assign(_y=positions, _row=[str(p) for p in positions])


def _with_series(frame: pd.DataFrame) -> pd.DataFrame:
    labels = [series_label(e, v) for e, v in zip(frame["env"], frame["variant"], strict=True)]
    return frame.assign(_series=labels)


def _grouped_rows(frame: pd.DataFrame) -> RowLayout:
    """A heading row per model, mode and size, then a row per environment / variant, up to
    :data:`MAX_ROWS` data rows."""
    labels: list[str] = []
    headings: list[int] = []
    row_index: list[Any] = []
    shown = 0
    for key, rows in frame.groupby(GROUP_KEYS, sort=True, dropna=False):
        if shown >= MAX_ROWS:
            break
        model, mode, batch, *_ = key
        headings.append(len(labels))
        labels.append(f"{model} · {mode} · batch {_count(batch)}")
        row_index.append(None)
        for index in rows.sort_values("_series").index[: MAX_ROWS - shown]:
            labels.append(frame.at[index, "_label"])
            row_index.append(index)
            shown += 1
    return RowLayout(labels, headings, row_index)


def _finish_rows(ax: Axes, layout: RowLayout, values: pd.Series, xlabel: str) -> None:
    _row_labels(ax, layout.labels, bold=layout.headings)
    for position in layout.headings:
        ax.axhline(position - 0.5, color="grey", linewidth=0.5)
    ax.set_ylim(len(layout.labels) - 0.5, -0.5)
    ax.set_ylabel("")
    ax.set_xlabel(xlabel, fontsize=FONT)
    ax.tick_params(axis="x", labelsize=FONT)
    positive = values[values > 0]
    if len(positive) and positive.max() / positive.min() > LOG_SPAN:
        log_axis(ax)
    else:
        linear_axis(ax)


def linear_axis(ax: Axes) -> None:
    """Linear x ticks no closer than their labels are wide: matplotlib's own count looks at the
    axes' length, not at the labels, and long ones (123500, 0.01225) meet on a narrow axes."""
    width_in = ax.get_position().width * ax.figure.get_figwidth()
    low, high = sorted(ax.get_xlim())
    formatter = ax.xaxis.get_major_formatter()
    for bins in range(9, 0, -1):
        locator = MaxNLocator(nbins=bins, steps=[1, 2, 2.5, 5, 10])
        ticks = [tick for tick in locator.tick_values(low, high) if low <= tick <= high]
        formatter.set_locs(ticks)
        widest = max((len(formatter(tick)) for tick in ticks), default=0)
        if len(ticks) * (widest * DIGIT_IN + TICK_PAD_IN) <= width_in:
            break
    ax.xaxis.set_major_locator(locator)


def log_axis(ax: Axes) -> None:
    """A logarithmic x axis labelled in plain numbers (20, 50, 100) at 1, 2 and 5 times each
    power of ten where they fit, else fewer (:data:`LOG_SUBS`), else every few powers of ten;
    other ticks unlabelled. matplotlib's own labels (2×10¹, 3×10¹, … on its minor ticks) print
    over each other on a narrow axes spanning one or two decades."""
    ax.set_xscale("log")
    low, high = ax.get_xlim()
    decades = max(math.log10(high / low), 1e-9)
    width_in = ax.get_position().width * ax.figure.get_figwidth()
    inches_per_decade = width_in / decades
    subs = next((s for s, gap in LOG_SUBS if gap * inches_per_decade >= LABEL_GAP_IN), (1.0,))
    most = max(2, int(width_in / LABEL_GAP_IN))  # powers of ten alone: every few if need be
    ax.xaxis.set_major_locator(LogLocator(base=10.0, subs=subs, numticks=most))
    ax.xaxis.set_major_formatter(FuncFormatter(lambda value, _: f"{value:g}"))
    ax.xaxis.set_minor_locator(LogLocator(base=10.0, subs="auto", numticks=most * 10))
    ax.xaxis.set_minor_formatter(NullFormatter())


def _row_labels(ax: Axes, labels: Sequence[str], bold: Sequence[int] = ()) -> None:
    """Row labels as plain text left of the axes, with a faint line per row: matplotlib's tick
    machinery costs several times more per label, seconds for a large report."""
    ax.set_yticks([])
    ax.grid(False, axis="y")
    left_of_axes = blended_transform_factory(ax.transAxes, ax.transData)
    for position, label in enumerate(labels):
        weight = "bold" if position in bold else "normal"
        ax.text(-0.015, position, label, transform=left_of_axes, ha="right", va="center",
                fontsize=FONT, fontweight=weight)  # fmt: skip
    ax.hlines(range(len(labels)), 0, 1, transform=left_of_axes, colors="0.92", linewidth=0.8)


def _figure(rows: int, labels: Sequence[str]) -> tuple[Figure, Axes]:
    """One axes with room on the left for ``labels`` (fixed margins: matplotlib's layout
    engines cost seconds)."""
    height = ROW_IN * rows + PAD_IN
    with sns.axes_style("whitegrid"):
        figure = Figure(figsize=(WIDTH_IN, height), dpi=DPI)
        FigureCanvasAgg(figure)
        ax = figure.add_subplot()
    label_in = max((len(label) for label in labels), default=0) * CHAR_IN + 0.15
    left = min(label_in / WIDTH_IN, MAX_LABEL_SHARE)
    right = 1 - 0.25 / WIDTH_IN
    figure.subplots_adjust(left=left, right=right, top=1 - 0.15 / height, bottom=0.65 / height)
    return figure, ax


def _data_uri(figure: Figure) -> str:
    buffer = io.BytesIO()
    figure.savefig(buffer, format="png", dpi=DPI)
    return "data:image/png;base64," + base64.b64encode(buffer.getvalue()).decode("ascii")


def _left_out(total: int, shown: int, what: str) -> str:
    if total <= shown:
        return ""
    return f"Showing the first {shown} of {total} {what}; the tables hold all of them."


def _finite(value: Any) -> bool:
    try:
        return math.isfinite(float(value))
    except (TypeError, ValueError):
        return False


def _numbers(values: pd.Series) -> pd.Series:
    """The values as floats; text and blanks as NaN."""
    return pd.to_numeric(values, errors="coerce").astype("float64")


def _count(value: Any) -> str:
    return str(int(value)) if _finite(value) else "?"
