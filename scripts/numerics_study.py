"""Measure the numerics gate: its errors on fault-free cells and on injected faults.

    PYTHONPATH=src python scripts/numerics_study.py --models mlp,resnet50,bert-base \\
        --variants loader=0,amp=bf16 --seeds 30 --faults grad,skip-step --out study.csv

Every (model, variant, seed) runs as a real cell (in this process, one after another, the
compiler reset in between) with tiny step counts, fault-free and with each fault. Prints, per
model and variant, the false alarms among fault-free cells, the largest fault-free error of
each quantity as a share of its bound, and for each fault how many cells it was caught in and
its smallest error against its bound. A share above 1 is a mismatch.
"""

from __future__ import annotations

import argparse
import csv
import sys
from collections import defaultdict
from pathlib import Path

import _checkout  # noqa: F401  (the checkout's src/ on the import path)

from ptspeed.cell.harness import run_cell
from ptspeed.cell.record import CellSpec

CPU_SIZES = {"batch_size": 4, "image_size": 64, "seq_len": 32}
FIELDS = ("model", "variant", "seed", "fault", "status", "quantity", "error", "allowed")


def run(model: str, knobs: str, seed: int, fault: str, device: str) -> list[dict[str, object]]:
    spec = CellSpec(
        model=model, variant=knobs, knobs=knobs, mode="train", seed=seed, fault=fault,
        warmup_steps=2, measured_steps=1, numerics_steps=2, device=device, **CPU_SIZES,
    )  # fmt: skip
    record = run_cell(spec)
    _reset_compiler()
    check = record.numerics
    rows = [
        {"quantity": q, "error": check.errors[q], "allowed": check.allowed_errors[q]}
        for q in check.errors
    ] or [{"quantity": "", "error": None, "allowed": None}]
    common = {"model": model, "variant": knobs, "seed": seed, "fault": fault or "none"}
    return [{**common, "status": record.status, **row} for row in rows]


def _reset_compiler() -> None:
    try:
        import torch._dynamo

        torch._dynamo.reset()
    except ImportError:
        pass


def share(row: dict[str, object]) -> float:
    error, allowed = row["error"], row["allowed"]
    if error is None:
        return float("inf")
    return float(error) / float(allowed)  # type: ignore[arg-type]


def summarise(rows: list[dict[str, object]]) -> None:
    by_cell: dict[tuple[object, ...], list[dict[str, object]]] = defaultdict(list)
    for row in rows:
        by_cell[(row["model"], row["variant"], row["fault"])].append(row)
    for (model, variant, fault), cell_rows in sorted(by_cell.items(), key=str):
        statuses = {(r["seed"], r["status"]) for r in cell_rows}
        cells = len(statuses)
        mismatches = sum(status == "numerics_mismatch" for _, status in statuses)
        if fault == "none":
            worst = defaultdict(float)
            for r in cell_rows:
                worst[r["quantity"]] = max(worst[r["quantity"]], share(r))
            shares = ", ".join(f"{q} {s:.2f}" for q, s in worst.items())
            print(f"{model:<10} {variant:<14} fault-free: {mismatches}/{cells} false alarms; "
                  f"largest error/bound: {shares}")  # fmt: skip
        else:
            caught = defaultdict(lambda: float("inf"))
            for r in cell_rows:
                caught[r["seed"]] = min(caught[r["seed"]], max(share(x) for x in cell_rows
                                        if x["seed"] == r["seed"]))  # fmt: skip
            print(f"{model:<10} {variant:<14} {fault:<10}: caught in {mismatches}/{cells}; "
                  f"smallest worst error/bound {min(caught.values()):.1f}")  # fmt: skip


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--models", default="mlp,resnet50,bert-base")
    parser.add_argument("--variants", default="loader=0,amp=bf16")
    parser.add_argument("--seeds", type=int, default=30)
    parser.add_argument("--fault-seeds", type=int, default=3, help="seeds per injected fault")
    parser.add_argument("--faults", default="grad,skip-step")
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--out", type=Path, default=Path("numerics_study.csv"))
    args = parser.parse_args(argv)
    rows: list[dict[str, object]] = []
    faults = ["", *filter(None, args.faults.split(","))]
    with args.out.open("w", newline="") as handle:  # row by row: a stopped study keeps its cells
        writer = csv.DictWriter(handle, fieldnames=FIELDS)
        writer.writeheader()
        for model in args.models.split(","):
            for variant in args.variants.split(","):
                for fault in faults:
                    for seed in range(args.fault_seeds if fault else args.seeds):
                        cell_rows = run(model, variant, seed, fault, args.device)
                        writer.writerows(cell_rows)
                        handle.flush()
                        rows += cell_rows
                print(f"{model} {variant}: done", file=sys.stderr, flush=True)
    summarise(rows)
    return 0


if __name__ == "__main__":
    sys.exit(main())
