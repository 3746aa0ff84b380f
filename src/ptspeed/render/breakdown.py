"""Where each step's time goes, in the report: beside each speedup of the seed table, the
sentence that names the biggest changes from baseline to candidate with links to both traces
(:func:`why_column`) and, under the table, a stacked bar per model and side by kind of work
(:func:`comparison_chart`); in the torch versions section, each cell across versions
(:func:`version_blocks`).

The times are the profiled steps' (:mod:`ptspeed.analysis.breakdown`; the kinds:
:data:`ptspeed.cell.measurement.work_kinds.KIND_HELP`). Traces are linked relative to the report
(``results/report/`` → ``../traces/…``), and open in Perfetto or TensorBoard.
"""

from __future__ import annotations

import base64
import io
import math
import os
from collections.abc import Mapping, Sequence
from typing import Any

import seaborn as sns

from ptspeed.analysis import breakdown
from ptspeed.analysis.columns import SIDES
from ptspeed.analysis.versions import torch_versions, version_key
from ptspeed.cell.measurement.work_kinds import KIND_HELP, KINDS
from ptspeed.render.figures import DPI, FONT, WIDTH_IN, Chart
from ptspeed.render.formatting import format_text, is_blank
from ptspeed.render.page import Block, ReportInputs
from ptspeed.render.tables import Column, LinkedText, Table

BAR_IN = 0.3
LEGEND_COLUMNS = 4
LEGEND_ROW_IN = 0.2
KINDS_FOOTNOTE = "Kinds: " + "; ".join(
    f"{label}: {KIND_HELP[kind]}" for kind, label in breakdown.KIND_LABELS.items()
)
REPORT_DIRECTORY = "report"  # the report's directory under the results directory


WHY_HEADER = "where the time went (per profiled step)"


def why_column(results: str) -> Column:
    """The seed table's column beside each speedup: the sentence naming the biggest changes
    from baseline to candidate, with links to both sides' traces."""

    def value(row: Mapping[str, Any]) -> str:
        sentence = row.get(breakdown.SENTENCE)
        links = [
            (f"{side} trace", link)
            for side in SIDES
            if (link := _link(row.get(f"{side}_trace"), results))
        ]
        return LinkedText(format_text(sentence), links)

    return Column(WHY_HEADER, value, wrap=True)


def comparison_chart(rows: Sequence[Mapping[str, Any]]) -> Block | None:
    """A comparison's models, baseline and candidate, as stacked bars by kind of work; None
    where neither side of any row was profiled."""
    bars = []
    for row in rows:
        place = " ".join(
            str(row[k]) for k in ("model", "mode", "platform") if not is_blank(row.get(k))
        )
        sides = ((side, breakdown.side(row, f"{side}_")) for side in SIDES)
        bars.extend((f"{place}: {side}", found) for side, found in sides if found)
    if not bars:
        return None
    return Block(chart=stacked_bars(bars), note=_kinds_note(bars), footnote=KINDS_FOOTNOTE)


def version_blocks(inputs: ReportInputs) -> list[Block]:
    """Each profiled cell (model, variant, mode) in every torch version, oldest first: its
    stacked bars and what changed from each version to the next, with the traces."""
    summary, results = inputs.summary, inputs.settings.results
    torch = torch_versions(inputs.runs)
    chosen = summary[summary["profile_step_s"].notna() & summary["env"].isin(list(torch))]
    bars, rows = [], []
    for (model, variant, mode), cell in chosen.groupby(["model", "variant", "mode"], sort=True):
        ordered = sorted(cell.to_dict("records"), key=lambda r: version_key(torch[r["env"]]))
        if len({torch[r["env"]] for r in ordered}) < 2:
            continue
        sides = [breakdown.side(r) for r in ordered]
        bars.extend(
            (f"{model}/{variant}: torch {torch[r['env']]}", s)
            for r, s in zip(ordered, sides, strict=True)
        )
        steps = [
            f"{torch[a['env']]} → {torch[b['env']]}: {breakdown.explain(x, y)}"
            for a, b, x, y in zip(ordered, ordered[1:], sides, sides[1:], strict=False)
        ]
        links = [
            (f"torch {torch[r['env']]} trace", link)
            for r in ordered
            if (link := _link(r.get("trace"), results))
        ]
        rows.append(
            {
                "cell": f"{model} / {variant} / {mode}",
                "changes": LinkedText("; ".join(steps), links),
            }
        )
    if not rows:
        return []
    table = Table.of(
        [
            Column("cell", lambda row: row["cell"]),
            Column(
                "where the time went, torch version to version",
                lambda row: row["changes"],
                wrap=True,
            ),
        ],
        rows,
    )
    heading = "Where the time goes, torch version to version"
    return [
        Block(heading=heading, chart=stacked_bars(bars), note=_kinds_note(bars)),
        Block(table=table, footnote=KINDS_FOOTNOTE),
    ]


def _link(path: Any, results: str) -> str:
    """A trace's path relative to the report's directory (``../traces/…``)."""
    if not isinstance(path, str) or not path:
        return ""
    return os.path.relpath(path, os.path.join(results, REPORT_DIRECTORY))


def _kinds_note(bars: Sequence[tuple[str, Mapping[str, Any]]]) -> str:
    timelines = {side["timeline"] for _, side in bars}
    what = "the GPU's time" if timelines == {"gpu"} else "the stepping thread's time"
    return f"Milliseconds per profiled step by kind of work ({what}; how: Method)."


def stacked_bars(bars: Sequence[tuple[str, Mapping[str, Any]]]) -> Chart | None:
    """One horizontal bar per (label, side): its time per step stacked by kind."""
    if not bars:
        return None
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure

    used = [kind for kind in KINDS if any(side["times"][kind] > 0 for _, side in bars)]
    colours = dict(zip(used, sns.color_palette("tab20", len(used)), strict=True))
    legend_rows = math.ceil(len(used) / LEGEND_COLUMNS)
    bottom_in = 0.5 + LEGEND_ROW_IN * legend_rows
    height = BAR_IN * len(bars) + bottom_in + 0.15
    figure = Figure(figsize=(WIDTH_IN, height), dpi=DPI)
    FigureCanvasAgg(figure)
    ax = figure.add_subplot()
    labels = [label for label, _ in bars]
    for position, (_, side) in enumerate(bars):
        left = 0.0
        for kind in used:
            width = side["times"][kind] * 1e3
            label = breakdown.KIND_LABELS[kind] if position == 0 else None
            ax.barh(position, width, left=left, color=colours[kind], label=label, height=0.7)
            left += width
    ax.set_yticks(range(len(bars)), labels, fontsize=FONT)
    ax.invert_yaxis()
    ax.set_xlabel("ms per profiled step", fontsize=FONT)
    ax.tick_params(labelsize=FONT)
    figure.legend(
        loc="lower center", ncol=LEGEND_COLUMNS, fontsize=FONT - 1, frameon=False,
        bbox_to_anchor=(0.5, 0.0),
    )  # fmt: skip
    longest = max(len(label) for label in labels)
    figure.subplots_adjust(
        left=min(0.55, longest * 0.07 / WIDTH_IN + 0.03), right=0.97, top=1 - 0.1 / height,
        bottom=bottom_in / height,
    )  # fmt: skip
    alt = "; ".join(
        f"{label}: " + ", ".join(f"{k} {side['times'][k] * 1e3:.2f} ms" for k in used)
        for label, side in bars
    )
    buffer = io.BytesIO()
    figure.savefig(buffer, format="png", dpi=DPI)
    uri = "data:image/png;base64," + base64.b64encode(buffer.getvalue()).decode("ascii")
    return Chart(alt=alt, data_uri=uri)
