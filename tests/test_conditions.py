"""Perturbed trials: each trial's conditions (cell/conditions.py), their judgement
(analysis/conditions.py), and a real run that a CPU burner perturbs on purpose.

The real run: two host environments x mlp x 4 trials, each cell run as the workflow runs it
(``python -m ptspeed cell`` with the matrix's arguments, the worker in its own session), with
a burner (8 spinning processes per CPU, each in its own session) around two chosen trials;
aggregation must mark exactly those perturbed and compute the speedup from the quiet trials
alone.
"""

from __future__ import annotations

import math
import os
import subprocess
import sys
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import pandas as pd
import pytest
import torch
import yaml
from helpers import CLAIMS, HOSTS, ROOT, SRC, run_aggregate_script

from ptspeed.analysis import ranks
from ptspeed.analysis.columns import ALPHA, CONFIDENCE, read_table
from ptspeed.analysis.conditions import (
    judge_runs,
    mostly_perturbed,
    perturbed_counts,
    settings,
)
from ptspeed.cell import conditions
from ptspeed.cell.arguments import to_arguments
from ptspeed.plan.config import fill_defaults, load_schema
from ptspeed.plan.matrix import cell_spec, cells

# --- the cell's samples --------------------------------------------------------------------------


def test_a_window_measures_the_cells_own_cpu_time_and_the_nodes() -> None:
    window = conditions.begin(torch.device("cpu"))
    deadline = time.process_time() + 0.3
    while time.process_time() < deadline:  # 0.3 s of this process's own CPU time
        pass
    measured = window.end()
    assert measured.window_s is not None and measured.window_s >= 0.29
    assert measured.affinity_cpus == len(os.sched_getaffinity(0))
    assert measured.own_cpu_s is not None and measured.own_cpu_s >= 0.25  # to a few 10 ms ticks
    assert measured.busy_cpu_s is not None and measured.busy_cpu_s >= measured.own_cpu_s - 0.05
    assert measured.other_cpu_s == pytest.approx(measured.busy_cpu_s - measured.own_cpu_s)
    assert measured.sampling_s is not None and measured.sampling_s < 0.5
    assert measured.gpu_source == ""  # on the CPU the GPU is not asked


# --- the judgement -------------------------------------------------------------------------------

QUIET = {
    "status": "ok",
    "window_s": 2.0,
    "affinity_cpus": 2,
    "other_cpu_s": 0.4,  # 10 % of 2 CPUs over 2 s
    "cpu_mhz_max": None,
    "cpu_mhz_limit": None,
    "gpu_sm_mhz_max": None,
    "gpu_sm_mhz_limit": None,
    "gpu_throttle_reasons": "",
    "gpu_other_processes": None,
}


def judged(*rows: dict[str, Any], config: dict[str, Any] | None = None) -> pd.DataFrame:
    return judge_runs(pd.DataFrame([{**QUIET, **row} for row in rows]), config)


@pytest.mark.parametrize(
    ("change", "why"),
    [
        ({"other_cpu_s": 3.8}, "other processes took 95% of its CPUs (> 90%)"),
        ({"cpu_mhz_max": 1000.0, "cpu_mhz_limit": 3000.0}, "CPU clock 1000 MHz < 50%"),
        ({"gpu_sm_mhz_max": 600.0, "gpu_sm_mhz_limit": 1980.0}, "GPU SM clock 600 MHz"),
        ({"gpu_throttle_reasons": "sw_power_cap, hw_slowdown"}, "GPU throttled (hw_slowdown)"),
        ({"gpu_other_processes": 1}, "1 other process(es) on its GPU"),
    ],
)
def test_each_rule_marks_a_trial_perturbed_and_says_why(change: dict[str, Any], why: str) -> None:
    runs = judged({}, change)
    assert runs["perturbed"].tolist() == [False, True]
    assert runs["perturbed_reason"][0] == ""
    assert why in runs["perturbed_reason"][1]


def test_a_burst_beside_some_trials_is_judged_against_the_runs_steady_background() -> None:
    """On a machine other work keeps 80 % busy, a trial left 5 % of its CPUs is perturbed;
    the others, left 20 %, are not (the absolute rule would need 95 %)."""
    steady = {"other_cpu_s": 3.2}  # 80 % of 2 CPUs over 2 s
    runs = judged(steady, steady, {"other_cpu_s": 3.8}, steady)
    assert runs["perturbed"].tolist() == [False, False, True, False]
    assert runs["perturbed_reason"][2] == (
        "other processes took 95% of its CPUs (> 90%); other processes left it 5% of its CPUs "
        "(< 50% of the 20% they left the run's median trial)"
    )


def test_what_cannot_be_judged_is_left_blank() -> None:
    runs = judged({"status": "failed"}, {"window_s": None}, {"window_s": 0.1, "other_cpu_s": 0.19})
    assert runs["perturbed"].isna().tolist() == [True, True, False]  # a short window is quiet
    assert not runs["perturbed"][2]


def test_a_power_cap_alone_is_the_card_at_work_not_a_perturbation() -> None:
    assert not judged({"gpu_throttle_reasons": "sw_power_cap"})["perturbed"][0]


def test_thresholds_come_from_the_config_and_re_judge() -> None:
    busy = {"other_cpu_s": 2.0}  # 50 %
    assert not judged(busy)["perturbed"][0]
    strict = {"conditions": {"max_other_cpu_share": 0.25}}
    assert judged(busy, config=strict)["perturbed"][0]
    assert settings(strict)["keep_perturbed"] is False  # the rest from the schema's defaults


def test_a_cells_counts_name_each_rule_once_with_its_trials() -> None:
    runs = judged({}, {}, {}, {"other_cpu_s": 3.7}, {"other_cpu_s": 3.8, "gpu_other_processes": 2})
    counts = perturbed_counts(
        runs["perturbed"].to_numpy(dtype=object), runs["perturbed_reason"].to_numpy(dtype=object)
    )
    assert counts == {
        "perturbed_trials": 2,
        "perturbed_reasons": "other processes: 2; other processes on its GPU: 1",
    }


def test_the_report_says_so_at_the_top_when_most_trials_were_perturbed() -> None:
    assert mostly_perturbed(judged({}, {}, {"other_cpu_s": 3.7})) == ""
    sentence = mostly_perturbed(judged({}, {"other_cpu_s": 3.7}, {"other_cpu_s": 3.7}))
    assert sentence.startswith("Most trials of this run were perturbed (2 of 3 judged trials")


# --- a real run, perturbed on purpose ------------------------------------------------------------

BURNERS_PER_CPU = 8
BURNED = {("host", 1), ("host-b", 2)}
RUN: dict[str, Any] = {
    **HOSTS,
    "trials": 4,
    "threads": 2,
    # 120 steps of mlp at batch 32: a window of 0.6-25 s on the 2-core machine (quiet to load
    # average 9), long enough for /proc/stat's 10 ms ticks.
    "steps": {"warmup": 2, "measured": 120, "numerics": 0},
    "models": {"mlp": {"cpu": {"batch_size": 32}}},
}


SPIN = "while True: pass"


@contextmanager
def cpu_burner(processes: int) -> Iterator[None]:
    """``processes`` processes spinning on the CPU while the block runs, each in a session of
    its own: with the kernel's autogroup scheduling (CONFIG_SCHED_AUTOGROUP) a session shares
    the CPU as one group, so burners in one session would take no more than one other job."""
    burners = [
        subprocess.Popen([sys.executable, "-c", SPIN], start_new_session=True)
        for _ in range(processes)
    ]
    try:
        time.sleep(2.0)  # every burner spinning before the cell starts
        yield
    finally:
        for burner in burners:
            burner.kill()
        for burner in burners:
            burner.wait()


def run_cell(config: dict[str, Any], cell: Any) -> None:
    spec = cell_spec(config, cell, "cpu", config["threads"])
    out = Path(config["results"]) / cell.path
    env = {**os.environ, "PYTHONPATH": str(SRC)}
    command = [sys.executable, "-m", "ptspeed", "cell", *to_arguments(spec), "--out", str(out)]
    done = subprocess.run(command, capture_output=True, text=True, env=env, timeout=300)
    assert done.returncode == 0, done.stderr[-3000:]


@pytest.fixture(scope="module")
def perturbed_run(tmp_path_factory: pytest.TempPathFactory) -> dict[str, pd.DataFrame]:
    directory = tmp_path_factory.mktemp("perturbed")
    config = {**RUN, "results": str(directory / "results")}
    fill_defaults(config, load_schema())
    for cell in cells(config, "cpu"):  # baseline and candidate trials alternate, as in a run
        if (cell.env, cell.trial) in BURNED:
            with cpu_burner(BURNERS_PER_CPU * (os.cpu_count() or 1)):
                run_cell(config, cell)
        else:
            run_cell(config, cell)
    for name, data in (("config", config), ("claims", CLAIMS)):
        (directory / f"{name}.yaml").write_text(yaml.safe_dump(data), encoding="utf-8")
    records = sorted(str(p) for p in Path(config["results"]).rglob("trial*.json"))
    out = directory / "tables"
    done = run_aggregate_script(
        "--config", str(directory / "config.yaml"), "--claims", str(directory / "claims.yaml"),
        "--records", *records, "--out-dir", str(out),
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    return {name: read_table(out / f"{name}.csv") for name in ("runs", "summary", "speedups")}


def _shares(runs: pd.DataFrame) -> str:
    shares = runs["other_cpu_s"] / (runs["window_s"] * runs["affinity_cpus"])
    return ", ".join(
        f"{env}/{trial}: {share:.0%} over {window:.1f} s"
        for env, trial, share, window in zip(
            runs["env"], runs["trial"], shares, runs["window_s"], strict=True
        )
    )


# Eight cells of 20-40 s and two burned ones of about 2 minutes on the 2-core machine at load
# average 10-17: about 10 minutes.
RUN_TIMEOUT_S = 1800


@pytest.mark.slow
@pytest.mark.timeout(RUN_TIMEOUT_S)
def test_a_burner_marks_exactly_the_trials_it_ran_beside(
    perturbed_run: dict[str, pd.DataFrame],
) -> None:
    runs = perturbed_run["runs"]
    assert set(runs["status"]) == {"ok"}
    flagged = {(env, int(t)) for env, t, p in runs[["env", "trial", "perturbed"]].values if p}
    assert flagged == BURNED, _shares(runs)
    burned = runs[runs["perturbed"].astype(bool)]
    assert burned["perturbed_reason"].str.startswith("other processes").all()
    summary = perturbed_run["summary"].set_index("env")
    assert summary.loc["host", "perturbed_trials"] == 1
    assert summary.loc["host-b", "perturbed_reasons"] == "other processes: 1"


@pytest.mark.slow
@pytest.mark.timeout(RUN_TIMEOUT_S)
def test_the_speedup_is_that_of_the_quiet_trials(perturbed_run: dict[str, pd.DataFrame]) -> None:
    runs = perturbed_run["runs"]
    quiet = runs[~runs["perturbed"].astype(bool)]
    rates = {
        env: quiet.loc[quiet["env"] == env, "throughput_samples_per_s"].tolist()
        for env in ("host", "host-b")
    }
    expected = ranks.speedup(rates["host"], rates["host-b"], CONFIDENCE, ALPHA)
    [row] = perturbed_run["speedups"].to_dict("records")
    assert (row["baseline_trials"], row["candidate_trials"]) == (3, 3)
    assert (row["baseline_perturbed_trials"], row["candidate_perturbed_trials"]) == (1, 1)
    assert math.isclose(row["speedup"], expected.columns("speedup")["speedup"], rel_tol=1e-9)
    assert math.isclose(
        row["baseline_samples_per_s"], sorted(rates["host"])[1], rel_tol=1e-9
    )  # the median of the 3 quiet trials


def test_the_test_config_is_valid() -> None:
    """The run above uses the ordinary schema (and so the default thresholds)."""
    config = {**RUN, "results": "results"}
    fill_defaults(config, load_schema())
    assert config["conditions"]["max_other_cpu_share"] == 0.9
    assert ROOT.is_dir()
