"""The hash-locked requirement sets envs/*.txt, scripts/lock_envs.sh, which makes them, and
ptspeed.envs.locks, which reads the version each pins a package to.

Every requirement of every lock is pinned (``==`` from PyPI, or one wheel by URL) and hashed, in
a form pip reads; torch-2.0-cu118 pins PyTorch's CUDA 11.8 wheels by their download.pytorch.org
URLs with the sha256 that envs/README.md documents, and is torch-2.0 otherwise; config/hopper.yaml
runs it. Nothing here locks or downloads anything: the script's own checks run, and its rewrite
of an extra index's packages into URL pins runs against a local HTTP server.
"""

from __future__ import annotations

import functools
import http.server
import re
import subprocess
import threading
from collections.abc import Iterator
from pathlib import Path
from urllib.parse import quote, unquote

import pytest
import yaml
from packaging.requirements import Requirement  # packaging: a dependency of pytest
from packaging.utils import canonicalize_name, parse_wheel_filename
from packaging.version import Version

from ptspeed.envs.locks import locked_version
from ptspeed.plan.config import prepare_config

ROOT = Path(__file__).resolve().parents[1]
ENVS = ROOT / "envs"
SCRIPT = ROOT / "scripts" / "lock_envs.sh"
LOCKS = sorted(ENVS.glob("*.txt"))
CU118 = "torch-2.0-cu118"
PYTORCH_CU118 = "https://download.pytorch.org/whl/cu118/"
HASH = re.compile(r"--hash=sha256:([0-9a-f]{64})\b")
# envs/README.md's table of the torch-2.0-cu118 wheels: | `file.whl` | `sha256` |
DOCUMENTED = re.compile(r"^\| `((?:torch|torchvision)-[^`]+\.whl)` \| `([0-9a-f]{64})` \|$", re.M)


def entries(lock: Path) -> dict[str, tuple[Requirement, list[str]]]:
    """Each requirement of ``lock`` by its normalised name: the requirement and its hashes.
    Fails on an option line (a lock names no index: PyPI, or each file by URL)."""
    found: dict[str, tuple[Requirement, list[str]]] = {}
    for line in lock.read_text(encoding="utf-8").replace("\\\n", " ").splitlines():
        line = line.strip()
        if not line or line.startswith("#"):
            continue
        assert not line.startswith("-"), f"{lock.name}: option line {line!r}"
        requirement = Requirement(line.split(" --", 1)[0])
        name = canonicalize_name(requirement.name)
        assert name not in found, f"{lock.name}: {name} twice"
        found[name] = (requirement, HASH.findall(line))
    return found


def script_table(name: str) -> dict[str, str]:
    """``declare -A NAME=( ["key"]=value ... )`` of scripts/lock_envs.sh."""
    block = re.search(rf"^declare -A {name}=\((.*?)^\)", SCRIPT.read_text(), re.M | re.S)
    assert block, name
    return dict(re.findall(r'\["([^"]+)"\]="?([^"\n]*)"?', block[1]))


def documented_hashes() -> dict[str, str]:
    """wheel file name -> sha256, from envs/README.md."""
    return dict(DOCUMENTED.findall((ENVS / "README.md").read_text(encoding="utf-8")))


def test_every_environment_has_its_lock_and_the_script_locks_it() -> None:
    inputs = {path.stem for path in ENVS.glob("*.in")}
    assert inputs == {path.stem for path in LOCKS}
    assert set(script_table("PYTHON_VERSION")) == inputs
    every = re.search(r"^ALL=\(([^)]*)\)", SCRIPT.read_text(), re.M)
    assert every and sorted(every[1].split()) == sorted(inputs)


@pytest.mark.parametrize("lock", LOCKS, ids=lambda path: path.stem)
def test_each_lock_was_made_by_the_script_command(lock: Path) -> None:
    """The uv command heading the lock has the script's Python, platform and snapshot date."""
    script = SCRIPT.read_text()
    python = script_table("PYTHON_VERSION")[lock.stem]
    date = re.search(r'^EXCLUDE_NEWER="([^"]+)"', script, re.M)
    platform = re.search(r'^PLATFORM="([^"]+)"', script, re.M)
    assert date and platform
    command = (
        f"#    uv pip compile --generate-hashes --python-version {python} --python-platform "
        f"{platform[1]} --exclude-newer {date[1]} envs/{lock.stem}.in -o envs/{lock.stem}.txt"
    )
    assert command in lock.read_text(encoding="utf-8").splitlines()


@pytest.mark.parametrize("lock", LOCKS, ids=lambda path: path.stem)
def test_every_requirement_is_pinned_and_hashed(lock: Path) -> None:
    found = entries(lock)
    assert {"torch", "torchvision", "transformers"} <= set(found)
    for name, (requirement, hashes) in found.items():
        assert hashes, f"{lock.name}: {name} has no hash"
        assert len(set(hashes)) == len(hashes), f"{lock.name}: {name} repeats a hash"
        assert not requirement.extras and requirement.marker is None, name
        if requirement.url:
            # One file: by https, a wheel of this very name, with exactly its hash.
            assert requirement.url.startswith("https://"), name
            assert requirement.url.endswith(".whl") and "#" not in requirement.url, name
            wheel = requirement.url.rsplit("/", 1)[1]
            assert canonicalize_name(wheel.split("-", 1)[0]) == name
            assert len(hashes) == 1, f"{lock.name}: {name} by URL needs one hash"
        else:
            [specifier] = requirement.specifier
            assert specifier.operator == "==" and "*" not in specifier.version, name


@pytest.mark.filterwarnings("ignore::DeprecationWarning")  # pip's vendored pkg_resources
@pytest.mark.parametrize("lock", LOCKS, ids=lambda path: path.stem)
def test_pip_reads_every_lock_with_a_hash_on_every_requirement(lock: Path) -> None:
    """What `pip install --require-hashes -r` parses (pip's own reader; nothing fetched)."""
    req_file = pytest.importorskip("pip._internal.req.req_file")
    session = pytest.importorskip("pip._internal.network.session")
    parsed = list(req_file.parse_requirements(str(lock), session=session.PipSession()))
    assert len(parsed) == len(entries(lock))
    for requirement in parsed:
        assert requirement.options and requirement.options.get("hashes"), requirement.requirement


def test_cu118_pins_pytorchs_wheels_by_url_with_the_documented_hashes() -> None:
    documented = documented_hashes()
    assert sorted(documented) == [
        "torch-2.0.1+cu118-cp310-cp310-linux_x86_64.whl",
        "torchvision-0.15.2+cu118-cp310-cp310-linux_x86_64.whl",
    ]
    found = entries(ENVS / f"{CU118}.txt")
    for wheel, sha256 in documented.items():
        requirement, hashes = found[wheel.split("-", 1)[0]]
        assert requirement.url == PYTORCH_CU118 + quote(wheel)  # '+' as %2B
        assert hashes == [sha256]
    # The same release as torch-2.0's, in its CUDA 11.8 build.
    plain = entries(ENVS / "torch-2.0.txt")
    assert str(plain["torch"][0].specifier) == "==2.0.1"
    assert str(plain["torchvision"][0].specifier) == "==0.15.2"


def test_cu118_brings_no_cuda_packages_and_triton_2_0_0() -> None:
    found = entries(ENVS / f"{CU118}.txt")
    assert not [name for name in found if name.startswith("nvidia-")]
    assert str(found["triton"][0]) == "triton==2.0.0"
    assert str(found["numpy"][0]).startswith("numpy==1.")


def test_cu118_is_torch_2_0_but_for_torchs_build() -> None:
    """The same pins in the .in, and every package both locks have at the same version with the
    same hashes; torch-2.0 has besides only the CUDA 11.7 packages (and wheel, theirs)."""

    def pins(name: str) -> list[str]:
        text = (ENVS / f"{name}.in").read_text(encoding="utf-8")
        lines = [line.strip() for line in text.splitlines()]
        return [line for line in lines if line and not line.startswith("#")]

    assert pins(CU118)[2:] == pins("torch-2.0")[2:]
    assert [line.split()[0] for line in pins(CU118)[:2]] == ["torch", "torchvision"]
    cu118, plain = entries(ENVS / f"{CU118}.txt"), entries(ENVS / "torch-2.0.txt")
    assert set(cu118) <= set(plain)
    only_plain = set(plain) - set(cu118)
    assert only_plain - {"wheel"} == {name for name in plain if name.endswith("-cu11")}
    for name in set(cu118) - {"torch", "torchvision"}:
        assert str(cu118[name][0]) == str(plain[name][0]), name
        assert cu118[name][1] == plain[name][1], name


def test_the_hopper_config_runs_the_cu118_lock_and_no_cuda_11_7_build() -> None:
    path = ROOT / "config" / "hopper.yaml"
    config = yaml.safe_load(path.read_text(encoding="utf-8"))
    assert prepare_config(config, lambda _device: "cuda", ROOT, (path,)).device == "cuda"
    pythons = script_table("PYTHON_VERSION")
    for env, spec in config["environments"].items():
        assert spec["requirements"] == f"envs/{env}.txt"
        assert spec["python"] == pythons[env]
    assert CU118 in config["environments"]
    assert not {"torch-1.13", "torch-2.0"} & set(config["environments"])


# --- ptspeed.envs.locks: the version a lock pins a package to ---------------------------------

CU118_TORCH_URL = f"{PYTORCH_CU118}torch-2.0.1%2Bcu118-cp310-cp310-linux_x86_64.whl"
# name -> what locked_version reads of LOCK_TEXT (None: not pinned there).
LOCK_TEXT = f"""\
# torch==0.0.0 in a comment, and torchaudio @ https://x/torchaudio-9.9.9-py3-none-any.whl
torchvision @ {PYTORCH_CU118}torchvision-0.15.2%2Bcu118-cp310-cp310-linux_x86_64.whl \\
    --hash=sha256:00
    # via -r envs/x.in
torch @ {CU118_TORCH_URL} \\
    --hash=sha256:00
Typing_Extensions==4.16.0 ; python_version >= '3.8'
numpy[extra]==1.26.4 \\
    --hash=sha256:00
triton==2.0.0+local
sympy @ https://example.org/sympy-1.13.3.tar.gz
filelock @ https://example.org/other-3.0.0-py3-none-any.whl#sha256=00
"""
LOCK_PINS = {
    "torch": "2.0.1+cu118",  # by URL, %2B decoded
    "torchvision": "0.15.2+cu118",
    "typing-extensions": "4.16.0",  # names compare normalised
    "typing_extensions": "4.16.0",
    "numpy": "1.26.4",
    "triton": "2.0.0+local",  # a local version by ==
    "sympy": None,  # by URL, but not a wheel
    "filelock": None,  # a wheel of another name
    "torchaudio": None,  # only in a comment
    "transformers": None,
}


@pytest.mark.parametrize(("package", "pinned"), LOCK_PINS.items())
def test_locked_version_reads_pins_by_version_and_by_wheel_url(
    package: str, pinned: str | None
) -> None:
    assert locked_version(LOCK_TEXT, package) == pinned


def test_locked_version_reads_a_pypi_pin_with_its_hashes() -> None:
    assert locked_version("torch==2.0.1 \\\n    --hash=sha256:00\n", "torch") == "2.0.1"
    assert locked_version(f"torch @ {CU118_TORCH_URL}#sha256=00\n", "torch") == "2.0.1+cu118"
    assert locked_version("", "torch") is None


@pytest.mark.parametrize("lock", LOCKS, ids=lambda path: path.stem)
def test_locked_version_agrees_with_packaging_on_every_lock(lock: Path) -> None:
    """Every requirement of every real lock: the version packaging reads (the specifier's, or
    that of the wheel's file name for a URL pin)."""
    text = lock.read_text(encoding="utf-8")
    for name, (requirement, _) in entries(lock).items():
        if requirement.url:
            expected = parse_wheel_filename(unquote(requirement.url.rsplit("/", 1)[1]))[1]
        else:
            [specifier] = requirement.specifier
            expected = Version(specifier.version)
        found = locked_version(text, name)
        assert found is not None and Version(found) == expected, name
    if lock.stem == CU118:
        assert locked_version(text, "torch") == "2.0.1+cu118"
        assert locked_version(text, "torchvision") == "0.15.2+cu118"


# --- scripts/lock_envs.sh ------------------------------------------------------------------


def run_script(*arguments: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        ["bash", str(SCRIPT), *arguments], capture_output=True, text=True, timeout=60
    )


def test_script_help_names_every_environment_and_the_extra_index() -> None:
    done = run_script("--help")
    assert done.returncode == 0, done.stderr
    assert "--extra-index-url URL" in done.stdout
    listed = done.stdout.splitlines()[-1]
    assert listed == f"environments: torch-1.13 torch-2.0 torch-2.14 {CU118}"


@pytest.mark.parametrize(
    ("arguments", "message"),
    [
        (("nope",), "error: unknown environment 'nope' (known: torch-1.13 torch-2.0"),
        (("--extra-index-url",), "error: --extra-index-url needs a URL"),
        (("--index", "x"), "error: unknown option --index"),
    ],
)
def test_script_refuses_bad_arguments_before_locking_anything(
    arguments: tuple[str, ...], message: str
) -> None:
    before = {path: path.read_bytes() for path in LOCKS}
    done = run_script(*arguments)
    assert done.returncode == 2
    assert done.stderr.startswith(message)
    assert "locking" not in done.stderr
    assert {path: path.read_bytes() for path in LOCKS} == before


class QuietHandler(http.server.SimpleHTTPRequestHandler):
    def log_message(self, format: str, *args: object) -> None:
        pass


@pytest.fixture
def index(tmp_path: Path) -> Iterator[str]:
    """A PEP 503 page of torch on a local HTTP server: its wheels for several Pythons and
    platforms, each link with its sha256; yields the index URL."""
    wheels = {
        "torch-2.1.2%2Bcu121-cp311-cp311-linux_x86_64.whl": "1" * 64,
        "torch-2.1.2%2Bcu121-cp310-cp310-win_amd64.whl": "2" * 64,
        "torch-2.1.2%2Bcu121-cp310-cp310-linux_x86_64.whl": "3" * 64,
        "torch-2.1.1%2Bcu121-cp310-cp310-linux_x86_64.whl": "4" * 64,
    }
    links = "".join(
        f'<a href="/whl/cu121/{name}#sha256={digest}">{name}</a><br/>\n'
        for name, digest in wheels.items()
    )
    page = tmp_path / "simple" / "torch" / "index.html"
    page.parent.mkdir(parents=True)
    page.write_text(f"<!DOCTYPE html>\n<html><body>\n{links}</body></html>\n")
    handler = functools.partial(QuietHandler, directory=str(tmp_path))
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), handler)
    thread = threading.Thread(target=server.serve_forever, args=(0.05,), daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}/simple"
    finally:
        server.shutdown()
        thread.join()
        server.server_close()


def pin_by_url(lock: Path, index: str, python: str = "3.10") -> subprocess.CompletedProcess[str]:
    """The script's pin_by_url (sourced: main does not run) on ``lock``."""
    command = f'source {SCRIPT} && pin_by_url "$1" "$2" "$3"'
    return subprocess.run(
        ["bash", "-c", command, "pin_by_url", str(lock), index, python],
        capture_output=True, text=True, timeout=60,
    )  # fmt: skip


LOCAL_LOCK = """\
# head
filelock==3.13.1 \\
    --hash=sha256:{filelock}
    # via torch
torch==2.1.2+cu121 \\
    --hash=sha256:{one} \\
    --hash=sha256:{two} \\
    --hash=sha256:{three}
    # via -r envs/mine.in
"""


def test_an_extra_indexs_local_versions_become_url_pins_of_the_pythons_wheel(
    tmp_path: Path, index: str
) -> None:
    lock = tmp_path / "mine.txt"
    digests = {"filelock": "f" * 64, "one": "1" * 64, "two": "2" * 64, "three": "3" * 64}
    lock.write_text(LOCAL_LOCK.format(**digests))
    done = pin_by_url(lock, index)
    assert done.returncode == 0, done.stderr
    wheel = "torch-2.1.2%2Bcu121-cp310-cp310-linux_x86_64.whl"
    assert lock.read_text() == (
        "# head\n"
        f"filelock==3.13.1 \\\n    --hash=sha256:{'f' * 64}\n    # via torch\n"
        f"torch @ {index.rsplit('/', 1)[0]}/whl/cu121/{wheel} \\\n"
        f"    --hash=sha256:{'3' * 64}\n"
        "    # via -r envs/mine.in\n"
    )
    assert entries(lock)["torch"][1] == ["3" * 64]


def test_an_extra_indexs_package_without_a_wheel_for_the_python_is_refused(
    tmp_path: Path, index: str
) -> None:
    lock = tmp_path / "mine.txt"
    text = LOCAL_LOCK.format(filelock="f" * 64, one="1" * 64, two="2" * 64, three="3" * 64)
    lock.write_text(text)
    done = pin_by_url(lock, index, python="3.12")
    assert done.returncode == 1
    assert "links no wheel of torch==2.1.2+cu121 for Python 3.12 on Linux x86_64" in done.stderr
    assert lock.read_text() == text
