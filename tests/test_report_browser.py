"""The report in a real browser: headless Chromium opens the page rendered from a fixture with
failures and missing cells, finds the seed table and the figures, decodes every figure, logs
nothing to the console, and fits a narrow window without sideways scrolling. In a 1280 and a
1600 px window every table fits the page, verdicts included, also a seed table of two platforms
with compiled candidates and long verdicts (a wide page). The README's picture of the seed table
is the one today's code renders.

Needs Debian's ``chromium`` package (``apt-get install chromium``); skipped without it.
Screenshots are kept under ``results/`` in the test's temporary directory.
"""

from __future__ import annotations

import json
import re
import subprocess
from pathlib import Path
from typing import Any

import pandas as pd
import pytest
from helpers import (
    ROOT,
    TABLE_NAMES,
    aggregate_cli,
    expected_seed_tables,
    fixture_paths,
    html_cells,
    read_page,
    render_tables,
)

from ptspeed.analysis.columns import read_table
from ptspeed.render.screenshot import (
    HEADLESS_FLAGS,
    page_digest,
    photograph,
    seed_table_page,
    stamped_digest,
)

CHROMIUM = Path("/usr/bin/chromium")
LAPTOP = "1280,2000"
WIDE = "1600,2000"
NARROW = "500,1600"  # headless Chromium's narrowest window: a large phone held upright
TIMEOUT_S = 60
PNG_MAGIC = b"\x89PNG\r\n\x1a\n"
# The page has no scripts; the probe copy gets this one, which reports on the loaded page.
PROBE = """<script>
window.addEventListener("load", () => {
  const images = [...document.images];
  document.title = JSON.stringify({
    viewport: window.innerWidth,
    page: document.documentElement.scrollWidth,
    decoded: images.map((image) => image.naturalWidth),
    shown: images.map((image) => Math.ceil(image.getBoundingClientRect().width)),
    width: document.documentElement.clientWidth,
    tables: [...document.querySelectorAll("table")].map((table) => {
      const heads = [...table.tHead.rows[0].cells].map((cell) => cell.textContent);
      const verdict = heads.indexOf("verdict");
      const rows = [...table.tBodies[0].rows];
      return {
        section: table.closest("section").id,
        right: table.getBoundingClientRect().right,
        box: table.parentElement.getBoundingClientRect().right,
        verdicts: verdict < 0 ? [] : rows.map((row) => {
          const cell = row.cells[verdict].getBoundingClientRect();
          return {right: cell.right, width: cell.width, height: cell.height};
        }),
        links: [...table.querySelectorAll("a")].map((link) => {
          const box = link.getBoundingClientRect();
          return {href: link.getAttribute("href"), right: box.right, width: box.width};
        }),
      };
    }),
  });
});
</script>
"""
# Slack for sub-pixel layout, in CSS pixels.
PIXEL = 1.0

pytestmark = [
    pytest.mark.browser,
    pytest.mark.skipif(
        not CHROMIUM.exists(),
        reason=f"headless Chromium not found at {CHROMIUM} (apt-get install chromium)",
    ),
]


@pytest.fixture(scope="module")
def site(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    """The report rendered from the fixture, its tables, and a directory for browser runs."""
    tmp_path = tmp_path_factory.mktemp("browser")
    out_dir = aggregate_cli(tmp_path, fixture_paths(tmp_path))
    tables = {name: read_table(out_dir / f"{name}.csv") for name in TABLE_NAMES}
    render_tables(tables, tmp_path / "report")
    return {"root": tmp_path, "page": tmp_path / "report" / "index.html", "tables": tables}


@pytest.fixture(scope="module")
def wide_site(site: dict[str, Any]) -> dict[str, Any]:
    """The fixture's tables made as wide as a real run's: every comparison on two platforms,
    both sides compiled and profiled (where the time went, with both traces), long verdicts, a
    long environment name and every cell's compile time with its cold and warm parts."""
    tables = site["tables"]
    compiled = {
        f"{side}_median_{name}": value
        for side in ("baseline", "candidate")
        for name, value in (("compiled_graphs", 12), ("graph_breaks", 3), ("recompilations", 11))
    }
    reason = (
        "claimed on NVIDIA A100-SXM4-80GB, fp32; measured on NVIDIA H100 80GB HBM3 (cuda), "
        "tf32 / bf16; interval at 80% confidence (3 and 2 ok trials cannot reach 95%)"
    )
    profiled = {
        f"{side}_{column}": value
        for side, step in (("baseline", 0.012), ("candidate", 0.007))
        for column, value in (
            ("profile_timeline", "cpu"), ("profile_step_s", step), ("time_matmul_s", 0.005),
            ("time_elementwise_s", step - 0.006), ("time_host_s", 0.001),
            ("trace", f"results/traces/a-long-cell-name-of-the-{side}.json.gz"),
        )
    }  # fmt: skip
    sentence = (
        "elementwise −83 % (6.0 → 1.0 ms), compiler-generated new (2.0 ms), matmul/conv +1 % "
        "(5.0 → 5.1 ms); ops per step 412 → 96"
    )
    speedups = tables["speedups"].assign(
        **compiled, **profiled, verdict_reason=reason, breakdown=sentence
    )
    speedups = pd.concat(
        [speedups.assign(platform=name) for name in ("a100-sxm4-80gb", "h100-80gb-hbm3")]
    )
    longer = {"torch-2.0": "torch-2.0-cu118"}
    summary = tables["summary"].assign(
        env=tables["summary"]["env"].replace(longer),
        compile_time_s=123.45,
        compile_time_cold_s=301.25,
        compile_time_warm_s=32.5,
    )
    runs = tables["runs"].assign(env=tables["runs"]["env"].replace(longer))
    root = site["root"] / "wide"
    root.mkdir()
    wide = {**tables, "runs": runs, "summary": summary, "speedups": speedups}
    render_tables(wide, root / "report")
    return {"root": root, "page": root / "report" / "index.html", "tables": wide}


def chromium(root: Path, url: str, *args: str) -> subprocess.CompletedProcess[str]:
    """One headless Chromium run with its own profile; console messages go to stderr."""
    profiles = sorted(root.glob("profile-*"))
    profile = root / f"profile-{len(profiles)}"
    command = [
        str(CHROMIUM),
        *HEADLESS_FLAGS,
        f"--user-data-dir={profile}",
        "--enable-logging=stderr",
        "--v=0",
        *args,
        url,
    ]
    return subprocess.run(command, capture_output=True, text=True, timeout=TIMEOUT_S, check=False)


def console_messages(stderr: str) -> list[str]:
    """Chromium logs every console message (errors, uncaught exceptions) as a ``:CONSOLE`` line."""
    return [line for line in stderr.splitlines() if ":CONSOLE" in line or "Uncaught" in line]


def take_screenshot(
    site: dict[str, Any], name: str, window: str
) -> tuple[Path, subprocess.CompletedProcess[str]]:
    """A PNG of the page in a ``window`` (``"width,height"``), under the site's results/."""
    screenshot = site["root"] / "results" / name
    screenshot.parent.mkdir(exist_ok=True)
    result = chromium(
        site["root"], site["page"].as_uri(), f"--screenshot={screenshot}", f"--window-size={window}"
    )
    assert result.returncode == 0, result.stderr[-2000:]
    assert screenshot.read_bytes().startswith(PNG_MAGIC)
    return screenshot, result


def probe(site: dict[str, Any], window: str) -> dict[str, Any]:
    html = site["page"].read_text(encoding="utf-8")
    probe_page = site["page"].with_name("probe.html")
    probe_page.write_text(html.replace("</body>", PROBE + "</body>"), encoding="utf-8")
    result = chromium(site["root"], probe_page.as_uri(), "--dump-dom", f"--window-size={window}")
    assert result.returncode == 0, result.stderr[-2000:]
    title = re.search(r"<title>(.*?)</title>", result.stdout, re.DOTALL)
    assert title, result.stdout[:2000]
    return json.loads(title.group(1).replace("&quot;", '"'))


def test_screenshot_shows_the_page_without_console_errors(site: dict[str, Any]) -> None:
    screenshot, result = take_screenshot(site, "report.png", LAPTOP)
    assert screenshot.stat().st_size > 50_000  # a page of tables and figures, not a blank one
    assert console_messages(result.stderr) == []


def test_console_check_catches_a_broken_page(site: dict[str, Any]) -> None:
    broken = site["root"] / "broken.html"
    broken.write_text(
        "<!DOCTYPE html><title>x</title><script>console.error('oops'); undefined_call();</script>",
        encoding="utf-8",
    )
    result = chromium(site["root"], broken.as_uri(), "--dump-dom")
    messages = console_messages(result.stderr)
    assert any("oops" in line for line in messages), result.stderr[-2000:]
    assert any("Uncaught ReferenceError" in line for line in messages)


def test_dom_has_the_seed_table_and_the_figures(site: dict[str, Any]) -> None:
    result = chromium(site["root"], site["page"].as_uri(), "--dump-dom")
    assert result.returncode == 0, result.stderr[-2000:]
    page = read_page(result.stdout)
    speedups: pd.DataFrame = site["tables"]["speedups"]
    assert page.tables["seed-table"] == [html_cells(t) for t in expected_seed_tables(speedups)]
    assert len(page.images) == 5
    for image in page.images:
        assert image["src"].startswith("data:image/png;base64,")
        assert image["alt"]
    assert "missing" in {row[6] for row in page.tables["failures"][0][1:]}
    assert console_messages(result.stderr) == []


@pytest.mark.parametrize("page", ["site", "wide_site"])
@pytest.mark.parametrize("window", [LAPTOP, WIDE])
def test_every_table_fits_the_window_and_shows_its_verdicts(
    request: pytest.FixtureRequest, page: str, window: str
) -> None:
    """No table is wider than the page (none scrolls in its box): the seed table's verdicts, the
    answer to the question, are all in view, each on the screen."""
    served: dict[str, Any] = request.getfixturevalue(page)
    found = probe(served, window)
    width = found["width"]
    assert len(found["tables"]) >= 10
    for table in found["tables"]:
        assert table["right"] <= min(width, table["box"]) + PIXEL, (table["section"], found)
    seed = [table for table in found["tables"] if table["section"] == "seed-table"]
    verdicts = [cell for table in seed for cell in table["verdicts"]]
    assert len(verdicts) == len(served["tables"]["speedups"])  # every row's verdict
    for cell in verdicts:
        assert cell["width"] > 0 and cell["height"] > 0, cell
        assert cell["right"] <= width + PIXEL, (cell, width)
    links = [link for table in seed for link in table["links"]]
    if page == "wide_site":  # beside every speedup, both sides' traces, in view
        assert len(links) == 2 * len(verdicts)
        assert all(link["href"].startswith("../traces/") for link in links), links
        assert all(link["width"] > 0 and link["right"] <= width + PIXEL for link in links), links
    take_screenshot(served, f"report-{window.split(',')[0]}.png", window)


@pytest.mark.parametrize("window", [LAPTOP, NARROW])
def test_figures_decode_and_the_page_fits_the_window(site: dict[str, Any], window: str) -> None:
    found = probe(site, window)
    assert len(found["decoded"]) == 5
    assert all(width > 0 for width in found["decoded"]), found  # every PNG decoded
    assert found["page"] <= found["viewport"], found  # wide tables scroll inside their box
    assert all(width <= found["viewport"] for width in found["shown"]), found
    if window == NARROW:
        take_screenshot(site, "report-narrow.png", window)


README_PICTURE = ROOT / "docs" / "seed-table.png"
README_PICTURE_MAX_BYTES = 100_000


def test_the_readme_picture_is_the_seed_table_of_today(tmp_path: Path) -> None:
    """docs/seed-table.png was photographed from the page today's code renders of the golden
    fixture's tables (its digest says which page), and stays small; ``python3 scripts/docs.py
    --screenshot`` makes it again after a change to the seed table."""
    golden = ROOT / "tests" / "fixtures" / "golden"
    page = seed_table_page(golden / "expected", golden / "config.yaml", golden / "claims.yaml")
    stale = "stale: python3 scripts/docs.py --screenshot writes it again"
    assert stamped_digest(README_PICTURE) == page_digest(page), stale
    assert README_PICTURE.stat().st_size < README_PICTURE_MAX_BYTES
    assert f"]({README_PICTURE.relative_to(ROOT)})" in (ROOT / "README.md").read_text("utf-8")
    again = tmp_path / "seed-table.png"
    photograph(page, again, CHROMIUM)
    assert again.read_bytes().startswith(PNG_MAGIC)
    assert stamped_digest(again) == page_digest(page)
