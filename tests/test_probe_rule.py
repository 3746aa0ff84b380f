"""The machine-speed probe's rule judged on runs from two CPU families (issue 36).

tests/fixtures/probes/ holds the probe fields of whole first rounds (README.md there):

* ``amd-issue36.csv``: the default matrix's 45 first-round trials on a 2-core AMD EPYC VM, built
  to the issue's figures (torch 1.13's GEMM probe 60–145 ms, torch 2.0's 19–39 ms, the memory
  pass 6–27 ms, the "before" end up to ×1.8 the slower, a quiet machine). The rule before the
  issue flagged 30 of them by the probe; it must now flag at most 2.
* ``intel-alike.csv``: the same matrix where both builds' BLAS are alike (the runs the project
  was tuned on): nothing to flag, before or now.
* ``amd-measured-host.csv``: 60 real trials of the mlp cell (45 with one thread, 15 with two)
  measured by scripts/probe_spread.py with the new probe on the issue's kind of machine, shared
  with other sessions' tests: what the probe flags ran really slower, and the quiet trials'
  spread is ``PROBE_SPREAD``'s (the method's and the default threshold's evidence).
"""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any

import pandas as pd
import pytest
from helpers import settings_of

from ptspeed.analysis.conditions import (
    PROBE_SPREAD,
    QUIET_SHARE,
    judge_runs,
    quiet_spread,
)
from ptspeed.analysis.reruns import reruns_due
from ptspeed.analysis.trial_readings import other_cpu_share, probe_ends
from ptspeed.plan.schema import section_with_defaults

PROBES = Path(__file__).parent / "fixtures" / "probes"
CONFIG = settings_of({"trials": 5, "conditions": {"reruns": 2}})
SIZES = {"resnet50": "b8-i64", "bert-base": "b2-s32", "gpt2": "b2-s32", "mlp": "b32"}
BY_PROBE = "the node ran"


def fixture(name: str) -> pd.DataFrame:
    runs = pd.read_csv(PROBES / name, keep_default_na=False, na_values=[""])
    paths = [
        f"results/records/{env}/{model}/{variant}/{mode}/{SIZES[model]}/trial{trial}.json"
        for env, model, variant, mode, trial in runs[
            ["env", "model", "variant", "mode", "trial"]
        ].itertuples(index=False)
    ]
    return runs.assign(record_path=paths)


def by_probe(runs: pd.DataFrame) -> pd.DataFrame:
    return runs[runs["perturbed_reason"].str.contains(BY_PROBE, regex=False)]


def rule_before_issue_36(runs: pd.DataFrame, by_env: bool) -> int:
    """How many trials the probe rule as it was flagged: the mean of both ends against the
    median of every trial probing on the same platform, device and threads (``by_env``: of the
    same environment too), more than 15 % off."""
    columns = [
        f"probe_cpu_{part}_s_{end}" for part in ("gemm", "memory") for end in ("before", "after")
    ]
    seconds = runs[columns].sum(axis=1) / 2
    groups = runs["env"] if by_env else pd.Series("", index=runs.index)
    median = seconds.groupby(groups).transform("median")
    return int(((median / seconds - 1).abs() > 0.15).sum())


# --- the issue's AMD figures --------------------------------------------------------------------


def test_the_issue_figures_are_the_issues() -> None:
    runs = fixture("amd-issue36.csv")
    assert len(runs) == 45
    gemm = {
        env: pd.concat([group["probe_cpu_gemm_s_before"], group["probe_cpu_gemm_s_after"]]) * 1e3
        for env, group in runs.groupby("env")
    }
    assert (gemm["torch-1.13"].min(), gemm["torch-1.13"].max()) == pytest.approx((60, 145))
    assert (gemm["torch-2.0"].min(), gemm["torch-2.0"].max()) == pytest.approx((19, 39))
    memory = pd.concat([runs["probe_cpu_memory_s_before"], runs["probe_cpu_memory_s_after"]]) * 1e3
    assert (memory.min(), memory.median(), memory.max()) == pytest.approx((6, 12.8, 27), abs=0.1)
    # The rule before the issue flagged most of them (the issue: 30 of 45 pooled, 23 of 45 per
    # environment), so this run is the issue's.
    assert rule_before_issue_36(runs, by_env=False) >= 30
    assert rule_before_issue_36(runs, by_env=True) >= 15


def test_on_the_issues_quiet_amd_machine_the_probe_flags_at_most_2_of_45() -> None:
    judged = judge_runs(fixture("amd-issue36.csv"), CONFIG)
    assert len(by_probe(judged)) <= 2, by_probe(judged)["perturbed_reason"].tolist()
    assert not judged["perturbed"].any()  # a quiet machine: nothing else either


def test_the_builds_are_never_compared_with_each_other() -> None:
    """Issue 36's first failure: a torch-1.13 probe 3.7 times a torch-2.0 one is the build."""
    runs = fixture("amd-issue36.csv")
    fast_build = runs[runs["env"] == "torch-2.0"]
    one_slow = pd.concat([fast_build, runs[runs["env"] == "torch-1.13"].head(3)])
    assert not by_probe(judge_runs(one_slow, CONFIG)).any().any()


def loaded(runs: pd.DataFrame, position: int) -> pd.DataFrame:
    """``runs`` with the trial at ``position`` run beside a process spinning on every CPU
    through its window and probes: others took 95 % of its CPUs, its probe ran x2.1 (as one
    spinning process per CPU slowed the probe on the 2-core VM, analysis/compare.py)."""
    runs = runs.copy()
    row = runs.index[position]
    window, cpus = runs.at[row, "window_s"], runs.at[row, "affinity_cpus"]
    runs.at[row, "other_cpu_s"] = 0.95 * window * cpus
    for column in [c for c in runs.columns if c.startswith("probe_cpu_")]:
        runs.at[row, column] = runs.at[row, column] * 2.1
    return runs


@pytest.mark.parametrize("name", ["amd-issue36.csv", "intel-alike.csv"])
def test_a_trial_beside_a_real_load_is_still_judged_perturbed_and_rerun(name: str) -> None:
    runs = loaded(fixture(name), 7)
    judged = judge_runs(runs, CONFIG)
    assert judged["perturbed"].tolist() == [i == 7 for i in range(len(runs))]
    reason = judged["perturbed_reason"].iloc[7]
    assert reason.startswith("other processes took 95% of its CPUs"), reason
    [rerun] = reruns_due(judged, CONFIG, 0)
    assert (rerun.env, rerun.model, rerun.variant, rerun.trial) == (
        runs["env"].iloc[7], runs["model"].iloc[7], runs["variant"].iloc[7],
        int(runs["trial"].iloc[7]) + 5,
    )  # fmt: skip


def test_where_the_probe_is_tight_it_catches_the_load_by_itself() -> None:
    """On the Intel-like machine, the loaded trial's probe alone (its CPU share unread) names
    it; on the issue's AMD machine, whose old probes spread ±20 %, only 3 × that would."""
    intel = loaded(fixture("intel-alike.csv"), 7).assign(other_cpu_s=math.nan)
    judged = judge_runs(intel, CONFIG)
    assert by_probe(judged).index.tolist() == [7]
    assert "slower" in judged["perturbed_reason"].iloc[7]


# --- the Intel-like machine, both builds alike --------------------------------------------------


def test_where_both_builds_blas_are_alike_nothing_showed_the_problem() -> None:
    runs = fixture("intel-alike.csv")
    assert rule_before_issue_36(runs, by_env=False) <= 1
    assert not judge_runs(runs, CONFIG)["perturbed"].any()


# --- measured: the new probe on the issue's kind of machine -------------------------------------


# The measured cells ran 15 trials each, one round.
MEASURED = settings_of({"trials": 15, "conditions": {"reruns": 2}})


def test_what_the_probe_flags_on_the_measured_machine_really_ran_slower() -> None:
    runs = fixture("amd-measured-host.csv")
    judged = judge_runs(runs, MEASURED)
    flagged = by_probe(judged)
    assert len(flagged) >= 4  # the machine was shared: some trials ran beside others' tests
    for threads, group in judged.groupby("probe_threads"):
        full_speed = group["throughput_samples_per_s"].quantile(0.75)
        slowed = flagged[flagged["probe_threads"] == threads]["throughput_samples_per_s"]
        assert (slowed < 0.75 * full_speed).all(), (threads, slowed.tolist(), full_speed)


def test_no_quiet_trial_of_the_measured_machine_is_flagged_by_the_probe() -> None:
    runs = fixture("amd-measured-host.csv")
    judged = judge_runs(runs, MEASURED)
    one_thread = judged[judged["probe_threads"] == 1]
    quiet = [other_cpu_share(row) <= QUIET_SHARE for row in one_thread.to_dict("records")]
    assert not by_probe(one_thread[quiet]).any().any()


def test_the_stated_spread_is_the_measured_one_and_the_default_has_margin() -> None:
    """PROBE_SPREAD (stated in the report's method) is recomputed from the measured trials,
    and the default threshold lies well beyond it."""
    runs = fixture("amd-measured-host.csv")
    rows: list[dict[str, Any]] = runs[runs["probe_threads"] == 1].to_dict("records")
    trials, largest, spread = quiet_spread(rows)
    assert (trials, round(largest, 3), round(spread, 3)) == (
        PROBE_SPREAD.trials,
        PROBE_SPREAD.largest,
        PROBE_SPREAD.spread,
    )
    default = section_with_defaults(None, "conditions")["max_probe_deviation"]
    assert default >= 1.5 * PROBE_SPREAD.largest and default >= 5 * PROBE_SPREAD.spread
    ends = [end for row in rows for end in probe_ends(row)]
    assert all(end > 0 for end in ends)
