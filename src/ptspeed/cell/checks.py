"""Checks of a cell spec before anything runs: one clear line naming the field on bad input."""

from __future__ import annotations

import re

from ptspeed.cell.gpu_code import FAKED_GPU_FAULTS
from ptspeed.cell.record import CellSpec
from ptspeed.cell.variants.knobs import parse_knobs
from ptspeed.errors import BadInput
from ptspeed.models import Sizes, check_sizes

MODES = ("train", "infer")
DEVICES = ("auto", "cpu", "cuda")
# Injected faults for testing the suite (ptspeed.cell.faults); oom-once is handled by the cell
# command.
FAULTS = (
    "",
    "error",
    "oom",
    "hang",
    "crash",
    "numerics",
    "grad",
    "skip-step",
    "late",
    "oom-once",
    "rank-error",
    "rank-crash",
    "rank-slow-sampling",
    "neighbour",
    "slow-machine",
    "slow-step",
    *FAKED_GPU_FAULTS,  # sm-90: the cell's GPU reports compute capability 9.0
)
# The last rank of a ddp/fsdp cell raises, dies, or samples the node slowly.
RANK_FAULTS = ("rank-error", "rank-crash", "rank-slow-sampling")
MAX_STEPS = 100_000


def check_cell(spec: CellSpec) -> None:
    """Raise :class:`BadInput` for the first field of ``spec`` that cannot work."""
    sizes = Sizes(spec.batch_size, spec.image_size, spec.seq_len)
    check_sizes(spec.model_reference, sizes, spec.shape)
    knobs = parse_knobs(spec.knobs)
    _one_of("mode", spec.mode, MODES)
    if not (spec.device in DEVICES or re.fullmatch(r"cuda:[0-9]+", spec.device)):
        raise BadInput(f"device: {spec.device!r} is not one of {', '.join(DEVICES)} or cuda:N")
    _one_of("fault", spec.fault, FAULTS)
    if spec.fault in RANK_FAULTS and knobs.world_size < 2:
        raise BadInput(f"fault: {spec.fault} needs a ddp or fsdp variant with procs >= 2")
    if spec.batch_size < knobs.chunks:
        raise BadInput(f"batch_size: {spec.batch_size} is smaller than chunks={knobs.chunks}")
    _in_range("measured_steps", spec.measured_steps, 1, MAX_STEPS)
    _in_range("warmup_steps", spec.warmup_steps, 1, MAX_STEPS)
    _in_range("numerics_steps", spec.numerics_steps, 0, MAX_STEPS)
    _in_range("trial", spec.trial, 0, MAX_STEPS)
    _in_range("threads", spec.threads, 0, 4096)
    if not spec.timeout_s > 0:
        raise BadInput(f"timeout_s: {spec.timeout_s} must be positive")


def _one_of(field: str, value: str, accepted: tuple[str, ...]) -> None:
    if value not in accepted:
        shown = ", ".join(a if a else repr(a) for a in accepted)
        raise BadInput(f"{field}: {value!r} is not one of {shown}")


def _in_range(field: str, value: int, low: int, high: int) -> None:
    if not low <= value <= high:
        raise BadInput(f"{field}: {value} must be from {low} to {high}")
