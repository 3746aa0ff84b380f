"""Command line: ``python -m ptspeed cell|models|knobs|schema``.

``cell`` runs one benchmark cell in a worker process under a watchdog and writes exactly one
JSON record to ``--out``. Bad input is refused before anything runs: one line naming the
field and the accepted values on stderr, exit status 2, nothing written.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import NoReturn

from ptspeed import knobs as knobs_module
from ptspeed.knobs import BadInput
from ptspeed.models import REGISTRY
from ptspeed.record import CellSpec, json_schema
from ptspeed.validate import DEVICES, FAULTS, MODES, check_cell

EXIT_BAD_INPUT = 2
EXIT_INTERRUPTED = 130


def main(argv: list[str] | None = None) -> int:
    parser = _parser()
    args = parser.parse_args(argv)
    try:
        return args.handler(args)
    except BadInput as exc:
        print(f"error: {exc}", file=sys.stderr)
        return EXIT_BAD_INPUT


class _Parser(argparse.ArgumentParser):
    """Usage errors as bad input: one ``error:`` line naming the argument, exit status 2."""

    def error(self, message: str) -> NoReturn:
        self.exit(EXIT_BAD_INPUT, f"error: {message}\n")


def _parser() -> argparse.ArgumentParser:
    parser = _Parser(prog="ptspeed", description=__doc__.splitlines()[0])
    commands = parser.add_subparsers(required=True, metavar="command")
    cell = commands.add_parser("cell", help="run one benchmark cell and write its record")
    _cell_arguments(cell)
    cell.set_defaults(handler=_cell)
    for name, handler, text in (
        ("models", _models, "list the models"),
        ("knobs", _knobs, "describe the variant knobs"),
        ("schema", _schema, "print the record's JSON Schema"),
    ):
        commands.add_parser(name, help=text).set_defaults(handler=handler)
    return parser


def _cell_arguments(cell: argparse.ArgumentParser) -> None:
    defaults = CellSpec(model="", variant="", knobs="", mode="train", batch_size=1)
    cell.add_argument("--model", required=True, help=f"one of: {', '.join(REGISTRY)}")
    cell.add_argument("--variant", default="eager", help="variant name (default: eager)")
    cell.add_argument("--knobs", help="knob string of the variant (default: the variant name)")
    cell.add_argument("--mode", default="train", help=f"one of: {', '.join(MODES)}")
    cell.add_argument("--batch-size", type=int, required=True)
    cell.add_argument("--image-size", type=int, default=defaults.image_size)
    cell.add_argument("--seq-len", type=int, default=defaults.seq_len)
    cell.add_argument("--env", default=defaults.env, help="environment name, for the record")
    cell.add_argument("--trial", type=int, default=0)
    cell.add_argument("--seed", type=int, default=0)
    cell.add_argument("--warmup", type=int, default=defaults.warmup_steps)
    cell.add_argument("--steps", type=int, default=defaults.measured_steps)
    cell.add_argument("--numerics-steps", type=int, default=defaults.numerics_steps)
    cell.add_argument("--device", default="auto", help=f"one of: {', '.join(DEVICES)}, cuda:N")
    cell.add_argument("--threads", type=int, default=0, help="torch CPU threads (0: default)")
    cell.add_argument("--timeout", type=float, default=defaults.timeout_s, help="seconds")
    cell.add_argument("--fault", default="", help=f"inject a fault to test the suite: {FAULTS}")
    cell.add_argument("--out", type=Path, required=True, help="where the JSON record goes")


def spec_from_args(args: argparse.Namespace) -> CellSpec:
    return CellSpec(
        model=args.model,
        variant=args.variant,
        knobs=args.knobs or args.variant,
        mode=args.mode,
        batch_size=args.batch_size,
        image_size=args.image_size,
        seq_len=args.seq_len,
        env=args.env,
        trial=args.trial,
        seed=args.seed,
        warmup_steps=args.warmup,
        measured_steps=args.steps,
        numerics_steps=args.numerics_steps,
        device=args.device,
        threads=args.threads,
        timeout_s=args.timeout,
        fault=args.fault,
    )


def _cell(args: argparse.Namespace) -> int:
    from ptspeed.runner import run_cell_in_worker

    spec = spec_from_args(args)
    check_cell(spec)
    try:
        record = run_cell_in_worker(spec, args.out)
    except KeyboardInterrupt as exc:
        print(
            f"interrupted ({exc or 'SIGINT'}): the worker was stopped, no record written",
            file=sys.stderr,
        )
        return EXIT_INTERRUPTED
    line = f"{spec.model} {spec.variant} {spec.mode} batch {spec.batch_size}: {record.status}"
    if record.status == "ok":
        line += f", {record.metrics.throughput_samples_per_s:.2f} samples/s"
    elif record.reason:
        line += f" ({record.reason})"
    print(line, file=sys.stderr)
    return 0


def _models(args: argparse.Namespace) -> int:
    for name, entry in REGISTRY.items():
        sizes = ", ".join(f"{k} {lo}..{hi}" for k, (lo, hi) in entry.limits.items())
        print(f"{name:10} sizes: batch_size{', ' + sizes if sizes else ''}")
    return 0


def _knobs(args: argparse.Namespace) -> int:
    print(knobs_module.__doc__)
    return 0


def _schema(args: argparse.Namespace) -> int:
    print(json.dumps(json_schema(), indent=2))
    return 0
