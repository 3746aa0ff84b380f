"""How a field of the cell record is declared: its default and its meaning together
(:func:`documented`), the meaning kept in the field's ``help`` metadata, from which
:mod:`ptspeed.cell.schema` writes the JSON Schema's descriptions and the cell command its help.

This module must import under Python 3.10 without torch: the cell watchdog uses it.
"""

from __future__ import annotations

import dataclasses
from dataclasses import field
from typing import Any


def documented(text: str, default: Any = dataclasses.MISSING) -> Any:
    """A dataclass field of the record meaning ``text`` (its ``help``), required without a
    ``default``; a list or dict default is copied for each instance."""
    if default is dataclasses.MISSING:
        return field(metadata={"help": text})
    if isinstance(default, (list, dict)):
        return field(default_factory=lambda: type(default)(default), metadata={"help": text})
    return field(default=default, metadata={"help": text})
