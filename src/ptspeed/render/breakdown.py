"""The report's section on where each step's time goes: per comparison, baseline against
candidate by kind of work (a stacked bar per model and the sentence that names the biggest
changes), then each cell across torch versions, with the path of every trace.

The times are the profiled steps' (:mod:`ptspeed.analysis.breakdown`; the kinds:
:data:`ptspeed.cell.breakdown.KIND_HELP`). Traces are linked relative to the report
(``results/report/`` → ``../traces/…``), and open in Perfetto or TensorBoard.
"""

from __future__ import annotations

import base64
import io
import math
import os
from collections.abc import Mapping, Sequence
from typing import Any

import pandas as pd
import seaborn as sns

from ptspeed.analysis import breakdown
from ptspeed.analysis.versions import torch_versions, version_key
from ptspeed.cell.breakdown import KIND_HELP, KINDS, SUM_TOLERANCE
from ptspeed.render.figures import DPI, FONT, WIDTH_IN, Chart
from ptspeed.render.formatting import format_text
from ptspeed.render.page import Block, ReportInputs, Section
from ptspeed.render.tables import Column, Table

BAR_IN = 0.3
LEGEND_COLUMNS = 4
LEGEND_ROW_IN = 0.2
KINDS_FOOTNOTE = "Kinds: " + "; ".join(
    f"{label}: {KIND_HELP[kind]}" for kind, label in breakdown.KIND_LABELS.items()
)
REPORT_DIRECTORY = "report"  # the report's directory under the results directory


def breakdown_section(inputs: ReportInputs) -> Section | None:
    """Each comparison's models by kind of work, then each cell across torch versions; None
    where no cell was profiled."""
    summary = inputs.summary
    if "profiled_trials" not in summary.columns or not (summary["profiled_trials"] > 0).any():
        return None
    results = str(inputs.config.get("results", "results"))
    blocks = []
    speedups = inputs.speedups
    for name in dict.fromkeys(speedups["comparison"]):
        rows = [
            row
            for row in speedups[speedups["comparison"] == name].to_dict("records")
            if breakdown.side(row, "baseline_") or breakdown.side(row, "candidate_")
        ]
        if rows:
            blocks.extend(_comparison_blocks(rows, results))
    blocks.extend(_version_blocks(summary, inputs.runs, results))
    return Section(
        id="breakdown",
        title="Where the time goes",
        intro=(
            "Each cell's first trial ran a few more steps under torch.profiler after its "
            "measured window (never inside it). Their time per step by kind of work: on the CPU "
            "each op's self time by the op's kind, 'Python/framework' the time outside any op; "
            "on CUDA the GPU's time by kernel kind, 'GPU idle' the time no kernel ran "
            f"(host overhead). The kinds sum to the profiled step time within "
            f"{SUM_TOLERANCE:.0%}; profiled steps are slower than measured ones (the "
            "profiler's cost), so compare shares, not these times with the throughputs."
        ),
        blocks=blocks,
    )


def _comparison_blocks(rows: Sequence[Mapping[str, Any]], results: str) -> list[Block]:
    first = rows[0]
    bars = []
    for row in rows:
        for prefix, env, variant in (
            ("baseline_", first["baseline_env"], first["baseline_variant"]),
            ("candidate_", first["candidate_env"], first["candidate_variant"]),
        ):
            side = breakdown.side(row, prefix)
            if side:
                bars.append((f"{row['model']}: {env}/{variant}", side))
    table = Table.of(
        [
            Column("model", lambda row: format_text(row["model"])),
            Column(
                "what changed (per profiled step)",
                lambda row: format_text(row.get(breakdown.SENTENCE)),
                wrap=True,
            ),
            Column("traces", lambda row: _traces(row, results), wrap=True),
        ],
        rows,
    )
    heading = f"{format_text(first['title'])}: where the time goes"
    return [
        Block(heading=heading, chart=stacked_bars(bars), note=_kinds_note(bars)),
        Block(table=table, footnote=KINDS_FOOTNOTE),
    ]


def _version_blocks(summary: pd.DataFrame, runs: pd.DataFrame, results: str) -> list[Block]:
    """Each profiled cell (model, variant, mode) in every torch version, oldest first."""
    torch = torch_versions(runs)
    profiled = summary[(summary["profiled_trials"] > 0) & summary["env"].isin(list(torch))]
    bars, rows = [], []
    for (model, variant, mode), cell in profiled.groupby(["model", "variant", "mode"], sort=True):
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
        rows.append(
            {"cell": f"{model} / {variant} / {mode}", "changes": "; ".join(steps),
             "traces": " ".join(_link(r.get("trace"), results) for r in ordered if r.get("trace"))}
        )  # fmt: skip
    if not rows:
        return []
    table = Table.of(
        [
            Column("cell", lambda row: row["cell"]),
            Column("what changed between torch versions", lambda row: row["changes"], wrap=True),
            Column("traces", lambda row: row["traces"] or "—", wrap=True),
        ],
        rows,
    )
    return [
        Block(heading="Across torch versions", chart=stacked_bars(bars), note=_kinds_note(bars)),
        Block(table=table),
    ]


def _traces(row: Mapping[str, Any], results: str) -> str:
    links = [_link(row.get(f"{side}_trace"), results) for side in ("baseline", "candidate")]
    return " ".join(link for link in links if link) or "—"


def _link(path: Any, results: str) -> str:
    """A trace's path relative to the report's directory (``../traces/…``)."""
    if not isinstance(path, str) or not path:
        return ""
    return os.path.relpath(path, os.path.join(results, REPORT_DIRECTORY))


def _kinds_note(bars: Sequence[tuple[str, Mapping[str, Any]]]) -> str:
    timelines = {side["timeline"] for _, side in bars}
    what = "the GPU's time" if timelines == {"gpu"} else "the stepping thread's time"
    return f"Milliseconds per profiled step by kind of work ({what})."


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
