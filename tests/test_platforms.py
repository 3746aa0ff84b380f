"""Platforms: the cluster's GPU types planned, submitted, tabled and reported apart.

The plan (ptspeed.plan.platforms) leaves out what an environment cannot run on a platform's
GPU; the matrix, the job resources, the speedups, the report and compare.py carry the platform.
The runs on a real SLURM with two partitions are in tests/test_slurm.py.
"""

from __future__ import annotations

import dataclasses
import math
from pathlib import Path
from typing import Any

import pandas as pd
import pytest
from helpers import CLAIMS, CONFIG, make_record, settings_of

from ptspeed.analysis.aggregate import load_tables
from ptspeed.analysis.claims import claimed_on_another_gpu
from ptspeed.analysis.compare import compare_runs
from ptspeed.analysis.speedups import speedups
from ptspeed.analysis.summary import summary_table
from ptspeed.cell.gpu_code import published_code
from ptspeed.cell.record import write_record
from ptspeed.errors import ConfigError
from ptspeed.plan.matrix import cells
from ptspeed.plan.platforms import (
    Platform,
    cell_job_resources,
    configured_platforms,
    platform_plan,
)
from ptspeed.render.page import ReportInputs
from ptspeed.render.sections import build_sections
from ptspeed.render.tables import SEED_TABLE, headers

A100 = {"name": "NVIDIA A100-SXM4-80GB", "capability": "8.0"}
H100 = {"name": "NVIDIA H100 80GB HBM3", "capability": "9.0"}
PLATFORMS = {
    "a100": {"partition": "gpu-a100", "gres_type": "a100", "gpu": A100},
    "h100": {"partition": "gpu-h100", "gres_type": "h100", "gpu": H100},
    "b200": {"partition": "gpu-b200", "gpu": "probe"},
}
# What the planner knows of each environment before it is built: its published build's code.
CODES = {
    "torch-1.13": published_code("1.13.1+cu117"),
    "torch-2.0": published_code("2.0.1+cu117"),
    "torch-2.0-cu118": published_code("2.0.1+cu118"),
    "torch-2.14": published_code("2.14.1+cu130"),
    "mine": None,  # a container of the user's: unknown until a cell runs
}
MATRIX: dict[str, Any] = {
    **CONFIG,
    "trials": 2,
    "environments": {env: {"kind": "venv"} for env in CODES},
    "platforms": PLATFORMS,
}
A100_NAME, H100_NAME = A100["name"], H100["name"]


def plan(platforms: dict[str, Any] = PLATFORMS) -> Any:
    return platform_plan(settings_of({**MATRIX, "platforms": platforms}), CODES)


def test_a_config_without_platforms_is_one_unnamed_platform() -> None:
    assert configured_platforms(settings_of(CONFIG)) == (Platform(""),)
    assert plan({}).cannot_run == {}
    assert {cell.platform for cell in cells(settings_of(CONFIG | {"trials": 1}, "cpu"))} == {""}


def test_a_bad_capability_is_one_line_naming_the_field() -> None:
    bad = {"a100": {"gpu": {"capability": "eight"}}}
    with pytest.raises(ConfigError, match=r"^platforms\.a100\.gpu\.capability: 'eight' is not"):
        configured_platforms(settings_of({**CONFIG, "platforms": bad}))


def test_the_plan_leaves_out_what_a_gpu_has_no_code_for() -> None:
    cannot = plan().cannot_run
    assert set(cannot) == {("h100", "torch-1.13"), ("h100", "torch-2.0")}
    reason = cannot[("h100", "torch-1.13")]
    assert reason.startswith(
        f"torch 1.13.1+cu117 has no code for sm_90 ({H100_NAME}); its newest is sm_86"
    )
    # Where it does run among the platforms whose GPU is known (b200 is probed: not named).
    assert reason.endswith("(platform h100; it runs on platform a100)")


def test_a_v100_platform_cannot_run_the_newest_build() -> None:
    v100 = {"v100": {"gpu": {"name": "Tesla V100-SXM2-32GB", "capability": "7.0"}}}
    assert set(plan(v100).cannot_run) == {("v100", "torch-2.14")}


def test_cells_are_planned_per_platform_minus_what_cannot_run() -> None:
    planned = list(cells(settings_of(MATRIX, "cpu"), plan().cannot_run))
    by_platform = {p: {c.env for c in planned if c.platform == p} for p in PLATFORMS}
    assert by_platform == {"a100": {"torch-1.13", "torch-2.0"}, "h100": set(),
                           "b200": {"torch-1.13", "torch-2.0"}}  # fmt: skip
    assert all(cell.path.startswith(f"records/{cell.platform}/") for cell in planned)


def test_each_platforms_cells_go_to_its_partition() -> None:
    resources = cell_job_resources(plan(), {"slurm_account": "proj"})
    assert resources["slurm_account"] == "proj"
    for name, partition in (("a100", "gpu-a100"), ("b200", "gpu-b200")):
        assert resources["slurm_partition"](_Wildcards(f"{name}/")) == partition
    assert "gpu_model" not in resources  # the GPU request: ptspeed.plan.cluster.gpu_request


def test_one_platform_keeps_constant_resources() -> None:
    one = platform_plan(settings_of({**MATRIX, "platforms": {"a100": PLATFORMS["a100"]}}), CODES)
    assert cell_job_resources(one, {"qos": "long"}) == {
        "qos": "long", "slurm_partition": "gpu-a100",
    }  # fmt: skip


def test_a_constraint_on_some_platforms_only_is_refused() -> None:
    platforms = {"a100": {"constraint": "a100"}, "h100": {}}
    with pytest.raises(ConfigError, match=r"^platforms\.h100: sets no constraint"):
        cell_job_resources(plan(platforms), {})


class _Wildcards:
    def __init__(self, platform: str) -> None:
        self.platform = platform


# --- tables and report ---------------------------------------------------------------------------

RATES = {  # (platform, env, variant): samples/s of trials 0 to 3
    ("a100", "torch-1.13", "eager"): [100.0, 102.0, 98.0, 101.0],
    ("a100", "torch-2.0", "compile"): [150.0, 149.0, 152.0, 151.0],
    ("a100", "torch-2.0", "eager"): [110.0, 111.0, 109.0, 110.0],
    ("h100", "torch-2.0", "compile"): [300.0, 301.0, 299.0, 302.0],
    ("h100", "torch-2.0", "eager"): [200.0, 201.0, 199.0, 202.0],
}
GPU_NAMES = {"a100": A100_NAME, "h100": H100_NAME}
TWO_PLATFORMS = {"a100": PLATFORMS["a100"], "h100": PLATFORMS["h100"]}


def platform_records(directory: Path) -> list[Path]:
    paths = []
    for (platform, env, variant), rates in RATES.items():
        for trial, rate in enumerate(rates):
            record = make_record(env, "resnet50", variant, trial, "ok", rate)
            record.cell = dataclasses.replace(record.cell, platform=platform)
            record.provenance.device_name, record.provenance.device_index = GPU_NAMES[platform], 0
            paths.append(directory / f"{platform}-{env}-{variant}-{trial}.json")
            write_record(record, paths[-1])
    return paths


def platform_tables(directory: Path) -> tuple[pd.DataFrame, pd.DataFrame, pd.DataFrame, Any]:
    config = {
        **CONFIG,
        "device": "cuda",
        "environments": MATRIX["environments"],
        "models": {"resnet50": CONFIG["models"]["resnet50"]},
        "platforms": TWO_PLATFORMS,
        "platform_plan": plan(TWO_PLATFORMS).to_json(),
    }
    claims = {**CLAIMS, "pytorch-2.0-upgrade": {**CLAIMS["pytorch-2.0-upgrade"],
              "device": "NVIDIA A100", "device_class": "cuda", "gpu": "A100"}}  # fmt: skip
    runs, _ = load_tables(platform_records(directory))
    summary = summary_table(runs)
    return runs, summary, speedups(summary, settings_of(config), claims, runs), (config, claims)


def test_speedups_are_per_platform_and_the_a100_claim_is_judged_on_the_a100(
    tmp_path: Path,
) -> None:
    _, _, table, _ = platform_tables(tmp_path)
    rows = {(r["comparison"], r["platform"]): r for r in table.to_dict("records")}
    seed_a100 = rows[("upgrade-and-compile", "a100")]
    assert seed_a100["speedup"] == pytest.approx(1.5, rel=0.02)
    assert seed_a100["verdict"] == "consistent with the claim"
    seed_h100 = rows[("upgrade-and-compile", "h100")]
    assert seed_h100["verdict"] == "not measured"
    assert seed_h100["verdict_reason"].startswith("torch 1.13.1+cu117 has no code for sm_90")
    compile_h100 = rows[("compile-alone", "h100")]
    assert compile_h100["speedup"] == pytest.approx(1.5, rel=0.02)
    assert rows[("compile-alone", "a100")]["speedup"] == pytest.approx(150.5 / 110, rel=0.02)


def test_a_claim_on_one_gpu_is_not_judged_on_another() -> None:
    row = {"platform": "h100", "measured_device": f"{H100_NAME} (cuda)"}
    reason = claimed_on_another_gpu({"device": "NVIDIA A100", "gpu": "A100"}, row)
    assert (
        reason
        == f"claimed on NVIDIA A100; platform h100 measured on {H100_NAME} (cuda): another GPU"
    )
    assert (
        claimed_on_another_gpu({"gpu": "A100"}, {**row, "measured_device": f"{A100_NAME} (cuda)"})
        == ""
    )


def test_the_report_has_a_row_per_platform_and_what_each_can_run(tmp_path: Path) -> None:
    runs, summary, table, (config, claims) = platform_tables(tmp_path)
    runs = runs.assign(device=runs["platform"].map({"a100": "cuda", "h100": "cpu"}))
    sections = {
        s.id: s
        for s in build_sections(ReportInputs(runs, summary, table, settings_of(config), claims))
    }
    seed = sections["seed-table"].blocks[0].table
    # As narrow as one platform's table: the platform is a column, each a row of its own.
    assert seed.headers == ["model", "mode", "batch", "platform", *headers(SEED_TABLE)[3:]]
    rows = [row for row in seed.rows if row[0] == "resnet50"]
    assert [row[3] for row in rows] == ["a100", "h100"]
    verdicts = [row[seed.headers.index("verdict")] for row in rows]
    assert verdicts[0].startswith("consistent with the claim")
    assert verdicts[1].startswith("not measured")
    can_run = sections["environments"].blocks[0]
    assert can_run.heading == "What each platform can run"
    cells_of = {r[0]: r for r in can_run.table.rows}
    h100 = can_run.table.headers.index(f"h100: {H100_NAME} (sm_90)")
    assert cells_of["torch-1.13"][h100].startswith("cannot: torch 1.13.1+cu117 has no code")
    assert cells_of["torch-2.14"][h100] == "runs"
    assert "sm_37 sm_50 sm_60 sm_70 sm_75 sm_80 sm_86" in cells_of["torch-2.0"][1]
    assert can_run.note.endswith("Device of each platform's cells: a100 cuda; h100 cpu.")


def test_compare_matches_cells_of_the_same_platform_only(tmp_path: Path) -> None:
    runs, _, _, _ = platform_tables(tmp_path)
    old = runs[runs["platform"] == "a100"]
    new = runs[runs["platform"] == "h100"].assign(platform="a100")
    moved = compare_runs(old, runs[runs["platform"] == "h100"])
    assert set(moved["platform"]) == {"a100", "h100"}
    assert all(math.isnan(ratio) for ratio in moved["ratio"])
    same = compare_runs(old, new)
    assert not same["ratio"].isna().all()
