"""How short a window the GPU's own meters can measure, on the GPU at hand (developer tool).

    PYTHONPATH=src python3 scripts/gpu_window_study.py [--out study.json]

1. NVML's total-energy counter: how often it changes under a steady GEMM load (its update
   period bounds the shortest window whose energy means something), against the power reading
   (an average over about a second on GPUs since Ampere).
2. The machine-speed probe's GEMM (fp16, the probe's size) from an idle GPU and warm: its time
   per repeat for the first products (the clock ramp) and the spread of repeated probes, so that
   the probe's length and threshold rest on figures of this GPU.

Prints a summary and writes it as JSON; needs torch with CUDA and the NVIDIA driver.
"""

from __future__ import annotations

import argparse
import itertools
import json
import statistics
import sys
import time
from pathlib import Path

import _checkout  # noqa: F401  (the checkout's src/ on the import path)
import torch

from ptspeed.cell.measurement import probe, telemetry
from ptspeed.cell.provenance import smi_id


def counter_updates(nvml: telemetry.Nvml, load_s: float) -> dict[str, float]:
    """Poll the energy counter and the power reading as fast as possible under a GEMM load."""
    a = torch.randn(8192, 8192, device="cuda", dtype=torch.bfloat16)
    changes, powers, last = [], [], nvml.energy_j()
    begun = time.perf_counter()
    while time.perf_counter() - begun < load_s:
        for _ in range(4):
            torch.mm(a, a)
        now, energy = time.perf_counter(), nvml.energy_j()
        if energy != last:
            changes.append((now, energy))
            last = energy
        powers.append(nvml.power_w())
    torch.cuda.synchronize()
    gaps = [b[0] - a[0] for a, b in itertools.pairwise(changes)]
    steps = [b[1] - a[1] for a, b in itertools.pairwise(changes)]
    return {
        "load_s": load_s,
        "counter_changes": len(changes),
        "update_period_median_ms": statistics.median(gaps) * 1e3 if gaps else float("nan"),
        "update_period_max_ms": max(gaps) * 1e3 if gaps else float("nan"),
        "energy_step_median_j": statistics.median(steps) if steps else float("nan"),
        "power_from_counter_w": (changes[-1][1] - changes[0][1]) / (changes[-1][0] - changes[0][0])
        if len(changes) > 1 else float("nan"),
        "power_reading_median_w": statistics.median(powers),
    }  # fmt: skip


def probe_ramp(repeats: int) -> list[float]:
    """Milliseconds of each of the probe's GEMMs, one by one, from the GPU as it is now."""
    size = probe.GPU_GEMM_SIZE
    a = torch.randn(size, size, device="cuda", dtype=torch.float16)
    b = torch.randn(size, size, device="cuda", dtype=torch.float16)
    times = []
    for _ in range(repeats):
        start, stop = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        torch.mm(a, b)
        stop.record()
        stop.synchronize()
        times.append(start.elapsed_time(stop))
    return times


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, default=Path("gpu-window-study.json"))
    args = parser.parse_args()
    nvml = telemetry.Nvml.open(smi_id(0))
    time.sleep(3.0)  # idle, so that the ramp below starts from an idle GPU's clocks
    ramp = probe_ramp(60)
    probes = [probe.measure(torch.device("cuda", 0)) for _ in range(30)]
    gemm_ms = [p.gpu_gemm_s * 1e3 for p in probes if p.gpu_gemm_s is not None]
    study = {
        "gpu": torch.cuda.get_device_name(0),
        "torch": torch.__version__,
        "probe_work": probe.WORK,
        "ramp_ms_per_gemm_first_10": [round(t, 3) for t in ramp[:10]],
        "ramp_ms_per_gemm_last_10": [round(t, 3) for t in ramp[-10:]],
        "probe_ms": [round(t, 3) for t in gemm_ms],
        "probe_ms_median": statistics.median(gemm_ms),
        "probe_spread": (max(gemm_ms) - min(gemm_ms)) / statistics.median(gemm_ms),
        "energy_counter": counter_updates(nvml, 3.0),
    }
    args.out.write_text(json.dumps(study, indent=2) + "\n")
    print(json.dumps(study, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
