"""GPU assignment: distinct GPUs per concurrent cell, allocations respected, no GPU needed."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest

from ptspeed.errors import ConfigError, GpuRequestError
from ptspeed.launch.gpus import (
    LOCK_DIR_VARIABLE,
    VISIBLE_DEVICES_VARIABLE,
    GpuPool,
    check_variant_gpus,
    claim_gpus,
    cpu_share,
    gpu_environment,
    lock_dir,
    node_pool,
)

SRC = Path(__file__).resolve().parents[1] / "src"

# One process of the concurrency test: claims GPUs, notes when it held which, holds a while.
# With a start file it says it is ready (OUT.ready) and claims only once the file exists, so
# that every holder claims at the same moment however slowly the processes started.
HOLDER = textwrap.dedent(
    """
    import json, sys, time
    from pathlib import Path
    from ptspeed.launch.gpus import GpuPool, claim_gpus
    count, n_gpus, locks, out, hold_s, start_file = sys.argv[1:]
    pool = GpuPool(tuple(str(i) for i in range(int(n_gpus))), "test")
    if start_file:
        Path(out + ".ready").touch()
        while not Path(start_file).exists():
            time.sleep(0.005)
    with claim_gpus(int(count), wait_s=60, pool=pool, locks=Path(locks)) as claim:
        start = time.monotonic()
        time.sleep(float(hold_s))
        end = time.monotonic()
    Path(out).write_text(json.dumps({"ids": list(claim.ids), "start": start, "end": end}))
    """
)


def start_holder(
    tmp_path: Path, name: str, count: int, n_gpus: int, hold_s: float, start_file: str = ""
) -> tuple[subprocess.Popen[bytes], Path]:
    out = tmp_path / f"{name}.json"
    arguments = (count, n_gpus, tmp_path / "locks", out, hold_s, start_file)
    process = subprocess.Popen(
        [sys.executable, "-c", HOLDER, *map(str, arguments)],
        env={**os.environ, "PYTHONPATH": str(SRC)},
    )
    return process, out


def test_pool_respects_an_existing_allocation() -> None:
    pool = node_pool({"CUDA_VISIBLE_DEVICES": "2,3", "PTSPEED_GPU_COUNT": "8"})
    assert pool.ids == ("2", "3")
    assert "CUDA_VISIBLE_DEVICES=2,3" in pool.source


def test_pool_names_slurm_as_the_allocator() -> None:
    pool = node_pool({"CUDA_VISIBLE_DEVICES": "0", "SLURM_JOB_ID": "17"})
    assert pool.ids == ("0",)
    assert pool.source.startswith("SLURM's allocation")


def test_pool_keeps_uuids_and_stops_at_an_invalid_entry() -> None:
    pool = node_pool({"CUDA_VISIBLE_DEVICES": "GPU-aa11, MIG-bb22,-1,3"})
    assert pool.ids == ("GPU-aa11", "MIG-bb22")
    assert node_pool({"CUDA_VISIBLE_DEVICES": ""}).ids == ()


def test_pool_from_an_injected_count() -> None:
    assert node_pool({"PTSPEED_GPU_COUNT": "3"}).ids == ("0", "1", "2")
    with pytest.raises(GpuRequestError, match="PTSPEED_GPU_COUNT: 'two'"):
        node_pool({"PTSPEED_GPU_COUNT": "two"})


def test_lock_dir_is_per_slurm_job(tmp_path: Path) -> None:
    base = {"PTSPEED_GPU_LOCK_DIR": str(tmp_path)}
    assert lock_dir(base) == tmp_path
    assert lock_dir({**base, "SLURM_JOB_ID": "42"}) == tmp_path / "slurm-job-42"


def test_claim_gives_distinct_gpus_and_releases_them(tmp_path: Path) -> None:
    pool = GpuPool(("0", "1", "2"), "test")
    with (
        claim_gpus(2, wait_s=0, pool=pool, locks=tmp_path) as first,
        claim_gpus(1, wait_s=0, pool=pool, locks=tmp_path) as second,
    ):
        assert len(first.ids) == 2
        assert set(first.ids).isdisjoint(second.ids)
        assert second.visible_devices == "2"
        with (
            pytest.raises(GpuRequestError, match="no 1 free GPU"),
            claim_gpus(1, wait_s=0.3, pool=pool, locks=tmp_path),
        ):
            pass
    with claim_gpus(3, wait_s=0, pool=pool, locks=tmp_path) as everything:
        assert everything.ids == ("0", "1", "2")
        assert everything.describe() == "claimed [0,1,2] of 3 GPU(s) [0,1,2] from test"


def test_asking_for_more_gpus_than_the_node_has_fails_at_once(tmp_path: Path) -> None:
    pool = GpuPool(("0", "1"), "nvidia-smi -L")
    begun = time.monotonic()
    with (
        pytest.raises(GpuRequestError, match=r"needs 4 GPU\(s\); the node has 2 GPU\(s\)"),
        claim_gpus(4, wait_s=30, pool=pool, locks=tmp_path),
    ):
        pass
    assert time.monotonic() - begun < 5


@pytest.mark.slow
def test_concurrent_cells_never_share_a_gpu(tmp_path: Path) -> None:
    """Six processes start at once on a 4-GPU node, some asking for 2: at no moment do two of
    them hold the same GPU, and the ones that had to wait got GPUs once others let go."""
    wanted = [1, 2, 1, 1, 2, 1]
    start_file = tmp_path / "start"
    holders = [
        start_holder(tmp_path, f"cell{i}", count, n_gpus=4, hold_s=0.6, start_file=str(start_file))
        for i, count in enumerate(wanted)
    ]
    deadline = time.monotonic() + 60
    while not all(Path(f"{out}.ready").exists() for _, out in holders):
        assert time.monotonic() < deadline, "the holders did not start"
        time.sleep(0.02)
    start_file.touch()  # all claim at once: 8 GPUs asked of 4
    for process, _ in holders:
        assert process.wait(timeout=60) == 0
    held = [json.loads(out.read_text()) for _, out in holders]
    assert [len(h["ids"]) for h in held] == wanted
    pairs = [(a, b) for i, a in enumerate(held) for b in held[i + 1 :]]
    overlapping = [(a, b) for a, b in pairs if a["start"] < b["end"] and b["start"] < a["end"]]
    assert overlapping, "no two holders held GPUs at once: the check below would be vacuous"
    for a, b in overlapping:
        assert set(a["ids"]).isdisjoint(b["ids"]), (a, b)
    first_end = min(h["end"] for h in held)
    assert any(h["start"] >= first_end for h in held), "none waited for a GPU to be let go"


def test_a_killed_cell_leaves_its_gpu_free(tmp_path: Path) -> None:
    process, _ = start_holder(tmp_path, "victim", 1, n_gpus=1, hold_s=60)
    pool = GpuPool(("0",), "test")
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:  # wait until the victim holds the GPU
        try:
            with claim_gpus(1, wait_s=0, pool=pool, locks=tmp_path / "locks"):
                pass
        except GpuRequestError:
            break
        time.sleep(0.1)  # outside the claim: give the holder its chance
    else:
        pytest.fail("the holder never claimed the GPU")
    process.send_signal(signal.SIGKILL)
    process.wait(timeout=10)
    with claim_gpus(1, wait_s=5, pool=pool, locks=tmp_path / "locks") as claim:
        assert claim.ids == ("0",)


def test_gpu_environment_pins_a_cuda_cell(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("CUDA_VISIBLE_DEVICES", raising=False)
    monkeypatch.delenv("SLURM_JOB_ID", raising=False)
    monkeypatch.setenv("PTSPEED_GPU_COUNT", "2")
    monkeypatch.setenv("PTSPEED_GPU_LOCK_DIR", str(tmp_path))
    with gpu_environment("cpu", 1, wait_s=0) as cpu_env:
        assert cpu_env == {}
    with gpu_environment("cuda:1", 1, wait_s=0) as pinned_by_hand:
        assert pinned_by_hand == {}
    with gpu_environment("cuda", 2, wait_s=0) as env:
        assert env["CUDA_VISIBLE_DEVICES"] == "0,1"
        assert env["CUDA_DEVICE_ORDER"] == "PCI_BUS_ID"  # the order nvidia-smi numbers them in
        assert env["PTSPEED_GPU_ASSIGNMENT"].startswith("claimed [0,1] of 2 GPU(s)")
    monkeypatch.delenv("PTSPEED_GPU_COUNT")
    monkeypatch.setenv("PATH", str(tmp_path))  # no nvidia-smi
    with gpu_environment("cuda", 1, wait_s=0) as none_listed:
        assert "CUDA_VISIBLE_DEVICES" not in none_listed
        assert none_listed["PTSPEED_GPU_ASSIGNMENT"].startswith("not assigned")


def test_variants_needing_more_gpus_than_the_run_may_use_are_refused() -> None:
    variants = {"eager": "eager", "ddp": "ddp+procs=4"}
    check_variant_gpus(variants, None)
    check_variant_gpus(variants, 4)
    with pytest.raises(ConfigError, match=r"^variants\.ddp: each cell needs 4 GPUs"):
        check_variant_gpus(variants, 2)
    with pytest.raises(ConfigError, match=r"^resources: gpu=0 runs no CUDA cell"):
        check_variant_gpus(variants, 0)


def run_cuda_cell(tmp_path: Path, name: str, knobs: str) -> dict:
    out = tmp_path / f"{name}.json"
    env = {
        **os.environ,
        "PYTHONPATH": str(SRC),
        "PTSPEED_GPU_COUNT": "2",
        "PTSPEED_GPU_LOCK_DIR": str(tmp_path / "locks"),
    }
    env.pop("CUDA_VISIBLE_DEVICES", None)
    env.pop("SLURM_JOB_ID", None)
    command = [sys.executable, "-m", "ptspeed", "cell", "--model", "mlp", "--batch-size", "4"]
    command += ["--device", "cuda", "--knobs", knobs, "--timeout-s", "120", "--out", str(out)]
    subprocess.run(command, env=env, check=True, timeout=180)
    return json.loads(out.read_text())


@pytest.mark.slow
def test_a_cell_runs_on_the_gpu_no_other_cell_holds(tmp_path: Path) -> None:
    """GPU 0 is held by another cell: this one is given GPU 1, and its record says so (torch
    sees no CUDA device on this machine, so the cell itself is unsupported)."""
    pool = GpuPool(("0", "1"), "test")
    with claim_gpus(1, wait_s=0, pool=pool, locks=tmp_path / "locks") as other:
        assert other.ids == ("0",)
        record = run_cuda_cell(tmp_path, "second", "eager")
    provenance = record["provenance"]
    assert provenance["cuda_visible_devices"] == "1"
    assert provenance["gpu_assignment"].startswith("claimed [1] of 2 GPU(s) [0,1]")
    assert record["status"] == "unsupported"


def test_a_cell_needing_more_gpus_than_the_node_has_gets_a_failed_record(tmp_path: Path) -> None:
    record = run_cuda_cell(tmp_path, "ddp4", "ddp+procs=4")
    assert record["status"] == "failed"
    assert record["reason"].startswith("GPU assignment: this cell needs 4 GPU(s); the node has 2")


def test_cells_side_by_side_get_disjoint_shares_of_the_cpus() -> None:
    pool = GpuPool(("0", "1", "2", "3"), "test")
    cpus = list(range(8))
    assert cpu_share(cpus, pool, ("0",)) == [0, 1]
    assert cpu_share(cpus, pool, ("3",)) == [6, 7]
    assert cpu_share(cpus, pool, ("2", "1")) == [2, 3, 4, 5]
    # Fewer CPUs than GPUs: no share to cut, the cell keeps them all.
    assert cpu_share([0, 1], pool, ("3",)) == [0, 1]


def test_a_claimed_gpu_pins_the_cell_to_its_share(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    cpus = sorted(os.sched_getaffinity(0))
    monkeypatch.setenv(VISIBLE_DEVICES_VARIABLE, ",".join(str(i) for i in range(len(cpus))))
    monkeypatch.setenv(LOCK_DIR_VARIABLE, str(tmp_path))
    try:
        with gpu_environment("cuda", 1, wait_s=1):
            assert len(os.sched_getaffinity(0)) == 1
    finally:
        os.sched_setaffinity(0, cpus)
