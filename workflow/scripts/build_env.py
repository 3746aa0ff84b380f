"""Build (or reuse) the venv of one environment and write what it realised to --link (JSON).

    python workflow/scripts/build_env.py --name torch-2.0 --requirements envs/torch-2.0.txt \\
        --python 3.10 --dest .cache/envs --link results/envs/torch-2.0.json

The record holds the venv's interpreter (``python``) and the GPU code of its torch
(``gpu_code``: torch and CUDA versions, ``torch._C._cuda_getArchFlags()``), read by one
subprocess in the venv (ptspeed.envs.gpu_code).
"""

import argparse
import json
import sys
from pathlib import Path

from ptspeed.cell.files import write_atomic
from ptspeed.entrypoint import one_line_errors
from ptspeed.envs.gpu_code import environment_record, probe_code
from ptspeed.envs.venvs import INSTALLERS, build_venv, venv_python
from ptspeed.errors import EnvBuildError


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--name", required=True, help="environment name, e.g. torch-2.0")
    parser.add_argument("--requirements", required=True, type=Path, help="hash-locked file")
    parser.add_argument("--python", required=True, help="major.minor, e.g. 3.10")
    parser.add_argument("--dest", required=True, type=Path, help="directory of the venvs")
    parser.add_argument("--link", required=True, type=Path, help="JSON file to write the record to")
    parser.add_argument(
        "--installer",
        choices=INSTALLERS,
        help="uv or pip (default: $PTSPEED_ENV_INSTALLER, else uv where installed, else pip)",
    )
    return parser.parse_args(argv)


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    with one_line_errors(EnvBuildError, OSError):
        venv = build_venv(
            args.name, args.requirements, args.python, args.dest, installer=args.installer
        )
        python = venv_python(venv)
        record = environment_record(python, probe_code(python))
        write_atomic(args.link, json.dumps(record, indent=2) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
