"""The environment a cell's worker starts with: what of the caller's environment would change
the measurement is cleared and named in the record; the driver Apptainer binds with --nv is
made linkable for Triton."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from helpers import TINY_CELL, fake_libcuda, ptspeed, read_valid_record

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
    # Other variables of this process may be cleared too (an in-process cell of an earlier
    # test sets TORCHINDUCTOR_CACHE_DIR): these are among them.
    assert variables.items() <= record.provenance.cleared_host_variables.items()
    assert record.provenance.kept_host_variables == {"NCCL_DEBUG": "WARN"}


def test_tritons_libcuda_link_finds_the_driver_apptainer_bound(tmp_path: Path) -> None:
    driver = fake_libcuda(tmp_path / "singularity-libs")
    plain = {"PATH": "/usr/bin:/bin"}
    assert "cannot find -lcuda" in hostenv.link_against_libcuda(tmp_path, plain)
    variables = hostenv.triton_libcuda(driver, link_dir=tmp_path / "links")
    assert variables["TRITON_LIBCUDA_PATH"] == variables["LIBRARY_PATH"]
    assert hostenv.link_against_libcuda(tmp_path, plain | variables) == ""
    # A second cell on the node (or another driver's path) replaces the link atomically.
    assert hostenv.triton_libcuda(driver, link_dir=tmp_path / "links") == variables
    assert hostenv.triton_libcuda(tmp_path / "absent") == {}


def test_inside_an_image_the_variables_its_own_environment_sets_are_kept(tmp_path: Path) -> None:
    """An image that finds its tools through the environment it was built with (Docker ENV
    converted by Apptainer, a definition file's %environment) keeps them; what the caller
    brings from a login node is still cleared."""
    scripts = tmp_path / "env"
    scripts.mkdir()
    (scripts / "10-docker2singularity.sh").write_text(
        '#!/bin/sh\nexport PATH="${PATH:-/usr/local/bin}"\n'
        'export TRITON_PTXAS_PATH="${TRITON_PTXAS_PATH:-/usr/local/cuda/bin/ptxas}"\n'
    )
    (scripts / "90-environment.sh").write_text("#!/bin/sh\nCC=/opt/gcc/bin/gcc\nexport CC\n")
    environ = {
        "TRITON_PTXAS_PATH": "/usr/local/cuda/bin/ptxas",
        "CC": "/opt/gcc/bin/gcc",
        "TORCHINDUCTOR_MAX_AUTOTUNE": "1",  # the caller's, from a login node
        "PATH": "/usr/bin",
    }
    worker = hostenv.worker_environment(environ, tmp_path / "no-driver", scripts)
    assert worker["TRITON_PTXAS_PATH"] == "/usr/local/cuda/bin/ptxas"
    assert worker["CC"] == "/opt/gcc/bin/gcc"
    assert "TORCHINDUCTOR_MAX_AUTOTUNE" not in worker
    assert json.loads(worker[hostenv.CLEARED_VARIABLE]) == {"TORCHINDUCTOR_MAX_AUTOTUNE": "1"}
    outside = hostenv.worker_environment(environ, tmp_path / "no-driver", tmp_path / "none")
    assert "TRITON_PTXAS_PATH" not in outside and "CC" not in outside
