"""The environments' Apptainer images: how this machine makes them (chosen once), the commands
that make ``<env>.sif``, the digest that names it in every record, the shared image directory
that several checkouts reuse, and the check that the node's driver runs the image's CUDA. The
room a build needs: :mod:`ptspeed.envs.build_space`; the cells that run in the images:
:mod:`ptspeed.envs.apptainer_cells`.

This module needs no torch and no Snakemake.
"""

from __future__ import annotations

import hashlib
import json
import os
import re
import shutil
import subprocess
from collections.abc import Callable
from dataclasses import asdict, dataclass
from pathlib import Path

from ptspeed.envs.containers import (
    CA_SECRET_ID,
    ENGINES,
    INDEX_SECRET_ID,
    RECIPE,
    RECIPE_FILES,
    BuildSpec,
    ImageManifest,
)
from ptspeed.envs.image_references import brought_digest, digest_of, strip_scheme, without_tag
from ptspeed.errors import ConfigError
from ptspeed.plan.settings import Containers

BUILDERS = ("auto", *ENGINES, "apptainer")
# How the main process makes the images (SifPlan.to_text), for the cluster jobs it submits
# (sbatch exports its environment): a job then probes no engine and plans the sif's params as
# the login node that made the sif did, so that a node without that builder never rebuilds it.
SIF_PLAN_VARIABLE = "PTSPEED_SIF_PLAN"
# Apptainer's command, then SingularityCE's (the older name, which some sites still install).
APPTAINER_COMMANDS = ("apptainer", "singularity")
# The SingularityCE whose build takes --build-arg and %arguments (its CHANGELOG, 4.0.0); older
# ones (3.11) run the images and convert docker's, but cannot build docker/ptspeed.def.
SINGULARITY_CE_BUILDS = (4, 0)
SINGULARITY_CE_VERSION = re.compile(r"singularity-ce version (\d+\.\d+(?:\.\d+)?)")
PROBES = {
    "docker": "`docker version` failed",
    "podman": "`podman info` failed, or its user namespace maps one user ID: no subuid range",
}
DEFINITION = Path("docker/ptspeed.def")
# Where docker/install.sh finds uv's cache in an Apptainer build (its default UV_CACHE_DIR).
BUILD_UV_CACHE = "/var/cache/uv"
# The oldest Linux driver that runs each CUDA major release's toolkits: minor-version
# compatibility (NVIDIA's CUDA Compatibility guide) lets an application built with CUDA 11.x
# run on any driver >= 450.80.02, 12.x on >= 525.60.13. What it does not cover, PTX JIT of
# code newer than the driver, is not how torch runs: its wheels carry cubins for the GPUs
# it supports, and Triton compiles its kernels to cubins with its own ptxas.
CUDA_MINIMUM_DRIVER = {11: "450.80.02", 12: "525.60.13", 13: "580.65.06"}
CUDA_IN_BASE = re.compile(r"cuda:(\d+)\.(\d+)")
# The CUDA runtime a lock's wheels bring: nvidia-cuda-runtime-cu12==12.8.90, or (CUDA 13)
# nvidia-cuda-runtime==13.0.96.
CUDA_IN_LOCK = re.compile(r"^nvidia-cuda-runtime(?:-cu\d+)?==(\d+)\.(\d+)\S*", re.MULTILINE)
NO_BUILDER = (
    "containers: nothing here builds the images (no docker, podman or apptainer): "
    "install Apptainer (it builds docker/ptspeed.def with --fakeroot), or set "
    "containers.images: pull with containers.registry holding the images, pinned by digest"
)


@dataclass(frozen=True)
class SifPlan:
    """Where ``<env>.sif`` comes from: ``image`` (the engine's build of docker/Dockerfile),
    ``definition`` (``apptainer build --fakeroot`` of docker/ptspeed.def) or ``registry``
    (``apptainer build`` of the pinned reference)."""

    source: str
    engine: str | None = None
    # apptainer, or SingularityCE's singularity where there is no apptainer.
    command: str = "apptainer"

    def to_text(self) -> str:
        return json.dumps(asdict(self), sort_keys=True)

    @classmethod
    def from_text(cls, text: str) -> SifPlan:
        """The plan :meth:`to_text` wrote; raises :class:`ConfigError` naming the variable."""
        try:
            return cls(**json.loads(text))
        except (ValueError, TypeError) as error:
            raise ConfigError(f"{SIF_PLAN_VARIABLE}: {text!r} is not a plan ({error})") from None

    def describe(self) -> str:
        if self.source == "image":
            via = "docker-daemon" if self.engine == "docker" else "a docker archive"
            return (
                f"images: {self.engine} build of docker/Dockerfile, then {self.command} build "
                f"from {via} -> <env>.sif"
            )
        if self.source == "definition":
            return f"images: {self.command} build --fakeroot of docker/ptspeed.def -> <env>.sif"
        return f"images: {self.command} build from the registry, by digest -> <env>.sif"


def command_version(command: str) -> str:
    """What ``command --version`` prints ('' where it does not answer)."""
    try:
        done = subprocess.run(
            [command, "--version"], capture_output=True, text=True, check=False, timeout=30
        )
    except (OSError, subprocess.TimeoutExpired):
        return ""
    return done.stdout.strip()


def check_singularity_builds(version: str) -> None:
    """Refuse a SingularityCE (its ``--version``: ``version``) too old to build
    docker/ptspeed.def: its {{ NAME }} build variables and %arguments came with SingularityCE
    4.0 (Apptainer has them since 1.2)."""
    match = SINGULARITY_CE_VERSION.search(version)
    if match and _version(match.group(1)) >= SINGULARITY_CE_BUILDS:
        return
    found = f"SingularityCE {match.group(1)}" if match else repr(version or "no --version")
    raise ConfigError(
        f"containers: singularity here is {found}, whose build lacks --build-arg (the templated "
        f"definition files of SingularityCE >= {'.'.join(map(str, SINGULARITY_CE_BUILDS))}, "
        "Apptainer >= 1.2): load a newer module, or build with docker or podman "
        "(containers.builder), or set containers.images: pull"
    )


def apptainer_command(which: Callable[[str], str | None] = shutil.which) -> str | None:
    """The command that builds and runs Apptainer images here, as Snakemake chooses it:
    apptainer, else SingularityCE's singularity; None without either."""
    return next((name for name in APPTAINER_COMMANDS if which(name)), None)


def plan_sif(
    containers: Containers,
    usable: Callable[[str], bool],
    which: Callable[[str], str | None] = shutil.which,
    version: Callable[[str], str] = command_version,
) -> SifPlan:
    """How this machine makes the Apptainer images, in the order of preference: docker or
    podman (``usable``: ptspeed.envs.engine_calls.engine_usable) then Apptainer, else Apptainer
    alone (or SingularityCE >= 4.0, ``version`` its ``--version``); raises
    :class:`ConfigError`."""
    command = apptainer_command(which) or APPTAINER_COMMANDS[0]
    if containers.images == "pull":
        return SifPlan("registry", command=command)
    builder = containers.builder
    if builder not in BUILDERS:
        raise ConfigError(f"containers.builder: {builder!r} is not one of {', '.join(BUILDERS)}")
    if builder in ENGINES:
        if not usable(builder):
            raise ConfigError(
                f"containers.builder: {builder} is not on PATH or cannot run here "
                f"({PROBES[builder]}): fix it, or set containers.builder: auto to fall "
                "back to Apptainer"
            )
        return SifPlan("image", builder, command)
    if builder == "auto":
        engine = next((engine for engine in ENGINES if usable(engine)), None)
        if engine:
            return SifPlan("image", engine, command)
    if apptainer_command(which):
        if command == "singularity":
            check_singularity_builds(version(command))
        return SifPlan("definition", command=command)
    raise ConfigError(
        NO_BUILDER
        if builder == "auto"
        else "containers.builder: neither apptainer nor singularity is on PATH"
    )


def saves_archive(plan: SifPlan) -> bool:
    """Whether making the SIF goes through a docker archive (an engine's image, not docker's:
    Apptainer reads docker's daemon directly)."""
    return plan.source == "image" and plan.engine != "docker"


def sif_archive(sif: Path) -> Path:
    """The docker archive an engine's image is saved to on its way to ``sif``."""
    return sif.with_name(f"{sif.name}.tar")


def sif_commands(
    plan: SifPlan,
    sif: Path,
    spec: BuildSpec | None,
    project: Path,
    manifest: ImageManifest | None = None,
    reference: str = "",
) -> list[list[str]]:
    """The commands that write ``sif`` (their caller removes :func:`sif_archive` after them)."""
    build = [plan.command, "build", "--force"]
    if plan.source == "registry":
        return [[*build, str(sif), f"docker://{without_tag(strip_scheme(reference))[0]}"]]
    if plan.source == "image":
        if manifest is None or plan.engine is None:
            raise ValueError("an Apptainer image made from an image needs its manifest and engine")
        if not saves_archive(plan):
            return [[*build, str(sif), f"docker-daemon:{manifest.image}"]]
        archive = sif_archive(sif)
        return [
            [plan.engine, "save", "--format", "docker-archive", "--output", str(archive),
             manifest.image],
            [*build, str(sif), f"docker-archive:{archive}"],
        ]  # fmt: skip
    if spec is None:
        raise ValueError("an Apptainer image built from the definition needs its build spec")
    if os.geteuid() != 0:
        build.append("--fakeroot")
    for name, value in definition_arguments(spec, project).items():
        build += ["--build-arg", f"{name}={value}"]
    if spec.ca_bundle is not None:
        build += ["--bind", f"{spec.ca_bundle}:/run/secrets/{CA_SECRET_ID}"]
    if spec.package_index is not None:
        build += ["--bind", f"{spec.package_index}:/run/secrets/{INDEX_SECRET_ID}"]
    if spec.uv_cache is not None:
        build += ["--bind", f"{spec.uv_cache}:{BUILD_UV_CACHE}"]
    return [[*build, str(sif), str(project / DEFINITION)]]


def definition_arguments(spec: BuildSpec, project: Path) -> dict[str, str]:
    """The --build-arg values of docker/ptspeed.def, every one used there (Apptainer refuses an
    unused one): the base by digest alone and its tag apart (Apptainer 1.3 refuses both)."""
    arguments = {"PROJECT": str(project), **spec.build_arguments()}
    if arguments.get("BASE_IMAGE"):
        arguments["BASE_IMAGE"], arguments["BASE_IMAGE_TAG"] = without_tag(arguments["BASE_IMAGE"])
    return arguments


def sif_digest(
    plan: SifPlan, sif: Path, manifest: ImageManifest | None = None, reference: str = ""
) -> str:
    """The digest a record names: the image's (built or pulled) that the SIF was made from;
    for a SIF bootstrapped from the definition, the sha256 of the SIF file itself."""
    if plan.source == "image" and manifest is not None:
        return manifest.digest
    if plan.source == "registry":
        return digest_of(reference)
    return file_digest(sif)


def file_digest(path: Path) -> str:
    """``sha256:`` and the hash of the file at ``path`` (a SIF is named by its bytes)."""
    digest = hashlib.sha256()
    with open(path, "rb") as stream:
        for block in iter(lambda: stream.read(1 << 20), b""):
            digest.update(block)
    return f"sha256:{digest.hexdigest()}"


def brought_image_digest(reference: str, workdir: Path) -> str:
    """The digest that names an image a site brings in every record: the one its reference
    pins, or the hash of a local file's bytes."""
    return brought_digest(reference) or file_digest(workdir / Path(reference).expanduser())


def image_key(spec: BuildSpec, project: Path) -> str:
    """16 hex digits naming what an image is built from (recipes, lock, base, Python): the
    name of its files in a shared image directory, so that checkouts with the same inputs share
    them and a changed input never meets an old image."""
    digest = hashlib.sha256()
    for path in (project / RECIPE, project / DEFINITION, *(project / f for f in RECIPE_FILES)):
        digest.update(path.read_bytes())
    digest.update(spec.requirements.read_bytes())
    digest.update(f"{spec.base_image}\0{spec.python}".encode())
    return digest.hexdigest()[:16]


def default_base_image(project: Path) -> str:
    """The base docker/Dockerfile builds on when an environment names none."""
    for line in (project / RECIPE).read_text(encoding="utf-8").splitlines():
        if line.startswith("ARG BASE_IMAGE="):
            return line.split("=", 1)[1].strip()
    return ""


def check_driver(env: str, base_image: str, driver: str, lock: str = "") -> None:
    """Refuse an image whose CUDA needs a newer driver than the node's (``driver``, as
    nvidia-smi prints it): the base's CUDA (its name) or, where newer, the CUDA runtime wheel
    of the environment's ``lock`` (its text: torch 2.14's CUDA 13 wheels on a 12.8 base);
    without either, it passes."""
    base = _cuda_in(CUDA_IN_BASE, base_image, f"its image's base ({base_image.split('@')[0]}) has")
    wheels = _cuda_in(CUDA_IN_LOCK, lock, "its lock's wheels ({match}) bring")
    needs = [need for need in (base, wheels) if need]
    if not needs or not driver:
        return
    cuda, what = max(needs)
    minimum = CUDA_MINIMUM_DRIVER.get(cuda[0])
    if minimum and _version(driver) < _version(minimum):
        raise ConfigError(
            f"environments.{env}: {what} CUDA {cuda[0]}.{cuda[1]}, which needs an NVIDIA driver "
            f">= {minimum} (CUDA {cuda[0]}.x with minor-version compatibility); this node's "
            f"driver is {driver}: set environments.{env}.base_image "
            "to an older CUDA base (or lock wheels of an older CUDA), or run on a node with a "
            "newer driver"
        )


def _cuda_in(pattern: re.Pattern[str], text: str, what: str) -> tuple[tuple[int, int], str] | None:
    """(CUDA major, minor) that ``pattern`` finds in ``text``, and what says so; None."""
    match = pattern.search(text)
    if not match:
        return None
    return (int(match.group(1)), int(match.group(2))), what.format(match=match.group(0))


def _version(text: str) -> tuple[int, ...]:
    return tuple(int(part) for part in re.findall(r"\d+", text))
