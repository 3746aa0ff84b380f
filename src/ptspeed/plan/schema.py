"""The config's JSON Schema and the defaults it holds, without a validator.

Reading defaults needs only YAML: the aggregation and the GPU check use them on machines that
have no ``jsonschema`` (a GPU node's fixed image), while :mod:`ptspeed.plan.config` validates
against the same file where the workflow runs.
"""

from __future__ import annotations

import copy
import functools
import os
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import yaml

from ptspeed.plan.settings import Settings

PROJECT_DIR = Path(__file__).resolve().parents[3]
SCHEMA_PATH = PROJECT_DIR / "workflow" / "schemas" / "config.schema.yaml"
DEFAULT_CONFIG_PATH = PROJECT_DIR / "config" / "config.yaml"


@functools.cache
def load_schema(path: str | os.PathLike[str] = SCHEMA_PATH) -> dict[str, Any]:
    """The config's JSON Schema, which also holds every config default."""
    with open(path, encoding="utf-8") as handle:
        return yaml.safe_load(handle)


def fill_defaults(instance: Any, schema: Mapping[str, Any]) -> None:
    """Set every absent property that has a ``default`` in ``schema``, recursively through
    ``properties`` (a default ``{}`` gets its own properties' defaults too) and the entries of
    a mapping of names (``additionalProperties``: a platform's)."""
    if not isinstance(instance, dict):
        return
    properties = schema.get("properties") or {}
    for key, spec in properties.items():
        if key not in instance and "default" in spec:
            instance[key] = copy.deepcopy(spec["default"])
        if key in instance:
            fill_defaults(instance[key], spec)
    entries = schema.get("additionalProperties")
    if isinstance(entries, Mapping):
        for key, item in instance.items():
            if key not in properties:
                fill_defaults(item, entries)


def default_of(*keys: str) -> Any:
    """The schema's default of the property at ``keys`` (``default_of("env_cache")``)."""
    spec: Mapping[str, Any] = load_schema()
    for key in keys:
        spec = spec["properties"][key]
    return copy.deepcopy(spec["default"])


def section_with_defaults(config: Mapping[str, Any] | None, name: str) -> dict[str, Any]:
    """The ``name`` section of ``config`` (a run's config snapshot, or None), the schema's
    defaults filling the gaps."""
    given = (config or {}).get(name)
    filled: dict[str, Any] = {name: dict(given) if isinstance(given, Mapping) else {}}
    fill_defaults(filled, {"properties": {name: load_schema()["properties"][name]}})
    return filled[name]


def default_config() -> dict[str, Any]:
    """The default matrix (config/config.yaml) with the schema's defaults filled in."""
    with open(DEFAULT_CONFIG_PATH, encoding="utf-8") as handle:
        config = yaml.safe_load(handle)
    fill_defaults(config, load_schema())
    return config


def settings_from(mapping: Mapping[str, Any]) -> Settings:
    """The settings of an already validated config (the effective config a script reads,
    an older snapshot of it), the schema's defaults filling what it lacks but its ``trials``:
    a config that names none (one written for the tables alone) has no count of trials to
    judge its records by (``trials`` None), rather than the planner's default."""
    filled = copy.deepcopy(dict(mapping))
    fill_defaults(filled, load_schema())
    if "trials" not in mapping:
        filled["trials"] = None
    return Settings.from_mapping(filled)


def default_settings() -> Settings:
    """The settings of the default matrix (config/config.yaml)."""
    return Settings.from_mapping(default_config())
