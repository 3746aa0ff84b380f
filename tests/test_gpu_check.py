"""scripts/gpu_check.py: the late numerics check it runs over each environment's paths."""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import gpu_node_bed
import pytest
from helpers import ROOT, TOOLS, fake_libcuda, load_script, make_record, with_sources

from ptspeed.cell.record import write_record

SCRIPT = TOOLS / "gpu_check.py"


gpu_check = load_script(SCRIPT)


def path_outcome(directory: Path, knobs: str, late_loss: float) -> Any:
    """A written gpt2 record of ``knobs`` whose loss at eager's last step is ``late_loss``,
    and the outcome the check made of it before the late check."""
    record = make_record("torch-2.0", "gpt2", knobs, 0, "ok", 100.0)
    record.cell.knobs = knobs
    steps = record.cell.warmup_steps + record.cell.measured_steps
    record.metrics.late_loss, record.metrics.late_loss_step = late_loss, steps
    path = directory / f"{knobs}.json"
    write_record(record, path)
    return gpu_check.Outcome(
        "torch-2.0", "2.0.1", knobs, knobs, "ok", "ok", "", 1.0, 100.0, "pass", str(path)
    )


def test_a_path_whose_late_loss_strays_from_eager_s_is_a_mismatch(tmp_path: Path) -> None:
    """A CUDA graph replaying stale inputs passes the cell's own checks before the measured
    window; its loss at eager's last step does not match, and the check reports it."""
    eager = path_outcome(tmp_path, "eager", 2.0)
    graphs = path_outcome(tmp_path, "cudagraphs", 2.2)
    script = path_outcome(tmp_path, "jit=script", 2.0)
    missing = gpu_check.Outcome(
        "torch-2.0", "2.0.1", "memfrac", "memfrac=0.5", "ok", "no record", "", 1.0, None, "",
        str(tmp_path / "memfrac.json"),
    )  # fmt: skip
    outcomes = [eager, graphs, script, missing]
    gpu_check.check_with_aggregation(outcomes)
    assert [o.late for o in outcomes] == ["reference", "mismatch", "passed", ""]
    assert (graphs.status, graphs.as_expected) == ("numerics_mismatch", False)
    assert graphs.reason.startswith("late numerics check: step 13's loss 2.2 is 10.00%")
    assert (script.status, missing.status) == ("ok", "no record")


# What each path ends as on the CPU under the host's torch (2.14.1, Python 3.11), as the whole
# CPU half ran it (make gpu-check DEVICE=cpu ENVS=host: 20 of 20 as expected, 4 minutes).
CPU_UNSUPPORTED = {"amp fp16", "cudagraphs", "memfrac", "pin + loader", "tf32 on",
                   "cudnn_benchmark", "prefetch", "infer cudagraphs", "cudagraphs bf16",
                   "cudagraphs + loader", "fsdp offload, 1 process"}  # fmt: skip
CPU_MISMATCHES = {"gate: wrong gradients", "gate: skipped step"}


def test_each_path_s_expected_status_on_the_cpu() -> None:
    """Every path but the out-of-memory one runs on the CPU: the gates as mismatches, what
    needs CUDA unsupported, the rest ok."""
    expected = {
        path.name: gpu_check.expected_status(path, "cpu", (2, 14), (3, 11))
        for path in gpu_check.PATHS
        if "cpu" in path.devices
    }
    assert len(expected) == len(gpu_check.PATHS) - 1
    for name, status in expected.items():
        wanted = (
            "unsupported" if name in CPU_UNSUPPORTED
            else "numerics_mismatch" if name in CPU_MISMATCHES
            else "ok"
        )  # fmt: skip
        assert status == wanted, name


def test_paths_are_chosen_by_slug_with_eager(capsys: pytest.CaptureFixture[str]) -> None:
    names = [path.name for path in gpu_check.chosen_paths("gate-skipped-step,cudagraphs")]
    assert names == ["eager", "cudagraphs", "gate: skipped step"]
    assert gpu_check.chosen_paths("") == gpu_check.PATHS
    assert gpu_check.main(["--paths", "eager,cuda-graphs", "--envs", "host"]) == 2
    line = capsys.readouterr().out.strip()
    assert line.startswith("error: paths: cuda-graphs unknown; the paths are eager, compile, ")


# One path of each kind: the late check's reference and a passed late check, an unsupported
# knob, and both gates' mismatches.
CPU_SAMPLE = ("amp-bf16", "cudagraphs", "jit-script", "gate-wrong-gradients", "gate-skipped-step")


@pytest.mark.slow
@pytest.mark.timeout(600)
def test_its_cpu_half_ends_each_kind_of_path_as_expected(tmp_path: Path) -> None:
    """``make gpu-check DEVICE=cpu ENVS=host PATHS=…`` (README: The GPU check), written to a
    temporary directory: real cells of each kind end as expected on the CPU, the late numerics
    check runs, and the summary and exit status say so, so the check cannot rot on machines
    without a GPU. The whole CPU half (4 minutes) is ``make gpu-check DEVICE=cpu``."""
    command = [sys.executable, str(SCRIPT), "--device", "cpu", "--envs", "host"]
    done = subprocess.run(
        [*command, "--paths", ",".join(CPU_SAMPLE), "--out", str(tmp_path)], cwd=ROOT,
        capture_output=True, text=True, env=with_sources(), check=False,
    )  # fmt: skip
    assert done.returncode == 0, done.stdout[-6000:] + done.stderr[-3000:]
    assert "6 of 6 paths as expected" in done.stdout
    summary = json.loads((tmp_path / "summary.json").read_text())
    ended = {o["path"]: (o["status"], o["late"].split(":")[0]) for o in summary["outcomes"]}
    assert ended == {
        "eager": ("ok", "reference"),
        "amp bf16": ("ok", "passed"),
        "cudagraphs": ("unsupported", ""),
        "jit script": ("ok", "passed"),
        "gate: wrong gradients": ("numerics_mismatch", ""),
        "gate: skipped step": ("numerics_mismatch", ""),
    }
    profiled = {o["path"]: o["profile"] for o in summary["outcomes"] if o["profile"]}
    assert list(profiled) == ["eager"] and profiled["eager"].startswith("cpu "), profiled


def test_inside_an_image_on_a_gpu_the_driver_must_link_for_triton(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Only inside Apptainer on CUDA; without --nv (no driver bound) the check fails, saying
    so; a bound driver (here one made for the test) that links passes."""
    assert gpu_check.check_in_image("cuda") is None or "APPTAINER_CONTAINER" in os.environ
    monkeypatch.setenv("APPTAINER_CONTAINER", "/images/torch-2.0.sif")
    assert gpu_check.check_in_image("cpu") is None
    unbound = gpu_check.check_in_image("cuda", tmp_path / "absent")
    assert unbound.status == "failed" and not unbound.as_expected
    assert "run the image with --nv" in unbound.reason
    driver = fake_libcuda(tmp_path / "libs")
    monkeypatch.setattr(gpu_check.tempfile, "gettempdir", lambda: str(tmp_path))
    bound = gpu_check.check_in_image("cuda", driver)
    assert bound.status == "ok" and bound.as_expected, bound.reason


def test_the_budget_and_the_nodes_gpus_leave_paths_out_listed(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """A spent budget runs nothing more but lists every path left, saying why; a path that
    needs more GPUs than the node has says so; the table and summary are written all the
    same, and nothing not run counts as unexpected."""
    arguments = ["--device", "cuda", "--envs", "host", "--out", str(tmp_path), "--budget-s", "0"]
    assert gpu_check.main([*arguments, "--paths", "ddp-2-processes,cudagraphs"]) == 0
    out = capsys.readouterr().out
    assert "0 of 0 paths as expected, 3 not run" in out
    rows = {o["path"]: o for o in json.loads((tmp_path / "summary.json").read_text())["outcomes"]}
    assert rows["ddp, 2 processes"]["reason"].startswith("needs 2 GPUs, the node has ")
    assert rows["cudagraphs"]["reason"] == "budget: needs about 11 s, 0 s left of 0 s"
    assert {o["status"] for o in rows.values()} == {"not run"}


def test_a_cuda_trial_without_in_window_telemetry_is_unexpected() -> None:
    """On a GPU every ok trial must carry NVML's in-window samples, the window's energy and
    the GPU's machine-speed probe."""
    record = make_record("torch-2.0", "gpt2", "eager", 0, "ok", 100.0)
    record.cell.device = "cuda"
    path = next(p for p in gpu_check.PATHS if p.name == "amp fp16")
    record.conditions.window_s = 2.0  # long enough for NVML's energy counter
    bare = gpu_check.outcome_of("host", "2.11", path, "ok", record, 1.0, Path("r.json"))
    assert not bare.as_expected
    assert bare.complaint == (
        "no in-window telemetry: GPU samples (none, 0), energy, the GPU's machine-speed probe"
    )
    conditions = record.conditions
    conditions.gpu_source, conditions.gpu_samples, conditions.gpu_sm_mhz_median = "nvml", 9, 1980.0
    conditions.energy_j, conditions.energy_source = 35.0, "nvml"
    conditions.probe_gpu_gemm_s_before, conditions.probe_gpu_gemm_s_after = 0.0121, 0.0123
    conditions.probe_gpu_sm_mhz_after = 1980.0
    sampled = gpu_check.outcome_of("host", "2.11", path, "ok", record, 1.0, Path("r.json"))
    assert sampled.as_expected, sampled.complaint
    assert (
        sampled.telemetry == "9 samples, SM 1980 MHz, 35.0 J (nvml), probe 12.1/12.3 ms at 1980 MHz"
    )
    # A window shorter than NVML's energy counter can resolve has no energy, and says why.
    conditions.window_s, conditions.energy_j = 0.02, None
    conditions.energy_not_measured = "a 0.02 s window is shorter than 1 s"
    short = gpu_check.outcome_of("host", "2.11", path, "ok", record, 1.0, Path("r.json"))
    assert short.as_expected, short.complaint
    assert "energy: a 0.02 s window is shorter than 1 s" in short.telemetry
    record.cell.device = "cpu"
    on_cpu = gpu_check.outcome_of("host", "2.11", path, "ok", record, 1.0, Path("r.json"))
    assert on_cpu.as_expected  # the CPU's energy is reported where RAPL is readable, not required


def test_a_profiled_cuda_path_must_break_the_gpus_time_down_and_keep_its_trace(
    tmp_path: Path,
) -> None:
    record = make_record("torch-2.0", "gpt2", "eager", 0, "ok", 100.0)
    path = gpu_check.PATHS[0]
    assert path.name == "eager" and path.profiled
    unprofiled = gpu_check.outcome_of("host", "2.11", path, "ok", record, 1.0, Path("r.json"))
    assert unprofiled.complaint.startswith("not profiled")
    trace = tmp_path / "eager.json.gz"
    trace.write_bytes(b"")
    record.cell.device = "cuda"
    profile = record.profile
    profile.profiled, profile.timeline, profile.step_time_s = True, "cpu", 0.004
    profile.time_by_kind_s = {"matmul": 0.001, "idle": 0.003}
    profile.sum_error, profile.sums, profile.kernels_per_step = 0.0, True, 12.0
    profile.trace = str(trace)
    wrong = gpu_check.profile_of(record)[1]
    assert wrong == "the breakdown is of the cpu timeline, not the GPU's"
    profile.timeline = "gpu"
    line, wrong = gpu_check.profile_of(record)
    assert (line, wrong) == ("gpu 4.00 ms/step, 12 kernels/step, idle 75%, sum error +0.0%", "")
    profile.sums, profile.sum_error = False, 0.03
    assert gpu_check.profile_of(record)[1] == "the kinds miss the step time by +3.0%"


@pytest.mark.slow
def test_a_check_stopped_by_its_time_limit_still_prints_its_table(tmp_path: Path) -> None:
    command = [sys.executable, str(SCRIPT), "--device", "cpu", "--envs", "host",
               "--paths", "compile", "--out", str(tmp_path)]  # fmt: skip
    process = subprocess.Popen(command, cwd=ROOT, stdout=subprocess.PIPE, text=True,
                               env=with_sources())  # fmt: skip
    # Eager runs first (with its machine-speed probes and profiled steps: up to minutes on a
    # loaded 2-core machine); once it has run, compile (a minute or more) is running.
    deadline = time.monotonic() + 300
    while time.monotonic() < deadline and not (tmp_path / "host" / "eager.json").exists():
        time.sleep(0.2)
    assert (tmp_path / "host" / "eager.json").exists(), "eager did not finish within 300 s"
    process.send_signal(signal.SIGTERM)
    out, _ = process.communicate(timeout=120)
    assert "stopped: the table holds the paths that ran" in out
    assert "env         torch" in out and (tmp_path / "summary.json").is_file()
    assert "1 of 1 paths as expected" in out  # eager, which ran


@pytest.mark.slow
@pytest.mark.venv
@pytest.mark.network
@pytest.mark.timeout(900)
def test_its_cpu_half_runs_whole_with_a_gpu_node_s_packages(tmp_path: Path) -> None:
    """``python3 scripts/gpu_check.py`` where there is no make, no jsonschema and no Snakemake
    (a GPU node's fixed image: torch, torchvision, transformers 5, numpy, pandas, scipy,
    pyyaml): the cells run, the aggregation half (the late numerics check, the judgement of
    each trial) runs too, and a transformers model's path passes under transformers 5."""
    uv = Path(sys.executable).with_name("uv")
    python = gpu_node_bed.make_bed(tmp_path / "bed", uv)
    for absent in gpu_node_bed.ABSENT:
        probe = subprocess.run([str(python), "-c", f"import {absent}"], capture_output=True)
        assert probe.returncode != 0, f"{absent} is importable in the bed"
    done = subprocess.run(
        [str(python), str(SCRIPT), "--device", "cpu", "--envs", "host", "--out", str(tmp_path),
         "--paths", "amp-bf16,attn-sdpa,gate-wrong-gradients", "--budget-s", "600"],
        cwd=ROOT, capture_output=True, text=True, check=False,
    )  # fmt: skip
    assert done.returncode == 0, done.stdout[-6000:] + done.stderr[-3000:]
    assert "left out" not in done.stdout and "4 of 4 paths as expected" in done.stdout
    summary = json.loads((tmp_path / "summary.json").read_text())
    late = {o["path"]: o["late"].split(":")[0] for o in summary["outcomes"]}
    assert late["eager"] == "reference" and late["amp bf16"] == "passed", late


@pytest.mark.slow
def test_a_path_the_budget_cuts_is_not_run_and_not_a_failure(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """Eager is admitted (its cost fits the 20 s budget) but hangs: its watchdog ends it at the
    budget's end, and the check lists it as not run, cut by the budget, and exits 0."""
    monkeypatch.setenv("PTSPEED_FAULTS", "host/mlp/eager/train/*=hang")
    arguments = ["--device", "cpu", "--envs", "host", "--paths", "eager", "--budget-s", "20"]
    assert gpu_check.main([*arguments, "--out", str(tmp_path)]) == 0
    out = capsys.readouterr().out
    assert "0 of 0 paths as expected, 1 not run" in out
    (row,) = json.loads((tmp_path / "summary.json").read_text())["outcomes"]
    assert row["status"] == "not run"
    assert re.fullmatch(r"the budget cut it: \d+ s were left of 20 s", row["reason"]), row


def test_a_stuck_child_is_killed_and_the_table_still_prints(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """A cell's process that outlives its own time limit (a watchdog stuck in a driver call)
    is killed with its process group; the check goes on, prints its table and fails."""
    stuck = tmp_path / "python"
    stuck.write_text(f'#!/bin/sh\n[ "$1" = -c ] && exec {sys.executable} "$@"\nexec sleep 600\n')
    stuck.chmod(0o755)
    monkeypatch.setattr(gpu_check, "interpreters", lambda config: {"host": str(stuck)})
    monkeypatch.setattr(gpu_check, "STUCK_AFTER_S", 1.0)
    started = time.monotonic()
    arguments = ["--device", "cpu", "--envs", "host", "--paths", "eager", "--timeout", "1"]
    assert gpu_check.main([*arguments, "--out", str(tmp_path)]) == 1
    assert time.monotonic() - started < 30
    out = capsys.readouterr().out
    assert "env         torch" in out and "0 of 1 paths as expected" in out
    assert "unexpected: host eager: no record (stuck: still running 2 s after it started" in out
