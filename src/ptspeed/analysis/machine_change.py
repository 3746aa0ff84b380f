"""The machine between two runs (:mod:`ptspeed.analysis.compare`): per :class:`MachineKey`
(platform, device kind, CPU threads, probe work, environment and its torch build), the speeds
of the machine-speed probes of the trials the cells count, and the Hodges–Lehmann ratio new /
old of them (:func:`machine_changes`), which a cell's ratio is divided by. Probes are compared
only with like probes, never pooled across environments: the probe runs in the cell's
environment, so it times that build's BLAS as well as the machine.
"""

from __future__ import annotations

import math
import statistics
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, NamedTuple

import pandas as pd

from ptspeed.analysis import ranks
from ptspeed.analysis.columns import ALPHA, CONFIDENCE
from ptspeed.analysis.compare_inputs import known_rows, plain_value
from ptspeed.analysis.conditions import counted_in_speedups
from ptspeed.analysis.trial_readings import probe_kind, probe_s

# The machine changed between the runs when its probe's ratio is significant and beyond this
# (one thread's probe varies by about 3 % within a quiet run on the development VM).
MACHINE_CHANGE = 0.03


class MachineKey(NamedTuple):
    """What a machine-speed probe is compared with: probes of the same work, threads and
    device on the same platform, made in the same environment by the same torch build (the
    probe times the build's BLAS too)."""

    platform: str
    kind: str
    threads: int | None
    work: str
    env: str
    torch: str


def machine_key(row: Mapping[str, Any]) -> MachineKey:
    """A trial's :class:`MachineKey` from its runs.csv row (kind '' where it did not probe;
    a GPU's probe does not depend on the CPU threads)."""
    kind = probe_kind(row)
    threads = plain_value(row.get("probe_threads")) if kind == "cpu" else None
    text = [plain_value(row.get(k)) for k in ("platform", "probe_work", "env", "torch")]
    platform, work, env, torch = ("" if v is None else str(v) for v in text)
    return MachineKey(platform, kind, threads, work, env, torch)


def probe_speeds(runs: pd.DataFrame, keep_perturbed: bool = False) -> dict[MachineKey, list[float]]:
    """Per machine key, the machine's speed (1 / probe_s) of each ok trial a cell counts
    (the perturbed left out unless ``keep_perturbed``); trials without probes in no key."""
    known = known_rows(runs)
    counted = counted_in_speedups(known, keep_perturbed)
    speeds: dict[MachineKey, list[float]] = {}
    for row, use in zip(known.to_dict("records"), counted, strict=True):
        seconds = probe_s(row) if use and row.get("status") == "ok" else math.nan
        if math.isfinite(seconds) and seconds > 0:
            speeds.setdefault(machine_key(row), []).append(1.0 / seconds)
    return speeds


@dataclass(frozen=True)
class Machine:
    """One machine key in both runs: each run's median probe (seconds) and trials, and the
    ratio new / old of its speed (None where a side did not probe)."""

    key: MachineKey
    old_probe_s: float
    old_trials: int
    new_probe_s: float
    new_trials: int
    ratio: ranks.Ratio | None

    def changed(self) -> bool:
        """The probe's change is significant and beyond :data:`MACHINE_CHANGE`."""
        ratio = self.ratio
        return (
            ratio is not None and ratio.significant and abs(ratio.estimate - 1.0) > MACHINE_CHANGE
        )

    def bounds(self) -> tuple[float, float, float]:
        """(m, m_low, m_high): the machine's ratio and interval; where it has no interval,
        the estimate for both ends; where it was not probed on both sides, 1, 1, 1."""
        if self.ratio is None or math.isnan(self.ratio.estimate):
            return 1.0, 1.0, 1.0
        m = self.ratio.estimate
        low, high = self.ratio.low, self.ratio.high
        return (m, m, m) if math.isnan(low) else (m, low, high)


def machine_changes(
    old: pd.DataFrame, new: pd.DataFrame, keep_perturbed: bool = False
) -> dict[MachineKey, Machine]:
    """Per machine key of either run, its :class:`Machine`."""
    old_speeds, new_speeds = probe_speeds(old, keep_perturbed), probe_speeds(new, keep_perturbed)
    machines = {}
    for key in sorted(old_speeds.keys() | new_speeds.keys(), key=_key_order):
        before, after = old_speeds.get(key, []), new_speeds.get(key, [])
        ratio = ranks.speedup(before, after, CONFIDENCE, ALPHA) if before and after else None
        machines[key] = Machine(
            key,
            1.0 / statistics.median(before) if before else math.nan,
            len(before),
            1.0 / statistics.median(after) if after else math.nan,
            len(after),
            ratio,
        )
    return machines


def _key_order(key: MachineKey) -> tuple[str, ...]:
    return tuple("" if v is None else str(v) for v in key)


def machine_of(
    old: Mapping[str, Any], new: Mapping[str, Any], machines: Mapping[MachineKey, Machine]
) -> Machine | None:
    """The machine a cell ran on in both runs: its key where it is one and the same on both
    sides and both probed; None otherwise."""
    keys = set(old.get("machines", [])) | set(new.get("machines", []))
    if len(keys) != 1:
        return None
    machine = machines.get(keys.pop())
    return machine if machine is not None and machine.ratio is not None else None
