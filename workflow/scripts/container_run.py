"""Run a command (a cell) in an environment's image with docker or podman.

    python workflow/scripts/container_run.py --engine podman \\
        --manifest results/images/torch-2.0.json \\
        [--gpus] --mount PROJECT --mount RESULTS --workdir DIR -- python -m ptspeed cell ...

The image is the manifest's (run by id, named in the record with its digest); the mounted
directories appear at the same paths inside, so paths on the command line mean the same thing
there. Exits with the command's exit status.
"""

import argparse
import os
import sys
from pathlib import Path

from ptspeed.cell.provenance import GIT_COMMIT_VARIABLE, git_state
from ptspeed.entrypoint import one_line_errors
from ptspeed.envs.containers import ENGINES, ImageManifest
from ptspeed.envs.engine_calls import passed_environment, run_command
from ptspeed.launch.gpus import LOCK_DIR_VARIABLE, lock_dir

PROJECT = Path(__file__).resolve().parents[2]


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--engine", required=True, choices=ENGINES)
    parser.add_argument("--manifest", required=True, type=Path, help="the image's manifest")
    parser.add_argument("--gpus", action="store_true", help="give the container the GPUs")
    parser.add_argument("--mount", action="append", type=Path, default=[], help="directory")
    parser.add_argument("--workdir", required=True, type=Path, help="working directory inside")
    parser.add_argument("--dry-run", action="store_true", help="print the command, run nothing")
    parser.add_argument("command", nargs="+", help="what to run inside (after --)")
    return parser.parse_args(argv)


def gpu_lock_mount() -> dict[str, Path]:
    """The node's GPU lock directory (ptspeed.launch.gpus), shared with the container so that cells
    in separate containers still claim different GPUs."""
    directory = lock_dir()
    directory.mkdir(parents=True, exist_ok=True)
    return {LOCK_DIR_VARIABLE: directory}


def code_environment() -> dict[str, str]:
    """The suite's code as the container sees it: mounted from this checkout, at its commit
    (the image has no git to ask)."""
    environment = {"PYTHONPATH": str(PROJECT / "src")}
    commit, _ = git_state()
    if commit:
        environment[GIT_COMMIT_VARIABLE] = commit
    return environment


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    with one_line_errors(OSError, ValueError, TypeError, about=f"manifest {args.manifest}"):
        manifest = ImageManifest.read(args.manifest)
    environment = {**passed_environment(os.environ), **code_environment()}
    mounts = [PROJECT, *args.mount]
    if args.gpus:
        locks = gpu_lock_mount()
        mounts += locks.values()
        environment.update({name: str(path) for name, path in locks.items()})
    command = run_command(
        args.engine,
        manifest,
        args.command,
        gpus=args.gpus,
        mounts=mounts,
        workdir=args.workdir.resolve(),
        environment=environment,
    )
    if args.dry_run:
        print(" ".join(command))
        return 0
    with one_line_errors(OSError, about=command[0]):
        os.execvp(command[0], command)
    return 0  # not reached: the command replaced this process


if __name__ == "__main__":
    sys.exit(main())
