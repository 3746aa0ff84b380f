"""Container images of the environments: what one is built from, and the manifest that
describes it.

An image is built from ``docker/Dockerfile`` with the arguments of one environment (its lock
file, Python and base image: :class:`BuildSpec`, staged by :func:`stage_context` with the
site's package index as a build secret), or pulled from a registry by the environment's
``container`` reference. Either way the engine is asked what it holds
(:mod:`ptspeed.envs.engine_calls`), and the answer (name, local id, digest, labels) is written
as a JSON manifest (:class:`ImageManifest`) that the cells of the environment read: they run
the image by its id, and the name and digest land in every record through
``PTSPEED_CONTAINER_IMAGE`` and ``PTSPEED_CONTAINER_DIGEST``. The references themselves:
:mod:`ptspeed.envs.image_references`; the config's ``containers`` section:
:mod:`ptspeed.envs.container_config`.

This module needs no torch and no Snakemake.
"""

from __future__ import annotations

import configparser
import hashlib
import json
import os
import shlex
import shutil
import subprocess
from collections.abc import Mapping
from dataclasses import asdict, dataclass, field
from pathlib import Path

from ptspeed.envs.locks import locked_version
from ptspeed.envs.venvs import find_uv

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
LOCKED_PACKAGES = ("torch", "torchvision", "transformers")


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


def locked_versions(requirements: str) -> dict[str, str]:
    """Versions of torch, torchvision and transformers pinned by a lock file's text (by
    ``==`` or a wheel's URL: ``2.0.1+cu118``); a package the lock does not pin is left out."""
    pinned = {package: locked_version(requirements, package) for package in LOCKED_PACKAGES}
    return {package: version for package, version in pinned.items() if version}


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
