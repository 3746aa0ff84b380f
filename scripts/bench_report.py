"""Benchmark aggregation plus report on synthetic records (goal: 10,000 records in <= 15 s).

    python scripts/bench_report.py [--records 10000] [--keep DIR] [--check]

Writes realistic synthetic cell records (as the workflow lays them out: several environments,
models, variants, modes, sizes and trials; unsupported compile cells on torch 1.13, a few
failed, oom, timeout and numerics-mismatch cells, some corrupt and some missing record files)
into a temporary directory, then times each stage of what ``workflow/scripts/aggregate.py`` and
``workflow/scripts/render_report.py`` do (imports included) and prints the stages and the total.
``--check`` exits 1 when the total misses the goal.
"""

from __future__ import annotations

import argparse
import itertools
import json
import random
import sys
import tempfile
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import _checkout  # noqa: F401  (the checkout's src/ on the import path)

from ptspeed.plan.layout import DEFAULT_SIZES, Cell, size_label

GOAL_S = 15.0
ENVS = ["torch-1.13", "torch-2.0", "torch-2.1", "torch-2.4", "torch-2.14"]
VARIANTS = {
    "eager": "eager",
    "compile": "compile",
    "amp": "amp=bf16",
    "compile-amp": "compile+amp=bf16",
    "channels-last": "channels_last",
}
MODELS = {  # name: (an image model?, eager fp32 training samples/s at batch 8)
    "resnet50": (True, 120.0),
    "resnet18": (True, 400.0),
    "vit-b16": (True, 60.0),
    "mobilenet-v3": (True, 900.0),
    "efficientnet-b0": (True, 500.0),
    "bert-base": (False, 85.0),
    "gpt2": (False, 35.0),
    "distilbert": (False, 170.0),
    "t5-small": (False, 140.0),
    "mlp": (False, 20000.0),
}
MODES = {"train": 1.0, "infer": 3.0}
BATCHES = [8, 32]
VARIANT_GAIN = dict(zip(VARIANTS, (1.0, 1.35, 1.25, 1.6, 1.05), strict=True))
ENV_GAIN = dict(zip(ENVS, (1.0, 1.05, 1.08, 1.12, 1.15), strict=True))
FAULTS = [
    ("failed", "RuntimeError: CUDA error: an illegal memory access"),
    ("oom", "CUDA out of memory"),
    ("timeout", "cell exceeded 1800 s"),
    ("numerics_mismatch", "loss differs from eager fp64 by 0.31"),
]
CORRUPT_EVERY = 2000
MISSING_EVERY = 2500


def config() -> dict[str, Any]:
    newer = ENVS[1:]
    comparisons: dict[str, Any] = {
        "upgrade-and-compile": {
            "title": "1.13 eager → 2.0 compile (the seed table)",
            "baseline": {"env": "torch-1.13", "variant": "eager"},
            "candidate": {"env": "torch-2.0", "variant": "compile"},
            "claim": "pytorch-2.0-upgrade",
        }
    }
    for env in newer:
        comparisons[f"upgrade-{env}"] = {
            "baseline": {"env": "torch-1.13", "variant": "eager"},
            "candidate": {"env": env, "variant": "eager"},
        }
        comparisons[f"compile-{env}"] = {
            "baseline": {"env": env, "variant": "eager"},
            "candidate": {"env": env, "variant": "compile-amp"},
        }
    sizes = {"cuda": {"batch_size": 32}, "cpu": {"batch_size": 32}}
    return {
        "device": "cuda",
        "trials": 10,
        "steps": {"warmup": 3, "measured": 10, "numerics": 2},
        "timeout_s": 1800,
        "environments": {env: {"kind": "venv"} for env in ENVS},
        "models": {model: sizes for model in MODELS},
        "variants": VARIANTS,
        "modes": list(MODES),
        "comparisons": comparisons,
    }


CLAIMS = {
    "pytorch-2.0-upgrade": {
        "source": "Seed article 000",
        "device": "NVIDIA A100",
        "device_class": "cuda",
        "precision": "unspecified (fp32 assumed)",
        "models": {
            "resnet50": {"baseline": 125, "candidate": 185, "speedup": 1.48},
            "bert-base": {"baseline": 85, "candidate": 120, "speedup": 1.41},
            "gpt2": {"baseline": 35, "candidate": 52, "speedup": 1.49},
            "mask-rcnn": {"speedup": 1.40},
        },
    }
}


def cells(count: int) -> Iterator[tuple[str, str, str, str, int, int]]:
    grid = itertools.product(ENVS, VARIANTS, MODELS, MODES, BATCHES)
    trials = max(1, count // (len(ENVS) * len(VARIANTS) * len(MODELS) * len(MODES) * len(BATCHES)))
    made = 0
    for env, variant, model, mode, batch in grid:
        for trial in range(trials):
            if made == count:
                return
            made += 1
            yield env, variant, model, mode, batch, trial


def record(cell: tuple[str, str, str, str, int, int], rng: random.Random) -> dict[str, Any]:
    env, variant, model, mode, batch, trial = cell
    status, reason = "ok", ""
    if env == "torch-1.13" and "compile" in variant:
        status, reason = "unsupported", "torch.compile needs torch >= 2.0 (this is 1.13.1)"
    elif rng.random() < 0.03:
        status, reason = rng.choice(FAULTS)
    rate = MODELS[model][1] * MODES[mode] * (batch / 8) ** 0.8
    rate *= VARIANT_GAIN[variant] * ENV_GAIN[env]
    rate *= rng.lognormvariate(0, 0.02 if rng.random() > 0.05 else 0.15)
    steps = [batch / rate * rng.lognormvariate(0, 0.03) for _ in range(10)]
    steps = steps if status == "ok" else []
    amp = "amp" in variant
    return {
        "cell": {
            "model": model,
            "variant": variant,
            "knobs": VARIANTS[variant],
            "mode": mode,
            "batch_size": batch,
            "env": env,
            "trial": trial,
            "device": "cuda",
        },
        "status": status,
        "reason": reason,
        "metrics": {
            "throughput_samples_per_s": rate if status == "ok" else None,
            "measured_wall_s": sum(steps) or None,
            "step_times_s": steps,
            "first_step_s": (30.0 if "compile" in variant else 0.5) * rng.uniform(0.9, 1.1),
            "peak_memory_bytes": int(batch * 60e6 * (0.6 if amp else 1.0)),
            "memory_kind": "cuda_allocator_peak",
        },
        "numerics": {
            "checked": variant != "eager",
            "precision": "bf16" if amp else "fp32",
            "tolerance": 0.05 if amp else 0.01,
            "max_relative_error": 1e-3,
            "passed": status != "numerics_mismatch",
        },
        "provenance": PROVENANCE | {"torch": env.removeprefix("torch-") + ".1"},
        "duration_s": 60.0,
    }


PROVENANCE = {
    "cuda": "12.1",
    "cudnn": "8902",
    "device_name": "NVIDIA H200",
    "device_index": 0,
    "gpu_driver": "550.54.15",
    "cpu_model": "Intel Xeon Platinum 8480+",
    "cpu_count": 16,
    "torch_threads": 16,
    "python": "3.11.7",
    "packages": {"torchvision": "0.16.2", "numpy": "1.26.4"},
    "git_commit": "0123abc",
    "hostname": "bench",
}


def write_records(root: Path, count: int) -> list[Path]:
    """The records' paths, in the workflow's layout; a few corrupt files and missing paths."""
    rng = random.Random(0)
    paths = []
    for index, cell in enumerate(cells(count)):
        env, variant, model, mode, batch, trial = cell
        used = ("image_size",) if MODELS[model][0] else ("seq_len",)
        size = size_label({"batch_size": batch, **DEFAULT_SIZES}, used)
        path = root / Cell(env, model, variant, mode, size, trial).path
        paths.append(path)
        if index % MISSING_EVERY == MISSING_EVERY - 1:
            continue  # listed but never written: the report must name it
        path.parent.mkdir(parents=True, exist_ok=True)
        corrupt = index % CORRUPT_EVERY == CORRUPT_EVERY - 1
        text = '{"cell": {"model": ' if corrupt else json.dumps(record(cell, rng))
        path.write_text(text, encoding="utf-8")
    return paths


def timed(stages: list[tuple[str, float]], name: str, action: Callable[[], Any]) -> Any:
    start = time.perf_counter()
    result = action()
    stages.append((name, time.perf_counter() - start))
    return result


def run(root: Path, paths: list[Path]) -> list[tuple[str, float]]:
    stages: list[tuple[str, float]] = []
    modules = timed(stages, "import", _import)
    analysis, report, write_atomic = modules
    runs, steps = timed(stages, "load records", lambda: analysis.load_tables(paths))
    summary = timed(stages, "summarise", lambda: analysis.summary_table(runs))
    speedups = timed(stages, "speedups", lambda: analysis.speedups(summary, config(), CLAIMS, runs))
    tables = {"runs": runs, "steps": steps, "summary": summary, "speedups": speedups}
    table_dir = root / "tables"

    def write() -> None:
        for name, frame in tables.items():
            write_atomic(table_dir / f"{name}.csv", frame.to_csv(index=False))

    timed(stages, "write CSVs", write)
    read = timed(
        stages,
        "read CSVs",
        lambda: {name: analysis.read_table(table_dir / f"{name}.csv") for name in tables},
    )
    timed(stages, "render (tables and figures)", lambda: _render(report, read, root / "report"))
    return stages


def _render(report: Any, tables: dict[str, Any], out_dir: Path) -> None:
    frames = tables["runs"], tables["summary"], tables["speedups"]
    report.render(*frames, config(), CLAIMS, out_dir, steps=tables["steps"])


def _import() -> tuple[SimpleNamespace, Any, Any]:
    """The aggregation steps, the report and the CSV writer, imported as the scripts do."""
    from ptspeed.analysis.aggregate import load_tables
    from ptspeed.analysis.columns import read_table
    from ptspeed.analysis.speedups import speedups
    from ptspeed.analysis.summary import summary_table
    from ptspeed.cell.files import write_atomic
    from ptspeed.render import report

    steps = {"load_tables": load_tables, "summary_table": summary_table, "speedups": speedups}
    return SimpleNamespace(**steps, read_table=read_table), report, write_atomic


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--records", type=int, default=10_000, help="how many records")
    parser.add_argument("--keep", help="write here and keep (default: a temporary directory)")
    parser.add_argument("--check", action="store_true", help=f"exit 1 above {GOAL_S:g} s")
    args = parser.parse_args(argv)
    with tempfile.TemporaryDirectory(prefix="bench-report-") as scratch:
        root = Path(args.keep or scratch)
        start = time.perf_counter()
        paths = write_records(root, args.records)
        print(f"wrote {len(paths)} record paths in {time.perf_counter() - start:.1f} s (untimed)")
        stages = run(root, paths)
        html = root / "report" / "index.html"
        print(f"report: {html.stat().st_size / 1e6:.1f} MB" + (f" at {html}" if args.keep else ""))
    total = sum(seconds for _, seconds in stages)
    for name, seconds in stages:
        print(f"  {name:<28} {seconds:6.2f} s")
    verdict = "met" if total <= GOAL_S else "MISSED"
    print(f"  {'total':<28} {total:6.2f} s  (goal <= {GOAL_S:g} s: {verdict})")
    return 1 if args.check and total > GOAL_S else 0


if __name__ == "__main__":
    sys.exit(main())
