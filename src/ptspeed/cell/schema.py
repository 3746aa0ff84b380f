"""The JSON Schema (2020-12) of a record, derived from the record's dataclasses and their
``help`` metadata, so that the documentation, the schema and the writer cannot drift apart."""

from __future__ import annotations

import dataclasses
import typing
from typing import Any

from ptspeed.cell.record import STATUSES, Record

_SCALARS = {str: "string", int: "integer", float: "number", bool: "boolean"}


def _schema_of(hint: Any) -> dict[str, Any]:
    origin = typing.get_origin(hint)
    args = typing.get_args(hint)
    if origin is typing.Union:
        inner = [a for a in args if a is not type(None)]
        schema = _schema_of(inner[0])
        schema["type"] = [schema["type"], "null"] if "type" in schema else schema["type"]
        return schema
    if origin is list:
        return {"type": "array", "items": _schema_of(args[0])}
    if origin is dict:
        return {"type": "object", "additionalProperties": _schema_of(args[1])}
    if dataclasses.is_dataclass(hint):
        return _dataclass_schema(hint)
    if hint is float:
        return {"type": "number"}
    return {"type": _SCALARS[hint]}


def _dataclass_schema(cls: type) -> dict[str, Any]:
    hints = typing.get_type_hints(cls)
    properties = {}
    for f in dataclasses.fields(cls):
        prop = _schema_of(hints[f.name])
        prop["description"] = f.metadata.get("help", "")
        properties[f.name] = prop
    return {
        "type": "object",
        "description": (cls.__doc__ or "").strip(),
        "properties": properties,
        "required": [f.name for f in dataclasses.fields(cls)],
        "additionalProperties": False,
    }


def json_schema() -> dict[str, Any]:
    """The JSON Schema (2020-12) of a record as written by :func:`write_record`."""
    schema = _dataclass_schema(Record)
    schema["properties"]["status"]["enum"] = list(STATUSES)
    schema["$schema"] = "https://json-schema.org/draft/2020-12/schema"
    schema["title"] = "ptspeed cell record"
    return schema
