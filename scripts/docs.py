"""Write the guide's generated pages from the code: docs/configuration.md from the config's
JSON Schema, docs/method-rules.md from the report's Method section at the default config.
``--check`` only says whether they are current (exit 1 if not).

    python3 scripts/docs.py [--check]
"""

from __future__ import annotations

import argparse
import sys

from _checkout import ROOT

from ptspeed.plan.reference import reference, undescribed_keys
from ptspeed.render.method import method_rules

PAGES = {
    ROOT / "docs" / "configuration.md": reference,
    ROOT / "docs" / "method-rules.md": method_rules,
}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--check", action="store_true", help="only check the pages are current")
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
    if stale:
        print(f"out of date: {', '.join(stale)} (python3 scripts/docs.py writes them)")
    return 1 if stale else 0


if __name__ == "__main__":
    sys.exit(main())
