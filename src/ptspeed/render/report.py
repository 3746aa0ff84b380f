"""The report: the aggregated tables rendered as one self-contained HTML page and Markdown.

This module checks the inputs, builds the sections (:mod:`ptspeed.render.sections`), renders
both templates (``report/templates``) and writes ``index.html`` and ``report.md``. The Markdown
version carries the tables and names the figures.

Every number on the page is a value of the aggregated CSVs passed through one of the
``format_*`` functions of :mod:`ptspeed.render.formatting`, so the page and the tables cannot
disagree, and every measured value is shown with the number of ok trials it came from (``n=``).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import jinja2
import pandas as pd

from ptspeed.analysis.columns import RUNS_COLUMNS, SPEEDUP_COLUMNS, STEPS_COLUMNS, SUMMARY_COLUMNS
from ptspeed.analysis.conditions import mostly_perturbed
from ptspeed.cell.files import write_atomic
from ptspeed.plan.settings import Settings
from ptspeed.render.page import ReportInputs
from ptspeed.render.sections import build_sections
from ptspeed.render.templates import REPO_TEMPLATES_DIR, template_environment

HTML_TEMPLATE = "index.html.j2"
MARKDOWN_TEMPLATE = "report.md.j2"


def render(
    runs: pd.DataFrame,
    summary: pd.DataFrame,
    speedups: pd.DataFrame,
    settings: Settings,
    claims: Mapping[str, Any],
    out_dir: str | Path,
    templates_dir: str | Path | None = None,
    steps: pd.DataFrame | None = None,
    earlier: pd.DataFrame | None = None,
) -> list[Path]:
    """Write ``index.html`` and ``report.md`` into ``out_dir``; return their paths.

    ``steps`` (the per-step table) feeds the step-time figure; without it the figure is
    replaced by a note. ``earlier`` (an earlier run's runs table, ``compare.earlier``) adds the
    section that sets this run against it. Raises ValueError when a table lacks a column the
    report shows (extra columns are fine).
    """
    check_columns(runs, RUNS_COLUMNS, "runs")
    check_columns(summary, SUMMARY_COLUMNS, "summary")
    check_columns(speedups, SPEEDUP_COLUMNS, "speedups")
    if steps is not None:
        check_columns(steps, STEPS_COLUMNS, "steps")
    environment = page_templates(templates_dir)
    inputs = ReportInputs(runs, summary, speedups, settings, claims, steps, earlier)
    sections = build_sections(inputs)
    warning = mostly_perturbed(runs)
    outputs = {"index.html": HTML_TEMPLATE, "report.md": MARKDOWN_TEMPLATE}
    written = []
    for filename, template in outputs.items():
        text = environment.get_template(template).render(sections=sections, warning=warning)
        path = Path(out_dir) / filename
        write_atomic(path, text)
        written.append(path)
    return written


def check_columns(frame: pd.DataFrame, required: Sequence[str], name: str) -> None:
    missing = [column for column in required if column not in frame.columns]
    if missing:
        raise ValueError(f"{name} table lacks columns: {', '.join(missing)}")


def page_templates(templates_dir: str | Path | None = None) -> jinja2.Environment:
    """The project's Jinja environment over ``templates_dir`` (default: the repository's
    report/templates), which must hold the page's templates."""
    directory = Path(templates_dir) if templates_dir is not None else REPO_TEMPLATES_DIR
    if not (directory / HTML_TEMPLATE).is_file():
        raise FileNotFoundError(f"no report templates in {directory}")
    return template_environment(directory)
