"""Reliability: faults injected into real runs, and what the suite keeps.

Every test injects a fault and checks the outcome: cells given faults through PTSPEED_FAULTS in a
real workflow run (a hang, an out-of-memory error with and without a retry), signals to
Snakemake and to running cells, corrupt, foreign and stale records in results/, a second run on
the same results directory, code and shell syntax in a config, a cell without a network.
Workflow runs use the host environment, mlp, tiny steps and one thread per cell.
"""

from __future__ import annotations

import copy
import json
import os
import re
import shutil
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml
from helpers import (
    HOSTS,
    ROOT,
    TINY_CELL,
    TINY_STEPS,
    job_counts,
    make_record,
    ok,
    planned_outputs,
    read_valid_record,
    settings_of,
    snakemake,
    tool,
    write_config,
)

from ptspeed.analysis.aggregate import load_records, load_tables, read_mapping
from ptspeed.analysis.columns import read_table
from ptspeed.analysis.speedups import speedups
from ptspeed.analysis.staleness import stale_reason
from ptspeed.analysis.summary import summary_table
from ptspeed.cell.faults import FAULTS_VARIABLE, fault_from_environment, parse_faults
from ptspeed.cell.record import CellSpec, read_record, write_record
from ptspeed.errors import BadInput, ResultsInUse
from ptspeed.plan.layout import cell_from_path
from ptspeed.plan.runlock import LOCK_NAME, hold_results_lock
from ptspeed.render import report

SRC = ROOT / "src"
RUN_TIMEOUT_S = 900
WAIT_S = 240
HANG_LIMIT_S = (
    60  # the faulty run's cell limit: a cell and a retry fit in it on a busy 2-core machine
)
CELL_JOB = re.compile(r"^\s*(?:local)?rule cell:", re.MULTILINE)
WILL_EXIT = "Will exit after finishing currently running jobs"
TWO_JOBS_DONE = re.compile(r"^2 of \d+ steps \(\d+%\) done", re.MULTILINE)


def record_path(results: Path, env: str, trial: int, size: str = "b16") -> Path:
    return results / f"records/{env}/mlp/eager/train/{size}/trial{trial}.json"


def faults_env(faults: str = "") -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if k != FAULTS_VARIABLE}
    env["PYTHONUNBUFFERED"] = "1"  # the log of a killed run holds all it printed
    return {**env, FAULTS_VARIABLE: faults} if faults else env


def snakemake_in(
    workdir: Path, *args: str, env: dict[str, str] | None = None, timeout: float = RUN_TIMEOUT_S
) -> subprocess.CompletedProcess[str]:
    return snakemake(*args, cwd=workdir, env=env or faults_env(), timeout=timeout)


# Execs the command with SIGINT's default action, as a terminal's shell starts a command. A
# program started in the background of a non-interactive shell (`make test &`, a CI runner, nohup)
# inherits SIGINT ignored, and Python then installs no KeyboardInterrupt handler: Snakemake
# would not see Ctrl-C at all.
AS_FROM_A_TERMINAL = [
    sys.executable,
    "-c",
    "import os, signal, sys; signal.signal(signal.SIGINT, signal.SIG_DFL); "
    "os.execv(sys.argv[1], sys.argv[1:])",
]


def start_snakemake(workdir: Path, config: Path, log: Path, faults: str = "") -> subprocess.Popen:
    """Snakemake in the background, in its own process group (as a batch job would be), with
    Ctrl-C's default action whatever this process inherited."""
    with open(log, "w", encoding="utf-8") as output:
        return subprocess.Popen(
            [*AS_FROM_A_TERMINAL, tool("snakemake"), "--cores", "2", "--configfile", str(config)],
            cwd=workdir,
            stdout=output,
            stderr=subprocess.STDOUT,
            text=True,
            env=faults_env(faults),
            start_new_session=True,
        )


def wait_for(condition: Callable[[], Any], what: str, timeout: float = WAIT_S) -> Any:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        value = condition()
        if value:
            return value
        time.sleep(0.2)
    raise AssertionError(f"timed out after {timeout:.0f} s waiting for {what}")


def command_line(pid: int) -> list[str]:
    try:
        raw = Path(f"/proc/{pid}/cmdline").read_bytes()
    except OSError:
        return []
    return raw.decode(errors="replace").split("\0")


def alive(pid: int) -> bool:
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except (OSError, IndexError):
        return False
    return state != "Z"


def pids() -> Iterator[int]:
    return (int(p.name) for p in Path("/proc").iterdir() if p.name.isdigit())


def watchdog_of(record: Path) -> int | None:
    """The pid of the cell command (the watchdog) writing ``record``."""
    for pid in pids():
        args = command_line(pid)
        if args[1:4] == ["-m", "ptspeed", "cell"] and str(record) in args and alive(pid):
            return pid
    return None


def worker_of(watchdog: int) -> int | None:
    for pid in pids():
        try:
            parent = int(Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[1])
        except (OSError, IndexError, ValueError):
            continue
        if parent == watchdog and "ptspeed.launch.worker" in command_line(pid) and alive(pid):
            return pid
    return None


def running_cell(record: Path) -> tuple[int, int]:
    """(watchdog, worker) of the cell writing ``record``, once its worker has started."""

    def found() -> tuple[int, int] | None:
        watchdog = watchdog_of(record)
        worker = worker_of(watchdog) if watchdog else None
        return (watchdog, worker) if watchdog and worker else None

    return wait_for(found, f"the cell writing {record} to run")


def processes_of(results: Path) -> list[int]:
    return [pid for pid in pids() if alive(pid) and str(results) in " ".join(command_line(pid))]


def assert_records_complete(results: Path) -> list[Path]:
    """Every record file in ``results`` is a whole, valid record (temporary files of atomic
    writes are dot-files ending in .tmp and are never read as records)."""
    records = sorted((results / "records").rglob("*.json"))
    for path in records:
        read_valid_record(path)
    return records


# --- 2, 3: a hang, an out-of-memory error and its retry, in one real run --------------------

CANARY = "canary-from-title"


@pytest.fixture(scope="module")
def faulty_run(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path, str]:
    """host/0 ok; host-b/0 hangs; host-b/1 runs out of memory (and again at half the batch);
    host/1 runs out of memory once (its retry at half the batch succeeds). The comparison's
    title holds shell syntax that must stay text. Returns (config, results, output)."""
    directory = tmp_path_factory.mktemp("faulty-run")
    config = copy.deepcopy(HOSTS)
    config["timeout_s"] = HANG_LIMIT_S
    config["oom_retry"] = True
    canary = directory / CANARY
    config["comparisons"]["two-hosts"]["title"] = f"host $(touch {canary}) `touch {canary}`"
    path = write_config(directory, config)
    faults = ",".join(
        [
            "host-b/mlp/eager/train/0=hang",
            "host-b/mlp/eager/train/1=oom",
            "host/mlp/eager/train/1=oom-once",
        ]
    )
    result = snakemake_in(ROOT, "--configfile", str(path), env=faults_env(faults))
    return path, directory / "results", ok(result)


@pytest.mark.slow
@pytest.mark.timeout(RUN_TIMEOUT_S + 300)
def test_a_hung_cell_ends_as_a_timeout_and_the_run_goes_on(
    faulty_run: tuple[Path, Path, str],
) -> None:
    _, results, _ = faulty_run
    record = read_valid_record(record_path(results, "host-b", 0))
    assert record.status == "timeout"
    assert record.reason == f"no result within the cell's limit of {HANG_LIMIT_S} s"
    assert record.cell.fault == "hang"
    assert read_valid_record(record_path(results, "host", 0)).status == "ok"
    report_text = (results / "report/report.md").read_text(encoding="utf-8")
    assert "[injected fault: hang]" in report_text


@pytest.mark.slow
@pytest.mark.timeout(RUN_TIMEOUT_S + 300)
def test_out_of_memory_is_recorded_with_the_batch_size_and_retried_at_half(
    faulty_run: tuple[Path, Path, str],
) -> None:
    _, results, _ = faulty_run
    failed = read_valid_record(record_path(results, "host-b", 1))
    assert failed.status == "oom"
    assert failed.reason.startswith("out of memory at batch_size 8: ")
    assert (failed.cell.batch_size, failed.cell.retried_from_batch_size) == (8, 16)
    assert failed.detail.startswith("first attempt at batch_size 16: out of memory at batch_size")
    retried = read_valid_record(record_path(results, "host", 1))
    assert retried.status == "ok", retried.reason
    assert (retried.cell.batch_size, retried.cell.retried_from_batch_size) == (8, 16)
    assert retried.cell.fault == "oom-once"
    assert retried.cell.timeout_s == HANG_LIMIT_S
    assert retried.detail.startswith("first attempt at batch_size 16: out of memory")


@pytest.mark.slow
@pytest.mark.timeout(RUN_TIMEOUT_S + 300)
def test_retried_trials_are_shown_apart_and_never_mixed_into_a_speedup(
    faulty_run: tuple[Path, Path, str],
) -> None:
    _, results, _ = faulty_run
    runs = read_table(results / "tables/runs.csv")
    assert sorted(zip(runs.env, runs.trial, runs.status, runs.batch_size, strict=True)) == [
        ("host", 0, "ok", 16),
        ("host", 1, "ok", 8),
        ("host-b", 0, "timeout", 16),
        ("host-b", 1, "oom", 8),
    ]
    summary = read_table(results / "tables/summary.csv").set_index(["env", "batch_size"])
    assert summary.loc[("host", 8), "retried_from_batch_size"] == "16"
    assert summary.loc[("host", 16), "ok_trials"] == 1
    [speedup] = read_table(results / "tables/speedups.csv").to_dict("records")
    assert (speedup["batch_size"], speedup["baseline_trials"]) == (16, 1)
    assert speedup["verdict"] == "not measured"
    report_text = (results / "report/report.md").read_text(encoding="utf-8")
    assert "| host | mlp | eager | train | 8 (retried from 16) |" in report_text
    assert "### Retried at half the batch size" in report_text


@pytest.mark.slow
@pytest.mark.timeout(RUN_TIMEOUT_S + 300)
def test_shell_syntax_in_a_title_stays_text(faulty_run: tuple[Path, Path, str]) -> None:
    config, results, _ = faulty_run
    assert not (config.parent / CANARY).exists()
    effective = json.loads((results / "config.json").read_text(encoding="utf-8"))
    title = effective["comparisons"]["two-hosts"]["title"]
    assert title.startswith("host $(touch ")
    assert title in (results / "report/report.md").read_text(encoding="utf-8")


@pytest.mark.slow
@pytest.mark.timeout(RUN_TIMEOUT_S + 300)
def test_a_variant_wrong_after_the_checked_steps_is_a_mismatch_in_the_tables_and_report(
    tmp_path: Path,
) -> None:
    """The ``late`` fault in a later trial, whose gate is left to trial 0: only aggregation's
    late check (its loss at eager's last step against eager's) can see it."""
    config = {
        **copy.deepcopy(HOSTS),
        "environments": {"host": {"kind": "host"}},
        "variants": {"eager": "eager", "loader": "loader=0"},
        "comparisons": {
            "loader": {
                "title": "eager → loader",
                "baseline": {"env": "host", "variant": "eager"},
                "candidate": {"env": "host", "variant": "loader"},
            }
        },
    }
    path = write_config(tmp_path, config)
    ok(
        snakemake_in(
            ROOT, "--configfile", str(path), env=faults_env("host/mlp/loader/train/1=late")
        )
    )
    runs = read_table(tmp_path / "results/tables/runs.csv").set_index(["variant", "trial"])
    assert tuple(runs.loc[("loader", 0), ["status", "late_check"]]) == ("ok", "passed")
    wrong = runs.loc[("loader", 1)]
    assert (wrong["status"], wrong["late_check"]) == ("numerics_mismatch", "mismatch")
    assert wrong["reason"].startswith("late numerics check: step 3's loss ")
    report_text = (tmp_path / "results/report/report.md").read_text(encoding="utf-8")
    assert "late numerics check: step 3's loss" in report_text
    assert "[injected fault: late]" in report_text


# --- 4, 5: corrupt, foreign and stale records; a changed config ------------------------------


@pytest.mark.slow
@pytest.mark.timeout(RUN_TIMEOUT_S + 300)
def test_a_changed_config_plans_only_the_cells_it_affects(
    faulty_run: tuple[Path, Path, str],
) -> None:
    config_path, results, _ = faulty_run
    config = yaml.safe_load(config_path.read_text(encoding="utf-8"))
    more = copy.deepcopy(config)
    more["trials"] = 3
    more["environments"]["host-c"] = {"kind": "host"}
    more["comparisons"]["to-c"] = {
        "baseline": {"env": "host", "variant": "eager"},
        "candidate": {"env": "host-c", "variant": "eager"},
    }
    output = ok(
        snakemake_in(
            ROOT, "-n", "--configfile", str(write_config(config_path.parent, more, "more.yaml"))
        )
    )
    planned = {Path(p).relative_to(results / "records") for p in planned_outputs(output)["cell"]}
    assert planned == {
        Path(f"{env}/mlp/eager/train/b16/trial{trial}.json")
        for env, trial in [("host", 2), ("host-b", 2), ("host-c", 0), ("host-c", 1), ("host-c", 2)]
    }
    steps = copy.deepcopy(config)
    steps["steps"] = {**TINY_STEPS, "measured": 3}
    output = ok(
        snakemake_in(
            ROOT, "-n", "--configfile", str(write_config(config_path.parent, steps, "steps.yaml"))
        )
    )
    assert job_counts(output)["cell"] == 4  # every cell measured the old number of steps


@pytest.mark.slow
@pytest.mark.timeout(RUN_TIMEOUT_S + 300)
def test_records_of_an_older_config_are_stale_not_counted(
    faulty_run: tuple[Path, Path, str], tmp_path: Path
) -> None:
    _, results, _ = faulty_run
    config = json.loads((results / "config.json").read_text(encoding="utf-8"))
    config["steps"]["measured"] = 3
    config["variants"]["eager"] = "eager+channels_last"
    paths = [record_path(results, env, trial) for env in ("host", "host-b") for trial in (0, 1)]
    runs, steps = load_tables(paths, settings_of(config))
    assert list(runs["status"]) == ["stale"] * 4
    assert steps.empty
    reason = runs["reason"].iloc[0]
    assert reason.startswith(f"{paths[0]}: stale record, not counted (")
    assert "knobs 'eager', the config's 'eager+channels_last'" in reason
    assert "measured_steps 2, the config's 3" in reason
    assert reason.endswith("it recorded status ok")
    summary = summary_table(runs)
    assert set(summary["ok_trials"]) == {0}
    assert set(summary["statuses"]) == {"stale:2"}
    settings = settings_of(config)
    report.render(runs, summary, speedups(summary, settings, {}, runs), settings, {}, tmp_path)
    text = (tmp_path / "report.md").read_text(encoding="utf-8")
    assert "Records by status: stale:4." in text
    assert text.count("stale record, not counted") == 4


@pytest.mark.slow
@pytest.mark.timeout(RUN_TIMEOUT_S + 300)
def test_corrupt_and_foreign_records_are_named_and_the_rest_aggregated(
    faulty_run: tuple[Path, Path, str],
) -> None:
    """Runs last on the faulty run: it rewrites records."""
    config_path, results, _ = faulty_run
    corrupt = record_path(results, "host", 0)
    corrupt.write_text('{"cell": {"model": "ml', encoding="utf-8")
    foreign = record_path(results, "host-b", 0)  # another cell's record copied over this one
    shutil.copyfile(record_path(results, "host", 1), foreign)
    (results / "records/notes.json").write_text('{"hello": "world"}', encoding="utf-8")
    output = ok(snakemake_in(ROOT, "--configfile", str(config_path)))
    assert not CELL_JOB.search(output), output[-3000:]  # only the tables and the report again
    runs = read_table(results / "tables/runs.csv").set_index("record_path")
    assert runs.loc[str(corrupt), "status"] == "unreadable"
    assert runs.loc[str(corrupt), "reason"].startswith(f"{corrupt}: not JSON")
    assert runs.loc[str(foreign), "status"] == "stale"
    assert (
        "its path names host-b/mlp/eager/train/b16-i224-s128/trial0 but it holds "
        "host/mlp/eager/train/b8-i224-s128/trial1" in runs.loc[str(foreign), "reason"]
    )
    assert runs.loc[str(record_path(results, "host", 1)), "status"] == "ok"
    text = (results / "report/report.md").read_text(encoding="utf-8")
    assert str(corrupt) in text and str(foreign) in text
    assert "notes.json" not in text  # a file outside the matrix is not read at all


# --- staleness, unit ------------------------------------------------------------------------

STALE_CONFIG: dict[str, Any] = {
    **copy.deepcopy(HOSTS),
    "steps": {"warmup": 1, "measured": 2, "numerics": 1},
}


def host_cell(**changes: Any) -> dict[str, Any]:
    cell = CellSpec(
        model="mlp", variant="eager", knobs="eager", mode="train", batch_size=16, env="host",
        warmup_steps=1, measured_steps=2, numerics_steps=1, device="cpu",
    )  # fmt: skip
    return {**cell.__dict__, **changes}


PATH_CELL = cell_from_path("r/records/host/mlp/eager/train/b16/trial0.json")


@pytest.mark.parametrize(
    ("changes", "reason"),
    [
        ({}, ""),
        ({"batch_size": 8, "retried_from_batch_size": 16}, ""),
        ({"device": "auto"}, ""),
        ({"knobs": "compile"}, "knobs 'compile', the config's 'eager'"),
        ({"batch_size": 32}, "sizes batch_size 32,"),
        ({"batch_size": 4, "retried_from_batch_size": 16}, "its path names host/mlp/eager/"),
        ({"measured_steps": 10}, "measured_steps 10, the config's 2"),
        ({"warmup_steps": 3}, "warmup_steps 3, the config's 1"),
        ({"device": "cuda"}, "device cuda, the config's cpu"),
        ({"env": "host-b"}, "its path names host/mlp/eager/train/b16-i224-s128/trial0 but it"),
        ({"variant": "compile", "knobs": "compile"}, "host/compile is not compared in the config"),
        ({"trial": 6}, "trial 6 is outside the config's 2 trials and their 2 reruns"),
    ],
)  # fmt: skip
def test_stale_reason(changes: dict[str, Any], reason: str) -> None:
    found = stale_reason(host_cell(**changes), PATH_CELL, settings_of(STALE_CONFIG))
    assert reason in found if reason else found == ""


def test_a_rerun_of_a_perturbed_trial_is_a_trial_of_the_matrix() -> None:
    """Trial 5 is the second rerun of trial 1 (2 trials, conditions.reruns 2 by default)."""
    rerun = host_cell(trial=5)
    assert stale_reason(rerun, {**PATH_CELL, "trial": 5}, settings_of(STALE_CONFIG)) == ""
    no_reruns = settings_of({**STALE_CONFIG, "conditions": {"reruns": 0}})
    found = stale_reason(rerun, {**PATH_CELL, "trial": 5}, no_reruns)
    assert found == "trial 5 is outside the config's 2 trials and their 0 reruns"


def test_a_model_size_the_model_does_not_use_is_not_a_misplacement() -> None:
    config = copy.deepcopy(STALE_CONFIG)
    config["models"]["mlp"]["cpu"]["image_size"] = 96  # mlp's path label has no image size
    assert stale_reason(host_cell(image_size=96), PATH_CELL, settings_of(config)) == ""


def test_records_without_config_are_not_checked(tmp_path: Path) -> None:
    path = tmp_path / "records/torch-2.0/gpt2/compile/train/b2-s64/trial0.json"
    write_record(make_record("torch-2.0", "gpt2", "compile", 0, "ok", 50.0, batch_size=4), path)
    assert list(load_records([path])["status"]) == ["ok"]


# --- the cell command's fault injection ----------------------------------------------------


def cell_command(*args: str, env: dict[str, str]) -> subprocess.CompletedProcess[str]:
    env = {**env, "PYTHONPATH": str(SRC)}
    return subprocess.run(
        [sys.executable, "-m", "ptspeed", "cell", *args],
        capture_output=True, text=True, timeout=300, env=env, check=False,
    )  # fmt: skip


def test_a_malformed_fault_variable_is_refused_and_nothing_written(tmp_path: Path) -> None:
    out = tmp_path / "cell.json"
    result = cell_command(*TINY_CELL, "--out", str(out), env=faults_env("mlp=hang"))
    assert result.returncode == 2
    assert result.stderr == (
        "error: PTSPEED_FAULTS: 'mlp=hang' is not ENV/MODEL/VARIANT/MODE/TRIAL=FAULT "
        "('*' matches any part)\n"
    )
    assert not out.exists()


@pytest.mark.parametrize(
    ("value", "fault"),
    [
        ("", ""),
        ("host/mlp/eager/train/0=hang", "hang"),
        ("*/mlp/*/*/0=crash,host/mlp/eager/train/0=hang", "crash"),
        ("host-b/mlp/eager/train/0=hang", ""),
        ("host/mlp/eager/train/1=hang", ""),
        (" host/*/*/*/* = error ", None),
    ],
)
def test_fault_selection(value: str, fault: str | None) -> None:
    spec = CellSpec(model="mlp", variant="eager", knobs="eager", mode="train", batch_size=1)
    if fault is None:
        with pytest.raises(BadInput, match="is not ENV/MODEL/VARIANT/MODE/TRIAL=FAULT"):
            fault_from_environment(spec, {FAULTS_VARIABLE: value})
    else:
        assert fault_from_environment(spec, {FAULTS_VARIABLE: value}) == fault


def test_an_unknown_fault_is_refused() -> None:
    with pytest.raises(BadInput, match="fault 'explode' is not one of error, oom, hang"):
        parse_faults("*/*/*/*/*=explode")


# --- 6: one run at a time on a results directory --------------------------------------------

HOLD_LOCK = """
import sys, time
sys.path.insert(0, sys.argv[2])
from ptspeed.plan.runlock import hold_results_lock
hold_results_lock(sys.argv[1])
print("held", flush=True)
time.sleep(600)
"""


def test_the_results_lock_names_its_holder_and_dies_with_it(tmp_path: Path) -> None:
    holder = subprocess.Popen(
        [sys.executable, "-c", HOLD_LOCK, str(tmp_path / "results"), str(SRC)],
        stdout=subprocess.PIPE, text=True,
    )  # fmt: skip
    try:
        assert holder.stdout is not None and holder.stdout.readline() == "held\n"
        with pytest.raises(
            ResultsInUse, match=rf"in use by another run \(process {holder.pid} on "
        ):
            hold_results_lock(tmp_path / "results")
    finally:
        holder.kill()  # SIGKILL: no clean-up code runs, the kernel drops the lock
        holder.wait()
    assert hold_results_lock(tmp_path / "results") == tmp_path / "results" / LOCK_NAME


# --- 1, 6: signals to Snakemake and to cells; a second run on the same results ---------------


def linked_working_directory(directory: Path) -> Path:
    """Another working directory for the same workflow: the project's files linked in, its
    own .snakemake (Snakemake's lock and job metadata), as a second checkout would have."""
    directory.mkdir()
    for entry in ROOT.iterdir():
        if entry.name not in (".snakemake", "results", ".pytest_cache"):
            (directory / entry.name).symlink_to(entry)
    return directory


@pytest.mark.slow
@pytest.mark.timeout(4 * RUN_TIMEOUT_S)
def test_interrupted_runs_keep_whole_records_and_rerun_only_unfinished_cells(
    tmp_path: Path,
) -> None:
    """host/0 finishes, host-b/0 hangs. Phase 1: a second run from the same and from another
    working directory is refused; SIGTERM to Snakemake (it waits for running jobs), then to
    the cell. Phase 2: SIGKILL to the cell. Phase 3: SIGKILL to Snakemake's process group
    (a node dying). Then the stale Snakemake lock is named, --unlock, and the rerun does the
    unfinished cell only."""
    config = {**copy.deepcopy(HOSTS), "trials": 1, "timeout_s": 600}
    config_path = write_config(tmp_path, config)
    results = tmp_path / "results"
    done, hung = record_path(results, "host", 0), record_path(results, "host-b", 0)
    first, second = (linked_working_directory(tmp_path / name) for name in ("wd1", "wd2"))
    hang = "host-b/mlp/eager/train/0=hang"

    run = start_snakemake(first, config_path, tmp_path / "phase1.log", hang)
    try:
        wait_for(done.exists, "the first cell's record")
        watchdog, worker = running_cell(hung)
        same_dir = snakemake_in(first, "--configfile", str(config_path))
        other_dir = snakemake_in(second, "--configfile", str(config_path))
        run.send_signal(signal.SIGTERM)
        # Snakemake has taken the signal when it says so; from then on only its running job
        # keeps it alive (not mere slowness): it must still run while the cell does.
        log_path = tmp_path / "phase1.log"
        wait_for(
            lambda: WILL_EXIT in log_path.read_text(encoding="utf-8"), "Snakemake to take SIGTERM"
        )
        time.sleep(1)
        assert alive(watchdog) and run.poll() is None  # Snakemake waits for its running jobs
        os.kill(watchdog, signal.SIGTERM)
        assert run.wait(timeout=WAIT_S) != 0
    finally:
        if run.poll() is None:
            os.killpg(run.pid, signal.SIGKILL)
    log = (tmp_path / "phase1.log").read_text(encoding="utf-8")
    assert WILL_EXIT in log
    assert same_dir.returncode != 0 and "Directory cannot be locked" in same_dir.stdout
    assert f"results: {results} is in use by another run (process {run.pid} on " in other_dir.stdout
    for refused in (same_dir, other_dir):
        assert not CELL_JOB.search(refused.stdout), refused.stdout[-3000:]
    assert not hung.exists() and not alive(worker)
    kept = done.read_bytes()
    assert assert_records_complete(results) == [done]
    assert not (results / "tables").exists()

    for phase, kill in ((2, "cell"), (3, "group")):
        log_path = tmp_path / f"phase{phase}.log"
        run = start_snakemake(first, config_path, log_path, hang)
        try:
            watchdog, worker = running_cell(hung)
            if kill == "cell":
                os.kill(watchdog, signal.SIGKILL)
            else:
                os.killpg(run.pid, signal.SIGKILL)
            assert run.wait(timeout=WAIT_S) != 0
        finally:
            if run.poll() is None:
                os.killpg(run.pid, signal.SIGKILL)
        assert job_counts(log_path.read_text(encoding="utf-8"))["cell"] == 1, phase
        wait_for(lambda w=worker: not alive(w), "the worker to die with its watchdog", 30)
        assert not hung.exists()
        assert assert_records_complete(results) == [done] and done.read_bytes() == kept
        assert not processes_of(results)

    locked = snakemake_in(first, "--configfile", str(config_path))
    assert locked.returncode != 0 and "Directory cannot be locked" in locked.stdout
    ok(snakemake_in(first, "--unlock", "--configfile", str(config_path)))
    rerun = ok(snakemake_in(first, "--configfile", str(config_path)))
    assert job_counts(rerun)["cell"] == 1
    assert planned_outputs(rerun)["cell"] == [str(hung)]
    assert done.read_bytes() == kept
    runs = read_table(results / "tables/runs.csv")
    assert list(runs["status"]) == ["ok", "ok"]


@pytest.mark.slow
@pytest.mark.workflow
@pytest.mark.timeout(2 * RUN_TIMEOUT_S)
def test_ctrl_c_stops_the_run_and_the_rerun_redoes_only_the_interrupted_cell(
    tmp_path: Path,
) -> None:
    """Ctrl-C in the terminal: SIGINT to Snakemake's whole process group while host/0 is done
    and host-b/0 runs. No record of the interrupted cell, no temporary file; the rerun (no
    fault this time, no --unlock needed) runs that cell alone."""
    config = {**copy.deepcopy(HOSTS), "trials": 1, "timeout_s": 600}
    config_path = write_config(tmp_path, config)
    results = tmp_path / "results"
    done, hung = record_path(results, "host", 0), record_path(results, "host-b", 0)
    log = tmp_path / "run.log"
    run = start_snakemake(ROOT, config_path, log, "host-b/mlp/eager/train/0=hang")
    try:
        # The first cell done as Snakemake counts it, not only its record on disk: with the
        # effective config, two jobs finished (the other cell hangs until interrupted).
        wait_for(done.exists, "the first cell's record")
        wait_for(lambda: TWO_JOBS_DONE.search(log.read_text(encoding="utf-8")), "two jobs done")
        _, worker = running_cell(hung)
        kept = done.read_bytes()
        os.killpg(run.pid, signal.SIGINT)
        try:
            assert run.wait(timeout=WAIT_S) != 0
        except subprocess.TimeoutExpired:
            tail = log.read_text(encoding="utf-8")[-3000:]
            pytest.fail(f"Snakemake still runs {WAIT_S} s after Ctrl-C; its log ends:\n{tail}")
    finally:
        if run.poll() is None:
            os.killpg(run.pid, signal.SIGKILL)
    wait_for(lambda: not alive(worker), "the worker to stop with its watchdog", 30)
    # The watchdog outlives its worker for a moment (it reaps the group, then exits): only
    # once no process of the run is left is the results directory final.
    wait_for(lambda: not processes_of(results), "every process of the run to end", 30)
    assert not hung.exists()
    assert assert_records_complete(results) == [done] and done.read_bytes() == kept
    assert not list(results.rglob("*.tmp"))

    rerun = ok(snakemake_in(ROOT, "--configfile", str(config_path)))
    assert planned_outputs(rerun)["cell"] == [str(hung)]
    assert done.read_bytes() == kept
    runs = read_table(results / "tables/runs.csv")
    assert list(runs["status"]) == ["ok", "ok"]


# --- 7, 8: bad configs refused end to end; nothing in a config runs ---------------------------


@pytest.mark.workflow
@pytest.mark.parametrize("case", ["outside", "python-tag", "code-knob"])
def test_bad_config_runs_nothing_and_executes_nothing(tmp_path: Path, case: str) -> None:
    canary = tmp_path / "executed"
    config = copy.deepcopy(HOSTS)
    if case == "outside":
        config["results"] = "../outside"
        path = tmp_path / "config.yaml"
        path.write_text(yaml.safe_dump(config), encoding="utf-8")
        expected = "config: results: '../outside' leads outside the project directory"
    elif case == "python-tag":
        path = write_config(tmp_path, config)
        tag = f'!!python/object/apply:os.system ["touch {canary}"]'
        path.write_text(path.read_text() + f"threads: {tag}\n", encoding="utf-8")
        expected = "Config file is not valid JSON or YAML"
    else:
        config["variants"]["eager"] = f"__import__('os').system('touch {canary}')"
        path = write_config(tmp_path, config)
        expected = "config: variants.eager: \"__import__('os').system("
    result = snakemake_in(ROOT, "-n", "--configfile", str(path))
    assert result.returncode != 0
    assert result.stdout.count(expected) == 1, result.stdout[-3000:]
    assert "Building DAG" not in result.stdout
    assert not canary.exists()
    assert not (tmp_path / "results").exists() and not (ROOT.parent / "outside").exists()


CODE_RUNNERS = re.compile(
    r"(?<![.\w])(eval|exec|compile|__import__)\(|yaml\.(load|unsafe_load|full_load)\("
    r"|\bpickle\b|shell=True|os\.system\(|os\.popen\(|\bmarshal\b|torch\.load\("
)
# Module imports by constant name: the model registry's modules, dynamo, version probes; and
# the one by a name the config gives: a user's model module (module:attribute), by design.
ALLOWED_IMPORTS = {
    "src/ptspeed/models/__init__.py": (
        "importlib.import_module(REGISTRY[name].module)",
        "importlib.import_module(reference.module)",
    ),
    "src/ptspeed/models/text.py": ('importlib.import_module("torch._dynamo")',),
    "src/ptspeed/envs/venvs.py": ("importlib.import_module(module)",),
}


def test_no_code_evaluates_configured_text() -> None:
    """No eval/exec/unsafe YAML/pickle anywhere in the suite's code; the only dynamic imports
    take module names from the code itself."""
    sources = [*SRC.rglob("*.py"), *(ROOT / "scripts").glob("*.py")]
    sources += [*(ROOT / "workflow").rglob("*.py"), *(ROOT / "workflow").rglob("*.smk")]
    sources.append(ROOT / "Snakefile")
    offending = []
    for path in sources:
        for number, line in enumerate(path.read_text(encoding="utf-8").splitlines(), 1):
            if CODE_RUNNERS.search(line):
                offending.append(f"{path.relative_to(ROOT)}:{number}: {line.strip()}")
            if "import_module(" in line:
                allowed = ALLOWED_IMPORTS.get(str(path.relative_to(ROOT)), ())
                if not any(import_ in line for import_ in allowed):
                    offending.append(f"{path.relative_to(ROOT)}:{number}: {line.strip()}")
    assert not offending, "\n".join(offending)


def test_yaml_readers_are_safe(tmp_path: Path) -> None:
    path = tmp_path / "claims.yaml"
    canary = tmp_path / "executed"
    path.write_text(f'x: !!python/object/apply:os.system ["touch {canary}"]\n', encoding="utf-8")
    with pytest.raises(ValueError, match="not YAML or JSON"):
        read_mapping(path)
    assert not canary.exists()


# --- 8: a cell without a network ------------------------------------------------------------


def without_network() -> list[str]:
    """A command prefix that runs its command in a new network namespace (loopback only,
    down), or a pytest skip saying why this machine cannot make one."""
    tried = []
    unshare = shutil.which("unshare")
    if unshare:
        probe = subprocess.run([unshare, "--net", "true"], capture_output=True, text=True)
        if probe.returncode == 0:
            return [unshare, "--net"]
        tried.append(f"unshare --net: {probe.stderr.strip()}")
    else:
        tried.append("unshare: not installed")
    pytest.skip("no network namespace can be made here: " + "; ".join(tried))


PROBE = "import socket; socket.create_connection((sys.argv[1], 443), timeout=5)"


@pytest.mark.slow
def test_a_cell_runs_with_the_network_unreachable(tmp_path: Path) -> None:
    prefix = without_network()
    reachable_address = socket.gethostbyname("pypi.org") if _resolves("pypi.org") else "1.1.1.1"
    probe = subprocess.run(
        [*prefix, sys.executable, "-c", f"import sys; {PROBE}", reachable_address],
        capture_output=True, text=True, timeout=60,
    )  # fmt: skip
    assert probe.returncode != 0 and "Network is unreachable" in probe.stderr, probe.stderr
    out = tmp_path / "cell.json"
    env = {
        **faults_env(),
        "PYTHONPATH": str(SRC),
        "HF_HUB_OFFLINE": "0",
        "TRANSFORMERS_OFFLINE": "0",
    }
    args = ["--model", "bert-base", "--batch-size", "2", "--seq-len", "8", "--warmup-steps", "1"]
    args += ["--measured-steps", "1", "--numerics-steps", "0", "--device", "cpu", "--threads", "1"]
    result = subprocess.run(
        [*prefix, sys.executable, "-m", "ptspeed", "cell", *args, "--out", str(out)],
        capture_output=True, text=True, timeout=600, env=env,
    )  # fmt: skip
    assert result.returncode == 0, result.stderr
    record = read_record(out)
    assert record.status == "ok", (record.reason, record.detail)
    assert record.provenance.packages.get("transformers")


def _resolves(host: str) -> bool:
    try:
        socket.gethostbyname(host)
    except OSError:
        return False
    return True
