"""The launcher side of a distributed cell: the torchrun command, and one record from N ranks.

A ddp/fsdp cell runs as ``python -m ptspeed.launch.worker --launch SPEC RESULT``, which becomes
(``exec``) ``python -m torch.distributed.run ... -m ptspeed.launch.worker --rank SPEC RESULT``. Each
rank writes its own outcome (its record and, when it failed, the time it failed) beside RESULT;
the watchdog then makes the cell's one record with :func:`merged_record`: rank 0's when every
rank finished, else a failure naming the rank that caused it.

Which rank caused a failure: when one rank dies, the others fail too (gloo raises "connection
closed by peer"; NCCL waits until torchrun terminates them), so the cause is, in this order,
a rank that died without writing an outcome (a signal other than torchrun's own SIGTERM, or an
exit before the harness ran), else the rank whose own failure came first, else a rank that
torchrun terminated. torchrun's own "root cause" is not used: it orders failures by whole
seconds. The signals and exit codes of ranks that wrote nothing come from torchrun's failure
summary (the same layout in torch 1.13 to 2.14).

Standard library only: this runs in the watchdog, which does not import torch.
"""

from __future__ import annotations

import json
import re
import signal
from dataclasses import dataclass
from pathlib import Path

from ptspeed.cell.files import write_atomic
from ptspeed.cell.provenance import collect_base
from ptspeed.cell.record import CellSpec, Record

LAUNCH_FLAG = "--launch"
RANK_FLAG = "--rank"
FINISHED = ("ok", "unsupported", "numerics_mismatch")
# torch 1.13 polls its ranks every 5 s by default: a failed rank would hold the others that long.
MONITOR_INTERVAL_S = 0.5
_LAUNCHER_FAILURE = re.compile(
    r"rank\s*:\s*(\d+)\s*\(local_rank:\s*\d+\)\s*\n\s*exitcode\s*:\s*(-?\d+)"
)


@dataclass
class RankOutcome:
    rank: int
    record: Record
    failed_at: float | None  # time.time() when the rank's record was made, for failures


def torchrun_command(python: str, world_size: int, worker_arguments: list[str]) -> list[str]:
    """``python -m torch.distributed.run`` starting ``world_size`` ranks of the worker.

    Underscored options and an explicit rendezvous on port 0: torch 1.13 knows no dashed
    spellings, and its ``--standalone`` uses the fixed port 29400, so that two cells started
    at once on one node would collide (or join one job).
    """
    return [
        python,
        "-m",
        "torch.distributed.run",
        "--nnodes",
        "1",
        "--nproc_per_node",
        str(world_size),
        "--rdzv_backend",
        "c10d",
        "--rdzv_endpoint",
        "localhost:0",
        "--max_restarts",
        "0",
        "--monitor_interval",
        str(MONITOR_INTERVAL_S),
        "-m",
        "ptspeed.launch.worker",
        RANK_FLAG,
        *worker_arguments,
    ]


def rank_outcome_path(result_path: Path, rank: int) -> Path:
    return result_path.with_name(f"{result_path.stem}.rank{rank}.json")


def write_rank_outcome(
    result_path: Path, rank: int, record: Record, failed_at: float | None
) -> None:
    content = {"rank": rank, "failed_at": failed_at, "record": record.to_dict()}
    write_atomic(rank_outcome_path(result_path, rank), json.dumps(content, allow_nan=False))


def read_rank_outcomes(result_path: Path, world_size: int) -> dict[int, RankOutcome]:
    outcomes = {}
    for rank in range(world_size):
        try:
            content = json.loads(rank_outcome_path(result_path, rank).read_text(encoding="utf-8"))
            record = Record.from_dict(content["record"])
        except (OSError, ValueError, TypeError, KeyError):
            continue
        outcomes[rank] = RankOutcome(rank, record, content.get("failed_at"))
    return outcomes


def launcher_failures(launcher_output: str) -> dict[int, int]:
    """Rank -> exit code (negative: killed by that signal) from torchrun's failure summary."""
    return {int(rank): int(code) for rank, code in _LAUNCHER_FAILURE.findall(launcher_output)}


def merged_record(
    spec: CellSpec, result_path: Path, world_size: int, launcher_output: str, returncode: int | None
) -> Record | None:
    """The cell's one record from its ranks' outcomes; None when there is nothing to go on."""
    outcomes = read_rank_outcomes(result_path, world_size)
    if len(outcomes) == world_size and all(o.record.status in FINISHED for o in outcomes.values()):
        return outcomes[0].record
    exits = {r: c for r, c in launcher_failures(launcher_output).items() if r not in outcomes}
    silent = {r: c for r, c in exits.items() if c != -signal.SIGTERM}
    failed = [o for o in outcomes.values() if o.record.status not in FINISHED]
    if silent:
        rank = min(silent)
        return _failure(spec, outcomes, rank, world_size, _exit_cause(silent[rank]))
    if failed:
        first = min(failed, key=lambda o: (o.failed_at or float("inf"), o.rank))
        record = first.record
        record.reason = f"rank {first.rank} of {world_size}: {record.reason}"
        return record
    if exits:
        rank = min(exits)
        return _failure(spec, outcomes, rank, world_size, _exit_cause(exits[rank]))
    if not outcomes:
        return None
    missing = [r for r in range(world_size) if r not in outcomes]
    cause = f"rank(s) {', '.join(map(str, missing))} of {world_size} wrote no result"
    return _failure(spec, outcomes, None, world_size, f"{cause}; torchrun exited with {returncode}")


def _exit_cause(code: int) -> str:
    if code >= 0:
        return f"exited with code {code} without a result"
    try:
        name = signal.Signals(-code).name
    except ValueError:
        name = f"signal {-code}"
    if name == "SIGKILL":
        return "killed by SIGKILL (the kernel's out-of-memory killer does this)"
    return f"killed by {name}"


def _failure(
    spec: CellSpec,
    outcomes: dict[int, RankOutcome],
    rank: int | None,
    world_size: int,
    cause: str,
) -> Record:
    known = [o.record.provenance for o in outcomes.values() if o.record.provenance.torch]
    reason = cause if rank is None else f"rank {rank} of {world_size}: {cause}"
    return Record(
        cell=spec,
        status="failed",
        reason=reason,
        provenance=known[0] if known else collect_base(),
    )
