"""ptspeed.plan.matrix: the config turned into cells, and the cross-reference checks."""

from __future__ import annotations

import copy
import dataclasses
import shlex
from typing import Any

import pytest
from helpers import settings_of

from ptspeed.cell.arguments import from_arguments
from ptspeed.errors import ConfigError
from ptspeed.models import Sizes
from ptspeed.plan.matrix import (
    cell_command_line,
    cell_spec,
    cells,
    check_config,
    model_sizes,
    runtime_minutes,
    trial_groups,
)

BASE: dict[str, Any] = {
    "results": "results",
    "trials": 2,
    "timeout_s": 1800,
    "steps": {"warmup": 3, "measured": 10, "numerics": 2},
    "modes": ["train"],
    "environments": {
        "old": {"kind": "venv", "requirements": "envs/torch-1.13.txt", "python": "3.10"},
        "new": {"kind": "host"},
    },
    "models": {
        "mlp": {"cpu": {"batch_size": 32}, "cuda": {"batch_size": 256}},
        "lstm-lm": {"cpu": {"batch_size": 2, "seq_len": 16}},
        "resnet50": {"cpu": {"batch_size": 8, "image_size": 96}},
    },
    "variants": {"eager": "eager", "compile": "compile"},
    "comparisons": {
        "upgrade": {
            "baseline": {"env": "old", "variant": "eager"},
            "candidate": {"env": "new", "variant": "eager"},
        },
        "compiler": {
            "baseline": {"env": "new", "variant": "eager"},
            "candidate": {"env": "new", "variant": "compile"},
        },
    },
}


@pytest.fixture
def config() -> dict[str, Any]:
    return copy.deepcopy(BASE)


def error_of(config: dict[str, Any], device_class: str = "cpu") -> str:
    with pytest.raises(ConfigError) as caught:
        check_config(settings_of(config, device_class))
    return str(caught.value)


# --- cells ----------------------------------------------------------------------------------


def test_pairs_are_those_the_comparisons_need_in_first_mentioned_order(
    config: dict[str, Any],
) -> None:
    pairs = settings_of(config).env_variant_pairs()
    assert pairs == [("old", "eager"), ("new", "eager"), ("new", "compile")]


def test_cell_count_is_the_product_of_the_matrix(config: dict[str, Any]) -> None:
    config["modes"] = ["train", "infer"]
    listed = list(cells(settings_of(config, "cpu")))
    # 2 trials x 3 models x 2 modes x 3 (env, variant) pairs
    assert len(listed) == 2 * 3 * 2 * 3
    assert len(set(listed)) == len(listed)
    assert len({cell.path for cell in listed}) == len(listed)


def test_trials_are_the_outer_loop_so_baseline_and_candidate_alternate(
    config: dict[str, Any],
) -> None:
    config["models"] = {"mlp": config["models"]["mlp"]}
    config["comparisons"] = {"upgrade": config["comparisons"]["upgrade"]}
    config["trials"] = 3
    order = [(cell.env, cell.trial) for cell in cells(settings_of(config, "cpu"))]
    assert order == [("old", 0), ("new", 0), ("old", 1), ("new", 1), ("old", 2), ("new", 2)]


def test_every_trial_lists_every_model_before_the_next_trial(config: dict[str, Any]) -> None:
    trials = [cell.trial for cell in cells(settings_of(config, "cpu"))]
    assert trials == sorted(trials)
    first_trial = [cell for cell in cells(settings_of(config, "cpu")) if cell.trial == 0]
    assert [cell.model for cell in first_trial[::3]] == ["mlp", "lstm-lm", "resnet50"]


def test_a_trial_of_every_side_is_one_group_job_in_alternating_order(
    config: dict[str, Any],
) -> None:
    config["models"] = {"mlp": config["models"]["mlp"]}
    planned = list(cells(settings_of(config, "cpu")))
    groups = trial_groups(planned)
    assert set(groups) == set(planned)
    names = {trial: {groups[c][0] for c in planned if c.trial == trial} for trial in (0, 1)}
    assert names == {0: {"cells.mlp.train.b32.trial0"}, 1: {"cells.mlp.train.b32.trial1"}}

    def order(trial: int) -> list[tuple[str, str]]:
        """The sides of ``trial`` from the first (no cell before it) along the chain."""
        members = {c: before for c, (_, before) in groups.items() if c.trial == trial}
        after = {before: c for c, before in members.items()}
        chain, cell = [], after[None]
        while cell is not None:
            chain.append((cell.env, cell.variant))
            cell = after.get(cell)
        return chain

    assert order(0) == [("old", "eager"), ("new", "eager"), ("new", "compile")]
    assert order(1) == [("new", "compile"), ("new", "eager"), ("old", "eager")]


def test_cells_use_the_size_table_of_the_device_class(config: dict[str, Any]) -> None:
    config["models"] = {"mlp": config["models"]["mlp"]}
    assert {cell.size for cell in cells(settings_of(config, "cpu"))} == {"b32"}
    assert {cell.size for cell in cells(settings_of(config, "cuda"))} == {"b256"}


def test_model_sizes_fill_unset_sizes_with_the_defaults(config: dict[str, Any]) -> None:
    settings = settings_of(config, "cpu")
    assert model_sizes(settings, "lstm-lm") == Sizes(batch_size=2, seq_len=16)
    assert model_sizes(settings, "resnet50") == Sizes(batch_size=8, image_size=96)


@pytest.mark.parametrize(("device_class", "threads"), [("cpu", 4), ("cuda", 0)])
def test_a_jobs_command_line_runs_its_cells_spec(
    config: dict[str, Any], device_class: str, threads: int
) -> None:
    config["models"] = {"resnet50": {"cpu": {"batch_size": 8}, "cuda": {"batch_size": 64}}}
    config["oom_retry"] = True
    cell = next(c for c in cells(settings_of(config, device_class)) if c.trial == 1)
    wildcards = {**vars(cell), "trial": str(cell.trial)}
    line = cell_command_line(settings_of(config, device_class), wildcards, threads=4)
    spec = cell_spec(settings_of(config, device_class), cell, threads)
    assert from_arguments(shlex.split(line)) == spec
    assert line.endswith(" --oom-retry")


def test_only_a_cell_s_first_trial_runs_the_numerics_gate(config: dict[str, Any]) -> None:
    """Reruns (trials past the configured count) too leave the gate to trial 0."""
    config["trials"] = 3
    by_trial = {
        cell.trial: cell_spec(settings_of(config, "cpu"), cell).numerics_by_first_trial
        for cell in cells(settings_of(config, "cpu"))
    }
    rerun = next(cell for cell in cells(settings_of(config, "cpu")) if cell.trial == 2)
    rerun = dataclasses.replace(rerun, trial=5)
    assert by_trial == {0: False, 1: True, 2: True}
    assert cell_spec(settings_of(config, "cpu"), rerun).numerics_by_first_trial


# --- check_config: one line naming the key --------------------------------------------------


def test_a_good_config_passes(config: dict[str, Any]) -> None:
    check_config(settings_of(config, "cpu"))


def test_unknown_model(config: dict[str, Any]) -> None:
    config["models"]["resnet51"] = {"cpu": {"batch_size": 8}}
    message = error_of(config)
    assert message.startswith("models.resnet51: unknown model")
    assert "resnet50" in message  # the accepted names are listed


def test_model_without_sizes_for_the_device_class(config: dict[str, Any]) -> None:
    assert error_of(config, "cuda") == "models.lstm-lm.cuda: no sizes for this device class"


def test_size_outside_the_model_limits(config: dict[str, Any]) -> None:
    config["models"]["resnet50"]["cpu"]["image_size"] = 16
    assert error_of(config).startswith("models.resnet50.cpu.image_size: 16 is outside")


def test_unknown_knob(config: dict[str, Any]) -> None:
    config["variants"]["x"] = "turbo"
    assert error_of(config).startswith("variants.x: knobs: unknown knob 'turbo'")


def test_inconsistent_knobs(config: dict[str, Any]) -> None:
    config["variants"]["fast"] = "eager+compile"
    assert error_of(config).startswith("variants.fast: knobs: eager cannot be combined")


@pytest.mark.parametrize("side", ["baseline", "candidate"])
def test_comparison_naming_a_missing_environment(config: dict[str, Any], side: str) -> None:
    config["comparisons"]["upgrade"][side]["env"] = "nope"
    assert error_of(config) == (
        f"comparisons.upgrade.{side}.env: 'nope' is not an environment (defined: old, new)"
    )


@pytest.mark.parametrize("side", ["baseline", "candidate"])
def test_comparison_naming_a_missing_variant(config: dict[str, Any], side: str) -> None:
    config["comparisons"]["compiler"][side]["variant"] = "amp"
    assert error_of(config) == (
        f"comparisons.compiler.{side}.variant: 'amp' is not a variant (defined: eager, compile)"
    )


def test_comparison_of_a_side_with_itself(config: dict[str, Any]) -> None:
    comparison = config["comparisons"]["compiler"]
    comparison["candidate"] = dict(comparison["baseline"])
    assert error_of(config) == "comparisons.compiler: baseline and candidate are the same"


def test_same_environment_with_different_variants_is_a_comparison(
    config: dict[str, Any],
) -> None:
    config["comparisons"] = {"compiler": config["comparisons"]["compiler"]}
    check_config(settings_of(config, "cpu"))


def test_venv_environment_needs_requirements_and_python(config: dict[str, Any]) -> None:
    del config["environments"]["old"]["python"]
    assert error_of(config) == "environments.old: kind venv needs requirements and python"


def test_container_environment_needs_an_image(config: dict[str, Any]) -> None:
    config["environments"]["new"] = {"kind": "container"}
    assert error_of(config) == "environments.new: kind container needs container"


def test_every_message_is_one_line(config: dict[str, Any]) -> None:
    config["models"]["resnet51"] = {"cpu": {"batch_size": 8}}
    assert "\n" not in error_of(config)


# --- runtime --------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("timeout_s", "minutes"),
    [(1800, 35), (60, 6), (61, 7), (0.5, 6), (604800, 10085)],
)
def test_runtime_is_the_cell_limit_rounded_up_plus_slack(timeout_s: float, minutes: int) -> None:
    assert runtime_minutes(settings_of({**BASE, "timeout_s": timeout_s})) == minutes
