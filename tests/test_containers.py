"""Container images and runtimes: the recipes, the commands, the workflow's plan, and (with
PTSPEED_CONTAINER_BUILD=1, as CI sets it after .ci/podman.sh) a real podman build of the
torch 2.0.1 image and one cell run in it through the workflow.

The linters (hadolint, shellcheck, nix-instantiate) are skipped only where the tool is missing
and CI is not set; under CI=true a missing tool fails.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest
from helpers import (
    BIN,
    CI_BASE_IMAGE,
    PLAN_TIMEOUT_S,
    ROOT,
    host_ca_bundle,
    settings_of,
    write_config,
)
from helpers import snakemake as run_snakemake

from ptspeed.cell import provenance
from ptspeed.envs.container_config import check_container_config
from ptspeed.envs.containers import BuildSpec, ImageManifest, locked_versions, stage_context
from ptspeed.envs.engine_calls import build_command, image_digest, run_command
from ptspeed.envs.image_references import build_tag, digest_of
from ptspeed.errors import ConfigError
from ptspeed.plan.schema import fill_defaults, load_schema

# The real build: debootstrap base -> apt (Python, g++) -> 2.5 GB of wheels -> a 5 GB layer.
BUILD_TIMEOUT_S = 25 * 60
DIGEST = "sha256:" + "ab" * 32
MANIFEST = ImageManifest(
    env="torch-2.0",
    image="localhost/ptspeed/torch-2.0:test",
    id="sha256:" + "cd" * 32,
    digest=DIGEST,
    engine="podman",
    source="build",
)
# .ci/podman.sh's stand-in for the CUDA base: Debian 12 with CPython 3.10, as the CUDA base's
# Ubuntu 22.04 has (tests/test_apptainer.py builds on it too, so the layers are shared).
CI_IMAGE = "localhost/ptspeed/torch-2.0:ci"
RECORD = "records/torch-2.0/mlp/eager/train/b8/trial0.json"


def linter(name: str) -> str:
    """A linter from the test interpreter's venv or PATH; skip without it unless under CI."""
    beside = BIN / name
    found = str(beside) if beside.exists() else shutil.which(name)
    if found:
        return found
    if os.environ.get("CI") == "true":
        pytest.fail(f"{name} is not installed and CI=true")
    pytest.skip(f"{name} is not installed")


def container_config(directory: Path, **containers: str) -> dict[str, Any]:
    """The torch-2.0 environment as a container built from the CI's stand-in base."""
    return {
        "results": str(directory / "results"),
        "device": "cpu",
        "trials": 1,
        "threads": 1,
        "steps": {"warmup": 1, "measured": 2, "numerics": 1},
        "timeout_s": 600,
        "containers": {"runtime": "podman", "images": "build", **containers},
        "environments": {
            "torch-2.0": {
                "kind": "container",
                "requirements": "envs/torch-2.0.txt",
                "python": "3.10",
                "container": CI_IMAGE,
                "base_image": CI_BASE_IMAGE,
            }
        },
        "models": {"mlp": {"cpu": {"batch_size": 8}, "cuda": {"batch_size": 8}}},
        "variants": {"eager": "eager", "compile": "compile"},
        "comparisons": {
            "compile-alone": {
                "baseline": {"env": "torch-2.0", "variant": "eager"},
                "candidate": {"env": "torch-2.0", "variant": "compile"},
            }
        },
    }


def snakemake(*args: str, timeout: float = PLAN_TIMEOUT_S, path: str | None = None) -> str:
    """Snakemake from the repository root; its exit status, then stdout and stderr together."""
    environment = {**os.environ, "PATH": path or os.environ["PATH"]}
    done = run_snakemake(*args, timeout=timeout, env=environment)
    return f"exit {done.returncode}\n{done.stdout}"


# --- the recipes ----------------------------------------------------------------------------


def recipes() -> list[Path]:
    found = sorted((ROOT / "docker").glob("*Dockerfile*")) + sorted(ROOT.glob("Dockerfile*"))
    assert found, "no Dockerfile under docker/"
    return found


def test_hadolint_is_clean_on_every_recipe() -> None:
    hadolint = linter("hadolint")
    done = subprocess.run(
        [hadolint, *map(str, recipes())], capture_output=True, text=True, check=False
    )
    assert done.returncode == 0, done.stdout + done.stderr


def test_shellcheck_is_clean_on_the_container_scripts() -> None:
    shellcheck = linter("shellcheck")
    scripts = [ROOT / "docker/install.sh", ROOT / ".ci/podman.sh"]
    done = subprocess.run(
        [shellcheck, *map(str, scripts)], capture_output=True, text=True, check=False
    )
    assert done.returncode == 0, done.stdout + done.stderr


def test_nix_instantiate_parses_every_nix_file() -> None:
    nix_instantiate = linter("nix-instantiate")
    files = sorted(p for p in ROOT.rglob("*.nix") if not {".venv", ".snakemake"} & set(p.parts))
    assert ROOT / "flake.nix" in files
    for path in files:
        done = subprocess.run(
            [nix_instantiate, "--parse", str(path)], capture_output=True, text=True, check=False
        )
        assert done.returncode == 0, f"{path}: {done.stderr}"


def test_the_recipe_pins_its_default_base_by_digest() -> None:
    recipe = (ROOT / "docker/Dockerfile").read_text()
    default = next(line for line in recipe.splitlines() if line.startswith("ARG BASE_IMAGE="))
    assert digest_of(default.split("=", 1)[1]), default


# --- commands -------------------------------------------------------------------------------


def test_locked_versions_are_read_from_the_real_locks() -> None:
    assert locked_versions((ROOT / "envs/torch-1.13.txt").read_text()) == {
        "torch": "1.13.1",
        "torchvision": "0.14.1",
        "transformers": "4.46.3",
    }
    assert locked_versions((ROOT / "envs/torch-2.0.txt").read_text())["torch"] == "2.0.1"
    # PyTorch's CUDA 11.8 wheels, pinned by URL: the versions their file names give.
    assert locked_versions((ROOT / "envs/torch-2.0-cu118.txt").read_text()) == {
        "torch": "2.0.1+cu118",
        "torchvision": "0.15.2+cu118",
        "transformers": "4.46.3",
    }
    spec = BuildSpec("torch-2.0-cu118", ROOT / "envs/torch-2.0-cu118.txt", "3.10", "t")
    assert spec.build_arguments()["TORCH_VERSION"] == "2.0.1+cu118"


def install_check(tmp_path: Path, installed: str, wanted: str) -> subprocess.CompletedProcess[str]:
    """docker/install.sh's check of the installed torch (its Python heredoc), run against a
    stand-in torch that reports ``installed``, with TORCH_VERSION ``wanted``."""
    script = (ROOT / "docker/install.sh").read_text()
    check = script.split("<<'PYTHON'\n", 1)[1].split("\nPYTHON\n", 1)[0]
    modules = tmp_path / "modules"
    (modules / "torch").mkdir(parents=True)
    (modules / "torch" / "__init__.py").write_text(
        f"import types\n__version__ = {installed!r}\nversion = types.SimpleNamespace(cuda=None)\n"
        "_C = types.SimpleNamespace()\n"
    )
    for other in ("torchvision", "transformers"):
        (modules / f"{other}.py").write_text("__version__ = '0'\n")
    return subprocess.run(
        [sys.executable, "-", wanted, str(tmp_path / "gpu-code.json")],
        input=check, capture_output=True, text=True, check=False,
        env={**os.environ, "PYTHONPATH": str(modules)},
    )  # fmt: skip


@pytest.mark.parametrize(
    ("installed", "wanted", "accepted"),
    [
        ("2.0.1+cu117", "2.0.1", True),  # a PyPI lock: its wheel's local version is not pinned
        ("2.0.1", "2.0.1", True),
        ("2.0.1+cu118", "2.0.1+cu118", True),  # a lock pinning the wheel by URL
        ("2.0.1+cu117", "2.0.1+cu118", False),
        ("2.0.0+cu118", "2.0.1", False),
        ("2.0.1+cu118", "", False),  # a lock that pins no torch
    ],
)
def test_the_image_build_checks_the_installed_torch_against_the_lock(
    tmp_path: Path, installed: str, wanted: str, accepted: bool
) -> None:
    done = install_check(tmp_path, installed, wanted)
    assert (done.returncode == 0) == accepted, done.stdout + done.stderr
    if not accepted:
        assert f"torch {installed} installed, the lock pins {wanted}" in done.stderr


def test_build_command_passes_the_environment_and_the_ca_bundle_as_a_secret(
    tmp_path: Path,
) -> None:
    bundle = tmp_path / "ca.pem"
    bundle.write_text("not a real certificate\n")
    spec = BuildSpec(
        env="torch-2.0",
        requirements=ROOT / "envs/torch-2.0.txt",
        python="3.10",
        tag=build_tag("docker://ghcr.io/ptspeed/torch-2.0:latest"),
        base_image="example/base@" + DIGEST,
        ca_bundle=bundle,
    )
    command = build_command("podman", spec, tmp_path, ROOT / "docker/Dockerfile")
    assert command[:2] == ["podman", "build"]
    assert command[command.index("-t") + 1] == "ghcr.io/ptspeed/torch-2.0:latest"
    arguments = {command[i + 1] for i, word in enumerate(command) if word == "--build-arg"}
    assert {"ENV_NAME=torch-2.0", "PYTHON_VERSION=3.10", "TORCH_VERSION=2.0.1"} <= arguments
    assert f"BASE_IMAGE=example/base@{DIGEST}" in arguments
    assert command[command.index("--secret") + 1] == f"id=ca_bundle,src={bundle}"
    assert command[-1] == str(tmp_path)
    no_bundle = build_command(
        "docker", BuildSpec("torch-2.0", spec.requirements, "3.10", "t"), ROOT, ROOT
    )
    assert "--secret" not in no_bundle and "--format" not in no_bundle


def test_the_staged_context_holds_only_what_the_recipe_copies(tmp_path: Path) -> None:
    spec = BuildSpec("torch-2.0", ROOT / "envs/torch-2.0.txt", "3.10", "t")
    context = stage_context(spec, ROOT, tmp_path / "context")
    staged = sorted(str(p.relative_to(context)) for p in context.rglob("*") if p.is_file())
    assert staged == ["docker/install.sh", "docker/uv.txt", "envs/torch-2.0.txt"]


# A mount outside the project wherever the checkout lies (a clone under /tmp included).
DATA_MOUNT = Path("/srv/ptspeed-test-data")


@pytest.mark.parametrize(
    ("engine", "gpu_flag"),
    [("docker", ["--gpus", "all"]), ("podman", ["--device", "nvidia.com/gpu=all"])],
)
def test_run_command_gives_gpus_only_on_gpu_runs(engine: str, gpu_flag: list[str]) -> None:
    def run(gpus: bool) -> list[str]:
        return run_command(
            engine,
            MANIFEST,
            ["python", "-m", "ptspeed", "cell"],
            gpus=gpus,
            mounts=[ROOT, ROOT / "src", DATA_MOUNT],
            workdir=ROOT,
            environment={"PYTHONPATH": str(ROOT / "src")},
        )

    def has(command: list[str], flag: list[str]) -> bool:
        return any(command[i : i + 2] == flag for i in range(len(command) - 1))

    with_gpus, without = run(True), run(False)
    assert has(with_gpus, gpu_flag) and not has(without, gpu_flag)
    assert "--gpus" not in without and "nvidia.com/gpu=all" not in " ".join(without)
    assert without[:3] == [engine, "run", "--rm"]
    assert has(without, ["--network", "none"])
    # The image by id, then the command; the name and digest go in for the record.
    assert without[-5:] == [MANIFEST.id, "python", "-m", "ptspeed", "cell"]
    assert f"PTSPEED_CONTAINER_IMAGE={MANIFEST.image}" in without
    assert f"PTSPEED_CONTAINER_DIGEST={DIGEST}" in without
    # src/ is inside the project: one mount for both.
    volumes = [without[i + 1] for i, word in enumerate(without) if word == "--volume"]
    assert sorted(volumes) == sorted([f"{DATA_MOUNT}:{DATA_MOUNT}", f"{ROOT}:{ROOT}"])


@pytest.mark.parametrize(
    ("engine", "euid", "owner"),
    [
        ("podman", 1000, ["--userns", "keep-id"]),  # rootless podman maps the caller in
        ("podman", 0, ["--user", "0:0"]),
        ("docker", 1000, ["--user", "1000:1000"]),
        ("docker", 0, ["--user", "0:0"]),
    ],
)
def test_the_cell_runs_as_the_caller(
    monkeypatch: pytest.MonkeyPatch, engine: str, euid: int, owner: list[str]
) -> None:
    """Both branches of the user mapping, whatever user runs the tests (CI runs as root, so
    the integration test below sees only the root branch)."""
    for name in ("geteuid", "getuid", "getgid"):
        monkeypatch.setattr(os, name, lambda uid=euid: uid)
    command = run_command(
        engine, MANIFEST, ["true"], gpus=False, mounts=[ROOT], workdir=ROOT, environment={}
    )
    at = [i for i in range(len(command) - 1) if command[i : i + 2] == owner]
    assert at, command
    assert ("--userns" in command) == (owner[0] == "--userns")
    assert ("--user" in command) == (owner[0] == "--user")


def test_container_run_script_prints_the_command(tmp_path: Path) -> None:
    manifest = tmp_path / "torch-2.0.json"
    MANIFEST.write(manifest)
    assert ImageManifest.read(manifest) == MANIFEST
    done = subprocess.run(
        [sys.executable, str(ROOT / "workflow/scripts/container_run.py"), "--engine", "docker",
         "--manifest", str(manifest), "--workdir", str(tmp_path), "--dry-run",
         "--", "python", "-m", "ptspeed", "cell", "--env", "torch-2.0"],
        capture_output=True, text=True, check=False,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    assert done.stdout.startswith("docker run --rm")
    assert "--gpus" not in done.stdout
    assert f"PYTHONPATH={ROOT / 'src'}" in done.stdout
    assert done.stdout.rstrip().endswith(f"{MANIFEST.id} python -m ptspeed cell --env torch-2.0")


def test_image_digest_prefers_the_pinned_then_the_registry_then_the_id() -> None:
    details: dict[str, object] = {"Id": "cd" * 32, "RepoDigests": [], "Digest": ""}
    assert image_digest(details, "x") == "sha256:" + "cd" * 32
    details["Digest"] = "sha256:" + "ef" * 32
    assert image_digest(details, "x") == "sha256:" + "ef" * 32
    details["RepoDigests"] = [f"x@{DIGEST}"]
    assert image_digest(details, "x") == DIGEST
    assert image_digest(details, "y@sha256:" + "01" * 32) == "sha256:" + "01" * 32


def test_provenance_takes_the_digest_from_the_runtime_or_the_pinned_name(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    for variable in ("PTSPEED_CONTAINER_IMAGE", "PTSPEED_CONTAINER_DIGEST"):
        monkeypatch.delenv(variable, raising=False)
    monkeypatch.delenv("APPTAINER_CONTAINER", raising=False)
    monkeypatch.delenv("SINGULARITY_CONTAINER", raising=False)
    assert provenance.collect_base().container_digest == ""
    monkeypatch.setenv("PTSPEED_CONTAINER_IMAGE", f"ghcr.io/ptspeed/torch-2.0@{DIGEST}")
    assert provenance.collect_base().container_digest == DIGEST
    monkeypatch.setenv("PTSPEED_CONTAINER_DIGEST", "sha256:" + "99" * 32)
    assert provenance.collect_base().container_digest == "sha256:" + "99" * 32


# --- config ---------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("change", "message"),
    [
        (
            lambda c: c["environments"]["torch-2.0"].update(container="results/images/x.sif"),
            "environments.torch-2.0.container: 'results/images/x.sif' is not an image reference",
        ),
        (
            lambda c: c["environments"]["torch-2.0"].pop("python"),
            "environments.torch-2.0: containers.images build needs requirements and python",
        ),
        (
            lambda c: c["containers"].update(ca_bundle="/nonexistent/ca.pem"),
            "containers.ca_bundle: '/nonexistent/ca.pem' is not a file",
        ),
    ],
)
def test_container_config_errors_name_the_key(tmp_path: Path, change: Any, message: str) -> None:
    config = container_config(tmp_path)
    change(config)
    fill_defaults(config, load_schema())
    with pytest.raises(ConfigError) as error:
        check_container_config(settings_of(config))
    assert str(error.value).startswith(message)
    assert "\n" not in str(error.value)


@pytest.mark.workflow
def test_a_bad_runtime_stops_the_workflow_with_one_line(tmp_path: Path) -> None:
    config = container_config(tmp_path, runtime="lxc")
    output = snakemake("-n", f"--configfile={write_config(tmp_path, config)}")
    assert output.startswith("exit 1"), output
    (line,) = [line for line in output.splitlines() if line.startswith("config:")]
    assert line.startswith("config: containers.runtime: 'lxc' is not one of"), line
    assert "Traceback" not in output


# --- the workflow's plan --------------------------------------------------------------------


@pytest.mark.workflow
@pytest.mark.parametrize(("device", "engine"), [("cpu", "podman"), ("cuda", "docker")])
def test_cells_of_a_container_environment_run_in_the_built_image(
    tmp_path: Path, device: str, engine: str
) -> None:
    config = {**container_config(tmp_path, runtime=engine), "device": device}
    results = tmp_path / "results"
    # A CUDA run on one machine says how many GPUs it may use (profiles/default says 0).
    output = snakemake(
        "-n", "-p", "--resources", "gpu=1", f"--configfile={write_config(tmp_path, config)}",
        str(results / RECORD),
    )  # fmt: skip
    assert output.startswith("exit 0"), output[-4000:]
    assert f"output: {results}/images/torch-2.0.json" in output
    assert f"workflow/scripts/image.py build --env torch-2.0 --engine {engine}" in output
    assert f"--base-image {CI_BASE_IMAGE}" in output
    (cell,) = [line for line in output.splitlines() if "-m ptspeed cell" in line]
    assert f"container_run.py --engine {engine} --manifest {results}/images/torch-2.0.json" in cell
    assert ("--gpus" in cell) == (device == "cuda"), cell
    assert "-- python -m ptspeed cell --model mlp" in cell and " --env torch-2.0 " in cell


# A podman stand-in whose storage holds no image (or, with PRESENT=1, every image).
PODMAN_STANDIN = """#!/bin/sh
if [ "$1 $2" = "image inspect" ] && [ "$PRESENT" != 1 ]; then
    echo "Error: $5: image not known" >&2
    exit 125
fi
exit 0
"""


@pytest.mark.workflow
@pytest.mark.parametrize("present", [True, False])
def test_a_manifest_naming_a_pruned_image_builds_it_again(
    tmp_path: Path, present: bool, monkeypatch: pytest.MonkeyPatch
) -> None:
    if present:
        monkeypatch.setenv("PRESENT", "1")
    results = tmp_path / "results"
    standin = tmp_path / "bin" / "podman"
    standin.parent.mkdir()
    standin.write_text(PODMAN_STANDIN)
    standin.chmod(0o755)
    manifest = results / "images" / "torch-2.0.json"
    MANIFEST.write(manifest)  # as rule image wrote it, newer than every input
    config = write_config(tmp_path, container_config(tmp_path, runtime="podman"))
    output = snakemake(
        "-n", f"--configfile={config}", str(results / RECORD),
        path=f"{standin.parent}:{os.environ['PATH']}",
    )  # fmt: skip
    assert output.startswith("exit 0"), output[-4000:]
    if present:
        assert manifest.exists() and f"output: {manifest}" not in output
        return
    assert (
        f"ptspeed: {manifest} names image {MANIFEST.id} ({MANIFEST.image}), which podman" in output
    )
    assert not manifest.exists() and f"output: {manifest}" in output  # rule image runs again


@pytest.mark.workflow
def test_apptainer_makes_the_sif_of_a_pinned_registry_image(tmp_path: Path) -> None:
    """containers.images pull under --sdm apptainer: rule sif builds the image from the
    registry by its digest, no engine is involved, and the cells run in that sif."""
    config = container_config(tmp_path, runtime="apptainer", images="pull")
    config["environments"]["torch-2.0"]["container"] = (
        f"docker://ghcr.io/ptspeed/torch-2.0@{DIGEST}"
    )
    results = tmp_path / "results"
    emulator = ROOT / "tests/fixtures/apptainer-emulator"
    output = snakemake(
        "-n", "-p", "--sdm", "apptainer", f"--configfile={write_config(tmp_path, config)}",
        str(results / RECORD), path=f"{emulator}:{os.environ['PATH']}",
    )  # fmt: skip
    assert output.startswith("exit 0"), output[-4000:]
    assert "ptspeed: images: apptainer build from the registry, by digest" in output
    (sif,) = [line for line in output.splitlines() if "workflow/scripts/image.py sif" in line]
    assert f"--source registry --uri docker://ghcr.io/ptspeed/torch-2.0@{DIGEST}" in sif
    (cell,) = [line for line in output.splitlines() if "-m ptspeed cell" in line]
    digest_file = results / "images/torch-2.0.sif.digest"
    assert f'PTSPEED_CONTAINER_DIGEST="$(cat {digest_file})" python -m ptspeed cell' in cell
    assert "container_run.py" not in output and "rule image" not in output


# --- the real thing: podman builds the image, one cell runs in it -----------------------------


@pytest.mark.container
@pytest.mark.slow
@pytest.mark.skipif(
    os.environ.get("PTSPEED_CONTAINER_BUILD") != "1",
    reason="builds a 5 GB image with podman (minutes): set PTSPEED_CONTAINER_BUILD=1 after "
    ".ci/podman.sh",
)
@pytest.mark.timeout(BUILD_TIMEOUT_S + 300)
def test_podman_builds_the_torch_2_0_image_and_runs_a_cell_in_it(tmp_path: Path) -> None:
    assert shutil.which("podman"), "podman is missing: run .ci/podman.sh"
    exists = subprocess.run(["podman", "image", "exists", CI_BASE_IMAGE], check=False)
    assert exists.returncode == 0, f"{CI_BASE_IMAGE} is missing: run .ci/podman.sh"
    config = container_config(tmp_path, ca_bundle=host_ca_bundle())
    results = tmp_path / "results"

    started = time.monotonic()
    output = snakemake(
        f"--configfile={write_config(tmp_path, config)}", str(results / RECORD),
        timeout=BUILD_TIMEOUT_S,
    )  # fmt: skip
    elapsed_s = time.monotonic() - started
    build_s = _benchmark_seconds(results / "benchmarks/images/torch-2.0.tsv")
    print(f"podman build + cell: {elapsed_s:.0f} s (image rule {build_s:.0f} s)")
    assert output.startswith("exit 0"), output[-4000:] + _log(results / "logs/images/torch-2.0.log")

    manifest = json.loads((results / "images/torch-2.0.json").read_text())
    assert manifest["image"] == CI_IMAGE and manifest["engine"] == "podman"
    assert manifest["digest"].startswith("sha256:") and manifest["id"].startswith("sha256:")
    assert manifest["labels"]["io.ptspeed.torch"] == "2.0.1"
    assert manifest["labels"]["org.opencontainers.image.base.name"] == CI_BASE_IMAGE

    record_path = results / RECORD
    record = json.loads(record_path.read_text())
    assert record["status"] == "ok", record["reason"] + record["detail"]
    assert record["provenance"]["container_image"] == CI_IMAGE
    assert record["provenance"]["container_digest"] == manifest["digest"]
    assert record["provenance"]["torch"].startswith("2.0.1")
    assert record["provenance"]["python"].startswith("3.10")
    assert record["provenance"]["git_commit"], "the host's commit goes into the container"
    # The cell ran as the caller, so the caller owns what it wrote. As root this holds
    # whatever the mapping does; test_the_cell_runs_as_the_caller checks both branches.
    assert record_path.stat().st_uid == os.getuid()


def _benchmark_seconds(path: Path) -> float:
    try:
        return float(path.read_text().splitlines()[1].split("\t")[0])
    except (OSError, IndexError, ValueError):
        return float("nan")


def _log(path: Path) -> str:
    try:
        return "\n--- image log ---\n" + path.read_text()[-4000:]
    except OSError:
        return ""
