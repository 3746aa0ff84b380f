"""Suite figures (ptspeed.analysis.suites), the report's section of them, and where sourced models
came from (the environments section)."""

from __future__ import annotations

import math
from typing import Any

import pandas as pd
import pytest
from helpers import settings_of

from ptspeed.analysis.suites import geomean, geomean_interval, suite_figures, suite_members
from ptspeed.render.method import source_blocks
from ptspeed.render.page import ReportInputs
from ptspeed.render.sections import suites_section

SIDES = {
    "baseline_env": "host",
    "baseline_variant": "eager",
    "candidate_env": "host",
    "candidate_variant": "compile",
}
SIZES = {"batch_size": 2, "image_size": 64, "seq_len": math.nan}
SPEEDUPS = {"a": 2.0, "b": 1.0, "c": 4.0, "d": math.nan}  # d: its candidate failed
CONFIG: dict[str, Any] = {
    "modes": ["train"],
    "models": {
        "mlp": {"cpu": {"batch_size": 2}},
        **{m: {"source": f"torchvision:{m}", "suite": "tv"} for m in SPEEDUPS},
    },
}


def speedups() -> pd.DataFrame:
    rows = [
        {"comparison": "compiler", "title": "eager → compile", "platform": math.nan, "model": m,
         "mode": "train", **SIZES, **SIDES, "speedup": s}
        for m, s in {"mlp": 1.1, **SPEEDUPS}.items()
    ]  # fmt: skip
    return pd.DataFrame(rows)


def summary() -> pd.DataFrame:
    memory = {"eager": 100.0, "compile": 50.0}
    compile_s = {"a": 10.0, "b": 20.0, "c": 40.0, "d": math.nan, "mlp": 1.0}
    rows = [
        {"platform": math.nan, "env": "host", "variant": v, "model": m, "mode": "train", **SIZES,
         "compile_time_s": compile_s[m] if v == "compile" else math.nan,
         "median_peak_memory_bytes": memory[v] if m != "d" or v == "eager" else math.nan}
        for m in ["mlp", *SPEEDUPS] for v in ("eager", "compile")
    ]  # fmt: skip
    return pd.DataFrame(rows)


def runs() -> pd.DataFrame:
    def run(model: str, variant: str, status: str, reason: str = "") -> dict[str, Any]:
        return {"platform": math.nan, "env": "host", "variant": variant, "model": model,
                "mode": "train", "status": status, "reason": reason}  # fmt: skip

    return pd.DataFrame(
        [
            *(run(m, v, "ok") for m in "abc" for v in ("eager", "compile")),
            run("d", "eager", "ok"),
            run("d", "compile", "failed", "BackendCompilerFailed: boom"),
            run("c", "compile", "numerics_mismatch", "loss 0.42 is 2.5% from eager's 0.41"),
            run("b", "compile", "numerics_mismatch", "loss 1.5e-3 is 9% from eager's 4"),
            run("mlp", "compile", "failed", "not a suite's"),
        ]
    )


def test_a_suites_figures_are_the_dashboards() -> None:
    settings = settings_of(CONFIG)
    assert suite_members(settings) == {"tv": ["a", "b", "c", "d"]}
    figures = suite_figures(speedups(), summary(), runs(), settings)
    assert len(figures) == 1
    row = figures.iloc[0]
    assert (row.suite, row.comparison, row["mode"], row.models, row.passed) == (
        "tv", "compiler", "train", 4, 3,
    )  # fmt: skip
    assert row.pass_rate == 0.75
    assert row.geomean_speedup == pytest.approx(2.0)  # (2 x 1 x 4) ** (1/3)
    assert 1.0 <= row.geomean_low < 2.0 < row.geomean_high <= 4.0
    assert row.median_compile_time_s == 20.0
    assert row.memory_ratio == pytest.approx(0.5)
    assert row.failures == (
        "2× numerics_mismatch: loss N is N% from eager's N; 1× failed: BackendCompilerFailed: boom"
    )


def test_the_geomean_interval_is_seeded_and_needs_two_models() -> None:
    assert geomean([]) != geomean([])  # NaN
    assert geomean_interval([3.0]) == pytest.approx((math.nan, math.nan), nan_ok=True)
    values = [1.1, 1.3, 0.9, 1.6, 1.2]
    low, high = geomean_interval(values)
    assert geomean_interval(values) == (low, high)
    assert min(values) <= low < geomean(values) < high <= max(values)


def test_the_report_has_a_suite_section_only_where_the_config_has_suites() -> None:
    inputs = ReportInputs(runs(), summary(), speedups(), settings_of(CONFIG), {})
    section = suites_section(inputs)
    assert section is not None and section.title == "Suites"
    (cells,) = section.blocks[0].table.rows
    low, high = geomean_interval([2.0, 1.0, 4.0])
    assert cells[4:8] == [
        "75.0% (3 of 4)",
        f"×2.00 (+100%) [{low:.2f}–{high:.2f}]",
        "20.00 s",
        "×0.50",
    ]
    plain = {**CONFIG, "models": {"mlp": CONFIG["models"]["mlp"]}}
    assert (
        suites_section(ReportInputs(runs(), summary(), speedups(), settings_of(plain), {})) is None
    )


def test_the_environments_section_says_where_each_sourced_model_came_from() -> None:
    recorded = runs().assign(source="", shape="")
    recorded.loc[recorded.model == "a", "source"] = "torchvision:a"
    recorded.loc[recorded.model == "b", ["source", "shape"]] = ["transformers:llama", "layers=2"]
    (block,) = source_blocks(recorded)
    assert block.heading == "Models by source"
    assert block.table.rows == [
        ["a", "torchvision:a", "—"],
        ["b", "transformers:llama", "layers=2"],
    ]
    assert source_blocks(runs()) == []  # records from before sources: nothing to say
