"""The report: seed table first, numbers equal to the CSVs', self-contained HTML with figures."""

from __future__ import annotations

import base64
import dataclasses
import itertools
import json
import math
import re
import subprocess
import sys
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd
import pytest
from helpers import (
    ABSENT,
    CLAIMS,
    CONFIG,
    CORRUPT_NAME,
    TABLE_NAMES,
    aggregate_cli,
    expected_seed_tables,
    fixture_paths,
    html_cells,
    make_record,
    read_page,
    render_tables,
    settings_of,
)

from ptspeed.analysis import change_verdict, conditions, late_numerics, ranks, stats
from ptspeed.analysis.aggregate import load_tables
from ptspeed.analysis.columns import (
    MISSING_REASON,
    RUNS_COLUMNS,
    SPEEDUP_COLUMNS,
    SUMMARY_COLUMNS,
    read_table,
)
from ptspeed.analysis.conditions import MIN_PROBED_TRIALS, PROBE_SPREAD, PROBE_SPREAD_MULTIPLIER
from ptspeed.analysis.late_numerics import LATE_TOLERANCES
from ptspeed.analysis.speedups import speedups
from ptspeed.analysis.summary import summary_table
from ptspeed.cell.measurement import breakdown as measurement_breakdown
from ptspeed.cell.measurement import numerics, probe_work, telemetry
from ptspeed.cell.measurement.numerics import TOLERANCES
from ptspeed.cell.record import write_record
from ptspeed.plan.settings import Comparison, Side
from ptspeed.render import figures
from ptspeed.render.formatting import (
    format_compile_time,
    format_compiler_counts,
    format_fraction_as_percent,
    format_int,
    format_mib,
    format_published,
    format_rate,
    format_rate_interval,
    format_samples_per_s,
    format_seconds,
    format_speedup,
    format_speedup_interval,
)
from ptspeed.render.page import Block, ReportInputs, Section
from ptspeed.render.sections import build_sections
from ptspeed.render.tables import (
    CLAIMS_TABLE,
    COMPILED_SEED_TABLE,
    COMPILER_HEADER,
    FIRST_STEP_TABLE,
    MEDIAN_HEADER,
    NOISY_TABLE,
    SEED_TABLE,
    SPEEDUP_HEADER,
    SUMMARY_TABLE,
    Column,
    Table,
    headers,
)
from ptspeed.render.templates import markdown_cell, template_environment

REPO = Path(__file__).resolve().parents[1]
PNG_MAGIC = b"\x89PNG\r\n\x1a\n"


@pytest.fixture(scope="module")
def tables(tmp_path_factory: pytest.TempPathFactory) -> dict[str, pd.DataFrame]:
    """The four tables as the report reads them: written by the CLI, read back from CSV."""
    tmp_path = tmp_path_factory.mktemp("aggregated")
    out_dir = aggregate_cli(tmp_path, fixture_paths(tmp_path))
    return {name: read_table(out_dir / f"{name}.csv") for name in TABLE_NAMES}


@pytest.fixture(scope="module")
def report_dir(tmp_path_factory: pytest.TempPathFactory, tables: dict[str, pd.DataFrame]) -> Path:
    out_dir = tmp_path_factory.mktemp("report")
    assert render_tables(tables, out_dir) == [out_dir / "index.html", out_dir / "report.md"]
    return out_dir


@pytest.fixture(scope="module")
def markdown(report_dir: Path) -> str:
    return (report_dir / "report.md").read_text(encoding="utf-8")


@pytest.fixture(scope="module")
def html(report_dir: Path) -> str:
    return (report_dir / "index.html").read_text(encoding="utf-8")


# --- reading the outputs back --------------------------------------------------------------------


def markdown_tables(text: str) -> list[list[list[str]]]:
    """Every pipe table in ``text``: rows of cells, the header row first, the rule dropped."""
    tables, current = [], []
    for line in [*text.splitlines(), ""]:
        if line.startswith("|"):
            cells = [c.strip().replace("\\|", "|") for c in re.split(r"(?<!\\)\|", line)[1:-1]]
            if not all(set(c) <= set("-: ") for c in cells):
                current.append(cells)
        elif current:
            tables.append(current)
            current = []
    return tables


def section(text: str, title: str) -> str:
    start = text.index(f"## {title}")
    end = text.find("\n## ", start + 1)
    return text[start : end if end >= 0 else len(text)]


# --- what each table must hold, from the CSVs ----------------------------------------------------


def expected_median(row: dict[str, Any]) -> str:
    return format_rate_interval(
        row["median_samples_per_s"],
        row["median_low"],
        row["median_high"],
        row["median_confidence"],
        row["ok_trials"],
    )


def expected_perturbed(row: dict[str, Any]) -> str:
    count, reasons, reruns = row["perturbed_trials"], row["perturbed_reasons"], row["reruns"]
    shown = f"{count} ({reasons})" if count and isinstance(reasons, str) and reasons else str(count)
    return f"{shown}; {reruns} rerun{'s' if reruns > 1 else ''}" if reruns else shown


def expected_cell(row: dict[str, Any]) -> list[str]:
    """A summary row's cell and sizes, as the tables of every cell show them."""
    sizes = [format_int(row[key]) for key in ("batch_size", "image_size", "seq_len")]
    return [row["env"], row["model"], row["variant"], row["mode"], *sizes]


def expected_summary_table(summary: pd.DataFrame) -> list[list[str]]:
    rows = [
        [
            *expected_cell(row),
            f"{row['trials']} ({row['statuses']})",
            expected_median(row),
            "—"
            if math.isnan(row["min_samples_per_s"])
            else f"{format_samples_per_s(row['min_samples_per_s'])}–"
            f"{format_samples_per_s(row['max_samples_per_s'])}",
            format_fraction_as_percent(row["cv"]) + (" noisy" if row["noisy"] else ""),
            expected_perturbed(row),
        ]
        for row in summary.to_dict("records")
    ]
    return [headers(SUMMARY_TABLE), *rows]


def expected_first_step_table(summary: pd.DataFrame) -> list[list[str]]:
    rows = [
        [
            *expected_cell(row),
            format_seconds(row["median_first_step_s"]),
            format_compile_time(
                row["compile_time_s"], row["compile_time_cold_s"], row["compile_time_warm_s"]
            ),
            format_compiler_counts(
                row["median_compiled_graphs"],
                row["median_graph_breaks"],
                row["median_recompilations"],
            ),
            format_mib(row["median_peak_memory_bytes"]),
        ]
        for row in summary.to_dict("records")
    ]
    return [headers(FIRST_STEP_TABLE), *rows]


def expected_noisy_table(summary: pd.DataFrame) -> list[list[str]]:
    rows = [
        [
            row["env"],
            row["model"],
            row["variant"],
            row["mode"],
            format_int(row["batch_size"]),
            expected_median(row),
            format_fraction_as_percent(row["cv"]),
            row["noisy_reason"],
        ]
        for row in summary[summary["noisy"]].to_dict("records")
    ]
    return [headers(NOISY_TABLE), *rows]


# --- the seed table ------------------------------------------------------------------------------


def test_seed_table_comes_first_and_equals_the_csv(
    markdown: str, html: str, tables: dict[str, pd.DataFrame]
) -> None:
    assert markdown.index("## The seed table") < markdown.index("## Speedups against")
    expected = expected_seed_tables(tables["speedups"])
    assert len(expected) == tables["speedups"]["comparison"].nunique() == 2
    assert markdown_tables(section(markdown, "The seed table, measured")) == expected
    page = read_page(html)
    assert next(iter(page.tables)) == "seed-table"
    assert page.tables["seed-table"] == [html_cells(table) for table in expected]


def test_seed_table_rows_for_the_fixture(markdown: str) -> None:
    first = markdown_tables(section(markdown, "The seed table, measured"))[0]
    assert first[1] == [
        "resnet50",
        "train",
        "8",
        "110.0 (n=3)",
        "165.0 (n=2)",
        "×1.50 (+50%) [1.25–1.80] 80%",  # 3 and 2 trials: all pairs cover 1 - 2 / C(5, 2)
        "×1.48 (+48%); 125.0 → 185.0 samples/s",
        "consistent with the claim: measured on Test CPU (cpu), fp32; interval at 80% "
        "confidence (3 and 2 ok trials cannot reach 95%)",
    ]
    assert first[2][5] == "×2.01 (+101%) [no interval]"  # one candidate trial
    assert first[3][3:6] == ["40.0 (n=1)", "— (n=0)", "—"]
    assert first[3][7] == (
        "not measured: no ok trials: candidate (torch-2.0/compile: unsupported:1 missing:1)"
    )


def test_seed_notes_say_where_the_claim_was_made(
    tmp_path: Path, tables: dict[str, pd.DataFrame]
) -> None:
    claims = {
        "pytorch-2.0-upgrade": {
            **CLAIMS["pytorch-2.0-upgrade"],
            "device": "NVIDIA A100",
            "precision": "fp32",
            "device_class": "cuda",
        }
    }
    speedups = tables["speedups"].assign(claim_device="NVIDIA A100", claim_precision="fp32")
    render_tables({**tables, "speedups": speedups}, tmp_path, claims=claims)
    text = (tmp_path / "report.md").read_text(encoding="utf-8")
    assert "Published: pytorch-2.0-upgrade (Seed article 000, A100, batch 64); claimed on " in text
    assert "claimed on device NVIDIA A100, precision fp32." in text


def test_every_shown_throughput_carries_its_trial_count(markdown: str, html: str) -> None:
    pattern = re.compile(r"(\d+\.\d( \[(no interval|\d+\.\d–\d+\.\d(, \d+%)?)\])?|—) \(n=\d+\)")
    rate_columns = {"baseline samples/s", "candidate samples/s", MEDIAN_HEADER, "median samples/s"}
    html_shown = [table for tables in read_page(html).tables.values() for table in tables]
    checked = 0
    for table in [*markdown_tables(markdown), *html_shown]:
        header = table[0]
        for row in table[1:]:
            for name, cell in zip(header, row, strict=True):
                if name in rate_columns:
                    assert pattern.fullmatch(cell), cell
                    checked += 1
    assert checked > 40


# --- the other tables ----------------------------------------------------------------------------


def test_summary_tables_equal_the_csv(
    markdown: str, html: str, tables: dict[str, pd.DataFrame]
) -> None:
    expected = expected_summary_table(tables["summary"])
    [table] = markdown_tables(section(markdown, "Every cell"))
    assert table == expected
    assert read_page(html).tables["summary"] == [html_cells(expected)]
    first_steps = expected_first_step_table(tables["summary"])
    [table] = markdown_tables(section(markdown, "Step times, memory and compilation"))
    assert table == first_steps
    assert read_page(html).tables["timing"] == [html_cells(first_steps)]


def test_summary_rows_for_the_fixture(markdown: str, tables: dict[str, pd.DataFrame]) -> None:
    [table] = markdown_tables(section(markdown, "Every cell"))
    [costs] = markdown_tables(section(markdown, "Step times, memory and compilation"))
    summary = tables["summary"]
    compiled = summary.index[summary["variant"].eq("compile") & summary["model"].eq("resnet50")]
    assert table[1 + compiled[0]][4:] == [
        "8",
        "96",
        "—",  # resnet50 takes no sequence length
        "3 (ok:2 failed:1)",
        "165.0 [150.0–180.0, 50%] (n=2)",
        "150.0–180.0",
        "12.9% noisy",
        "0",  # no trial recorded conditions: none perturbed, none rerun
    ]
    assert costs[1 + compiled[0]][7:] == [
        "2.50 s",
        "0.00 s",  # torch-2.0 eager's first steps: 2.0 and 3.0 s, as compile's
        "—",  # the fixture's records say nothing of what the compiler did
        "100.5 MiB",
    ]
    gpt2 = summary.index[summary["variant"].eq("compile") & summary["model"].eq("gpt2")]
    assert table[1 + gpt2[0]][4:9] == ["2", "—", "64", "2 (unsupported:1 missing:1)", "— (n=0)"]


def test_sizes_a_model_does_not_use_are_blank_in_every_table(
    tables: dict[str, pd.DataFrame],
) -> None:
    """bert-base and gpt2 take no image size and resnet50 no sequence length: the records hold
    CellSpec's defaults for them (224, 128), the tables leave them blank."""
    for name in ("runs", "summary", "speedups", "steps"):
        frame = tables[name]
        text_models = frame["model"].isin(["bert-base", "gpt2"])
        assert frame.loc[text_models, "image_size"].isna().all(), name
        assert frame.loc[frame["model"] == "resnet50", "seq_len"].isna().all(), name
        assert (frame.loc[text_models & frame["batch_size"].notna(), "seq_len"] == 64).all(), name
    runs = tables["runs"]
    # Rows of every kind: the missing record's cell comes from its path, the stale one's too.
    assert {"ok", "missing", "stale"} <= set(runs.loc[runs["model"] == "gpt2", "status"]) | set(
        runs.loc[runs["model"] == "resnet50", "status"]
    )


def test_a_table_written_before_sizes_were_blanked_reads_them_blank(tmp_path: Path) -> None:
    old = pd.DataFrame(
        {"model": ["bert-base", "resnet50", "mine"], "batch_size": [4, 8, 2],
         "image_size": [224, 96, 224], "seq_len": [64, 128, 128]}
    )  # fmt: skip
    old.to_csv(tmp_path / "summary.csv", index=False)
    table = read_table(tmp_path / "summary.csv")
    assert table["image_size"].isna().tolist() == [True, False, False]  # mine: not registered
    assert table["seq_len"].isna().tolist() == [False, True, False]


def test_versions_table_of_the_fixture(markdown: str, html: str) -> None:
    [table] = markdown_tables(section(markdown, "PyTorch 1.13.1 → 2.0.1"))
    assert table[1:] == [
        ["resnet50", "eager", "train", "8", "110.0 (n=3)", "132.0 (n=2) ×1.20 (+20%)"]
    ]  # bert-base ran eager in 1.13 and compiled in 2.0: no cell in both
    assert read_page(html).tables["versions"] == [html_cells(table)]


def test_failures_table_lists_every_record_that_is_not_ok(
    markdown: str, html: str, tables: dict[str, pd.DataFrame]
) -> None:
    failures, noisy = markdown_tables(section(markdown, "Failures, unsupported"))
    assert failures[0] == ["env", "model", "variant", "mode", "batch", "trial", "status", "reason"]
    rows = failures[1:]
    runs = tables["runs"]
    assert [r[6] for r in rows] == list(runs.loc[runs["status"] != "ok", "status"])
    assert [r[6] for r in rows] == ["failed", "unsupported", "stale", "unreadable", "missing"]
    assert rows[0][:6] == ["torch-2.0", "resnet50", "compile", "train", "8", "2"]
    assert rows[1][7] == "needs torch>=2.0 | fake"  # the pipe survives, escaped
    assert CORRUPT_NAME in rows[3][7]
    assert rows[4][:6] == ["torch-2.0", "gpt2", "compile", "train", "2", "1"]
    assert rows[4][7].endswith(f"{ABSENT}: {MISSING_REASON}")
    assert noisy == expected_noisy_table(tables["summary"])
    assert len(noisy) > 1
    page = read_page(html).tables["failures"]
    assert page == [html_cells(failures), html_cells(noisy)]


def test_claims_table_names_every_claim_group(markdown: str) -> None:
    [table] = markdown_tables(section(markdown, "Speedups against the published claims"))
    assert table[0] == headers(CLAIMS_TABLE)
    assert table[1] == [
        "pytorch-2.0-upgrade",
        "Seed article 000",
        "—",
        "—",
        "upgrade-and-compile",
        "consistent with the claim: 1; measured: 1; not measured: 1",
    ]


def test_an_image_a_site_brings_is_named_as_brought(
    tmp_path: Path, tables: dict[str, pd.DataFrame]
) -> None:
    image = "docker://nvcr.io/nvidia/pytorch:22.11-py3@sha256:" + "ab" * 32
    environments = {**CONFIG["environments"], "torch-1.13": {"kind": "image", "image": image}}
    render_tables(tables, tmp_path, config={**CONFIG, "environments": environments})
    [table] = markdown_tables(section((tmp_path / "report.md").read_text(), "Environments"))
    rows = {row[0]: row[1:] for row in table[1:]}
    assert rows["kind"] == [f"brought: {image}", "venv"]


def test_claim_group_no_comparison_checks_is_not_measured(
    tmp_path: Path, tables: dict[str, pd.DataFrame]
) -> None:
    claims = {
        **CLAIMS,
        "one-line": {"source": "Seed 001", "models": {"resnet50": {"speedup": 1.3}}},
    }
    render_tables(tables, tmp_path, claims=claims)
    text = (tmp_path / "report.md").read_text(encoding="utf-8")
    [table] = markdown_tables(section(text, "Speedups against the published claims"))
    assert table[2] == [
        "one-line",
        "Seed 001",
        "—",
        "—",
        "—",
        "not measured: no comparison in the configuration checks this claim",
    ]


def test_environments_come_from_the_records(markdown: str, html: str) -> None:
    [table] = markdown_tables(section(markdown, "Environments"))
    assert table[0] == ["", "torch-1.13", "torch-2.0"]
    rows = {row[0]: row[1:] for row in table[1:]}
    assert rows["kind"] == ["venv", "venv"]
    assert rows["records"] == ["7", "7"]  # missing and unreadable records are not provenance
    assert rows["torch"] == ["1.13.1", "2.0.1"]
    assert rows["torchvision"] == ["0.15.2", "0.15.2"]
    assert rows["transformers"] == ["—", "—"]
    assert rows["CUDA"] == ["11.7", "11.8"]
    assert rows["cuDNN"] == ["8500", "8500"]
    assert rows["GPU"] == ["—", "—"]  # CPU runs
    assert rows["CPU"] == ["Test CPU", "Test CPU"]
    assert rows["threads"] == ["4", "4"]
    assert rows["Python"] == ["3.10.13", "3.10.13"]
    assert rows["git commit"] == ["1234567", "1234567"]
    assert "TF32 matmul" not in rows  # records that do not state it get no row
    assert read_page(html).tables["environments"] == [table]


def sections_of(paths: list[Path], config: dict[str, Any] | None = None) -> dict[str, Any]:
    runs, steps = load_tables(paths)
    summary = summary_table(runs)
    settings = settings_of(config or CONFIG)
    inputs = ReportInputs(runs, summary, speedups(summary, settings, CLAIMS, runs),
                          settings, CLAIMS, steps)  # fmt: skip
    return {s.id: s for s in build_sections(inputs)}


def test_tf32_and_cudnn_benchmark_settings_are_shown_where_recorded(tmp_path: Path) -> None:
    settings = {
        "torch-1.13": {"tf32_matmul": True, "tf32_cudnn": True, "cudnn_benchmark": False,
                       "float32_matmul_precision": "highest"},
        "torch-2.0": {"tf32_matmul": False, "tf32_cudnn": True, "cudnn_benchmark": False,
                      "float32_matmul_precision": "highest"},
    }  # fmt: skip
    paths = []
    for env, provenance in settings.items():
        data = make_record(env, "resnet50", "eager", 0, "ok", 100.0).to_dict()
        data["provenance"].update(provenance)
        paths.append(tmp_path / f"{env}.json")
        paths[-1].write_text(json.dumps(data), encoding="utf-8")
    sections = sections_of(paths)
    [table] = [b.table for b in sections["environments"].blocks]
    rows = {row[0]: row[1:] for row in table.rows}
    assert rows["TF32 matmul"] == ["True", "False"]
    assert rows["TF32 cuDNN"] == ["True", "True"]
    assert rows["cudnn.benchmark"] == ["False", "False"]
    assert rows["float32 matmul precision"] == ["highest", "highest"]
    method = {row[0]: row[1] for row in sections["method"].blocks[0].table.rows}
    assert method["TF32 and cudnn.benchmark"] == (
        "each column ran with the settings its records state (also in Environments): "
        "torch-1.13: TF32 matmul True, TF32 cuDNN True, cudnn.benchmark False, float32 matmul "
        "precision highest; torch-2.0: TF32 matmul False, TF32 cuDNN True, cudnn.benchmark "
        "False, float32 matmul precision highest"
    )


# --- what the compiler did, and the same cells across torch versions -----------------------------


def compiler_paths(
    directory: Path, envs: tuple[str, ...] = ("torch-1.13", "torch-2.0")
) -> list[Path]:
    """resnet50 records, two trials a cell: eager in ``envs``, compile in torch-2.0 with what the
    compiler did (2 and 3 graphs, one break, no recompilation)."""
    eager = [(env, "eager", rate) for env, rate in zip(envs, (100.0, 120.0), strict=False)]
    cells = [*eager, ("torch-2.0", "compile", 150.0)]
    paths = []
    for env, variant, rate in cells:
        for trial in range(2):
            record = make_record(env, "resnet50", variant, trial, "ok", rate + trial)
            if variant == "compile":
                metrics = dataclasses.replace(
                    record.metrics, compiled_graphs=2 + trial, graph_breaks=1, recompilations=0,
                    graph_break_reasons=["print", "len of a tensor"],
                )  # fmt: skip
                record = dataclasses.replace(record, metrics=metrics)
            paths.append(directory / f"{env}-{variant}-{trial}.json")
            write_record(record, paths[-1])
    return paths


def test_a_compiled_candidate_shows_what_the_compiler_did_beside_the_speedup(
    tmp_path: Path,
) -> None:
    upgrade_alone = {
        "baseline": {"env": "torch-1.13", "variant": "eager"},
        "candidate": {"env": "torch-2.0", "variant": "eager"},
    }
    config = {**CONFIG, "comparisons": {**CONFIG["comparisons"], "upgrade-alone": upgrade_alone}}
    compiled, compile_alone, eager = sections_of(compiler_paths(tmp_path), config)[
        "seed-table"
    ].blocks
    assert compiled.table.headers == compile_alone.table.headers == headers(COMPILED_SEED_TABLE)
    column = headers(COMPILED_SEED_TABLE).index(COMPILER_HEADER)
    assert column == headers(SEED_TABLE).index(SPEEDUP_HEADER) + 1
    assert [row[column] for row in compiled.table.rows] == ["2.5 / 1 / 0", "—", "—"]
    # Below the table: the caption above it stays one line.
    assert compiled.footnote == "Candidate's graph breaks: resnet50: print; len of a tensor."
    assert "graph breaks" not in compiled.note
    assert eager.table.headers == headers(SEED_TABLE)  # its candidate did not compile
    assert not eager.footnote


def test_cells_measured_in_several_torch_versions_are_side_by_side(tmp_path: Path) -> None:
    versions = sections_of(compiler_paths(tmp_path))["versions"]
    assert versions.title == "PyTorch 1.13.1 → 2.0.1"
    [block] = versions.blocks
    assert block.table.headers == [
        "model", "variant", "mode", "batch",
        "torch-1.13 (torch 1.13.1) samples/s", "torch-2.0 (torch 2.0.1) samples/s",
    ]  # fmt: skip
    # compile ran in torch-2.0 alone: no row
    assert block.table.rows == [
        ["resnet50", "eager", "train", "8", "100.5 (n=2)", "120.5 (n=2) ×1.20 (+20%)"]
    ]


def test_one_torch_version_leaves_the_versions_section_out(tmp_path: Path) -> None:
    sections = sections_of(compiler_paths(tmp_path, envs=("torch-2.0",)))
    assert "versions" not in sections
    assert list(sections)[:3] == ["seed-table", "claims", "summary"]


def test_a_late_numerics_mismatch_is_among_the_failures(tmp_path: Path) -> None:
    paths = []
    for variant, loss in (("eager", 2.0), ("compile", 2.2)):
        data = make_record("torch-2.0", "gpt2", variant, 0, "ok", 100.0).to_dict()
        data["metrics"] |= {"loss_last": loss, "late_loss": loss, "late_loss_step": 13}
        paths.append(tmp_path / f"{variant}.json")
        paths[-1].write_text(json.dumps(data), encoding="utf-8")
    [failures, *_] = [b.table for b in sections_of(paths)["failures"].blocks if b.table]
    [row] = failures.rows
    assert row[2] == "compile" and row[6] == "numerics_mismatch"
    assert row[7].startswith("late numerics check: step 13's loss 2.2 is 10.00% from the eager")


def test_method_section_gives_steps_trials_intervals_and_tolerances(markdown: str) -> None:
    config = {**CONFIG, "trials": 5, "steps": {"warmup": 3, "measured": 10, "numerics": 2}}
    text = section(markdown, "Method")
    [table] = markdown_tables(text)
    rows = {row[0]: row[1] for row in table[1:]}
    assert rows["device class"] == "cpu"
    assert "Moses" in rows["speedup interval"]
    assert "4 ok trials a side reach 95%" in rows["speedup interval"]
    assert "Mann–Whitney" in rows["significance"]
    assert "Hodges–Lehmann" in rows["speedup"]
    assert f"fp32 {LATE_TOLERANCES['fp32']:.1%}" in rows["late numerics check"]
    assert rows["noisy"] == "cv > 5% or median interval half-width > 10% of the median"
    for precision, tolerance in TOLERANCES.items():
        assert f"{precision} {tolerance:.1%}" in rows["numerics tolerance"]
    frames = [pd.DataFrame(columns=c) for c in (RUNS_COLUMNS, SUMMARY_COLUMNS, SPEEDUP_COLUMNS)]
    sections = build_sections(ReportInputs(*frames, settings_of(config), CLAIMS))
    [method] = [s for s in sections if s.id == "method"]
    configured = {row[0]: row[1] for row in method.blocks[0].table.rows}
    assert configured["trials per cell"] == "5, each its own process"
    assert configured["warm-up steps"] == "3 (the first holds compilation)"
    assert configured["measured steps"] == "10"
    assert configured["numerics steps"] == "2 leading steps checked"
    assert configured["speedup interval"].endswith("this run's 5 trials a side give 96.8%")
    assert configured["significance"].endswith("p cannot fall below 2 / C(10, 5) = 0.0079")
    assert configured["TF32 and cudnn.benchmark"].startswith("not recorded")


def test_method_section_says_what_three_trials_cannot_do() -> None:
    config = {**CONFIG, "trials": 3}
    frames = [pd.DataFrame(columns=c) for c in (RUNS_COLUMNS, SUMMARY_COLUMNS, SPEEDUP_COLUMNS)]
    sections = build_sections(ReportInputs(*frames, settings_of(config), CLAIMS))
    [method] = [s for s in sections if s.id == "method"]
    configured = {row[0]: row[1] for row in method.blocks[0].table.rows}
    assert configured["speedup interval"].endswith("this run's 3 trials a side give 90.0%")
    assert configured["significance"].endswith(
        "p cannot fall below 2 / C(6, 3) = 0.1, so no difference can be significant"
    )


def method_rows(config: dict[str, Any]) -> dict[str, str]:
    frames = [pd.DataFrame(columns=c) for c in (RUNS_COLUMNS, SUMMARY_COLUMNS, SPEEDUP_COLUMNS)]
    sections = build_sections(ReportInputs(*frames, settings_of(config), CLAIMS))
    [method] = [s for s in sections if s.id == "method"]
    return {row[0]: row[1] for row in method.blocks[0].table.rows}


def test_method_states_every_rule_with_the_thresholds_the_code_uses() -> None:
    """Issue 36: the steal, probe and GradScaler rules were missing; each is stated with the
    run's threshold (a changed threshold changes the text) and the probe's default with the
    spread it was set from (PROBE_SPREAD, measured)."""
    rules = method_rows({**CONFIG, "trials": 5})["perturbed trials"]
    assert "the hypervisor took more than 2.0% of its CPUs' time (steal" in rules
    assert "GradScaler skipped optimizer steps inside the window" in rules
    assert f"each trial times a fixed work ({probe_work.WORK})" in rules
    assert "both ends lie more than 15% off the median of its like probes" in rules
    assert "the same environment and build, platform, device and threads" in rules
    assert f"at least {MIN_PROBED_TRIALS} trials probed), or {PROBE_SPREAD_MULTIPLIER:g} ×" in rules
    assert (
        f"the ends of {PROBE_SPREAD.trials} trials' probes lay within ±"
        f"{PROBE_SPREAD.largest:.0%} of their median (robust spread {PROBE_SPREAD.spread:.1%}); "
        f"the default, 15%, is {0.15 / PROBE_SPREAD.largest:.1f} times that"
    ) in rules
    assert "unless every rule that flagged it also flagged the attempt it repeats" in rules
    strict = {"max_probe_deviation": 0.3, "max_steal_share": 0.005, "reruns": 1}
    changed = method_rows({**CONFIG, "conditions": strict})["perturbed trials"]
    assert "both ends lie more than 30% off" in changed
    assert "the hypervisor took more than 0.5% of its CPUs' time" in changed
    assert "up to 1 time (conditions.reruns)" in changed
    assert "the default, 15%," in changed  # the default's evidence, whatever this run's


CODE_CONSTANTS = [
    (numerics, "EAGER_ERROR_MULTIPLIER", 7.0, "numerics tolerance", "7 × eager's own error"),
    (numerics, "SPREAD_ERROR_MULTIPLIER", 4.0, "numerics tolerance", "4 × how far eager moves"),
    (numerics, "TOLERANCES", {"fp32": 0.0125}, "numerics tolerance", "tolerances fp32 1.2%;"),
    (change_verdict, "AA_SPREAD", 0.07, "against an earlier run", "the ±7% two runs"),
    (conditions, "PROBE_SPREAD_MULTIPLIER", 6.0, "perturbed trials", "or 6 × those probes'"),
    (conditions, "MIN_PROBED_TRIALS", 8, "perturbed trials", "at least 8 trials probed"),
    (stats, "NOISE_CV", 0.08, "noisy", "cv > 8% or"),
    (telemetry, "NVML_ENERGY_MIN_WINDOW_S", 2.5, "energy", "shorter than 2.5 s has no energy"),
    (late_numerics, "EAGER_SPREAD_MULTIPLIER", 9.0, "late numerics check", "9 × the eager"),
    (measurement_breakdown, "SUM_TOLERANCE", 0.03, "where the time went", "within 3%."),
]


@pytest.mark.parametrize(
    ("module", "name", "value", "row", "stated"),
    CODE_CONSTANTS,
    ids=[f"{module.__name__}.{name}" for module, name, *_ in CODE_CONSTANTS],
)
def test_the_method_states_the_constant_the_code_applies(
    monkeypatch: pytest.MonkeyPatch, module: Any, name: str, value: Any, row: str, stated: str
) -> None:
    """The Method section reads each number from the constant the code applies: a changed
    constant changes the text."""
    assert stated not in method_rows(CONFIG)[row]
    monkeypatch.setattr(module, name, value)
    assert stated in method_rows(CONFIG)[row]


def test_method_states_the_verdicts_the_right_way_round() -> None:
    """Below the claim: the whole interval lies below the published speedup (it was written
    inverted before issue 36)."""
    verdict = method_rows(CONFIG)["verdict"]
    assert "below the claim: the whole interval lies below the published speedup" in verdict
    assert "above the claim: the whole interval lies above it" in verdict
    assert "none ok or all judged perturbed" in verdict
    ratio = ranks.Ratio(1.1, 1.05, 1.15, 0.95, 0.96, "", 5, 5, 0.01, True, 0.05)
    assert ranks.compare_to_claim(ratio, 1.48) == "below"  # the interval lies below 1.48


# --- the page ------------------------------------------------------------------------------------


def expected_classes(columns: list[Column]) -> tuple[list[str], list[str]]:
    """The classes a table's header and body cells get from its columns' specs."""
    heads = ["num" if c.align == "right" else "" for c in columns]
    cells = [
        " ".join(name for name, has in (("num", c.align == "right"), ("wrap", c.wrap)) if has)
        for c in columns
    ]
    return heads, cells


def html_classes(html: str) -> list[tuple[list[str], list[list[str]]]]:
    """Each table's header cell classes and each body row's cell classes, in page order."""
    found = []
    for table in re.findall(r"<table>.*?</table>", html, re.DOTALL):
        head, body = table.split("</thead>")
        heads = re.findall(r'<th(?: class="(\w+)")?>', head)
        rows = re.findall(r"<tr>(.*?)</tr>", body, re.DOTALL)
        found.append((heads, [re.findall(r'<td(?: class="([\w ]+)")?[ >]', row) for row in rows]))
    return found


def markdown_rules(text: str) -> list[list[str]]:
    """The alignment row of every Markdown table: "---:" right, "---" left."""
    rules = [line for line in text.splitlines() if re.fullmatch(r"\|( -+:? \|)+", line)]
    return [[cell.strip() for cell in rule.split("|")[1:-1]] for rule in rules]


def test_every_table_has_a_cell_per_column_aligned_as_its_spec(
    tables: dict[str, pd.DataFrame], html: str, markdown: str
) -> None:
    frames = tables["runs"], tables["summary"], tables["speedups"]
    built = build_sections(ReportInputs(*frames, settings_of(CONFIG), CLAIMS, tables["steps"]))
    shown = [b.table for s in built for b in s.blocks if b.table is not None and b.table.rows]
    # two seed tables, claims, versions, summary, first steps, failures, noisy, environments,
    # method
    assert len(shown) == 10
    for table in shown:
        assert all(len(row) == len(table.columns) == len(table.headers) for row in table.rows)
    page = html_classes(html)
    assert len(page) == len(shown)
    for table, (heads, rows) in zip(shown, page, strict=True):
        expected_heads, expected_cells = expected_classes(list(table.columns))
        assert heads == expected_heads
        assert rows == [expected_cells] * len(table.rows)
    rules = [["---:" if c.align == "right" else "---" for c in t.columns] for t in shown]
    assert markdown_rules(markdown) == rules


def test_a_column_keeps_its_alignment_wherever_it_is_added(tmp_path: Path) -> None:
    number = Column("n", lambda row: str(row["n"]), align="right")
    prose = Column("why", lambda row: row["why"], wrap=True)
    name = Column("name", lambda row: row["name"])
    both = Column("m", lambda row: str(row["n"]), align="right", wrap=True)
    rows = [{"n": 3, "why": "a reason", "name": "x"}]
    for columns in ([number, prose, name], [name, number, prose], [prose, name, number, both]):
        table = Table.of(columns, rows)
        section = Section("s", "S", "", [Block(table=table)])
        environment = template_environment()
        page = environment.get_template("index.html.j2").render(sections=[section])
        text = environment.get_template("report.md.j2").render(sections=[section])
        heads, cells = expected_classes(columns)
        assert html_classes(page) == [(heads, [cells])]
        assert markdown_rules(text) == [["---:" if c.align == "right" else "---" for c in columns]]
        assert markdown_tables(text) == [[headers(columns), table.rows[0]]]
    with pytest.raises(ValueError, match="2 columns but rows of"):
        Table([number, prose], [["3"]])


def test_the_verdict_comes_first_and_its_reason_below_it(html: str) -> None:
    """The answer first: the verdict's words, then its reason on a smaller line of its own; the
    separator stays in the text (hidden), which reads as the Markdown's cell."""
    seed = html[html.index('id="seed-table"') : html.index('id="claims"')]
    verdicts = re.findall(r'<td class="wrap" data-label="verdict">(.*?)</td>', seed)
    assert verdicts[0] == (
        'consistent with the claim<span class="sep">: </span><small class="detail">measured on '
        "Test CPU (cpu), fp32; interval at 80% confidence (3 and 2 ok trials cannot reach 95%)"
        "</small>"
    )
    published = re.findall(r'<td class="wrap" data-label="published">(.*?)</td>', seed)
    assert published[0] == (
        '×1.48 (+48%)<span class="sep">; </span><small class="detail">125.0 → 185.0 '
        "samples/s</small>"
    )
    assert "td .sep { display: none; }" in html
    assert ".detail { display: block;" in html


def test_captions_are_short_and_the_method_is_in_method(tables: dict[str, pd.DataFrame]) -> None:
    """What a section and a table are takes a line or two above them; how the numbers are made
    is the Method section's."""
    frames = tables["runs"], tables["summary"], tables["speedups"]
    built = build_sections(ReportInputs(*frames, settings_of(CONFIG), CLAIMS, tables["steps"]))
    texts = [s.intro for s in built] + [b.note for s in built for b in s.blocks]
    assert max(len(text) for text in texts) <= 230, max(texts, key=len)
    method = {row[0] for row in built[-1].blocks[0].table.rows}
    assert {COMPILER_HEADER, "compile time", "cv", "energy", "stale record", "sizes"} <= method


def test_html_is_self_contained_and_responsive(html: str) -> None:
    assert "<script" not in html
    assert "<link" not in html
    assert not re.search(r"(src|href)=\"(?!#|data:image/png;base64,)", html)
    assert "http://" not in html and "https://" not in html
    assert 'name="viewport"' in html
    assert "overflow-x: auto" in html
    assert "max-width: 100%" in html
    assert html.index('id="seed-table"') < html.index('id="summary"')
    # A number cell breaks between its value and its interval, never inside either.
    units = '<span class="unit">×1.50 (+50%)</span> <span class="unit">[1.25–1.80] 80%</span>'
    assert units in html
    assert "needs torch&gt;=2.0 | fake" in html  # escaped, not markup


def test_html_embeds_every_figure_as_a_png(html: str) -> None:
    images = read_page(html).images
    assert [image["section"] for image in images] == [
        "claims",
        "summary",
        "timing",
        "timing",
        "timing",
    ]
    for image in images:
        assert len(image["alt"]) > 40
        data = base64.b64decode(image["src"].removeprefix("data:image/png;base64,"))
        assert data.startswith(PNG_MAGIC)


def test_markdown_names_the_figures_and_carries_no_images(markdown: str) -> None:
    assert "data:image" not in markdown and "<img" not in markdown
    assert markdown.count("*Figure in index.html: ") == 5


def test_html_escapes_record_text(tmp_path: Path, tables: dict[str, pd.DataFrame]) -> None:
    runs = tables["runs"].copy()
    runs.loc[runs["status"] == "failed", "reason"] = "<img src=x onerror=alert(1)>"
    render_tables({**tables, "runs": runs}, tmp_path)
    html = (tmp_path / "index.html").read_text(encoding="utf-8")
    assert "<img src=x" not in html
    assert "&lt;img src=x onerror=alert(1)&gt;" in html


def test_empty_tables_render(tmp_path: Path, tables: dict[str, pd.DataFrame]) -> None:
    empty = {name: frame.iloc[0:0] for name, frame in tables.items()}
    render_tables(empty, tmp_path, config={}, claims={})
    text = (tmp_path / "report.md").read_text(encoding="utf-8")
    assert "None." in section(text, "Every cell")
    assert "Nothing to draw: no cell has an ok trial." in text
    assert "<img" not in (tmp_path / "index.html").read_text(encoding="utf-8")


def test_without_steps_the_step_figure_says_so(
    tmp_path: Path, tables: dict[str, pd.DataFrame]
) -> None:
    render_tables({k: v for k, v in tables.items() if k != "steps"}, tmp_path)
    text = (tmp_path / "report.md").read_text(encoding="utf-8")
    assert "Nothing to draw: no steps table was given." in text


@pytest.mark.slow
def test_a_figure_that_fails_leaves_a_note_and_the_tables(
    tmp_path: Path, tables: dict[str, pd.DataFrame], monkeypatch: pytest.MonkeyPatch
) -> None:
    def broken(frame: pd.DataFrame) -> None:
        raise TypeError("odd data")

    monkeypatch.setattr("ptspeed.render.sections.forest_plot", broken)
    render_tables(tables, tmp_path)
    text = (tmp_path / "report.md").read_text(encoding="utf-8")
    assert "Figure not drawn: TypeError: odd data" in text
    assert markdown_tables(section(text, "The seed table, measured"))


@pytest.mark.slow
def test_report_from_only_bad_records_renders(tmp_path: Path) -> None:
    corrupt = tmp_path / "results/records/e/m/v/train/b1/trial0.json"
    corrupt.parent.mkdir(parents=True)
    corrupt.write_text("not json", encoding="utf-8")
    absent = tmp_path / "results/records/e/m/v/train/b1/trial1.json"
    out_dir = aggregate_cli(tmp_path, [corrupt, absent])
    frames = {name: read_table(out_dir / f"{name}.csv") for name in TABLE_NAMES}
    render_tables(frames, tmp_path / "report")
    text = (tmp_path / "report" / "report.md").read_text(encoding="utf-8")
    failures = markdown_tables(section(text, "Failures, unsupported"))[0]
    assert [row[6] for row in failures[1:]] == ["unreadable", "missing"]
    assert "Records by status: missing:1 unreadable:1." in text


@pytest.mark.slow
def test_explicit_templates_dir(tmp_path: Path, tables: dict[str, pd.DataFrame]) -> None:
    templates = tmp_path / "templates"
    templates.mkdir()
    (templates / "index.html.j2").write_text("<p>{{ sections | length }}</p>\n")
    (templates / "report.md.j2").write_text("{{ sections[0].title }}\n")
    render_tables(tables, tmp_path / "out", templates_dir=templates)
    assert (tmp_path / "out" / "index.html").read_text() == "<p>9</p>\n"
    with pytest.raises(FileNotFoundError, match="no report templates"):
        render_tables(tables, tmp_path / "out", templates_dir=tmp_path / "nowhere")


# --- formatting ----------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("value", "expected"),
    [(1.5, "×1.50 (+50%)"), (0.8, "×0.80 (-20%)"), (1.0, "×1.00 (+0%)"), (math.nan, "—")],
)
def test_format_speedup(value: float, expected: str) -> None:
    assert format_speedup(value) == expected


def test_format_rate_and_published() -> None:
    assert format_rate(123.456, 3) == "123.5 (n=3)"
    assert format_rate(math.nan, 0) == "— (n=0)"
    assert format_rate(5.0, 0) == "— (n=0)"  # a number without ok trials is never shown
    assert format_published(1.3, math.nan, math.nan) == "×1.30 (+30%)"
    assert format_published(math.nan, math.nan, math.nan) == "—"
    assert markdown_cell("a | b\nc") == "a \\| b c"


@pytest.mark.parametrize(
    ("args", "expected"),
    [
        ((110.0, 100.0, 120.0, 0.98, 9), "110.0 [100.0–120.0] (n=9)"),
        ((110.0, 100.0, 120.0, 0.95, 9), "110.0 [100.0–120.0] (n=9)"),
        ((110.0, 100.0, 120.0, 0.75, 3), "110.0 [100.0–120.0, 75%] (n=3)"),
        ((40.0, 40.0, 40.0, 0.0, 1), "40.0 [no interval] (n=1)"),
        ((math.nan, math.nan, math.nan, math.nan, 0), "— (n=0)"),
        ((5.0, 4.0, 6.0, 0.99, 0), "— (n=0)"),
    ],
)
def test_format_rate_interval(args: tuple[float, ...], expected: str) -> None:
    assert format_rate_interval(*args) == expected


def test_format_compile_time() -> None:
    assert format_compile_time(12.3) == "12.30 s"
    assert format_compile_time(12.3, 30.1, 3.2) == "12.30 s (cold 30.10 s, warm 3.20 s)"
    assert format_compile_time(12.3, math.nan, 3.2) == "12.30 s (warm 3.20 s)"
    assert format_compile_time(math.nan, 30.1, 3.2) == "—"


def test_format_speedup_interval() -> None:
    assert format_speedup_interval(1.5, 1.25, 1.8) == "×1.50 (+50%) [1.25–1.80]"
    assert format_speedup_interval(2.0, math.nan, math.nan) == "×2.00 (+100%) [no interval]"
    assert format_speedup_interval(math.nan, 1.0, 2.0) == "—"
    assert format_speedup_interval(1.34, 1.1, 1.52, 0.9) == "×1.34 (+34%) [1.10–1.52] 90%"
    assert format_speedup_interval(1.34, 1.1, 1.52, 0.971) == "×1.34 (+34%) [1.10–1.52]"
    assert format_speedup_interval(1.34, 1.1, 1.52, math.nan) == "×1.34 (+34%) [1.10–1.52]"


# --- the command line ----------------------------------------------------------------------------


def run_render_script(tmp_path: Path, *extra: str) -> subprocess.CompletedProcess[str]:
    tables = tmp_path / "tables"
    config, claims = tmp_path / "config.json", tmp_path / "claims.yaml"
    return subprocess.run(
        [
            sys.executable, str(REPO / "workflow" / "scripts" / "render_report.py"),
            "--runs", str(tables / "runs.csv"), "--summary", str(tables / "summary.csv"),
            "--speedups", str(tables / "speedups.csv"), "--steps", str(tables / "steps.csv"),
            "--config", str(config), "--claims", str(claims),
            "--out-dir", str(tmp_path / "report"), *extra,
        ],
        capture_output=True, text=True, cwd=REPO, check=False,
    )  # fmt: skip


@pytest.fixture(scope="module")
def aggregated(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A directory holding the aggregated fixture (tables/, config, claims), to copy from."""
    tmp_path = tmp_path_factory.mktemp("cli")
    aggregate_cli(tmp_path, fixture_paths(tmp_path))
    return tmp_path


def copy_aggregated(source: Path, target: Path) -> None:
    (target / "tables").mkdir()
    for path in (source / "tables").iterdir():
        (target / "tables" / path.name).write_bytes(path.read_bytes())
    for name in ("config.json", "claims.yaml"):
        (target / name).write_bytes((source / name).read_bytes())


@pytest.mark.slow
def test_render_cli_writes_both_files(tmp_path: Path, aggregated: Path) -> None:
    copy_aggregated(aggregated, tmp_path)
    result = run_render_script(tmp_path)
    assert result.returncode == 0, result.stderr
    assert sorted(p.name for p in (tmp_path / "report").iterdir()) == ["index.html", "report.md"]
    assert (tmp_path / "report" / "index.html").read_text().count("<img") == 5


@pytest.mark.slow
@pytest.mark.parametrize(
    "problem", ["missing csv", "empty csv", "wrong csv", "wrong steps", "bad templates"]
)
def test_render_cli_reports_bad_input_in_one_line(
    tmp_path: Path, aggregated: Path, problem: str
) -> None:
    copy_aggregated(aggregated, tmp_path)
    extra: list[str] = []
    if problem == "missing csv":
        (tmp_path / "tables" / "summary.csv").unlink()
    elif problem == "empty csv":
        (tmp_path / "tables" / "speedups.csv").write_text("")
    elif problem == "wrong csv":
        (tmp_path / "tables" / "runs.csv").write_text("a,b\n1,2\n")
    elif problem == "wrong steps":
        (tmp_path / "tables" / "steps.csv").write_text("a,b\n1,2\n")
    else:
        extra = ["--templates-dir", str(tmp_path / "nowhere")]
    result = run_render_script(tmp_path, *extra)
    assert result.returncode == 2
    assert result.stderr.startswith("error: ")
    assert len(result.stderr.strip().splitlines()) == 1
    assert "Traceback" not in result.stderr


# --- figures ------------------------------------------------------------------------------------


def drawn_figure(monkeypatch: pytest.MonkeyPatch, draw: Any) -> Any:
    """The matplotlib figure behind ``draw()``'s chart, drawn."""
    drawn = []
    encode = figures._data_uri
    monkeypatch.setattr(figures, "_data_uri", lambda figure: drawn.append(figure) or encode(figure))
    assert draw() is not None
    [figure] = drawn
    figure.canvas.draw()
    return figure


def x_tick_labels(figure: Any) -> list[tuple[str, Any]]:
    """The x tick labels the figure shows (major and minor, inside the axes' limits), with
    their boxes in pixels."""
    [ax] = figure.axes
    low, high = sorted(ax.get_xlim())
    renderer = figure.canvas.get_renderer()
    ticks = [
        *zip(ax.xaxis.get_majorticklocs(), ax.xaxis.get_majorticklabels(), strict=True),
        *zip(ax.xaxis.get_minorticklocs(), ax.xaxis.get_minorticklabels(), strict=True),
    ]
    return [
        (label.get_text(), label.get_window_extent(renderer))
        for location, label in ticks
        if low <= location <= high and label.get_visible() and label.get_text()
    ]


def step_rows(low_ms: float, high_ms: float) -> pd.DataFrame:
    """Steps of three models whose step times span ``low_ms`` to ``high_ms``, two cells each."""
    rows = [
        {"platform": "", "env": env, "model": f"model{i}", "variant": "eager", "mode": "train",
         "batch_size": 8, "image_size": math.nan, "seq_len": 64, "trial": step % 3, "step": step,
         "step_time_s": ms / 1000 * (1 + step / 100)}
        for i, ms in enumerate((low_ms, math.sqrt(low_ms * high_ms), high_ms))
        for env in ("torch-1.13", "torch-2.0-cu118")
        for step in range(6)
    ]  # fmt: skip
    return pd.DataFrame(rows)


def assert_labels_apart(figure: Any) -> list[str]:
    """At least two x tick labels, no two of which overlap, all inside the figure; their texts."""
    labels = x_tick_labels(figure)
    assert len(labels) >= 2, labels  # enough to read the scale
    boxes = sorted((box.x0, box.x1, text) for text, box in labels)
    gaps = [(b[0] - a[1], a[2], b[2]) for a, b in itertools.pairwise(boxes)]
    assert min(gap for gap, _, _ in gaps) > 0, gaps  # no two labels overlap
    edge = figure.bbox
    assert all(edge.x0 <= box.x0 and box.x1 <= edge.x1 for _, box in labels), labels
    return [text for text, _ in labels]


@pytest.mark.parametrize(
    ("low_ms", "high_ms"),
    [(12, 300), (30, 700), (40, 420), (3000, 33000), (0.05, 0.8), (2, 2000), (7, 7e5)],
)
def test_log_axis_tick_labels_never_overlap_and_stay_in_the_figure(
    monkeypatch: pytest.MonkeyPatch, low_ms: float, high_ms: float
) -> None:
    """One or two decades of step times once got matplotlib's labels of its minor ticks
    (2×10¹, 3×10¹, 4×10¹…) printed over each other."""
    figure = drawn_figure(monkeypatch, lambda: figures.step_time_boxes(step_rows(low_ms, high_ms)))
    assert figure.axes[0].get_xscale() == "log"
    texts = assert_labels_apart(figure)
    assert all(text.replace(".", "").isdigit() for text in texts if "e" not in text)


@pytest.mark.parametrize(
    ("low", "high"), [(123456.7, 370370.1), (123456.7, 123580.1), (0.0123, 0.01231)]
)
def test_linear_axis_tick_labels_never_overlap(
    monkeypatch: pytest.MonkeyPatch, low: float, high: float
) -> None:
    """Long labels (123500, 0.01225) on an axes narrowed by long row labels."""
    rows = [
        {"env": "a-long-environment-name-" * 3 if i == 0 else f"env{i}", "variant": "eager",
         "model": "mlp", "mode": "train", "batch_size": 8, "image_size": math.nan,
         "seq_len": math.nan, "median_samples_per_s": rate, "median_low": rate * 0.999,
         "median_high": rate * 1.001, "ok_trials": 3}
        for i, rate in enumerate(np.linspace(low, high, 6))
    ]  # fmt: skip
    summary = pd.DataFrame(rows)
    figure = drawn_figure(monkeypatch, lambda: figures.cell_dots(summary, figures.THROUGHPUT))
    assert figure.axes[0].get_xscale() == "linear"
    assert_labels_apart(figure)


def test_every_figure_label_lies_inside_its_figure(
    monkeypatch: pytest.MonkeyPatch, tables: dict[str, pd.DataFrame]
) -> None:
    """Row labels, axis labels and tick labels are all in the picture (the forest plot's axis
    label once ran off its right edge)."""
    for draw in (
        lambda: figures.forest_plot(tables["speedups"]),
        lambda: figures.cell_dots(tables["summary"], figures.THROUGHPUT),
        lambda: figures.step_time_boxes(tables["steps"]),
    ):
        figure = drawn_figure(monkeypatch, draw)
        assert_labels_apart(figure)
        [ax] = figure.axes
        renderer = figure.canvas.get_renderer()
        texts = [*ax.texts, ax.xaxis.label]
        boxes = [box for _, box in x_tick_labels(figure)]
        boxes += [text.get_window_extent(renderer) for text in texts if text.get_text()]
        edge = figure.bbox
        outside = [b for b in boxes if not (edge.x0 - 0.5 <= b.x0 and b.x1 <= edge.x1 + 0.5)]
        assert not outside, (draw, edge, outside)
        monkeypatch.undo()


# --- trials over the run -------------------------------------------------------------------------

DRIFT_COMPARISON = Comparison(
    title="a → b", baseline=Side(env="a", variant="eager"), candidate=Side(env="b", variant="eager")
)


def drift_runs() -> pd.DataFrame:
    rows = [
        ("a", 0, 100.0, False), ("b", 0, 150.0, False), ("a", 1, 120.0, True),
        ("b", 1, 180.0, False), ("a", 2, 110.0, False), ("b", 2, 0.0, False),
    ]  # fmt: skip
    return pd.DataFrame(
        [
            {"env": env, "variant": "eager", "model": "mlp", "status": "ok", "trial": trial,
             "throughput_samples_per_s": rate, "perturbed": perturbed,
             "window_started_unix_s": 1_000.0 + 30.0 * (2 * trial + (env == "b"))}
            for env, trial, rate, perturbed in rows
        ]
    )  # fmt: skip


def test_the_drift_plot_places_each_trial_at_its_start_against_the_baseline_median() -> None:
    points = figures._drift_points(drift_runs(), DRIFT_COMPARISON)
    assert points["_minute"].tolist() == [0.0, 1.0, 2.0, 0.5, 1.5]  # the rate of 0 left out
    assert points["_relative"].round(3).tolist() == [0.909, 1.091, 1.0, 1.364, 1.636]
    assert points["_quiet"].tolist() == ["quiet", "perturbed", "quiet", "quiet", "quiet"]
    assert figures.drift_plot(drift_runs(), DRIFT_COMPARISON) is not None


@pytest.mark.slow
def test_the_report_draws_one_drift_plot_per_comparison_that_recorded_start_times(
    tmp_path: Path, tables: dict[str, pd.DataFrame]
) -> None:
    runs = tables["runs"].assign(window_started_unix_s=lambda r: 1_000.0 + 60.0 * r["trial"])
    render_tables({**tables, "runs": runs}, tmp_path)
    page = read_page((tmp_path / "index.html").read_text(encoding="utf-8"))
    drawn = [image for image in page.images if image["section"] == "drift"]
    assert len(drawn) == tables["speedups"]["comparison"].nunique()
    assert all(image["alt"].startswith("Time series of ") for image in drawn)


# --- against an earlier run (compare.earlier) ----------------------------------------------------


def _five_trials(runs: pd.DataFrame, factor: float = 1.0) -> pd.DataFrame:
    """Each ok trial of ``runs`` as five, ±1 % apart, throughput times ``factor``; 2 s windows."""
    ok = runs[runs["status"] == "ok"]
    copies = [
        ok.assign(
            trial=ok["trial"] * 5 + copy,
            throughput_samples_per_s=ok["throughput_samples_per_s"] * factor * (1 + offset),
        )
        for copy, offset in enumerate((-0.01, -0.005, 0.0, 0.005, 0.01))
    ]
    return pd.concat([*copies, runs[runs["status"] != "ok"]]).assign(window_s=2.0)


def test_the_report_sets_the_run_against_an_earlier_one_by_compare_rule(
    tables: dict[str, pd.DataFrame], tmp_path: Path
) -> None:
    """An earlier run where one cell was 30 % faster and everything else the same: that cell
    is called slower, the rest not, and the machine's line comes first."""
    runs = tables["runs"]
    regressed = (runs["env"] == "torch-2.0") & (runs["variant"] == "eager")
    earlier = pd.concat([_five_trials(runs[~regressed]), _five_trials(runs[regressed], 1.3)])
    render_tables({**tables, "runs": _five_trials(runs)}, tmp_path, earlier=earlier)
    page = read_page((tmp_path / "index.html").read_text(encoding="utf-8"))
    rows = page.tables["earlier"][0]
    assert rows[0][:2] == ["mark", "old samples/s"]
    marks = {row[6]: row[0] for row in rows[1:]}
    assert marks.pop("torch-2.0/resnet50/eager/train/b8-i96") == "-", rows
    assert set(marks.values()) <= {"", "x"}, rows
    markdown = (tmp_path / "report.md").read_text(encoding="utf-8")
    section = markdown.split("## Against an earlier run", 1)[1]
    before_cells = section.split("|", 1)[0]  # the machine is said first, probed or not
    assert "no machine-speed probe in old and new (records from before probes)" in before_cells
    assert "rule: a cell is called slower (-) or faster (+)" in before_cells
    assert "(defaults from this run's config)" in before_cells
    assert "0 faster, 1 slower" in section
