"""Suites: many models of one family, named once in the config.

A suite (config ``suites``) lists its members, or matches a shell pattern over the names the
family's library knows where the workflow plans (torchvision's builders of one task, say).
:func:`expand_suites` makes each member a model of the config's ``models``, named as the family
names it (lower case; characters a path cannot hold become ``-``), with the suite's sizes, its
``source`` and the ``suite`` it belongs to, which the report's suite figures group by.
"""

from __future__ import annotations

import fnmatch
import re
from collections.abc import Mapping
from typing import Any

from ptspeed.errors import ConfigError
from ptspeed.models.catalog import family_names, importable, torchvision_tasks

SIZE_TABLES = ("cpu", "cuda")


def expand_suites(config: dict[str, Any]) -> None:
    """Add every suite's members to ``config['models']``, in place; :class:`ConfigError` for
    a suite that selects nothing or a member whose name a model already has."""
    for suite, entry in config.get("suites", {}).items():
        for member in suite_members(suite, entry):
            name = model_name(member)
            if name in config["models"]:
                raise ConfigError(
                    f"suites.{suite}: its member {member} is named {name}, as a model already "
                    "is (exclude it, or rename the model)"
                )
            sizes = {key: entry[key] for key in SIZE_TABLES if key in entry}
            config["models"][name] = {
                "source": f"{entry['family']}:{member}",
                "suite": suite,
                **sizes,
            }


def suite_members(suite: str, entry: Mapping[str, Any]) -> list[str]:
    """The names the suite's ``models`` lists, or its ``pattern`` matches (of its ``task``),
    but those of ``exclude``."""
    family = entry["family"]
    if ("models" in entry) == ("pattern" in entry):
        raise ConfigError(f"suites.{suite}: give models (a list) or pattern, one of the two")
    if "task" in entry and family != "torchvision":
        raise ConfigError(f"suites.{suite}.task: only torchvision suites have tasks")
    if "models" in entry:
        return list(entry["models"])
    if not importable(family):
        raise ConfigError(
            f"suites.{suite}.pattern: {family} is not installed where the workflow runs, so "
            "its names cannot be matched; list the models instead"
        )
    known = family_names(family)
    if "task" in entry:
        tasks = torchvision_tasks()
        known = [name for name in known if tasks[name] == entry["task"]]
    excluded = set(entry.get("exclude", ()))
    members = [n for n in fnmatch.filter(known, entry["pattern"]) if n not in excluded]
    if not members:
        raise ConfigError(f"suites.{suite}.pattern: {entry['pattern']!r} matches no {family} model")
    return members


def model_name(member: str) -> str:
    """A member's model name: lower case, with what a path may not hold as ``-``."""
    return re.sub(r"[^a-z0-9._-]", "-", member.lower()).lstrip("._-") or "model"
