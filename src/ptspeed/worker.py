"""The worker process of one cell: ``python -m ptspeed.worker SPEC_JSON RESULT_PATH``.

Started by :mod:`ptspeed.runner`, never by hand. It writes the record to RESULT_PATH.
"""

from __future__ import annotations

import contextlib
import ctypes
import json
import os
import signal
import sys

PR_SET_PDEATHSIG = 1
WATCHDOG_PID_VARIABLE = "PTSPEED_WATCHDOG_PID"


def die_with_parent() -> None:
    """Ask Linux to kill this worker when its watchdog dies, even by SIGKILL: the worker runs
    in its own session, so no signal sent to the watchdog's process group reaches it. Done
    before torch is imported, and followed by a check that the watchdog did not die first."""
    with contextlib.suppress(OSError, AttributeError):
        ctypes.CDLL(None, use_errno=True).prctl(PR_SET_PDEATHSIG, signal.SIGKILL)
    expected = os.environ.get(WATCHDOG_PID_VARIABLE)
    if expected and os.getppid() != int(expected):
        sys.exit("ptspeed worker: the watchdog is gone; not starting")


def main(argv: list[str]) -> int:
    die_with_parent()
    from ptspeed.harness import run_cell
    from ptspeed.record import CellSpec, write_record

    spec = CellSpec(**json.loads(argv[0]))
    write_record(run_cell(spec), argv[1])
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
