"""The configuration reference, written from the config's JSON Schema.

Every key of ``workflow/schemas/config.schema.yaml`` becomes a row (key, type, default, what it
does) of ``docs/configuration.md``; ``scripts/docs.py`` writes it and a test checks
that the page and the schema agree, so the reference cannot drift from what is validated.
"""

from __future__ import annotations

import json
from collections.abc import Iterator, Mapping
from typing import Any

from ptspeed.plan.schema import load_schema

HEADER = """# Configuration reference

Generated from `workflow/schemas/config.schema.yaml` by `python3 scripts/docs.py`;
do not edit by hand. `config/config.yaml` is the default matrix, `config/README.md` says how
the parts fit together. `<name>` stands for a name of your choosing.
"""
UNDESCRIBED = "(no description in the schema)"


def reference(schema: Mapping[str, Any] | None = None) -> str:
    """The reference page: one table per top-level key, its nested keys as rows."""
    schema = schema if schema is not None else load_schema()
    sections = [HEADER]
    for key, spec in (schema.get("properties") or {}).items():
        sections.append(f"## `{key}`\n\n{_text(spec, schema)}\n")
        rows = list(_rows(spec, [key], schema))
        if len(rows) > 1 or rows[0][0] != key:
            table = ["| key | type | default | description |", "| --- | --- | --- | --- |"]
            table += [
                f"| `{path}` | {kind} | {default} | {text} |" for path, kind, default, text in rows
            ]
            sections.append("\n".join(table) + "\n")
        else:
            _, kind, default, _ = rows[0]
            sections.append(f"Type: {kind}. Default: {default}.\n")
    return "\n".join(sections)


def undescribed_keys(schema: Mapping[str, Any] | None = None) -> list[str]:
    """Keys the schema gives no description: the reference would say nothing of them."""
    schema = schema if schema is not None else load_schema()
    rows = (row for key, spec in (schema.get("properties") or {}).items()
            for row in _rows(spec, [key], schema))  # fmt: skip
    return [path for path, _, _, text in rows if text == UNDESCRIBED]


def _rows(
    spec: Mapping[str, Any], path: list[str], schema: Mapping[str, Any]
) -> Iterator[tuple[str, str, str, str]]:
    spec = _resolved(spec, schema)
    yield ".".join(path), _kind(spec, schema), _default(spec), _text(spec, schema)
    for key, child in (spec.get("properties") or {}).items():
        yield from _rows(child, [*path, key], schema)
    for child in _named_children(spec):
        yield from _rows(child, [*path, "<name>"], schema)


def _named_children(spec: Mapping[str, Any]) -> Iterator[Mapping[str, Any]]:
    """The schemas of a mapping's values under names the user chooses."""
    extra = spec.get("additionalProperties")
    if isinstance(extra, Mapping):
        yield extra
    yield from (spec.get("patternProperties") or {}).values()


def _resolved(spec: Mapping[str, Any], schema: Mapping[str, Any]) -> Mapping[str, Any]:
    """``spec`` with a local ``$ref`` (``#/$defs/NAME``) merged in beneath its own keys."""
    ref = spec.get("$ref")
    if not isinstance(ref, str) or not ref.startswith("#/$defs/"):
        return spec
    target = schema.get("$defs", {}).get(ref.removeprefix("#/$defs/"), {})
    return {**_resolved(target, schema), **{k: v for k, v in spec.items() if k != "$ref"}}


def _kind(spec: Mapping[str, Any], schema: Mapping[str, Any]) -> str:
    if "enum" in spec:
        return "one of " + ", ".join(f"`{json.dumps(v)}`" for v in spec["enum"])
    if "type" in spec:
        kinds = spec["type"] if isinstance(spec["type"], list) else [spec["type"]]
        return " or ".join(kinds)
    for combined in ("oneOf", "anyOf"):
        if combined in spec:
            return " or ".join(_kind(_resolved(s, schema), schema) for s in spec[combined])
    return "any"


def _default(spec: Mapping[str, Any]) -> str:
    if "default" not in spec:
        return "required" if spec.get("type") != "object" else "—"
    value = spec["default"]
    if value in ({}, []):
        return "empty"
    return f"`{json.dumps(value)}`"


def _text(spec: Mapping[str, Any], schema: Mapping[str, Any]) -> str:
    text = _resolved(spec, schema).get("description") or UNDESCRIBED
    return " ".join(str(text).split()).replace("|", "\\|")
