"""What torch.compile did in a cell: graphs, graph breaks, recompilations, compile time by phase.

Read from Dynamo's own bookkeeping, which differs between torch versions and is not public
API, so every read is guarded: what a version does not expose is left out (null or empty in
the record), never a failure. What each version has:

* ``torch._dynamo.utils.counters``: ``stats/unique_graphs`` (graphs compiled) and
  ``graph_break`` (reason -> count), in 2.0.1 and 2.14.1;
* recompilations: in 2.14.1 the compilation metrics that carry a ``recompile_reason``
  (``get_compilation_metrics``: the last 64 compilations), in 2.0.1 ``guard_failures`` (one
  entry per recompilation);
* ``compile_times(repr="csv", aggregate=True)``: seconds per timed function of the compiler
  (2.0.1: Dynamo's ``_compile`` and the backend call; 2.14.1 also bytecode tracing, guards,
  AOTAutograd and Inductor phases). Phases nest: their sum is not the total.

:func:`reset` empties this bookkeeping before a compiled cell, so that a process that runs
several cells (the test suite) records each cell's own.
"""

from __future__ import annotations

import contextlib
from typing import Any

REASONS_KEPT = 5
REASON_CHARACTERS = 300


def _dynamo_utils() -> Any:
    try:
        from torch._dynamo import utils
    except ImportError:  # torch 1.13: no compiler
        return None
    return utils


def reset() -> None:
    """Empty Dynamo's caches, counters, guard failures and compile times."""
    utils = _dynamo_utils()
    if utils is None:
        return
    import torch._dynamo

    torch._dynamo.reset()
    utils.counters.clear()
    for name in ("compilation_time_metrics", "compilation_metrics"):  # 2.14.1, 2.0.1
        with contextlib.suppress(AttributeError, TypeError):
            getattr(utils, name).clear()
    with contextlib.suppress(AttributeError):
        utils.clear_compilation_metrics()


def collect() -> dict[str, Any]:
    """What the compiler did since :func:`reset`, by the name of its field in the record's
    Metrics; only what this torch exposes ({} where torch has no compiler)."""
    utils = _dynamo_utils()
    if utils is None:
        return {}
    stats: dict[str, Any] = {}
    with contextlib.suppress(Exception):
        stats["compiled_graphs"] = int(utils.counters["stats"]["unique_graphs"])
    with contextlib.suppress(Exception):
        breaks = utils.counters["graph_break"]
        stats["graph_breaks"] = int(sum(breaks.values()))
        stats["graph_break_reasons"] = _first_lines(breaks)
    with contextlib.suppress(Exception):
        reasons = _recompile_reasons(utils)
        stats["recompilations"] = len(reasons)
        stats["recompile_reasons"] = _first_lines(dict.fromkeys(reasons))
    with contextlib.suppress(Exception):
        names, seconds = utils.compile_times(repr="csv", aggregate=True)
        phases = zip(names, seconds, strict=True)
        stats["compile_time_by_phase_s"] = {name: float(s) for name, s in phases}
    return stats


def _recompile_reasons(utils: Any) -> list[str]:
    metrics = getattr(utils, "get_compilation_metrics", None)
    if metrics is not None:
        return [m.recompile_reason for m in metrics() if getattr(m, "recompile_reason", None)]
    return [str(reason) for reasons in utils.guard_failures.values() for reason in reasons]


def _first_lines(reasons: Any) -> list[str]:
    """The first REASONS_KEPT reasons, each by its first line, shortened."""
    kept = []
    for reason in list(reasons)[:REASONS_KEPT]:
        lines = str(reason).strip().splitlines()
        kept.append((lines[0] if lines else "")[:REASON_CHARACTERS])
    return kept
