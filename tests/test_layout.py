"""ptspeed.plan.layout: record paths and size labels, written and read back the same way."""

from __future__ import annotations

import re
from dataclasses import asdict
from typing import Any

import pytest
import yaml
from helpers import CONFIG, settings_of
from hypothesis import given
from hypothesis import strategies as st

from ptspeed.cell.record import CellSpec
from ptspeed.models import REGISTRY, Sizes
from ptspeed.plan.layout import (
    DEFAULT_SIZES,
    MODES,
    NAME,
    RECORD_PATTERN,
    SIZE_KEYS,
    Cell,
    cell_from_path,
    configured_sizes,
    parse_size_label,
    size_label,
    wildcard_constraints,
)
from ptspeed.plan.schema import SCHEMA_PATH

ENVIRONMENTS = ("host", "host-b", "torch-2.0")
PLATFORMS = ("a100", "h100")

names = st.from_regex(rf"\A{NAME}\Z", fullmatch=True).filter(lambda name: len(name) <= 64)
sizes = st.builds(
    Sizes,
    batch_size=st.integers(1, 65536),
    image_size=st.integers(1, 4096),
    seq_len=st.integers(1, 65536),
)
used_sizes = st.sets(st.sampled_from(tuple(DEFAULT_SIZES)))


@st.composite
def cells(draw: st.DrawFn) -> Cell:
    label = size_label(asdict(draw(sizes)), draw(used_sizes))
    place = [draw(st.sampled_from(ENVIRONMENTS)), draw(names), draw(names)]
    trial = draw(st.integers(0, 10**6))
    platform = draw(st.sampled_from(("", *PLATFORMS)))
    return Cell(*place, draw(st.sampled_from(MODES)), label, trial, platform)


def snakemake_regex(pattern: str, platforms: tuple[str, ...] = PLATFORMS) -> re.Pattern[str]:
    """The pattern with each wildcard replaced by its constraint, as Snakemake matches paths."""
    constraints = wildcard_constraints(ENVIRONMENTS, platforms)
    parts = re.split(r"\{(\w+)\}", pattern)
    literal, wildcards = parts[::2], parts[1::2]
    groups = [f"(?P<{name}>{constraints[name]})" for name in wildcards]
    pieces = zip(literal, [*groups, ""], strict=True)
    return re.compile("".join(re.escape(text) + group for text, group in pieces))


def test_cell_path_names_every_coordinate() -> None:
    cell = Cell("torch-2.0", "gpt2", "compile", "infer", "b2-s64", 4)
    assert cell.path == "records/torch-2.0/gpt2/compile/infer/b2-s64/trial4.json"
    assert cell.key == "torch-2.0/gpt2/compile/infer/b2-s64"


def test_a_platform_is_a_directory_above_the_environment() -> None:
    cell = Cell("torch-2.0", "gpt2", "compile", "infer", "b2-s64", 4, "h100")
    assert cell.path == "records/h100/torch-2.0/gpt2/compile/infer/b2-s64/trial4.json"
    assert Cell.from_path(f"results/{cell.path}") == cell
    assert cell_from_path(f"results/{cell.path}")["platform"] == "h100"


def test_without_platforms_the_constraint_matches_no_platform_directory() -> None:
    unnamed = snakemake_regex(RECORD_PATTERN, platforms=())
    assert unnamed.fullmatch("records/host/mlp/eager/train/b8/trial0.json")
    assert not unnamed.fullmatch("records/a100/host/mlp/eager/train/b8/trial0.json")
    named = snakemake_regex(RECORD_PATTERN)
    assert not named.fullmatch("records/b200/host/mlp/eager/train/b8/trial0.json")


@given(cells())
def test_a_cell_is_read_back_from_its_path(cell: Cell) -> None:
    assert Cell.from_path(f"results/{cell.path}") == cell
    read = cell_from_path(f"/abs/results/{cell.path}")
    place = ("platform", "env", "model", "variant", "mode", "trial")
    assert {key: read[key] for key in place} == {key: getattr(cell, key) for key in place}
    assert {key: read[key] for key in SIZE_KEYS} == parse_size_label(cell.size)


@given(cells())
def test_the_wildcard_constraints_match_every_path_the_layout_writes(cell: Cell) -> None:
    match = snakemake_regex(RECORD_PATTERN).fullmatch(cell.path)
    assert match is not None
    assert Cell.from_wildcards(match.groupdict()) == cell


def test_a_cell_from_the_workflows_wildcards() -> None:
    wildcards = {"env": "host", "model": "mlp", "variant": "eager", "mode": "train"}
    cell = Cell.from_wildcards({**wildcards, "size": "b8", "trial": "2", "platform": ""})
    assert cell == Cell("host", "mlp", "eager", "train", "b8", 2)
    cell = Cell.from_wildcards({**wildcards, "size": "b8", "trial": "2", "platform": "a100/"})
    assert cell == Cell("host", "mlp", "eager", "train", "b8", 2, "a100")


# --- size labels ------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("model", "sizes", "label"),
    [
        ("mlp", Sizes(batch_size=32, image_size=96, seq_len=7), "b32"),
        ("resnet50", Sizes(batch_size=8, image_size=96), "b8-i96"),
        ("bert-base", Sizes(batch_size=4, seq_len=64), "b4-s64"),
        ("lstm-lm", Sizes(batch_size=2, seq_len=4), "b2-s4"),
    ],
)
def test_size_label_names_only_the_sizes_the_model_uses(
    model: str, sizes: Sizes, label: str
) -> None:
    assert size_label(asdict(sizes), REGISTRY[model].uses) == label


def test_size_label_names_every_size_unless_told() -> None:
    assert size_label({"batch_size": 8, "image_size": 224, "seq_len": 128}) == "b8-i224-s128"


@given(sizes, used_sizes)
def test_a_size_label_is_read_back_with_the_sizes_it_leaves_out_at_their_defaults(
    sizes: Sizes, used: set[str]
) -> None:
    label = size_label(asdict(sizes), used)
    expected = {**DEFAULT_SIZES, **{key: getattr(sizes, key) for key in used}}
    assert parse_size_label(label) == {"batch_size": sizes.batch_size, **expected}


@pytest.mark.parametrize(
    "label", ["8", "b", "b08", "b8-", "b8-i", "b8-s4-i3", "b8-q1", "b-1", "b8-i96-i96", "B8", " b8"]
)
def test_what_the_layout_never_writes_is_no_size_label(label: str) -> None:
    assert parse_size_label(label) is None
    assert not re.fullmatch(wildcard_constraints(ENVIRONMENTS)["size"], label)


@given(st.text(alphabet="bis0123456789-", max_size=14))
def test_the_size_constraint_accepts_exactly_what_the_parser_reads(label: str) -> None:
    constraint = wildcard_constraints(ENVIRONMENTS)["size"]
    assert (re.fullmatch(constraint, label) is not None) == (parse_size_label(label) is not None)


def test_the_cell_and_the_models_default_to_the_layouts_sizes() -> None:
    spec = CellSpec(model="mlp", variant="eager", knobs="eager", mode="train", batch_size=1)
    assert {key: getattr(spec, key) for key in DEFAULT_SIZES} == DEFAULT_SIZES
    assert {key: getattr(Sizes(batch_size=1), key) for key in DEFAULT_SIZES} == DEFAULT_SIZES


def test_names_are_what_the_config_schema_accepts() -> None:
    schema = yaml.safe_load(SCHEMA_PATH.read_text(encoding="utf-8"))
    assert schema["$defs"]["name"]["pattern"] == f"^{NAME}$"


# --- record paths -----------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("path", "cell"),
    [
        (
            "results/records/torch-2.0/gpt2/compile/train/b2-s64/trial3.json",
            {"platform": "", "env": "torch-2.0", "model": "gpt2", "variant": "compile",
             "mode": "train", "trial": 3, "batch_size": 2, "image_size": 224, "seq_len": 64},
        ),
        (
            "/x/records/host/resnet50/eager/infer/b8-i96/trial0.json",
            {"platform": "", "env": "host", "model": "resnet50", "variant": "eager",
             "mode": "infer", "trial": 0, "batch_size": 8, "image_size": 96, "seq_len": 128},
        ),
        ("records/m/v/train/b8/trial0.json", {}),  # too short: no env
        ("x/records/e/m/v/train/8/trial0.json", {}),
        ("x/records/e/m/v/train/b8-q1/trial0.json", {}),
        ("x/records/e/m/v/train/b8/trialX.json", {}),
        ("x/records/e/m/v/train/b8/trial01.json", {}),
        ("x/records/e/m/v/train/b8/trial1.txt", {}),
        ("x/other/e/m/v/train/b8/trial0.json", {}),
    ],
)  # fmt: skip
def test_cell_from_path_reads_the_workflow_layout(path: str, cell: dict[str, Any]) -> None:
    assert cell_from_path(path) == cell


# --- configured sizes -------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("models", "device_class", "expected"),
    [
        ({"gpt2": {"cpu": {"batch_size": 2, "seq_len": 64}}}, "cpu", (2, 224, 64)),
        ({"gpt2": {"cpu": {"batch_size": 2}, "cuda": {"batch_size": 32}}}, "cuda", (32, 224, 128)),
        ({"gpt2": {"batch_size": 4, "image_size": 96}}, "cuda", (4, 96, 128)),  # one for all
        ({"gpt2": {"cpu": {"batch_size": 2}}}, "cuda", None),
        ({"gpt2": {"cpu": {"batch_size": 2}}}, "auto", None),
        ({"mlp": {"cpu": {"batch_size": 2}}}, "cpu", None),
    ],
)
def test_configured_sizes_fill_the_defaults(
    models: Any, device_class: str, expected: tuple[int, int, int] | None
) -> None:
    found = configured_sizes(settings_of({**CONFIG, "models": models}), "gpt2", device_class)
    assert found == (dict(zip(SIZE_KEYS, expected, strict=True)) if expected else None)
