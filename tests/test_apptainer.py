"""The Apptainer path: `snakemake --cores all --use-singularity` builds each environment's
image, makes its Apptainer image and runs every cell of the environment in it.

No Apptainer can be installed here, so `apptainer` is an emulator that carries out what
Snakemake and rule sif ask of it with podman (tests/fixtures/apptainer-emulator/apptainer,
whose docstring lists where it differs from Apptainer). The plan, the choice of builder and
the checks run everywhere; with PTSPEED_APPTAINER_RUN=1 (CI, after .ci/podman.sh) the default
matrix reduced to mlp on the CPU runs from nothing to the report, and each record is checked
to come from inside its image.
"""

from __future__ import annotations

import dataclasses
import json
import os
import re
import shlex
import shutil
import socket
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml
from helpers import (
    CI_BASE_IMAGE,
    ROOT,
    USER_MODEL_MODULE,
    first_round_and_reruns,
    host_ca_bundle,
    settings_of,
    small_disk,
    snakemake,
    write_config,
)

from ptspeed.envs.apptainer import (
    DEFINITION as DEFINITION_FILE,
)
from ptspeed.envs.apptainer import (
    NO_BUILDER,
    SifPlan,
    check_driver,
    image_key,
    plan_sif,
    sif_commands,
    sif_digest,
)
from ptspeed.envs.apptainer_cells import CELL_PYTHON, cell_apptainer_args, outside
from ptspeed.envs.build_space import build_places, check_build_space, check_room_for_sif
from ptspeed.envs.container_config import check_container_config
from ptspeed.envs.containers import (
    BuildSpec,
    ImageManifest,
    package_index_settings,
    write_index_secret,
)
from ptspeed.envs.engine_calls import (
    build_command,
    engine_usable,
    failure_cause,
    inspect_image,
    push_image,
)
from ptspeed.envs.image_references import digest_of, without_tag
from ptspeed.errors import ConfigError, ContainerError
from ptspeed.plan.settings import Containers

EMULATOR_DIR = ROOT / "tests" / "fixtures" / "apptainer-emulator"
EMULATOR = EMULATOR_DIR / "apptainer"
# The same emulator called as SingularityCE's `singularity` (a link).
SINGULARITY_DIR = ROOT / "tests" / "fixtures" / "singularity-emulator"
DEFAULT_CONFIG = yaml.safe_load((ROOT / "config" / "config.yaml").read_text())
ENVIRONMENTS = {"torch-1.13": "1.13.1", "torch-2.0": "2.0.1"}
RUN_TIMEOUT_S = 45 * 60
# The time limit of each test of the real run: whichever comes first runs apptainer_run.
WHOLE_RUN = pytest.mark.timeout(RUN_TIMEOUT_S + 300)
DIGEST = "sha256:" + "ab" * 32


def with_emulator(path: str | None = None) -> dict[str, str]:
    """This environment with the emulator first on PATH (or on ``path`` alone)."""
    search = f"{EMULATOR_DIR}{os.pathsep}{path if path is not None else os.environ['PATH']}"
    return {**os.environ, "PATH": search}


def jobs(output: str, rule: str) -> list[dict[str, str]]:
    """The jobs of ``rule`` in a dry run's output, each as its `key: value` lines."""
    found = []
    for block in re.split(r"\n(?=\[|rule )", output):
        if block.startswith(f"rule {rule}:"):
            lines = (line.strip().partition(": ") for line in block.splitlines()[1:])
            found.append({key: value for key, _, value in lines if value})
    return found


# --- the emulator ---------------------------------------------------------------------------


def test_emulator_reports_a_version_snakemake_accepts() -> None:
    done = subprocess.run([str(EMULATOR), "--version"], capture_output=True, text=True)
    assert re.fullmatch(r"apptainer version 1\.\d+\.\d+\S*\n", done.stdout), done.stdout


def test_emulator_refuses_what_it_does_not_implement(tmp_path: Path) -> None:
    done = subprocess.run(
        [str(EMULATOR), "exec", "--writable", "x.sif", "true"], capture_output=True, text=True
    )
    assert done.returncode == 255
    assert done.stderr.strip() == "FATAL:   the emulator does not implement option --writable"
    done = subprocess.run(
        [str(EMULATOR), "exec", str(tmp_path / "missing.sif"), "true"],
        capture_output=True,
        text=True,
    )
    assert "could not open image" in done.stderr


# --- the plan -------------------------------------------------------------------------------


@pytest.mark.workflow
def test_default_run_plans_image_then_sif_then_cells_for_every_environment() -> None:
    done = snakemake("-n", "--use-singularity", cores="all", env=with_emulator())
    assert done.returncode == 0, done.stdout[-4000:]
    assert "docker://" not in done.stdout and "ghcr.io" not in done.stdout
    (choice,) = [line for line in done.stdout.splitlines() if line.startswith("ptspeed: images:")]
    environments = {
        comparison[side]["env"]
        for comparison in DEFAULT_CONFIG["comparisons"].values()
        for side in ("baseline", "candidate")
    }
    sifs = {job["output"].split(",")[0] for job in jobs(done.stdout, "sif")}
    assert sifs == {f"results/images/{env}.sif" for env in environments}
    if "build of docker/Dockerfile" in choice:
        images = {job["output"] for job in jobs(done.stdout, "image")}
        assert images == {f"results/images/{env}.json" for env in environments}
    cells = jobs(done.stdout, "cell")
    assert cells
    for cell in cells:
        env = cell["wildcards"].split("env=")[1].split(",")[0]
        assert f"results/images/{env}.sif" in cell["input"].split(", ")


def bare_path(directory: Path) -> str:
    """A PATH of the basic tools Snakemake and its plugins call, without any container tool."""
    directory.mkdir()
    for tool in ("which", "sh", "bash", "git", "uname"):
        found = shutil.which(tool)
        if found:
            (directory / tool).symlink_to(found)
    # The emulator's interpreter (a real one: a pyenv shim needs more than this PATH).
    (directory / "python3").symlink_to(os.path.realpath(sys.executable))
    return str(directory)


@pytest.mark.workflow
def test_without_any_builder_the_run_stops_with_one_line(tmp_path: Path) -> None:
    """Nothing on PATH but the emulator: it would build from the definition file; without it
    too, the line names what is missing and both ways out."""
    path = bare_path(tmp_path / "bin")
    done = snakemake("-n", "--use-singularity", env=with_emulator(path))
    assert done.returncode == 0, done.stdout[-3000:]
    assert "ptspeed: images: apptainer build --fakeroot of docker/ptspeed.def" in done.stdout
    for job in jobs(done.stdout, "sif"):
        assert "docker/ptspeed.def" in job["input"]
    assert not jobs(done.stdout, "image")
    done = snakemake("-n", "--use-singularity", env={**os.environ, "PATH": path})
    assert done.returncode == 1
    assert NO_BUILDER in done.stdout.splitlines(), done.stdout[-3000:]
    assert "Traceback" not in done.stdout


@pytest.mark.workflow
def test_singularity_builds_and_runs_the_images_where_apptainer_is_absent(tmp_path: Path) -> None:
    """SingularityCE's `singularity` alone, as Snakemake takes it: rule sif builds with it; a
    SingularityCE older than 4.0 (no --build-arg) is refused in one line before any job."""
    path = f"{SINGULARITY_DIR}{os.pathsep}{bare_path(tmp_path / 'bin')}"
    done = snakemake("-n", "--use-singularity", env={**os.environ, "PATH": path})
    assert done.returncode == 0, done.stdout[-3000:]
    assert "ptspeed: images: singularity build --fakeroot of docker/ptspeed.def" in done.stdout
    old = {**os.environ, "PATH": path, "PTSPEED_SINGULARITY_CE_VERSION": "3.11.5"}
    done = snakemake("-n", "--use-singularity", env=old)
    assert done.returncode == 1
    assert (
        "containers: singularity here is SingularityCE 3.11.5, whose build lacks --build-arg"
    ) in done.stdout, done.stdout[-3000:]
    assert "Traceback" not in done.stdout


def containers_of(**given: Any) -> Containers:
    """The containers settings of ``given``, the schema's defaults filling the rest."""
    return settings_of({"containers": given}).containers


def test_the_sif_is_made_by_the_command_found(tmp_path: Path) -> None:
    found = {"singularity": "/usr/bin/singularity"}.get
    settings = containers_of(images="build", builder="auto")
    plan = plan_sif(settings, lambda _: False, found, lambda _: "singularity-ce version 4.1.5")
    assert plan == SifPlan("definition", command="singularity")
    spec = BuildSpec("torch-2.0", ROOT / "envs/torch-2.0.txt", "3.10", "t")
    (command,) = sif_commands(plan, tmp_path / "x.sif", spec, ROOT)
    assert command[:3] == ["singularity", "build", "--force"]
    pulled = plan_sif(containers_of(images="pull", builder="auto"), bool, found)
    (pull,) = sif_commands(pulled, tmp_path / "x.sif", None, ROOT, reference=f"docker://r@{DIGEST}")
    assert pull[0] == "singularity"
    with pytest.raises(ConfigError, match=r"^containers: singularity here is 'no --version'"):
        plan_sif(settings, lambda _: False, found, lambda _: "")


@pytest.mark.parametrize(
    ("available", "source", "engine"),
    [
        ({"docker", "podman", "apptainer"}, "image", "docker"),
        ({"podman", "apptainer"}, "image", "podman"),
        ({"apptainer"}, "definition", None),
    ],
)
def test_builder_preference(available: set[str], source: str, engine: str | None) -> None:
    settings = containers_of(images="build", builder="auto")
    plan = plan_sif(settings, available.__contains__, lambda n: n if n in available else None)
    assert (plan.source, plan.engine) == (source, engine)
    with pytest.raises(ConfigError, match=r"^containers: nothing here builds"):
        plan_sif(settings, lambda _: False, lambda _: None)
    assert plan_sif(containers_of(images="pull", builder="auto"), bool).source == "registry"


def test_podman_that_cannot_run_is_not_chosen(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Rootless podman without subuids, as on many login nodes: on PATH, `podman info` fails;
    the images are then built by Apptainer from the definition."""
    fake = tmp_path / "podman"
    fake.write_text('#!/bin/sh\necho "Error: cannot find UID/GID for user u: no subuid ranges '
                    'found for user \\"u\\" in /etc/subuid" >&2\nexit 125\n')  # fmt: skip
    fake.chmod(0o755)
    monkeypatch.setenv("PATH", f"{tmp_path}{os.pathsep}{os.environ['PATH']}")
    assert not engine_usable("podman")
    apptainer = {"apptainer": "/usr/bin/apptainer"}.get
    settings = containers_of(images="build", builder="auto")
    assert plan_sif(settings, engine_usable, apptainer).source == "definition"
    with pytest.raises(ConfigError, match=r"^containers.builder: podman is not on PATH or cannot"):
        plan_sif(dataclasses.replace(settings, builder="podman"), engine_usable, apptainer)


ROOTLESS_MAPS = {
    # Rootless podman without a subuid range: the user alone, as `podman info` says it.
    "single": '[{"container_id":0,"host_id":1000,"size":1}]',
    # With one (/etc/subuid: u:100000:65536).
    "subuids": '[{"container_id":0,"host_id":1000,"size":1},'
    '{"container_id":1,"host_id":100000,"size":65536}]',
}


@pytest.mark.parametrize(("maps", "usable"), [("single", False), ("subuids", True)])
def test_podman_whose_user_namespace_maps_one_id_is_not_chosen(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, maps: str, usable: bool
) -> None:
    """`podman info` succeeds without subuids, yet such a podman cannot unpack a CUDA base
    (files of other users): it is not chosen, and Apptainer builds from the definition."""
    fake = tmp_path / "podman"
    answer = f'{{"gidmap":{ROOTLESS_MAPS[maps]},"uidmap":{ROOTLESS_MAPS[maps]}}}'
    fake.write_text(f"#!/bin/sh\n[ \"$1\" = info ] || exit 125\necho '{answer}'\n")
    fake.chmod(0o755)
    monkeypatch.setenv("PATH", f"{tmp_path}{os.pathsep}{os.environ['PATH']}")
    assert engine_usable("podman") is usable
    settings = containers_of(images="build", builder="auto")
    plan = plan_sif(settings, engine_usable, {"apptainer": "/usr/bin/apptainer"}.get)
    assert plan.source == ("image" if usable else "definition")
    if not usable:
        with pytest.raises(ConfigError, match=r"its user namespace maps one user ID"):
            plan_sif(dataclasses.replace(settings, builder="podman"), engine_usable)


@pytest.mark.workflow
def test_a_cluster_job_takes_the_login_nodes_plan_and_probes_nothing(tmp_path: Path) -> None:
    """The main process asks podman once and hands its plan to the jobs it submits (sbatch
    exports its environment); a job (Snakemake's remote mode) on a node without podman plans
    the sif as the login node did, so the sif is not made again there, and asks nothing."""
    bin_dir = tmp_path / "bin"
    path = bare_path(bin_dir)
    calls = tmp_path / "podman-calls"
    (bin_dir / "podman").write_text(
        f'#!/bin/sh\necho "$*" >> {calls}\necho \'{{"uidmap":{ROOTLESS_MAPS["subuids"]}}}\'\n'
    )
    (bin_dir / "podman").chmod(0o755)
    done = snakemake("-n", "--use-singularity", env=with_emulator(path))
    assert done.returncode == 0, done.stdout[-3000:]
    assert calls.read_text().splitlines() == ["info --format {{json .Host.IDMappings}}"]
    (plan_line,) = [line for line in done.stdout.splitlines() if "ptspeed: images:" in line]
    assert "podman build" in plan_line
    calls.unlink()
    (bin_dir / "podman").unlink()  # the GPU node has no podman
    plan = SifPlan("image", "podman").to_text()
    # A cluster job plans the device its login node decided (device: auto is refused there).
    job = snakemake("-n", "--use-singularity", "--mode", "remote", "--config", "device=cpu",
                    env={**with_emulator(path), "PTSPEED_SIF_PLAN": plan})  # fmt: skip
    assert job.returncode == 0, job.stdout[-3000:]
    assert not calls.exists()
    assert jobs(job.stdout, "image"), "the sif is still made of podman's image, as planned"


def test_sif_commands_for_each_source(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    spec = BuildSpec(
        "torch-2.0", ROOT / "envs/torch-2.0.txt", "3.10", "t", uv_cache=tmp_path / "uv"
    )
    manifest = ImageManifest("torch-2.0", "localhost/ptspeed/torch-2.0:latest", DIGEST, DIGEST,
                             "podman", "build")  # fmt: skip
    sif = tmp_path / "torch-2.0.sif"
    (daemon,) = sif_commands(SifPlan("image", "docker"), sif, spec, ROOT, manifest)
    assert daemon[-1] == f"docker-daemon:{manifest.image}"
    save, convert = sif_commands(SifPlan("image", "podman"), sif, spec, ROOT, manifest)
    assert save[:2] == ["podman", "save"] and convert[-1].startswith("docker-archive:")
    monkeypatch.setattr(os, "geteuid", lambda: 1000)
    (bootstrap,) = sif_commands(SifPlan("definition"), sif, spec, ROOT)
    assert bootstrap[:4] == ["apptainer", "build", "--force", "--fakeroot"]
    assert f"{tmp_path / 'uv'}:/var/cache/uv" in bootstrap
    assert bootstrap[-1] == str(ROOT / "docker/ptspeed.def")
    (pull,) = sif_commands(SifPlan("registry"), sif, None, ROOT, reference=f"docker://r/x@{DIGEST}")
    assert pull[-1] == f"docker://r/x@{DIGEST}"


def test_a_conversion_needs_room_for_the_archive_and_the_sif(tmp_path: Path) -> None:
    """Twice the image's size, with margins that other tests writing to the disk meanwhile
    (the Apptainer run writes GBs beside it) do not cross."""
    free = shutil.disk_usage(tmp_path).free
    check_room_for_sif("torch-2.0", tmp_path, free // 4)
    with pytest.raises(ContainerError, match=r"^images: making torch-2\.0\.sif needs about "):
        check_room_for_sif("torch-2.0", tmp_path, free // 2 + 10**9)


def test_a_build_needs_room_where_apptainer_unpacks_and_caches(tmp_path: Path) -> None:
    """APPTAINER_TMPDIR (else TMPDIR, else /tmp: often a small tmpfs) and the layer cache
    (APPTAINER_CACHEDIR/cache, else ~/.apptainer/cache: a home quota) are checked before a
    build, and the one line names both variables."""
    cache = tmp_path / "cache"
    assert [p.path for p in build_places({"APPTAINER_CACHEDIR": str(cache)})] == [
        Path("/tmp"), cache / "cache"]  # fmt: skip
    assert build_places({"TMPDIR": "/scratch"})[1].path == Path.home() / ".apptainer/cache"
    with small_disk(tmp_path / "tmpfs", size_kib=1024) as small:
        environ = {"APPTAINER_TMPDIR": str(small), "APPTAINER_CACHEDIR": str(cache)}
        check_build_space("torch-2.0", 10**5, environ)
        with pytest.raises(ContainerError) as error:
            check_build_space("torch-2.0", 10**7, environ)
    message = str(error.value)
    assert message.startswith("images: building torch-2.0.sif needs about 0.0 GB in each of ")
    assert f"APPTAINER_TMPDIR ({small}, where it unpacks the image): 0.0 GB free" in message
    assert "APPTAINER_CACHEDIR (" not in message  # the cache's disk has room
    assert message.endswith("set APPTAINER_TMPDIR and APPTAINER_CACHEDIR to directories on a "
                            "disk with room")  # fmt: skip
    free = shutil.disk_usage(tmp_path).free
    same_disk = {"APPTAINER_TMPDIR": str(tmp_path), "APPTAINER_CACHEDIR": str(cache)}
    check_build_space("torch-2.0", free // 4, same_disk)
    with pytest.raises(ContainerError, match=r"APPTAINER_TMPDIR .*; APPTAINER_CACHEDIR "):
        check_build_space("torch-2.0", free // 2 + 10**9, same_disk)  # both on one disk


QUOTA = ROOT / "tests" / "fixtures" / "quota" / "quota"


def test_the_build_space_check_reads_the_singularity_names_too(tmp_path: Path) -> None:
    """Site modules still set SINGULARITY_*: Apptainer honours them after its own names,
    SingularityCE reads them alone (and keeps its cache in ~/.singularity)."""
    legacy = {"SINGULARITY_TMPDIR": "/scratch/tmp", "SINGULARITY_CACHEDIR": "/scratch/cache"}
    places = build_places(legacy)
    assert [(p.variable, p.path) for p in places] == [
        ("SINGULARITY_TMPDIR", Path("/scratch/tmp")),
        ("SINGULARITY_CACHEDIR", Path("/scratch/cache/cache")),
    ]
    both = {**legacy, "APPTAINER_TMPDIR": "/fast"}
    assert build_places(both)[0].path == Path("/fast")
    assert build_places(both, "singularity")[0].path == Path("/scratch/tmp")
    configured = build_places({"SINGULARITY_CONFIGDIR": "/scratch/conf"})
    assert configured[1].path == Path("/scratch/conf/cache")
    assert build_places({"APPTAINER_CACHEDIR": "/a"}, "singularity")[1].path == (
        Path.home() / ".singularity/cache"
    )


def test_the_build_space_check_counts_the_users_quota(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A home quota smaller than the disk's free space stops the build in the same one line,
    naming the quota; where no `quota` answers, the check says it counts the disk only."""
    environ = {"APPTAINER_TMPDIR": str(tmp_path), "APPTAINER_CACHEDIR": str(tmp_path / "c")}
    monkeypatch.setenv("PTSPEED_QUOTA_KIB", f"{2 * 10**6}:{4 * 10**6}:{5 * 10**6}")
    assert check_build_space("torch-2.0", 10**9, environ, quota=str(QUOTA)) == []
    with pytest.raises(ContainerError) as error:
        check_build_space("torch-2.0", 2 * 10**9, environ, quota=str(QUOTA))
    assert f"APPTAINER_TMPDIR ({tmp_path}, where it unpacks the image): 3.1 GB left of your " \
        "quota" in str(error.value)  # fmt: skip
    monkeypatch.delenv("PTSPEED_QUOTA_KIB")  # a filesystem without quotas
    assert check_build_space("torch-2.0", 10**9, environ, quota=str(QUOTA)) == []
    monkeypatch.setenv("PATH", str(tmp_path / "empty"))
    (note,) = check_build_space("torch-2.0", 10**9, environ)
    assert note.endswith(": no `quota` command here to read your quota: the check counts the "
                         "disk's free space only")  # fmt: skip


def test_a_cuda_base_newer_than_the_driver_is_refused() -> None:
    base = "nvidia/cuda:12.8.1-cudnn-runtime-ubuntu22.04@" + DIGEST
    check_driver("torch-2.14", base, "570.124.06")
    # Minor-version compatibility: any CUDA 12.x runs on a 12.0 driver.
    check_driver("torch-2.14", base, "535.104.05")
    with pytest.raises(ConfigError) as error:
        check_driver("torch-2.14", base, "520.61.05")
    message = str(error.value)
    assert "CUDA 12.8" in message and "520.61.05" in message and ">= 525.60.13" in message
    assert message.startswith("environments.torch-2.14: ")
    # torch 2.14's wheels bring CUDA 13 on that CUDA 12.8 base: the wheels decide.
    lock = (ROOT / "envs/torch-2.14.txt").read_text()
    with pytest.raises(ConfigError, match=r"nvidia-cuda-runtime==13\.0\.96\) bring CUDA 13\.0"):
        check_driver("torch-2.14", base, "570.124.06", lock)
    check_driver("torch-2.14", base, "580.65.06", lock)
    check_driver("torch-2.0", base, "570.124.06", (ROOT / "envs/torch-2.0.txt").read_text())


def test_cuda_11_images_run_on_drivers_older_than_their_toolkits() -> None:
    """CUDA 11.7 shipped with driver 515, but 11.x runs on >= 450.80.02: a 470 driver is fine."""
    base = "nvidia/cuda:11.7.1-cudnn8-runtime-ubuntu22.04@" + DIGEST
    check_driver("torch-1.13", base, "470.256.02")
    with pytest.raises(ConfigError, match=r">= 450\.80\.02 \(CUDA 11\.x with minor-version"):
        check_driver("torch-1.13", base, "450.51.06")


@pytest.mark.workflow
def test_pull_takes_images_by_digest_only(tmp_path: Path) -> None:
    config = {**DEFAULT_CONFIG, "containers": {"images": "pull", "registry": "r.example/p"}}
    done = snakemake(
        "-n", "--use-singularity", f"--configfile={write_config(tmp_path, config)}",
        env=with_emulator(),
    )  # fmt: skip
    assert done.returncode == 1
    (line,) = [line for line in done.stdout.splitlines() if line.startswith("config:")]
    assert "containers.images pull takes an image pinned by digest" in line
    assert "docker://r.example/p/torch-1.13@sha256:…" in line


@pytest.mark.parametrize(
    ("image", "refused"),
    [
        (f"docker://nvcr.io/nvidia/pytorch:22.11-py3@{DIGEST}", ""),
        (f"oras://ghcr.io/site/pytorch@{DIGEST}", ""),
        ("library://site/default/pytorch:sha256." + "ab" * 32, ""),
        ("oras://ghcr.io/site/pytorch:22.11", "is not pinned"),
        ("library://site/default/pytorch:latest", "is not pinned"),
        (f"shub://site/pytorch@{DIGEST}", "is not pinned"),
        ("missing.sif", "is not a file"),
    ],
)
def test_an_image_a_site_brings_is_pinned_or_a_file(image: str, refused: str) -> None:
    config = {
        "containers": {"runtime": "apptainer", "push": False, "ca_bundle": ""},
        "environments": {"site": {"kind": "image", "image": image}},
    }
    if not refused:
        check_container_config(settings_of(config), in_apptainer=True)
        return
    with pytest.raises(ConfigError, match=rf"^environments\.site\.image: .* {refused}"):
        check_container_config(settings_of(config), in_apptainer=True)


NGC_CONFIG = ROOT / "config" / "ngc-hopper.yaml"


def ngc_config(tmp_path: Path, image: str) -> Path:
    """config/ngc-hopper.yaml as shipped, its NGC image replaced by ``image``."""
    config = yaml.safe_load(NGC_CONFIG.read_text())
    config["environments"]["ngc-22.11"]["image"] = image
    return write_config(tmp_path, {**config, "results": str(tmp_path / "results")})


@pytest.mark.workflow
def test_a_site_image_without_its_digest_is_refused_in_one_line() -> None:
    """config/ngc-hopper.yaml as shipped names NGC's tag: the site fills in the digest."""
    done = snakemake("-n", "--use-singularity", f"--configfile={NGC_CONFIG}", env=with_emulator())
    assert done.returncode == 1
    (line,) = [line for line in done.stdout.splitlines() if line.startswith("config:")]
    assert line.startswith(
        "config: environments.ngc-22.11.image: 'docker://nvcr.io/nvidia/pytorch:22.11-py3' is "
        "not pinned: expected a .sif path, docker://name@sha256:…"
    ), line
    assert "Traceback" not in done.stdout
    done = snakemake("-n", f"--configfile={NGC_CONFIG}", env=with_emulator())
    assert "kind image runs only under --use-singularity" in done.stdout


@pytest.mark.workflow
def test_the_ngc_example_with_its_digest_runs_the_image_as_is(tmp_path: Path) -> None:
    """Filled in, the NGC image is read once (rule brought_image) and each of its cells runs
    in it, by digest alone (Apptainer 1.3 refuses a tag beside it); nothing is built for it."""
    reference = f"docker://nvcr.io/nvidia/pytorch:22.11-py3@{DIGEST}"
    done = snakemake(
        "-n", "--use-singularity", f"--configfile={ngc_config(tmp_path, reference)}",
        env=with_emulator(),
    )  # fmt: skip
    assert done.returncode == 0, done.stdout[-4000:]
    results = tmp_path / "results"
    (probe,) = jobs(done.stdout, "brought_image")
    assert probe["output"].split(", ") == [f"{results}/envs/ngc-22.11.json",
                                           f"{results}/envs/ngc-22.11.digest"]  # fmt: skip
    assert {job["output"].split(",")[0] for job in jobs(done.stdout, "sif")} == {
        f"{results}/images/torch-2.0-cu118.sif"
    }
    assert not [job for job in jobs(done.stdout, "build_env")]
    cells = [job for job in jobs(done.stdout, "cell") if "env=ngc-22.11" in job["wildcards"]]
    assert cells
    for cell in cells:
        assert f"{results}/envs/ngc-22.11.digest" in cell["input"].split(", ")
    assert f"nvcr.io/nvidia/pytorch@{DIGEST} will be pulled" in done.stdout


@pytest.mark.workflow
def test_without_a_brought_image_its_rule_is_not_there(tmp_path: Path) -> None:
    """Rule brought_image exists only beside an environment that brings its image: otherwise
    Snakemake would try it for every venv's record (an empty constraint constrains nothing)."""
    done = snakemake("-n")
    assert done.returncode == 0, done.stdout[-3000:]
    assert "brought_image" not in done.stdout and "Empty file path" not in done.stdout


@pytest.mark.workflow
def test_a_local_sif_a_site_brings_is_the_input_of_its_record(tmp_path: Path) -> None:
    sif = tmp_path / "pytorch.sif"
    sif.write_text("a site's image\n")
    done = snakemake(
        "-n", "--use-singularity", f"--configfile={ngc_config(tmp_path, str(sif))}",
        env=with_emulator(),
    )  # fmt: skip
    assert done.returncode == 0, done.stdout[-4000:]
    (probe,) = jobs(done.stdout, "brought_image")
    assert probe["input"] == str(sif)
    assert "will be pulled" not in done.stdout


# --- the real run ---------------------------------------------------------------------------


APPTAINER_TRIALS = 3  # the report's statistics need no more; each trial is a container start
HOST_COMPILER = {"CXX": "/nonexistent"}


def reduced_matrix(directory: Path) -> dict[str, Any]:
    """The default matrix: mlp and a user's model (a module outside the checkout, found through
    model_paths, which the cells' containers bind) on the CPU, eager and compile, torch-1.13
    and torch-2.0 on the CI's stand-in base (Debian 12 and CPython 3.10: .ci/podman.sh), 3
    trials; the results outside the working directory (the checkout), as on a cluster's
    scratch."""
    user_models = directory / "user-models"
    user_models.mkdir(exist_ok=True)
    (user_models / "mymodels.py").write_text(USER_MODEL_MODULE, encoding="utf-8")
    environments = {
        env: {**DEFAULT_CONFIG["environments"][env], "base_image": CI_BASE_IMAGE}
        for env in ENVIRONMENTS
    }
    return {
        **DEFAULT_CONFIG,
        "results": str(directory / "results"),
        "trials": APPTAINER_TRIALS,
        "device": "cpu",
        "containers": {**DEFAULT_CONFIG["containers"], "ca_bundle": host_ca_bundle()},
        "environments": environments,
        "model_paths": [str(user_models)],
        "models": {
            "mlp": {"cpu": {"batch_size": 16}, "cuda": {"batch_size": 64}},
            "tiny": {
                "source": "mymodels:tiny",
                "cpu": {"batch_size": 4, "seq_len": 8},
                "cuda": {"batch_size": 4, "seq_len": 8},
            },
        },
    }


@pytest.fixture(scope="module")
def apptainer_run(tmp_path_factory: pytest.TempPathFactory) -> Iterator[dict[str, Any]]:
    if os.environ.get("PTSPEED_APPTAINER_RUN") != "1":
        pytest.skip("builds two 5 GB images (minutes): PTSPEED_APPTAINER_RUN=1 after .ci/podman.sh")
    exists = subprocess.run(["podman", "image", "exists", CI_BASE_IMAGE], check=False)
    assert exists.returncode == 0, f"{CI_BASE_IMAGE} is missing: run .ci/podman.sh"
    directory = tmp_path_factory.mktemp("apptainer")
    config = write_config(directory, reduced_matrix(directory))
    started = time.monotonic()
    # A compiler module's CXX on the node: Apptainer passes it in, and inductor would compile
    # with it; the cells' workers start without it and name it.
    done = snakemake(
        "--use-singularity", f"--configfile={config}", cores="all",
        env={**with_emulator(), **HOST_COMPILER}, timeout=RUN_TIMEOUT_S,
    )  # fmt: skip
    elapsed_s = time.monotonic() - started
    print(f"snakemake --cores all --use-singularity, from nothing to the report: {elapsed_s:.0f} s")
    results = directory / "results"
    assert done.returncode == 0, done.stdout[-6000:] + logs(results)
    records = [json.loads(p.read_text()) for p in sorted((results / "records").rglob("*.json"))]
    yield {"config": config, "results": results, "records": records, "output": done.stdout}


def logs(results: Path) -> str:
    tails = [f"\n--- {p} ---\n{p.read_text()[-2500:]}" for p in results.glob("logs/images/*.log")]
    return "".join(tails)


def image_exec(sif: Path, *command: str, home: Path = ROOT) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [str(EMULATOR), "exec", "--home", str(home), str(sif), *command],
        capture_output=True, text=True, check=False, cwd=ROOT, env=with_emulator(),
    )  # fmt: skip


@pytest.mark.apptainer
@pytest.mark.slow
@WHOLE_RUN
def test_the_run_reaches_the_report(apptainer_run: dict[str, Any]) -> None:
    results = apptainer_run["results"]
    assert (results / "report/index.html").is_file()
    first, _ = first_round_and_reruns(results, APPTAINER_TRIALS)
    assert len(first) == 2 * 3 * APPTAINER_TRIALS  # mlp and the user's
    assert apptainer_run["output"].count("ptspeed: images:") == 1


@pytest.mark.apptainer
@pytest.mark.slow
@WHOLE_RUN
def test_every_record_comes_from_inside_its_image(apptainer_run: dict[str, Any]) -> None:
    results = apptainer_run["results"]
    host_os = Path("/etc/os-release").read_text()
    for record in apptainer_run["records"]:
        env = record["cell"]["env"]
        sif = results / "images" / f"{env}.sif"
        provenance = record["provenance"]
        assert record["status"] == "ok", record["reason"] + record["detail"]
        assert provenance["torch"].split("+")[0] == ENVIRONMENTS[env]
        assert provenance["python"].startswith("3.10.")
        assert provenance["git_commit"], "the checkout's commit goes into the container"
        inside = image_exec(sif, "grep", "^PRETTY_NAME=", "/etc/os-release")
        assert inside.stdout.strip() == f'PRETTY_NAME="{provenance["os_release"]}"'
        assert f'PRETTY_NAME="{provenance["os_release"]}"' not in host_os
        manifest = json.loads((results / "images" / f"{env}.json").read_text())
        built = subprocess.run(
            ["podman", "image", "inspect", "--format", "{{.Id}}", manifest["image"]],
            capture_output=True, text=True, check=True,
        )  # fmt: skip
        assert provenance["container_digest"] == manifest["digest"]
        assert manifest["digest"] == f"sha256:{built.stdout.strip()}"
        # The image the emulator ran is that one (its sif names the podman image by id).
        assert json.loads(sif.read_text())["image_id"] == manifest["digest"]
        assert provenance["container_image"] == os.path.abspath(sif)  # as given, links kept
        assert HOST_COMPILER.items() <= provenance["cleared_host_variables"].items()


@pytest.mark.apptainer
@pytest.mark.slow
@WHOLE_RUN
def test_a_cell_cannot_write_into_its_image(apptainer_run: dict[str, Any]) -> None:
    sif = apptainer_run["results"] / "images" / "torch-2.0.sif"
    done = image_exec(sif, "python", "-c", "open('/opt/venv/written-by-a-cell', 'w')")
    assert done.returncode != 0 and "Read-only file system" in done.stderr


@pytest.mark.apptainer
@pytest.mark.slow
@WHOLE_RUN
def test_the_cells_python_does_not_see_the_hosts_packages(
    apptainer_run: dict[str, Any], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Apptainer passes the host's PYTHONPATH and PYTHONHOME in: the image's python alone
    would import a host module or fail to start; the cell's command (the rule's PYTHONPATH,
    then CELL_PYTHON) is the image's venv and nothing else."""
    (tmp_path / "host_only_probe.py").write_text("")
    sif = apptainer_run["results"] / "images" / "torch-2.0.sif"
    probe = "python -c 'import sys; print(sys.prefix); import host_only_probe'"
    cell = f"PYTHONPATH={ROOT / 'src'} {CELL_PYTHON} {probe}"
    monkeypatch.setenv("PYTHONPATH", str(tmp_path))
    assert image_exec(sif, "sh", "-c", probe).returncode == 0
    blind = image_exec(sif, "sh", "-c", cell)
    assert blind.stdout.strip() == "/opt/venv"
    assert blind.returncode == 1 and "No module named 'host_only_probe'" in blind.stderr
    monkeypatch.setenv("PYTHONHOME", str(tmp_path))
    assert image_exec(sif, "python", "-c", "pass").returncode != 0
    assert image_exec(sif, "sh", "-c", cell).stdout.strip() == "/opt/venv"


@pytest.mark.apptainer
@pytest.mark.slow
@WHOLE_RUN
def test_a_changed_lock_rebuilds_exactly_its_image_and_cells(apptainer_run: dict[str, Any]) -> None:
    """A changed lock (a comment added: Snakemake compares the content of small inputs, not
    only their times) plans its image, its sif and its cells again, and nothing of the other
    environment. The lock is restored, content and time, whatever happens."""
    lock = ROOT / "envs/torch-2.0.txt"
    before, text = lock.stat(), lock.read_bytes()
    try:
        lock.write_bytes(text + b"# changed by tests/test_apptainer.py\n")
        done = snakemake(
            "-n", "--use-singularity", f"--configfile={apptainer_run['config']}",
            env=with_emulator(),
        )  # fmt: skip
    finally:
        lock.write_bytes(text)
        os.utime(lock, ns=(before.st_atime_ns, before.st_mtime_ns))
    assert done.returncode == 0, done.stdout[-3000:]
    assert [job["wildcards"] for job in jobs(done.stdout, "image")] == ["env=torch-2.0"]
    assert [job["wildcards"] for job in jobs(done.stdout, "sif")] == ["env=torch-2.0"]
    rerun = {
        part.strip()
        for job in jobs(done.stdout, "cell")
        for part in job["wildcards"].split(",")
        if part.strip().startswith("env=")
    }
    assert rerun == {"env=torch-2.0"}


def test_a_shared_image_dir_serves_a_second_checkout_without_building(tmp_path: Path) -> None:
    """What another checkout built with the same recipes and lock is reused: the manifest is
    copied, the sif linked, and neither an engine nor Apptainer runs (none is on PATH)."""
    shared, results = tmp_path / "shared", tmp_path / "results"
    shared.mkdir()
    spec = BuildSpec("torch-2.0", ROOT / "envs/torch-2.0.txt", "3.10", "t", CI_BASE_IMAGE)
    stem = f"{shared}/torch-2.0-{image_key(spec, ROOT)}"
    manifest = ImageManifest("torch-2.0", "localhost/ptspeed/torch-2.0:latest", DIGEST, DIGEST,
                             "podman", "build")  # fmt: skip
    manifest.write(Path(f"{stem}.json"))
    Path(f"{stem}.sif").write_text("an image\n")
    Path(f"{stem}.sif.digest").write_text(f"{DIGEST}\n")
    recipe = ["--requirements", "envs/torch-2.0.txt", "--python", "3.10",
              "--base-image", CI_BASE_IMAGE, "--image-dir", str(shared)]  # fmt: skip
    bare = {**os.environ, "PATH": bare_path(tmp_path / "bin")}

    def image_py(*args: str) -> None:
        done = subprocess.run([sys.executable, "workflow/scripts/image.py", *args, *recipe],
                              cwd=ROOT, env=bare, capture_output=True, text=True)  # fmt: skip
        assert done.returncode == 0, done.stdout + done.stderr

    image_py("build", "--env", "torch-2.0", "--engine", "podman", "--tag", "t",
             "--manifest", str(results / "torch-2.0.json"))  # fmt: skip
    assert ImageManifest.read(results / "torch-2.0.json") == manifest
    image_py("sif", "--env", "torch-2.0", "--source", "image", "--engine", "podman",
             "--manifest", str(results / "torch-2.0.json"), "--sif", str(results / "x.sif"),
             "--digest", str(results / "x.sif.digest"))  # fmt: skip
    assert (results / "x.sif").resolve() == Path(f"{stem}.sif").resolve()
    assert (results / "x.sif.digest").read_text() == f"{DIGEST}\n"


@pytest.mark.apptainer
@pytest.mark.slow
@WHOLE_RUN
def test_a_sif_another_checkout_built_is_brought_as_is(
    apptainer_run: dict[str, Any], tmp_path: Path
) -> None:
    """The first run's torch-2.0 sif, named by its path in a second run (kind image): nothing
    is built, its torch and GPU code are read from inside it once, every record names the
    file's digest and the report says where the image came from."""
    sif = apptainer_run["results"] / "images" / "torch-2.0.sif"
    config = {
        **reduced_matrix(tmp_path),
        "environments": {"site-2.0": {"kind": "image", "image": str(sif)}},
        "comparisons": {
            "compile-alone": {
                "title": "compile alone, in a brought image",
                "baseline": {"env": "site-2.0", "variant": "eager"},
                "candidate": {"env": "site-2.0", "variant": "compile"},
            }
        },
    }
    done = snakemake(
        "--use-singularity", f"--configfile={write_config(tmp_path, config)}", cores="all",
        env=with_emulator(), timeout=RUN_TIMEOUT_S,
    )  # fmt: skip
    results = tmp_path / "results"
    assert done.returncode == 0, done.stdout[-6000:]
    assert "rule sif:" not in done.stdout and "rule image:" not in done.stdout
    assert "ptspeed: images:" not in done.stdout  # no builder was looked for
    recorded = json.loads((results / "envs/site-2.0.json").read_text())
    assert recorded["gpu_code"]["torch_version"].startswith("2.0.1")
    digest = sif_digest(SifPlan("definition"), sif)
    assert recorded["digest"] == digest
    records = [json.loads(p.read_text()) for p in (results / "records").rglob("*.json")]
    assert records and {r["provenance"]["container_digest"] for r in records} == {digest}
    report = (results / "report/report.md").read_text()
    assert f"brought: {sif}" in report


DEFINITION = """\
Bootstrap: docker
From: {{ BASE }}

%arguments
    BASE=localhost/ptspeed/debian-base:bookworm
    WORD=default

%files
    {{ SOURCE }} /opt/copied.txt

%post
    echo "{{ WORD }}" > /opt/built.txt

%environment
    export GREETING=from-environment

%labels
    org.example.word {{ WORD }}

%runscript
    echo "runscript $GREETING $*"
"""


DEBIAN_BASE = "localhost/ptspeed/debian-base:bookworm"


def need_debian_base() -> None:
    if (
        shutil.which("podman") is None
        or subprocess.run(["podman", "image", "exists", DEBIAN_BASE], check=False).returncode
    ):
        pytest.skip(f"needs podman and {DEBIAN_BASE} (.ci/podman.sh)")


def make_sif_of_debian_base(
    tmp_path: Path, images: Path, path: str
) -> subprocess.CompletedProcess[str]:
    """workflow/scripts/image.py sif of the debian base into ``images``, with ``path`` as PATH."""
    manifest = inspect_image("podman", "torch-2.0", DEBIAN_BASE, "build")
    manifest.write(tmp_path / "torch-2.0.json")
    command = [sys.executable, "workflow/scripts/image.py", "sif", "--env", "torch-2.0", "--source",
               "image", "--engine", "podman", "--manifest", str(tmp_path / "torch-2.0.json"),
               "--requirements", "envs/torch-2.0.txt", "--python", "3.10",
               "--sif", str(images / "torch-2.0.sif"),
               "--digest", str(images / "torch-2.0.sif.digest")]  # fmt: skip
    return subprocess.run(command, cwd=ROOT, env={**os.environ, "PATH": path},
                          capture_output=True, text=True, check=False)  # fmt: skip


@pytest.mark.container
def test_a_disk_too_small_for_the_sif_stops_it_in_one_line_before_writing(tmp_path: Path) -> None:
    need_debian_base()
    with small_disk(tmp_path / "images", size_kib=1024) as images:
        done = make_sif_of_debian_base(tmp_path, images, with_emulator()["PATH"])
        left = sorted(p.name for p in images.iterdir())
    assert done.returncode == 2, done.stdout + done.stderr
    (line,) = done.stderr.strip().splitlines()
    assert re.fullmatch(
        rf"error: images: making torch-2\.0\.sif needs about \d+\.\d GB free in {images} \(the "
        r"image's docker archive, then the SIF\); 0\.0 GB are free: free space there, or set "
        r"containers\.image_dir to a directory on a larger disk",
        line,
    ), line
    assert "podman save" not in done.stdout
    assert left == [".sif-conversion.lock"]


@pytest.mark.container
def test_a_failed_conversion_leaves_neither_its_archive_nor_a_partial_sif(tmp_path: Path) -> None:
    """podman saves the image's archive, then the conversion fails (no apptainer on PATH): the
    multi-GB archive goes with it."""
    need_debian_base()
    tools = tmp_path / "bin"
    bare = bare_path(tools)
    (tools / "podman").symlink_to(shutil.which("podman"))
    images = tmp_path / "images"
    done = make_sif_of_debian_base(tmp_path, images, bare)
    assert done.returncode == 2, done.stdout + done.stderr
    assert "+ podman save" in done.stdout and "+ apptainer build" in done.stdout
    assert sorted(p.name for p in images.iterdir()) == [".sif-conversion.lock"]
    converted = make_sif_of_debian_base(tmp_path, images, with_emulator(bare)["PATH"])
    assert converted.returncode == 0, converted.stdout + converted.stderr
    assert sorted(p.name for p in images.iterdir()) == [
        ".sif-conversion.lock",
        "torch-2.0.sif",
        "torch-2.0.sif.digest",
    ]


@pytest.mark.container
def test_emulator_builds_a_definition_file_and_runs_it(tmp_path: Path) -> None:
    need_debian_base()
    (tmp_path / "ptspeed.def").write_text(DEFINITION)
    (tmp_path / "source.txt").write_text("copied\n")
    sif = tmp_path / "x.sif"
    build = [str(EMULATOR), "build", "--fakeroot", "--build-arg", "WORD=given",
             "--build-arg", f"SOURCE={tmp_path / 'source.txt'}", str(sif),
             str(tmp_path / "ptspeed.def")]  # fmt: skip
    done = subprocess.run(build, capture_output=True, text=True, check=False)
    assert done.returncode == 0, done.stderr[-3000:]
    again = subprocess.run(build, capture_output=True, text=True, check=False)
    assert "already exists; use --force" in again.stderr
    shown = image_exec(sif, "sh", "-c", "cat /opt/built.txt /opt/copied.txt; echo $GREETING")
    assert shown.stdout.split() == ["given", "copied", "from-environment"], shown.stderr
    ran = subprocess.run([str(EMULATOR), "run", str(sif), "a", "b"], capture_output=True,
                         text=True, check=False, env=with_emulator())  # fmt: skip
    assert ran.stdout.strip() == "runscript from-environment a b", ran.stderr


@pytest.mark.container
def test_an_image_without_torch_is_named_in_one_line_when_brought(tmp_path: Path) -> None:
    """workflow/scripts/brought_image.py runs the image's own python (the CI's Python 3.10 base,
    which has no torch): the line names the environment, the image and what its python said."""
    need_debian_base()
    sif = tmp_path / "site.sif"
    build = [str(EMULATOR), "build", str(sif), f"docker-daemon:{CI_BASE_IMAGE}"]
    subprocess.run(build, capture_output=True, check=True)
    record, digest = tmp_path / "site.json", tmp_path / "site.digest"
    done = subprocess.run(
        [sys.executable, "workflow/scripts/brought_image.py", "--env", "site", "--image", str(sif),
         "--record", str(record), "--digest", str(digest)],
        cwd=ROOT, env=with_emulator(), capture_output=True, text=True, check=False,
    )  # fmt: skip
    assert done.returncode == 2
    assert done.stderr.splitlines()[-1] == (
        f"error: environments.site.image: reading the GPU code of the torch of python in {sif} "
        "failed (exit 1): ModuleNotFoundError: No module named 'torch'"
    )
    assert not record.exists() and not digest.exists()


@pytest.mark.parametrize(
    ("output", "kind"),
    [
        # Apptainer 1.3, --fakeroot without a subuid range.
        ("FATAL:   could not use fakeroot: no mapping entry found in /etc/subuid for alice",
         "fakeroot"),
        # uv and pip writing a wheel to a full disk, podman to its storage.
        ("error: Failed to write to the distribution cache: No space left on device (os error 28)",
         "space"),
        ("OSError: [Errno 122] Disk quota exceeded: '/home/alice/.apptainer/cache/blob'", "space"),
        # pip behind a site that reaches PyPI only through its mirror.
        ("WARNING: Retrying ... Failed to establish a new connection: [Errno 111] Connection "
         "refused')': /simple/torch/", "network"),
        ("Err:1 http://archive.ubuntu.com/ubuntu jammy InRelease  Temporary failure in name "
         "resolution", "network"),
        ("Error: no container image matching", ""),
    ],
)  # fmt: skip
def test_a_failed_builds_cause_is_named(output: str, kind: str) -> None:
    cause = failure_cause(["building...", output, "exit status 1"])
    assert cause.partition(":")[0] == kind
    if kind:
        assert cause.endswith(f"({output.strip()[:200]})")


@pytest.mark.container
def test_a_build_that_cannot_reach_its_registry_says_so_on_the_console(tmp_path: Path) -> None:
    """The base on a registry no resolver knows (.invalid): the build's one console line says
    network, what to do, and where the log is."""
    need_debian_base()
    config = reduced_matrix(tmp_path)
    config["environments"]["torch-2.0"]["base_image"] = f"registry.invalid/cuda@{DIGEST}"
    done = snakemake(
        "--use-singularity", f"--configfile={write_config(tmp_path, config)}",
        str(tmp_path / "results/images/torch-2.0.sif"), env=with_emulator(),
    )  # fmt: skip
    assert done.returncode == 1
    (line,) = [line for line in done.stdout.splitlines() if line.startswith("ptspeed: error:")]
    assert ": network: the build cannot reach the network" in line, line
    assert line.endswith(f"(log: {tmp_path}/results/logs/images/torch-2.0.log)"), line


@pytest.fixture
def local_registry(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[str]:
    """A registry of its own (Debian's docker-registry, from .ci/podman.sh) on a free port,
    plain HTTP, which podman is told through CONTAINERS_REGISTRIES_CONF."""
    registry = shutil.which("docker-registry")
    if registry is None or shutil.which("podman") is None:
        pytest.skip("needs podman and docker-registry (.ci/podman.sh)")
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    address = f"127.0.0.1:{port}"
    config = tmp_path / "registry.yml"
    config.write_text(
        "version: 0.1\nstorage:\n  filesystem:\n"
        f"    rootdirectory: {tmp_path / 'storage'}\nhttp:\n  addr: {address}\n"
    )
    registries = tmp_path / "registries.conf"
    registries.write_text(f'[[registry]]\nlocation = "{address}"\ninsecure = true\n')
    monkeypatch.setenv("CONTAINERS_REGISTRIES_CONF", str(registries))
    server = subprocess.Popen([registry, "serve", str(config)], stderr=subprocess.DEVNULL)
    try:
        for _ in range(100):
            with socket.socket() as client:
                if client.connect_ex(("127.0.0.1", port)) == 0:
                    break
            time.sleep(0.1)
        yield address
    finally:
        server.terminate()
        server.wait(timeout=30)


@pytest.mark.slow
def test_push_pins_by_digest_and_apptainer_builds_from_it(
    local_registry: str, tmp_path: Path
) -> None:
    """The push of `snakemake images` with containers.push returns the image pinned
    by the registry's digest; `apptainer build` of that reference (rule sif with images: pull)
    gives the same image."""
    base = "localhost/ptspeed/debian-base:bookworm"
    if subprocess.run(["podman", "image", "exists", base], check=False).returncode != 0:
        pytest.skip(f"needs {base} (.ci/podman.sh)")
    manifest = inspect_image("podman", "probe", base, "build")
    pinned = push_image("podman", manifest, f"{local_registry}/ptspeed")
    assert re.fullmatch(rf"{re.escape(local_registry)}/ptspeed/probe@sha256:[0-9a-f]{{64}}", pinned)
    plan = SifPlan("registry")
    (command,) = sif_commands(plan, tmp_path / "probe.sif", None, ROOT, reference=pinned)
    done = subprocess.run(command, capture_output=True, text=True, env=with_emulator())
    assert done.returncode == 0, done.stderr[-3000:]
    assert sif_digest(plan, tmp_path / "probe.sif", reference=pinned) == digest_of(pinned)
    pulled = json.loads((tmp_path / "probe.sif").read_text())["image_id"]
    assert pulled == manifest.id


@pytest.mark.workflow
def test_cuda_cells_get_nv_and_a_shared_image_dir_spares_the_build(tmp_path: Path) -> None:
    """On a CUDA run the cells get --nv though the default profile has no apptainer-args (the
    emulator, like Apptainer on a machine without NVIDIA's driver, warns and goes on), and a
    shared image directory that holds the environment's image spares the build: the sif is a
    link to it. The shared "image" is the CI base itself, without torch: the cell's own result
    does not matter here."""
    if subprocess.run(["podman", "image", "exists", CI_BASE_IMAGE], check=False).returncode:
        pytest.skip(f"needs podman and {CI_BASE_IMAGE} (.ci/podman.sh)")
    shared = tmp_path / "shared"
    spec = BuildSpec("torch-2.0", ROOT / "envs/torch-2.0.txt", "3.10", "t", CI_BASE_IMAGE)
    stem = f"{shared}/torch-2.0-{image_key(spec, ROOT)}"
    build = [str(EMULATOR), "build", f"{stem}.sif", f"docker-daemon:{CI_BASE_IMAGE}"]
    subprocess.run(build, check=True, capture_output=True, env=with_emulator())
    manifest = inspect_image("podman", "torch-2.0", CI_BASE_IMAGE, "build")
    manifest.write(Path(f"{stem}.json"))
    Path(f"{stem}.sif.digest").write_text(f"{manifest.digest}\n")
    config = {
        **reduced_matrix(tmp_path),
        "device": "cuda",
        "trials": 1,
        "environments": {"torch-2.0": reduced_matrix(tmp_path)["environments"]["torch-2.0"]},
        "comparisons": {"compile-alone": DEFAULT_CONFIG["comparisons"]["compile-alone"]},
    }
    config["containers"] = {**config["containers"], "image_dir": str(shared)}
    record = tmp_path / "results/records/torch-2.0/mlp/eager/train/b64/trial0.json"
    done = snakemake(
        str(record), "--use-singularity", f"--configfile={write_config(tmp_path, config)}",
        "--resources", "gpu=1", env=with_emulator(),
    )  # fmt: skip
    assert "WARNING: Could not find any nv files on this host!" in done.stdout, done.stdout[-3000:]
    assert (tmp_path / "results/images/torch-2.0.sif").resolve() == Path(f"{stem}.sif")
    log = (tmp_path / "results/logs/images/torch-2.0.log").read_text()
    assert log.startswith("reusing "), log


@pytest.mark.workflow
def test_a_node_driver_leaves_out_only_the_cells_it_cannot_run(tmp_path: Path) -> None:
    """nvidia-smi says 535.104.05: torch-2.14's CUDA 13 wheels need 580.65.06, so its cells are
    not planned, saying why, before any job; torch-1.13's and 2.0's (CUDA 11.8) run."""
    smi = tmp_path / "bin/nvidia-smi"
    smi.parent.mkdir()
    smi.write_text('#!/bin/sh\ncase "$*" in *driver_version*) echo 535.104.05 ;;\n'
                   '*) echo "GPU 0: NVIDIA A100 (UUID: GPU-0)" ;; esac\n')  # fmt: skip
    smi.chmod(0o755)
    done = snakemake(
        "-n", "--use-singularity", "--resources", "gpu=1",
        env=with_emulator(f"{smi.parent}{os.pathsep}{os.environ['PATH']}"),
    )  # fmt: skip
    assert done.returncode == 0, done.stdout[-3000:]
    (line,) = [line for line in done.stdout.splitlines() if line.startswith("ptspeed: not planned")]
    assert line.startswith("ptspeed: not planned: environments.torch-2.14: ")
    assert "CUDA 13.0" in line and ">= 580.65.06" in line and "driver is 535.104.05" in line
    planned = {
        env
        for env in ("torch-1.13", "torch-2.0", "torch-2.14")
        if f"/records/{env}/" in done.stdout
    }
    assert planned == {"torch-1.13", "torch-2.0"}, done.stdout[-3000:]


# --- what real Apptainer does that the emulator once did not -------------------------------


def definition_sections() -> dict[str, str]:
    sections: dict[str, str] = {}
    current = None
    for line in (ROOT / DEFINITION_FILE).read_text().splitlines():
        if line.startswith("%"):
            current = line[1:].split()[0]
            sections[current] = ""
        elif current:
            sections[current] += line + "\n"
    return sections


def bootstrap_command(tmp_path: Path, base_image: str = "") -> list[str]:
    spec = BuildSpec("torch-2.0", ROOT / "envs/torch-2.0.txt", "3.10", "t", base_image,
                     ca_bundle=tmp_path / "ca.crt", uv_cache=tmp_path / "uv",
                     package_index=tmp_path / "package_index")  # fmt: skip
    (command,) = sif_commands(SifPlan("definition"), tmp_path / "x.sif", spec, ROOT)
    return command


def test_the_definitions_setup_makes_every_build_binds_destination(tmp_path: Path) -> None:
    """%post runs under `exec --writable`: a bind to a path the CUDA base lacks is fatal."""
    rootfs = tmp_path / "rootfs"
    rootfs.mkdir()
    setup = definition_sections().get("setup", "")
    subprocess.run(["sh", "-e", "-c", setup], env={**os.environ, "APPTAINER_ROOTFS": str(rootfs)},
                   check=True)  # fmt: skip
    command = bootstrap_command(tmp_path)
    destinations = [command[i + 1].split(":")[1] for i, a in enumerate(command) if a == "--bind"]
    assert len(destinations) == 3
    for destination in destinations:
        assert (rootfs / destination.lstrip("/")).exists(), destination
    assert not any((rootfs / "var/cache/uv").iterdir())  # the cache's content stays outside


MIRROR = "https://ptspeed:s3cret-token@mirror.example.org/pypi/simple"


def test_the_sites_package_index_reaches_the_build_as_a_secret_only(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """PIP_INDEX_URL (a token in it) and pip.conf's extra index reach the build as a file that
    only its owner reads, bound or mounted as a secret: in no argument of any build command,
    so in no history, label or kept definition file."""
    pip_conf = tmp_path / "pip.conf"
    pip_conf.write_text("[global]\nextra-index-url = https://extra.example.org/simple\n")
    environ = {"PIP_INDEX_URL": MIRROR, "PIP_CONFIG_FILE": str(pip_conf), "HOME": str(tmp_path)}
    settings = package_index_settings(environ)
    assert settings == {"PIP_INDEX_URL": MIRROR,
                        "PIP_EXTRA_INDEX_URL": "https://extra.example.org/simple"}  # fmt: skip
    assert package_index_settings({"HOME": str(tmp_path)}) == {}
    secret = write_index_secret(settings, tmp_path)
    assert secret is not None and secret.stat().st_mode & 0o777 == 0o600
    assert f"PIP_INDEX_URL={MIRROR}\n" in secret.read_text()
    spec = BuildSpec("torch-2.0", ROOT / "envs/torch-2.0.txt", "3.10", "t",
                     package_index=secret)  # fmt: skip
    (definition,) = sif_commands(SifPlan("definition"), tmp_path / "x.sif", spec, ROOT)
    assert f"{secret}:/run/secrets/package_index" in definition
    engine_build = build_command("podman", spec, tmp_path, ROOT / "docker/Dockerfile")
    assert f"id=package_index,src={secret}" in engine_build
    for command in (definition, engine_build):
        assert not [argument for argument in command if "s3cret" in argument]


@pytest.mark.container
def test_emulator_runs_post_with_a_clean_environment(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Apptainer's %post sees none of the host's variables (a site's PIP_INDEX_URL does not
    reach it); a file bound into the build does."""
    need_debian_base()
    definition = tmp_path / "index.def"
    definition.write_text(
        f"Bootstrap: docker\nFrom: {DEBIAN_BASE}\n\n%setup\n    mkdir -p ${{APPTAINER_ROOTFS}}/run"
        "/secrets\n    touch ${APPTAINER_ROOTFS}/run/secrets/package_index\n\n%post\n"
        '    echo "host: ${PIP_INDEX_URL-unset}" > /opt/index.txt\n'
        "    . /run/secrets/package_index\n"
        '    echo "bound: ${PIP_INDEX_URL-unset}" >> /opt/index.txt\n'
    )
    secret = write_index_secret({"PIP_INDEX_URL": MIRROR}, tmp_path)
    monkeypatch.setenv("PIP_INDEX_URL", "https://from-the-host.example.org/simple")
    sif = tmp_path / "x.sif"
    made = emulator("build", "--bind", f"{secret}:/run/secrets/package_index", str(sif),
                    str(definition), PIP_INDEX_URL="https://host.example.org")  # fmt: skip
    assert made.returncode == 0, made.stderr[-3000:]
    shown = image_exec(sif, "cat", "/opt/index.txt")
    assert shown.stdout.splitlines() == ["host: unset", f"bound: {MIRROR}"]


def test_the_definition_takes_its_base_by_digest_alone_and_every_argument_it_is_given() -> None:
    """Apptainer 1.3 refuses name:tag@digest; every Apptainer refuses an unused --build-arg."""
    text = (ROOT / DEFINITION_FILE).read_text()
    used = set(re.findall(r"\{\{\s*(\w+)\s*\}\}", text))
    for base in ("", "nvidia/cuda:12.8.1-cudnn-runtime-ubuntu22.04@" + DIGEST):
        command = bootstrap_command(Path("/tmp"), base)
        given = dict(command[i + 1].split("=", 1) for i, a in enumerate(command)
                     if a == "--build-arg")  # fmt: skip
        assert set(given) <= used, set(given) - used
        if base:
            assert given["BASE_IMAGE"] == "nvidia/cuda@" + DIGEST
            assert given["BASE_IMAGE_TAG"] == "12.8.1-cudnn-runtime-ubuntu22.04"
    default = re.search(r"^\s*BASE_IMAGE=(\S+)$", text, re.M).group(1)
    assert without_tag(default) == (default, "")
    (pull,) = sif_commands(SifPlan("registry"), Path("x.sif"), None, ROOT,
                           reference=f"docker://r:5000/x:v1@{DIGEST}")  # fmt: skip
    assert pull[-1] == f"docker://r:5000/x@{DIGEST}"


def test_cell_apptainer_args_bind_what_the_working_directory_does_not_hold(tmp_path: Path) -> None:
    """Snakemake binds the working directory (as home): results on scratch, or reached through a
    link, and sources elsewhere are bound; what is inside is not; twice is once."""
    workdir, scratch = tmp_path / "work", tmp_path / "scratch"
    (workdir / "inside").mkdir(parents=True)
    scratch.mkdir()
    (workdir / "results").symlink_to(scratch)
    binds = outside(workdir, [Path("results"), Path("inside"), scratch, tmp_path / "src"])
    assert binds == [scratch.resolve(), (tmp_path / "src").resolve()]
    once = cell_apptainer_args("--nv", "cuda", binds, environ={})
    assert shlex.split(once) == ["--nv", "--bind", str(binds[0]), "--bind", str(binds[1])]
    assert cell_apptainer_args(once, "cuda", binds, environ={}) == once
    assert cell_apptainer_args("", "cpu", [], environ={}) == ""


@pytest.mark.parametrize(
    ("given", "environ", "named"),
    [
        ("--contain", {}, "apptainer-args: --contain gives every cell its own /tmp"),
        ("--nv -C", {}, "apptainer-args: -C gives every cell its own /tmp (64 MiB), where the"),
        ("--cleanenv", {}, "apptainer-args: --cleanenv drops CUDA_VISIBLE_DEVICES"),
        ("", {"APPTAINER_CONTAINALL": "1"}, "APPTAINER_CONTAINALL (= --containall) gives"),
    ],
)
def test_options_that_isolate_the_cells_are_refused_in_one_line(
    given: str, environ: dict[str, str], named: str
) -> None:
    with pytest.raises(ConfigError) as error:
        cell_apptainer_args(given, "cuda", [], environ=environ)
    assert str(error.value).startswith(named) and "\n" not in str(error.value)
    assert "drop it" in str(error.value)


@pytest.mark.workflow
def test_a_run_with_contain_stops_before_any_job(tmp_path: Path) -> None:
    done = snakemake("-n", "--use-singularity", "--apptainer-args=--contain", env=with_emulator())
    assert done.returncode == 1, done.stdout[-3000:]
    (line,) = [line for line in done.stdout.splitlines() if line.startswith("config:")]
    assert "--contain gives every cell its own /tmp" in line


def emulator(*args: str, **variables: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([str(EMULATOR), *args], capture_output=True, text=True, check=False,
                          env={**with_emulator(), **variables})  # fmt: skip


BIND_DEFINITION = """\
Bootstrap: docker
From: {{ BASE }}

%arguments
    BASE=localhost/ptspeed/debian-base:bookworm

%post
    touch /var/cache/uv/written-in-post
"""


@pytest.mark.container
def test_emulator_builds_as_apptainer_does(tmp_path: Path) -> None:
    """A build bind to a destination the base lacks fails until %setup makes it; the cache's
    content stays outside the image; a tag with a digest and an unused --build-arg fail."""
    need_debian_base()
    cache = tmp_path / "cache"
    cache.mkdir()
    definition = tmp_path / "bind.def"
    definition.write_text(BIND_DEFINITION)
    build = ["build", "--force", "--bind", f"{cache}:/var/cache/uv", str(tmp_path / "x.sif"),
             str(definition)]  # fmt: skip
    missing = emulator(*build)
    assert missing.returncode == 255
    assert "destination /var/cache/uv doesn't exist in container" in missing.stderr
    setup = '\n%setup\n    mkdir -p "${APPTAINER_ROOTFS}/var/cache/uv"\n'
    definition.write_text(BIND_DEFINITION + setup)
    made = emulator(*build)
    assert made.returncode == 0, made.stderr[-3000:]
    assert (cache / "written-in-post").is_file()
    inside = image_exec(tmp_path / "x.sif", "ls", "-A", "/var/cache/uv")
    assert inside.returncode == 0 and inside.stdout == ""
    tagged = BIND_DEFINITION.replace("debian-base:bookworm", f"debian-base:bookworm@{DIGEST}")
    definition.write_text(tagged)
    refused = emulator(*build)
    assert "both a tag and digest are currently not supported" in refused.stderr
    definition.write_text(BIND_DEFINITION + setup)
    unused = emulator("build", "--build-arg", "UNUSED=1", str(tmp_path / "y.sif"), str(definition))
    assert unused.returncode == 255 and "unused build args: UNUSED." in unused.stderr


@pytest.mark.container
def test_emulator_as_singularity_reads_only_singularity_variables(tmp_path: Path) -> None:
    need_debian_base()
    singularity = SINGULARITY_DIR / "singularity"
    sif = tmp_path / "x.sif"
    env = {**os.environ, "PATH": f"{SINGULARITY_DIR}{os.pathsep}{os.environ['PATH']}"}
    subprocess.run([str(singularity), "build", str(sif), f"docker-daemon:{DEBIAN_BASE}"],
                   env=env, check=True, capture_output=True)  # fmt: skip
    show = 'echo "${GREETING-unset}|${SINGULARITY_NAME-}|${APPTAINER_NAME-}"'
    done = subprocess.run(
        [str(singularity), "exec", str(sif), "sh", "-c", show], capture_output=True, text=True,
        env={**env, "APPTAINERENV_GREETING": "a", "APPTAINER_CONTAIN": "1"}, check=False,
    )  # fmt: skip
    assert done.stdout.strip() == "unset|x.sif|", done.stderr
    done = subprocess.run([str(singularity), "exec", str(sif), "sh", "-c", show],
                          capture_output=True, text=True, check=False,
                          env={**env, "SINGULARITYENV_GREETING": "b"})  # fmt: skip
    assert done.stdout.strip().startswith("b|")


@pytest.fixture(scope="module")
def image_with_env(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A sif of the debian base with a Docker ENV, through a link (as containers.image_dir)."""
    need_debian_base()
    directory = tmp_path_factory.mktemp("env-image")
    (directory / "Containerfile").write_text(f"FROM {DEBIAN_BASE}\nENV GREETING=from-image\n")
    iid = directory / "iid"
    subprocess.run(["podman", "build", "--iidfile", str(iid), str(directory)], check=True,
                   capture_output=True)  # fmt: skip
    real = directory / "shared" / "x.sif"
    made = emulator("build", str(real), f"docker-daemon:{iid.read_text().strip()}")
    assert made.returncode == 0, made.stderr
    (directory / "x.sif").symlink_to(real)
    return directory / "x.sif"


@pytest.mark.container
def test_emulator_runs_as_apptainer_does(image_with_env: Path, tmp_path: Path) -> None:
    """The image's ENV wins over the host's; APPTAINER_CONTAINER is the path as given; --contain
    hides the host's /tmp and --containall the GPU choice; --no-mount tmp with results outside
    the working directory needs their bind."""
    sif = str(image_with_env)
    show = 'echo "$GREETING|$APPTAINER_CONTAINER|${CUDA_VISIBLE_DEVICES-unset}"'
    shown = emulator("exec", sif, "sh", "-c", show, GREETING="host", CUDA_VISIBLE_DEVICES="1")
    assert shown.stdout.strip() == f"from-image|{sif}|1", shown.stderr
    forced = emulator("exec", sif, "sh", "-c", show, APPTAINERENV_GREETING="forced")
    assert forced.stdout.split("|")[0] == "forced"
    with tempfile.NamedTemporaryFile(dir="/tmp") as host_file:
        probe = ["sh", "-c", f"test -e {host_file.name} && echo seen || echo private"]
        assert emulator("exec", sif, *probe).stdout.strip() == "seen"
        assert emulator("exec", "--contain", sif, *probe).stdout.strip() == "private"
        contained = emulator("exec", sif, *probe, APPTAINER_CONTAIN="1")
        assert contained.stdout.strip() == "private"
    clean = emulator("exec", "--containall", sif, "sh", "-c", show, CUDA_VISIBLE_DEVICES="1")
    assert clean.stdout.strip().endswith("|unset")
    results = tmp_path / "results"
    results.mkdir()
    (results / "record.json").write_text("{}")
    read = ["cat", str(results / "record.json")]
    workdir = tmp_path / "work"
    workdir.mkdir()
    home = ["--home", str(workdir), "--no-mount", "tmp"]
    hidden = subprocess.run([str(EMULATOR), "exec", *home, sif, *read], capture_output=True,
                            text=True, cwd=workdir, env=with_emulator(), check=False)  # fmt: skip
    assert hidden.returncode != 0, "results outside every bind must not be seen"
    binds = shlex.split(cell_apptainer_args("", "cpu", outside(workdir, [results]), environ={}))
    bound = subprocess.run([str(EMULATOR), "exec", *home, *binds, sif, *read],
                           capture_output=True, text=True, cwd=workdir, env=with_emulator(),
                           check=False)  # fmt: skip
    assert bound.stdout == "{}", bound.stderr
