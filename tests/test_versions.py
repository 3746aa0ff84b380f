"""The same cells across torch versions (ptspeed.analysis.versions): which rows, in which order,
and the ratio to each row's oldest version."""

from __future__ import annotations

import math
from typing import Any

import pandas as pd
import pytest

from ptspeed.analysis.versions import torch_versions, version_key, version_table

# Environment names that sort against their versions: the order must come from the versions.
TORCH = {"b-old": "1.13.1", "c-mid": "2.0.1", "a-new": "2.14.1+cpu"}


def summary(*cells: tuple[str, str, float, int]) -> pd.DataFrame:
    """Summary rows of resnet50 train at batch 8: (env, variant, median samples/s, ok trials)."""
    rows = [
        {"env": env, "model": "resnet50", "variant": variant, "mode": "train", "batch_size": 8,
         "image_size": 64, "seq_len": 128, "median_samples_per_s": rate, "ok_trials": trials}
        for env, variant, rate, trials in cells
    ]  # fmt: skip
    return pd.DataFrame(rows)


def rates(row: Any) -> dict[str, tuple[float, int, float]]:
    return {env: (row.rates[env], row.trials[env], round(row.ratios[env], 3)) for env in row.rates}


def test_a_cell_in_several_versions_is_a_row_oldest_first_with_its_ratios() -> None:
    table = version_table(
        summary(
            ("a-new", "eager", 150.0, 5),
            ("b-old", "eager", 100.0, 5),
            ("c-mid", "eager", 120.0, 4),
            ("a-new", "compile", 300.0, 5),
            ("c-mid", "compile", 200.0, 5),
            ("b-old", "jit", 90.0, 5),  # one version only: no row
        ),
        TORCH,
    )
    assert table is not None
    assert table.envs == ["b-old", "c-mid", "a-new"]
    assert [row.cell["variant"] for row in table.rows] == ["compile", "eager"]
    compiled, eager = table.rows
    assert rates(eager) == {
        "b-old": (100.0, 5, 1.0),
        "c-mid": (120.0, 4, 1.2),
        "a-new": (150.0, 5, 1.5),
    }
    assert list(compiled.rates) == ["c-mid", "a-new"]  # its oldest is 2.0: the ratio is to it
    assert compiled.ratios["a-new"] == 1.5
    assert compiled.cell == {"platform": "", "model": "resnet50", "variant": "compile",
                             "mode": "train", "batch_size": 8, "image_size": 64,
                             "seq_len": 128}  # fmt: skip


def test_an_environment_without_an_ok_trial_is_not_a_version_of_the_row() -> None:
    cells = summary(("b-old", "compile", math.nan, 0), ("c-mid", "compile", 200.0, 5))
    assert version_table(cells, TORCH) is None


@pytest.mark.parametrize(
    "torch",
    [
        {"b-old": "1.13.1"},  # one environment
        {"b-old": "2.14.1", "c-mid": "2.14.1"},  # two environments of the same torch
        {},  # no record said which torch
    ],
)
def test_fewer_than_two_versions_give_no_table(torch: dict[str, str]) -> None:
    cells = summary(("b-old", "eager", 100.0, 5), ("c-mid", "eager", 120.0, 5))
    assert version_table(cells, torch) is None


def test_each_environments_torch_is_what_most_of_its_ok_records_say() -> None:
    runs = pd.DataFrame(
        [
            {"env": "b-old", "status": "ok", "torch": "1.13.1"},
            {"env": "b-old", "status": "ok", "torch": "1.13.1"},
            {"env": "b-old", "status": "ok", "torch": "1.13.0"},
            {"env": "c-mid", "status": "missing", "torch": None},
            {"env": "c-mid", "status": "failed", "torch": "2.0.1"},
        ]
    )
    assert torch_versions(runs) == {"b-old": "1.13.1"}


def test_version_key_orders_releases_numerically() -> None:
    assert version_key("2.14.1+cpu") == (2, 14, 1)
    assert sorted(["2.14.1", "2.0.1", "1.13.1"], key=version_key) == ["1.13.1", "2.0.1", "2.14.1"]
