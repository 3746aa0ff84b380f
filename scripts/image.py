"""Build or pull one environment's container image and write its manifest; make an Apptainer
image of it.

    python scripts/image.py build --env torch-2.0 --engine podman \\
        --requirements envs/torch-2.0.txt --python 3.10 --tag ghcr.io/ptspeed/torch-2.0:latest \\
        [--base-image IMAGE] [--ca-bundle FILE] --manifest results/images/torch-2.0.json
    python scripts/image.py pull --env torch-2.0 --engine podman \\
        --uri docker://ghcr.io/ptspeed/torch-2.0@sha256:... --manifest results/images/torch-2.0.json
    python scripts/image.py sif --env torch-2.0 [--engine podman --manifest M.json] \\
        --requirements envs/torch-2.0.txt --python 3.10 [--base-image IMAGE] \\
        --sif results/images/torch-2.0.sif

Runs from the repository root without the package installed.
"""

import argparse
import subprocess
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "src"))

from ptspeed.containers import (
    ENGINES,
    BuildSpec,
    ContainerError,
    ImageManifest,
    build_image,
    build_tag,
    pull_image,
    sif_commands,
)

PROJECT = Path(__file__).resolve().parents[1]
DEFINITION = PROJECT / "docker" / "ptspeed.def"


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
    pull.add_argument("--uri", required=True, help="image reference, best pinned by digest")
    build.add_argument("--tag", required=True, help="name of the built image")
    sif.add_argument("--engine", choices=ENGINES, help="take the image from this engine")
    sif.add_argument("--manifest", type=Path, help="the image's manifest (with --engine)")
    sif.add_argument("--sif", required=True, type=Path, help="Apptainer image to write")
    for action in (build, sif):
        action.add_argument("--requirements", required=True, type=Path, help="hash-locked file")
        action.add_argument("--python", required=True, help="major.minor, e.g. 3.10")
        action.add_argument("--base-image", default="", help="base image ('' = the recipe's)")
        action.add_argument("--ca-bundle", type=Path, help="CA bundle for TLS during the build")
    return parser.parse_args(argv)


def spec_of(args: argparse.Namespace, tag: str) -> BuildSpec:
    return BuildSpec(
        env=args.env,
        requirements=args.requirements,
        python=args.python,
        tag=build_tag(tag),
        base_image=args.base_image,
        ca_bundle=args.ca_bundle,
    )


def make_sif(args: argparse.Namespace) -> None:
    manifest = ImageManifest.read(args.manifest) if args.manifest else None
    spec = spec_of(args, manifest.image if manifest else f"localhost/ptspeed/{args.env}")
    args.sif.parent.mkdir(parents=True, exist_ok=True)
    for command in sif_commands(args.engine, manifest, args.sif, DEFINITION, spec):
        print("+", " ".join(command), flush=True)
        subprocess.run(command, check=True)


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    try:
        if args.action == "build":
            build_image(args.engine, spec_of(args, args.tag), PROJECT).write(args.manifest)
        elif args.action == "pull":
            pull_image(args.engine, args.env, args.uri).write(args.manifest)
        else:
            make_sif(args)
    except (ContainerError, OSError, subprocess.CalledProcessError) as error:
        print(f"error: {error}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main())
