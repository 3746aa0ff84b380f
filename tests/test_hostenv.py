"""The environment a cell's worker starts with: what of the caller's environment would change
the measurement is cleared and named in the record; the driver Apptainer binds with --nv is
made linkable for Triton."""

from __future__ import annotations

import json
import shutil
import subprocess
from pathlib import Path

import pytest
from helpers import TINY_CELL, ptspeed, read_valid_record

from ptspeed.cell import hostenv

CALLER = {
    "HOME": "/home/someone",
    "PATH": "/usr/bin",
    "CXX": "/nonexistent",
    "CC": "/opt/compilers/gcc-13/bin/gcc",
    "TORCHINDUCTOR_MAX_AUTOTUNE": "1",
    "TRITON_CACHE_DIR": "/scratch/triton",
    "CUDA_LAUNCH_BLOCKING": "1",
    "NVIDIA_TF32_OVERRIDE": "0",
    "LD_PRELOAD": "/usr/lib/libtcmalloc.so",
    "NCCL_SOCKET_IFNAME": "ib0",
}
CLEARED = {"CXX", "CC", "TORCHINDUCTOR_MAX_AUTOTUNE", "TRITON_CACHE_DIR", "CUDA_LAUNCH_BLOCKING",
           "NVIDIA_TF32_OVERRIDE", "LD_PRELOAD"}  # fmt: skip


def test_the_worker_starts_without_what_changes_the_measurement(tmp_path: Path) -> None:
    worker = hostenv.worker_environment(CALLER, driver_libs=tmp_path / "absent")
    assert CLEARED.isdisjoint(worker)
    assert worker["HOME"] == "/home/someone" and worker["NCCL_SOCKET_IFNAME"] == "ib0"
    named = json.loads(worker[hostenv.CLEARED_VARIABLE])
    assert named == {name: CALLER[name] for name in CLEARED}
    assert hostenv.kept(CALLER) == {"NCCL_SOCKET_IFNAME": "ib0"}
    assert "LIBRARY_PATH" not in worker  # no driver bound here


@pytest.mark.slow
def test_a_cell_records_what_its_worker_started_without(tmp_path: Path) -> None:
    out = tmp_path / "cell.json"
    variables = {name: CALLER[name] for name in ("CXX", "TORCHINDUCTOR_MAX_AUTOTUNE")}
    done = ptspeed("cell", *TINY_CELL, "--out", str(out), env=variables | {"NCCL_DEBUG": "WARN"})
    assert done.returncode == 0, done.stderr[-3000:]
    record = read_valid_record(out)
    assert record.status == "ok", record.reason
    assert record.provenance.cleared_host_variables == variables
    assert record.provenance.kept_host_variables == {"NCCL_DEBUG": "WARN"}


def fake_driver(directory: Path) -> Path:
    """A libcuda.so.1 (with its soname) alone, as `apptainer exec --nv` may bind it."""
    directory.mkdir()
    source = directory.parent / "cuda.c"
    source.write_text("int cuInit(unsigned int flags) { return (int)flags; }\n")
    subprocess.run(
        ["cc", "-shared", "-fPIC", "-Wl,-soname,libcuda.so.1", str(source), "-o",
         str(directory / "libcuda.so.1")],
        check=True,
    )  # fmt: skip
    return directory


def link_like_triton_2_0(directory: Path, environ: dict[str, str]) -> subprocess.CompletedProcess:
    """What Triton 2.0 runs to build its launcher: `cc ... -lcuda` (plus -L of what `whereis
    libcuda.so` finds: nothing in an Apptainer container)."""
    source = directory / "launcher.c"
    source.write_text("int cuInit(unsigned int); int launch(void) { return cuInit(0); }\n")
    command = ["cc", str(source), "-shared", "-fPIC", "-lcuda", "-o", str(directory / "l.so")]
    return subprocess.run(command, env=environ, capture_output=True, text=True, check=False)


@pytest.mark.skipif(shutil.which("cc") is None, reason="needs a C compiler")
def test_tritons_libcuda_link_finds_the_driver_apptainer_bound(tmp_path: Path) -> None:
    driver = fake_driver(tmp_path / "singularity-libs")
    plain = {"PATH": "/usr/bin:/bin"}
    failed = link_like_triton_2_0(tmp_path, plain)
    assert failed.returncode != 0 and "cannot find -lcuda" in failed.stderr
    variables = hostenv.triton_libcuda(driver, link_dir=tmp_path / "links")
    assert variables["TRITON_LIBCUDA_PATH"] == variables["LIBRARY_PATH"]
    linked = link_like_triton_2_0(tmp_path, plain | variables)
    assert linked.returncode == 0, linked.stderr
    # A second cell on the node (or another driver's path) replaces the link atomically.
    assert hostenv.triton_libcuda(driver, link_dir=tmp_path / "links") == variables
    assert hostenv.triton_libcuda(tmp_path / "absent") == {}
