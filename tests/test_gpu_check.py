"""scripts/gpu_check.py: the late numerics check it runs over each environment's paths."""

from __future__ import annotations

import importlib.util
import json
import subprocess
import sys
from pathlib import Path
from types import ModuleType
from typing import Any

import pytest
from helpers import ROOT, make_record, with_sources

from ptspeed.cell.record import write_record

SCRIPT = Path(__file__).resolve().parents[1] / "scripts" / "gpu_check.py"


def load_script() -> ModuleType:
    spec = importlib.util.spec_from_file_location("gpu_check_script", SCRIPT)
    assert spec and spec.loader
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # its dataclasses look their module up
    spec.loader.exec_module(module)
    return module


gpu_check = load_script()


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
    gpu_check.check_late_losses(outcomes)
    assert [o.late for o in outcomes] == ["reference", "mismatch", "passed", ""]
    assert (graphs.status, graphs.as_expected) == ("numerics_mismatch", False)
    assert graphs.reason.startswith("late numerics check: step 13's loss 2.2 is 10.00%")
    assert (script.status, missing.status) == ("ok", "no record")


@pytest.mark.slow
@pytest.mark.timeout(1200)
def test_its_cpu_half_ends_every_path_as_expected(tmp_path: Path) -> None:
    """``make gpu-check DEVICE=cpu ENVS=host`` (README: The GPU check), written to a
    temporary directory: every path that runs on the CPU ends as expected there, so the check
    cannot rot on machines without a GPU. About 4 minutes on the 2-core machine."""
    command = [sys.executable, str(SCRIPT), "--device", "cpu", "--envs", "host"]
    done = subprocess.run(
        [*command, "--out", str(tmp_path)], cwd=ROOT, capture_output=True, text=True,
        env=with_sources(), check=False,
    )  # fmt: skip
    cpu_paths = [path.name for path in gpu_check.PATHS if "cpu" in path.devices]
    assert done.returncode == 0, done.stdout[-6000:] + done.stderr[-3000:]
    assert f"{len(cpu_paths)} of {len(cpu_paths)} paths as expected" in done.stdout
    summary = json.loads((tmp_path / "summary.json").read_text())
    assert [outcome["path"] for outcome in summary["outcomes"]] == cpu_paths
    assert {outcome["status"] for outcome in summary["outcomes"]} >= {"ok", "numerics_mismatch"}
