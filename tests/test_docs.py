"""The guide: README.md a door of at most 150 lines with the two commands first, docs/ the
pages a person reads in order, the generated pages current with the code, and no link broken."""

from __future__ import annotations

import re
from pathlib import Path

import pytest
from helpers import ROOT

from ptspeed.plan.reference import UNDESCRIBED, reference, undescribed_keys
from ptspeed.render.method import method_rules

PAGES = sorted([ROOT / "README.md", *(ROOT / "docs").glob("*.md"),
                *(ROOT / d / "README.md" for d in ("config", "envs", "docker"))])  # fmt: skip
LINK = re.compile(r"\[[^\]]*\]\(([^)\s]+)\)")
README_LINES = 150


def test_the_generated_pages_are_current() -> None:
    """docs/configuration.md and docs/method-rules.md are what the code writes today:
    ``python3 scripts/docs.py`` after a change to the schema or to a rule's parameter."""
    assert (ROOT / "docs/configuration.md").read_text(encoding="utf-8") == reference()
    assert (ROOT / "docs/method-rules.md").read_text(encoding="utf-8") == method_rules()


def test_every_config_key_is_described() -> None:
    assert undescribed_keys() == []


def test_a_key_without_a_description_is_named() -> None:
    schema = {"properties": {"trials": {"type": "integer", "default": 5}}}
    assert undescribed_keys(schema) == ["trials"]
    assert UNDESCRIBED in reference(schema)


@pytest.mark.parametrize("page", PAGES, ids=lambda p: str(p.relative_to(ROOT)))
def test_every_link_of_the_guide_leads_somewhere(page: Path) -> None:
    broken = []
    for target in LINK.findall(page.read_text(encoding="utf-8")):
        if re.match(r"[a-z]+:", target) or target.startswith("#"):
            continue  # a web address or an anchor of the page
        path = (page.parent / target.split("#")[0]).resolve()
        if not path.exists():
            broken.append(target)
    assert broken == [], f"{page.relative_to(ROOT)}: broken links {broken}"


def test_the_readme_is_a_door() -> None:
    """At most 150 lines; its first commands are the two a newcomer needs."""
    text = (ROOT / "README.md").read_text(encoding="utf-8")
    assert len(text.splitlines()) <= README_LINES
    first_block = text.split("```sh\n", 1)[1].split("```", 1)[0]
    commands = [line.split("#")[0].strip() for line in first_block.splitlines()]
    assert commands == ["make run", "make test"]


def test_the_development_page_names_every_stage() -> None:
    """docs/development.md's layout names every rule file of the workflow and every package of
    src/ptspeed."""
    text = (ROOT / "docs/development.md").read_text(encoding="utf-8")
    rules = [f"workflow/rules/{p.name}" for p in sorted((ROOT / "workflow/rules").glob("*.smk"))]
    packages = [
        f"`{p.name}/`"
        for p in sorted((ROOT / "src/ptspeed").iterdir())
        if (p / "__init__.py").is_file()
    ]
    assert [name for name in [*rules, *packages] if name not in text] == []


def test_the_guide_lists_its_pages_in_reading_order() -> None:
    """docs/README.md's numbered list and the README's link the guide's pages in one order."""
    order = ["getting-started", "models", "configuration", "clusters", "method", "report",
             "gpu-check", "development"]  # fmt: skip
    for page in (ROOT / "docs/README.md", ROOT / "README.md"):
        items = re.findall(r"^\d+\. (.*)$", page.read_text(encoding="utf-8"), re.MULTILINE)
        firsts = [Path(LINK.findall(item)[0]).stem for item in items]
        assert firsts == order, page.name
