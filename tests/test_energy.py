"""Energy per sample in the tables: each trial's window energy over its samples, the summary's
median with its interval, the speedups' energy ratio beside the speedup; where no trial
measured energy, the summary says why."""

from __future__ import annotations

import math
from pathlib import Path

import pytest
from helpers import CONFIG, make_record, read_page, render_tables, settings_of

from ptspeed.analysis.aggregate import load_tables
from ptspeed.analysis.speedups import speedups
from ptspeed.analysis.summary import summary_table
from ptspeed.cell.record import write_record

WALL_S = 2.0
# (env, variant, samples/s, joules over the window); baseline 1.0 J a sample, candidate 0.5.
TRIALS = [
    ("torch-1.13", "eager", 100.0, 200.0),
    ("torch-1.13", "eager", 100.0, 210.0),
    ("torch-1.13", "eager", 100.0, 190.0),
    ("torch-2.0", "compile", 200.0, 200.0),
    ("torch-2.0", "compile", 200.0, 190.0),
    ("torch-2.0", "compile", 200.0, 210.0),
]


def tables(tmp_path: Path, energy: bool) -> tuple:
    paths = []
    for trial, (env, variant, rate, joules) in enumerate(TRIALS):
        record = make_record(env, "resnet50", variant, trial, "ok", rate)
        record.metrics.measured_wall_s = WALL_S
        if energy:
            record.conditions.energy_j, record.conditions.energy_source = joules, "nvml"
        else:
            record.conditions.energy_not_measured = "no RAPL zones in /sys/class/powercap"
        path = tmp_path / f"{env}-{variant}-{trial}.json"
        write_record(record, path)
        paths.append(path)
    runs, _ = load_tables(paths, settings_of(CONFIG))
    summary = summary_table(runs)
    return runs, summary, speedups(summary, settings_of(CONFIG), runs=runs)


def test_energy_per_sample_is_summarised_and_compared(tmp_path: Path) -> None:
    runs, summary, compared = tables(tmp_path, energy=True)
    expected = [j / (rate * WALL_S) for _, _, rate, j in TRIALS]
    assert runs["joules_per_sample"].tolist() == pytest.approx(expected)
    by_env = summary.set_index("env")
    assert by_env.loc["torch-1.13", "median_joules_per_sample"] == pytest.approx(1.0)
    assert by_env.loc["torch-2.0", "median_joules_per_sample"] == pytest.approx(0.5)
    low, high = by_env.loc["torch-1.13", ["joules_low", "joules_high"]]
    assert low <= 1.0 <= high
    chosen = (compared["comparison"] == "upgrade-and-compile") & (compared["model"] == "resnet50")
    (row,) = compared[chosen].to_dict("records")
    assert row["speedup"] == pytest.approx(2.0)
    assert row["energy_ratio"] == pytest.approx(0.5, rel=0.06)
    assert row["energy_ratio_low"] <= row["energy_ratio"] <= row["energy_ratio_high"]


def test_without_energy_the_summary_says_why(tmp_path: Path) -> None:
    runs, summary, compared = tables(tmp_path, energy=False)
    assert runs["joules_per_sample"].isna().all()
    assert summary["median_joules_per_sample"].isna().all()
    assert set(summary["energy_not_measured"]) == {"no RAPL zones in /sys/class/powercap"}
    assert all(math.isnan(v) for v in compared["energy_ratio"])


@pytest.mark.parametrize("energy", [True, False])
def test_the_report_shows_energy_where_measured_and_why_not_elsewhere(
    tmp_path: Path, energy: bool
) -> None:
    runs, summary, compared = tables(tmp_path, energy=energy)
    out = tmp_path / "report"
    render_tables({"runs": runs, "summary": summary, "speedups": compared}, out)
    html = (out / "index.html").read_text()
    page = read_page(html)
    energy_tables = [t for t in page.tables["summary"] if t and "joules / sample" in " ".join(t[0])]
    if energy:
        (table,) = energy_tables
        assert {row[-1] for row in table[1:]} == {
            "1 J [0.95–1.05]",
            "0.5 J [0.475–0.525]",
        }
        assert "×0.50 (-50%) [" in html  # the ratio beside the speedup
    else:
        assert not energy_tables
        assert "Energy was not measured: no RAPL zones in /sys/class/powercap." in html
