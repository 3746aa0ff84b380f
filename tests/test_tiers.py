"""The fast tier's guard (tests/conftest.py): a command a test starts names its marker."""

from __future__ import annotations

import sys

import pytest
from conftest import marker_needed


@pytest.mark.parametrize(
    ("argv", "marker"),
    [
        (["/x/.venv/bin/snakemake", "--cores", "1"], "workflow"),
        ([sys.executable, "-m", "snakemake", "-n"], "workflow"),
        (["/usr/bin/chromium", "--headless", "--dump-dom", "file:///r.html"], "browser"),
        ([sys.executable, "-m", "venv", "/tmp/v"], "venv"),
        (["uv", "pip", "sync", "--require-hashes", "r.txt"], "venv"),
        (["pip", "install", "torch"], "venv"),
        ([sys.executable, "-m", "ptspeed", "cell", "--model", "mlp"], ""),
        (["uv", "--version"], ""),
        ([], ""),
    ],
)
def test_a_command_names_the_marker_it_needs(argv: list[str], marker: str) -> None:
    assert marker_needed(argv) == marker
