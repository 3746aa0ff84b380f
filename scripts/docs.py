"""Write the guide's generated pages from the code: docs/configuration.md from the config's
JSON Schema, docs/method-rules.md from the report's Method section at the default config.
``--check`` only says whether they are current (exit 1 if not). ``--screenshot`` also writes
the README's picture, docs/seed-table.png: the golden fixture's seed table in headless Chromium
(tests/test_report_browser.py says when it is stale).

    python3 scripts/docs.py [--check] [--screenshot]
"""

from __future__ import annotations

import argparse
import shutil
import sys
from pathlib import Path

from _checkout import ROOT

from ptspeed.plan.reference import reference, undescribed_keys
from ptspeed.render.method import method_rules
from ptspeed.render.screenshot import photograph, seed_table_page

PAGES = {
    ROOT / "docs" / "configuration.md": reference,
    ROOT / "docs" / "method-rules.md": method_rules,
}
SCREENSHOT = ROOT / "docs" / "seed-table.png"
GOLDEN = ROOT / "tests" / "fixtures" / "golden"
CHROMIUM = Path(shutil.which("chromium") or "chromium")


def write_screenshot() -> None:
    """The README's picture of the seed table, from the golden fixture's tables."""
    page = seed_table_page(GOLDEN / "expected", GOLDEN / "config.yaml", GOLDEN / "claims.yaml")
    photograph(page, SCREENSHOT, CHROMIUM)
    print(f"wrote {SCREENSHOT.relative_to(ROOT)}")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--check", action="store_true", help="only check the pages are current")
    parser.add_argument(
        "--screenshot", action="store_true", help=f"also write {SCREENSHOT.name} (needs Chromium)"
    )
    args = parser.parse_args(argv)
    missing = undescribed_keys()
    if missing:
        print(f"error: the config schema describes no {', '.join(missing)}")
        return 1
    stale = []
    for page, write in PAGES.items():
        text = write()
        name = page.relative_to(ROOT)
        if args.check:
            if not page.is_file() or page.read_text(encoding="utf-8") != text:
                stale.append(str(name))
            continue
        page.parent.mkdir(exist_ok=True)
        page.write_text(text, encoding="utf-8")
        print(f"wrote {name}")
    if args.screenshot and not args.check:
        write_screenshot()
    if stale:
        print(f"out of date: {', '.join(stale)} (python3 scripts/docs.py writes them)")
    return 1 if stale else 0


if __name__ == "__main__":
    sys.exit(main())
