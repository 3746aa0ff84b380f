"""The report: seed table first, numbers equal to the CSVs', self-contained HTML."""

from __future__ import annotations

import math
import re
import subprocess
import sys
from pathlib import Path

import pandas as pd
import pytest
from test_aggregate import CLAIMS, CONFIG, CORRUPT_NAME, aggregate_cli, write_fixture_records

from ptspeed.aggregate import read_table
from ptspeed.report import (
    SEED_HEADERS,
    format_published,
    format_rate,
    format_speedup,
    format_verdict,
    markdown_cell,
    render,
)

REPO = Path(__file__).resolve().parents[1]


@pytest.fixture(scope="module")
def tables(tmp_path_factory: pytest.TempPathFactory) -> dict[str, pd.DataFrame]:
    """The three tables as the report reads them: written by the CLI, read back from CSV."""
    tmp_path = tmp_path_factory.mktemp("aggregated")
    out_dir = aggregate_cli(tmp_path, write_fixture_records(tmp_path / "records"))
    return {name: read_table(out_dir / f"{name}.csv") for name in ("runs", "summary", "speedups")}


@pytest.fixture(scope="module")
def report_dir(tmp_path_factory: pytest.TempPathFactory, tables: dict[str, pd.DataFrame]) -> Path:
    out_dir = tmp_path_factory.mktemp("report")
    written = render(tables["runs"], tables["summary"], tables["speedups"], CONFIG, CLAIMS, out_dir)
    assert written == [out_dir / "index.html", out_dir / "report.md"]
    return out_dir


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


def test_seed_table_comes_first_and_equals_the_csv(
    report_dir: Path, tables: dict[str, pd.DataFrame]
) -> None:
    text = (report_dir / "report.md").read_text(encoding="utf-8")
    assert text.index("## The seed table") < text.index("## Every cell")
    seed_tables = markdown_tables(section(text, "The seed table, measured"))
    frame = tables["speedups"]
    assert [table[0] for table in seed_tables] == [SEED_HEADERS] * frame["comparison"].nunique()
    shown = [row for table in seed_tables for row in table[1:]]
    assert len(shown) == len(frame)
    for cells, row in zip(shown, frame.to_dict("records"), strict=True):
        assert cells == [
            row["model"],
            row["mode"],
            str(row["batch_size"]),
            format_rate(row["baseline_samples_per_s"], row["baseline_trials"]),
            format_rate(row["candidate_samples_per_s"], row["candidate_trials"]),
            format_speedup(row["speedup"]),
            format_published(
                row["published_speedup"], row["published_baseline"], row["published_candidate"]
            ),
            format_verdict(row["verdict"], row["verdict_reason"]),
        ]


def test_seed_table_row_for_the_fixture(report_dir: Path) -> None:
    text = (report_dir / "report.md").read_text(encoding="utf-8")
    first = markdown_tables(section(text, "The seed table, measured"))[0]
    assert first[1] == [
        "resnet50",
        "train",
        "8",
        "110.0 (n=3)",
        "165.0 (n=2)",
        "×1.50 (+50%)",
        "×1.48 (+48%); 125.0 → 185.0 samples/s",
        "measured",
    ]
    assert first[3][3:6] == ["40.0 (n=1)", "— (n=0)", "—"]
    assert first[3][7] == "not measured: no ok trials: candidate (torch-2.0/compile)"


def test_every_shown_throughput_carries_its_trial_count(report_dir: Path) -> None:
    text = (report_dir / "report.md").read_text(encoding="utf-8")
    for title in ("The seed table, measured", "Every cell"):
        for table in markdown_tables(section(text, title)):
            header = table[0]
            for row in table[1:]:
                for name, cell in zip(header, row, strict=True):
                    if name in ("baseline samples/s", "candidate samples/s", "median samples/s"):
                        assert re.fullmatch(r"(\d+\.\d|—) \(n=\d+\)", cell), cell


def test_summary_table_equals_the_csv(report_dir: Path, tables: dict[str, pd.DataFrame]) -> None:
    text = (report_dir / "report.md").read_text(encoding="utf-8")
    [table] = markdown_tables(section(text, "Every cell"))
    summary = tables["summary"]
    assert len(table) - 1 == len(summary)
    row = table[
        1 + summary.index[summary["variant"].eq("compile") & summary["model"].eq("resnet50")][0]
    ]
    assert row[7:] == [
        "3 (ok:2 failed:1)",
        "165.0 (n=2)",
        "150.0–180.0",
        "12.9%",
        "2.50 s",
        "100.5 MiB",
    ]


def test_failures_table_lists_every_record_that_is_not_ok(report_dir: Path) -> None:
    text = (report_dir / "report.md").read_text(encoding="utf-8")
    [table] = markdown_tables(section(text, "Failures and unsupported cells"))
    assert table[0] == ["env", "model", "variant", "mode", "trial", "status", "reason"]
    rows = table[1:]
    assert [r[5] for r in rows] == ["failed", "unsupported", "unreadable"]
    assert rows[0][:5] == ["torch-2.0", "resnet50", "compile", "train", "2"]
    assert rows[1][6] == "needs torch>=2.0 | fake"  # the pipe survives, escaped
    assert CORRUPT_NAME in rows[2][6]


def test_environments_come_from_the_records(report_dir: Path) -> None:
    text = (report_dir / "report.md").read_text(encoding="utf-8")
    [table] = markdown_tables(section(text, "Environments"))
    assert table[1][:6] == ["torch-1.13", "venv", "7", "1.13.1", "11.7", "Test CPU"]
    assert table[2][:6] == ["torch-2.0", "venv", "7", "2.0.1", "11.8", "Test CPU"]


def test_html_is_self_contained_and_responsive(report_dir: Path) -> None:
    html = (report_dir / "index.html").read_text(encoding="utf-8")
    assert "<script" not in html
    assert "<link" not in html
    assert not re.search(r"(src|href)=\"(?!#)", html)
    assert "http://" not in html and "https://" not in html
    assert 'name="viewport"' in html
    assert "overflow-x: auto" in html
    assert html.index('id="seed-table"') < html.index('id="summary"')
    assert "×1.50 (+50%)" in html
    assert "needs torch&gt;=2.0 | fake" in html  # escaped, not markup


def test_html_escapes_record_text(tmp_path: Path, tables: dict[str, pd.DataFrame]) -> None:
    runs = tables["runs"].copy()
    runs.loc[runs["status"] == "failed", "reason"] = "<img src=x onerror=alert(1)>"
    render(runs, tables["summary"], tables["speedups"], CONFIG, CLAIMS, tmp_path)
    html = (tmp_path / "index.html").read_text(encoding="utf-8")
    assert "<img" not in html
    assert "&lt;img src=x onerror=alert(1)&gt;" in html


def test_empty_tables_render(tmp_path: Path, tables: dict[str, pd.DataFrame]) -> None:
    empty = {name: frame.iloc[0:0] for name, frame in tables.items()}
    render(empty["runs"], empty["summary"], empty["speedups"], {}, {}, tmp_path)
    text = (tmp_path / "report.md").read_text(encoding="utf-8")
    assert "None." in section(text, "Every cell")


def test_explicit_templates_dir(tmp_path: Path, tables: dict[str, pd.DataFrame]) -> None:
    templates = tmp_path / "templates"
    templates.mkdir()
    (templates / "index.html.j2").write_text("<p>{{ sections | length }}</p>\n")
    (templates / "report.md.j2").write_text("{{ sections[0].title }}\n")
    args = (tables["runs"], tables["summary"], tables["speedups"], CONFIG, CLAIMS)
    render(*args, tmp_path / "out", templates_dir=templates)
    assert (tmp_path / "out" / "index.html").read_text() == "<p>4</p>\n"
    with pytest.raises(FileNotFoundError, match="no report templates"):
        render(*args, tmp_path / "out", templates_dir=tmp_path / "nowhere")


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


def run_render_script(tmp_path: Path, *extra: str) -> subprocess.CompletedProcess[str]:
    tables = tmp_path / "tables"
    config, claims = tmp_path / "config.json", tmp_path / "claims.yaml"
    return subprocess.run(
        [
            sys.executable, str(REPO / "scripts" / "render_report.py"),
            "--runs", str(tables / "runs.csv"), "--summary", str(tables / "summary.csv"),
            "--speedups", str(tables / "speedups.csv"), "--config", str(config),
            "--claims", str(claims), "--out-dir", str(tmp_path / "report"), *extra,
        ],
        capture_output=True, text=True, cwd=REPO, check=False,
    )  # fmt: skip


def test_render_cli_writes_both_files(tmp_path: Path) -> None:
    aggregate_cli(tmp_path, write_fixture_records(tmp_path / "records"))
    result = run_render_script(tmp_path)
    assert result.returncode == 0, result.stderr
    assert sorted(p.name for p in (tmp_path / "report").iterdir()) == ["index.html", "report.md"]


@pytest.mark.parametrize("problem", ["missing csv", "empty csv", "wrong csv", "bad templates"])
def test_render_cli_reports_bad_input_in_one_line(tmp_path: Path, problem: str) -> None:
    aggregate_cli(tmp_path, write_fixture_records(tmp_path / "records"))
    extra: list[str] = []
    if problem == "missing csv":
        (tmp_path / "tables" / "summary.csv").unlink()
    elif problem == "empty csv":
        (tmp_path / "tables" / "speedups.csv").write_text("")
    elif problem == "wrong csv":
        (tmp_path / "tables" / "runs.csv").write_text("a,b\n1,2\n")
    else:
        extra = ["--templates-dir", str(tmp_path / "nowhere")]
    result = run_render_script(tmp_path, *extra)
    assert result.returncode == 2
    assert result.stderr.startswith("error: ")
    assert len(result.stderr.strip().splitlines()) == 1
    assert "Traceback" not in result.stderr
