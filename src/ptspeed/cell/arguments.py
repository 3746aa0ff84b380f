"""The arguments of ``python -m ptspeed cell``: each field of the cell spec is one flag.

A flag is its field's name with dashes (``measured_steps`` is ``--measured-steps``), of the
field's type, default and help. The command's parser and the argument list that runs a spec
(what the workflow and the scripts start) are both made here from the fields, so a flag is
named nowhere else. Standard library only, like the rest of the cell side.
"""

from __future__ import annotations

import argparse
import dataclasses
import functools
import typing
from collections.abc import Sequence
from typing import Any

from ptspeed.cell.checks import DEVICES, FAULTS, MODES
from ptspeed.cell.faults import FAULTS_VARIABLE
from ptspeed.cell.record import CellSpec
from ptspeed.models import accepted_references

OOM_RETRY = "--oom-retry"
# Set by the command itself (the out-of-memory retry), never asked for.
NOT_ASKED = ("retried_from_batch_size",)
# What the command takes for fields the spec has no default for ('' knobs: the variant's name).
COMMAND_DEFAULTS = {"variant": "eager", "knobs": "", "mode": "train"}
HELP = {
    "model": f"a name or reference: {accepted_references()}",
    "source": "the model's reference when --model is a name of the config's",
    "variant": "variant name (default: eager)",
    "knobs": "knob string of the variant (default: the variant name)",
    "mode": f"one of: {', '.join(MODES)}",
    "device": f"one of: {', '.join(DEVICES)}, cuda:N",
    "fault": f"inject a fault to test the suite: {FAULTS} (else from ${FAULTS_VARIABLE})",
}


def flag(field: str) -> str:
    """``--measured-steps`` for ``measured_steps``."""
    return "--" + field.replace("_", "-")


@functools.cache
def asked_fields() -> tuple[tuple[dataclasses.Field[Any], type], ...]:
    """The spec's fields the command takes, each with its type."""
    hints = typing.get_type_hints(CellSpec)
    fields = dataclasses.fields(CellSpec)
    return tuple((field, hints[field.name]) for field in fields if field.name not in NOT_ASKED)


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """The command's flags: one per asked field, and ``--oom-retry``."""
    for field, kind in asked_fields():
        help_text = HELP.get(field.name, field.metadata["help"]).replace("%", "%%")
        parser.add_argument(flag(field.name), dest=field.name, help=help_text, **_how(field, kind))
    parser.add_argument(
        OOM_RETRY,
        action="store_true",
        help="after running out of memory, run once more at half the batch size",
    )


def _how(field: dataclasses.Field[Any], kind: type) -> dict[str, Any]:
    if kind is bool:
        return {"action": "store_true"}
    default = COMMAND_DEFAULTS.get(field.name, field.default)
    if default is dataclasses.MISSING:
        return {"type": kind, "required": True}
    return {"type": kind, "default": default}


def to_arguments(spec: CellSpec, oom_retry: bool = False) -> list[str]:
    """The arguments that run ``spec`` (all but ``--out``): every asked field, a switch only
    when it is on."""
    arguments = []
    for field, kind in asked_fields():
        value = getattr(spec, field.name)
        if kind is not bool:
            arguments += [flag(field.name), str(value)]
        elif value:
            arguments.append(flag(field.name))
    return arguments + ([OOM_RETRY] if oom_retry else [])


def spec_of(parsed: argparse.Namespace) -> CellSpec:
    """The spec the parsed arguments ask for."""
    values = {field.name: getattr(parsed, field.name) for field, _ in asked_fields()}
    return CellSpec(**{**values, "knobs": values["knobs"] or values["variant"]})


def from_arguments(arguments: Sequence[str]) -> CellSpec:
    """The spec that ``python -m ptspeed cell ARGUMENTS --out …`` runs."""
    parser = argparse.ArgumentParser(prog="ptspeed cell")
    add_arguments(parser)
    return spec_of(parser.parse_args(arguments))
