"""Time building one environment's venv with pip, then with uv (cold cache, then warm), in one run.

    python scripts/bench_envbuild.py [--env torch-1.13] [--python 3.10] [--keep]

Builds ``envs/<env>.txt`` three times into a temporary directory, as
``workflow/scripts/build_env.py`` would: with pip (downloading what pip's own cache lacks),
with uv and an empty uv cache of its own (every wheel downloaded once), and with uv again on
that warm cache (a second lock, or an image build sharing the cache: nothing downloaded,
files hard-linked). Prints each wall time,
the disk each venv takes beyond what it shares, and the ratios pip / uv. The venvs and the
temporary cache are removed at the end unless ``--keep``.
"""

from __future__ import annotations

import argparse
import os
import shutil
import sys
import tempfile
import time
from pathlib import Path

from _checkout import ROOT

from ptspeed.entrypoint import one_line_errors
from ptspeed.envs.venvs import build_venv
from ptspeed.errors import EnvBuildError

BYTES_PER_GIB = 1024**3


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--env", default="torch-1.13", help="environment name (envs/<env>.txt)")
    parser.add_argument("--python", default="3.10", help="its Python, major.minor")
    parser.add_argument("--keep", action="store_true", help="keep the venvs and the uv cache")
    return parser.parse_args(argv)


def timed_build(label: str, env: str, python: str, dest: Path, installer: str) -> float:
    begun = time.perf_counter()
    build_venv(env, ROOT / "envs" / f"{env}.txt", python, dest, installer=installer)
    elapsed = time.perf_counter() - begun
    print(f"{label}: {elapsed:.1f} s, {own_bytes(dest) / BYTES_PER_GIB:.2f} GiB of its own")
    return elapsed


def own_bytes(directory: Path) -> int:
    """Bytes of the files under ``directory`` that no other path links to (st_nlink == 1)."""
    total = 0
    for root, _, files in os.walk(directory):
        for name in files:
            info = os.lstat(os.path.join(root, name))
            total += info.st_size if info.st_nlink == 1 else 0
    return total


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    work = Path(tempfile.mkdtemp(prefix="ptspeed-envbench-"))
    os.environ["UV_CACHE_DIR"] = str(work / "uv-cache")
    try:
        with one_line_errors(EnvBuildError):
            pip_s = timed_build("pip", args.env, args.python, work / "pip", "pip")
            cold_s = timed_build("uv, empty cache", args.env, args.python, work / "uv-cold", "uv")
            warm_s = timed_build("uv, warm cache", args.env, args.python, work / "uv-warm", "uv")
    finally:
        if not args.keep:
            shutil.rmtree(work, ignore_errors=True)
    print(f"pip / uv (empty cache): {pip_s / cold_s:.1f}x")
    print(f"pip / uv (warm cache): {pip_s / warm_s:.1f}x")
    return 0


if __name__ == "__main__":
    sys.exit(main())
