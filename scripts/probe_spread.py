"""How far a quiet machine's machine-speed probes stray from their median, per environment.

    python scripts/probe_spread.py --python .venv/bin/python --env host --trials 15 \
        --threads 1 --out /tmp/spread [--device cuda] [--csv probes.csv]

Runs ``--trials`` real cells (``python -m ptspeed cell``, the mlp model, each its own process,
one at a time) with the given interpreter, as ``--env``; each probes the machine just before
and just after its measured window (ptspeed.cell.measurement.probe). Then reads the records as
aggregation does and prints, per probe group (environment and build, threads, work), the
median probe, each end's deviation from it (the largest, and the share beyond the default
``conditions.max_probe_deviation``), what the group's own spread makes of the rule, and the
load beside the trials (other processes' share of the CPUs, steal), so that a noisy machine
is not taken for a noisy probe. Run it once per environment (``--python`` each one's
interpreter; the same ``--out`` gathers them) on a quiet machine: the numbers behind
``PROBE_SPREAD`` in ptspeed.analysis.conditions and the default threshold. ``--csv`` writes the
trials' probe fields (tests/fixtures/probes/'s layout).
"""

from __future__ import annotations

import argparse
import math
import subprocess
import sys
from pathlib import Path

import pandas as pd
from _checkout import ROOT

from ptspeed.analysis.aggregate import load_tables
from ptspeed.analysis.conditions import (
    PROBE_FIXTURE_COLUMNS,
    QUIET_SHARE,
    judge_runs,
    probe_norms,
    quiet_spread,
)
from ptspeed.analysis.trial_readings import other_cpu_share, probe_ends, probe_group, steal_share
from ptspeed.plan.schema import section_with_defaults

# mlp at batch 32: about a second of measured window on a 2-core VM, as long as a short cell.
MODEL = ["--model", "mlp", "--batch-size", "32", "--warmup-steps", "3", "--numerics-steps", "0"]
SIZE = "b32"


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--python", default=sys.executable, help="the environment's interpreter")
    parser.add_argument("--env", default="host", help="the environment's name in the records")
    parser.add_argument("--trials", type=int, default=15, help="cells to run (0: only read --out)")
    parser.add_argument("--threads", type=int, default=1, help="torch threads of each cell")
    parser.add_argument("--steps", type=int, default=160, help="measured steps of each cell")
    parser.add_argument("--device", default="cpu", help="cpu, cuda or cuda:N")
    parser.add_argument("--out", type=Path, required=True, help="where the records go")
    parser.add_argument("--csv", type=Path, help="write the trials' probe fields here")
    return parser.parse_args(argv)


def run_cells(args: argparse.Namespace) -> None:
    directory = args.out / "records" / args.env / "mlp" / "eager" / "train" / SIZE
    directory.mkdir(parents=True, exist_ok=True)
    first = len(list(directory.glob("trial*.json")))
    for trial in range(first, first + args.trials):
        out = directory / f"trial{trial}.json"
        command = [
            args.python, "-m", "ptspeed", "cell", *MODEL, "--measured-steps", str(args.steps),
            "--env", args.env, "--trial", str(trial), "--device", args.device,
            "--threads", str(args.threads), "--out", str(out),
        ]  # fmt: skip
        done = subprocess.run(
            command, cwd=ROOT, env=_with_sources(), capture_output=True, text=True, check=False
        )
        if not out.exists():
            raise SystemExit(f"{args.env} trial {trial}: no record\n{done.stderr[-2000:]}")
        print(f"{args.env} trial {trial}: done", file=sys.stderr)


def _with_sources() -> dict[str, str]:
    import os

    path = os.pathsep.join(p for p in (str(ROOT / "src"), os.environ.get("PYTHONPATH")) if p)
    return {**os.environ, "PYTHONPATH": path}


def spread_lines(runs: pd.DataFrame) -> list[str]:
    """Per probe group: the median probe, the ends' deviations from it, the load beside."""
    limit = float(section_with_defaults(None, "conditions")["max_probe_deviation"])
    rows = [row for row in runs.to_dict("records") if row.get("status") == "ok"]
    norms = probe_norms(rows)
    lines = []
    for group, norm in norms.items():
        members = [row for row in rows if probe_group(row) == group]
        ends = [end for row in members for end in probe_ends(row) if math.isfinite(end)]
        logs = sorted(abs(math.log(end / norm.median_s)) for end in ends)
        beyond = sum(1 for value in logs if value > math.log1p(limit))
        others = [other_cpu_share(row) for row in members]
        steals = [steal_share(row) for row in members]
        quiet, largest, spread = quiet_spread(members)
        lines += [
            f"{group[0] or 'no platform'}, {group[1]}, {group[2]} thread(s): {group[3]}",
            f"  {len(members)} trials, median probe {norm.median_s * 1e3:.2f} ms; the ends "
            f"lie within x{math.exp(logs[-1]):.3f} of it (95th percentile "
            f"x{math.exp(_quantile(logs, 0.95)):.3f}); robust spread {norm.spread:.1%}; "
            f"{beyond} of {len(logs)} ends beyond the default {limit:.0%}",
            f"  beside them: other processes {_range(others)} of the CPUs, steal {_range(steals)}",
            f"  the {quiet} trials beside which others took at most {QUIET_SHARE:.0%}: the "
            f"nearer end of each within {largest:.1%} of their median, robust spread "
            f"{spread:.1%} (PROBE_SPREAD's figures)",
        ]
    judged = judge_runs(runs)
    flagged = judged[judged["perturbed_reason"].astype(str).str.contains("the node ran")]
    lines.append(
        f"judged with the defaults: {int(judged['perturbed'].fillna(False).sum())} of "
        f"{int(judged['perturbed'].notna().sum())} trials perturbed, {len(flagged)} by the probe"
    )
    return lines


def _quantile(values: list[float], share: float) -> float:
    return values[min(len(values) - 1, math.ceil(share * len(values)) - 1)]


def _range(values: list[float]) -> str:
    known = sorted(v for v in values if math.isfinite(v))
    if not known:
        return "unknown"
    return f"{known[0]:.1%}–{known[-1]:.1%} (median {known[len(known) // 2]:.1%})"


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    if args.trials:
        run_cells(args)
    runs, _ = load_tables(sorted(args.out.glob("records/**/trial*.json")))
    for line in spread_lines(runs):
        print(line)
    if args.csv:
        wanted = [*PROBE_FIXTURE_COLUMNS, "throughput_samples_per_s"]
        present = [column for column in wanted if column in runs.columns]
        runs[present].to_csv(args.csv, index=False)
    return 0


if __name__ == "__main__":
    sys.exit(main())
