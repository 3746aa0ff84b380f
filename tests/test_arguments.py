"""ptspeed.cell.arguments: a cell spec as the cell command's arguments, and back."""

from __future__ import annotations

import dataclasses
import os
from typing import Any

import pytest

from ptspeed import cli
from ptspeed.cell.arguments import (
    NOT_ASKED,
    OOM_RETRY,
    flag,
    from_arguments,
    spec_of,
    to_arguments,
)
from ptspeed.cell.record import CellSpec

# A value other than the default for every field the command takes.
OTHER_VALUES: dict[str, Any] = {
    "model": "resnet50",
    "source": "torchvision:resnet18",
    "shape": "layers=2,hidden=64",
    "variant": "compile",
    "knobs": "compile+amp=bf16",
    "mode": "infer",
    "batch_size": 3,
    "image_size": 96,
    "seq_len": 64,
    "env": "torch-2.0",
    "platform": "h100",
    "trial": 4,
    "seed": 7,
    "warmup_steps": 5,
    "measured_steps": 11,
    "numerics_steps": 0,
    "numerics_by_first_trial": True,
    "device": "cuda:1",
    "threads": 3,
    "timeout_s": 90.5,
    "fault": "oom-once",
    "compiler_cache": "/tmp/compiler cache/x",
    "compiler_cache_cold": True,
    "profile_steps": 2,
    "profile_trace": "/tmp/traces x/cell.json.gz",
}
PLAIN = CellSpec(model="mlp", variant="eager", knobs="eager", mode="train", batch_size=2)
ASKED = [field.name for field in dataclasses.fields(CellSpec) if field.name not in NOT_ASKED]


def through_the_command(arguments: list[str]) -> tuple[CellSpec, bool]:
    parsed = cli._parser().parse_args(["cell", *arguments, "--out", os.devnull])
    return spec_of(parsed), parsed.oom_retry


def test_every_field_the_command_takes_has_another_value_here() -> None:
    assert sorted(OTHER_VALUES) == sorted(ASKED)
    assert all(OTHER_VALUES[name] != getattr(PLAIN, name) for name in ASKED)


def test_a_spec_with_every_field_changed_comes_back_the_same() -> None:
    spec = CellSpec(**OTHER_VALUES)
    assert from_arguments(to_arguments(spec)) == spec
    assert through_the_command(to_arguments(spec, oom_retry=True)) == (spec, True)


@pytest.mark.parametrize("name", ASKED)
def test_each_field_alone_comes_back(name: str) -> None:
    spec = dataclasses.replace(PLAIN, **{name: OTHER_VALUES[name]})
    assert through_the_command(to_arguments(spec)) == (spec, False)


def test_a_flag_is_its_fields_name_with_dashes() -> None:
    spec = CellSpec(**OTHER_VALUES)
    flags = [part for part in to_arguments(spec, oom_retry=True) if part.startswith("--")]
    assert flags == [*(flag(name) for name in ASKED), OOM_RETRY]
    assert flag("measured_steps") == "--measured-steps"


def test_switches_are_written_only_when_on() -> None:
    arguments = to_arguments(PLAIN)
    assert flag("compiler_cache_cold") not in arguments
    assert OOM_RETRY not in arguments


def test_by_hand_the_command_needs_only_a_model_and_a_batch_size() -> None:
    assert from_arguments(["--model", "mlp", "--batch-size", "2"]) == PLAIN
    compiled = from_arguments(["--model", "mlp", "--batch-size", "2", "--variant", "compile"])
    assert compiled.knobs == "compile"


def test_the_retry_is_no_argument() -> None:
    with pytest.raises(SystemExit):
        from_arguments(["--model", "mlp", "--batch-size", "2", "--retried-from-batch-size", "4"])
