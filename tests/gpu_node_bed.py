"""A test bed with a lent GPU node's package set: a venv holding torch, torchvision, numpy,
pandas, scipy and pyyaml (the host venv's own, linked in with everything they need) and
transformers 5 (from the package index), and neither jsonschema nor Snakemake.

The GPU node ptspeed meets first is a fixed, offline image (Python 3.12, torch 2.11,
transformers 5.x, pandas, scipy, pyyaml; no jsonschema, no Snakemake). The bed differs from the
host venv as that image does, in what is installed; its torch is the host's.
"""

from __future__ import annotations

import importlib.metadata as metadata
import re
import subprocess
import sys
from pathlib import Path

# What the GPU node's image has, by distribution name (transformers comes from the index).
NODE_PACKAGES = ("torch", "torchvision", "numpy", "pandas", "scipy", "pyyaml")
NODE_TRANSFORMERS = "transformers>=5,<6"
ABSENT = ("jsonschema", "snakemake")


def _canonical(name: str) -> str:
    return re.sub(r"[-_.]+", "-", name).lower()


def _closure(names: tuple[str, ...]) -> set[str]:
    """The distributions ``names`` need, themselves included (markers of extras left out)."""
    wanted, seen = [_canonical(n) for n in names], set()
    while wanted:
        name = wanted.pop()
        if name in seen:
            continue
        try:
            requires = metadata.distribution(name).requires or []
        except metadata.PackageNotFoundError:
            continue  # a platform's optional need, not installed here
        seen.add(name)
        for requirement in requires:
            if "extra ==" in requirement:
                continue
            wanted.append(_canonical(re.split(r"[\s;<>=!~\[(]", requirement, maxsplit=1)[0]))
    return seen


def _top_level_entries(name: str) -> set[str]:
    """The site-packages entries (packages, modules, .dist-info, .libs) a distribution owns."""
    files = metadata.distribution(name).files or []
    return {f.parts[0] for f in files if f.parts and not f.parts[0].startswith("..")}


def make_bed(directory: Path, uv: Path) -> Path:
    """The bed's python: a venv of this Python with the node's packages and nothing else."""
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(directory)], check=True)
    site = next((directory / "lib").glob("python3*/site-packages"))
    host_site = Path(metadata.distribution("torch").locate_file(""))
    linked = set().union(*(_top_level_entries(n) for n in _closure(NODE_PACKAGES)))
    for entry in sorted(linked):
        source = host_site / entry
        if source.exists() and not (site / entry).exists():
            (site / entry).symlink_to(source)
    python = directory / "bin" / "python"
    subprocess.run(
        [str(uv), "pip", "install", "--quiet", "--python", str(python), NODE_TRANSFORMERS],
        check=True,
    )
    return python
