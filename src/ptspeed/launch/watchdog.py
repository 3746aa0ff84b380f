"""The watchdog: one cell = one worker process, one record, whatever happens.

The parent process does not import torch. It starts ``python -m ptspeed.launch.worker`` with the
cell spec, waits at most the cell's time limit, and then writes the record atomically: the worker's
own record when it finished, otherwise a ``timeout`` or ``failed`` record that says what
happened (exit code, signal, the end of its stderr). The worker's process group is killed on
timeout so that DataLoader workers and compile subprocesses go with it.

A ddp/fsdp cell's worker is torchrun with its ranks (:mod:`ptspeed.launch.torchrun`): on timeout or
SIGTERM torchrun ends its ranks, and the ranks die with torchrun should it be killed outright.
The cell's record is made from the ranks' outcomes.
"""

from __future__ import annotations

import json
import math
import os
import select
import signal
import subprocess
import sys
import tempfile
import time
from dataclasses import asdict
from pathlib import Path

from ptspeed.cell.hostenv import worker_environment
from ptspeed.cell.provenance import collect_base
from ptspeed.cell.record import CellSpec, Record, read_record, utc_now, write_record
from ptspeed.cell.variants.knobs import parse_knobs
from ptspeed.errors import BadInput
from ptspeed.launch import torchrun
from ptspeed.launch.worker import WATCHDOG_PID_VARIABLE

STDERR_TAIL_CHARS = 3000
KILL_GRACE_S = 5.0


def run_cell_in_worker(
    spec: CellSpec,
    out: Path,
    python: str = sys.executable,
    extra_env: dict[str, str] | None = None,
) -> Record:
    """Run ``spec`` in a worker process under a watchdog and write its record to ``out``.

    ``extra_env`` is added to the worker's environment. SIGTERM (a scheduler's time limit,
    Snakemake being stopped) ends the worker and writes nothing: an interrupted cell has no
    record, so a rerun runs it again.
    """
    signal.signal(signal.SIGTERM, _raise_interrupt)
    started_at = utc_now()
    begun = time.perf_counter()
    ranks = _torchrun_ranks(spec)
    with tempfile.TemporaryDirectory(prefix="ptspeed-cell-") as scratch:
        result_path = Path(scratch) / "record.json"
        stderr_path = Path(scratch) / "stderr.txt"
        command = _worker_command(spec, result_path, python, ranks)
        returncode, timed_out = _run_worker(spec, command, stderr_path, extra_env or {})
        if ranks and not timed_out:
            launcher_output = _tail(stderr_path, chars=None)
            record = torchrun.merged_record(spec, result_path, ranks, launcher_output, returncode)
        else:
            record = _worker_record(result_path)
        if record is None:
            record = _record_without_worker_result(spec, returncode, timed_out, _tail(stderr_path))
        if not record.started_at:
            record.started_at = started_at
            record.finished_at = utc_now()
            record.duration_s = time.perf_counter() - begun
            record.detail = record.detail or _tail(stderr_path)
    write_record(record, out)
    return record


def _torchrun_ranks(spec: CellSpec) -> int:
    """The processes torchrun starts for ``spec`` (ddp/fsdp, even procs=1); 0: no torchrun."""
    try:
        knobs = parse_knobs(spec.knobs)
    except BadInput:
        return 0  # the worker records the bad knobs as a failure
    return knobs.world_size if knobs.parallel else 0


def _worker_command(spec: CellSpec, result_path: Path, python: str, ranks: int) -> list[str]:
    arguments = [json.dumps(asdict(spec)), str(result_path)]
    launch = [torchrun.LAUNCH_FLAG] if ranks else []
    return [python, "-m", "ptspeed.launch.worker", *launch, *arguments]


def _run_worker(
    spec: CellSpec, command: list[str], stderr_path: Path, extra_env: dict[str, str]
) -> tuple[int | None, bool]:
    with open(stderr_path, "w+", encoding="utf-8") as stderr:
        process = subprocess.Popen(
            command,
            stdout=None,
            stderr=stderr,
            start_new_session=True,
            env=_worker_env(extra_env),
        )
        try:
            wait_blocking(process, spec.timeout_s)
        except subprocess.TimeoutExpired:
            end_process_group(process)
            return None, True
        except BaseException:
            end_process_group(process)
            raise
        finally:
            _relay(stderr_path)
    return process.returncode, False


def wait_blocking(process: subprocess.Popen[bytes], timeout_s: float) -> int:
    """``process.wait(timeout_s)`` asleep until the process ends: Popen.wait with a timeout
    polls (sleeps of up to 50 ms, about 2 % of a core beside the measured cell); a pidfd
    wakes the watchdog once. Raises subprocess.TimeoutExpired as Popen.wait does."""
    try:
        pidfd = os.pidfd_open(process.pid)
    except (AttributeError, OSError):  # before Linux 5.3 or Python 3.9
        return process.wait(timeout=timeout_s)
    try:
        ready = select.poll()
        ready.register(pidfd, select.POLLIN)
        if not ready.poll(max(0, math.ceil(timeout_s * 1000))):
            raise subprocess.TimeoutExpired(process.args, timeout_s)
    finally:
        os.close(pidfd)
    return process.wait()


def _raise_interrupt(signum: int, frame: object) -> None:
    raise KeyboardInterrupt(f"stopped by {signal.Signals(signum).name}")


def _worker_env(extra_env: dict[str, str]) -> dict[str, str]:
    """The caller's environment without what would change the measurement (named in the
    record: ptspeed.cell.hostenv), with ``extra_env`` and the worker's own variables."""
    env = {**worker_environment(os.environ), **extra_env}
    source_root = str(Path(__file__).resolve().parents[2])
    env["PYTHONPATH"] = os.pathsep.join(p for p in (source_root, env.get("PYTHONPATH")) if p)
    env[WATCHDOG_PID_VARIABLE] = str(os.getpid())
    return env


def end_process_group(process: subprocess.Popen[bytes], grace_s: float = KILL_GRACE_S) -> None:
    """TERM to ``process``'s process group (its workers, torchrun's ranks), KILL to what is
    left after ``grace_s``; nothing where the group is gone."""
    for sig, wait_s in ((signal.SIGTERM, grace_s), (signal.SIGKILL, None)):
        try:
            os.killpg(process.pid, sig)
        except ProcessLookupError:
            return
        try:
            process.wait(timeout=wait_s)
            return
        except subprocess.TimeoutExpired:
            continue


def _worker_record(result_path: Path) -> Record | None:
    if not result_path.exists():
        return None
    try:
        return read_record(result_path)
    except (OSError, ValueError, TypeError):
        return None


def _record_without_worker_result(
    spec: CellSpec, returncode: int | None, timed_out: bool, stderr_tail: str
) -> Record:
    if timed_out:
        status, reason = "timeout", f"no result within the cell's limit of {spec.timeout_s:g} s"
    elif returncode is not None and returncode < 0:
        name = signal.Signals(-returncode).name
        status, reason = "failed", f"worker killed by {name} before writing a result"
        if name == "SIGKILL":
            reason += " (the kernel's out-of-memory killer does this)"
    else:
        status, reason = "failed", f"worker exited with code {returncode} without a result"
    return Record(
        cell=spec, status=status, reason=reason, detail=stderr_tail, provenance=collect_base()
    )


def _tail(path: Path, chars: int | None = STDERR_TAIL_CHARS) -> str:
    try:
        return path.read_text(encoding="utf-8", errors="replace")[-chars if chars else 0 :]
    except OSError:
        return ""


def _relay(stderr_path: Path) -> None:
    """Copy the worker's stderr to ours, so the rule's log holds it."""
    try:
        sys.stderr.write(stderr_path.read_text(encoding="utf-8", errors="replace"))
        sys.stderr.flush()
    except OSError:
        pass
