"""Aggregate cell records into results/tables: runs.csv, steps.csv, summary.csv, speedups.csv.

    python workflow/scripts/aggregate.py --config CONFIG --claims config/claims.yaml \
        --records results/records/*.json --out-dir results/tables

Every listed path becomes a runs row: a path with no file is a ``missing`` row, a file that is
not a record an ``unreadable`` one, a record of another cell than the config asks for at its
path (an older config, a copied file) a ``stale`` one, each with a reason naming the path.

A comparison a side of which counted no trial (none ok, or all judged perturbed) is a row
"not measured" with the reason; the other rows and every table are still written, and one
line on stderr names what was not measured (the workflow's aggregate rule shows it).
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import pandas as pd

from ptspeed.analysis.aggregate import (
    load_tables,
    read_mapping,
    read_settings,
    records_listed_in,
)
from ptspeed.analysis.claims import empty_sides
from ptspeed.analysis.speedups import speedups
from ptspeed.analysis.summary import summary_table
from ptspeed.cell.files import write_atomic
from ptspeed.entrypoint import one_line_errors


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--config", required=True, help="merged config (YAML or JSON)")
    parser.add_argument("--claims", required=True, help="published figures (claims.yaml)")
    parser.add_argument("--records", nargs="*", default=[], help="cell record files")
    parser.add_argument("--records-from", help="a file listing record paths, one per line")
    parser.add_argument("--out-dir", required=True, help="where the four CSVs go")
    return parser.parse_args(argv)


def write_csv(frame: pd.DataFrame, path: Path) -> None:
    write_atomic(path, frame.to_csv(index=False))


def not_measured_line(comparisons: pd.DataFrame) -> str:
    """One line naming the speedups a side of which counted no trial ('' where none)."""
    empty = [text for row in comparisons.to_dict("records") if (text := empty_sides(row))]
    if not empty:
        return ""
    why = "; ".join(dict.fromkeys(part for text in empty for part in text.split("; ")))
    return (
        f"warning: {len(empty)} of {len(comparisons)} speedups not measured, a side without "
        f"counted trials ({why}); the tables and the report are written without them"
    )


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    with one_line_errors(unexpected=True):
        settings, claims = read_settings(args.config), read_mapping(args.claims)
        paths = [
            *args.records,
            *(records_listed_in(args.records_from) if args.records_from else []),
        ]
        runs, steps = load_tables(paths, settings)
        summary = summary_table(runs)
        comparisons = speedups(summary, settings, claims, runs)
        out_dir = Path(args.out_dir)
        write_csv(runs, out_dir / "runs.csv")
        write_csv(steps, out_dir / "steps.csv")
        write_csv(summary, out_dir / "summary.csv")
        write_csv(comparisons, out_dir / "speedups.csv")
        warning = not_measured_line(comparisons)
        if warning:
            print(warning, file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
