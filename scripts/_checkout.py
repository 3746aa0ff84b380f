"""The checkout's sources on the import path, for the tools here that run from a plain checkout
without the project installed (a GPU node's fixed image, a bare ``python3``). A tool imports it
before the project: ``from _checkout import ROOT``."""

import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "src"))
