"""Compare two result sets cell by cell, like ``asv compare``; exit 1 on a significant slowdown.

    python scripts/compare.py OLD NEW [--min-effect 0.05] [--aa-spread 0.05] [--only-changed]
        [--out table.md|.csv]

OLD and NEW are runs.csv files or directories holding runs.csv or tables/runs.csv. Prints one
row per cell: a mark (``+`` significantly faster, ``-`` significantly slower, blank unchanged,
``x`` not comparable), both medians with their ok trials, the ratio new / old (Hodges–Lehmann)
with its exact interval (95 %, else the confidence the trials allow, printed beside it), and the
Mann–Whitney p-value; trials judged perturbed are left out (--keep-perturbed keeps them). Where
both sets have a speedups.csv beside their runs.csv, each speedup of one is then checked against
the other's interval, both ways.

The machine comes first: per environment (probes are compared only with probes made by the
same build, threads and work), each run's machine-speed probe (a fixed GEMM and memory pass
beside every trial) and whether the machine changed between the runs. Then the rule, with its
numbers: a cell is called faster or slower when its ratio divided by its environment's machine
ratio is beyond the minimum effect and its interval (the trials', the machine's and the spread
two runs of identical code show, --aa-spread, added in quadrature) excludes no change; never
against the cell's own direction (ptspeed.analysis.compare states it in full). --min-effect,
--min-window-s and --keep-perturbed default to the compared run's own config (the config.json
beside its tables: NEW's, else OLD's), else the config schema's. Exit status: 0 none slower,
1 at least one cell slower by that rule, 2 bad input (one ``error:`` line).
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import _checkout  # noqa: F401  (the checkout's src/ on the import path)
import pandas as pd

from ptspeed.analysis.change_verdict import AA_SPREAD, SAME, Rule
from ptspeed.analysis.columns import read_table
from ptspeed.analysis.compare import compare_runs, cross_check_speedups, regressions
from ptspeed.analysis.compare_inputs import read_runs, run_defaults, speedups_beside
from ptspeed.analysis.machine_change import machine_changes
from ptspeed.cell.files import write_atomic
from ptspeed.entrypoint import OneLineParser, one_line_errors
from ptspeed.render.comparison import (
    CROSS_CHECK_HEADERS,
    DISPLAY_HEADERS,
    as_markdown,
    as_text,
    cross_check_line,
    cross_check_rows,
    display_rows,
    machine_lines,
    rule_line,
    verdict_line,
)

EXIT_SLOWER = 1
OUT_SUFFIXES = (".csv", ".md")


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = OneLineParser(description=__doc__.splitlines()[0])
    parser.add_argument("old", help="the reference result set (runs.csv or a results directory)")
    parser.add_argument("new", help="the result set to judge")
    parser.add_argument(
        "--min-effect",
        "--threshold",
        dest="threshold",
        type=float,
        default=None,
        help="smallest relative change that counts, beyond the machine's own (default: the "
        "compared run's compare.min_effect, 0.05 in the schema)",
    )
    parser.add_argument(
        "--aa-spread",
        type=float,
        default=AA_SPREAD,
        help="how far two runs of identical code differ on this machine, 95%% (default "
        f"{AA_SPREAD}: measured by A/A runs on the development VM)",
    )
    parser.add_argument(
        "--min-window-s",
        type=float,
        default=None,
        help="no change is called in a cell whose windows are shorter (default: the compared "
        "run's conditions.min_window_s, 0.5 in the schema)",
    )
    parser.add_argument(
        "--only-changed", action="store_true", help="print only faster, slower and missing cells"
    )
    parser.add_argument(
        "--keep-perturbed",
        action="store_true",
        help="count trials judged perturbed too (default: the compared run's "
        "conditions.keep_perturbed)",
    )
    parser.add_argument(
        "--out", action="append", default=[], help="also write the table here (.csv or .md)"
    )
    return parser.parse_args(argv)


def write_outputs(
    compared: pd.DataFrame, rows: list[list[str]], rule: str, paths: list[str]
) -> None:
    for path in map(Path, paths):
        if path.suffix == ".csv":
            write_atomic(path, compared.to_csv(index=False))
        else:
            write_atomic(path, rule + "\n\n" + as_markdown(DISPLAY_HEADERS, rows))


def print_cross_check(old: str, new: str) -> None:
    """Each speedup of one set against the other's interval, where both have speedups.csv."""
    paths = [speedups_beside(old), speedups_beside(new)]
    if None in paths:
        return
    checked = cross_check_speedups(*(read_table(path) for path in paths if path))
    if checked.empty:
        return
    print()
    print(as_text(CROSS_CHECK_HEADERS, cross_check_rows(checked)), end="")
    print(cross_check_line(checked))


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    with one_line_errors(unexpected=True):
        unknown = [out for out in args.out if Path(out).suffix not in OUT_SUFFIXES]
        if unknown:
            raise ValueError(f"--out {unknown[0]}: write .csv or .md")
        old, new = read_runs(args.old), read_runs(args.new)
        defaults = run_defaults(args.old, args.new)
        threshold = defaults.min_effect if args.threshold is None else args.threshold
        window = defaults.min_window_s if args.min_window_s is None else args.min_window_s
        keep = args.keep_perturbed or defaults.keep_perturbed
        compared = compare_runs(old, new, threshold, keep, window, args.aa_spread)
        for line in machine_lines(machine_changes(old, new, keep)):
            print(line)
        rule = rule_line(Rule(threshold, args.aa_spread, window), defaults.source)
        print(rule)
        shown = compared[compared["mark"] != SAME] if args.only_changed else compared
        rows = display_rows(shown)
        print(as_text(DISPLAY_HEADERS, rows), end="")
        print(verdict_line(compared))
        print_cross_check(args.old, args.new)
        write_outputs(compared, display_rows(compared), rule, args.out)
    slower = regressions(compared)
    if len(slower):
        print(f"{len(slower)} cell(s) significantly slower by more than {threshold:.0%}")
        return EXIT_SLOWER
    return 0


if __name__ == "__main__":
    sys.exit(main())
