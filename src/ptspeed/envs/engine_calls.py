"""What ptspeed asks docker and podman (and the runner of Apptainer's builds): the command
lines that build, push, pull, inspect and run an image, whether an engine can run here, and
the running of those commands, a failed build's output read for its cause.

This module needs no torch and no Snakemake.
"""

from __future__ import annotations

import collections
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
from collections.abc import Iterable, Mapping, Sequence
from pathlib import Path

from ptspeed.cell.provenance import (
    CONTAINER_DIGEST_VARIABLE,
    CONTAINER_IMAGE_VARIABLE,
    GIT_COMMIT_VARIABLE,
)
from ptspeed.envs.containers import (
    CA_SECRET_ID,
    HOST_UV_CACHE_TARGET,
    INDEX_SECRET_ID,
    RECIPE,
    BuildSpec,
    ImageManifest,
    stage_context,
)
from ptspeed.envs.image_references import digest_of, strip_scheme
from ptspeed.errors import ContainerError
from ptspeed.launch.gpus import COUNT_VARIABLE, VISIBLE_DEVICES_VARIABLE

# Variables of the caller that a cell in a container must see: the GPU choice made by SLURM or
# the user, the GPU lock directory shared by the cells of a node, the commit of the code.
PASSED_VARIABLES = (VISIBLE_DEVICES_VARIABLE, COUNT_VARIABLE, GIT_COMMIT_VARIABLE)
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
