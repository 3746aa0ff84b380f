"""Where a cell's record lives, and how the path writes the cell's sizes.

A cell is ``[<platform>/]<env>/<model>/<variant>/<mode>/<size>/trial<N>``, and its record is
``records/<cell>.json`` under the results directory. The platform (a GPU type of the cluster,
config ``platforms``) is there only where the config names platforms: a run on one machine is
one unnamed platform, and its paths are as they always were. The size is a label,
``b<batch_size>[-i<image_size>][-s<seq_len>]``: the batch size and those sizes the model uses,
so that a size the model ignores never splits its cells. A size the label leaves out is at its
default, which the cell takes when none is given.

The matrix writes paths, the aggregation and the staleness check read them back, and the
workflow takes its output patterns and wildcard constraints from here. Light to import (the
standard library and the cell side's constants): the Snakefile imports it.
"""

from __future__ import annotations

import re
from collections.abc import Collection, Iterable, Mapping
from dataclasses import dataclass
from pathlib import Path, PurePath
from typing import Any

from ptspeed.cell.checks import MODES
from ptspeed.errors import InputError
from ptspeed.models import DEFAULT_IMAGE_SIZE, DEFAULT_SEQ_LEN
from ptspeed.plan.settings import Settings

DEVICE_CLASSES = ("cpu", "cuda")
DEFAULT_SIZES = {"image_size": DEFAULT_IMAGE_SIZE, "seq_len": DEFAULT_SEQ_LEN}
SIZE_KEYS = ("batch_size", *DEFAULT_SIZES)
SIZE_LETTERS = {"batch_size": "b", "image_size": "i", "seq_len": "s"}

# A name of an environment, model or variant: the config schema's $defs/name.
NAME = r"[a-z0-9][a-z0-9._-]*"
# A whole number as Python writes it: no sign, no leading zeros.
NUMBER = r"(?:0|[1-9][0-9]*)"
RECORDS = "records"
# The platform wildcard holds its directory with the slash ("a100/"), or nothing.
PLACE_PATTERN = "{platform}{env}/{model}/{variant}/{mode}/{size}"
CELL_PATTERN = f"{PLACE_PATTERN}/trial{{trial}}"
RECORD_PATTERN = f"{RECORDS}/{CELL_PATTERN}.json"
# The trace of a cell's profiled steps (its first trial's), gzipped Chrome trace JSON.
TRACES = "traces"
TABLES = "tables"
TRACE_PATTERN = f"{TRACES}/{PLACE_PATTERN}.json.gz"


def _size_regex(named: bool) -> str:
    def number(key: str) -> str:
        return f"(?P<{key}>{NUMBER})" if named else NUMBER

    optional = "".join(f"(?:-{SIZE_LETTERS[key]}{number(key)})?" for key in DEFAULT_SIZES)
    return f"{SIZE_LETTERS['batch_size']}{number('batch_size')}{optional}"


SIZE_LABEL = _size_regex(named=False)
_SIZE_LABEL = re.compile(_size_regex(named=True))
_TRIAL_FILE = re.compile(rf"trial({NUMBER})\.json")


@dataclass(frozen=True)
class Cell:
    env: str
    model: str
    variant: str
    mode: str
    size: str
    trial: int
    platform: str = ""

    @property
    def key(self) -> str:
        """The cell without its trial: ``[platform/]env/model/variant/mode/size``."""
        return PLACE_PATTERN.format(**self._wildcards())

    @property
    def path(self) -> str:
        """The record's path under the results directory."""
        return RECORD_PATTERN.format(**self._wildcards())

    @property
    def trace(self) -> str:
        """The trace of the cell's profiled steps under the results directory."""
        return TRACE_PATTERN.format(**self._wildcards())

    def _wildcards(self) -> dict[str, Any]:
        return {**vars(self), "platform": platform_directory(self.platform)}

    @classmethod
    def from_wildcards(cls, wildcards: Mapping[str, str]) -> Cell:
        """The cell of a job of the workflow's rule cell."""
        place = {key: wildcards[key] for key in ("env", "model", "variant", "mode", "size")}
        platform = wildcards["platform"].rstrip("/")
        return cls(**place, trial=int(wildcards["trial"]), platform=platform)

    @classmethod
    def from_path(cls, path: str | PurePath) -> Cell | None:
        """The cell a record path names (``.../records/[<platform>/]<cell>.json``), else None."""
        parts = PurePath(path).parts
        if len(parts) >= 7 and parts[-7] == RECORDS:
            platform = ""
        elif len(parts) >= 8 and parts[-8] == RECORDS and re.fullmatch(NAME, parts[-7]):
            platform = parts[-7]
        else:
            return None
        env, model, variant, mode, size, name = parts[-6:]
        trial = _TRIAL_FILE.fullmatch(name)
        if trial is None or parse_size_label(size) is None:
            return None
        return cls(env, model, variant, mode, size, int(trial[1]), platform)


def runs_csv_of(path: str | PurePath) -> Path:
    """The runs table a path stands for: the file itself, or ``runs.csv`` or
    ``tables/runs.csv`` in a directory (a results directory or its tables)."""
    path = Path(path)
    if path.is_file():
        return path
    if path.is_dir():
        for candidate in (path / "runs.csv", path / TABLES / "runs.csv"):
            if candidate.is_file():
                return candidate
        raise InputError(f"{path}: no runs.csv or {TABLES}/runs.csv in this directory")
    raise InputError(f"{path}: no such file or directory")


def platform_directory(platform: str) -> str:
    """What a platform adds to a cell's path: ``a100/``, or nothing for the unnamed one."""
    return f"{platform}/" if platform else ""


def cell_from_path(path: str | PurePath) -> dict[str, Any]:
    """The cell a record path names, as CellSpec fields (every size included), else ``{}``."""
    cell = Cell.from_path(path)
    if cell is None:
        return {}
    keys = ("platform", "env", "model", "variant", "mode", "trial")
    place = {key: getattr(cell, key) for key in keys}
    return {**place, **(parse_size_label(cell.size) or {})}


def size_label(sizes: Mapping[str, Any], used: Collection[str] = SIZE_KEYS) -> str:
    """``b8-i96``: the batch size and those of the other sizes in ``used``."""
    keys = [key for key in SIZE_KEYS if key == "batch_size" or key in used]
    return "-".join(f"{SIZE_LETTERS[key]}{sizes[key]}" for key in keys)


def parse_size_label(label: str) -> dict[str, int] | None:
    """Every size a label stands for (those it leaves out at their defaults); None when
    ``label`` is not one."""
    match = _SIZE_LABEL.fullmatch(label)
    if match is None:
        return None
    given = match.groupdict()
    return {key: int(given[key]) if given[key] else DEFAULT_SIZES[key] for key in SIZE_KEYS}


def configured_sizes(settings: Settings, model: str, device_class: str) -> dict[str, Any] | None:
    """The sizes ``settings`` sets for ``model`` on ``device_class``, those it leaves out at
    their defaults; None when it sets none."""
    table = settings.model_sizes(model, device_class)
    if table is None:
        return None
    given = {"image_size": table.image_size, "seq_len": table.seq_len}
    defaults = {key: given[key] or default for key, default in DEFAULT_SIZES.items()}
    return {"batch_size": table.batch_size, **defaults}


def wildcard_constraints(
    environments: Iterable[str], platforms: Iterable[str] = ()
) -> dict[str, str]:
    """The regular expressions of the workflow's wildcards: each matches exactly what the
    paths above are made of (``environments``, ``platforms``: the configured names)."""
    named = "|".join(re.escape(platform_directory(name)) for name in platforms if name)
    return {
        "platform": f"(?:{named})?" if named else "(?:)",
        "env": "|".join(map(re.escape, environments)),
        "model": NAME,
        "variant": NAME,
        "mode": "|".join(MODES),
        "size": SIZE_LABEL,
        "trial": NUMBER,
    }
