"""Image references as the environments and a site's own images give them: the digest a
reference pins, its scheme, name and tag, and which forms docker, podman and Apptainer take.

Pure (the standard library only): nothing here asks an engine.
"""

from __future__ import annotations

import re

DIGEST = re.compile(r"@(sha256:[0-9a-f]{64})$")
# A library:// reference pins its image by a tag naming the SIF's hash.
LIBRARY_DIGEST = re.compile(r":(sha256\.[0-9a-f]{64})$")
# Where an image a site brings may come from besides a local file (environments.<env>.image).
BROUGHT_SCHEMES = ("docker", "oras", "library")
BROUGHT_FORMS = (
    "a .sif path, docker://name@sha256:…, oras://name@sha256:… or library://path:sha256.…"
)


def is_registry_reference(uri: str) -> bool:
    """Whether docker and podman can pull or name ``uri``: docker:// or no scheme, not a file."""
    scheme, separator, _ = uri.partition("://")
    if separator and scheme != "docker":
        return False
    return not uri.endswith((".sif", ".simg"))


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
