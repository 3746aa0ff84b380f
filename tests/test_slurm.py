"""Cells as SLURM jobs: the config's cluster block, the slurm profile, and a real SLURM.

The tests marked ``slurm`` need a running cluster (``.ci/slurm.sh start``: two nodes with two
fake GPUs each that only jobs see, no accounting database) and run only when PTSPEED_SLURM=1, as
CI sets it. This shell is the login node: it has no GPU. Every wait is
bounded: Snakemake runs under a timeout, and jobs a failed run leaves behind are cancelled.
"""

from __future__ import annotations

import html
import os
import re
import shlex
import shutil
import subprocess
import time
import uuid
from pathlib import Path
from typing import Any

import pandas as pd
import pytest
from helpers import ROOT, TINY_STEPS, first_round_and_reruns, settings_of, write_config
from helpers import snakemake as run_snakemake

from ptspeed.errors import ConfigError
from ptspeed.plan.cluster import (
    check_cluster,
    check_gpu_limit,
    cpus_per_cell,
    gpu_request,
    slurm_resources,
)
from ptspeed.plan.device import device_class_for_jobs
from ptspeed.plan.settings import Cluster

pytestmark = pytest.mark.workflow

PLAN_TIMEOUT_S = 120
SLURM_RUN_TIMEOUT_S = 600
SLURM_QUERY_TIMEOUT_S = 20
SUBMITTED = re.compile(r"Job \S+ has been submitted with SLURM jobid (\d+) \(log: (\S+)\)")

MATRIX: dict[str, Any] = {
    "device": "cpu",
    "trials": 2,
    "threads": 1,
    "steps": TINY_STEPS,
    "timeout_s": 120,
    "mem_mb": 1000,
    "environments": {"host": {"kind": "host"}},
    "models": {"mlp": {"cpu": {"batch_size": 16}, "cuda": {"batch_size": 16}}},
    "variants": {"eager": "eager", "bf16": "amp=bf16"},
    "comparisons": {
        "amp": {
            "baseline": {"env": "host", "variant": "eager"},
            "candidate": {"env": "host", "variant": "bf16"},
        }
    },
}
needs_slurm = pytest.mark.skipif(
    os.environ.get("PTSPEED_SLURM") != "1",
    reason="needs a running SLURM: `.ci/slurm.sh start`, then PTSPEED_SLURM=1 (CI does this)",
)


def slurm_config(directory: Path, **changes: Any) -> Path:
    return write_config(directory, {**MATRIX, **changes})


def snakemake(
    *args: str,
    profile: tuple[str, ...] = ("--workflow-profile", "profiles/slurm"),
    timeout: float = PLAN_TIMEOUT_S,
) -> subprocess.CompletedProcess[str]:
    """Snakemake from the repository root, by default with the slurm profile in place of
    profiles/default."""
    return run_snakemake(*profile, *args, timeout=timeout, cores=None)


# --- the cluster block, without SLURM ---------------------------------------------------------


def cluster_of(given: dict[str, Any]) -> Cluster:
    """The cluster block of ``given``, the schema's defaults filling the rest."""
    return settings_of({"cluster": given}).cluster


def test_only_the_keys_set_become_job_resources() -> None:
    cluster = {"partition": "gpu", "account": "", "constraint": "", "qos": "short"}
    assert slurm_resources(cluster_of(cluster)) == {"slurm_partition": "gpu", "qos": "short"}


@pytest.mark.parametrize("key", ["account", "partition"])
def test_a_required_key_is_checked_only_for_cluster_runs(key: str) -> None:
    cluster = {"account": "", "partition": "", f"{key}_required": True}
    check_cluster(settings_of({"cluster": cluster}), jobs_go_to_scheduler=False)
    with pytest.raises(ConfigError, match=rf"^cluster\.{key}: this site requires a SLURM {key}"):
        check_cluster(settings_of({"cluster": cluster}), jobs_go_to_scheduler=True)
    named = settings_of({"cluster": {**cluster, key: "name1"}})
    check_cluster(named, jobs_go_to_scheduler=True)


def test_a_gpu_limit_of_zero_is_refused_only_for_cuda_cluster_jobs() -> None:
    with pytest.raises(ConfigError, match=r"^resources: gpu=0 "):
        check_gpu_limit(0, cuda=True, jobs_go_to_scheduler=True)
    check_gpu_limit(0, cuda=True, jobs_go_to_scheduler=False)
    check_gpu_limit(0, cuda=False, jobs_go_to_scheduler=True)
    check_gpu_limit(None, cuda=True, jobs_go_to_scheduler=True)
    check_gpu_limit(2, cuda=True, jobs_go_to_scheduler=True)


def test_cluster_jobs_take_their_cpus_from_the_cluster_block() -> None:
    cluster = cluster_of({"cpus_per_task": 6})
    assert cpus_per_cell(2, cluster, jobs_go_to_scheduler=True, cores=32) == 2
    assert cpus_per_cell(0, cluster, jobs_go_to_scheduler=True, cores=32) == 6
    assert cpus_per_cell(0, cluster, jobs_go_to_scheduler=False, cores=32) == 32


def test_gpu_cells_on_one_node_take_their_gpus_share_of_the_cores() -> None:
    """profiles/gpu-node with --resources gpu=8 on a 32-core node: 8 one-GPU cells at once."""
    cluster = cluster_of({"cpus_per_task": 6})
    assert cpus_per_cell(0, cluster, False, cores=32, gpus=1, gpu_limit=8) == 4
    assert cpus_per_cell(0, cluster, False, cores=32, gpus=2, gpu_limit=8) == 8
    assert cpus_per_cell(0, cluster, False, cores=4, gpus=1, gpu_limit=8) == 1
    assert cpus_per_cell(3, cluster, False, cores=32, gpus=1, gpu_limit=8) == 3


def test_device_auto_is_decided_for_the_nodes_that_run_cluster_jobs() -> None:
    assert device_class_for_jobs("auto", declares_platforms=True) == "cuda"
    assert device_class_for_jobs("cpu", declares_platforms=True) == "cpu"
    assert device_class_for_jobs("cuda", declares_platforms=False) == "cuda"
    with pytest.raises(ConfigError, match=r"^device: auto cannot be decided .* set device: cuda"):
        device_class_for_jobs("auto", declares_platforms=False)


def test_a_required_partition_may_come_from_every_platform() -> None:
    cluster = {"account": "", "partition": "", "partition_required": True}
    both = {"a100": {"partition": "gpu-a"}, "h100": {"partition": "gpu-h"}}
    check_cluster(settings_of({"cluster": cluster, "platforms": both}), True)
    one = {"a100": {"partition": "gpu-a"}, "h100": {}}
    with pytest.raises(ConfigError, match=r"^cluster\.partition: .*\(platform h100 sets none\)"):
        check_cluster(settings_of({"cluster": cluster, "platforms": one}), True)


def test_gpu_requests_as_sites_take_them() -> None:
    assert gpu_request(2, "a100", "gpus") == {
        "gpu": 2, "gpu_model": "a100", "gres": "", "slurm_extra": ""
    }  # fmt: skip
    assert gpu_request(1, "", "gres")["gres"] == "gpu:1"
    assert gpu_request(2, "a100", "gres") == {
        "gpu": 0, "gpu_model": "", "gres": "gpu:a100:2", "slurm_extra": ""
    }  # fmt: skip
    # The plugin rejects a '-' in gpu_model: a dashed type travels as --gpus-per-node.
    dashed = gpu_request(1, "a100-sxm4-80gb", "gpus")
    assert dashed == {
        "gpu": 0,
        "gpu_model": "",
        "gres": "",
        "slurm_extra": "--gpus-per-node=a100-sxm4-80gb:1",
    }
    with pytest.raises(ConfigError, match=r"^platforms: gres_type 'a100-sxm4-80gb' cannot travel"):
        gpu_request(1, "a100-sxm4-80gb", "gres")


def test_slurm_run_without_a_required_account_stops_with_one_line(tmp_path: Path) -> None:
    config = slurm_config(tmp_path, cluster={"account_required": True})
    done = snakemake("--dry-run", "--configfile", str(config))
    assert done.returncode != 0, done.stdout
    messages = [line for line in done.stdout.splitlines() if line.startswith("config: ")]
    assert len(messages) == 1, done.stdout
    assert messages[0].startswith("config: cluster.account: this site requires a SLURM account")
    assert "Traceback" not in done.stdout
    assert "Building DAG" not in done.stdout


def test_cuda_run_with_the_default_profile_added_is_refused(tmp_path: Path) -> None:
    """--profile profiles/slurm also applies profiles/default, whose gpu: 0 would strip the
    GPU request from every CUDA cell job."""
    config = slurm_config(tmp_path, device="cuda")
    done = snakemake(
        "--dry-run", "--configfile", str(config), profile=("--profile", "profiles/slurm")
    )
    assert done.returncode != 0, done.stdout
    assert "resources: gpu=0 would submit CUDA cell jobs without a GPU" in done.stdout
    assert "Building DAG" not in done.stdout


def test_device_auto_on_a_login_node_without_platforms_stops_with_one_line(tmp_path: Path) -> None:
    """Today's login node has no GPU: auto must not plan the GPU nodes' cells as CPU cells."""
    config = slurm_config(tmp_path, device="auto")
    done = snakemake("--dry-run", "--configfile", str(config))
    assert done.returncode != 0, done.stdout
    messages = [line for line in done.stdout.splitlines() if line.startswith("config: ")]
    assert messages == [
        "config: device: auto cannot be decided for cluster jobs on the node that submits them "
        "(it would plan the GPU nodes' cells from this node's devices); set device: cuda or "
        "device: cpu (e.g. --config device=cuda), or list the cluster's GPU types as platforms"
    ], done.stdout
    assert "Building DAG" not in done.stdout


def cell_job_lines(output: str) -> list[str]:
    return [line for line in output.splitlines() if "resources:" in line and "nodes=" in line]


def test_device_auto_with_platforms_plans_cuda_cells_at_gpu_sizes(tmp_path: Path) -> None:
    platforms = {**PLATFORMS, "h100": {**PLATFORMS["h100"], "gres_type": "h100-80gb"}}
    models = {"mlp": {"cpu": {"batch_size": 8}, "cuda": {"batch_size": 16}}}
    config = slurm_config(tmp_path, device="auto", trials=1, models=models, platforms=platforms)
    done = snakemake("--dry-run", "--configfile", str(config))
    assert done.returncode == 0, done.stdout
    planned = [line for line in done.stdout.splitlines() if "/records/" in line]
    assert planned and all("/b16/" in line for line in planned), planned
    jobs = cell_job_lines(done.stdout)
    assert len(jobs) == 4, done.stdout
    for line in jobs:
        assert "nodes=1" in line
        assert ("gpu=1, gpu_model=a100" in line) or (
            "gpu=0, gpu_model=, gres=, slurm_extra=--gpus-per-node=h100-80gb:1" in line
        ), line


def test_a_gres_site_gets_its_gpus_by_gres(tmp_path: Path) -> None:
    config = slurm_config(
        tmp_path, device="cuda", trials=1, platforms=PLATFORMS, cluster={"gpu_request": "gres"}
    )
    done = snakemake("--dry-run", "--configfile", str(config))
    assert done.returncode == 0, done.stdout
    jobs = cell_job_lines(done.stdout)
    assert len(jobs) == 4, done.stdout
    assert sorted(line.split("gres=")[1].split(",")[0] for line in jobs) == [
        "gpu:a100:1", "gpu:a100:1", "gpu:h100:1", "gpu:h100:1"
    ]  # fmt: skip
    assert all("gpu=0" in line for line in jobs)


def test_gpu_cells_of_the_gpu_node_recipe_share_its_cores(tmp_path: Path) -> None:
    config = slurm_config(tmp_path, device="cuda", trials=1, threads=0)
    done = snakemake(
        "--dry-run", "--configfile", str(config), "--cores", "8", "--resources", "gpu=2",
        profile=("--workflow-profile", "profiles/gpu-node"),
    )  # fmt: skip
    assert done.returncode == 0, done.stdout
    threads = [line.strip() for line in done.stdout.splitlines() if "threads:" in line]
    assert threads == ["threads: 4"] * 2, done.stdout


def test_cell_jobs_carry_the_cluster_block_as_resources(tmp_path: Path) -> None:
    cluster = {"partition": "gpu", "account": "proj1", "account_required": True}
    config = slurm_config(tmp_path, cluster=cluster)
    done = snakemake("--dry-run", "--configfile", str(config))
    assert done.returncode == 0, done.stdout
    cell_resources = [
        line for line in done.stdout.splitlines() if "resources:" in line and "gpu=" in line
    ]
    assert len(cell_resources) == 4, done.stdout
    for line in cell_resources:
        for expected in ("slurm_partition=gpu", "slurm_account=proj1", "runtime=7", "mem_mb=1000"):
            assert expected in line
        assert "cpus_per_task=" in line
        assert "constraint=" not in line and "qos=" not in line


# --- a real SLURM ---------------------------------------------------------------------------


def slurm_query(*command: str) -> str:
    done = subprocess.run(
        list(command), capture_output=True, text=True, timeout=SLURM_QUERY_TIMEOUT_S, check=True
    )
    return done.stdout


def jobs_named(prefix: str) -> list[dict[str, str]]:
    """The jobs (pending, running or finished within MinJobAge) whose name starts with prefix."""
    output = slurm_query("squeue", "--states=all", "--noheader", "--format=%i|%j|%T|%k")
    jobs = []
    for line in output.splitlines():
        job_id, name, state, comment = line.split("|", 3)
        if name.startswith(prefix):
            jobs.append({"id": job_id, "state": state, "comment": comment})
    return jobs


def cancel_jobs(prefix: str) -> None:
    left = [j["id"] for j in jobs_named(prefix) if j["state"] in ("PENDING", "RUNNING")]
    if left:
        subprocess.run(["scancel", *left], timeout=SLURM_QUERY_TIMEOUT_S, check=False)


def run_on_slurm(
    directory: Path, config: Path, *extra: str, command: list[str] | None = None
) -> tuple[str, float, str]:
    """Run the workflow through the slurm executor (by ``command``, a README's, or the slurm
    profile's); return (output, wall seconds, job-name prefix). Whatever happens, no job of
    this run is left queued."""
    prefix = f"ptspeedtest_{uuid.uuid4().hex[:8]}"
    arguments = [
        "--configfile",
        str(config),
        "--slurm-status-command",
        "squeue",
        "--slurm-init-seconds-before-status-checks",
        "2",
        "--slurm-logdir",
        str(directory / "slurm-logs"),
        "--slurm-jobname-prefix",
        prefix,
        *extra,
    ]
    started = time.monotonic()
    try:
        if command:
            done = subprocess.run(
                [*command, *arguments],
                cwd=ROOT,
                stdout=subprocess.PIPE,
                stderr=subprocess.STDOUT,
                text=True,
                timeout=SLURM_RUN_TIMEOUT_S,
                check=False,
            )
        else:
            done = snakemake(*arguments, timeout=SLURM_RUN_TIMEOUT_S)
    finally:
        cancel_jobs(prefix)
    wall_s = time.monotonic() - started
    print(f"SLURM run: {wall_s:.1f} s wall")
    assert done.returncode == 0, done.stdout[-6000:]
    return done.stdout, wall_s, prefix


# Where the README sends a user for the cluster recipes: the commands are copied from there.
CLUSTER_GUIDE = "docs/clusters.md"


def readme_command(start: str) -> list[str]:
    """The cluster guide's command line that starts with ``start``, as printed (a line ending in a
    backslash continues on the next)."""
    lines = iter((ROOT / CLUSTER_GUIDE).read_text(encoding="utf-8").splitlines())
    for line in lines:
        if line.startswith(start):
            while line.endswith("\\"):
                line = line[:-1] + next(lines)
            return shlex.split(line, comments=True)
    raise AssertionError(f"{CLUSTER_GUIDE} has no command starting with {start!r}")


def records(results: Path, trials: int) -> list[dict[str, Any]]:
    """The run's records of its first round (any other is a rerun its judgement listed)."""
    first, _ = first_round_and_reruns(results, trials)
    return first


@pytest.fixture(scope="module")
def slurm_node() -> None:
    assert shutil.which("sinfo"), "PTSPEED_SLURM=1 but sinfo is not installed"
    states = slurm_query("sinfo", "--noheader", "--Node", "--format=%t").split()
    assert set(states) & {"idle", "mix"}, f"no idle SLURM node (states: {states})"


@needs_slurm
@pytest.mark.slurm
@pytest.mark.timeout(SLURM_RUN_TIMEOUT_S + 300)
@pytest.mark.slow
def test_a_comparisons_trials_run_side_by_side_on_one_node_of_two(
    tmp_path: Path, slurm_node: None
) -> None:
    """Each trial of the comparison is one group job; asking for a node's memory, each job has
    a node to itself, so SLURM runs the two trials' jobs at once, one on each node."""
    memory = slurm_query("sinfo", "--Node", "--noheader", "--format=%m").split()
    config = slurm_config(tmp_path, mem_mb=min(int(mb) for mb in memory))
    output, _, prefix = run_on_slurm(tmp_path, config)
    results = tmp_path / "results"
    found = records(results, MATRIX["trials"])
    assert len(found) == 4
    assert {r["status"] for r in found} == {"ok"}, [r.get("reason") for r in found]
    for table in ("runs", "summary", "speedups", "steps"):
        assert (results / "tables" / f"{table}.csv").stat().st_size > 0

    submitted = SUBMITTED.findall(output)
    assert len(submitted) == 2 and len({job_id for job_id, _ in submitted}) == 2, output
    for job_id, log in submitted:
        # SLURM itself wrote this log (it substitutes %j): the cells ran inside that job.
        assert Path(log).name == f"{job_id}.log"
        assert "2 of 2 steps (100%) done" in Path(log).read_text(encoding="utf-8")
    jobs = jobs_named(prefix)
    assert {j["state"] for j in jobs} == {"COMPLETED"}, jobs
    assert sorted(j["comment"] for j in jobs) == [
        "rule_cells.mlp.train.b16.trial0_cell",
        "rule_cells.mlp.train.b16.trial1_cell",
    ]

    by_trial: dict[int, dict[str, dict[str, Any]]] = {}
    for record in found:
        by_trial.setdefault(record["cell"]["trial"], {})[record["cell"]["variant"]] = record
    for trial, sides in by_trial.items():
        nodes = {side["provenance"]["slurm_node"] for side in sides.values()}
        jobs_of_trial = {side["provenance"]["slurm_job_id"] for side in sides.values()}
        assert len(nodes) == 1 and len(jobs_of_trial) == 1, (trial, nodes, jobs_of_trial)
        # Back to back, the baseline first on even trials and last on odd ones.
        first = min(sides, key=lambda variant: sides[variant]["started_at"])
        assert first == ("eager" if trial % 2 == 0 else "bf16"), trial
    used = sorted({r["provenance"]["slurm_node"] for r in found})
    assert used == ["ci1", "ci2"], used
    runs = pd.read_csv(results / "tables" / "runs.csv")
    assert sorted(runs["slurm_node"]) == ["ci1", "ci1", "ci2", "ci2"]
    for page in ("index.html", "report.md"):
        text = html.unescape((results / "report" / page).read_text(encoding="utf-8"))
        assert "Ran on nodes ci1, ci2; each trial's baseline and candidate on one node." in text


# --- platforms: the cluster's GPU types --------------------------------------------------------

A100 = {"name": "NVIDIA A100-SXM4-80GB", "capability": "8.0"}
H100 = {"name": "NVIDIA H100 80GB HBM3", "capability": "9.0"}
# The partitions and gres types of .ci/slurm.sh's node: one fake GPU of each type.
PLATFORMS = {
    "a100": {"partition": "a100", "gres_type": "a100", "gpu": A100},
    "h100": {"partition": "h100", "gres_type": "h100", "gpu": "probe"},
}


def test_cells_a_platforms_gpu_cannot_run_are_not_submitted_and_say_why(tmp_path: Path) -> None:
    versions = {
        env: {"kind": "venv", "requirements": f"envs/{env}.txt", "python": "3.10"}
        for env in ("torch-1.13", "torch-2.0")
    }
    comparison = {
        "baseline": {"env": "torch-1.13", "variant": "eager"},
        "candidate": {"env": "torch-2.0", "variant": "eager"},
    }
    platforms = {**PLATFORMS, "h100": {**PLATFORMS["h100"], "gpu": H100}}
    config = slurm_config(
        tmp_path,
        trials=1,
        environments=versions,
        comparisons={"upgrade": comparison},
        platforms=platforms,
    )
    done = snakemake("--dry-run", "--configfile", str(config))
    assert done.returncode == 0, done.stdout
    for version in ("1.13.1", "2.0.1"):
        assert (
            f"not planned: torch {version}+cu117 has no code for sm_90 (NVIDIA H100 80GB HBM3); "
            "its newest is sm_86"
        ) in done.stdout
    planned = [line for line in done.stdout.splitlines() if "/records/" in line]
    assert planned and all("/records/a100/" in line for line in planned), planned
    cell_jobs = [line for line in done.stdout.splitlines() if "slurm_partition=" in line]
    assert cell_jobs and all("slurm_partition=a100" in line for line in cell_jobs)


def jobs_partitions(prefix: str) -> dict[str, str]:
    """The partition of each job (by id) whose name starts with prefix."""
    output = slurm_query("squeue", "--states=all", "--noheader", "--format=%i|%j|%P")
    rows = (line.split("|", 2) for line in output.splitlines())
    return {job_id: partition for job_id, name, partition in rows if name.startswith(prefix)}


@needs_slurm
@pytest.mark.slurm
@pytest.mark.timeout(SLURM_RUN_TIMEOUT_S + 300)
@pytest.mark.slow
def test_each_platforms_cells_run_in_its_partition(tmp_path: Path, slurm_node: None) -> None:
    config = slurm_config(tmp_path, trials=1, platforms=PLATFORMS)
    _, _, prefix = run_on_slurm(tmp_path, config)
    results = tmp_path / "results"
    found = records(results, trials=1)
    assert len(found) == 4
    assert {r["status"] for r in found} == {"ok"}, [r.get("reason") for r in found]
    for record in found:
        platform = record["cell"]["platform"]
        # The job's own SLURM_JOB_PARTITION, as the cell recorded it.
        assert record["provenance"]["slurm_partition"] == platform
    # One group job per platform: its trial's two sides on one node of its partition.
    assert sorted(jobs_partitions(prefix).values()) == ["a100", "h100"]
    speedups = pd.read_csv(results / "tables" / "speedups.csv")
    assert sorted(speedups["platform"]) == ["a100", "h100"]
    page = (results / "report" / "index.html").read_text(encoding="utf-8")
    for platform in PLATFORMS:  # the seed table's row of each platform
        assert f'<td data-label="platform">{platform}</td>' in page
    assert "What each platform can run" in page


@needs_slurm
@pytest.mark.slurm
@pytest.mark.timeout(SLURM_RUN_TIMEOUT_S + 300)
@pytest.mark.slow
def test_a_cuda_cell_asks_for_its_platforms_gpu_type(tmp_path: Path, slurm_node: None) -> None:
    config = slurm_config(tmp_path, device="cuda", trials=1, platforms=PLATFORMS)
    target = tmp_path / "results" / "records" / "h100" / "host" / "mlp" / "eager" / "train"
    output, _, prefix = run_on_slurm(tmp_path, config, "--verbose", str(target / "b16/trial0.json"))
    (sbatch,) = [line for line in output.splitlines() if line.startswith("sbatch call:")]
    assert " -p h100 " in sbatch and " --gpus=h100:1 " in sbatch, sbatch
    ((job_id, partition),) = jobs_partitions(prefix).items()
    shown = slurm_query("scontrol", "--oneliner", "show", "job", job_id)
    assert partition == "h100" and "TresPerJob=gres:gpu:h100:1" in shown, shown
    (record,) = records(tmp_path / "results", trials=1)
    assert record["cell"]["platform"] == "h100"
    # The h100 fake GPU is the node's second (gres.conf order): SLURM gave the job that one.
    assert record["provenance"]["cuda_visible_devices"] in ("0", "1")


# --- the README's recipes, from a side without a GPU ------------------------------------------

GPU_SIZES = {"mlp": {"cpu": {"batch_size": 8}, "cuda": {"batch_size": 16}}}


@needs_slurm
@pytest.mark.slurm
@pytest.mark.timeout(SLURM_RUN_TIMEOUT_S + 300)
@pytest.mark.slow
def test_the_readme_login_node_recipe_runs_cuda_cells_on_the_gpu_nodes(
    tmp_path: Path, slurm_node: None
) -> None:
    """The login node (this shell) has no GPU; the cells' nodes have (fake) ones."""
    assert shutil.which("nvidia-smi") is None, "the submitting side must have no GPU"
    command = readme_command(".venv/bin/snakemake --workflow-profile profiles/slurm")
    config = slurm_config(tmp_path, device="auto", trials=1, models=GPU_SIZES)
    output, _, prefix = run_on_slurm(tmp_path, config, "--verbose", command=command)
    # One trial: its two sides are one group job, which asks for the GPU of one cell at a time.
    (sbatch,) = [line for line in output.splitlines() if line.startswith("sbatch call:")]
    assert " --gpus=1 " in sbatch and " --nodes=1 " in sbatch, sbatch
    (job,) = jobs_named(prefix)
    shown = slurm_query("scontrol", "--oneliner", "show", "job", job["id"])
    assert "TresPerJob=gres:gpu:1" in shown and "JobState=COMPLETED" in shown, shown
    found = records(tmp_path / "results", trials=1)
    assert len(found) == 2
    for record in found:
        assert record["cell"]["device"] == "cuda" and record["cell"]["batch_size"] == 16
        # CPU torch on the test nodes: the cell says CUDA is missing, not a speed.
        assert record["status"] == "unsupported" and "CUDA" in record["reason"], record
        assert record["provenance"]["slurm_node"] in ("ci1", "ci2")
        # SLURM gave the job one of its node's GPUs (CUDA_VISIBLE_DEVICES, from gres.conf).
        assert record["provenance"]["cuda_visible_devices"] in ("0", "1")


@needs_slurm
@pytest.mark.slurm
@pytest.mark.timeout(SLURM_RUN_TIMEOUT_S + 300)
@pytest.mark.slow
def test_the_readme_gpu_node_recipe_runs_gpu_cells_side_by_side(
    tmp_path: Path, slurm_node: None
) -> None:
    """The recipe at the test nodes' size: 2 GPUs and their CPUs, --resources gpu=2."""
    cpus = slurm_query("sinfo", "--Node", "--noheader", "--format=%c").split()
    node_cpus = min(int(count) for count in cpus)
    sized = {"--gpus=8": "--gpus=2", "--cpus-per-task=32": f"--cpus-per-task={node_cpus}"}
    command = [sized.get(arg, arg) for arg in readme_command("srun --gpus=8")]
    command[-1] = command[-1].replace("gpu=8", "gpu=2")
    assert command[-2:] == ["--resources", "gpu=2"], command
    config = slurm_config(tmp_path, device="auto", trials=1, threads=0, models=GPU_SIZES)
    done = subprocess.run(
        [*command, "--configfile", str(config)],
        cwd=ROOT,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        timeout=SLURM_RUN_TIMEOUT_S,
        check=False,
    )
    assert done.returncode == 0, done.stdout[-6000:]
    found = records(tmp_path / "results", trials=1)
    assert len(found) == 2, done.stdout[-6000:]
    # auto, decided on the GPU node the job runs on: CUDA cells at GPU sizes.
    assert {(r["cell"]["device"], r["cell"]["batch_size"]) for r in found} == {("cuda", 16)}
    # At once: a cell holds its GPU until it ends and claims the first free one, so two cells
    # one after the other would both have had GPU 0. (Their records' times, to the second, are
    # too coarse for cells that stop at once for want of CUDA.)
    claimed = {r["provenance"]["gpu_assignment"].split("]")[0] for r in found}
    assert claimed == {"claimed [0", "claimed [1"}, [r["provenance"] for r in found]
    # Each with its GPU's share of the cores (Snakemake prints a job's threads above 1 only).
    share = max(node_cpus // 2, 1)
    threads = [line.strip() for line in done.stdout.splitlines() if "threads:" in line]
    assert threads == ([f"threads: {share}"] * 2 if share > 1 else []), done.stdout[-6000:]
