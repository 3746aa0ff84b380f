"""The worker process of one cell: ``python -m ptspeed.launch.worker SPEC_JSON RESULT_PATH``.

Started by :mod:`ptspeed.launch.watchdog`, never by hand. It writes the record to RESULT_PATH.
A ddp/fsdp cell starts as ``--launch``, which becomes torchrun, which starts the ranks as
``--rank`` (see :mod:`ptspeed.launch.torchrun`); each rank writes its own outcome beside
RESULT_PATH.
"""

from __future__ import annotations

import contextlib
import ctypes
import json
import os
import signal
import sys
import time
from pathlib import Path
from typing import TYPE_CHECKING, NoReturn

if TYPE_CHECKING:  # torch-importing modules, imported by the functions that need them
    from ptspeed.cell.parallelism.distributed import Rank
    from ptspeed.cell.record import CellSpec

PR_SET_PDEATHSIG = 1
WATCHDOG_PID_VARIABLE = "PTSPEED_WATCHDOG_PID"


def die_with_parent() -> None:
    """Ask Linux to kill this worker when its watchdog dies, even by SIGKILL: the worker runs
    in its own session, so no signal sent to the watchdog's process group reaches it. Done
    before torch is imported, and followed by a check that the watchdog did not die first.
    For a rank of a distributed cell the parent is torchrun (the variable then names it), and
    torchrun in turn dies with the watchdog."""
    with contextlib.suppress(OSError, AttributeError):
        ctypes.CDLL(None, use_errno=True).prctl(PR_SET_PDEATHSIG, signal.SIGKILL)
    expected = os.environ.get(WATCHDOG_PID_VARIABLE)
    if expected and os.getppid() != int(expected):
        sys.exit("ptspeed worker: the watchdog is gone; not starting")


def main(argv: list[str]) -> int:
    die_with_parent()
    from ptspeed.cell.record import CellSpec
    from ptspeed.launch.torchrun import LAUNCH_FLAG, RANK_FLAG

    if argv[0] == LAUNCH_FLAG:
        launch_torchrun(argv[1:])
    if argv[0] == RANK_FLAG:
        return run_rank(CellSpec(**json.loads(argv[1])), Path(argv[2]))
    from ptspeed.cell.harness import run_cell
    from ptspeed.cell.record import write_record

    write_record(run_cell(CellSpec(**json.loads(argv[0]))), argv[1])
    return 0


def placement_of(spec: CellSpec) -> Rank:
    """This rank: of a ddp/fsdp cell, or a stage of a modelpar/pipeline cell."""
    from ptspeed.cell.parallelism.distributed import Rank
    from ptspeed.cell.parallelism.stages import StageRank
    from ptspeed.cell.variants.knobs import STAGED, parse_knobs

    if parse_knobs(spec.knobs).parallel in STAGED:
        return StageRank.from_environment(spec)
    return Rank.from_environment(spec)


def run_rank(spec: CellSpec, result_path: Path) -> int:
    """Run this rank's part of ``spec`` and write its outcome; exit status 1 when it failed,
    so that torchrun ends the other ranks at once."""
    from ptspeed.cell.harness import run_cell
    from ptspeed.launch.torchrun import FINISHED, write_rank_outcome

    rank = placement_of(spec)
    record = run_cell(spec, rank)
    failed = record.status not in FINISHED
    failed_at = time.time() if failed else None
    if not failed:
        rank.close()
    write_rank_outcome(result_path, rank.rank, record, failed_at)
    return 1 if failed else 0


def launch_torchrun(argv: list[str]) -> NoReturn:
    """Become torchrun (exec: same pid, so the watchdog's kill and our PR_SET_PDEATHSIG still
    apply), with the ranks' parent check pointed at it."""
    from ptspeed.cell.variants.knobs import parse_knobs, threads_per_process
    from ptspeed.launch.torchrun import torchrun_command

    spec = json.loads(argv[0])
    world_size = parse_knobs(spec["knobs"]).world_size
    os.environ[WATCHDOG_PID_VARIABLE] = str(os.getpid())
    os.environ["OMP_NUM_THREADS"] = str(threads_per_process(spec["threads"], world_size))
    command = torchrun_command(sys.executable, world_size, argv)
    os.execv(command[0], command)


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
