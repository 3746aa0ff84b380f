"""One run at a time per results directory.

Snakemake locks its working directory (``.snakemake/locks``), which stops a second run started
from the same directory. Two checkouts (or two working directories) whose configs name the
same absolute ``results`` directory do not see each other's Snakemake lock; this lock is taken
on the results directory itself. It is an advisory ``flock`` on ``<results>/.ptspeed-run.lock``,
held by the Snakemake process for as long as it runs: the kernel releases it when the process
ends in any way (SIGKILL included), so it never needs removing by hand.
"""

from __future__ import annotations

import fcntl
import json
import os
import socket
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

from ptspeed.errors import ResultsInUse

LOCK_NAME = ".ptspeed-run.lock"

_held: dict[Path, int] = {}


def hold_results_lock(results: str | os.PathLike[str]) -> Path:
    """Lock ``results`` for this process until it exits; return the lock file's path.

    Raises :class:`ResultsInUse` naming the holder (process, host, working directory, start)
    when another process holds it. Taking it again in the same process is a no-op.
    """
    directory = Path(results).absolute()
    if directory in _held:
        return directory / LOCK_NAME
    directory.mkdir(parents=True, exist_ok=True)
    path = directory / LOCK_NAME
    fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o644)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except OSError:
        holder = _describe_holder(path)
        os.close(fd)
        raise ResultsInUse(
            f"results: {directory} is in use by another run ({holder}); wait for it to end "
            "or stop it, then start again"
        ) from None
    os.ftruncate(fd, 0)
    os.write(fd, (json.dumps(_holder()) + "\n").encode("utf-8"))
    _held[directory] = fd
    return path


def _holder() -> dict[str, Any]:
    return {
        "pid": os.getpid(),
        "host": socket.gethostname(),
        "working_directory": os.getcwd(),
        "started_at": datetime.now(timezone.utc).isoformat(timespec="seconds"),
    }


def _describe_holder(path: Path) -> str:
    try:
        holder = json.loads(path.read_text(encoding="utf-8"))
        return (
            f"process {holder['pid']} on {holder['host']}, started {holder['started_at']} "
            f"in {holder['working_directory']}"
        )
    except (OSError, ValueError, KeyError, TypeError):
        return "holder unknown"
