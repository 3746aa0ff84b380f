"""The two runs a comparison reads (:mod:`ptspeed.analysis.compare`): each one's runs table,
checked for the columns a comparison needs, and the rows whose cell is known; the settings
it is compared by where not given, from the config snapshot beside the compared run's tables;
and the speedups table beside a run's runs table, for the cross-check.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pandas as pd

from ptspeed.analysis.aggregate import read_mapping
from ptspeed.analysis.columns import CELL_KEYS, platform_column, read_table
from ptspeed.errors import InputError
from ptspeed.plan.layout import runs_csv_of
from ptspeed.plan.schema import section_with_defaults

# The config the workflow writes beside a run's tables (rule effective_config).
CONFIG_SNAPSHOT = "config.json"
# Tables from before platforms have no platform column: they are one unnamed platform.
REQUIRED_COLUMNS = [
    *(key for key in CELL_KEYS if key != "platform"),
    "status",
    "throughput_samples_per_s",
]


def read_runs(path: str | Path) -> pd.DataFrame:
    """The runs table of a result set, checked for the columns a comparison needs."""
    csv = runs_csv_of(path)
    try:
        runs = read_table(csv)
    except (pd.errors.ParserError, pd.errors.EmptyDataError, UnicodeDecodeError) as error:
        raise InputError(f"{csv}: not a runs table ({error})") from error
    missing = [column for column in REQUIRED_COLUMNS if column not in runs.columns]
    if missing:
        raise InputError(f"{csv}: not a runs table, lacks columns: {', '.join(missing)}")
    return runs


def known_rows(runs: pd.DataFrame) -> pd.DataFrame:
    """The rows whose cell is known, with their platform (a run without platforms: one
    unnamed)."""
    known = runs[runs["env"].notna()]
    return known.assign(platform=platform_column(known))


def plain_value(value: Any) -> Any:
    """A key part that compares equal across the two tables (NaN != NaN would split cells)."""
    if value is None or value is pd.NA or (isinstance(value, float) and math.isnan(value)):
        return None
    return int(value) if isinstance(value, float) and value.is_integer() else value


def speedups_beside(runs_path: str | Path) -> Path | None:
    """The speedups.csv beside a result set's runs.csv, if there is one."""
    candidate = runs_csv_of(runs_path).with_name("speedups.csv")
    return candidate if candidate.is_file() else None


@dataclass(frozen=True)
class Defaults:
    """The settings a comparison uses where not given, and where they came from."""

    min_effect: float
    min_window_s: float
    keep_perturbed: bool
    source: str


def config_beside(runs_path: str | Path) -> Path | None:
    """The config snapshot of a result set: ``config.json`` in its results directory (beside
    ``tables/``) or beside its runs.csv; None where there is none."""
    csv = runs_csv_of(runs_path)
    for directory in (csv.parent, csv.parent.parent):
        if (directory / CONFIG_SNAPSHOT).is_file():
            return directory / CONFIG_SNAPSHOT
    return None


def run_defaults(old_path: str | Path, new_path: str | Path) -> Defaults:
    """The compared run's own settings: from the new run's config snapshot, else the old
    run's, else the schema's defaults."""
    for path in (config_beside(new_path), config_beside(old_path)):
        if path is not None:
            return defaults_of(read_mapping(path), str(path))
    return defaults_of(None, "the config schema")


def defaults_of(config: Mapping[str, Any] | None, source: str) -> Defaults:
    conditions = section_with_defaults(config, "conditions")
    return Defaults(
        float(section_with_defaults(config, "compare")["min_effect"]),
        float(conditions["min_window_s"]),
        bool(conditions["keep_perturbed"]),
        source,
    )
