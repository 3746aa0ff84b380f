"""The Snakemake workflow end to end: what it plans, what it runs, what it refuses.

Every run uses its own config file and results directory under pytest's tmp_path, so no test
depends on (or disturbs) the repository's results/ or the developer's earlier runs. Snakemake
runs from the repository root, as `make run` does.
"""

from __future__ import annotations

import copy
import json
import math
import re
import subprocess
from collections import Counter
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd
import pytest
import yaml
from helpers import (
    HOSTS,
    PLAN_TIMEOUT_S,
    ROOT,
    TINY_STEPS,
    USER_MODEL_MODULE,
    job_counts,
    ok,
    planned_outputs,
    snakemake,
    tool,
    write_config,
)

from ptspeed.cell.measurement.breakdown import STEP_ANNOTATION
from ptspeed.cell.measurement.profiling import read_trace
from ptspeed.cell.variants.knobs import parse_knobs
from ptspeed.cell.variants.support import unsupported_reason
from ptspeed.envs.venvs import lock_hash

pytestmark = pytest.mark.workflow

RUN_TIMEOUT_S = 1800
CROSS_VERSION_TIMEOUT_S = 40 * 60

HOST_COMPILE = {
    "device": "cpu",
    "trials": 2,
    "threads": 1,
    "steps": TINY_STEPS,
    "timeout_s": 900,
    "environments": {"host": {"kind": "host"}},
    "models": {"mlp": {"cpu": {"batch_size": 16}}},
    "variants": {"eager": "eager", "compile": "compile"},
    "comparisons": {
        "compile-alone": {
            "title": "Host eager → host compile",
            "baseline": {"env": "host", "variant": "eager"},
            "candidate": {"env": "host", "variant": "compile"},
        }
    },
}


# --- 1, 2: a tiny matrix on the host environment, end to end --------------------------------


@pytest.fixture(scope="module")
def host_run(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path]:
    """One real run of mlp eager vs compile, 2 trials on the host; (config, results)."""
    directory = tmp_path_factory.mktemp("host-run")
    config = write_config(directory, HOST_COMPILE)
    ok(snakemake("--configfile", str(config), timeout=RUN_TIMEOUT_S))
    return config, directory / "results"


@pytest.mark.slow
@pytest.mark.timeout(RUN_TIMEOUT_S + 300)
def test_host_run_writes_tables_and_report(host_run: tuple[Path, Path]) -> None:
    _, results = host_run
    runs = pd.read_csv(results / "tables/runs.csv")
    assert sorted(zip(runs.env, runs.variant, runs.trial, strict=True)) == [
        ("host", "compile", 0),
        ("host", "compile", 1),
        ("host", "eager", 0),
        ("host", "eager", 1),
    ]
    assert set(runs.model) == {"mlp"}
    assert (runs.loc[runs.variant == "eager", "status"] == "ok").all(), runs.reason.tolist()
    # The host's torch (>= 2.0, Python 3.11) compiles on the CPU: unsupported would be a bug.
    assert (runs.loc[runs.variant == "compile", "status"] == "ok").all(), runs.reason.tolist()

    summary = pd.read_csv(results / "tables/summary.csv")
    assert len(summary) == 2
    median = summary.set_index("variant").median_samples_per_s

    speedups = pd.read_csv(results / "tables/speedups.csv")
    assert len(speedups) == 1
    row = speedups.iloc[0]
    assert (row.comparison, row.model) == ("compile-alone", "mlp")
    assert math.isfinite(row.speedup) and row.speedup > 0
    # The Hodges-Lehmann ratio: exp of the median of all pairwise log-throughput differences.
    rates = {
        v: runs.loc[runs.variant == v, "throughput_samples_per_s"].to_numpy() for v in median.index
    }
    differences = np.log(rates["compile"])[None, :] - np.log(rates["eager"])[:, None]
    assert row.speedup == pytest.approx(math.exp(np.median(differences)), rel=1e-9)

    report = (results / "report/report.md").read_text()
    assert (results / "report/index.html").stat().st_size > 0
    assert "Host eager → host compile" in report
    assert re.search(r"^\| mlp \| train \| 16 \|", report, re.MULTILINE), report
    # Beside the speedup, where the time went and both sides' traces, each of which opens.
    html = (results / "report/index.html").read_text()
    links = re.findall(r'<a href="(\.\./traces/[^"]+)">(\w+) trace</a>', html)
    assert [side for _, side in links] == ["baseline", "candidate"], links
    for link, _ in links:
        events = read_trace(str(results / "report" / link))["traceEvents"]
        assert any(str(e.get("name", "")).startswith(STEP_ANNOTATION) for e in events), link
    assert "ops per step" in row.breakdown


@pytest.mark.slow
@pytest.mark.timeout(RUN_TIMEOUT_S + 300)
def test_second_run_does_nothing(host_run: tuple[Path, Path]) -> None:
    config, _ = host_run
    output = ok(snakemake("-n", "--configfile", str(config)))
    assert "Nothing to be done" in output, output[-3000:]
    assert "Job stats:" not in output


# --- 3: changing one model's size reruns only its cells -------------------------------------


@pytest.mark.slow
@pytest.mark.timeout(RUN_TIMEOUT_S + 300)
def test_changed_model_size_reruns_only_its_cells(tmp_path: Path) -> None:
    config = {
        "device": "cpu",
        "trials": 1,
        "threads": 1,
        "steps": TINY_STEPS,
        "environments": {"host": {"kind": "host"}, "host-b": {"kind": "host"}},
        "models": {
            "mlp": {"cpu": {"batch_size": 16}},
            "lstm-lm": {"cpu": {"batch_size": 2, "seq_len": 4}},
        },
        "variants": {"eager": "eager"},
        "comparisons": {
            "two-hosts": {
                "baseline": {"env": "host", "variant": "eager"},
                "candidate": {"env": "host-b", "variant": "eager"},
            }
        },
    }
    ok(snakemake("--configfile", str(write_config(tmp_path, config)), timeout=RUN_TIMEOUT_S))

    changed = copy.deepcopy(config)
    changed["models"]["mlp"]["cpu"]["batch_size"] = 32
    output = ok(snakemake("-n", "--configfile", str(write_config(tmp_path, changed))))

    assert job_counts(output) == Counter(
        cell=2, effective_config=1, judge_trials=1, aggregate=1, report=1, all=1
    )
    records = tmp_path / "results/records"
    assert set(planned_outputs(output)["cell"]) == {
        str(records / f"{env}/mlp/eager/train/b32/trial0.json") for env in ("host", "host-b")
    }


# --- 4: the default matrix plans exactly the expected jobs ----------------------------------


def test_default_matrix_plan(tmp_path: Path) -> None:
    output = ok(snakemake("-n", "--config", f"results={tmp_path / 'results'}"))
    assert job_counts(output) == Counter(
        cell=45, build_env=2, effective_config=1, judge_trials=1, aggregate=1, report=1, all=1
    )
    cells = [
        Path(path).relative_to(tmp_path / "results/records").parts
        for path in planned_outputs(output)["cell"]
    ]
    expected = {
        (env, model, variant, "train", f"trial{trial}.json")
        for env, variant in [
            ("torch-1.13", "eager"),
            ("torch-2.0", "eager"),
            ("torch-2.0", "compile"),
        ]
        for model in ("resnet50", "bert-base", "gpt2")
        for trial in range(5)
    }
    assert {(e, m, v, mode, trial) for e, m, v, mode, _size, trial in cells} == expected
    assert len(cells) == 45
    assert sorted(planned_outputs(output)["build_env"]) == [
        str(tmp_path / f"results/envs/{env}.json") for env in ("torch-1.13", "torch-2.0")
    ]
    assert not (tmp_path / "results").exists()


@pytest.mark.parametrize(
    ("config", "cells"),
    [
        # small-transformer x (2.0 eager, 2.14 eager, 2.14 compile) x 3 trials
        ("user-model", {("small-transformer", "b4-s64")}),
        # 24 torchvision models x eager and compile x 1 trial, each named as torchvision does
        ("suite-torchvision", {(m, "b2-i64") for m in ("resnet18", "vit_b_16", "alexnet")}),
        ("llm", {("llama", "b2-s128"), ("vit", "b4-i64")}),
    ],
)
def test_the_model_source_matrices_plan(
    tmp_path: Path, config: str, cells: set[tuple[str, str]]
) -> None:
    output = ok(
        snakemake(
            "-n", "--configfile", f"config/{config}.yaml", "--config",
            f"results={tmp_path / 'results'}", "device=cpu",
        )
    )  # fmt: skip
    planned = {
        Path(path).relative_to(tmp_path / "results/records").parts
        for path in planned_outputs(output)["cell"]
    }
    expected = {"user-model": 9, "suite-torchvision": 48, "llm": 42}[config]
    assert len(planned) == expected
    assert cells <= {(model, size) for _env, model, _variant, _mode, size, _trial in planned}


def test_the_report_is_set_against_an_earlier_run_where_the_config_names_one(
    tmp_path: Path,
) -> None:
    """compare.earlier (a results directory) becomes the report's --earlier (its runs.csv), an
    input of the report; without it the report has none."""
    earlier = tmp_path / "monday results"
    (earlier / "tables").mkdir(parents=True)
    (earlier / "tables/runs.csv").write_text("env\n", encoding="utf-8")
    config = write_config(tmp_path, HOSTS)
    named = ok(snakemake("-n", "-p", "--configfile", str(config), "--config",
                         f"compare={{earlier: '{earlier}'}}"))  # fmt: skip
    report = named.split("rule report:", 1)[1].split("\n\n", 1)[0]
    assert str(earlier / "tables/runs.csv") in report.split("input:", 1)[1].splitlines()[0]
    assert f"--earlier '{earlier}/tables/runs.csv'" in named
    plain = ok(snakemake("-n", "-p", "--configfile", str(config)))
    assert "--earlier" not in plain


# Each variant of config/extended.yaml and the environments it runs in: those whose torch can
# run it (compile from 2.0, attn=sdpa from 2.1.1), as its comparisons ask.
EXTENDED_VARIANT_ENVS = {
    "eager": {"torch-1.13", "torch-2.0", "torch-2.14"},
    "compile": {"torch-2.0", "torch-2.14"},
    "jit-script": {"torch-1.13"},
    "jit-trace": {"torch-2.14"},
    "attn-eager": {"torch-2.14"},
    "sdpa": {"torch-2.14"},
    "loader": {"torch-2.14"},
    "loader-pin": {"torch-2.14"},
    "prefetch": {"torch-2.14"},
}


def locked_torch(env: str) -> tuple[int, int]:
    """The torch release of a benchmark environment's lock file (envs/<env>.txt)."""
    lock = (ROOT / f"envs/{env}.txt").read_text(encoding="utf-8")
    version = re.search(r"^torch==(\d+)\.(\d+)", lock, re.MULTILINE)
    assert version, env
    return int(version[1]), int(version[2])


def test_extended_matrix_plans_every_variant_where_its_torch_runs_it(tmp_path: Path) -> None:
    path = ROOT / "config/extended.yaml"
    config = yaml.safe_load(path.read_text(encoding="utf-8"))
    results = tmp_path / "results"
    output = ok(snakemake("-n", "--configfile", str(path), "--config", f"results={results}"))
    records = (Path(p).relative_to(results / "records") for p in planned_outputs(output)["cell"])
    cells = Counter((env, variant) for env, _model, variant, *_ in (p.parts for p in records))
    planned: dict[str, set[str]] = {}
    for env, variant in cells:
        planned.setdefault(variant, set()).add(env)
    assert planned == EXTENDED_VARIANT_ENVS
    assert set(cells.values()) == {len(config["models"]) * len(config["modes"]) * config["trials"]}
    assert job_counts(output)["build_env"] == 3
    for variant, envs in planned.items():
        knobs = parse_knobs(config["variants"][variant])
        for env in envs:
            python = tuple(map(int, config["environments"][env]["python"].split(".")))
            torch = locked_torch(env)
            assert not unsupported_reason(knobs, "cuda", torch, python, True, True), (env, variant)
    assert not results.exists()


def test_hopper_matrix_plans_the_cuda_11_8_environment(tmp_path: Path) -> None:
    """config/hopper.yaml: torch-2.0-cu118 (torch pinned by its wheel's URL) and torch-2.14,
    eager and compile; build_env builds each venv from its lock, and the cells of
    torch-2.0-cu118 wait for its build and run in its venv."""
    path = ROOT / "config/hopper.yaml"
    config = yaml.safe_load(path.read_text(encoding="utf-8"))
    results = tmp_path / "results"
    overrides = ("--config", f"results={results}", "device=cpu")
    output = ok(snakemake("-n", "-p", "--configfile", str(path), *overrides))
    planned = planned_outputs(output)
    records = [Path(p).relative_to(results / "records").parts for p in planned["cell"]]
    cells = Counter((env, variant) for env, _model, variant, *_ in records)
    per_pair = len(config["models"]) * len(config["modes"]) * config["trials"]
    envs = ("torch-2.0-cu118", "torch-2.14")
    assert cells == {(env, variant): per_pair for env in envs for variant in ("eager", "compile")}
    assert sorted(planned["build_env"]) == [f"{results}/envs/{env}.json" for env in envs]
    build = re.search(r"workflow/scripts/build_env\.py --name torch-2\.0-cu118 (.*)", output)
    assert build and "--requirements envs/torch-2.0-cu118.txt --python 3.10" in build[1]
    venv = f"torch-2.0-cu118-{lock_hash(ROOT / 'envs/torch-2.0-cu118.txt')}/bin/python"
    # Every job's block, whatever its header (rule, localrule, checkpoint, localcheckpoint): a
    # cell's block ends where the next job's begins, never at a later one.
    blocks = re.split(r"\n(?:local)?(?:rule|checkpoint) ", output)
    cu118_cells = [
        block
        for block in blocks
        if block.startswith("cell:") and "records/torch-2.0-cu118/" in block.split("output:")[1]
    ]
    assert len(cu118_cells) == 2 * per_pair
    for block in cu118_cells:
        assert f"{results}/envs/torch-2.0-cu118.json" in block.splitlines()[1], block
        assert venv in block, block
    assert not results.exists()


# --- 4b: a user's model, from a directory outside the package ------------------------------


@pytest.mark.slow
@pytest.mark.timeout(RUN_TIMEOUT_S + 300)
def test_a_users_model_runs_through_the_workflow(tmp_path: Path) -> None:
    """A model module written outside the package, found through model_paths: its cells run
    (the compiled one through the numerics gate) and the report has its row."""
    models = tmp_path / "user-models"
    models.mkdir()
    (models / "mymodels.py").write_text(USER_MODEL_MODULE, encoding="utf-8")
    config = {
        **copy.deepcopy(HOST_COMPILE),
        "trials": 1,
        "model_paths": [str(models)],
        "models": {"tiny": {"source": "mymodels:tiny", "cpu": {"batch_size": 4, "seq_len": 8}}},
    }
    ok(snakemake("--configfile", str(write_config(tmp_path, config)), timeout=RUN_TIMEOUT_S))
    results = tmp_path / "results"
    runs = pd.read_csv(results / "tables/runs.csv")
    assert set(runs.model) == {"tiny"}
    assert (runs.status == "ok").all(), runs.reason.tolist()
    compiled = runs.loc[runs.variant == "compile"].iloc[0]
    assert compiled.numerics_passed, compiled.to_dict()
    record = results / "records/host/tiny/compile/train/b4-s8/trial0.json"
    assert json.loads(record.read_text())["cell"]["source"] == "mymodels:tiny"
    report = (results / "report/report.md").read_text()
    assert re.search(r"^\| tiny \| train \| 4 \|", report, re.MULTILINE), report


# --- 5: bad configs fail before any job, naming the key -------------------------------------


def mutated(change: str) -> dict[str, Any]:
    config = copy.deepcopy(HOST_COMPILE)
    comparison = config["comparisons"]["compile-alone"]
    if change == "unknown model":
        config["models"]["resnet51"] = {"cpu": {"batch_size": 8}}
    elif change == "unknown knob":
        config["variants"]["x"] = "turbo"
    elif change == "negative batch":
        config["models"]["mlp"]["cpu"]["batch_size"] = -1
    elif change == "missing env":
        config["comparisons"]["c"] = {**comparison, "baseline": {"env": "nope", "variant": "eager"}}
    elif change == "same sides":
        config["comparisons"]["c"] = {**comparison, "candidate": comparison["baseline"]}
    elif change == "shell name":
        config["environments"]["a;rm -rf"] = {"kind": "host"}
    elif change == "unknown key":
        config["bogus"] = 1
    elif change.startswith("source "):
        config["models"]["x"] = {"source": change.split()[1], "cpu": {"batch_size": 2}}
    return config


@pytest.mark.parametrize(
    ("change", "message"),
    [
        ("unknown model", "models.resnet51: unknown model"),
        ("unknown knob", "variants.x: knobs: unknown knob 'turbo'"),
        ("negative batch", "models.mlp.cpu.batch_size: -1 is less than the minimum of 1"),
        ("missing env", "comparisons.c.baseline.env: 'nope' is not an environment"),
        ("same sides", "comparisons.c: baseline and candidate are the same"),
        ("shell name", "environments: 'a;rm -rf' does not match"),
        ("unknown key", "Additional properties are not allowed ('bogus' was unexpected)"),
        (
            "source torchvision:nosuch",
            "models.x.source: model: torchvision:nosuch is not a classification, detection or "
            "segmentation builder of torchvision (e.g. alexnet",
        ),
        (
            "source transformers:",
            "models.x.source: model: 'transformers:' names no transformers model (accepted: "
            "transformers:<model_type>)",
        ),
        (
            "source json:missing",  # a module that is there, without the attribute
            "models.x.source: model: json has no attribute 'missing' (accepted: a "
            "ptspeed.models.ModelSpec, or a function returning one)",
        ),
    ],
)
def test_bad_config_fails_before_any_job(tmp_path: Path, change: str, message: str) -> None:
    result = snakemake("--configfile", str(write_config(tmp_path, mutated(change))))
    assert result.returncode != 0
    assert result.stdout.count(f"config: {message}") == 1, result.stdout[-3000:]
    assert "Building DAG" not in result.stdout
    assert not (tmp_path / "results").exists()


# --- 6: lint and formatting -----------------------------------------------------------------


def test_snakemake_lint_is_clean() -> None:
    output = ok(snakemake("--lint"))
    assert "Lints for" not in output, output
    assert "Congratulations, your workflow is in a good condition!" in output


def test_snakefmt_is_clean() -> None:
    result = subprocess.run(
        [tool("snakefmt"), "--check", "."],
        cwd=ROOT,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        timeout=PLAN_TIMEOUT_S,
        check=False,
    )
    assert result.returncode == 0, result.stdout


# --- 7: the real environments, torch 1.13 -> 2.0 --------------------------------------------


@pytest.mark.slow
@pytest.mark.crossversion
@pytest.mark.timeout(CROSS_VERSION_TIMEOUT_S + 300)
def test_cross_version_upgrade(tmp_path: Path) -> None:
    config = {
        "device": "cpu",
        "trials": 2,
        "threads": 1,
        "steps": TINY_STEPS,
        "environments": {
            name: {"kind": "venv", "requirements": f"envs/{name}.txt", "python": "3.10"}
            for name in ("torch-1.13", "torch-2.0")
        },
        "models": {"mlp": {"cpu": {"batch_size": 32}}},
        "variants": {"eager": "eager"},
        "comparisons": {
            "upgrade-alone": {
                "title": "PyTorch 1.13 eager → 2.0 eager",
                "baseline": {"env": "torch-1.13", "variant": "eager"},
                "candidate": {"env": "torch-2.0", "variant": "eager"},
            }
        },
    }
    path = write_config(tmp_path, config)
    ok(snakemake("--configfile", str(path), timeout=CROSS_VERSION_TIMEOUT_S))

    tables = tmp_path / "results/tables"
    runs = pd.read_csv(tables / "runs.csv")
    assert (runs.status == "ok").all(), runs[["env", "status", "reason"]].to_string()
    versions = {
        env: {str(v).split("+")[0] for v in group} for env, group in runs.groupby("env").torch
    }
    assert versions == {"torch-1.13": {"1.13.1"}, "torch-2.0": {"2.0.1"}}
    speedups = pd.read_csv(tables / "speedups.csv")
    assert len(speedups) == 1
    assert speedups.comparison[0] == "upgrade-alone"
    assert math.isfinite(speedups.speedup[0]) and speedups.speedup[0] > 0


@pytest.mark.workflow
def test_on_one_machine_every_cell_waits_for_every_environments_build(tmp_path: Path) -> None:
    """A cell beside another environment's venv build measured the build too (its trials were
    judged perturbed and rerun): each cell's inputs hold every environment's build."""
    output = ok(snakemake("-n", "--config", f"results={tmp_path / 'results'}"))
    results = tmp_path / "results"
    builds = {f"{results}/envs/torch-1.13.json", f"{results}/envs/torch-2.0.json"}
    inputs = [
        set(block.splitlines()[1].strip().removeprefix("input: ").split(", "))
        for block in output.split("\nrule ")
        if block.startswith("cell:")
    ]
    assert len(inputs) == 45 and all(builds <= given for given in inputs)
