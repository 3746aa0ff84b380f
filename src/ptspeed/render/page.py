"""The report's page structure: the inputs every section is built from, and what a section holds.

The page is a list of :class:`Section` objects, each a title, a short text and blocks: a
:class:`~ptspeed.render.tables.Table` of formatted strings, or a chart
(:mod:`ptspeed.render.figures`, embedded as a PNG data URI). Both templates render any section
the same way.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import pandas as pd

from ptspeed.plan.settings import Settings
from ptspeed.render.figures import Chart
from ptspeed.render.tables import Table


@dataclass(frozen=True)
class Block:
    """One table or one chart, with an optional heading and a short note above it, and a
    footnote below it (what the rows hold in more words than a cell has room for)."""

    table: Table | None = None
    heading: str = ""
    note: str = ""
    chart: Chart | None = None
    footnote: str = ""


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
    settings: Settings
    claims: Mapping[str, Any]
    steps: pd.DataFrame | None = None
    earlier: pd.DataFrame | None = None  # an earlier run's runs table (compare.earlier)


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
