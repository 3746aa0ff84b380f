"""The config's ``containers`` section and the environments that run in images: its settings
as the workflow reads them, the engine that makes the images, and what the schema cannot say
(pinned references, a build's inputs, a runtime that can run the environment's kind).

This module needs no torch and no Snakemake, and asks no engine anything.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

from ptspeed.envs.containers import ENGINES
from ptspeed.envs.image_references import (
    BROUGHT_FORMS,
    BROUGHT_SCHEMES,
    brought_digest,
    digest_of,
    is_local_image,
    is_registry_reference,
)
from ptspeed.errors import ConfigError
from ptspeed.plan.settings import Containers, Environment, Settings


def engine_for_images(containers: Containers, usable: Callable[[str], bool]) -> str:
    """The engine that builds or pulls images: the runtime itself; for Apptainer the builder,
    or with builder auto the first usable of docker and podman (docker when neither is)."""
    if containers.runtime in ENGINES:
        return containers.runtime
    if containers.builder in ENGINES:
        return containers.builder
    return next((engine for engine in ENGINES if usable(engine)), ENGINES[0])


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
