"""The config's ``containers`` section and the environments that run in images: its settings
as the workflow reads them, the engine that makes the images, and what the schema cannot say
(pinned references, a build's inputs, a runtime that can run the environment's kind).

This module needs no torch and no Snakemake, and asks no engine anything.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

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


def container_settings(config: Mapping[str, object]) -> dict[str, Any]:
    """The config's ``containers`` section, which ptspeed.plan.config fills with the schema's
    defaults."""
    given = config.get("containers")
    if not isinstance(given, Mapping):
        raise ConfigError("containers: missing or not a mapping")
    settings = dict(given)
    # --config passes nested values as text.
    settings["push"] = settings["push"] in (True, "true")
    return settings


def engine_for_images(settings: Mapping[str, Any], usable: Callable[[str], bool]) -> str:
    """The engine that builds or pulls images: the runtime itself; for Apptainer the builder,
    or with builder auto the first usable of docker and podman (docker when neither is)."""
    if settings["runtime"] in ENGINES:
        return settings["runtime"]
    if settings["builder"] in ENGINES:
        return settings["builder"]
    return next((engine for engine in ENGINES if usable(engine)), ENGINES[0])


def check_container_config(config: Mapping[str, object], in_apptainer: bool = False) -> None:
    """What the schema cannot say about containers; raises :class:`ConfigError`.
    ``in_apptainer``: the run is under --use-singularity / --sdm apptainer."""
    settings = container_settings(config)
    bundle = settings["ca_bundle"]
    if bundle and not Path(bundle).expanduser().is_file():
        raise ConfigError(f"containers.ca_bundle: {bundle!r} is not a file")
    if settings["push"] and not settings["registry"]:
        raise ConfigError(
            "containers.push: true needs containers.registry (e.g. registry.example.org/ptspeed)"
        )
    environments = config["environments"]
    if not isinstance(environments, Mapping):
        raise ConfigError("environments: not a mapping")
    for name, spec in environments.items():
        if spec["kind"] == "image":
            _check_brought_image(name, spec.get("image", ""), settings, in_apptainer)
            continue
        if spec["kind"] == "container" and not runs_in_image(spec, settings, in_apptainer):
            raise ConfigError(
                f"environments.{name}: kind container with containers.runtime apptainer runs "
                "only under --use-singularity (--sdm apptainer)"
            )
        if runs_in_image(spec, settings, in_apptainer):
            _check_image_source(name, spec, settings)


def runs_in_image(spec: Mapping[str, Any], settings: Mapping[str, Any], in_apptainer: bool) -> bool:
    """Whether an environment's cells run in its image: kind container under its runtime, or
    any environment but the host under Apptainer (kind image only there)."""
    if settings["runtime"] == "apptainer":
        return in_apptainer and spec["kind"] != "host"
    return spec["kind"] == "container"


def _check_brought_image(
    name: str, reference: str, settings: Mapping[str, Any], in_apptainer: bool
) -> None:
    """An image a site brings runs as is under Apptainer; a registry's pinned by its digest,
    so that every record of the run names one image."""
    key = f"environments.{name}.image"
    if settings["runtime"] != "apptainer" or not in_apptainer:
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


def _check_image_source(name: str, spec: Mapping[str, Any], settings: Mapping[str, Any]) -> None:
    uri = spec.get("container", "")
    if uri and not is_registry_reference(uri):
        raise ConfigError(
            f"environments.{name}.container: {uri!r} is not an image reference "
            "(docker://name[:tag][@sha256:…] or name[:tag])"
        )
    if settings["images"] == "build" and not (spec.get("requirements") and spec.get("python")):
        raise ConfigError(
            f"environments.{name}: containers.images build needs requirements and python "
            "(the lock and Python the image is built with)"
        )
    if settings["images"] == "pull" and not digest_of(uri):
        registry = settings["registry"] or "registry.example.org/ptspeed"
        raise ConfigError(
            f"environments.{name}.container: containers.images pull takes an image pinned by "
            f"digest, e.g. docker://{registry}/{name}@sha256:… (a push prints them: "
            f"config/README.md, containers.push); got {uri or 'none'!r}"
        )
