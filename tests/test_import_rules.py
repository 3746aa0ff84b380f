"""The package's import rule, read from the source (every import statement, also those inside
functions) and checked by importing in a clean interpreter.

The cell side (what runs inside a benchmark environment: ``cell/``, ``launch/``, ``models/``,
``cli.py``, ``entrypoint.py``, ``errors.py``) uses the standard library and torch alone (the
model zoo also its model libraries) and never imports the host side (``plan/``, ``envs/``,
``analysis/``, ``render/``). ``launch/`` starts and watches the worker and never loads
torch. The host side never reaches back into the render stage from the planning or
environment stages.
"""

from __future__ import annotations

import ast
import subprocess
import sys
from pathlib import Path

import pytest

SOURCE = Path(__file__).resolve().parents[1] / "src"
PACKAGE = SOURCE / "ptspeed"

CELL_SIDE = {"cell", "launch", "models", "cli", "entrypoint", "errors", "__main__", "__init__"}
HOST_SIDE = {"plan", "envs", "analysis", "render"}
# What each part may import from the project (besides itself).
ALLOWED_PARTS = {
    "errors": set(),
    "entrypoint": {"errors"},
    "cell": {"errors", "models"},
    "models": {"errors", "cell"},
    "launch": {"errors", "cell"},
    "cli": {"errors", "entrypoint", "cell", "launch", "models"},
    "__main__": {"cli"},
    "__init__": set(),
    "plan": {"errors", "cell", "launch", "models"},
    "envs": {"errors", "cell", "launch", "plan"},
    "analysis": {"errors", "cell", "models", "plan"},
    "render": {"errors", "cell", "models", "plan", "analysis"},
}
# Third-party packages each part may import: the cell side finds only torch (and the model
# libraries) in a benchmark environment.
ALLOWED_THIRD_PARTY = {
    # pynvml: optional, imported inside a try (cell/measurement/conditions.py reads the GPU's
    # state with it where a benchmark environment has it, else through nvidia-smi).
    "cell": {"torch", "pynvml"},
    "models": {"torch", "torchvision", "transformers", "timm"},
    "launch": set(),
    "cli": set(),
    "entrypoint": set(),
    "errors": set(),
    "__main__": set(),
    "__init__": set(),
    "plan": {"yaml", "jsonschema"},
    "envs": {"yaml"},
    "analysis": {"numpy", "pandas", "scipy", "yaml"},
    "render": {"numpy", "pandas", "jinja2", "matplotlib", "PIL", "seaborn"},
}
# Host-only libraries that a benchmark environment does not have (yaml and numpy come with
# the model libraries there, so the source check above is what keeps the cell code off them).
HOST_LIBRARIES = ("pandas", "scipy", "jsonschema", "jinja2", "matplotlib", "seaborn")


def _part(path: Path) -> str:
    relative = path.relative_to(PACKAGE)
    return relative.parts[0] if len(relative.parts) > 1 else relative.stem


def _imports(source: str) -> list[tuple[int, str]]:
    tree = ast.parse(source)
    found = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            found += [(node.lineno, alias.name) for alias in node.names]
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            if node.module == "ptspeed":
                found += [(node.lineno, f"ptspeed.{alias.name}") for alias in node.names]
            else:
                found.append((node.lineno, node.module))
        elif isinstance(node, ast.ImportFrom) and node.level:
            found.append((node.lineno, "<relative>"))
    return found


def _violations(source: str, part: str, where: str) -> list[str]:
    problems = []
    for line, module in _imports(source):
        top = module.split(".")[0]
        if module == "<relative>":
            problems.append(f"{where}:{line}: relative import (the rule reads absolute ones)")
        elif top == "ptspeed":
            target = module.split(".")[1] if "." in module else "__init__"
            if target != part and target not in ALLOWED_PARTS[part]:
                problems.append(f"{where}:{line}: {part} imports {module}")
        elif top not in sys.stdlib_module_names and top not in ALLOWED_THIRD_PARTY[part]:
            problems.append(f"{where}:{line}: {part} imports third-party {top}")
    return problems


def _modules() -> list[Path]:
    return sorted(PACKAGE.rglob("*.py"))


def test_every_part_of_the_package_has_a_rule() -> None:
    parts = {_part(path) for path in _modules()}
    assert parts <= set(ALLOWED_PARTS), parts - set(ALLOWED_PARTS)
    assert set(ALLOWED_PARTS) == CELL_SIDE | HOST_SIDE


def test_no_cell_side_part_may_import_the_host_side() -> None:
    for part in CELL_SIDE:
        assert not ALLOWED_PARTS[part] & HOST_SIDE, part


@pytest.mark.parametrize("path", _modules(), ids=lambda p: str(p.relative_to(PACKAGE)))
def test_module_imports_only_what_its_part_may(path: Path) -> None:
    where = str(path.relative_to(SOURCE))
    assert _violations(path.read_text(), _part(path), where) == []


def test_the_rule_catches_a_cell_module_importing_the_host_side() -> None:
    source = "def f():\n    import pandas\n    from ptspeed.analysis import stats\n"
    problems = _violations(source, "cell", "probe.py")
    assert problems == [
        "probe.py:2: cell imports third-party pandas",
        "probe.py:3: cell imports ptspeed.analysis",
    ]


def _cell_side_modules() -> list[str]:
    names = []
    for path in _modules():
        if _part(path) in CELL_SIDE and path.name != "__main__.py":
            dotted = ".".join(path.relative_to(SOURCE).with_suffix("").parts)
            names.append(dotted.removesuffix(".__init__"))
    return names


def _import_blocking(blocked: tuple[str, ...], modules: list[str]) -> subprocess.CompletedProcess:
    # A module set to None in sys.modules cannot be imported: the import raises ImportError.
    program = (
        "import sys\n"
        f"for name in {list(blocked)!r}:\n"
        "    sys.modules[name] = None\n"
        f"for name in {modules!r}:\n"
        "    __import__(name)\n"
    )
    return subprocess.run(
        [sys.executable, "-c", program],
        capture_output=True,
        text=True,
        env={"PYTHONPATH": str(SOURCE)},
        check=False,
    )


@pytest.mark.slow
def test_the_cell_side_imports_without_the_host_libraries() -> None:
    done = _import_blocking(HOST_LIBRARIES, _cell_side_modules())
    assert done.returncode == 0, done.stderr[-2000:]


def test_the_launch_side_and_the_cell_command_import_without_torch() -> None:
    launch = [name for name in _cell_side_modules() if name.startswith("ptspeed.launch")]
    done = _import_blocking(("torch",), [*launch, "ptspeed.cli", "ptspeed.models"])
    assert done.returncode == 0, done.stderr[-2000:]
