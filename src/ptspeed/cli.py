"""Command line: ``python -m ptspeed cell|models|knobs|schema``.

``cell`` runs one benchmark cell in a worker process under a watchdog and writes exactly one
JSON record to ``--out``. Bad input is refused before anything runs: one line naming the
field and the accepted values on stderr, exit status 2, nothing written. A record that cannot
be written (a full disk) is one ``error:`` line naming the file and the reason, exit status 1,
and no part of it on disk. With ``--oom-retry``
a cell that runs out of memory runs once more at half its batch size, within what is left of
its time limit; the record written is the retry's, saying so (``cell.retried_from_batch_size``,
and the first attempt's reason in ``detail``). Model hubs are switched off for the worker:
nothing is downloaded at run time.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import sys
import tempfile
import time
from pathlib import Path

from ptspeed.cell.arguments import add_arguments, spec_of
from ptspeed.cell.checks import check_cell
from ptspeed.cell.faults import FAULTS_VARIABLE, fault_from_environment, fault_of_attempt
from ptspeed.cell.provenance import collect_base
from ptspeed.cell.record import CellSpec, Record, utc_now, write_record
from ptspeed.cell.schema import json_schema
from ptspeed.cell.variants import knobs as knobs_module
from ptspeed.cell.variants.knobs import parse_knobs
from ptspeed.entrypoint import OneLineParser, one_line_errors
from ptspeed.errors import BadInput, GpuRequestError, WriteFailed
from ptspeed.launch.gpus import gpu_environment
from ptspeed.models import FAMILIES, REGISTRY
from ptspeed.models.catalog import family_names

EXIT_NOT_WRITTEN = 1
EXIT_INTERRUPTED = 130
# Set for the worker whatever the caller's environment says: models are built from configs
# with random weights, and a cell must never wait on (or depend on) the network.
HUB_OFFLINE_VARIABLES = ("HF_HUB_OFFLINE", "TRANSFORMERS_OFFLINE", "HF_DATASETS_OFFLINE")
MIN_RETRY_S = 1.0
# How long a GPU cell waits for GPUs held by other cells: only when more GPU cells were
# started than the node has GPUs (--resources gpu=N above the node's count).
GPU_WAIT_S = 600.0


def main(argv: list[str] | None = None) -> int:
    parser = _parser()
    args = parser.parse_args(argv)
    with one_line_errors(BadInput):
        return args.handler(args)


def _parser() -> argparse.ArgumentParser:
    parser = OneLineParser(prog="ptspeed", description=__doc__.splitlines()[0])
    commands = parser.add_subparsers(required=True, metavar="command")
    cell = commands.add_parser("cell", help="run one benchmark cell and write its record")
    add_arguments(cell)
    cell.add_argument("--out", type=Path, required=True, help="where the JSON record goes")
    cell.set_defaults(handler=_cell)
    models = commands.add_parser("models", help="list the models")
    models.add_argument(
        "--family", choices=FAMILIES, help="list the names this family's library knows here"
    )
    models.set_defaults(handler=_models)
    for name, handler, text in (
        ("knobs", _knobs, "describe the variant knobs"),
        ("schema", _schema, "print the record's JSON Schema"),
    ):
        commands.add_parser(name, help=text).set_defaults(handler=handler)
    return parser


def _cell(args: argparse.Namespace) -> int:
    spec = spec_of(args)
    if not spec.fault:
        spec = dataclasses.replace(spec, fault=fault_from_environment(spec, os.environ))
        if spec.fault:
            print(f"{FAULTS_VARIABLE}: injecting fault {spec.fault!r}", file=sys.stderr)
    check_cell(spec)
    for name in HUB_OFFLINE_VARIABLES:
        os.environ[name] = "1"
    try:
        with one_line_errors(WriteFailed, about="no record written", status=EXIT_NOT_WRITTEN):
            record = _run_on_claimed_gpus(spec, args.out, args.oom_retry)
    except KeyboardInterrupt as exc:
        print(
            f"interrupted ({exc or 'SIGINT'}): the worker was stopped, no record written",
            file=sys.stderr,
        )
        return EXIT_INTERRUPTED
    cell = record.cell
    line = f"{cell.model} {cell.variant} {cell.mode} batch {cell.batch_size}"
    if cell.retried_from_batch_size:
        line += f" (retried from {cell.retried_from_batch_size})"
    line += f": {record.status}"
    if record.status == "ok":
        line += f", {record.metrics.throughput_samples_per_s:.2f} samples/s"
    elif record.reason:
        line += f" ({record.reason})"
    print(line, file=sys.stderr)
    return 0


def _run_on_claimed_gpus(spec: CellSpec, out: Path, oom_retry: bool) -> Record:
    """Run the cell on GPUs no other cell of the node holds (ptspeed.launch.gpus), held until its
    record is written; a cell the node cannot give GPUs to gets a ``failed`` record saying so."""
    count = parse_knobs(spec.knobs).world_size
    try:
        with gpu_environment(spec.device, count, GPU_WAIT_S) as gpu_env:
            return run_with_oom_retry(spec, out, oom_retry, gpu_env)
    except GpuRequestError as exc:
        record = Record(
            cell=spec,
            status="failed",
            reason=f"GPU assignment: {exc}",
            provenance=collect_base(),
            started_at=utc_now(),
            finished_at=utc_now(),
        )
        write_record(record, out)
        return record


def run_with_oom_retry(
    spec: CellSpec, out: Path, oom_retry: bool, gpu_env: dict[str, str] | None = None
) -> Record:
    """Run ``spec`` (and, with ``oom_retry``, its retry at half the batch size after running out
    of memory) and write the one record that stands for the cell to ``out``. ``gpu_env`` pins
    the worker to its GPUs."""
    from ptspeed.launch.watchdog import run_cell_in_worker

    with tempfile.TemporaryDirectory(prefix="ptspeed-attempts-") as scratch:
        begun = time.monotonic()
        first_spec = dataclasses.replace(spec, fault=fault_of_attempt(spec.fault, 1))
        record = run_cell_in_worker(first_spec, Path(scratch) / "attempt1.json", extra_env=gpu_env)
        if oom_retry and record.status == "oom":
            left_s = spec.timeout_s - (time.monotonic() - begun)
            attempt2 = Path(scratch) / "attempt2.json"
            record = _retry_at_half_batch(spec, record, left_s, attempt2, gpu_env)
    # What was asked for: the fault as given (oom-once, not the attempt's), the whole limit.
    record.cell = dataclasses.replace(record.cell, fault=spec.fault, timeout_s=spec.timeout_s)
    write_record(record, out)
    return record


def _retry_at_half_batch(
    spec: CellSpec, first: Record, left_s: float, out: Path, gpu_env: dict[str, str] | None
) -> Record:
    from ptspeed.launch.watchdog import run_cell_in_worker

    retry = dataclasses.replace(
        spec,
        batch_size=spec.batch_size // 2,
        retried_from_batch_size=spec.batch_size,
        timeout_s=left_s,
        fault=fault_of_attempt(spec.fault, 2),
    )
    why_not = _why_no_retry(retry, left_s)
    if why_not:
        first.detail = f"not retried at half the batch size: {why_not}\n{first.detail}"
        return first
    second = run_cell_in_worker(retry, out, extra_env=gpu_env)
    second.started_at = first.started_at
    second.duration_s = (first.duration_s or 0.0) + (second.duration_s or 0.0)
    first_attempt = f"first attempt at batch_size {spec.batch_size}: {first.reason}"
    second.detail = "\n".join(text for text in (first_attempt, second.detail) if text)
    return second


def _why_no_retry(retry: CellSpec, left_s: float) -> str:
    if retry.batch_size < 1:
        return f"batch_size {retry.retried_from_batch_size} cannot be halved"
    if left_s < MIN_RETRY_S:
        return "no time left within the cell's limit"
    try:
        check_cell(retry)
    except BadInput as exc:
        return str(exc)
    return ""


def _models(args: argparse.Namespace) -> int:
    if args.family:
        names = family_names(args.family)
        if not names:
            raise BadInput(f"--family: {args.family} is not installed in this environment")
        print("\n".join(f"{args.family}:{name}" for name in names))
        return 0
    for name, entry in REGISTRY.items():
        sizes = ", ".join(f"{k} {lo}..{hi}" for k, (lo, hi) in entry.limits.items())
        print(f"{name:10} sizes: batch_size{', ' + sizes if sizes else ''}")
    print("and torchvision:<name>, transformers:<model_type>, timm:<name>, module:attribute")
    return 0


def _knobs(args: argparse.Namespace) -> int:
    print(knobs_module.__doc__)
    return 0


def _schema(args: argparse.Namespace) -> int:
    print(json.dumps(json_schema(), indent=2))
    return 0
