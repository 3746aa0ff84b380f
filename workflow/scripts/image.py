"""Build or pull one environment's container image and write its manifest; make an Apptainer
image of it.

    python workflow/scripts/image.py build --env torch-2.0 --engine podman \\
        --requirements envs/torch-2.0.txt --python 3.10 --tag localhost/ptspeed/torch-2.0:latest \\
        [--base-image IMAGE] [--ca-bundle FILE] [--push-to REGISTRY] [--image-dir DIR] \\
        --manifest results/images/torch-2.0.json
    python workflow/scripts/image.py pull --env torch-2.0 --engine podman \\
        --uri docker://registry.example.org/ptspeed/torch-2.0@sha256:... \\
        --manifest results/images/torch-2.0.json
    python workflow/scripts/image.py sif --env torch-2.0 --source image|definition|registry \\
        [--engine podman --manifest M.json | --uri REFERENCE] --requirements envs/torch-2.0.txt \\
        --python 3.10 [--base-image IMAGE] [--image-dir DIR] \\
        --sif results/images/torch-2.0.sif --digest results/images/torch-2.0.sif.digest

With --image-dir, images are kept there under a name made of the environment and the hash of
what they are built from (ptspeed.envs.apptainer.image_key): a build or a sif whose twin is already
there reuses it (the sif by a symbolic link) instead of building.
"""

import argparse
import functools
import os
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

from ptspeed.cell.files import exclusive_lock
from ptspeed.entrypoint import one_line_errors
from ptspeed.envs.apptainer import (
    APPTAINER_COMMANDS,
    SifPlan,
    apptainer_command,
    image_key,
    saves_archive,
    sif_archive,
    sif_commands,
    sif_digest,
)
from ptspeed.envs.build_space import SIF_LOCK, check_build_space, check_room_for_sif
from ptspeed.envs.containers import (
    ENGINES,
    BuildSpec,
    ImageManifest,
    host_uv_cache,
    package_index_settings,
    write_index_secret,
)
from ptspeed.envs.engine_calls import build_image, image_size, pull_image, push_image, run_streamed
from ptspeed.envs.image_references import build_tag
from ptspeed.errors import ContainerError

PROJECT = Path(__file__).resolve().parents[2]
SIF_SOURCES = ("image", "definition", "registry")


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    actions = parser.add_subparsers(dest="action", required=True)
    build = actions.add_parser("build", help="build from docker/Dockerfile")
    pull = actions.add_parser("pull", help="pull from a registry")
    sif = actions.add_parser("sif", help="make an Apptainer image")
    for action in (build, pull, sif):
        action.add_argument("--env", required=True, help="environment name, e.g. torch-2.0")
    for action in (build, pull):
        action.add_argument("--engine", required=True, choices=ENGINES)
        action.add_argument("--manifest", required=True, type=Path, help="JSON to write")
    for action in (pull, sif):
        action.add_argument("--uri", default="", help="image reference, pinned by digest")
    build.add_argument("--tag", required=True, help="name of the built image")
    build.add_argument("--push-to", default="", help="registry to push the built image to")
    sif.add_argument("--source", required=True, choices=SIF_SOURCES, help="what it is made of")
    sif.add_argument("--engine", choices=ENGINES, help="take the image from this engine")
    sif.add_argument("--manifest", type=Path, help="the image's manifest (with --engine)")
    sif.add_argument("--sif", required=True, type=Path, help="Apptainer image to write")
    sif.add_argument("--digest", required=True, type=Path, help="file to write its digest to")
    for action in (build, sif):
        # Required but for a sif from the registry.
        action.add_argument("--requirements", required=action is build, type=Path,
                            help="hash-locked file")  # fmt: skip
        action.add_argument("--python", required=action is build, help="major.minor, e.g. 3.10")
        action.add_argument("--base-image", default="", help="base image ('' = the recipe's)")
        action.add_argument("--ca-bundle", type=Path, help="CA bundle for TLS during the build")
        action.add_argument("--image-dir", type=Path, help="shared directory of built images")
    return parser.parse_args(argv)


def spec_of(args: argparse.Namespace, tag: str) -> BuildSpec:
    return BuildSpec(
        env=args.env,
        requirements=args.requirements,
        python=args.python,
        tag=build_tag(tag),
        base_image=args.base_image,
        ca_bundle=args.ca_bundle,
        uv_cache=host_uv_cache(),
        # Written for this build alone, and gone after it (main's scratch directory).
        package_index=write_index_secret(package_index_settings(), args.scratch),
    )


def shared_path(args: argparse.Namespace, spec: BuildSpec, suffix: str) -> Path | None:
    """The image's file of this kind in the shared image directory, None without one."""
    if not args.image_dir:
        return None
    return args.image_dir / f"{args.env}-{image_key(spec, PROJECT)}{suffix}"


def build(args: argparse.Namespace) -> None:
    spec = spec_of(args, args.tag)
    shared = shared_path(args, spec, ".json")
    if shared and shared.is_file() and shared.with_suffix(".sif").is_file():
        print(f"reusing {shared} (its sif is there: nothing to build)", flush=True)
        ImageManifest.read(shared).write(args.manifest)
        return
    manifest = build_image(args.engine, spec, PROJECT)
    manifest.write(args.manifest)
    if shared:
        manifest.write(shared)
    if args.push_to:
        pinned = push_image(args.engine, manifest, args.push_to)
        print(f"pushed: set environments.{args.env}.container: docker://{pinned}", flush=True)
        args.manifest.with_name(f"{args.env}.pushed").write_text(f"docker://{pinned}\n")


def make_sif(args: argparse.Namespace) -> None:
    plan = SifPlan(args.source, args.engine, apptainer_command() or APPTAINER_COMMANDS[0])
    manifest = ImageManifest.read(args.manifest) if args.manifest else None
    spec = None
    if plan.source != "registry":
        spec = spec_of(args, manifest.image if manifest else f"localhost/ptspeed/{args.env}")
    shared = shared_path(args, spec, ".sif") if spec else None
    target = shared or args.sif
    target.parent.mkdir(parents=True, exist_ok=True)
    digest_file = target.with_name(f"{target.name}.digest")

    def made_by_another_checkout() -> bool:
        return bool(shared and shared.is_file() and digest_file.is_file())

    if not made_by_another_checkout():
        waiting = f"waiting for another conversion in {target.parent}"
        with exclusive_lock(target.parent / SIF_LOCK, functools.partial(print, waiting)):
            if not made_by_another_checkout():
                convert(plan, target, digest_file, spec, manifest, args)
    if shared:
        args.sif.unlink(missing_ok=True)
        args.sif.symlink_to(shared.resolve())
    if digest_file != args.digest:
        shutil.copyfile(digest_file, args.digest)


def convert(
    plan: SifPlan,
    target: Path,
    digest_file: Path,
    spec: BuildSpec | None,
    manifest: ImageManifest | None,
    args: argparse.Namespace,
) -> None:
    """Make ``target`` and its digest file; a failed conversion leaves neither a partial SIF
    nor its multi-GB docker archive behind."""
    size = image_size(manifest.engine, manifest.id) if manifest is not None else None
    if saves_archive(plan) and size is not None:
        check_room_for_sif(args.env, target.parent, size)
    for note in check_build_space(args.env, size, command=plan.command):
        print(f"images: {note}", flush=True)
    partial = target.with_name(f".{target.name}.{os.getpid()}.partial")
    commands = sif_commands(plan, partial, spec, PROJECT, manifest, args.uri)
    try:
        for command in commands:
            print("+", " ".join(command), flush=True)
            run_streamed(command)
        digest_file.write_text(sif_digest(plan, partial, manifest, args.uri) + "\n")
        partial.replace(target)
    finally:
        for leftover in (partial, sif_archive(partial)):
            leftover.unlink(missing_ok=True)


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    with (
        one_line_errors(ContainerError, OSError, subprocess.CalledProcessError),
        tempfile.TemporaryDirectory(prefix="ptspeed-image-secrets-") as scratch,
    ):
        args.scratch = Path(scratch)
        if args.action == "build":
            build(args)
        elif args.action == "pull":
            pull_image(args.engine, args.env, args.uri).write(args.manifest)
        else:
            make_sif(args)
    return 0


if __name__ == "__main__":
    sys.exit(main())
