"""Aggregation: records in, runs/summary/speedups frames and CSVs out."""

from __future__ import annotations

import dataclasses
import json
import math
from pathlib import Path
from typing import Any

import pandas as pd
import pytest
from helpers import (
    CLAIMS,
    CONFIG,
    CORRUPT_NAME,
    SIZES,
    aggregate_cli,
    make_record,
    run_aggregate_script,
    settings_of,
    write_fixture_records,
    write_inputs,
)

from ptspeed.analysis import ranks, stats
from ptspeed.analysis.aggregate import load_records, load_tables, read_settings
from ptspeed.analysis.claims import verdict
from ptspeed.analysis.columns import (
    COMPILER_COLUMNS,
    MISSING_REASON,
    RUNS_COLUMNS,
    SPEEDUP_COLUMNS,
    STEPS_COLUMNS,
    SUMMARY_COLUMNS,
    read_table,
)
from ptspeed.analysis.speedups import speedups
from ptspeed.analysis.summary import coefficient_of_variation, summary_table
from ptspeed.cell.record import write_record

REPO = Path(__file__).resolve().parents[1]


@pytest.fixture
def record_paths(tmp_path: Path) -> list[Path]:
    return write_fixture_records(tmp_path / "records")


@pytest.fixture
def runs(record_paths: list[Path]) -> pd.DataFrame:
    return load_records(record_paths)


def summary_row(summary: pd.DataFrame, env: str, model: str, variant: str) -> pd.Series:
    match = summary[
        (summary["env"] == env)
        & (summary["model"] == model)
        & (summary["variant"] == variant)
        & (summary["batch_size"] == SIZES[model]["batch_size"])
    ]
    assert len(match) == 1
    return match.iloc[0]


def speedup_row(frame: pd.DataFrame, comparison: str, model: str) -> pd.Series:
    match = frame[(frame["comparison"] == comparison) & (frame["model"] == model)]
    assert len(match) == 1
    return match.iloc[0]


# --- runs ----------------------------------------------------------------------------------------


def test_runs_has_one_row_per_file_in_order(runs: pd.DataFrame, record_paths: list[Path]) -> None:
    assert list(runs.columns) == RUNS_COLUMNS
    assert list(runs["record_path"]) == [str(p) for p in record_paths]
    assert runs["status"].value_counts().to_dict() == {
        "ok": 12,
        "failed": 1,
        "unsupported": 1,
        "unreadable": 1,
    }


def test_runs_flattens_cell_metrics_numerics_and_provenance(runs: pd.DataFrame) -> None:
    first = runs.iloc[0]
    assert (first["env"], first["model"], first["variant"], first["mode"]) == (
        "torch-1.13",
        "resnet50",
        "eager",
        "train",
    )
    assert (first["batch_size"], first["image_size"], first["trial"]) == (8, 96, 0)
    assert first["throughput_samples_per_s"] == 100.0
    assert first["peak_memory_bytes"] == 100 * 1024 * 1024
    assert first["numerics_passed"]
    assert first["numerics_tolerance"] == 1e-4
    assert (first["torch"], first["cuda"], first["git_commit"]) == ("1.13.1", "11.7", "1234567")
    assert (first["cudnn"], first["python"], first["torchvision"]) == ("8500", "3.10.13", "0.15.2")
    assert first["transformers"] == ""  # not installed: blank, not an error
    assert pd.isna(first["device_index"])  # a CPU run
    assert "step_times_s" not in runs.columns


def test_corrupt_file_becomes_an_unreadable_row_naming_it(runs: pd.DataFrame) -> None:
    bad = runs[runs["status"] == "unreadable"].iloc[0]
    assert bad["record_path"].endswith(CORRUPT_NAME)
    assert CORRUPT_NAME in bad["reason"]
    assert "not JSON" in bad["reason"]
    assert pd.isna(bad["env"])


@pytest.mark.parametrize(
    ("content", "problem"),
    [
        ("[1, 2]", "top level is list"),
        ('{"status": "ok"}', "missing cell"),
        ('{"cell": {"model": "m"}, "status": "ok"}', "not a record"),
        (
            '{"cell": {"model": "m", "variant": "v", "knobs": "", "mode": "train", '
            '"batch_size": 1}, "status": "exploded"}',
            "not a record",
        ),
        ('{"cell": "nope", "status": "ok"}', "'cell' is not an object"),
        (b"\xff\xfe\x00", "decode"),
    ],
)
def test_files_that_are_not_records_become_unreadable_rows(
    tmp_path: Path, content: str | bytes, problem: str
) -> None:
    path = tmp_path / "odd.json"
    if isinstance(content, bytes):
        path.write_bytes(content)
    else:
        path.write_text(content, encoding="utf-8")
    row = load_records([path]).iloc[0]
    assert row["status"] == "unreadable"
    assert str(path) in row["reason"]
    assert problem in row["reason"]


def test_missing_file_becomes_a_missing_row_naming_it(tmp_path: Path) -> None:
    missing = tmp_path / "gone.json"
    row = load_records([missing]).iloc[0]
    assert row["status"] == "missing"
    assert row["reason"] == f"{missing}: {MISSING_REASON}"
    assert pd.isna(row["env"])  # not a workflow path: the cell is unknown


def test_unreadable_file_is_not_missing(tmp_path: Path) -> None:
    directory = tmp_path / "a-directory.json"
    directory.mkdir()
    row = load_records([directory]).iloc[0]
    assert row["status"] == "unreadable"
    assert str(directory) in row["reason"]


def test_missing_and_unreadable_records_count_as_trials_of_their_cell(tmp_path: Path) -> None:
    ok = tmp_path / "results/records/torch-2.0/gpt2/compile/train/b2-s64/trial0.json"
    write_record(make_record("torch-2.0", "gpt2", "compile", 0, "ok", 50.0), ok)
    missing = tmp_path / "results/records/torch-2.0/gpt2/compile/train/b2-s64/trial1.json"
    corrupt = tmp_path / "results/records/torch-2.0/gpt2/compile/train/b2-s64/trial2.json"
    corrupt.write_text("{", encoding="utf-8")
    runs = load_records([ok, missing, corrupt])
    assert list(runs["status"]) == ["ok", "missing", "unreadable"]
    assert list(runs["trial"]) == [0, 1, 2]
    [row] = summary_table(runs).to_dict("records")
    assert (row["env"], row["model"], row["batch_size"], row["seq_len"]) == (
        "torch-2.0",
        "gpt2",
        2,
        64,
    )
    assert (row["trials"], row["ok_trials"], row["statuses"]) == (
        3,
        1,
        "ok:1 missing:1 unreadable:1",
    )
    assert row["median_samples_per_s"] == 50.0
    assert f"missing: {missing}: {MISSING_REASON}" in row["reasons"]
    assert f"unreadable: {corrupt}: not JSON" in row["reasons"]


def test_steps_table_has_one_row_per_measured_step_of_ok_records(record_paths: list[Path]) -> None:
    runs, steps = load_tables(record_paths)
    assert list(steps.columns) == STEPS_COLUMNS
    ok = runs[runs["status"] == "ok"]
    assert len(steps) == 2 * len(ok)
    first = steps.iloc[0].to_dict()
    assert first == {
        "platform": "", "env": "torch-1.13", "model": "resnet50", "variant": "eager",
        "mode": "train",
        "batch_size": 8, "image_size": 96, "seq_len": None, "trial": 0, "step": 0,
        "step_time_s": 0.1,
    }  # fmt: skip
    # (resnet50 takes no sequence length: it is blank)
    assert list(steps["step"][:2]) == [0, 1]
    assert set(steps["variant"] + "/" + steps["env"]) <= set(ok["variant"] + "/" + ok["env"])


def test_odd_step_times_do_not_break_the_steps_table(tmp_path: Path) -> None:
    record = make_record("torch-1.13", "resnet50", "eager", 0, "ok", 1.0).to_dict()
    record["metrics"]["step_times_s"] = [0.1, "slow", None, [1]]
    other = make_record("torch-1.13", "resnet50", "eager", 1, "ok", 1.0).to_dict()
    other["metrics"]["step_times_s"] = "0.1"
    paths = [tmp_path / "a.json", tmp_path / "b.json"]
    for path, data in zip(paths, (record, other), strict=True):
        path.write_text(json.dumps(data), encoding="utf-8")
    _, steps = load_tables(paths)
    assert steps["step_time_s"].iloc[0] == 0.1
    assert steps["step_time_s"].iloc[1:].isna().all()
    assert len(steps) == 4


def test_odd_value_types_become_nan_or_text_not_errors(tmp_path: Path) -> None:
    record = make_record("torch-1.13", "resnet50", "eager", 0, "ok", 1.0).to_dict()
    record["metrics"]["throughput_samples_per_s"] = "fast"
    record["cell"]["image_size"] = [96]
    record["cell"]["model"] = 50
    record["provenance"]["torch"] = {"version": "1.13"}
    path = tmp_path / "odd.json"
    path.write_text(json.dumps(record), encoding="utf-8")
    runs = load_records([path])
    row = runs.iloc[0]
    assert row["status"] == "ok"
    assert math.isnan(row["throughput_samples_per_s"])
    assert pd.isna(row["image_size"])
    assert (row["model"], row["torch"]) == ("50", "{'version': '1.13'}")
    assert len(summary_table(runs)) == 1


def test_infinite_throughput_is_not_a_number(tmp_path: Path) -> None:
    path = tmp_path / "inf.json"
    record = make_record("torch-1.13", "resnet50", "eager", 0, "ok", 1.0).to_dict()
    text = json.dumps(record).replace(
        '"throughput_samples_per_s": 1.0', '"throughput_samples_per_s": Infinity'
    )
    path.write_text(text, encoding="utf-8")
    runs = load_records([path])
    assert math.isnan(runs["throughput_samples_per_s"].iloc[0])
    assert summary_table(runs)["ok_trials"].iloc[0] == 1


def test_no_records_give_empty_frames_with_their_columns() -> None:
    runs = load_records([])
    assert list(runs.columns) == RUNS_COLUMNS
    summary = summary_table(runs)
    assert list(summary.columns) == SUMMARY_COLUMNS
    assert summary.empty
    frame = speedups(summary, settings_of(CONFIG), CLAIMS, runs)
    assert len(frame) == 2 * 3
    assert set(frame["verdict"]) == {"not measured"}
    assert set(frame["verdict_reason"]) == {
        "no ok trials: baseline (torch-1.13/eager: no records), "
        "candidate (torch-2.0/compile: no records)",
        "no ok trials: baseline (torch-2.0/eager: no records), "
        "candidate (torch-2.0/compile: no records)",
    }


# --- summary -------------------------------------------------------------------------------------


def test_summary_groups_cells_and_uses_ok_trials_only(runs: pd.DataFrame) -> None:
    summary = summary_table(runs)
    assert list(summary.columns) == SUMMARY_COLUMNS
    assert len(summary) == 8  # 7 cells at the configured size + resnet50 at batch 64
    row = summary_row(summary, "torch-2.0", "resnet50", "compile")
    assert (row["trials"], row["ok_trials"], row["statuses"]) == (3, 2, "ok:2 failed:1")
    assert row["median_samples_per_s"] == 165.0
    assert (row["min_samples_per_s"], row["max_samples_per_s"]) == (150.0, 180.0)
    assert row["cv"] == pytest.approx(pd.Series([150.0, 180.0]).std() / 165.0)
    assert row["median_first_step_s"] == 2.5
    assert row["median_peak_memory_bytes"] == 100.5 * 1024 * 1024
    assert row["memory_kind"] == "process_peak_rss"
    assert row["reasons"] == "failed: RuntimeError: boom"


def test_summary_gives_the_median_interval_and_the_noise_flag(runs: pd.DataFrame) -> None:
    summary = summary_table(runs)
    base = summary_row(summary, "torch-1.13", "resnet50", "eager")
    expected = stats.summarise([100.0, 120.0, 110.0])
    assert (base["median_low"], base["median_high"]) == (100.0, 120.0)  # 3 trials: the range
    assert base["median_confidence"] == expected.achieved_confidence == 0.75
    assert base["noisy"]
    assert base["noisy_reason"] == "cv 9.1% > 5%"
    compiled = summary_row(summary, "torch-2.0", "resnet50", "compile")
    assert compiled["noisy_reason"] == "cv 12.9% > 5%"
    steady = summary_row(summary, "torch-2.0", "resnet50", "eager")  # 132, 132
    assert (steady["median_low"], steady["median_high"], steady["cv"]) == (132.0, 132.0, 0.0)
    assert (steady["noisy"], steady["noisy_reason"]) == (False, "")
    single = summary_row(summary, "torch-1.13", "gpt2", "eager")
    assert (single["median_low"], single["median_high"]) == (40.0, 40.0)
    assert single["median_confidence"] == 0.0
    assert not single["noisy"]  # one trial cannot show noise; n=1 says so instead


def test_summary_of_a_cell_without_ok_trials(runs: pd.DataFrame) -> None:
    row = summary_row(summary_table(runs), "torch-2.0", "gpt2", "compile")
    assert (row["trials"], row["ok_trials"], row["statuses"]) == (1, 0, "unsupported:1")
    assert math.isnan(row["median_samples_per_s"])
    assert math.isnan(row["median_low"]) and math.isnan(row["median_high"])
    assert math.isnan(row["cv"])
    assert not row["noisy"]
    assert row["reasons"] == "unsupported: needs torch>=2.0 | fake"


# (trial, status, graphs, graph breaks, recompilations, graph-break reasons)
COMPILER_TRIALS = [
    (0, "ok", 2, 1, 0, ["print", "data-dependent branch"]),
    (1, "ok", 3, 1, 1, ["print", "len of a tensor"]),
    (2, "ok", 4, 2, 0, ["a fourth reason"]),
    (3, "failed", 99, 99, 99, ["a failed trial's reason"]),
]


def compiler_record_paths(directory: Path) -> list[Path]:
    """torch-1.13 eager and torch-2.0 compile of resnet50, the compiled trials with what the
    compiler did (:data:`COMPILER_TRIALS`)."""
    paths = []
    for trial in range(2):
        paths.append(directory / f"eager{trial}.json")
        write_record(make_record("torch-1.13", "resnet50", "eager", trial, "ok", 100.0), paths[-1])
    for trial, status, graphs, breaks, recompilations, reasons in COMPILER_TRIALS:
        record = make_record("torch-2.0", "resnet50", "compile", trial, status, 150.0)
        metrics = dataclasses.replace(
            record.metrics,
            compiled_graphs=graphs,
            graph_breaks=breaks,
            recompilations=recompilations,
            graph_break_reasons=reasons,
        )
        paths.append(directory / f"compile{trial}.json")
        write_record(dataclasses.replace(record, metrics=metrics), paths[-1])
    return paths


def test_summary_and_speedups_carry_what_the_compiler_did(tmp_path: Path) -> None:
    runs = load_records(compiler_record_paths(tmp_path))
    summary = summary_table(runs)
    compiled = summary_row(summary, "torch-2.0", "resnet50", "compile")
    counts = COMPILER_COLUMNS[:-1]
    assert compiled[counts].tolist() == [3.0, 1.0, 0.0]  # medians of the ok trials alone
    assert compiled["graph_break_reasons"] == "print; data-dependent branch; len of a tensor"
    eager = summary_row(summary, "torch-1.13", "resnet50", "eager")
    assert eager[counts].isna().all() and eager["graph_break_reasons"] == ""
    row = speedup_row(
        speedups(summary, settings_of(CONFIG), CLAIMS, runs), "upgrade-and-compile", "resnet50"
    )
    assert [row[f"candidate_{c}"] for c in COMPILER_COLUMNS] == compiled[COMPILER_COLUMNS].tolist()
    assert all(math.isnan(row[f"baseline_{c}"]) for c in counts)
    missing = speedup_row(
        speedups(summary, settings_of(CONFIG), CLAIMS, runs), "upgrade-and-compile", "gpt2"
    )
    assert math.isnan(missing["candidate_median_graph_breaks"])  # no cell: blank, not an error


def test_cv_needs_two_values() -> None:
    assert math.isnan(coefficient_of_variation(pd.Series([5.0])))
    assert coefficient_of_variation(pd.Series([1.0, 3.0])) == pytest.approx(2**0.5 / 2)


# --- speedups ------------------------------------------------------------------------------------


def test_speedups_rows_follow_the_config(runs: pd.DataFrame) -> None:
    frame = speedups(summary_table(runs), settings_of(CONFIG), CLAIMS, runs)
    assert list(frame.columns) == SPEEDUP_COLUMNS
    assert list(zip(frame["comparison"], frame["model"], frame["mode"], strict=True)) == [
        (comparison, model, "train")
        for comparison in CONFIG["comparisons"]
        for model in CONFIG["models"]
    ]


def test_speedup_is_the_ratio_of_the_medians(runs: pd.DataFrame) -> None:
    frame = speedups(summary_table(runs), settings_of(CONFIG), CLAIMS, runs)
    row = speedup_row(frame, "upgrade-and-compile", "resnet50")
    # The batch-64 baseline record (999 samples/s) is not at the configured cpu size.
    assert (row["batch_size"], row["image_size"]) == (8, 96)
    assert row["baseline_samples_per_s"] == 110.0
    assert row["candidate_samples_per_s"] == 165.0
    assert (row["baseline_trials"], row["candidate_trials"]) == (3, 2)
    assert row["speedup"] == 165.0 / 110.0
    assert row["claim"] == "pytorch-2.0-upgrade"
    assert (row["published_speedup"], row["published_baseline"], row["published_candidate"]) == (
        1.48,
        125.0,
        185.0,
    )
    assert (row["baseline_statuses"], row["candidate_statuses"]) == ("ok:3", "ok:2 failed:1")


def test_speedup_and_interval_are_the_stats_modules_of_the_ok_trials(runs: pd.DataFrame) -> None:
    frame = speedups(summary_table(runs), settings_of(CONFIG), CLAIMS, runs)
    row = speedup_row(frame, "upgrade-and-compile", "resnet50")
    expected = ranks.speedup([100.0, 120.0, 110.0], [150.0, 180.0])
    assert row["speedup"] == expected.estimate
    assert (row["speedup_low"], row["speedup_high"]) == (expected.low, expected.high)
    assert (row["speedup_low"], row["speedup_high"]) == (150.0 / 120.0, 180.0 / 100.0)
    assert row["speedup_confidence"] == pytest.approx(1 - 2 / 10)  # 3 and 2: all pairs, 80 %
    assert (row["p_value"], row["significant"]) == (expected.p_value, expected.significant)
    assert row["speedup_low"] <= 1.48 <= row["speedup_high"]
    assert (row["measured_device"], row["measured_precision"]) == ("Test CPU (cpu)", "fp32")
    assert (row["verdict"], row["verdict_reason"]) == (
        "consistent with the claim",
        "measured on Test CPU (cpu), fp32; interval at 80% confidence "
        "(3 and 2 ok trials cannot reach 95%)",
    )


def test_without_runs_there_is_no_interval_and_no_claim_verdict(runs: pd.DataFrame) -> None:
    row = speedup_row(
        speedups(summary_table(runs), settings_of(CONFIG), CLAIMS),
        "upgrade-and-compile",
        "resnet50",
    )
    assert row["speedup"] == 165.0 / 110.0
    assert math.isnan(row["speedup_low"]) and math.isnan(row["p_value"])
    assert (row["verdict"], row["verdict_reason"]) == (
        "measured",
        "too few ok trials for an interval",
    )


def test_one_trial_side_has_no_interval(runs: pd.DataFrame) -> None:
    claims = {"pytorch-2.0-upgrade": {"models": {"bert-base": {"speedup": 2.0}}}}
    frame = speedups(summary_table(runs), settings_of(CONFIG), claims, runs)
    row = speedup_row(frame, "upgrade-and-compile", "bert-base")  # 10, 12 -> 22
    assert row["speedup"] == pytest.approx(math.sqrt(22 / 10 * 22 / 12))  # Hodges–Lehmann
    assert math.isnan(row["speedup_low"]) and math.isnan(row["speedup_high"])
    assert not row["significant"]
    assert (row["verdict"], row["verdict_reason"]) == (
        "measured",
        "too few ok trials for an interval",
    )


def test_claim_made_on_a_gpu_is_not_measured_on_a_cpu(runs: pd.DataFrame) -> None:
    claims = {
        "pytorch-2.0-upgrade": {
            **CLAIMS["pytorch-2.0-upgrade"],
            "device": "NVIDIA A100",
            "device_class": "cuda",
            "precision": "fp32",
        }
    }
    row = speedup_row(
        speedups(summary_table(runs), settings_of(CONFIG), claims, runs),
        "upgrade-and-compile",
        "resnet50",
    )
    assert not math.isnan(row["speedup_low"])  # measured, with an interval, yet not comparable
    assert (row["claim_device"], row["claim_precision"]) == ("NVIDIA A100", "fp32")
    assert (row["verdict"], row["verdict_reason"]) == (
        "not measured",
        "claimed on NVIDIA A100; this run measured on Test CPU (cpu)",
    )
    on_gpu = speedup_row(
        speedups(summary_table(runs), settings_of({**CONFIG, "device": "cuda"}), claims, runs),
        "upgrade-and-compile",
        "resnet50",
    )
    assert on_gpu["verdict"] == "consistent with the claim"
    assert on_gpu["verdict_reason"] == (
        "claimed on NVIDIA A100, fp32; measured on Test CPU (cpu), fp32; "
        "interval at 80% confidence (3 and 2 ok trials cannot reach 95%)"
    )


def test_claimed_model_not_in_the_matrix_gets_a_not_measured_row(runs: pd.DataFrame) -> None:
    claims = {
        "pytorch-2.0-upgrade": {
            "models": {**CLAIMS["pytorch-2.0-upgrade"]["models"], "mask-rcnn": {"speedup": 1.4}}
        }
    }
    frame = speedups(summary_table(runs), settings_of(CONFIG), claims, runs)
    assert len(frame) == 2 * 3 + 1
    row = speedup_row(frame, "upgrade-and-compile", "mask-rcnn")
    assert frame.index[frame["model"] == "mask-rcnn"][0] == 3  # after the comparison's models
    assert row["published_speedup"] == 1.4
    assert math.isnan(row["speedup"]) and pd.isna(row["batch_size"])
    assert (row["baseline_trials"], row["candidate_trials"]) == (0, 0)
    assert (row["verdict"], row["verdict_reason"]) == (
        "not measured",
        "mask-rcnn is not in the benchmark matrix (config models)",
    )


def test_missing_side_is_not_measured(runs: pd.DataFrame) -> None:
    row = speedup_row(
        speedups(summary_table(runs), settings_of(CONFIG), CLAIMS, runs),
        "upgrade-and-compile",
        "gpt2",
    )
    assert row["baseline_samples_per_s"] == 40.0
    assert math.isnan(row["candidate_samples_per_s"])
    assert row["candidate_trials"] == 0
    assert math.isnan(row["speedup"])
    assert row["published_speedup"] == 1.49
    assert row["verdict"] == "not measured"
    assert row["verdict_reason"] == "no ok trials: candidate (torch-2.0/compile: unsupported:1)"
    assert math.isnan(row["speedup_low"]) and not row["significant"]


def test_model_not_in_claims_group_is_measured(runs: pd.DataFrame) -> None:
    frame = speedups(summary_table(runs), settings_of(CONFIG), CLAIMS, runs)
    row = speedup_row(frame, "upgrade-and-compile", "bert-base")
    assert row["speedup"] == pytest.approx(math.sqrt(22 / 10 * 22 / 12))
    assert math.isnan(row["published_speedup"])
    assert row["verdict"] == "measured"
    assert row["verdict_reason"] == "bert-base not in claims group 'pytorch-2.0-upgrade'"


def test_comparison_without_claim(runs: pd.DataFrame) -> None:
    row = speedup_row(
        speedups(summary_table(runs), settings_of(CONFIG), CLAIMS, runs),
        "compile-alone",
        "resnet50",
    )
    assert row["speedup"] == pytest.approx(math.sqrt(150.0 * 180.0) / 132.0)  # Hodges–Lehmann
    assert row["claim"] == ""
    assert math.isnan(row["published_speedup"])
    assert (row["verdict"], row["verdict_reason"]) == (
        "measured",
        "no published claim for this comparison",
    )


def test_unresolved_device_uses_the_size_both_sides_share(runs: pd.DataFrame) -> None:
    config = {**CONFIG, "device": "auto"}
    row = speedup_row(
        speedups(summary_table(runs), settings_of(config), CLAIMS),
        "upgrade-and-compile",
        "resnet50",
    )
    assert row["batch_size"] == 8
    assert row["speedup"] == 165.0 / 110.0


@pytest.mark.parametrize(
    ("config", "message"),
    [
        ({"models": {}, "modes": ["train"]}, "KeyError: 'environments'"),
        (
            {**CONFIG, "comparisons": {"x": {"baseline": {"env": "a"}, "candidate": {}}}},
            "KeyError: 'variant'",
        ),
    ],
)
def test_a_config_the_tables_cannot_read_is_one_error(
    tmp_path: Path, config: dict[str, Any], message: str
) -> None:
    path = tmp_path / "config.json"
    path.write_text(json.dumps(config), encoding="utf-8")
    with pytest.raises(ValueError, match=f"^{path}: not a ptspeed config \\({message}"):
        read_settings(path)


# --- verdicts on constructed rows --------------------------------------------------------------

VERDICT_CLAIMS: dict[str, Any] = {
    "gpu-claim": {
        "device": "NVIDIA A100",
        "device_class": "cuda",
        "precision": "fp32",
        "models": {"m": {"speedup": 1.5}},
    },
    "cpu-claim": {"device_class": "cpu", "models": {"m": {"speedup": 1.5}}},
}


def constructed_row(**changes: Any) -> dict[str, Any]:
    row = {
        "model": "m",
        "baseline_env": "old",
        "baseline_variant": "eager",
        "candidate_env": "new",
        "candidate_variant": "compile",
        "baseline_samples_per_s": 100.0,
        "candidate_samples_per_s": 150.0,
        "baseline_trials": 5,
        "candidate_trials": 5,
        "baseline_statuses": "ok:5",
        "candidate_statuses": "ok:5",
        "speedup": 1.5,
        "speedup_low": 1.4,
        "speedup_high": 1.6,
        "p_value": 0.008,
        "significant": True,
        "claim": "gpu-claim",
        "published_speedup": 1.5,
        "measured_device": "NVIDIA H200 (cuda)",
        "measured_precision": "fp32",
    }
    return {**row, **changes}


GPU_CONTEXT = "claimed on NVIDIA A100, fp32; measured on NVIDIA H200 (cuda), fp32"


@pytest.mark.parametrize(
    ("changes", "device_class", "expected"),
    [
        ({}, "cuda", ("consistent with the claim", GPU_CONTEXT)),
        ({"speedup_low": 1.5, "speedup_high": 1.5}, "cuda", ("consistent with the claim",
                                                              GPU_CONTEXT)),
        ({"published_speedup": 1.61}, "cuda", ("below the claim", GPU_CONTEXT)),
        ({"published_speedup": 1.39}, "cuda", ("above the claim", GPU_CONTEXT)),
        (
            {"measured_device": "Some CPU (cpu)"},
            "cpu",
            ("not measured", "claimed on NVIDIA A100; this run measured on Some CPU (cpu)"),
        ),
        (
            {"candidate_trials": 0, "candidate_samples_per_s": math.nan,
             "candidate_statuses": "oom:5"},
            "cuda",
            ("not measured", "no ok trials: candidate (new/compile: oom:5)"),
        ),
        (
            {"baseline_trials": 0, "baseline_samples_per_s": math.nan, "baseline_statuses": "",
             "candidate_trials": 0, "candidate_samples_per_s": math.nan,
             "candidate_statuses": "failed:2 missing:3"},
            "cuda",
            ("not measured", "no ok trials: baseline (old/eager: no records), "
             "candidate (new/compile: failed:2 missing:3)"),
        ),
        ({"claim": ""}, "cuda", ("measured", "no published claim for this comparison")),
        ({"claim": "nowhere"}, "cuda", ("not measured", "claim group 'nowhere' not in claims")),
        (
            {"published_speedup": math.nan},
            "cuda",
            ("measured", "m not in claims group 'gpu-claim'"),
        ),
        (
            {"speedup_low": math.nan, "speedup_high": math.nan, "p_value": math.nan},
            "cuda",
            ("measured", "too few ok trials for an interval"),
        ),
        (
            {"claim": "cpu-claim", "published_speedup": 2.0, "measured_device": "X (cpu)"},
            "cpu",
            ("below the claim", "measured on X (cpu), fp32"),
        ),
        ({}, "", ("consistent with the claim", GPU_CONTEXT)),  # device class unresolved
        (
            {"speedup_confidence": 0.9, "baseline_trials": 3, "candidate_trials": 3,
             "published_speedup": 1.61},
            "cuda",
            ("below the claim", GPU_CONTEXT + "; interval at 90% confidence "
             "(3 and 3 ok trials cannot reach 95%)"),
        ),
        ({"speedup_confidence": 0.971}, "cuda", ("consistent with the claim", GPU_CONTEXT)),
    ],
)  # fmt: skip
def test_verdict_on_constructed_rows(
    changes: dict[str, Any], device_class: str, expected: tuple[str, str]
) -> None:
    assert verdict(constructed_row(**changes), VERDICT_CLAIMS, device_class) == expected


# --- the command line ----------------------------------------------------------------------------


@pytest.mark.slow
def test_cli_writes_the_four_tables(tmp_path: Path, record_paths: list[Path]) -> None:
    out_dir = aggregate_cli(tmp_path, record_paths)
    assert sorted(p.name for p in out_dir.iterdir()) == [
        "runs.csv",
        "speedups.csv",
        "steps.csv",
        "summary.csv",
    ]
    runs, steps, summary, frame = (
        read_table(out_dir / n) for n in ("runs.csv", "steps.csv", "summary.csv", "speedups.csv")
    )
    assert len(runs) == len(record_paths)
    assert list(steps.columns) == STEPS_COLUMNS
    assert len(steps) == 2 * (runs["status"] == "ok").sum()
    assert list(summary.columns) == SUMMARY_COLUMNS
    assert list(frame.columns) == SPEEDUP_COLUMNS
    assert runs["cuda"].iloc[0] == "11.7"  # text stays text through the CSV
    assert runs["git_commit"].iloc[0] == "1234567"
    row = speedup_row(frame, "upgrade-and-compile", "resnet50")
    assert row["speedup"] == 165.0 / 110.0
    assert row["claim"] == "pytorch-2.0-upgrade"
    assert row["verdict"] == "consistent with the claim"
    assert not row["significant"]


@pytest.mark.slow
def test_cli_names_a_listed_record_that_does_not_exist(
    tmp_path: Path, record_paths: list[Path]
) -> None:
    absent = tmp_path / "results/records/torch-2.0/gpt2/compile/train/b2-s64/trial1.json"
    out_dir = aggregate_cli(tmp_path, [*record_paths, absent])
    runs = read_table(out_dir / "runs.csv")
    row = runs.iloc[-1]
    assert (row["status"], row["reason"]) == ("missing", f"{absent}: {MISSING_REASON}")
    summary = read_table(out_dir / "summary.csv")
    gpt2 = summary_row(summary, "torch-2.0", "gpt2", "compile")
    assert gpt2["statuses"] == "unsupported:1 missing:1"


@pytest.mark.slow
def test_cli_accepts_records_as_arguments(tmp_path: Path, record_paths: list[Path]) -> None:
    config, claims = write_inputs(tmp_path)
    result = run_aggregate_script(
        "--config", str(config), "--claims", str(claims),
        "--records", *map(str, record_paths), "--out-dir", str(tmp_path / "t"),
    )  # fmt: skip
    assert result.returncode == 0, result.stderr
    assert len(read_table(tmp_path / "t" / "runs.csv")) == len(record_paths)


@pytest.mark.slow
@pytest.mark.parametrize("problem", ["missing config", "bad config", "missing list"])
def test_cli_reports_bad_input_in_one_line(tmp_path: Path, problem: str) -> None:
    config, claims = write_inputs(tmp_path)
    listing = tmp_path / "records.txt"
    listing.write_text("", encoding="utf-8")
    if problem == "missing config":
        config = tmp_path / "nope.yaml"
    elif problem == "bad config":
        config.write_text("comparisons: [1, 2]\nmodels: {}\nmodes: [train]\n", encoding="utf-8")
    else:
        listing = tmp_path / "nope.txt"
    result = run_aggregate_script(
        "--config", str(config), "--claims", str(claims),
        "--records-from", str(listing), "--out-dir", str(tmp_path / "t"),
    )  # fmt: skip
    assert result.returncode == 2
    assert result.stderr.startswith("error: ")
    assert len(result.stderr.strip().splitlines()) == 1
    assert "Traceback" not in result.stderr


def test_list_and_mapping_metrics_are_one_text_cell_of_runs() -> None:
    from ptspeed.analysis.columns import typed_runs
    from ptspeed.analysis.records import metric_cell

    assert metric_cell(["graph break in f", "data-dependent"]) == (
        "graph break in f; data-dependent"
    )
    assert metric_cell({"dynamo": 1.23456, "inductor": 2}) == "dynamo=1.23; inductor=2"
    assert metric_cell([]) == "" and metric_cell(3.5) == 3.5
    row = {column: None for column in RUNS_COLUMNS}
    row.update(graph_break_reasons="a; b", compile_time_by_phase_s="dynamo=1.23")
    runs = typed_runs(pd.DataFrame([row], columns=RUNS_COLUMNS))
    assert runs.loc[0, "graph_break_reasons"] == "a; b"
    assert runs.loc[0, "compile_time_by_phase_s"] == "dynamo=1.23"
