"""The report's sections of results: the seed table, the claims, the same cells across torch
versions, every cell, step times, memory and compilation, failures and noisy cells; and
:data:`SECTION_BUILDERS`, the page's order.

Each builder takes the :class:`~ptspeed.render.page.ReportInputs` and returns a
:class:`~ptspeed.render.page.Section`, or None where the run has nothing for it (the page then
leaves it out); its tables are built from the column lists of :mod:`ptspeed.render.tables`. To
grow the report, write such a function and add it to :data:`SECTION_BUILDERS`. The sections on
what ran and how are in :mod:`ptspeed.render.method`.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any

import pandas as pd

from ptspeed.analysis.change_verdict import Rule
from ptspeed.analysis.columns import COMPILER_REASONS, SIDES
from ptspeed.analysis.compare import compare_runs
from ptspeed.analysis.machine_change import machine_changes
from ptspeed.analysis.nodes import comparison_nodes
from ptspeed.analysis.reruns import stopped_sentence
from ptspeed.analysis.suites import suite_figures, suite_members
from ptspeed.analysis.summary import status_counts
from ptspeed.analysis.versions import torch_versions, version_table
from ptspeed.plan.settings import Settings
from ptspeed.render.breakdown import comparison_chart, version_blocks, why_column
from ptspeed.render.comparison import (
    DISPLAY_HEADERS,
    display_rows,
    machine_lines,
    rule_line,
    verdict_line,
)
from ptspeed.render.figures import (
    FIRST_STEP,
    PEAK_MEMORY,
    THROUGHPUT,
    cell_dots,
    drift_plot,
    forest_plot,
    step_time_boxes,
)
from ptspeed.render.formatting import BLANK, format_text, is_blank, is_true, plural
from ptspeed.render.method import environments_section, method_section
from ptspeed.render.page import Block, ReportInputs, Section, chart_block
from ptspeed.render.tables import (
    CLAIMS_TABLE,
    COMPILED_SEED_TABLE,
    ENERGY_RATIO_TABLE,
    ENERGY_TABLE,
    FAILURES_TABLE,
    FIRST_STEP_TABLE,
    NOISY_TABLE,
    PERTURBED_TABLE,
    RETRIED_TABLE,
    SEED_TABLE,
    SUITE_TABLE,
    SUMMARY_TABLE,
    Column,
    Table,
    compiler_counts,
    given,
    rows_by_platform,
    seed_table_by_platform,
    version_columns,
    version_rows,
)


def seed_section(inputs: ReportInputs) -> Section:
    frame = inputs.speedups
    keep = inputs.settings.conditions.keep_perturbed
    results = inputs.settings.results
    blocks = [
        block
        for name in dict.fromkeys(frame["comparison"])
        for block in _comparison_blocks(
            frame[frame["comparison"] == name], inputs.claims, keep, results, inputs.runs
        )
    ]
    return Section(
        id="seed-table",
        title="The seed table, measured",
        intro=(
            "Each comparison's speedup per model on this machine, whether the published figure "
            "holds and where the time went. Throughputs: medians over the ok trials (n); "
            "intervals 95% unless stated. How: Method."
        ),
        blocks=blocks,
    )


def _comparison_blocks(
    rows: pd.DataFrame,
    claims: Mapping[str, Any],
    keep_perturbed: bool,
    results: str,
    runs: pd.DataFrame,
) -> list[Block]:
    """A comparison's seed table (with the SLURM nodes its trials ran on, where they did) and,
    where its cells were profiled, the stacked bars of where each side's time went."""
    first = rows.iloc[0]
    records = rows.to_dict("records")
    compiled = any(compiler_counts("candidate_")(row) != BLANK for row in records)
    named = (row.get("platform") for row in records)
    platforms = list(dict.fromkeys(name for name in named if not is_blank(name)))
    several = len(platforms) > 1
    columns = (
        seed_table_by_platform(compiled)
        if several
        else (COMPILED_SEED_TABLE if compiled else SEED_TABLE)
    )
    ordered = rows_by_platform(records, platforms) if several else records
    chart = comparison_chart(ordered)  # None where neither side of any row was profiled
    table = Table.of([*columns, why_column(results)] if chart else columns, ordered)
    sides = (
        f"baseline {first['baseline_env']}/{first['baseline_variant']} → "
        f"candidate {first['candidate_env']}/{first['candidate_variant']}"
    )
    note = _claim_note(sides, first, claims) + _left_out_note(rows, keep_perturbed)
    nodes = comparison_nodes(runs, {side: _side(first, side) for side in SIDES})
    note += f" {nodes.describe()}" if nodes else ""
    footnote = _compiler_note(records) if compiled else ""
    seed = Block(table=table, heading=format_text(first["title"]), note=note, footnote=footnote)
    return [seed, chart] if chart else [seed]


def _side(row: Mapping[str, Any], side: str) -> dict[str, str]:
    return {"env": row[f"{side}_env"], "variant": row[f"{side}_variant"]}


def _compiler_note(records: list[dict[str, Any]]) -> str:
    """The candidate's first graph-break reasons by model (the column itself: Method)."""
    reasons = dict.fromkeys(
        f"{row['model']}: {row[f'candidate_{COMPILER_REASONS}']}"
        for row in records
        if not is_blank(row[f"candidate_{COMPILER_REASONS}"])
    )
    return f"Candidate's graph breaks: {'. '.join(reasons)}." if reasons else ""


def _most_per_side(rows: pd.DataFrame, column: str) -> dict[str, int]:
    """Each side's largest ``{side}_{column}`` count over a comparison's rows (blank: 0)."""
    return {
        side: int(pd.to_numeric(rows[f"{side}_{column}"], errors="coerce").fillna(0).max())
        for side in SIDES
    }


def _left_out_note(rows: pd.DataFrame, keep_perturbed: bool) -> str:
    """How many perturbed trials each side had, and whether the speedups left them out."""
    counts = _most_per_side(rows, "perturbed_trials")
    if not any(counts.values()):
        return ""
    what = "kept" if keep_perturbed else "left out of n and the speedup"
    shown = ", ".join(f"{side} up to {n}" for side, n in counts.items() if n)
    reruns = _most_per_side(rows, "reruns")
    ran = ", ".join(f"{side} up to {plural(n, 'rerun')}" for side, n in reruns.items() if n)
    again = f", {ran}" if ran else ""
    return f" Perturbed trials ({shown} per model{again}): {what}."


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
    return Section(
        id="claims",
        title="Speedups against the published claims",
        intro=(
            "Every measured speedup with its interval (n = ok trials of baseline/candidate); a "
            "published claim holds on this machine where its figure lies inside the interval."
        ),
        blocks=[forest, Block(table=Table.of(CLAIMS_TABLE, rows), heading="Claims")],
    )


def _claim_row(name: str, group: Mapping[str, Any], rows: pd.DataFrame) -> dict[str, Any]:
    comparisons = list(dict.fromkeys(rows["comparison"]))
    verdicts = (
        "; ".join(
            f"{verdict}: {count}" for verdict, count in rows["verdict"].value_counts().items()
        )
        if comparisons
        else "not measured: no comparison in the configuration checks this claim"
    )
    shown = {key: group.get(key) for key in ("source", "device", "precision")}
    return {"claim": name, **shown, "comparisons": comparisons, "verdicts": verdicts}


def earlier_section(inputs: ReportInputs) -> Section | None:
    """This run against an earlier one (``compare.earlier``) by scripts/compare.py's rule: the
    machine first, then every cell; None without an earlier run."""
    earlier = inputs.earlier
    if earlier is None:
        return None
    settings = inputs.settings
    keep = settings.conditions.keep_perturbed
    rule = Rule.of(settings)
    compared = compare_runs(earlier, inputs.runs, rule.min_effect, keep, rule.min_window_s)
    machine = [
        Block(note=line) for line in machine_lines(machine_changes(earlier, inputs.runs, keep))
    ]
    headers = ["mark", *DISPLAY_HEADERS[1:]]
    rows = [dict(zip(headers, cells, strict=True)) for cells in display_rows(compared)]
    columns = [
        Column(
            header,
            given(header),
            align="right" if "samples/s" in header or header in ("p", "/ machine") else "left",
            wrap=header in ("change", DISPLAY_HEADERS[3]),
        )
        for header in headers
    ]
    return Section(
        id="earlier",
        title="Against an earlier run",
        intro=(
            f"Each cell of this run (new) against {settings.compare.earlier or 'an earlier run'} "
            "(old), as scripts/compare.py sets them: - slower, + faster, x not comparable."
        ),
        blocks=[
            *machine,
            Block(note=rule_line(rule, "this run's config")),
            Block(
                table=Table.of(columns, rows),
                footnote=verdict_line(compared),
            ),
        ],
    )


def versions_section(inputs: ReportInputs) -> Section | None:
    """The cells measured in several torch versions side by side; None with fewer than two."""
    table = version_table(inputs.summary, torch_versions(inputs.runs))
    if table is None:
        return None
    versions = " → ".join(dict.fromkeys(table.torch.values()))
    return Section(
        id="versions",
        title=f"PyTorch {versions}",
        intro=(
            "The same model, variant, mode and size in each torch environment: its median "
            "throughput (n = ok trials), oldest torch first, then the ratio to the oldest."
        ),
        blocks=[
            Block(table=Table.of(version_columns(table), version_rows(table))),
            *version_blocks(inputs),
        ],
    )


def summary_section(inputs: ReportInputs) -> Section:
    table = Table.of(SUMMARY_TABLE, inputs.summary.to_dict("records"))
    throughput = chart_block(
        lambda: cell_dots(inputs.summary, THROUGHPUT), "Throughput", "no cell has an ok trial"
    )
    return Section(
        id="summary",
        title="Every cell",
        intro=(
            "One row per environment, model, variant, mode and size (a size the model does not "
            "use is blank), over its ok trials (n). First steps, compilation and memory: in Step "
            "times, memory and compilation."
        ),
        blocks=[throughput, Block(table=table), *energy_blocks(inputs)],
    )


def energy_blocks(inputs: ReportInputs) -> list[Block]:
    """Joules per sample where a cell measured them (NVML on CUDA, RAPL on the CPU), and each
    comparison's energy ratio; else why energy was not measured."""
    summary, compared = inputs.summary, inputs.speedups
    measured = summary[summary["median_joules_per_sample"].notna()]
    if measured.empty:
        reasons = dict.fromkeys(
            reason
            for text in summary["energy_not_measured"]
            if not is_blank(text)
            for reason in str(text).split("; ")
        )
        why = "; ".join(reasons) or "no record says why"
        return [Block(heading="Energy", note=f"Energy was not measured: {why}.")]
    blocks = [
        Block(
            heading="Energy",
            note="Energy per sample of each trial's measured window (how: Method).",
            table=Table.of(ENERGY_TABLE, measured.to_dict("records")),
        )
    ]
    ratios = compared[compared["energy_ratio"].notna()]
    if len(ratios):
        note = "Below ×1.00 the candidate spends less energy per sample than the baseline."
        table = Table.of(ENERGY_RATIO_TABLE, ratios.to_dict("records"))
        blocks.append(Block(note=note, table=table))
    return blocks


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
            "The measured step times of each cell, and its peak memory and first step "
            "(compilation included): medians over its ok trials."
        ),
        blocks=[
            Block(
                table=Table.of(FIRST_STEP_TABLE, inputs.summary.to_dict("records")),
                heading="First step, compilation and memory",
            ),
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


def drift_section(inputs: ReportInputs) -> Section:
    blocks = [
        chart_block(
            lambda comparison=comparison: drift_plot(inputs.runs, comparison),
            format_text(comparison.title or name),
            "no ok trial of this comparison recorded when it ran",
        )
        for name, comparison in inputs.settings.comparisons.items()
    ]
    return Section(
        id="drift",
        title="Trials over the run",
        intro=(
            "Each ok trial of a comparison when its measured window started, relative to its "
            "model's baseline median: a drifting machine shows as a slope, a perturbed trial "
            "(cross) as an outlier."
        ),
        blocks=blocks,
    )


def failures_section(inputs: ReportInputs) -> Section:
    runs = inputs.runs
    not_ok = runs[runs["status"] != "ok"]
    failures = Table.of(FAILURES_TABLE, not_ok.to_dict("records"))
    summary = inputs.summary
    noisy = summary[summary["noisy"].map(is_true)] if len(summary) else summary
    noise = Table.of(NOISY_TABLE, noisy.to_dict("records"))
    counts = status_counts(runs["status"]) or "none"
    return Section(
        id="failures",
        title="Failures, unsupported, missing, perturbed and noisy",
        intro=f"Records by status: {counts}. Every record whose status is not ok, with its reason.",
        blocks=[
            Block(table=failures),
            *_retried_blocks(runs),
            _perturbed_block(runs, inputs.settings),
            Block(
                table=noise,
                heading="Noisy cells",
                note="Cells whose trials vary too much to resolve a small speedup (rule: Method).",
            ),
        ],
    )


def _retried_blocks(runs: pd.DataFrame) -> list[Block]:
    """The trials run again at half the batch size after running out of memory (oom_retry)."""
    if "retried_from_batch_size" not in runs.columns:
        return []
    retried = runs[~runs["retried_from_batch_size"].map(is_blank)]
    if retried.empty:
        return []
    table = Table.of(RETRIED_TABLE, retried.to_dict("records"))
    note = "Out of memory at the configured batch size, run again at half of it (oom_retry)."
    return [Block(table=table, heading="Retried at half the batch size", note=note)]


def _perturbed_block(runs: pd.DataFrame, settings: Settings) -> Block:
    """The trials judged perturbed by what ran beside them (see the method's rules)."""
    flagged = runs["perturbed"].map(is_true).astype(bool)
    judged = int(runs["perturbed"].notna().sum())
    kept = settings.conditions.keep_perturbed
    fate = (
        "kept in the speedups (conditions.keep_perturbed)" if kept else "left out of the speedups"
    )
    reruns = int((pd.to_numeric(runs["attempt"], errors="coerce").fillna(0) > 0).sum())
    note = (
        f"{int(flagged.sum())} of {judged} judged ok trials ran perturbed, {fate}; "
        f"{plural(reruns, 'rerun')} (rerun of: the configured trial it repeats)."
    )
    stopped = stopped_sentence(runs, settings)
    note += f" {stopped}" if stopped else ""
    table = Table.of(PERTURBED_TABLE, runs[flagged].to_dict("records"))
    return Block(table=table, heading="Perturbed trials", note=note)


def suites_section(inputs: ReportInputs) -> Section | None:
    """Per suite, comparison and platform: the dynamo dashboard's figures (none without a
    suite in the config)."""
    if not suite_members(inputs.settings):
        return None
    figures = suite_figures(inputs.speedups, inputs.summary, inputs.runs, inputs.settings)
    return Section(
        id="suites",
        title="Suites",
        intro=(
            "Per suite of models, comparison and platform, as PyTorch's compile dashboard sums "
            "up its suites: the models whose both sides ran ok (ran, and passed the numerics "
            "gate); the geometric mean of their speedups, with a 95% interval from a bootstrap "
            "over the models (how much the figure rests on which models the suite holds); the "
            "candidate's median compile time; its peak memory over the baseline's (geometric "
            "mean over models); and every record that was not ok, counted by reason. Each "
            "model's own speedup, with its interval, is in the first section."
        ),
        blocks=[Block(table=Table.of(SUITE_TABLE, figures.to_dict("records")))],
    )


SECTION_BUILDERS: list[Callable[[ReportInputs], Section | None]] = [
    seed_section,
    suites_section,
    claims_section,
    earlier_section,
    versions_section,
    summary_section,
    timing_section,
    drift_section,
    failures_section,
    environments_section,
    method_section,
]


def build_sections(inputs: ReportInputs) -> list[Section]:
    """The page's sections in order, leaving out those whose builder has nothing to show."""
    built = (build(inputs) for build in SECTION_BUILDERS)
    return [section for section in built if section is not None]
