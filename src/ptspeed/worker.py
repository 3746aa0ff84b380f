"""The worker process of one cell: ``python -m ptspeed.worker SPEC_JSON RESULT_PATH``.

Started by :mod:`ptspeed.runner`, never by hand. It writes the record to RESULT_PATH.
"""

from __future__ import annotations

import json
import sys

from ptspeed.harness import run_cell
from ptspeed.record import CellSpec, write_record


def main(argv: list[str]) -> int:
    spec = CellSpec(**json.loads(argv[0]))
    write_record(run_cell(spec), argv[1])
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
