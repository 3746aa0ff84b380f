"""Injected faults, for testing the suite itself: never used by a real benchmark run.

A cell's fault comes from ``--fault`` or, so that the cells of a real workflow run can be given
one, from the environment variable :data:`FAULTS_VARIABLE`::

    PTSPEED_FAULTS="host-b/mlp/eager/train/0=hang,*/mlp/*/*/1=oom"

Each entry is ``ENV/MODEL/VARIANT/MODE/TRIAL=FAULT`` (``*`` matches any one part); the first
entry that matches the cell applies. A malformed value is refused (the cell writes nothing),
and an injected fault is always written in the record (``cell.fault``), so a fault can neither
be set by accident through a config nor pass unnoticed in a table.

Faults (``ptspeed.cell.checks.FAULTS``): ``error``, ``oom`` (a simulated out-of-memory error in the
first step), ``hang``, ``crash`` (the worker kills itself), ``numerics`` (a wrong output in every
step), ``grad`` (gradients doubled after every backward pass), ``skip-step`` (the first optimizer
step skipped), ``late`` (a wrong output only after the checked steps, for the aggregation's check
of the last loss), ``oom-once``: out of memory in the first attempt only, so that a retry at
half the batch size (``--oom-retry``) succeeds, ``neighbour``: a noisy neighbour, processes
spinning on every CPU of the node through the measured window (:func:`noisy_neighbours`), so
that the trial is really perturbed, ``slow-machine``: one process spinning per CPU of the node
through both machine-speed probes and the window (a machine slower by a steady load, as another
guest on the host makes it: give it to every cell of a run), ``slow-step``: every measured step
sleeps :data:`SLOW_STEP_FRACTION` of its own time after it (a regression of a fixed size in the
code), and ``rank-slow-sampling``: the last rank of a ddp/fsdp
cell takes a second longer to sample the node before its window (as ``nvidia-smi`` can), which
must not reach any rank's clock. ``sm-XY`` (``sm-90``, ``sm-80``, … one per capability of
:data:`ptspeed.cell.gpu_code.KNOWN_GPUS`): the cell's GPU reports compute capability X.Y (a
well-known GPU of it by name), also on the CPU, so that the refusal of a GPU the build has no code
for (:func:`ptspeed.cell.gpu_code.device_reason`) is tested without one; where the code runs on
it, the cell runs as usual on its device.
"""

from __future__ import annotations

import itertools
import os
import re
import subprocess
import sys
import time
from collections.abc import Callable, Iterator, Mapping
from contextlib import AbstractContextManager, contextmanager, nullcontext
from typing import Any, TypeVar

from ptspeed.cell.checks import FAULTS
from ptspeed.cell.record import CellSpec
from ptspeed.errors import BadInput

FAULTS_VARIABLE = "PTSPEED_FAULTS"
NUMERICS = "numerics"
LATE = "late"
WRONG_OUTPUT_SCALE = 1.1
OOM_ONCE = "oom-once"
NEIGHBOUR = "neighbour"
SLOW_MACHINE = "slow-machine"
SLOW_STEP = "slow-step"
SLOW_STEP_FRACTION = 0.1
SLOW_SAMPLING = "slow-sampling"  # what rank-slow-sampling gives the last rank
SLOW_SAMPLING_S = 1.0
# Spinning processes per CPU of a noisy neighbour: enough to take most of each CPU from a cell.
NEIGHBOURS_PER_CPU = 8
SPIN = "while True: pass"
SELECTOR_FIELDS = ("env", "model", "variant", "mode", "trial")
_PART = r"(?:\*|[A-Za-z0-9][A-Za-z0-9._-]*)"
_ENTRY = re.compile(rf"({_PART}(?:/{_PART}){{4}})=([a-z][a-z0-9-]*)")
Sample = TypeVar("Sample")


def parse_faults(text: str) -> list[tuple[tuple[str, ...], str]]:
    """The entries of a :data:`FAULTS_VARIABLE` value; :class:`BadInput` names a bad one."""
    entries = []
    for raw in filter(None, (part.strip() for part in text.split(","))):
        match = _ENTRY.fullmatch(raw)
        if match is None:
            raise BadInput(
                f"{FAULTS_VARIABLE}: {raw!r} is not ENV/MODEL/VARIANT/MODE/TRIAL=FAULT "
                "('*' matches any part)"
            )
        selector, fault = tuple(match[1].split("/")), match[2]
        if fault not in FAULTS or not fault:
            accepted = ", ".join(f for f in FAULTS if f)
            raise BadInput(f"{FAULTS_VARIABLE}: fault {fault!r} is not one of {accepted}")
        entries.append((selector, fault))
    return entries


def fault_from_environment(spec: CellSpec, environ: Mapping[str, str]) -> str:
    """The fault :data:`FAULTS_VARIABLE` gives ``spec`` ('' when none matches or it is unset)."""
    coordinates = tuple(str(getattr(spec, name)) for name in SELECTOR_FIELDS)
    for selector, fault in parse_faults(environ.get(FAULTS_VARIABLE, "")):
        if all(part in ("*", value) for part, value in zip(selector, coordinates, strict=True)):
            return fault
    return ""


def fault_of_attempt(fault: str, attempt: int) -> str:
    """What the harness injects in attempt 1 (the first) or 2 (an out-of-memory retry)."""
    if fault == OOM_ONCE:
        return "oom" if attempt == 1 else ""
    return fault


@contextmanager
def noisy_neighbours(processes: int = 0) -> Iterator[None]:
    """``processes`` processes (default: :data:`NEIGHBOURS_PER_CPU` per CPU of the node)
    spinning on the CPU while the block runs, each in a session of its own: with the kernel's
    autogroup scheduling (CONFIG_SCHED_AUTOGROUP) a session shares the CPU as one group, so
    spinners in one session would take no more than one other job."""
    count = processes or NEIGHBOURS_PER_CPU * (os.cpu_count() or 1)
    spinners = [
        subprocess.Popen([sys.executable, "-c", SPIN], start_new_session=True) for _ in range(count)
    ]
    try:
        time.sleep(2.0)  # every spinner spinning before the block starts
        yield
    finally:
        for spinner in spinners:
            spinner.kill()
        for spinner in spinners:
            spinner.wait()


def window_load(fault: str) -> AbstractContextManager[None]:
    """The load the ``neighbour`` and ``slow-machine`` faults run through the probes and the
    measured window; nothing for any other fault."""
    if fault == NEIGHBOUR:
        return noisy_neighbours()
    if fault == SLOW_MACHINE:
        return noisy_neighbours(os.cpu_count() or 1)
    return nullcontext()


def slowed_steps(step: Callable[[], Any], fault: str) -> Callable[[], Any]:
    """``step`` itself, or under the ``slow-step`` fault a step that sleeps
    :data:`SLOW_STEP_FRACTION` of its own time after it (synchronous devices: the CPU)."""
    if fault != SLOW_STEP:
        return step

    def slowed() -> Any:
        begun = time.perf_counter()
        output = step()
        time.sleep(SLOW_STEP_FRACTION * (time.perf_counter() - begun))
        return output

    return slowed


def wrong_outputs(step: Callable[[], Any], fault: str, checked_until: int) -> Callable[[], Any]:
    """``step`` itself, or a step whose tensor output is made wrong (times
    :data:`WRONG_OUTPUT_SCALE`): under the ``numerics`` fault in every call, under the ``late``
    fault from call ``checked_until`` on (the first after the check steps; calls counted from
    the warm-up's first)."""
    if fault not in (NUMERICS, LATE):
        return step
    # Imported here, not at the top: the cell command imports this module without torch.
    from torch import Tensor

    first_wrong = 0 if fault == NUMERICS else checked_until
    calls = itertools.count()

    def wrong() -> Any:
        output = step()
        if next(calls) >= first_wrong and isinstance(output, Tensor):
            return output * WRONG_OUTPUT_SCALE
        return output

    return wrong


def slowed_sampling(sample: Callable[[Any], Sample], fault: str) -> Callable[[Any], Sample]:
    """``sample`` itself, or under the ``slow-sampling`` fault a sampling that first sleeps
    :data:`SLOW_SAMPLING_S` (as ``nvidia-smi`` can take a second on one rank)."""
    if fault != SLOW_SAMPLING:
        return sample

    def slowed(device: Any) -> Sample:
        time.sleep(SLOW_SAMPLING_S)
        return sample(device)

    return slowed
