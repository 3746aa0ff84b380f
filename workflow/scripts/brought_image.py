"""Read what an image a site brings holds, once, and record it like a realised environment's.

    python workflow/scripts/brought_image.py --env ngc-22.11 \\
        --image docker://nvcr.io/nvidia/pytorch:22.11-py3@sha256:... \\
        --record results/envs/ngc-22.11.json --digest results/envs/ngc-22.11.digest

The image is used as is: its python reads its torch's version, CUDA and GPU code (``apptainer
exec``, or SingularityCE's ``singularity exec``; no GPU needed), which go to --record as
workflow/scripts/build_env.py writes a venv's, with the image and its digest; --digest holds
the digest alone, which every cell's record names.
"""

import argparse
import json
import sys
from pathlib import Path

from ptspeed.cell.files import write_atomic
from ptspeed.entrypoint import one_line_errors
from ptspeed.envs.apptainer import apptainer_command, brought_image_digest
from ptspeed.envs.apptainer_cells import brought_probe_launcher
from ptspeed.envs.gpu_code import environment_record, probe_code
from ptspeed.errors import EnvBuildError

SRC = Path(__file__).resolve().parents[2] / "src"
# The image's own interpreter, as the cells start it (ptspeed.envs.apptainer_cells.CELL_PYTHON).
IMAGE_PYTHON = "python"


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--env", required=True, help="environment name, e.g. ngc-22.11")
    parser.add_argument("--image", required=True, help="a .sif path or a pinned reference")
    parser.add_argument("--record", required=True, type=Path, help="JSON to write")
    parser.add_argument("--digest", required=True, type=Path, help="file to write its digest to")
    return parser.parse_args(argv)


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    command = apptainer_command()
    if command is None:
        print("error: neither apptainer nor singularity is on PATH", file=sys.stderr)
        return 2
    with one_line_errors(EnvBuildError, OSError, about=f"environments.{args.env}.image"):
        launcher = brought_probe_launcher(command, args.image, [SRC])
        code = probe_code(IMAGE_PYTHON, launcher, args.image)
        digest = brought_image_digest(args.image, Path.cwd())
    record = {**environment_record(IMAGE_PYTHON, code), "image": args.image, "digest": digest}
    write_atomic(args.digest, digest + "\n")
    write_atomic(args.record, json.dumps(record, indent=2) + "\n")
    print(f"{args.env}: brought {args.image}: {code.to_json()}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
