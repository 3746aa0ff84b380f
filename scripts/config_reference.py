"""Write docs/configuration.md from the config's JSON Schema (``--check``: say whether it is
current, exit 1 if not).

    python3 scripts/config_reference.py [--check]
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "src"))

from ptspeed.plan.reference import reference, undescribed_keys  # noqa: E402

PAGE = ROOT / "docs" / "configuration.md"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--check", action="store_true", help="only check the page is current")
    args = parser.parse_args(argv)
    missing = undescribed_keys()
    if missing:
        print(f"error: the schema describes no {', '.join(missing)}")
        return 1
    page = reference()
    if args.check:
        current = PAGE.is_file() and PAGE.read_text() == page
        print(f"{PAGE.relative_to(ROOT)} is {'current' if current else 'out of date'}")
        return 0 if current else 1
    PAGE.parent.mkdir(exist_ok=True)
    PAGE.write_text(page)
    print(f"wrote {PAGE.relative_to(ROOT)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
