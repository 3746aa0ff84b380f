"""In-window telemetry: the GPU sampled through NVML during the window, energy from NVML's
counter or RAPL, and what cannot be read named. NVML is a stand-in shared library with the
driver's signatures (tests/fixtures/fake-nvml/nvml.c), loaded the way the driver's is."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from helpers import ROOT, with_sources

from ptspeed.cell.measurement import telemetry

FAKE_NVML = ROOT / "tests/fixtures/fake-nvml/nvml.c"
WINDOW = """
import dataclasses, json, time, torch
from ptspeed.cell.measurement import conditions
window = conditions.begin(torch.device(DEVICE))
window.opened()
time.sleep(SECONDS)
window.closed()
print(json.dumps(dataclasses.asdict(window.end())))
"""


@pytest.fixture(scope="module")
def fake_driver(tmp_path_factory: pytest.TempPathFactory) -> Path:
    compiler = shutil.which("cc")
    if compiler is None:
        pytest.skip("needs a C compiler")
    directory = tmp_path_factory.mktemp("driver")
    library = directory / telemetry.NVML_LIBRARY
    subprocess.run([compiler, "-shared", "-fPIC", "-o", str(library), str(FAKE_NVML)], check=True)
    return directory


def window_conditions(device: str, seconds: float = 1.2, **variables: str) -> dict:
    """A window's Conditions, measured in a process of its own (the dynamic loader reads
    LD_LIBRARY_PATH when a process starts)."""
    code = WINDOW.replace("DEVICE", repr(device)).replace("SECONDS", repr(seconds))
    environment = {**with_sources(), **variables}
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                          env=environment, timeout=120, check=False)  # fmt: skip
    assert done.returncode == 0, done.stderr[-3000:]
    return json.loads(done.stdout)


def test_the_gpu_is_sampled_through_the_window(fake_driver: Path) -> None:
    measured = window_conditions("cuda:0", LD_LIBRARY_PATH=str(fake_driver))
    assert measured["gpu_source"] == "nvml"
    assert measured["gpu_samples"] >= 12  # every 50 ms over 1.2 s, and at both ends
    assert (measured["gpu_sm_mhz_min"], measured["gpu_sm_mhz_max"]) == (1410.0, 1980.0)
    assert measured["gpu_sm_mhz_median"] in (1410.0, 1695.0, 1980.0)
    assert measured["gpu_sm_mhz_limit"] == 1980.0
    assert measured["gpu_throttle_reasons"] == "sw_power_cap"  # seen in some samples only
    # Mean power is the window's energy over its length.
    assert measured["gpu_power_w_mean"] == pytest.approx(350.0, rel=0.01)
    assert measured["gpu_power_w_max"] == 350.0 and measured["gpu_temperature_c_max"] == 61.0
    assert measured["gpu_other_processes"] == 1  # pid 4242; the cell's own is not counted
    assert measured["energy_source"] == "nvml"
    assert measured["energy_j"] == pytest.approx(350 * measured["window_s"], rel=0.1, abs=1)
    assert 0 <= measured["sampler_cpu_s"] < 0.1
    assert "GPU" not in measured["not_readable"], measured["not_readable"]


def test_a_window_shorter_than_nvml_s_meters_reports_no_energy_or_power(
    fake_driver: Path,
) -> None:
    """NVML's energy counter moves every ~0.1 s and its power reading averages over ~1 s: a
    0.3 s window's energy and power are not measured, saying why; its clocks are."""
    measured = window_conditions("cuda:0", seconds=0.3, LD_LIBRARY_PATH=str(fake_driver))
    assert measured["energy_j"] is None and measured["energy_source"] == ""
    assert measured["energy_not_measured"].startswith("a 0.3")
    assert (
        "shorter than 1 s: NVML's energy counter moves in steps"
        in (measured["energy_not_measured"])
    )
    assert measured["gpu_power_w_mean"] is None and measured["gpu_power_w_max"] is None
    assert "GPU power (a 0.3" in measured["not_readable"]
    assert measured["gpu_samples"] >= 2 and measured["gpu_sm_mhz_median"] is not None


def test_a_gpu_without_an_energy_counter_says_so(fake_driver: Path) -> None:
    measured = window_conditions(
        "cuda:0", LD_LIBRARY_PATH=str(fake_driver), FAKE_NVML_NO_ENERGY="1"
    )
    assert measured["energy_j"] is None and measured["energy_source"] == ""
    why = "nvmlDeviceGetTotalEnergyConsumption: NVML error 3"
    assert measured["energy_not_measured"] == why
    assert f"GPU energy ({why})" in measured["not_readable"]
    assert measured["gpu_samples"] >= 6  # the rest is sampled


def test_without_nvml_or_nvidia_smi_a_cuda_window_says_what_it_lacks(tmp_path: Path) -> None:
    measured = window_conditions("cuda:0", PATH=str(tmp_path), LD_LIBRARY_PATH=str(tmp_path))
    assert measured["gpu_source"] == "" and measured["gpu_samples"] == 0
    assert f"NVML ({telemetry.NVML_LIBRARY}: " in measured["not_readable"]
    assert "GPU state (no NVML, no nvidia-smi)" in measured["not_readable"]
    assert measured["energy_not_measured"]


def test_a_cpu_window_says_why_its_energy_is_not_measured() -> None:
    measured = window_conditions("cpu")
    if os.access("/sys/class/powercap/intel-rapl:0/energy_uj", os.R_OK):
        assert measured["energy_source"] == "rapl" and measured["energy_j"] >= 0
    else:
        assert measured["energy_j"] is None
        assert (
            "RAPL" in measured["energy_not_measured"]
            or "energy_uj" in (measured["energy_not_measured"])
        )


def rapl_zone(root: Path, name: str, energy_uj: int, wraps_at: int) -> None:
    zone = root / name
    zone.mkdir(parents=True, exist_ok=True)
    (zone / "energy_uj").write_text(f"{energy_uj}\n")
    (zone / "max_energy_range_uj").write_text(f"{wraps_at}\n")


def test_rapl_sums_the_packages_across_a_counter_wrap(tmp_path: Path) -> None:
    rapl_zone(tmp_path, "intel-rapl:0", 1_000_000, 10_000_000)
    rapl_zone(tmp_path, "intel-rapl:1", 9_500_000, 10_000_000)
    rapl_zone(tmp_path, "intel-rapl:0:0", 5, 10)  # a sub-zone (cores): inside package 0
    before = telemetry.read_rapl(tmp_path)
    rapl_zone(tmp_path, "intel-rapl:0", 3_000_000, 10_000_000)
    rapl_zone(tmp_path, "intel-rapl:1", 500_000, 10_000_000)  # wrapped
    assert telemetry.read_rapl(tmp_path).joules_since(before) == pytest.approx(2.0 + 1.0)
    missing = telemetry.read_rapl(tmp_path / "absent")
    assert missing.why_not.startswith("no RAPL zones in ")
    assert missing.joules_since(before) is None


class StandInNvml:
    """NVML's readings as a test sets them: the energy counter (mJ) and the power (W)."""

    def __init__(self) -> None:
        self.energy_mj = 1_000_000.0
        self.power = 100.0

    def energy_j(self) -> float:
        return self.energy_mj / 1000.0

    def power_w(self) -> float:
        return self.power

    def sm_clock_mhz(self) -> float:
        return 1980.0

    max_sm_clock_mhz = sm_clock_mhz

    def temperature_c(self) -> float:
        return 50.0

    def power_limit_w(self) -> float:
        return 700.0

    def throttle_reasons(self) -> list[str]:
        return []

    def process_ids(self) -> list[int]:
        return []


class StepClock:
    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


@pytest.mark.parametrize("window_s", [0.02, 1.0, 3.0])
def test_energy_and_power_are_those_of_the_window_alone(window_s: float) -> None:
    """The counter jumps before the window opens and after it closes (the warm-up, the probe,
    the sampler's start and stop): neither jump reaches the window's energy, and power sampled
    outside the window never reaches its power."""
    nvml, clock = StandInNvml(), StepClock()
    sampler = telemetry.GpuSampler(nvml, interval_s=3600.0, clock=clock)  # type: ignore[arg-type]
    sampler.start()
    nvml.energy_mj += 5_000_000  # before the window
    nvml.power = 690.0
    sampler._sample()  # a background sample before the window: not the window's
    nvml.power = 400.0
    sampler.opened()
    clock.now += window_s
    nvml.energy_mj += 400_000 * window_s  # 400 W through the window
    sampler.closed()
    nvml.energy_mj += 7_000_000  # after it
    nvml.power = 690.0
    sampler._sample()  # after it: not the window's
    measured = sampler.stop()
    assert measured.window_s == pytest.approx(window_s)
    assert measured.samples == 2 and measured.power_w == [400.0, 400.0]
    if window_s < telemetry.NVML_ENERGY_MIN_WINDOW_S:
        assert measured.energy_j is None and measured.mean_power_w() is None
        assert measured.max_power_w() is None
        return
    assert measured.energy_j == pytest.approx(400.0 * window_s)
    assert measured.mean_power_w() == pytest.approx(400.0)
    assert measured.max_power_w() == 400.0
