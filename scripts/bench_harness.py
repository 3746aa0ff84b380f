"""Benchmark of the harness itself: does measuring through ptspeed cost throughput?

For each model, alternates (in time) a ptspeed cell and a bare hand-written training loop of
the same model, batch, optimizer and step counts, each in a fresh process; reports the ratio
of median throughputs (goal >= 0.98) and the coefficient of variation of ptspeed's trials
(goal <= 3 %). Usage:

    .venv/bin/python scripts/bench_harness.py --trials 5

The bare loop (``--bare``) imports nothing from ptspeed.
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from _checkout import ROOT

# Measured windows of a few seconds each: shorter ones are dominated by this machine's noise.
CASES = {
    "mlp": {"batch_size": 100, "image_size": 224, "steps": 300},
    "resnet50": {"batch_size": 8, "image_size": 64, "steps": 30},
}


def bare_loop(model_name: str, batch_size: int, image_size: int, warmup: int, steps: int) -> float:
    import torch
    import torchvision
    from torch.nn import functional

    torch.manual_seed(0)
    generator = torch.Generator().manual_seed(0)
    if model_name == "mlp":
        model = torch.nn.Sequential(
            torch.nn.Linear(1000, 1000), torch.nn.ReLU(), torch.nn.Linear(1000, 10)
        )
        inputs = torch.randn(batch_size, 1000, generator=generator)
        targets = torch.randint(0, 10, (batch_size,), generator=generator)
    else:
        model = torchvision.models.resnet50(weights=None)
        inputs = torch.randn(batch_size, 3, image_size, image_size, generator=generator)
        targets = torch.randint(0, 1000, (batch_size,), generator=generator)
    model.train()
    optimizer = torch.optim.SGD(model.parameters(), lr=1e-3, momentum=0.9)

    def step() -> None:
        optimizer.zero_grad(set_to_none=True)
        functional.cross_entropy(model(inputs), targets).backward()
        optimizer.step()

    for _ in range(warmup):
        step()
    started = time.perf_counter()
    for _ in range(steps):
        step()
    return batch_size * steps / (time.perf_counter() - started)


def run_bare(model: str, case: dict[str, int], warmup: int, steps: int) -> float:
    command = [
        sys.executable,
        __file__,
        "--bare",
        model,
        "--warmup",
        str(warmup),
        "--steps",
        str(steps),
    ]
    done = subprocess.run(command, capture_output=True, text=True, check=True)
    return float(done.stdout.strip().splitlines()[-1])


def suite_arguments(
    model: str, case: dict[str, int], warmup: int, steps: int, profile_steps: int = 0
) -> list[str]:
    # Imported here, not at the top: the bare loop's process imports nothing from ptspeed.
    from ptspeed.cell.arguments import to_arguments
    from ptspeed.cell.record import CellSpec

    spec = CellSpec(
        model=model,
        variant="eager",
        knobs="eager",
        mode="train",
        batch_size=case["batch_size"],
        image_size=case["image_size"],
        warmup_steps=warmup,
        measured_steps=steps,
        profile_steps=profile_steps,
    )
    return to_arguments(spec)


def run_suite(
    model: str, case: dict[str, int], warmup: int, steps: int, out: Path, profile_steps: int = 0
) -> float:
    arguments = suite_arguments(model, case, warmup, steps, profile_steps)
    command = [sys.executable, "-m", "ptspeed", "cell", *arguments, "--out", str(out)]
    env = {"PYTHONPATH": str(ROOT / "src")}
    subprocess.run(command, check=True, capture_output=True, env={**_environ(), **env})
    record = json.loads(out.read_text())
    if record["status"] != "ok":
        raise SystemExit(
            f"error: ptspeed cell {model} ended {record['status']}: {record['reason']}"
        )
    return record["metrics"]["throughput_samples_per_s"]


def _interval(bare: list[float], suite: list[float]) -> str:
    """suite / bare as the tables compare two cells (ptspeed.analysis.ranks.speedup): the
    Hodges-Lehmann ratio with its exact interval, so that a 2 % cost shows above the noise."""
    from ptspeed.analysis.ranks import speedup

    ratio = speedup(bare, suite, 0.95)
    return (
        f"{ratio.estimate:.3f} [{ratio.low:.3f}-{ratio.high:.3f}, {ratio.achieved_confidence:.0%}]"
    )


def _environ() -> dict[str, str]:
    import os

    return dict(os.environ)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--trials", type=int, default=5)
    parser.add_argument("--warmup", type=int, default=3)
    parser.add_argument("--steps", type=int, help="measured steps (default: per model)")
    parser.add_argument(
        "--profile",
        type=int,
        default=0,
        metavar="STEPS",
        help="also run each suite trial with STEPS profiled steps after its window (as the "
        "workflow's first trials do) and compare: the measured throughput must not change",
    )
    parser.add_argument("--bare", metavar="MODEL", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.bare:
        case = CASES[args.bare]
        print(bare_loop(args.bare, case["batch_size"], case["image_size"], args.warmup, args.steps))
        return 0
    with tempfile.TemporaryDirectory() as scratch:
        for model, case in CASES.items():
            suite, bare, profiled = [], [], []
            steps = args.steps or case["steps"]
            for trial in range(args.trials):
                out = Path(scratch) / f"{model}-{trial}.json"
                suite.append(run_suite(model, case, args.warmup, steps, out))
                bare.append(run_bare(model, case, args.warmup, steps))
                if args.profile:
                    out = Path(scratch) / f"{model}-{trial}-profiled.json"
                    profiled.append(run_suite(model, case, args.warmup, steps, out, args.profile))
            ratio = statistics.median(suite) / statistics.median(bare)
            cv = statistics.stdev(suite) / statistics.mean(suite)
            paired = _interval(bare, suite)
            print(
                f"{model} {case}: suite median {statistics.median(suite):.1f} samples/s, "
                f"bare median {statistics.median(bare):.1f}, ratio {ratio:.3f} (goal >= 0.98), "
                f"Hodges-Lehmann {paired} , suite cv {cv:.1%} (goal <= 3%), bare cv "
                f"{statistics.stdev(bare) / statistics.mean(bare):.1%}"
            )
            print("  suite:", " ".join(f"{v:.1f}" for v in suite))
            print("  bare: ", " ".join(f"{v:.1f}" for v in bare))
            if profiled:
                print(
                    f"  profiled ({args.profile} steps after the window) / unprofiled suite: "
                    f"Hodges-Lehmann {_interval(suite, profiled)} (goal: 1 within the interval)"
                )
                print("  profiled:", " ".join(f"{v:.1f}" for v in profiled))
    return 0


if __name__ == "__main__":
    sys.exit(main())
