"""Test setup: ``src/`` importable without installing the package, one Hypothesis profile, and
the guard of the fast tier.

``make test-fast`` sets ``PTSPEED_TEST_TIER=fast`` and deselects the markers that the
Makefile's ``FAST_TESTS`` names (slow, workflow, venv, network, …). The guard makes that
promise checkable: in the fast tier a test that starts Snakemake, builds a virtualenv,
installs packages or opens a connection beyond this machine fails at once, naming the marker
it lacks, instead of quietly making the loop slow.
"""

from __future__ import annotations

import ipaddress
import os
import shutil
import socket
import subprocess
import sys
import tempfile
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck, settings

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "src"))

from helpers import CROSS_VERSION_VARIABLE, TIER_VARIABLE, fast_tier

# Hypothesis' 200 ms deadline fails healthy tests on a loaded 2-core machine; examples are
# bounded by the per-test timeout instead, and derandomised so that a failure repeats.
settings.register_profile(
    "ptspeed",
    deadline=None,
    derandomize=True,
    suppress_health_check=[HealthCheck.too_slow],
)
settings.load_profile(os.environ.get("HYPOTHESIS_PROFILE", "ptspeed"))


def pytest_configure(config: pytest.Config) -> None:
    # Matplotlib caches its font list in the home directory, shared by every matplotlib of a
    # version; one written by another install or cut short leaves fonts out, and each lookup
    # then warns on stderr, where the tests read a command's one-line error. A session's own.
    os.environ["MPLCONFIGDIR"] = tempfile.mkdtemp(prefix="ptspeed-matplotlib-")
    workers = os.environ.get("PYTEST_XDIST_WORKER_COUNT")
    if workers:  # pytest-xdist: torch in this worker takes its share of the CPUs, not all of them
        import torch

        torch.set_num_threads(max(1, len(os.sched_getaffinity(0)) // int(workers)))


def pytest_unconfigure(config: pytest.Config) -> None:
    shutil.rmtree(os.environ.pop("MPLCONFIGDIR", ""), ignore_errors=True)


# make test hands whole files to its pytest-xdist workers in collection order: first the
# Apptainer run (image builds and conversions: mostly disk and network waits, which the other
# workers' CPU-bound files overlap), then the files that download wheels, those with slow tests,
# the podman build (after the Apptainer run's builds, not beside them), and the quick ones last
# to fill the end of the run. A file's place: that of the first group any of its tests is in.
FILE_PLACES = (
    ({"apptainer"}, 0),
    ({"container"}, 3),
    ({"crossversion", "venv", "network"}, 1),
    ({"slow", "workflow"}, 2),
)
QUICK_FILES_PLACE = 4


def _file_place(markers: set[str]) -> int:
    return next((place for names, place in FILE_PLACES if markers & names), QUICK_FILES_PLACE)


# The crossversion tests build (the first time) or reuse the torch 1.13 and 2.0 venvs: minutes
# and gigabytes, so they run where asked for (CI asks).
OLDER_ENVIRONMENTS_SKIP = pytest.mark.skip(
    reason=f"set {CROSS_VERSION_VARIABLE}=1 to build/use the torch 1.13 and 2.0 venvs"
)


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    markers: dict[Path, set[str]] = {}
    older_environments = os.environ.get(CROSS_VERSION_VARIABLE) == "1"
    for item in items:
        markers.setdefault(item.path, set()).update(m.name for m in item.iter_markers())
        if item.get_closest_marker("crossversion") and not older_environments:
            item.add_marker(OLDER_ENVIRONMENTS_SKIP)
    items.sort(key=lambda item: _file_place(markers[item.path]))  # stable: a file keeps its order


# Installing packages or making a venv: pip's and uv's subcommands that do it.
_INSTALLERS = {"pip", "uv"}
_INSTALLING = {"install", "sync", "download", "venv"}
_BROWSERS = {"chromium", "chromium-browser", "google-chrome", "chrome"}


def marker_needed(argv: Sequence[Any]) -> str:
    """The marker a command calls for ('' for none): Snakemake, a browser, a venv, a package
    install."""
    words = [os.fspath(w) if isinstance(w, os.PathLike) else str(w) for w in argv]
    if not words:
        return ""
    if Path(words[0]).name == "snakemake":
        return "workflow"
    if Path(words[0]).name in _BROWSERS:
        return "browser"
    if "-m" in words[:-1]:  # python -m MODULE ...
        words = words[words.index("-m") + 1 :]
        if words[0] == "snakemake":
            return "workflow"
        if words[0] == "venv":
            return "venv"
    installer = Path(words[0]).name in _INSTALLERS
    return "venv" if installer and _INSTALLING & set(words[1:3]) else ""


def _is_local(address: Any) -> bool:
    if not isinstance(address, tuple):
        return True  # a Unix socket
    host = str(address[0])
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


@pytest.fixture(autouse=True)
def _fast_tier_guard(monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    if not fast_tier():
        yield
        return
    real_init = subprocess.Popen.__init__
    real_connect = socket.socket.connect

    def guarded_init(self: subprocess.Popen, args: Any, *rest: Any, **kwargs: Any) -> None:
        argv = [args] if isinstance(args, (str, bytes, os.PathLike)) else list(args)
        marker = marker_needed(argv)
        if marker:
            pytest.fail(f"{TIER_VARIABLE}=fast: {argv[:4]} needs @pytest.mark.{marker}")
        real_init(self, args, *rest, **kwargs)

    def guarded_connect(self: socket.socket, address: Any) -> None:
        if not _is_local(address):
            needs = "needs @pytest.mark.network"
            pytest.fail(f"{TIER_VARIABLE}=fast: a connection to {address} {needs}")
        real_connect(self, address)

    monkeypatch.setattr(subprocess.Popen, "__init__", guarded_init)
    monkeypatch.setattr(socket.socket, "connect", guarded_connect)
    yield


@pytest.fixture(autouse=True)
def _torch_threads_restored() -> Iterator[None]:
    """A cell run in this process sets torch's thread count for the whole process: what a test
    computes must not depend on which test ran before it (a ResNet-50 step's fp32 error
    changes with the thread count)."""
    torch = sys.modules.get("torch")
    threads = torch.get_num_threads() if torch is not None else None
    yield
    torch = sys.modules.get("torch")
    if torch is not None and threads is not None:
        torch.set_num_threads(threads)


@pytest.fixture
def single_rank_group(monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    """torchrun's environment for one rank (ddp/fsdp/stages in this process), on a free local
    port; the process group, if one was made, is ended after."""
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    for name, value in {"RANK": "0", "LOCAL_RANK": "0", "WORLD_SIZE": "1"}.items():
        monkeypatch.setenv(name, value)
    monkeypatch.setenv("MASTER_ADDR", "127.0.0.1")
    monkeypatch.setenv("MASTER_PORT", str(port))
    yield
    import torch.distributed

    if torch.distributed.is_initialized():
        torch.distributed.destroy_process_group()
