"""The README's picture of the report: the first seed table of a set of aggregated tables (the
golden fixture's, ``tests/fixtures/golden``) rendered as a page of its own, photographed by
headless Chromium, cropped to what it shows and its shades reduced to stay small. The page's
digest is written into the PNG as a text chunk (:data:`DIGEST_KEY`), so that a test can tell a
picture made from another page than today's code renders.
"""

from __future__ import annotations

import hashlib
import subprocess
import tempfile
from pathlib import Path

import numpy as np
from matplotlib import image as mpimg
from PIL import Image

from ptspeed.analysis.aggregate import read_mapping, read_settings
from ptspeed.analysis.columns import read_table
from ptspeed.render.page import ReportInputs, Section
from ptspeed.render.report import HTML_TEMPLATE, page_templates
from ptspeed.render.sections import seed_section

DIGEST_KEY = "ptspeed-page-sha256"
WINDOW = "1100,900"  # wide enough for the seed table's columns, tall enough for its rows
MARGIN_PX = 12
SHADE_STEP = 32  # each colour channel rounded to a multiple of this: fewer shades, a smaller PNG
# Headless Chromium on a machine without a network (it would try Google's hosts at every start).
HEADLESS_FLAGS = [
    "--headless",
    "--no-sandbox",
    "--disable-gpu",
    "--disable-quic",
    "--no-first-run",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
]
CHROMIUM_TIMEOUT_S = 60


def seed_table_page(tables_dir: Path, config_path: Path, claims_path: Path) -> str:
    """The report's page holding only the first comparison's seed table."""
    runs, summary, speedups = (
        read_table(tables_dir / f"{name}.csv") for name in ("runs", "summary", "speedups")
    )
    settings, claims = read_settings(config_path), read_mapping(claims_path)
    seed = seed_section(ReportInputs(runs, summary, speedups, settings, claims))
    first_table = next(block for block in seed.blocks if block.table is not None)
    section = Section(seed.id, seed.title, seed.intro, [first_table])
    return page_templates().get_template(HTML_TEMPLATE).render(sections=[section], warning="")


def page_digest(html: str) -> str:
    return hashlib.sha256(html.encode("utf-8")).hexdigest()


def photograph(html: str, png: Path, chromium: Path) -> None:
    """Write ``png``: ``html`` in headless Chromium, cropped to its content, with its digest."""
    with tempfile.TemporaryDirectory() as scratch:
        page, shot = Path(scratch) / "page.html", Path(scratch) / "shot.png"
        page.write_text(html, encoding="utf-8")
        command = [
            str(chromium),
            *HEADLESS_FLAGS,
            "--hide-scrollbars",
            f"--user-data-dir={Path(scratch) / 'profile'}",
            f"--window-size={WINDOW}",
            f"--screenshot={shot}",
            page.as_uri(),
        ]
        subprocess.run(command, capture_output=True, check=True, timeout=CHROMIUM_TIMEOUT_S)
        pixels = mpimg.imread(shot)[:, :, :3]
    shades = np.round(cropped(pixels) * 255 / SHADE_STEP) * SHADE_STEP
    picture = np.clip(shades, 0, 255).astype(np.uint8)
    mpimg.imsave(
        png, picture, metadata={DIGEST_KEY: page_digest(html)}, pil_kwargs={"optimize": True}
    )


def cropped(pixels: np.ndarray) -> np.ndarray:
    """``pixels`` cut to the box of what differs from the top-left pixel (the page's
    background), with a margin."""
    differs = np.any(np.abs(pixels - pixels[0, 0]) > 0, axis=2)
    rows, columns = np.flatnonzero(differs.any(axis=1)), np.flatnonzero(differs.any(axis=0))
    if not len(rows):
        return pixels
    top, bottom = max(rows[0] - MARGIN_PX, 0), rows[-1] + 1 + MARGIN_PX
    left, right = max(columns[0] - MARGIN_PX, 0), columns[-1] + 1 + MARGIN_PX
    return pixels[top:bottom, left:right]


def stamped_digest(png: Path) -> str:
    """The page digest written into ``png``'s text chunk ("" where there is none)."""
    with Image.open(png) as picture:
        return picture.text.get(DIGEST_KEY, "")
