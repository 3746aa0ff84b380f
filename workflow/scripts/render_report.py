"""Render the report (index.html and report.md) from the aggregated tables.

    python workflow/scripts/render_report.py --runs results/tables/runs.csv \
        --summary results/tables/summary.csv --speedups results/tables/speedups.csv \
        --steps results/tables/steps.csv --config CONFIG --claims config/claims.yaml \
        --out-dir results/report

Bad input (a missing or malformed table, config or template) is one ``error:`` line on stderr
and exit status 2, never a traceback.
"""

from __future__ import annotations

import argparse
import sys

import jinja2
import pandas as pd

from ptspeed.analysis.aggregate import read_mapping, read_settings
from ptspeed.analysis.columns import read_table
from ptspeed.analysis.compare_inputs import read_runs
from ptspeed.entrypoint import PROJECT_ERRORS, one_line_errors
from ptspeed.render.report import render


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", required=True, help="runs.csv")
    parser.add_argument("--summary", required=True, help="summary.csv")
    parser.add_argument("--speedups", required=True, help="speedups.csv")
    parser.add_argument("--steps", help="steps.csv (per-step times, for the step-time figure)")
    parser.add_argument("--config", required=True, help="merged config (YAML or JSON)")
    parser.add_argument("--claims", required=True, help="published figures (claims.yaml)")
    parser.add_argument(
        "--earlier", help="an earlier run's runs.csv to set this one against (compare.earlier)"
    )
    parser.add_argument("--out-dir", required=True, help="where index.html and report.md go")
    parser.add_argument("--templates-dir", help="templates (default: the repository's)")
    return parser.parse_args(argv)


def read_csv(path: str) -> pd.DataFrame:
    try:
        return read_table(path)
    except pd.errors.ParserError as error:
        raise ValueError(f"{path}: not a CSV table ({error})") from error
    except pd.errors.EmptyDataError as error:
        raise ValueError(f"{path}: empty file") from error


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    with one_line_errors(*PROJECT_ERRORS, KeyError, jinja2.TemplateError, unexpected=True):
        tables = [read_csv(path) for path in (args.runs, args.summary, args.speedups)]
        steps = read_csv(args.steps) if args.steps else None
        settings, claims = read_settings(args.config), read_mapping(args.claims)
        earlier = read_runs(args.earlier) if args.earlier else None
        render(
            *tables, settings, claims, args.out_dir, templates_dir=args.templates_dir, steps=steps,
            earlier=earlier,
        )  # fmt: skip
    return 0


if __name__ == "__main__":
    sys.exit(main())
