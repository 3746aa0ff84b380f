"""The project's Jinja environment: the report's pages and the Method section's text are
rendered from ``report/templates`` through it, with the filters that format their numbers
(:mod:`ptspeed.render.formatting`, as everywhere on the page).
"""

from __future__ import annotations

import re
from functools import lru_cache
from pathlib import Path
from typing import Any

import jinja2

from ptspeed.render.formatting import (
    format_number,
    format_percent,
    format_percentages,
    format_text,
    plural,
)

REPO_TEMPLATES_DIR = Path(__file__).resolve().parents[3] / "report" / "templates"


def template_environment(templates_dir: str | Path | None = None) -> jinja2.Environment:
    """Jinja environment over ``templates_dir`` (default: the repository's report/templates)."""
    directory = Path(templates_dir) if templates_dir is not None else REPO_TEMPLATES_DIR
    return _environment(directory.resolve())


@lru_cache(maxsize=8)
def _environment(directory: Path) -> jinja2.Environment:
    environment = jinja2.Environment(
        loader=jinja2.FileSystemLoader(directory),
        autoescape=jinja2.select_autoescape(enabled_extensions=("html.j2",)),
        undefined=jinja2.StrictUndefined,
        keep_trailing_newline=True,
        trim_blocks=True,
        lstrip_blocks=True,
    )
    environment.filters.update(
        md=markdown_cell,
        units=number_units,
        text=format_text,
        percent=format_percent,
        percentages=format_percentages,
        number=format_number,
        plural=plural,
    )
    return environment


def markdown_cell(text: Any) -> str:
    """Text safe inside a Markdown table cell: no pipes or line breaks; a cell's links
    (:class:`~ptspeed.render.tables.LinkedText`) after it as ``[label](href)``."""
    links = getattr(text, "links", ())
    shown = str(text) + "".join(f" [{label}]({href})" for label, href in links)
    return " ".join(shown.split()).replace("|", "\\|")


# Where a number cell may break: before an interval, a trial count or the candidate's side.
_UNIT_BREAK = re.compile(r" (?=\[|\(n=|→)")


def number_units(text: Any) -> list[str]:
    """A number cell's text as the units the page keeps on one line each: the value, its
    interval, its count (``×2.01 (+101%)``, ``[no interval]``), so that a narrow column of
    numbers breaks between them and nowhere else."""
    return _UNIT_BREAK.split(str(text))
