"""List the perturbed trials of one round that the workflow runs again (config conditions.reruns).

    python workflow/scripts/judge_trials.py --config CONFIG --attempt 0 --records R... \\
        --out reruns.json

Judges every given record as aggregation does (ptspeed.analysis.conditions: round A against
the run's median trial of rounds 0 .. A, the records given; the final tables judge it so too)
and writes ``{"attempt": A, "reruns": [...], "stopped": [...]}``: the record paths, relative
to the results directory, of the reruns of round A's perturbed trials (none once A reaches
conditions.reruns), and the trials not run again because the rule that flagged them had
flagged the attempt they repeat too (ptspeed.analysis.reruns.stopped_reruns).
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from ptspeed.analysis.aggregate import load_tables, read_settings
from ptspeed.analysis.reruns import attempt_of, reruns_due, stopped_reruns
from ptspeed.cell.files import write_atomic
from ptspeed.entrypoint import one_line_errors


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--config", required=True, help="the effective config (JSON or YAML)")
    parser.add_argument("--attempt", type=int, required=True, help="the round judged (0: first)")
    parser.add_argument("--records", nargs="*", default=[], help="every record run so far")
    parser.add_argument("--out", type=Path, required=True, help="the JSON list to write")
    return parser.parse_args(argv)


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    with one_line_errors():
        settings = read_settings(args.config)
        runs, _ = load_tables(args.records, settings)
        due = [cell.path for cell in reruns_due(runs, settings, args.attempt)]
        stopped = [
            f"{key} trial {trial}: {', '.join(kinds)}"
            for key, trial, kinds in stopped_reruns(runs, settings)
            if attempt_of(trial, settings.trials) == args.attempt
        ]
        answer = {"attempt": args.attempt, "reruns": due, "stopped": stopped}
        write_atomic(args.out, json.dumps(answer, indent=1))
    print(f"round {args.attempt}: {len(due)} perturbed trial(s) to run again", file=sys.stderr)
    if stopped:
        print(
            f"round {args.attempt}: {len(stopped)} rerun(s) perturbed again by the same rule, "
            f"not run again: {'; '.join(stopped)}",
            file=sys.stderr,
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())
