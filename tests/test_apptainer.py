"""The Apptainer path: with the gpu-node profile (``--sdm apptainer``, ``--apptainer-args
--nv``) every environment's cells run in that environment's own image.

No Apptainer can be installed here, so the command Snakemake builds is checked with a
recording stand-in on PATH (tests/fixtures/apptainer-standin/apptainer): it "pulls" an image
by writing a file, and for ``exec`` logs its arguments and runs the command on the host,
setting APPTAINER_CONTAINER as the real command does. The cells therefore really run (host
torch, the project's interpreter as ``python``) and write their records.
"""

from __future__ import annotations

import hashlib
import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import yaml

ROOT = Path(__file__).resolve().parents[1]
BIN = Path(sys.executable).parent
STANDIN_DIR = ROOT / "tests" / "fixtures" / "apptainer-standin"
RUN_TIMEOUT_S = 300
IMAGES = {
    "torch-a": "docker://example.org/ptspeed/torch-a:1",
    "torch-b": "docker://example.org/ptspeed/torch-b:1",
}
CONFIG: dict[str, Any] = {
    "device": "cpu",
    "trials": 1,
    "threads": 1,
    "steps": {"warmup": 1, "measured": 2, "numerics": 1},
    "timeout_s": 120,
    "environments": {env: {"kind": "container", "container": uri} for env, uri in IMAGES.items()},
    "models": {"mlp": {"cpu": {"batch_size": 16}}},
    "variants": {"eager": "eager"},
    "comparisons": {
        "a-to-b": {
            "baseline": {"env": "torch-a", "variant": "eager"},
            "candidate": {"env": "torch-b", "variant": "eager"},
        }
    },
}


def standin_environment(log: Path) -> dict[str, str]:
    """PATH with the stand-in first, then this interpreter's bin/ (so `python` in a cell is the
    project's interpreter, as it would be the image's)."""
    path = os.pathsep.join([str(STANDIN_DIR), str(BIN), os.environ.get("PATH", "")])
    return {**os.environ, "PATH": path, "PTSPEED_APPTAINER_LOG": str(log)}


@pytest.fixture(scope="module")
def apptainer_run(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    directory = tmp_path_factory.mktemp("apptainer")
    config = directory / "config.yaml"
    results = directory / "results"
    config.write_text(yaml.safe_dump({"results": str(results), **CONFIG}, sort_keys=False))
    log = directory / "apptainer.jsonl"
    done = subprocess.run(
        [
            str(BIN / "snakemake"),
            "--workflow-profile",
            "profiles/gpu-node",
            "--configfile",
            str(config),
            "--apptainer-prefix",
            str(directory / "images"),
            # The cells are what runs in images; tables and report would only add time.
            "--until",
            "cell",
        ],
        cwd=ROOT,
        env=standin_environment(log),
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        timeout=RUN_TIMEOUT_S,
        check=False,
    )
    assert done.returncode == 0, done.stdout[-6000:]
    assert log.is_file(), f"Snakemake never called apptainer:\n{done.stdout[-3000:]}"
    entries = [json.loads(line) for line in log.read_text(encoding="utf-8").splitlines()]
    records = [json.loads(p.read_text()) for p in sorted((results / "records").rglob("*.json"))]
    return {"entries": entries, "records": records, "images": directory / "images"}


def image_path(images: Path, uri: str) -> str:
    """Where Snakemake keeps the pulled image of ``uri`` (the md5 of the URI, .simg)."""
    return str((images / f"{hashlib.md5(uri.encode()).hexdigest()}.simg").resolve())


def test_standin_reports_a_version_snakemake_accepts() -> None:
    done = subprocess.run(
        [str(STANDIN_DIR / "apptainer"), "--version"], capture_output=True, text=True, check=True
    )
    assert done.stdout.startswith("apptainer version 1.")


@pytest.mark.slow
def test_each_environment_image_is_pulled_once(apptainer_run: dict[str, Any]) -> None:
    pulled = [e["pulled"] for e in apptainer_run["entries"] if "pulled" in e]
    assert sorted(pulled) == sorted(IMAGES.values())


@pytest.mark.slow
def test_every_cell_runs_in_its_environments_image_with_nv(apptainer_run: dict[str, Any]) -> None:
    execs = [e for e in apptainer_run["entries"] if e["argv"][0] == "exec"]
    assert len(execs) == len(IMAGES)
    for entry in execs:
        command = " ".join(entry["command"])
        (env,) = [name for name in IMAGES if f"--env {name} " in command]
        assert entry["image"] == image_path(apptainer_run["images"], IMAGES[env])
        assert "--nv" in entry["options"]
        assert "-m ptspeed cell" in command


@pytest.mark.slow
def test_records_name_the_image_they_ran_in(apptainer_run: dict[str, Any]) -> None:
    records = apptainer_run["records"]
    assert len(records) == len(IMAGES)
    for record in records:
        assert record["status"] == "ok", record.get("reason")
        expected = image_path(apptainer_run["images"], IMAGES[record["cell"]["env"]])
        assert record["provenance"]["container_image"] == expected
