"""Tests of ptspeed.envs.venvs and workflow/scripts/build_env.py.

The builds here use the running interpreter and a wheel made on the spot (no network); only the
test marked slow installs from PyPI.
"""

import base64
import fcntl
import hashlib
import json
import os
import platform
import re
import subprocess
import sys
import time
import zipfile
from pathlib import Path

import pytest

from ptspeed.cell.gpu_code import GpuCode
from ptspeed.envs import venvs as envbuild
from ptspeed.envs.gpu_code import recorded_code
from ptspeed.envs.venvs import (
    BUILD_FORMAT,
    INSTALLERS,
    MARKER_NAME,
    build_venv,
    find_python,
    lock_hash,
    venv_python,
)
from ptspeed.errors import EnvBuildError

REPO = Path(__file__).resolve().parents[1]
BUILD_ENV_SCRIPT = REPO / "workflow" / "scripts" / "build_env.py"
THIS_PYTHON = f"{sys.version_info[0]}.{sys.version_info[1]}"


# --- find_python ---------------------------------------------------------------------------


def fake_executable(path: Path, script: str) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(f"#!/bin/sh\n{script}\n")
    path.chmod(0o755)
    return path


@pytest.fixture
def no_pythons(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """An empty PATH and pyenv root, and no uv: nothing to find until a test adds it."""
    path_dir = tmp_path / "path"
    path_dir.mkdir()
    (tmp_path / "pyenv" / "versions").mkdir(parents=True)
    monkeypatch.setenv("PATH", str(path_dir))
    monkeypatch.setenv("PYENV_ROOT", str(tmp_path / "pyenv"))
    monkeypatch.setattr(envbuild, "find_uv", lambda: None)
    return tmp_path


def test_find_python_on_path(no_pythons: Path) -> None:
    python = fake_executable(no_pythons / "path" / "python3.10", "echo 3.10")
    assert find_python("3.10") == python


def test_find_python_skips_a_broken_shim_and_takes_the_newest_pyenv_patch(
    no_pythons: Path,
) -> None:
    fake_executable(no_pythons / "path" / "python3.10", "echo 'pyenv: not found' >&2; exit 127")
    versions = no_pythons / "pyenv" / "versions"
    fake_executable(versions / "3.10.9" / "bin" / "python", "echo 3.10")
    newest = fake_executable(versions / "3.10.13" / "bin" / "python", "echo 3.10")
    fake_executable(versions / "3.11.7" / "bin" / "python", "echo 3.11")
    assert find_python("3.10") == newest


def test_find_python_ignores_an_interpreter_of_another_version(no_pythons: Path) -> None:
    fake_executable(no_pythons / "path" / "python3.10", "echo 3.11")
    with pytest.raises(EnvBuildError):
        find_python("3.10")


def test_find_python_asks_uv_last(no_pythons: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    python = fake_executable(no_pythons / "uv-python" / "python", "echo 3.10")
    uv = fake_executable(
        no_pythons / "uv",
        f'[ "$*" = "python find --system 3.10" ] && echo {python} || exit 2',
    )
    monkeypatch.setattr(envbuild, "find_uv", lambda: str(uv))
    assert find_python("3.10") == python


def test_find_python_says_what_to_install(no_pythons: Path) -> None:
    with pytest.raises(EnvBuildError) as raised:
        find_python("3.10", env_name="torch-1.13")
    assert str(raised.value) == (
        "no Python 3.10 found (needed by environment torch-1.13): "
        "install it with `pyenv install 3.10` or `uv python install 3.10`"
    )


@pytest.mark.parametrize("version", ["3", "3.10.13", "py3.10", ""])
def test_find_python_wants_major_minor(version: str) -> None:
    with pytest.raises(EnvBuildError, match=re.escape("major.minor")):
        find_python(version)


# --- lock_hash and the version check against the lock --------------------------------------


def test_lock_hash_depends_on_content_only(tmp_path: Path) -> None:
    first, second = tmp_path / "a.txt", tmp_path / "b.txt"
    first.write_text("torch==2.0.1\n")
    second.write_text("torch==2.0.1\n")
    assert lock_hash(first) == lock_hash(second) == lock_hash(str(first))
    assert lock_hash(first) == hashlib.sha256(b"torch==2.0.1\n").hexdigest()[:16]
    second.write_text("torch==2.0.1\n# changed\n")
    assert lock_hash(second) != lock_hash(first)


def test_lock_hash_is_16_hex_digits(tmp_path: Path) -> None:
    empty = tmp_path / "empty.txt"
    empty.write_text("")
    assert lock_hash(empty) == "e3b0c44298fc1c14"


def check_torch(requirements: Path, torch_version: str) -> None:
    """The build's check of a venv whose Python 3.10 imports torch at ``torch_version``."""
    found: dict[str, str | None] = {"python": "3.10.14", "torch": torch_version}
    envbuild._check_versions(found, requirements, "3.10", "torch", "env")


@pytest.mark.parametrize(
    ("lock", "installed"),
    [
        ("torch==2.0.1 \\\n    --hash=sha256:00\n", "2.0.1+cu117"),  # PyPI's CUDA wheel
        ("torch==2.0.1\n", "2.0.1"),
        ("torch==2.0.1+cu118 \\\n    --hash=sha256:00\n", "2.0.1+cu118"),
        (REPO / "envs" / "torch-2.0-cu118.txt", "2.0.1+cu118"),  # PyTorch's wheel by URL
    ],
)
def test_the_version_check_takes_the_build_the_lock_pins(
    tmp_path: Path, lock: str | Path, installed: str
) -> None:
    if isinstance(lock, str):
        (tmp_path / "lock.txt").write_text(lock)
        lock = tmp_path / "lock.txt"
    check_torch(lock, installed)


def test_the_version_check_refuses_another_build_than_the_url_pinned_one(tmp_path: Path) -> None:
    lock = REPO / "envs" / "torch-2.0-cu118.txt"
    with pytest.raises(
        EnvBuildError, match=re.escape("pins torch==2.0.1+cu118, the venv has 2.0.1+cu117")
    ):
        check_torch(lock, "2.0.1+cu117")
    with pytest.raises(
        EnvBuildError, match=re.escape("pins torch==2.0.1+cu118, the venv has 2.0.1")
    ):
        check_torch(lock, "2.0.1")
    unpinned = tmp_path / "lock.txt"
    unpinned.write_text("torchvision @ https://example.org/torchvision-0.15.2-py3-none-any.whl\n")
    with pytest.raises(EnvBuildError, match="does not pin torch"):
        check_torch(unpinned, "2.0.1")


# --- build_venv, offline -------------------------------------------------------------------


def make_wheel(directory: Path, version: str = "1.0", module_version: str | None = None) -> Path:
    """A minimal pure-Python wheel of package 'tinypkg' whose module says ``module_version``."""
    dist_info = f"tinypkg-{version}.dist-info"
    files = {
        "tinypkg/__init__.py": f'__version__ = "{module_version or version}"\n',
        f"{dist_info}/METADATA": f"Metadata-Version: 2.1\nName: tinypkg\nVersion: {version}\n",
        f"{dist_info}/WHEEL": (
            "Wheel-Version: 1.0\nGenerator: test\nRoot-Is-Purelib: true\nTag: py3-none-any\n"
        ),
    }
    record = [f"{name},sha256={_record_digest(text)},{len(text)}" for name, text in files.items()]
    files[f"{dist_info}/RECORD"] = "\n".join([*record, f"{dist_info}/RECORD,,"]) + "\n"
    wheel = directory / f"tinypkg-{version}-py3-none-any.whl"
    directory.mkdir(parents=True, exist_ok=True)
    with zipfile.ZipFile(wheel, "w") as archive:
        for name, text in files.items():
            archive.writestr(name, text)
    return wheel


def _record_digest(text: str) -> str:
    digest = hashlib.sha256(text.encode()).digest()
    return base64.urlsafe_b64encode(digest).rstrip(b"=").decode()


def offline_lock(tmp_path: Path, wheel: Path, sha256: str | None = None) -> Path:
    sha256 = sha256 or hashlib.sha256(wheel.read_bytes()).hexdigest()
    requirements = tmp_path / "tiny.txt"
    requirements.write_text(
        f"--no-index\n--find-links {wheel.parent}\ntinypkg==1.0 --hash=sha256:{sha256}\n"
    )
    return requirements


def build_tiny(requirements: Path, dest: Path, installer: str = "pip") -> Path:
    return build_venv(
        "tiny",
        requirements,
        THIS_PYTHON,
        dest,
        python=sys.executable,
        verify_imports=["tinypkg"],
        installer=installer,
    )


def lock_and_build_tiny(tmp_path: Path, installer: str) -> tuple[Path, Path]:
    """An offline lock of tinypkg and its venv, built in ``tmp_path/envs``."""
    requirements = offline_lock(tmp_path, make_wheel(tmp_path / "wheels"))
    return requirements, build_tiny(requirements, tmp_path / "envs", installer)


def rebuild_tiny(
    requirements: Path, tmp_path: Path, installer: str, capsys: pytest.CaptureFixture[str]
) -> Path:
    """Build the venv again, with only what this build says left in ``capsys``."""
    capsys.readouterr()
    return build_tiny(requirements, tmp_path / "envs", installer)


@pytest.fixture(params=INSTALLERS)
def installer(
    request: pytest.FixtureRequest,
    tmp_path_factory: pytest.TempPathFactory,
    monkeypatch: pytest.MonkeyPatch,
) -> str:
    """Each installer in turn; uv where it is installed (make setup installs it), with a cache
    of the tests' own (a test damages a hard-linked file on purpose)."""
    if request.param == "uv" and envbuild.find_uv() is None:
        pytest.skip("uv is not installed")
    monkeypatch.setenv("UV_CACHE_DIR", str(tmp_path_factory.getbasetemp() / "uv-cache"))
    return request.param


@pytest.mark.venv
def test_build_venv_builds_marks_and_moves_into_place(
    tmp_path: Path, installer: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("PYTHONDONTWRITEBYTECODE", "1")  # as in an image: only the build compiles
    requirements = offline_lock(tmp_path, make_wheel(tmp_path / "wheels"))
    dest = tmp_path / "envs"
    leftover = dest / f"tiny-{lock_hash(requirements)}"  # as an interrupted build leaves it
    leftover.mkdir(parents=True)
    (leftover / "half-written").write_text("")

    venv = build_tiny(requirements, dest, installer)

    assert venv == leftover.absolute()
    assert not (venv / "half-written").exists()
    assert sorted(path.name for path in dest.iterdir()) == [f".{venv.name}.lock", venv.name]
    marker = json.loads((venv / MARKER_NAME).read_text())
    assert marker["name"] == "tiny"
    assert marker["python_version"] == platform.python_version()
    assert marker["torch_version"] is None
    assert marker["modules"] == {"tinypkg": "1.0"}
    assert marker["lock_hash"] == lock_hash(requirements)
    assert marker["requirements"] == str(requirements)
    assert marker["installer"] == installer
    assert marker["build_format"] == BUILD_FORMAT
    assert marker["created_at"]
    site_packages = next(venv.glob("lib/python*/site-packages"))
    assert list((site_packages / "tinypkg" / "__pycache__").glob("__init__.*.pyc"))
    imported = subprocess.run(
        [venv_python(venv), "-c", "import sys, tinypkg; print(sys.prefix, tinypkg.__version__)"],
        capture_output=True,
        text=True,
        check=True,
    )
    assert imported.stdout.split() == [str(venv), "1.0"]
    if installer == "pip":  # uv's venvs have no pip
        pip_script = (venv / "bin" / "pip").read_text()
        assert f"{venv}/bin/python" in pip_script
        assert ".tmp-" not in pip_script
    assert "tmp-" not in (venv / "bin" / "activate").read_text()
    assert build_tiny(requirements, dest, installer) == venv
    assert json.loads((venv / MARKER_NAME).read_text()) == marker  # reused, not rebuilt


def test_build_venv_reuses_a_complete_venv_without_running_anything(tmp_path: Path) -> None:
    requirements = tmp_path / "lock.txt"
    requirements.write_text("tinypkg==1.0 --hash=sha256:00\n")
    venv = tmp_path / "envs" / f"tiny-{lock_hash(requirements)}"
    (venv / "bin").mkdir(parents=True)
    (venv / "bin" / "python").symlink_to(sys.executable)
    marker = {"name": "tiny", "lock_hash": lock_hash(requirements), "build_format": BUILD_FORMAT}
    marker["python_version"] = platform.python_version()
    marker["modules"] = {"json": json.__version__}
    (venv / MARKER_NAME).write_text(json.dumps(marker))

    found = build_venv(
        "tiny",
        requirements,
        THIS_PYTHON,
        tmp_path / "envs",
        python="/nonexistent/python",
        verify_imports=["json"],
    )
    assert found == venv


@pytest.mark.venv
def test_build_venv_refuses_a_wheel_with_another_hash(tmp_path: Path, installer: str) -> None:
    requirements = offline_lock(tmp_path, make_wheel(tmp_path / "wheels"), sha256="0" * 64)
    with pytest.raises(EnvBuildError, match="installing the lock of tiny failed"):
        build_tiny(requirements, tmp_path / "envs", installer)
    assert [p.name for p in (tmp_path / "envs").iterdir()] == [
        f".tiny-{lock_hash(requirements)}.lock"
    ]


@pytest.mark.venv
def test_build_venv_checks_the_imported_version_against_the_lock(tmp_path: Path) -> None:
    wheel = make_wheel(tmp_path / "wheels", module_version="2.0")
    requirements = offline_lock(tmp_path, wheel)
    with pytest.raises(EnvBuildError, match=re.escape("pins tinypkg==1.0, the venv has 2.0")):
        build_tiny(requirements, tmp_path / "envs")
    assert [p.name for p in (tmp_path / "envs").iterdir()] == [
        f".tiny-{lock_hash(requirements)}.lock"
    ]


def test_build_venv_reports_a_missing_requirements_file(tmp_path: Path) -> None:
    with pytest.raises(EnvBuildError, match="not found"):
        build_venv("tiny", tmp_path / "missing.txt", THIS_PYTHON, tmp_path / "envs")


# --- faults: a killed build, a damaged venv, two builds of one lock -------------------------

BUILD_TINY = """
import sys
sys.path.insert(0, sys.argv[1])
from ptspeed.envs.venvs import build_venv
venv = build_venv("tiny", sys.argv[2], sys.argv[3], sys.argv[4], python=sys.executable,
                  verify_imports=["tinypkg"], installer=sys.argv[5])
print(venv)
"""


def start_build(requirements: Path, dest: Path, installer: str) -> subprocess.Popen[str]:
    """build_venv of the tiny lock in another process (as another Snakemake run would)."""
    command = [sys.executable, "-c", BUILD_TINY, str(REPO / "src"), str(requirements)]
    command += [THIS_PYTHON, str(dest), installer]
    env = {key: value for key, value in os.environ.items() if key != "PYTHONPATH"}
    return subprocess.Popen(
        command, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env
    )


def staging_dirs(dest: Path) -> list[Path]:
    return sorted(dest.glob(".tmp-*")) if dest.exists() else []


@pytest.mark.venv
def test_a_build_killed_midway_leaves_a_staging_dir_that_the_next_build_removes(
    tmp_path: Path, installer: str
) -> None:
    requirements = offline_lock(tmp_path, make_wheel(tmp_path / "wheels"))
    dest = tmp_path / "envs"
    # pip's venv creation (ensurepip) takes seconds: the build is killed while it works.
    build = start_build(requirements, dest, "pip")
    deadline = time.monotonic() + 120
    while not staging_dirs(dest) and time.monotonic() < deadline and build.poll() is None:
        time.sleep(0.02)
    build.kill()  # SIGKILL: no finally block runs, as when a node or an OOM killer ends it
    build.communicate()
    [leaked] = staging_dirs(dest)
    assert not (dest / f"tiny-{lock_hash(requirements)}").exists()

    venv = build_tiny(requirements, dest, installer)
    assert not leaked.exists() and staging_dirs(dest) == []
    assert json.loads((venv / MARKER_NAME).read_text())["modules"] == {"tinypkg": "1.0"}


@pytest.mark.venv
def test_a_damaged_cached_venv_is_rebuilt_not_trusted(
    tmp_path: Path, installer: str, capsys: pytest.CaptureFixture[str]
) -> None:
    requirements, venv = lock_and_build_tiny(tmp_path, installer)
    [module] = venv.glob("lib/python*/site-packages/tinypkg/__init__.py")
    module.write_text("raise ImportError('a file of the package was lost')\n")  # marker intact

    assert rebuild_tiny(requirements, tmp_path, installer, capsys) == venv
    said = capsys.readouterr().err
    assert (
        f"the cached environment tiny is broken (tinypkg does not import as built): {venv}" in said
    )
    assert "building environment tiny" in said
    imported = subprocess.run([venv_python(venv), "-c", "import tinypkg"], capture_output=True)
    assert imported.returncode == 0, imported.stderr


@pytest.mark.venv
def test_a_venv_of_an_older_build_format_is_rebuilt_from_the_cache(
    tmp_path: Path, installer: str, capsys: pytest.CaptureFixture[str]
) -> None:
    requirements, venv = lock_and_build_tiny(tmp_path, installer)
    marker_path = venv / MARKER_NAME
    older = json.loads(marker_path.read_text())
    del older["build_format"]  # as ptspeed wrote it before venvs were compiled to bytecode
    marker_path.write_text(json.dumps(older))

    assert rebuild_tiny(requirements, tmp_path, installer, capsys) == venv
    said = capsys.readouterr().err
    assert "building environment tiny" in said
    assert "without uv's cache" not in said  # outdated, not damaged: the cache is sound
    assert json.loads(marker_path.read_text())["build_format"] == BUILD_FORMAT


@pytest.mark.venv
def test_two_runs_building_one_lock_build_it_once(tmp_path: Path, installer: str) -> None:
    requirements = offline_lock(tmp_path, make_wheel(tmp_path / "wheels"))
    dest = tmp_path / "envs"
    dest.mkdir()
    lock_path = dest / f".tiny-{lock_hash(requirements)}.lock"
    # Both start while a third holder has the lock, so that they surely overlap.
    with open(lock_path, "a+") as held:
        fcntl.flock(held, fcntl.LOCK_EX)
        builds = [start_build(requirements, dest, installer) for _ in range(2)]
        time.sleep(1)
    outcomes = [build.communicate(timeout=300) for build in builds]
    assert [build.returncode for build in builds] == [0, 0], outcomes
    said = "".join(err for _, err in outcomes)
    assert said.count("waiting for another run building environment tiny") == 2, said
    assert said.count("building environment tiny with") == 1, said
    assert said.count("reusing environment tiny, built by another run meanwhile") == 1, said
    built = {out.strip().splitlines()[-1] for out, _ in outcomes}  # after the installer's output
    assert built == {str(dest / f"tiny-{lock_hash(requirements)}")}


# --- workflow/scripts/build_env.py ---------------------------------------------------------


def run_build_env(*args: str | Path, cwd: Path = REPO) -> subprocess.CompletedProcess[str]:
    env = {key: value for key, value in os.environ.items() if key != "PYTHONPATH"}
    command = [sys.executable, str(BUILD_ENV_SCRIPT), *map(str, args)]
    return subprocess.run(command, capture_output=True, text=True, cwd=cwd, env=env, check=False)


def torch_version_of(python: str) -> str:
    probe = [python, "-c", "import torch; print(torch.__version__)"]
    return subprocess.run(probe, capture_output=True, text=True, check=True).stdout.strip()


@pytest.mark.slow  # imports torch three times in subprocesses
def test_build_env_script_writes_the_interpreter_and_its_gpu_code(tmp_path: Path) -> None:
    requirements = offline_lock(tmp_path, make_wheel(tmp_path / "wheels"))
    link = tmp_path / "results" / "envs" / "tiny.json"
    # An already complete venv whose torch imports (the tests' own interpreter stands in for
    # its python): the script must only find it and write the link.
    venv = tmp_path / "envs" / f"tiny-{lock_hash(requirements)}"
    fake_executable(venv / "bin" / "python", f'exec {sys.executable} "$@"')
    marker = {"name": "tiny", "lock_hash": lock_hash(requirements), "build_format": BUILD_FORMAT}
    marker["python_version"] = platform.python_version()
    marker["modules"] = {"torch": torch_version_of(sys.executable)}
    (venv / MARKER_NAME).write_text(json.dumps(marker))

    done = run_build_env(
        *("--name", "tiny", "--requirements", requirements, "--python", THIS_PYTHON),
        *("--dest", tmp_path / "envs", "--link", link),
        cwd=tmp_path,
    )
    assert done.returncode == 0, done.stderr
    record = json.loads(link.read_text())
    assert record["python"] == f"{venv}/bin/python"
    import torch  # the venv's python is this interpreter: the same torch

    assert GpuCode.from_json(record["gpu_code"]) == GpuCode.from_torch(torch)
    assert recorded_code(link) == GpuCode.from_torch(torch)
    assert [path.name for path in link.parent.iterdir()] == ["tiny.json"]


def test_build_env_script_fails_in_one_line(tmp_path: Path) -> None:
    done = run_build_env(
        *("--name", "tiny", "--requirements", tmp_path / "missing.txt", "--python", "3.10"),
        *("--dest", tmp_path / "envs", "--link", tmp_path / "tiny.path"),
    )
    assert done.returncode == 2
    assert done.stderr.startswith("error: requirements file ")
    assert len(done.stderr.strip().splitlines()) == 1
    assert not (tmp_path / "tiny.path").exists()


# --- from PyPI -----------------------------------------------------------------------------


@pytest.mark.slow
@pytest.mark.venv
@pytest.mark.network
def test_build_venv_from_pypi(tmp_path: Path) -> None:
    requirements = tmp_path / "six.txt"
    requirements.write_text(
        "six==1.16.0 \\\n"
        "    --hash=sha256:1e61c37477a1626458e36f7b1d82aa5c9b094fa4802892072e49de9c60c4c926 \\\n"
        "    --hash=sha256:8abb2f1d86890a2dfb989f9a77cfcfd3e47c2a354b01111771326f8aa26e0254\n"
    )
    venv = build_venv("six", requirements, THIS_PYTHON, tmp_path / "envs", verify_imports=["six"])
    assert json.loads((venv / MARKER_NAME).read_text())["modules"] == {"six": "1.16.0"}
    again = build_venv("six", requirements, THIS_PYTHON, tmp_path / "envs", verify_imports=["six"])
    assert again == venv
