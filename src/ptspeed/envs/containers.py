"""Container images of the environments: build or pull one, describe it in a manifest, and
run a cell in it with docker or podman.

An image is built from ``docker/Dockerfile`` with the arguments of one environment (its lock
file, Python and base image), or pulled from a registry by the environment's ``container``
reference. Either way the engine is asked what it holds, and the answer (name, local id,
digest, labels) is written as a JSON manifest that the cells of the environment read: they
run the image by its id, and the name and digest land in every record through
``PTSPEED_CONTAINER_IMAGE`` and ``PTSPEED_CONTAINER_DIGEST``.

This module needs no torch and no Snakemake.
"""

from __future__ import annotations

import collections
import configparser
import hashlib
import json
import os
import re
import shlex
import shutil
import subprocess
import sys
import tempfile
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path

from ptspeed.cell.provenance import (
    CONTAINER_DIGEST_VARIABLE,
    CONTAINER_IMAGE_VARIABLE,
    GIT_COMMIT_VARIABLE,
)
from ptspeed.envs.locks import locked_version
from ptspeed.envs.venvs import find_uv
from ptspeed.errors import ConfigError, ContainerError
from ptspeed.launch.gpus import COUNT_VARIABLE, VISIBLE_DEVICES_VARIABLE
from ptspeed.plan.settings import Containers, Environment, Settings

ENGINES = ("docker", "podman")
RUNTIMES = ("apptainer", *ENGINES)
IMAGE_SOURCES = ("build", "pull")
RECIPE = Path("docker/Dockerfile")
INSTALL_SCRIPT = Path("docker/install.sh")
UV_REQUIREMENTS = Path("docker/uv.txt")
# What the recipe copies besides the environment's lock (stage_context).
RECIPE_FILES = (INSTALL_SCRIPT, UV_REQUIREMENTS)
# Where a podman build mounts the host's uv cache (docker/Dockerfile, ARG UV_CACHE_DIR).
HOST_UV_CACHE_TARGET = "/var/cache/uv-host"
CA_SECRET_ID = "ca_bundle"
# The site's package index (a mirror, often with a token in its URL) reaches a build as a
# secret file of NAME=value lines that docker/install.sh reads, never as a build argument: a
# build argument stays in the image's history (docker history) and, in Apptainer, in the
# definition file the SIF keeps.
INDEX_SECRET_ID = "package_index"
INDEX_VARIABLES = (
    "PIP_INDEX_URL", "PIP_EXTRA_INDEX_URL", "PIP_TRUSTED_HOST",
    "UV_DEFAULT_INDEX", "UV_INDEX", "UV_INDEX_URL", "UV_EXTRA_INDEX_URL", "UV_INSECURE_HOST",
)  # fmt: skip
# pip's settings of the same names in its configuration files (pip.conf's [global] section).
PIP_CONFIG_KEYS = {"index-url": "PIP_INDEX_URL", "extra-index-url": "PIP_EXTRA_INDEX_URL",
                   "trusted-host": "PIP_TRUSTED_HOST"}  # fmt: skip
# Variables of the caller that a cell in a container must see: the GPU choice made by SLURM or
# the user, the GPU lock directory shared by the cells of a node, the commit of the code.
PASSED_VARIABLES = (VISIBLE_DEVICES_VARIABLE, COUNT_VARIABLE, GIT_COMMIT_VARIABLE)
LOCKED_PACKAGES = ("torch", "torchvision", "transformers")
DIGEST = re.compile(r"@(sha256:[0-9a-f]{64})$")
# A library:// reference pins its image by a tag naming the SIF's hash.
LIBRARY_DIGEST = re.compile(r":(sha256\.[0-9a-f]{64})$")
# Where an image a site brings may come from besides a local file (environments.<env>.image).
BROUGHT_SCHEMES = ("docker", "oras", "library")
BROUGHT_FORMS = (
    "a .sif path, docker://name@sha256:…, oras://name@sha256:… or library://path:sha256.…"
)
ENGINE_TIMEOUT_S = 120
# What a failed build's output says of its cause, in the words of Apptainer, podman, docker,
# apt, pip and uv (read from their last FAILURE_TAIL_LINES lines), and what to do about it.
FAILURE_TAIL_LINES = 400
FAILURE_LINE_CHARS = 200
FAILURE_CAUSES = (
    (
        "fakeroot",
        re.compile(r"fakeroot|/etc/sub[ug]id|newuidmap|newgidmap", re.IGNORECASE),
        "--fakeroot is not set up for you (a subuid range): ask the site for one (`apptainer "
        "config fakeroot --add $USER`), build where docker or podman runs, or set "
        "containers.images: pull",
    ),
    (
        "space",
        re.compile(r"no space left on device|disk quota exceeded", re.IGNORECASE),
        "no room where it writes: set APPTAINER_TMPDIR and APPTAINER_CACHEDIR (podman: its "
        "storage) to a disk with room, under your quota",
    ),
    (
        "network",
        re.compile(
            r"could not resolve|name resolution|name or service not known|no such host"
            r"|network is unreachable"
            r"|no route to host|connection (?:refused|reset|timed out)|failed to establish a new "
            r"connection|tls handshake|i/o timeout|failed to fetch",
            re.IGNORECASE,
        ),
        "the build cannot reach the network: build on a node that can, set HTTPS_PROXY, or name "
        "the site's package mirror (PIP_INDEX_URL, UV_INDEX_URL, UV_DEFAULT_INDEX)",
    ),
)
ENGINE_PROBE_TIMEOUT_S = 30
# `podman info`, answering with the user namespace's ID maps.
PODMAN_PROBE = ("info", "--format", "{{json .Host.IDMappings}}")


@dataclass(frozen=True)
class BuildSpec:
    """What one environment's image is built from."""

    env: str
    requirements: Path
    python: str
    tag: str
    base_image: str = ""
    ca_bundle: Path | None = None
    # The host's uv cache, mounted into the build so that its wheels are not downloaded again.
    uv_cache: Path | None = None
    # The site's package index settings (write_index_secret), a build secret.
    package_index: Path | None = None

    def build_arguments(self) -> dict[str, str]:
        text = self.requirements.read_text(encoding="utf-8")
        versions = locked_versions(text)
        arguments = {
            "ENV_NAME": self.env,
            "PYTHON_VERSION": self.python,
            "TORCH_VERSION": versions.get("torch", ""),
            "TORCHVISION_VERSION": versions.get("torchvision", ""),
            "TRANSFORMERS_VERSION": versions.get("transformers", ""),
            "LOCK_SHA256": hashlib.sha256(text.encode()).hexdigest(),
        }
        if self.base_image:
            arguments["BASE_IMAGE"] = self.base_image
        return arguments


@dataclass(frozen=True)
class ImageManifest:
    """An image as the engine holds it: what the cells of ``env`` run."""

    env: str
    image: str
    id: str
    digest: str
    engine: str
    source: str
    base_image: str = ""
    labels: dict[str, str] = field(default_factory=dict)

    def write(self, path: Path) -> None:
        path.parent.mkdir(parents=True, exist_ok=True)
        partial = path.with_name(f".{path.name}.{os.getpid()}.tmp")
        partial.write_text(json.dumps(asdict(self), indent=2, sort_keys=True) + "\n")
        partial.replace(path)

    @classmethod
    def read(cls, path: Path) -> ImageManifest:
        return cls(**json.loads(Path(path).read_text(encoding="utf-8")))


def forget_pruned_image(manifest_path: Path, engine: str) -> str:
    """Remove the manifest at ``manifest_path`` when ``engine`` no longer has its image (an
    ``image prune`` or ``rmi`` since it was built), so that the workflow builds it again instead
    of running cells in an image that is gone. Returns a one-line notice, '' when the manifest
    is absent, unreadable, its image present, or the engine not installed here."""
    if shutil.which(engine) is None:
        return ""
    try:
        manifest = ImageManifest.read(manifest_path)
    except (OSError, ValueError, TypeError):
        return ""
    try:
        subprocess.run(
            [engine, "image", "inspect", "--format", "{{.Id}}", manifest.id],
            check=True, capture_output=True, timeout=ENGINE_TIMEOUT_S,
        )  # fmt: skip
    except subprocess.CalledProcessError:
        manifest_path.unlink(missing_ok=True)
        return (
            f"{manifest_path} names image {manifest.id} ({manifest.image}), which {engine} "
            "no longer has (pruned?): building it again"
        )
    except (OSError, subprocess.TimeoutExpired):
        return ""
    return ""


def engine_for_images(containers: Containers, usable: Callable[[str], bool]) -> str:
    """The engine that builds or pulls images: the runtime itself; for Apptainer the builder,
    or with builder auto the first usable of docker and podman (docker when neither is)."""
    if containers.runtime in ENGINES:
        return containers.runtime
    if containers.builder in ENGINES:
        return containers.builder
    return next((engine for engine in ENGINES if usable(engine)), ENGINES[0])


def engine_usable(engine: str) -> bool:
    """Whether ``engine`` can build here: on PATH, and it answers: docker's daemon (a docker
    client without a daemon is common on clusters); podman's own check (`podman info`), whose
    user namespace maps more than one ID: rootless podman without a subuid range (usual on
    login nodes) answers `podman info`, but maps the user alone and cannot unpack a CUDA base,
    whose files belong to other users."""
    if shutil.which(engine) is None:
        return False
    probe = ["version", "--format", "{{.Server.Version}}"] if engine == "docker" else PODMAN_PROBE
    try:
        answer = subprocess.run(
            [engine, *probe],
            capture_output=True, text=True, check=False, timeout=ENGINE_PROBE_TIMEOUT_S,
        )  # fmt: skip
    except subprocess.TimeoutExpired:
        return False
    if answer.returncode != 0:
        return False
    return engine == "docker" or mapped_ids(answer.stdout) != 1


def mapped_ids(id_mappings: str) -> int | None:
    """How many user IDs podman's user namespace maps (``podman info``'s Host.IDMappings as
    JSON); None where it has none (rootful podman shares the host's IDs) or says nothing."""
    try:
        uidmap = (json.loads(id_mappings) or {}).get("uidmap") or []
        return sum(int(entry["size"]) for entry in uidmap) or None
    except (ValueError, TypeError, KeyError, AttributeError):
        return None


def host_uv_cache() -> Path:
    """The host's uv cache (``uv cache dir``; uv's default where uv is not installed)."""
    uv = find_uv()
    if uv:
        answer = subprocess.run(
            [uv, "cache", "dir"], capture_output=True, text=True, check=False, timeout=30
        )
        if answer.returncode == 0 and answer.stdout.strip():
            return Path(answer.stdout.strip())
    if os.environ.get("UV_CACHE_DIR"):
        return Path(os.environ["UV_CACHE_DIR"])
    return Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache") / "uv"


def is_registry_reference(uri: str) -> bool:
    """Whether docker and podman can pull or name ``uri``: docker:// or no scheme, not a file."""
    scheme, separator, _ = uri.partition("://")
    if separator and scheme != "docker":
        return False
    return not uri.endswith((".sif", ".simg"))


def check_container_config(settings: Settings, in_apptainer: bool = False) -> None:
    """What the schema cannot say about containers; raises :class:`ConfigError`.
    ``in_apptainer``: the run is under --use-singularity / --sdm apptainer."""
    containers = settings.containers
    bundle = containers.ca_bundle
    if bundle and not Path(bundle).expanduser().is_file():
        raise ConfigError(f"containers.ca_bundle: {bundle!r} is not a file")
    if containers.pushes and not containers.registry:
        raise ConfigError(
            "containers.push: true needs containers.registry (e.g. registry.example.org/ptspeed)"
        )
    for name, spec in settings.environments.items():
        if spec.kind == "image":
            _check_brought_image(name, spec.image, containers, in_apptainer)
            continue
        if spec.kind == "container" and not runs_in_image(spec, containers, in_apptainer):
            raise ConfigError(
                f"environments.{name}: kind container with containers.runtime apptainer runs "
                "only under --use-singularity (--sdm apptainer)"
            )
        if runs_in_image(spec, containers, in_apptainer):
            _check_image_source(name, spec, containers)


def runs_in_image(spec: Environment, containers: Containers, in_apptainer: bool) -> bool:
    """Whether an environment's cells run in its image: kind container under its runtime, or
    any environment but the host under Apptainer (kind image only there)."""
    if containers.runtime == "apptainer":
        return in_apptainer and spec.kind != "host"
    return spec.kind == "container"


def is_local_image(reference: str) -> bool:
    """Whether a brought image is a file on this machine (no scheme), not a registry's."""
    return "://" not in reference


def brought_digest(reference: str) -> str:
    """The digest a brought image's reference pins (``sha256:…``, or a library's
    ``sha256.…``); '' for a local file or a reference without one."""
    if reference.startswith("library://"):
        match = LIBRARY_DIGEST.search(reference)
        return match.group(1) if match else ""
    return "" if is_local_image(reference) else digest_of(reference)


def _check_brought_image(
    name: str, reference: str, containers: Containers, in_apptainer: bool
) -> None:
    """An image a site brings runs as is under Apptainer; a registry's pinned by its digest,
    so that every record of the run names one image."""
    key = f"environments.{name}.image"
    if containers.runtime != "apptainer" or not in_apptainer:
        raise ConfigError(
            f"environments.{name}: kind image runs only under --use-singularity (--sdm "
            "apptainer) with containers.runtime apptainer"
        )
    if is_local_image(reference):
        if not Path(reference).expanduser().is_file():
            raise ConfigError(f"{key}: {reference!r} is not a file (expected {BROUGHT_FORMS})")
        return
    scheme = reference.partition("://")[0]
    if scheme not in BROUGHT_SCHEMES or not brought_digest(reference):
        raise ConfigError(
            f"{key}: {reference!r} is not pinned: expected {BROUGHT_FORMS} (the digest of the "
            "image the site pulled, e.g. `apptainer inspect` or the registry's page)"
        )


def _check_image_source(name: str, spec: Environment, containers: Containers) -> None:
    uri = spec.container
    if uri and not is_registry_reference(uri):
        raise ConfigError(
            f"environments.{name}.container: {uri!r} is not an image reference "
            "(docker://name[:tag][@sha256:…] or name[:tag])"
        )
    if containers.images == "build" and not (spec.requirements and spec.python):
        raise ConfigError(
            f"environments.{name}: containers.images build needs requirements and python "
            "(the lock and Python the image is built with)"
        )
    if containers.images == "pull" and not digest_of(uri):
        registry = containers.registry or "registry.example.org/ptspeed"
        raise ConfigError(
            f"environments.{name}.container: containers.images pull takes an image pinned by "
            f"digest, e.g. docker://{registry}/{name}@sha256:… (a push prints them: "
            f"config/README.md, containers.push); got {uri or 'none'!r}"
        )


def strip_scheme(uri: str) -> str:
    """``docker://ghcr.io/x/y:t`` -> ``ghcr.io/x/y:t`` (engines take no scheme)."""
    return uri.split("://", 1)[1] if "://" in uri else uri


def digest_of(reference: str) -> str:
    """The ``sha256:…`` a reference is pinned to, '' for a tag or a path."""
    match = DIGEST.search(reference)
    return match.group(1) if match else ""


def without_tag(reference: str) -> tuple[str, str]:
    """(``name@sha256:…``, tag) of a reference pinned by digest, ``name:tag@sha256:…`` or not:
    Apptainer 1.3 refuses a reference with both ("both a tag and digest are currently not
    supported"). A reference without a digest is kept whole, with its tag."""
    name, digest = DIGEST.sub("", reference), digest_of(reference)
    repository, colon, tag = name.rpartition(":")
    if not colon or "/" in tag:  # no tag, or the colon of a registry's port
        repository, tag = name, ""
    return (f"{repository}@{digest}" if digest else name), tag


def build_tag(uri: str) -> str:
    """The name a built image gets: the environment's reference without scheme or digest."""
    return DIGEST.sub("", strip_scheme(uri))


def locked_versions(requirements: str) -> dict[str, str]:
    """Versions of torch, torchvision and transformers pinned by a lock file's text (by
    ``==`` or a wheel's URL: ``2.0.1+cu118``); a package the lock does not pin is left out."""
    pinned = {package: locked_version(requirements, package) for package in LOCKED_PACKAGES}
    return {package: version for package, version in pinned.items() if version}


def build_command(engine: str, spec: BuildSpec, context: Path, recipe: Path) -> list[str]:
    """The ``docker build`` / ``podman build`` of ``spec`` from a staged ``context``."""
    command = [engine, "build", "--network", "host", "-f", str(recipe), "-t", spec.tag]
    if engine == "podman":
        # Docker's image format keeps SHELL (the OCI format drops it).
        command += ["--format", "docker"]
    arguments = spec.build_arguments()
    if engine == "podman" and spec.uv_cache is not None:
        # Docker cannot mount a host directory into a build: it keeps its own cache mount.
        command += ["--volume", f"{spec.uv_cache}:{HOST_UV_CACHE_TARGET}"]
        arguments["UV_CACHE_DIR"] = HOST_UV_CACHE_TARGET
    for name, value in arguments.items():
        command += ["--build-arg", f"{name}={value}"]
    if spec.ca_bundle is not None:
        command += ["--secret", f"id={CA_SECRET_ID},src={spec.ca_bundle}"]
    if spec.package_index is not None:
        command += ["--secret", f"id={INDEX_SECRET_ID},src={spec.package_index}"]
    return [*command, str(context)]


def package_index_settings(environ: Mapping[str, str] = os.environ) -> dict[str, str]:
    """The site's pip and uv index settings: its variables (INDEX_VARIABLES), and pip's
    configuration files' where no variable sets them (PIP_CONFIG_FILE, else the user's and
    the system's pip.conf)."""
    settings = {name: environ[name] for name in INDEX_VARIABLES if environ.get(name)}
    home = Path(environ.get("HOME") or Path.home())
    files = [environ.get("PIP_CONFIG_FILE", ""), "/etc/pip.conf",
             str(home / ".pip/pip.conf"), str(home / ".config/pip/pip.conf")]  # fmt: skip
    parser = configparser.ConfigParser()
    parser.read([f for f in files if f], encoding="utf-8")  # later files win, as in pip
    for key, name in PIP_CONFIG_KEYS.items():
        value = parser.get("global", key, fallback="").strip()
        if value and name not in settings:
            settings[name] = " ".join(value.split())
    return settings


def write_index_secret(settings: Mapping[str, str], directory: Path) -> Path | None:
    """The settings as a file only its owner reads (NAME='value' lines), None without any."""
    if not settings:
        return None
    secret = directory / INDEX_SECRET_ID
    secret.touch(mode=0o600)
    lines = (f"{name}={shlex.quote(value)}\n" for name, value in settings.items())
    secret.write_text("".join(lines), encoding="utf-8")
    return secret


def stage_context(spec: BuildSpec, project: Path, destination: Path) -> Path:
    """A build context of only what the recipe copies (the project holds gigabytes of venvs)."""
    sources = {relative: project / relative for relative in RECIPE_FILES}
    sources[Path("envs") / f"{spec.env}.txt"] = spec.requirements
    for relative, source in sources.items():
        target = destination / relative
        target.parent.mkdir(parents=True, exist_ok=True)
        shutil.copy2(source, target)
    return destination


def build_image(engine: str, spec: BuildSpec, project: Path) -> ImageManifest:
    """Build ``spec`` with ``engine`` (output streams to this process's stdout/stderr)."""
    if spec.uv_cache is not None:
        spec.uv_cache.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(prefix="ptspeed-image-") as staging:
        context = stage_context(spec, project, Path(staging))
        _check_call(build_command(engine, spec, context, project / RECIPE), timeout=None)
    return inspect_image(engine, spec.env, spec.tag, "build", spec.base_image)


def push_image(engine: str, manifest: ImageManifest, registry: str) -> str:
    """Push the built image to ``registry`` and return its reference pinned by digest, the
    form ``containers.images: pull`` takes."""
    name = f"{registry.rstrip('/')}/{manifest.env}"
    tag = f"{name}:{manifest.labels.get('io.ptspeed.lock-sha256', 'latest')[:16] or 'latest'}"
    _check_call([engine, "tag", manifest.id, tag], timeout=ENGINE_TIMEOUT_S)
    if engine == "podman":
        with tempfile.TemporaryDirectory(prefix="ptspeed-push-") as scratch:
            digest_file = Path(scratch) / "digest"
            _check_call([engine, "push", "--digestfile", str(digest_file), tag], timeout=None)
            digest = digest_file.read_text(encoding="utf-8").strip()
    else:
        _check_call([engine, "push", tag], timeout=None)
        digest = inspect_image(engine, manifest.env, tag, "push").digest
    return f"{name}@{digest}"


def pull_image(engine: str, env: str, uri: str) -> ImageManifest:
    reference = strip_scheme(uri)
    _check_call([engine, "pull", reference], timeout=None)
    return inspect_image(engine, env, reference, "pull")


def inspect_image(
    engine: str, env: str, reference: str, source: str, base_image: str = ""
) -> ImageManifest:
    """Ask the engine for the image's id, digest and labels."""
    output = _output([engine, "image", "inspect", reference])
    try:
        details = json.loads(output)[0]
    except (ValueError, IndexError, KeyError) as error:
        raise ContainerError(f"{engine} image inspect {reference}: unreadable answer") from error
    labels = (details.get("Config") or {}).get("Labels") or details.get("Labels") or {}
    image_id = details["Id"] if details["Id"].startswith("sha256:") else f"sha256:{details['Id']}"
    return ImageManifest(
        env=env,
        image=reference,
        id=image_id,
        # A local build has no registry digest, and the manifest digest podman keeps for it
        # changes whenever the same image is saved and loaded again (as rule sif does): its
        # id, the digest of its configuration, names it exactly and for good.
        digest=image_id if source == "build" else image_digest(details, reference),
        engine=engine,
        source=source,
        base_image=base_image or labels.get("org.opencontainers.image.base.name", ""),
        labels=dict(labels),
    )


def image_size(engine: str, reference: str) -> int:
    """The image's size in bytes as the engine reports it (its layers, uncompressed)."""
    answer = _output([engine, "image", "inspect", "--format", "{{.Size}}", reference]).strip()
    try:
        return int(answer)
    except ValueError:
        raise ContainerError(f"{engine} image inspect {reference}: size {answer!r}") from None


def image_digest(details: Mapping[str, object], reference: str) -> str:
    """The manifest digest: the one the reference pins, a registry's, podman's own, else the id.

    Docker knows a manifest digest only for an image pulled from or pushed to a registry; a
    local build is then named by its id (the digest of its config), which is as exact.
    """
    pinned = digest_of(reference)
    if pinned:
        return pinned
    repo_digests = details.get("RepoDigests") or []
    for repo_digest in repo_digests if isinstance(repo_digests, list) else []:
        if digest_of(str(repo_digest)):
            return digest_of(str(repo_digest))
    own = details.get("Digest")
    if isinstance(own, str) and own.startswith("sha256:"):
        return own
    image_id = str(details.get("Id", ""))
    return image_id if image_id.startswith("sha256:") else f"sha256:{image_id}"


def run_command(
    engine: str,
    manifest: ImageManifest,
    command: Sequence[str],
    *,
    gpus: bool,
    mounts: Iterable[Path],
    workdir: Path,
    environment: Mapping[str, str],
) -> list[str]:
    """``docker run`` / ``podman run`` of ``command`` in the manifest's image.

    The caller's user owns what the cell writes (``--user``, or podman's ``keep-id`` when
    rootless); no network (cells download nothing); the host's IPC namespace, whose shared
    memory DataLoader workers need (Docker's default 64 MB is too small).
    """
    run = [engine, "run", "--rm", "--init", "--network", "none", "--ipc", "host"]
    if gpus:
        run += ["--gpus", "all"] if engine == "docker" else ["--device", "nvidia.com/gpu=all"]
    if engine == "podman" and os.geteuid() != 0:
        run += ["--userns", "keep-id"]
    else:
        run += ["--user", f"{os.getuid()}:{os.getgid()}"]
    for path in _outermost(mounts):
        run += ["--volume", f"{path}:{path}"]
    run += ["--workdir", str(workdir)]
    variables = {
        "HOME": "/tmp",
        CONTAINER_IMAGE_VARIABLE: manifest.image,
        CONTAINER_DIGEST_VARIABLE: manifest.digest,
        **environment,
    }
    for name, value in variables.items():
        run += ["--env", f"{name}={value}"]
    return [*run, manifest.id, *command]


def passed_environment(environ: Mapping[str, str]) -> dict[str, str]:
    """The caller's variables that the cell in the container must see, where set."""
    return {name: environ[name] for name in PASSED_VARIABLES if environ.get(name)}


def _outermost(paths: Iterable[Path]) -> list[Path]:
    """Resolved, without duplicates and without paths inside another one."""
    resolved = sorted({Path(p).resolve() for p in paths}, key=lambda p: len(p.parts))
    kept: list[Path] = []
    for path in resolved:
        if not any(path.is_relative_to(parent) for parent in kept):
            kept.append(path)
    return kept


def failure_cause(output: Iterable[str]) -> str:
    """Why a build failed, where its output says: fakeroot, space or network, with what to do
    and the line that tells it ('' where none does). The last telling line wins."""
    for line in reversed(list(output)):
        for kind, pattern, advice in FAILURE_CAUSES:
            if pattern.search(line):
                return f"{kind}: {advice} ({line.strip()[:FAILURE_LINE_CHARS]})"
    return ""


def run_streamed(command: list[str]) -> None:
    """Run ``command`` with its output passed on to this process's stdout (the rule's log) as
    it comes; a failure raises :class:`ContainerError` naming its cause (failure_cause)."""
    tail: collections.deque[str] = collections.deque(maxlen=FAILURE_TAIL_LINES)
    try:
        with subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                              text=True, errors="replace") as process:  # fmt: skip
            assert process.stdout is not None
            for line in process.stdout:
                sys.stdout.write(line)
                tail.append(line)
            returncode = process.wait()
    except FileNotFoundError:
        raise ContainerError(f"{command[0]}: not found on PATH") from None
    sys.stdout.flush()
    if returncode != 0:
        cause = failure_cause(tail)
        raise ContainerError(
            f"{command[0]} {command[1]} failed (exit {returncode})"
            + (f": {cause}" if cause else "")
        )


def _check_call(command: list[str], timeout: float | None) -> None:
    if timeout is None:
        run_streamed(command)
        return
    try:
        subprocess.run(command, check=True, timeout=timeout)
    except FileNotFoundError:
        raise ContainerError(f"{command[0]}: not found on PATH") from None
    except subprocess.CalledProcessError as error:
        raise ContainerError(
            f"{command[0]} {command[1]} failed (exit {error.returncode})"
        ) from None
    except subprocess.TimeoutExpired:
        raise ContainerError(f"{command[0]} {command[1]}: no answer in {timeout} s") from None


def _output(command: list[str]) -> str:
    try:
        done = subprocess.run(
            command, check=True, capture_output=True, text=True, timeout=ENGINE_TIMEOUT_S
        )
    except FileNotFoundError:
        raise ContainerError(f"{command[0]}: not found on PATH") from None
    except subprocess.CalledProcessError as error:
        detail = error.stderr.strip().splitlines()[-1:] or [f"exit {error.returncode}"]
        raise ContainerError(f"{' '.join(command[:3])}: {detail[0]}") from None
    except subprocess.TimeoutExpired:
        raise ContainerError(
            f"{' '.join(command[:3])}: no answer in {ENGINE_TIMEOUT_S} s"
        ) from None
    return done.stdout
