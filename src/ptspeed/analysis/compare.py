"""Compare two result sets cell by cell, in the manner of ``asv compare``.

Two runs (two machines, before and after a change) each give a ``runs.csv``. Cells are matched
on platform, environment, model, variant, mode and sizes; for each cell present on both sides
the ratio new / old of throughput is given as the report's speedups are
(:func:`ptspeed.analysis.ranks.speedup`: the Hodges–Lehmann ratio, its exact interval with the
confidence it achieves, and the Mann–Whitney p-value), and a mark:

* ``+`` faster, ``-`` slower: by the rule below;
* `` `` (blank) no change called: none measured, one within the minimum effect, one the
  machine's own change explains, one within what two runs of identical code differ by, or too
  few trials to tell;
* ``x`` not comparable: absent from one side, or without ok trials there.

Trials judged perturbed (``perturbed`` in runs.csv) are left out unless kept, as the speedups
leave them out.

**The machine.** Every trial probes the machine's speed just outside its window
(:mod:`ptspeed.cell.measurement.probe`; :func:`ptspeed.analysis.conditions.probe_s`). The probe
runs in the cell's environment, so it times that build's BLAS as well as the machine (on one
AMD CPU the GEMM probe took 60–145 ms under torch 1.13 and 19–39 ms under torch 2.0): probes
are compared only with like probes, per :class:`MachineKey` (platform, device kind, CPU
threads, probe work, environment and its torch build), never pooled across environments. Per
key, the machine's ratio ``m [m_low, m_high]`` is the Hodges–Lehmann ratio new / old of the
probes' speeds (1 / probe_s) over the trials the cells count (:func:`machine_changes`); 1 [1, 1]
where either side did not probe alike.

**The rule.** With ``r [r_low, r_high]`` a cell's ratio, ``t`` the minimum effect and ``a`` the
A/A spread (:data:`AA_SPREAD`), the cell's change beyond the machine's is ``c = r / m``, with
an interval whose half-widths (log scale) are those of ``r``, of ``m`` and ``log(1 + a)``
added in quadrature (:func:`corrected`): the trials' noise, the probe's, and the runs' own.

* ``-`` slower: ``c < 1 - t`` and ``c``'s whole interval below 1; ``+`` faster: ``c > 1 + t``
  and its whole interval above 1. So a real regression is called whether the machine got
  faster (``r`` near 1, ``c`` below), slower or stayed the same;
* the machine explains: ``r`` is significant and beyond ``t`` but ``c`` within ``t`` (a
  machine slower by 20 % and every cell with it): no change, the words say so;
* the machine vetoes: a cell significantly slower than before (``r_high < 1``) is never called
  faster, nor one significantly faster (``r_low > 1``) slower. A loaded machine slows its probe
  more than its cells (on the development VM one spinning process per CPU slowed the probe
  x0.48, the mlp cells x0.66), so a cell that lost less than the probe is no evidence of
  faster code, nor one that gained less than it of slower. The price: a regression smaller
  than a machine's gain in the other direction (machine x1.12, code x0.90, cell x1.01) reads
  as such a cell and is not called;
* between runs: trials of one run share what the run fixes (the machine that day, the files
  cached), which the trials' interval cannot see: ``a`` in ``c``'s interval is that spread. A
  change beyond ``t`` whose interval reaches 1 only through it is no change, and the words say
  to repeat the runs;
* never faster or slower where either side's median measured window is shorter than
  ``min_window_s``: windows that short are not judged for load either, and two runs of
  identical code on the development VM once differed by x0.91 [0.89–0.97] in 0.4 s windows
  with the probe unchanged; ``change`` says so and asks for longer windows.

:data:`AA_SPREAD` (5 %) is measured: two runs of identical code on the development VM with 2 s
windows (README's A/A table; tests/test_probe.py, ``PTSPEED_AA=1``) gave cell ratios x0.98,
x0.99 and x1.01 and probe ratios x0.98 and x0.96; the root mean square of their logs is 2.3 %,
so 95 % of such ratios lie within ±1.96 x 2.3 % = ±4.5 %, rounded up to 5 %. It includes the
trials' own noise (a ratio of two medians of 5), so adding it to the trials' interval is
cautious. A machine whose A/A runs differ more (measure it: ``PTSPEED_AA=1``) passes its own
(``aa_spread``, ``--aa-spread``).

The minimum effect ``t`` (``compare.min_effect``, 5 %) is the smallest change worth a mark; by
default it is no smaller than the A/A spread, so an estimate beyond it is beyond what identical
runs showed (a smaller one still needs its interval clear of the A/A spread).
``conditions.max_probe_deviation`` (15 %) is a different test: it drops a single trial
whose probe is far from its run's median, a bound wide enough for the probe's own noise within
an environment; the smaller machine changes it lets through are not taken for code, because
``m`` is measured on the very trials each cell counts and ``c`` divides it out, its interval
widened by ``m``'s. Where the probe is as noisy as on issue 36's AMD VM (torch 1.13's GEMM
probe 60–145 ms within one quiet run), ``m``'s interval is wide (x0.87–1.32 from 16 and 6
trials) and so is ``c``'s: smaller changes go uncalled there, the words saying the probe's
noise is why.

Defaults (:func:`run_defaults`): the minimum effect (``compare.min_effect``), the window
(``conditions.min_window_s``) and ``keep_perturbed`` are the compared run's own, from the
``config.json`` its workflow wrote beside its tables (the new run's, else the old run's),
else the config schema's.

The text (:mod:`ptspeed.render.comparison`) says first, per machine key, each run's probe and
whether the machine changed between the runs (:data:`MACHINE_CHANGE`), then the rule with its
numbers, then the cells. Where both result sets have a
``speedups.csv`` beside their ``runs.csv``, :func:`cross_check_speedups` checks each
comparison's speedup of one run against the other's interval, both ways: two runs of one matrix
on one machine should agree.
"""

from __future__ import annotations

import math
import statistics
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any, NamedTuple

import pandas as pd

from ptspeed.analysis import ranks
from ptspeed.analysis.aggregate import read_mapping
from ptspeed.analysis.columns import (
    ALPHA,
    CELL_KEYS,
    CONFIDENCE,
    platform_column,
    read_table,
)
from ptspeed.analysis.conditions import counted_in_speedups, probe_kind, probe_s, settings
from ptspeed.analysis.summary import status_counts
from ptspeed.errors import InputError
from ptspeed.plan.layout import (
    SIZE_KEYS,
    runs_csv_of,
)
from ptspeed.plan.schema import fill_defaults, load_schema

FASTER, SLOWER, SAME, NOT_COMPARABLE = "+", "-", " ", "x"
# Two runs of identical code differ by up to this ratio (95 %): measured, see the docstring.
AA_SPREAD = 0.05
# The machine changed between the runs when its probe's ratio is significant and beyond this
# (one thread's probe varies by about 3 % within a quiet run on the development VM).
MACHINE_CHANGE = 0.03
# The config the workflow writes beside a run's tables (rule effective_config).
CONFIG_SNAPSHOT = "config.json"
# Tables from before platforms have no platform column: they are one unnamed platform.
REQUIRED_COLUMNS = [
    *(key for key in CELL_KEYS if key != "platform"),
    "status",
    "throughput_samples_per_s",
]
COMPARE_COLUMNS = [
    "mark",
    *CELL_KEYS,
    "old_samples_per_s",
    "old_trials",
    "new_samples_per_s",
    "new_trials",
    "ratio",
    "ratio_low",
    "ratio_high",
    "ratio_confidence",
    "p_value",
    "significant",
    "machine_ratio",
    "machine_low",
    "machine_high",
    "machine_confidence",
    "corrected_ratio",
    "corrected_low",
    "corrected_high",
    "change",
]


def read_runs(path: str | Path) -> pd.DataFrame:
    """The runs table of a result set, checked for the columns a comparison needs."""
    csv = runs_csv_of(path)
    try:
        runs = read_table(csv)
    except (pd.errors.ParserError, pd.errors.EmptyDataError, UnicodeDecodeError) as error:
        raise InputError(f"{csv}: not a runs table ({error})") from error
    missing = [column for column in REQUIRED_COLUMNS if column not in runs.columns]
    if missing:
        raise InputError(f"{csv}: not a runs table, lacks columns: {', '.join(missing)}")
    return runs


# --- defaults ------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Defaults:
    """The settings a comparison uses where not given, and where they came from."""

    min_effect: float
    min_window_s: float
    keep_perturbed: bool
    source: str


def compare_settings(config: Mapping[str, Any] | None) -> dict[str, Any]:
    """The ``compare`` settings of ``config``, the schema's defaults filling the gaps."""
    given = (config or {}).get("compare")
    filled: dict[str, Any] = {"compare": dict(given) if isinstance(given, Mapping) else {}}
    fill_defaults(filled, {"properties": {"compare": load_schema()["properties"]["compare"]}})
    return filled["compare"]


def config_beside(runs_path: str | Path) -> Path | None:
    """The config snapshot of a result set: ``config.json`` in its results directory (beside
    ``tables/``) or beside its runs.csv; None where there is none."""
    csv = runs_csv_of(runs_path)
    for directory in (csv.parent, csv.parent.parent):
        if (directory / CONFIG_SNAPSHOT).is_file():
            return directory / CONFIG_SNAPSHOT
    return None


def run_defaults(old_path: str | Path, new_path: str | Path) -> Defaults:
    """The compared run's own settings: from the new run's config snapshot, else the old
    run's, else the schema's defaults."""
    for path in (config_beside(new_path), config_beside(old_path)):
        if path is not None:
            return defaults_of(read_mapping(path), str(path))
    return defaults_of(None, "the config schema")


def defaults_of(config: Mapping[str, Any] | None, source: str) -> Defaults:
    conditions = settings(config)
    return Defaults(
        float(compare_settings(config)["min_effect"]),
        float(conditions["min_window_s"]),
        bool(conditions["keep_perturbed"]),
        source,
    )


# --- comparing -----------------------------------------------------------------------------------


def compare_runs(
    old: pd.DataFrame,
    new: pd.DataFrame,
    threshold: float | None = None,
    keep_perturbed: bool = False,
    min_window_s: float | None = None,
    aa_spread: float = AA_SPREAD,
) -> pd.DataFrame:
    """One row per cell of either side (sorted by cell), columns :data:`COMPARE_COLUMNS`.

    ``ratio`` is new / old median throughput over the ok trials (the perturbed ones left out
    unless ``keep_perturbed``); above 1 means faster; ``corrected_ratio`` divides it by its
    environment's machine. ``threshold`` (the minimum effect) and ``min_window_s`` default to
    the config schema's; :func:`run_defaults` gives a run's own.
    """
    schema = defaults_of(None, "")
    threshold = schema.min_effect if threshold is None else threshold
    min_window_s = schema.min_window_s if min_window_s is None else min_window_s
    if not 0.0 <= threshold < 1.0:
        raise InputError(f"threshold must lie in [0, 1), got {threshold}")
    if not 0.0 <= aa_spread < 1.0:
        raise InputError(f"aa_spread must lie in [0, 1), got {aa_spread}")
    rule = Rule(threshold, aa_spread, min_window_s)
    old_cells, new_cells = cells_of(old, keep_perturbed), cells_of(new, keep_perturbed)
    machines = machine_changes(old, new, keep_perturbed)
    keys = sorted(old_cells.keys() | new_cells.keys(), key=_sort_key)
    rows = [_compared(key, old_cells.get(key), new_cells.get(key), rule, machines) for key in keys]
    return pd.DataFrame(rows, columns=COMPARE_COLUMNS)


def cells_of(
    runs: pd.DataFrame, keep_perturbed: bool = False
) -> dict[tuple[Any, ...], dict[str, Any]]:
    """Per cell: its ok throughputs (finite, positive; not perturbed unless ``keep_perturbed``)
    with their windows' lengths and machine keys, and all its statuses. Rows whose cell is
    unknown (an unreadable file outside the workflow's layout) cannot be matched and are left
    out."""
    # Only the same platform is compared across runs; a run without platforms is one unnamed.
    known = _known(runs)
    rates = pd.to_numeric(known["throughput_samples_per_s"], errors="coerce")
    rates = rates.where(counted_in_speedups(known, keep_perturbed))
    cells: dict[tuple[Any, ...], dict[str, Any]] = {}
    columns = [known[key].tolist() for key in CELL_KEYS]
    machines = [machine_key(row) for row in known.to_dict("records")]
    windows = (
        pd.to_numeric(known["window_s"], errors="coerce")
        if "window_s" in known.columns
        else pd.Series(math.nan, index=known.index)
    )
    trials = zip(*columns, known["status"], rates, machines, windows, strict=True)
    for *key, status, rate, machine, window in trials:
        cell = cells.setdefault(
            tuple(_plain(v) for v in key),
            {"rates": [], "statuses": [], "machines": [], "windows": []},
        )
        cell["statuses"].append(status)
        if status == "ok" and math.isfinite(rate) and rate > 0:
            cell["rates"].append(float(rate))
            cell["machines"].append(machine)
            cell["windows"].append(float(window))
    return cells


def _known(runs: pd.DataFrame) -> pd.DataFrame:
    """The rows whose cell is known, with their platform (a run without platforms: one
    unnamed)."""
    known = runs[runs["env"].notna()]
    return known.assign(platform=platform_column(known))


# --- the machine -----------------------------------------------------------------------------


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
    threads = _plain(row.get("probe_threads")) if kind == "cpu" else None
    text = [_plain(row.get(k)) for k in ("platform", "probe_work", "env", "torch")]
    platform, work, env, torch = ("" if v is None else str(v) for v in text)
    return MachineKey(platform, kind, threads, work, env, torch)


def probe_speeds(runs: pd.DataFrame, keep_perturbed: bool = False) -> dict[MachineKey, list[float]]:
    """Per machine key, the machine's speed (1 / probe_s) of each ok trial a cell counts
    (the perturbed left out unless ``keep_perturbed``); trials without probes in no key."""
    known = _known(runs)
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


def _machine_of(
    old: Mapping[str, Any], new: Mapping[str, Any], machines: Mapping[MachineKey, Machine]
) -> Machine | None:
    """The machine a cell ran on in both runs: its key where it is one and the same on both
    sides and both probed; None otherwise."""
    keys = set(old.get("machines", [])) | set(new.get("machines", []))
    if len(keys) != 1:
        return None
    machine = machines.get(keys.pop())
    return machine if machine is not None and machine.ratio is not None else None


def _plain(value: Any) -> Any:
    """A key part that compares equal across the two tables (NaN != NaN would split cells)."""
    if value is None or value is pd.NA or (isinstance(value, float) and math.isnan(value)):
        return None
    return int(value) if isinstance(value, float) and value.is_integer() else value


def _sort_key(key: tuple[Any, ...]) -> tuple[Any, ...]:
    # Blanks last; numbers before text, so that a stray text size never meets an int.
    return tuple((v is None, isinstance(v, str), 0 if v is None else v) for v in key)


# --- the verdict -----------------------------------------------------------------------------


@dataclass(frozen=True)
class Rule:
    """The numbers a verdict uses: the minimum effect, the A/A spread and the shortest
    window a change is called in (seconds)."""

    min_effect: float
    aa_spread: float
    min_window_s: float

    @classmethod
    def of(cls, config: Mapping[str, Any] | None) -> Rule:
        """The rule a run's config sets (the schema's defaults filling the gaps)."""
        defaults = defaults_of(config, "")
        return cls(defaults.min_effect, AA_SPREAD, defaults.min_window_s)


def corrected(
    ratio: ranks.Ratio, machine: Machine | None, aa_spread: float
) -> tuple[float, float, float]:
    """(c, low, high): the cell's ratio divided by its machine's, and an interval whose
    half-widths on the log scale are the ratio's, the machine's and ``log(1 + aa_spread)``
    added in quadrature (independent errors; each about 95 %)."""
    m, m_low, m_high = machine.bounds() if machine is not None else (1.0, 1.0, 1.0)
    between = math.log1p(aa_spread)
    c = ratio.estimate / m
    up = math.hypot(math.log(ratio.high / ratio.estimate), math.log(m / m_low), between)
    down = math.hypot(math.log(ratio.estimate / ratio.low), math.log(m_high / m), between)
    return c, c * math.exp(-down), c * math.exp(up)


def _compared(
    key: tuple[Any, ...],
    old: Mapping[str, Any] | None,
    new: Mapping[str, Any] | None,
    rule: Rule,
    machines: Mapping[MachineKey, Machine],
) -> dict[str, Any]:
    row: dict[str, Any] = {
        **dict(zip(CELL_KEYS, key, strict=True)),
        **_side("old", old),
        **_side("new", new),
        **dict.fromkeys(COMPARE_COLUMNS[COMPARE_COLUMNS.index("ratio") :], math.nan),
        "significant": False,
    }
    absent = _why_not_comparable(old, new)
    if absent:
        return {**row, "mark": NOT_COMPARABLE, "change": absent}
    assert old is not None and new is not None
    ratio = ranks.speedup(old["rates"], new["rates"], CONFIDENCE, ALPHA)
    row.update(ratio.columns("ratio"))
    machine = _machine_of(old, new, machines)
    if machine is not None and machine.ratio is not None:
        m = machine.ratio
        row.update(
            machine_ratio=m.estimate,
            machine_low=m.low,
            machine_high=m.high,
            machine_confidence=m.achieved_confidence,
        )
    if not math.isnan(ratio.low):
        c, low, high = corrected(ratio, machine, rule.aa_spread)
        row.update(corrected_ratio=c, corrected_low=low, corrected_high=high)
    mark, change = _judged(ratio, rule, machine, _shortest_window(old, new))
    return {**row, "mark": mark, "change": change}


def _shortest_window(old: Mapping[str, Any], new: Mapping[str, Any]) -> float:
    """The shorter of the two sides' median measured windows (seconds; inf where unknown)."""
    medians = [
        statistics.median(known)
        for cell in (old, new)
        if (known := [w for w in cell.get("windows", []) if math.isfinite(w)])
    ]
    return min(medians, default=math.inf)


def _side(prefix: str, cell: Mapping[str, Any] | None) -> dict[str, Any]:
    rates = cell["rates"] if cell else []
    median = statistics.median(rates) if rates else math.nan
    return {f"{prefix}_samples_per_s": median, f"{prefix}_trials": len(rates)}


def _why_not_comparable(old: Mapping[str, Any] | None, new: Mapping[str, Any] | None) -> str:
    reasons = []
    for name, cell in (("old", old), ("new", new)):
        if cell is None:
            reasons.append(f"not in {name}")
        elif not cell["rates"]:
            reasons.append(f"no ok trials in {name} ({status_counts(pd.Series(cell['statuses']))})")
    return "; ".join(reasons)


def _judged(
    ratio: ranks.Ratio, rule: Rule, machine: Machine | None = None, window_s: float = math.inf
) -> tuple[str, str]:
    """The mark and its words by the rule of the module docstring (``window_s``: the shorter
    side's median measured window)."""
    if math.isnan(ratio.low):
        return SAME, "too few ok trials for a test (2 per side needed)"
    floor = ranks.smallest_p_value(ratio.n_baseline, ratio.n_candidate)
    if floor >= ratio.alpha:
        return SAME, (
            f"too few ok trials to detect a change ({ratio.n_baseline} and "
            f"{ratio.n_candidate}: p >= {floor:.2g} whatever they measure)"
        )
    c, low, high = corrected(ratio, machine, rule.aa_spread)
    m = machine.bounds()[0] if machine is not None else 1.0
    beyond = abs(c - 1.0) > rule.min_effect
    if beyond and (high < 1.0 or low > 1.0):
        return _beyond(ratio, c, m, rule, window_s)
    if beyond:
        return SAME, _within_noise(ratio, c, machine, rule)
    if ratio.significant and abs(ratio.estimate - 1.0) > rule.min_effect:
        explained = f"x{ratio.estimate:.2f}, as the machine's own change explains"
        return SAME, f"{explained} ({_beside(c, m)})"
    if ratio.significant:
        return SAME, f"significant, but within the {rule.min_effect:.0%} threshold"
    return SAME, "no significant change"


def _beyond(ratio: ranks.Ratio, c: float, m: float, rule: Rule, window_s: float) -> tuple[str, str]:
    """The verdict on a change beyond the minimum effect whose whole interval lies on one
    side of no change: called, unless the cell moved against it or its windows are short."""
    slower = c < 1.0
    word = "slower" if slower else "faster"
    if (ratio.high < 1.0) if not slower else (ratio.low > 1.0):
        moved = "slower" if ratio.high < 1.0 else "faster"
        return SAME, (
            f"x{ratio.estimate:.2f}: {moved} than before, but by less than the machine "
            f"({_beside(c, m)}): a changed machine moves cells less than its probe, so not "
            f"called {word}"
        )
    if window_s < rule.min_window_s:
        return SAME, (
            f"{word} by the numbers, but its windows ({window_s:.2f} s) are shorter than the "
            f"{rule.min_window_s:g} s a change is called on (conditions.min_window_s): "
            "lengthen steps.measured"
        )
    if abs(m - 1.0) > MACHINE_CHANGE:
        return (SLOWER if slower else FASTER), f"{word} beyond the machine ({_beside(c, m)})"
    return (SLOWER if slower else FASTER), word


def _within_noise(ratio: ranks.Ratio, c: float, machine: Machine | None, rule: Rule) -> str:
    """Words for a change beyond the minimum effect whose interval reaches no change: which
    noise lets it (the runs' own spread, the machine's probe, or the trials themselves)."""
    _, low, high = corrected(ratio, machine, 0.0)
    if high < 1.0 or low > 1.0:
        return (
            f"x{c:.2f} beside the machine, within the ±{rule.aa_spread:.0%} two runs of identical "
            "code differ by (A/A): repeat the runs to tell"
        )
    if ratio.significant:
        return f"x{c:.2f} beside the machine, but not significant beside its probe's own noise"
    return "no significant change"


def _beside(c: float, m: float) -> str:
    return f"machine x{m:.2f}; ratio / machine x{c:.2f}"


def regressions(compared: pd.DataFrame) -> pd.DataFrame:
    """The cells that got significantly slower by more than the threshold."""
    return compared[compared["mark"] == SLOWER]


# --- speedups, both ways ---------------------------------------------------------------------

SPEEDUP_KEYS = ["comparison", "model", "mode", *SIZE_KEYS]
# A speedups.csv column and its name in the cross-check, after old_ or new_.
_PARTS = {
    "speedup": "speedup",
    "speedup_low": "low",
    "speedup_high": "high",
    "speedup_confidence": "confidence",
}
CROSS_CHECK_COLUMNS = [
    *SPEEDUP_KEYS,
    *(f"{side}_{part}" for side in ("old", "new") for part in _PARTS.values()),
    "new_inside_old",
    "old_inside_new",
]


def speedups_beside(runs_path: str | Path) -> Path | None:
    """The speedups.csv beside a result set's runs.csv, if there is one."""
    candidate = runs_csv_of(runs_path).with_name("speedups.csv")
    return candidate if candidate.is_file() else None


def cross_check_speedups(old: pd.DataFrame, new: pd.DataFrame) -> pd.DataFrame:
    """Per speedup measured in both (comparison, model, mode, sizes): both estimates and
    intervals, and whether each lies inside the other's interval (columns
    :data:`CROSS_CHECK_COLUMNS`)."""

    def side(frame: pd.DataFrame, prefix: str) -> pd.DataFrame:
        frame = frame[pd.to_numeric(frame["speedup"], errors="coerce").notna()]
        names = {column: f"{prefix}_{part}" for column, part in _PARTS.items()}
        return frame[[*SPEEDUP_KEYS, *_PARTS]].rename(columns=names)

    both = side(old, "old").merge(side(new, "new"), on=SPEEDUP_KEYS, how="inner")
    both["new_inside_old"] = both["new_speedup"].between(both["old_low"], both["old_high"])
    both["old_inside_new"] = both["old_speedup"].between(both["new_low"], both["new_high"])
    return both[CROSS_CHECK_COLUMNS].reset_index(drop=True)
