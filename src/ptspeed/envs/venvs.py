"""Build the virtualenv of a PyTorch environment from its hash-locked requirements.

The venv of environment NAME lives in ``<dest_root>/<NAME>-<lock hash>/`` and is reused for as
long as its marker file (written last) says that it was built completely from the same lock and
its first module (torch) still imports at the marked version; a venv that no longer does (a
deleted or damaged file) is rebuilt. The installer is uv where it is found (``uv venv`` and
``uv pip sync --require-hashes``: one wheel cache for every venv, hard-linked into each, so a
wheel is downloaded once), else pip. One build per lock at a time: a second run that wants the
same venv waits on a lock file and then reuses what the first built; the staging directory of a
build that was killed is removed by the next build of that lock.
Standard library only: this runs in the orchestrating interpreter, which has no torch.
"""

import contextlib
import functools
import hashlib
import json
import os
import re
import shutil
import subprocess
import sys
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass
from datetime import datetime, timezone
from pathlib import Path

from ptspeed.cell.files import exclusive_lock, process_exists
from ptspeed.envs.locks import locked_version
from ptspeed.errors import EnvBuildError

MARKER_NAME = "ptspeed-env.json"
# What a venv's build guarantees beyond its lock; a marker of another build is outdated.
# 2: every module is compiled to bytecode at install time (uv does not by default, and a cell
# that compiles torch's sources at import time spends 5 to 20 s before its first step).
BUILD_FORMAT = 2
INSTALLERS = ("uv", "pip")
STAGING_PREFIX = ".tmp-"
DEFAULT_VERIFY_IMPORTS: tuple[str, ...] = ("torch", "torchvision", "transformers")

_VERSION_PROBE = "import sys; print('%d.%d' % sys.version_info[:2])"
_IMPORT_PROBE = """\
import importlib, json, platform, sys
found = {"python": platform.python_version()}
for module in sys.argv[1:]:
    found[module] = getattr(importlib.import_module(module), "__version__", None)
print(json.dumps(found))
"""
# Each would make pip or the import check look outside the venv being built.
_LEAKY_ENV_VARS = ("PYTHONPATH", "PYTHONHOME", "PIP_USER", "PIP_TARGET", "PIP_PREFIX")
# pip's settings of where wheels lie that uv has an equivalent for (uv reads no pip.conf).
_PIP_TO_UV = {
    "PIP_FIND_LINKS": "UV_FIND_LINKS",
    "PIP_INDEX_URL": "UV_INDEX_URL",
    "PIP_EXTRA_INDEX_URL": "UV_EXTRA_INDEX_URL",
}


def find_python(version: str, env_name: str | None = None) -> Path:
    """Return an interpreter of ``version`` (major.minor) that runs and reports that version.

    Looks on PATH (``python3.10``), then in pyenv's versions, then asks ``uv python find``.
    """
    _check_version_format(version)
    for candidate in _python_candidates(version):
        if _reports_version(candidate, version):
            return candidate
    needed_by = f" (needed by environment {env_name})" if env_name else ""
    raise EnvBuildError(
        f"no Python {version} found{needed_by}: install it with "
        f"`pyenv install {version}` or `uv python install {version}`"
    )


def venv_dir(
    dest_root: str | os.PathLike[str], name: str, requirements: str | os.PathLike[str]
) -> Path:
    """Where the venv of environment ``name`` built from ``requirements`` lives: one directory
    per lock file hash, shared by every checkout that uses the same cache."""
    return Path(dest_root) / f"{name}-{lock_hash(requirements)}"


def lock_hash(requirements_path: str | os.PathLike[str]) -> str:
    """Short (16 hex digits) sha256 of the requirements file's content."""
    return hashlib.sha256(Path(requirements_path).read_bytes()).hexdigest()[:16]


def find_uv() -> str | None:
    """uv on PATH, else the one installed next to the running interpreter (a venv's bin/)."""
    on_path = shutil.which("uv")
    if on_path:
        return on_path
    beside_interpreter = Path(sys.executable).parent / "uv"
    if beside_interpreter.is_file() and os.access(beside_interpreter, os.X_OK):
        return str(beside_interpreter)
    return None


def build_venv(
    name: str,
    requirements: str | os.PathLike[str],
    python_version: str,
    dest_root: str | os.PathLike[str],
    *,
    python: str | os.PathLike[str] | None = None,
    verify_imports: Sequence[str] = DEFAULT_VERIFY_IMPORTS,
    installer: str | None = None,
) -> Path:
    """Build (or reuse) the venv of environment ``name`` and return its directory.

    The venv is built in a temporary directory beside its final place and renamed into place
    once the lock is installed, the imports in ``verify_imports`` work, the first of them has
    the version that the lock pins, and the marker is written. ``python`` overrides the
    interpreter that ``find_python(python_version)`` would choose; ``installer`` ('uv' or
    'pip') the one :func:`default_installer` would.
    """
    requirements = Path(requirements).absolute()
    if not requirements.is_file():
        raise EnvBuildError(f"requirements file {requirements} not found")
    _check_version_format(python_version)
    if not verify_imports:
        raise EnvBuildError("verify_imports must name at least one module")
    tool = installer or default_installer()
    if tool not in INSTALLERS:
        raise EnvBuildError(f"installer: {tool!r} is not one of {', '.join(INSTALLERS)}")
    digest = lock_hash(requirements)
    final = venv_dir(dest_root, name, requirements).absolute()
    if _is_usable(final, name, digest, python_version, verify_imports[0]):
        _say(f"reusing environment {name}: {final}")
        return final
    final.parent.mkdir(parents=True, exist_ok=True)
    with _build_lock(final, name):
        if _is_usable(final, name, digest, python_version, verify_imports[0]):
            _say(f"reusing environment {name}, built by another run meanwhile: {final}")
            return final
        _remove_staging_leftovers(final)
        # A complete venv that no longer imports was damaged after its build; with uv its files
        # are hard links into uv's cache, which an in-place write damages too: bypass it.
        bypass_cache = _is_complete(final, name, digest, python_version)
        interpreter = Path(python) if python else find_python(python_version, env_name=name)
        staging = final.parent / f"{STAGING_PREFIX}{final.name}-{os.getpid()}"
        try:
            _say(f"building environment {name} with {tool} (Python {python_version}): {final}")
            Installation(tool, interpreter, requirements, bypass_cache).run(staging, final, name)
            found = _import_versions(staging, verify_imports, name)
            _check_versions(found, requirements, python_version, verify_imports[0], name)
            _retarget_paths(staging, final)
            _write_marker(staging, name, found, digest, requirements, tool)
            return _move_into_place(staging, final, name, python_version)
        finally:
            _remove(staging)


def default_installer() -> str:
    """``$PTSPEED_ENV_INSTALLER`` when set, else uv where it is found, else pip."""
    return os.environ.get("PTSPEED_ENV_INSTALLER") or ("uv" if find_uv() else "pip")


@dataclass(frozen=True)
class Installation:
    """How a venv is made: the installer (uv or pip), the base interpreter, the lock, and
    whether uv's cache is bypassed (after a damaged venv, whose hard-linked files it shares)."""

    tool: str
    interpreter: Path
    requirements: Path
    bypass_cache: bool = False

    def run(self, staging: Path, final: Path, name: str) -> None:
        """Make the venv in ``staging`` (its prompt the name of ``final``), install the lock."""
        create, install = (
            self._uv_commands(staging) if self.tool == "uv" else self._pip_commands(staging)
        )
        _run_step([*create, "--prompt", final.name, str(staging)], f"creating the venv of {name}")
        _run_step(install, f"installing the lock of {name}")

    def _uv_commands(self, staging: Path) -> tuple[list[str], list[str]]:
        uv = find_uv()
        if uv is None:
            raise EnvBuildError("installer uv: uv is not installed (pip install uv)")
        create = [uv, "venv", "--no-config", "--python", str(self.interpreter)]
        install = [uv, "pip", "sync", "--no-config", "--require-hashes", "--compile-bytecode"]
        if self.bypass_cache:
            _say("installing without uv's cache, which may hold the damaged files too")
            install.append("--no-cache")
        return create, [*install, "--python", str(venv_python(staging)), str(self.requirements)]

    def _pip_commands(self, staging: Path) -> tuple[list[str], list[str]]:
        create = [str(self.interpreter), "-m", "venv"]
        install = [str(venv_python(staging)), "-m", "pip", "install", "--require-hashes"]
        return create, [*install, "--compile", "--no-deps", "-r", str(self.requirements)]


def _build_lock(final: Path, name: str) -> contextlib.AbstractContextManager[None]:
    """The build lock of ``final`` (a lock file beside it): one build of a lock at a time."""
    lock_path = final.parent / f".{final.name}.lock"
    waiting = f"waiting for another run building environment {name} ({lock_path})"
    return exclusive_lock(lock_path, functools.partial(_say, waiting))


def _remove_staging_leftovers(final: Path) -> None:
    """Remove staging directories of earlier builds of ``final`` whose process is gone (a build
    killed mid-way leaves its several-GB directory). Called with the build lock held."""
    for leftover in final.parent.glob(f"{STAGING_PREFIX}{final.name}-*"):
        builder = leftover.name.rsplit("-", 1)[1]
        if builder.isdigit() and process_exists(int(builder)):
            continue  # a build without the lock (an older ptspeed) still at work
        _say(f"removing {leftover}, left by an interrupted build")
        _remove(leftover)


def venv_python(venv: str | os.PathLike[str]) -> Path:
    """The venv's own interpreter (a symlink: never resolve it, or the venv is lost)."""
    return Path(venv).absolute() / "bin" / "python"


def _check_version_format(version: str) -> None:
    if not re.fullmatch(r"\d+\.\d+", version):
        raise EnvBuildError(f"Python version must be major.minor (like 3.10), not {version!r}")


def _python_candidates(version: str) -> Iterator[Path]:
    yield from _on_path(f"python{version}")
    yield from _in_pyenv(version)
    found_by_uv = _found_by_uv(version)
    if found_by_uv:
        yield found_by_uv


def _on_path(command: str) -> Iterator[Path]:
    # Every PATH entry, not only the first hit: pyenv puts a shim first that may refuse to run.
    for directory in os.environ.get("PATH", "").split(os.pathsep):
        candidate = Path(directory or ".") / command
        if candidate.is_file() and os.access(candidate, os.X_OK):
            yield candidate


def _in_pyenv(version: str) -> Iterator[Path]:
    root = _pyenv_root()
    if root is None:
        return
    installs = sorted((root / "versions").glob(f"{version}.*"), key=_patch_key, reverse=True)
    for install in installs:
        candidate = install / "bin" / "python"
        if candidate.is_file():
            yield candidate


def _pyenv_root() -> Path | None:
    if os.environ.get("PYENV_ROOT"):
        return Path(os.environ["PYENV_ROOT"])
    pyenv = shutil.which("pyenv")
    if pyenv:
        answer = _quiet_run([pyenv, "root"])
        if answer is not None:
            return Path(answer)
    default = Path.home() / ".pyenv"
    return default if default.is_dir() else None


def _patch_key(install: Path) -> tuple[int, bool]:
    """Newest patch first; a final release before a pre-release of the same patch."""
    match = re.fullmatch(r"\d+\.\d+\.(\d+)(.*)", install.name)
    return (int(match[1]), match[2] == "") if match else (-1, False)


def _found_by_uv(version: str) -> Path | None:
    uv = find_uv()
    if uv is None:
        return None
    # --system: a project's .venv of the right version is no base for another venv.
    answer = _quiet_run([uv, "python", "find", "--system", version])
    return Path(answer) if answer else None


def _reports_version(python: Path, version: str) -> bool:
    return _quiet_run([str(python), "-c", _VERSION_PROBE]) == version


def _quiet_run(command: list[str]) -> str | None:
    """The command's stripped stdout when it succeeds, else None; its stderr is dropped."""
    try:
        done = subprocess.run(
            command, capture_output=True, text=True, timeout=60, env=_child_env(), check=False
        )
    except (OSError, subprocess.TimeoutExpired):
        return None
    return done.stdout.strip() if done.returncode == 0 else None


def _child_env() -> dict[str, str]:
    env = {key: value for key, value in os.environ.items() if key not in _LEAKY_ENV_VARS}
    env["PIP_DISABLE_PIP_VERSION_CHECK"] = "1"
    env["UV_PYTHON_DOWNLOADS"] = "never"  # the interpreter is the one find_python chose
    env.update(uv_settings_from_pip(env))
    return env


def uv_settings_from_pip(env: Mapping[str, str]) -> dict[str, str]:
    """uv's equivalents of pip's wheel locations set in ``env`` (PIP_FIND_LINKS, …) that are
    not set for uv already: local wheels pip would take, uv takes too instead of downloading.
    pip separates several locations with spaces, uv with commas."""
    return {
        uv_name: ",".join(env[pip_name].split())
        for pip_name, uv_name in _PIP_TO_UV.items()
        if env.get(pip_name, "").strip() and uv_name not in env
    }


def _run_step(command: list[str], what: str, capture_stdout: bool = False) -> str:
    """Run one build step with its output going to ours (the rule's log); fail in one line."""
    sys.stdout.flush()
    sys.stderr.flush()
    try:
        done = subprocess.run(
            command,
            env=_child_env(),
            stdout=subprocess.PIPE if capture_stdout else None,
            text=True,
            check=False,
        )
    except OSError as error:
        raise EnvBuildError(f"{what} failed: {error}") from error
    if done.returncode != 0:
        raise EnvBuildError(f"{what} failed (exit {done.returncode}); its output is above")
    return done.stdout or ""


def _import_versions(venv: Path, modules: Sequence[str], name: str) -> dict[str, str | None]:
    what = f"importing {', '.join(modules)} in {name}"
    output = _run_step([str(venv_python(venv)), "-c", _IMPORT_PROBE, *modules], what, True)
    try:
        return json.loads(output.strip().splitlines()[-1])
    except (IndexError, ValueError) as error:
        raise EnvBuildError(f"{what} printed no versions: {output[-200:]!r}") from error


def _check_versions(
    found: dict[str, str | None],
    requirements: Path,
    python_version: str,
    module: str,
    name: str,
) -> None:
    python_found = found.get("python") or ""
    if not python_found.startswith(f"{python_version}."):
        raise EnvBuildError(f"the venv of {name} runs Python {python_found}, not {python_version}")
    pinned = locked_version(requirements.read_text(encoding="utf-8"), module)
    if pinned is None:
        raise EnvBuildError(f"{requirements} does not pin {module} (==<version>, or a wheel's URL)")
    installed = found.get(module) or ""
    # PyPI's CUDA wheels report a local version (1.13.1+cu117) that the lock does not spell; a
    # lock that spells one (2.0.1+cu118, by version or a wheel's URL) wants exactly that build.
    if installed != pinned and installed.split("+")[0] != pinned:
        raise EnvBuildError(f"{name}: the lock pins {module}=={pinned}, the venv has {installed}")


def _retarget_paths(staging: Path, final: Path) -> None:
    """Point the scripts' shebangs and activate files at the final place before the rename."""
    old, new = str(staging).encode(), str(final).encode()
    candidates = [*(staging / "bin").iterdir(), staging / "pyvenv.cfg"]
    for path in candidates:
        if path.is_symlink() or not path.is_file():
            continue
        content = path.read_bytes()
        if old in content:
            path.write_bytes(content.replace(old, new))


def _write_marker(
    venv: Path,
    name: str,
    found: dict[str, str | None],
    digest: str,
    requirements: Path,
    installer: str,
) -> None:
    modules = {module: version for module, version in found.items() if module != "python"}
    marker = {
        "name": name,
        "python_version": found["python"],
        "torch_version": found.get("torch"),
        "modules": modules,
        "lock_hash": digest,
        "requirements": str(requirements),
        "installer": installer,
        "build_format": BUILD_FORMAT,
        "created_at": datetime.now(timezone.utc).isoformat(timespec="seconds"),
    }
    (venv / MARKER_NAME).write_text(json.dumps(marker, indent=2) + "\n")


def _is_complete(venv: Path, name: str, digest: str, python_version: str) -> bool:
    try:
        marker = json.loads((venv / MARKER_NAME).read_text())
    except (OSError, ValueError):
        return False
    return (
        isinstance(marker, dict)
        and marker.get("name") == name
        and marker.get("lock_hash") == digest
        and marker.get("build_format") == BUILD_FORMAT
        and str(marker.get("python_version", "")).startswith(f"{python_version}.")
        and venv_python(venv).exists()  # False too when its base interpreter has gone
    )


def _is_usable(venv: Path, name: str, digest: str, python_version: str, module: str) -> bool:
    """Complete (:func:`_is_complete`) and ``module`` still imports at the marked version: a
    venv whose files were damaged after it was built is not trusted."""
    if not _is_complete(venv, name, digest, python_version):
        return False
    marked = json.loads((venv / MARKER_NAME).read_text()).get("modules", {}).get(module)
    probe = [str(venv_python(venv)), "-c", _IMPORT_PROBE, module]
    answer = _quiet_run(probe)
    try:
        imported = json.loads(answer.splitlines()[-1]).get(module) if answer else None
    except ValueError:
        imported = None
    if answer is None or imported != marked:
        _say(f"the cached environment {name} is broken ({module} does not import as built): {venv}")
        return False
    return True


def _move_into_place(staging: Path, final: Path, name: str, python_version: str) -> Path:
    """Replace ``final`` (incomplete, outdated or damaged: the build lock is held, so no other
    build is writing it) by ``staging``."""
    if final.exists() or final.is_symlink():
        _say(f"removing the incomplete, outdated or damaged {final}")
        _remove(final)
    try:
        staging.rename(final)
    except OSError as error:
        raise EnvBuildError(f"cannot move {staging} to {final}: {error}") from error
    if not _reports_version(venv_python(final), python_version):
        _remove(final)
        raise EnvBuildError(f"the venv of {name} no longer runs after moving it to {final}")
    _say(f"built environment {name}: {final}")
    return final


def _remove(path: Path) -> None:
    if path.is_symlink() or path.is_file():
        path.unlink()
    elif path.exists():
        shutil.rmtree(path)


def _say(message: str) -> None:
    print(f"[envbuild] {message}", file=sys.stderr, flush=True)
