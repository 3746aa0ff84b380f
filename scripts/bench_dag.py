"""Time how long Snakemake takes to plan a 2,000-cell matrix (a dry run).

    python scripts/bench_dag.py [--repeats 3] [--goal 20] [--root CHECKOUT]

Writes a config of exactly 2,000 cells (5 environments: 3 venv and 2 host; 2 variants;
4 models; 2 modes; 25 trials) into a temporary directory, runs
``snakemake -n --cores 2 --configfile CONFIG`` from the repository root REPEATS times, and
prints the wall time of each run (and its CPU time: on a busy machine the steadier figure)
and their median. Exits 1 when the median wall time exceeds GOAL seconds or the dry run does
not plan exactly 2,000 cell jobs.
"""

from __future__ import annotations

import argparse
import re
import resource
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import yaml

ROOT = Path(__file__).resolve().parents[1]
SNAKEMAKE = Path(sys.executable).parent / "snakemake"
CELLS = 2000
VENV_ENVS = {"torch-1.13": "3.10", "torch-2.0": "3.10", "torch-2.14": "3.11"}
HOST_ENVS = ("host", "host-b")
MODELS = {
    "mlp": {"batch_size": 32},
    "lstm-lm": {"batch_size": 2, "seq_len": 8},
    "resnet50": {"batch_size": 8, "image_size": 96},
    "bert-base": {"batch_size": 4, "seq_len": 64},
}
MODES = ["train", "infer"]
VARIANTS = {"eager": "eager", "compile": "compile"}


def matrix_config(results: Path) -> dict:
    """A config whose matrix is exactly CELLS cells: 10 env/variant pairs x 4 models x
    2 modes x 25 trials."""
    environments: dict[str, dict] = {
        name: {"kind": "venv", "requirements": f"envs/{name}.txt", "python": python}
        for name, python in VENV_ENVS.items()
    }
    environments.update({name: {"kind": "host"} for name in HOST_ENVS})
    comparisons = {
        f"compile-{name.replace('.', '-')}": {
            "baseline": {"env": name, "variant": "eager"},
            "candidate": {"env": name, "variant": "compile"},
        }
        for name in environments
    }
    pairs = len(environments) * len(VARIANTS)
    trials = CELLS // (pairs * len(MODELS) * len(MODES))
    if pairs * len(MODELS) * len(MODES) * trials != CELLS:
        raise ValueError(f"{CELLS} cells are not a whole number of trials of the matrix")
    return {
        "results": str(results),
        "device": "cpu",
        "trials": trials,
        "environments": environments,
        "models": {name: {"cpu": sizes} for name, sizes in MODELS.items()},
        "variants": VARIANTS,
        "modes": MODES,
        "comparisons": comparisons,
    }


def planned_jobs(output: str) -> dict[str, int]:
    """The 'Job stats' table of a dry run as {rule: count}."""
    table = output.split("Job stats:", 1)[1]
    return {
        match[1]: int(match[2])
        for match in re.finditer(r"^(\w+)\s+(\d+)$", table, re.MULTILINE)
        if match[1] != "total"
    }


def children_cpu_s() -> float:
    usage = resource.getrusage(resource.RUSAGE_CHILDREN)
    return usage.ru_utime + usage.ru_stime


def time_dry_run(config_path: Path, root: Path) -> tuple[float, float, dict[str, int]]:
    """Wall seconds, CPU seconds and the planned jobs of one dry run."""
    command = [str(SNAKEMAKE), "-n", "--cores", "2", "--configfile", str(config_path)]
    cpu, start = children_cpu_s(), time.perf_counter()
    done = subprocess.run(command, cwd=root, capture_output=True, text=True, timeout=600)
    elapsed, cpu = time.perf_counter() - start, children_cpu_s() - cpu
    if done.returncode != 0:
        raise SystemExit(f"snakemake failed ({done.returncode}):\n{done.stderr[-3000:]}")
    return elapsed, cpu, planned_jobs(done.stdout + done.stderr)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=3, help="dry runs to time")
    parser.add_argument("--goal", type=float, default=20.0, help="seconds the median may take")
    parser.add_argument("--root", type=Path, default=ROOT, help="checkout to run (this one)")
    args = parser.parse_args(argv)
    with tempfile.TemporaryDirectory(prefix="ptspeed-bench-dag-") as tmp:
        config_path = Path(tmp) / "config.yaml"
        config_path.write_text(yaml.safe_dump(matrix_config(Path(tmp) / "results")))
        times, cpu_times = [], []
        for repeat in range(1, args.repeats + 1):
            elapsed, cpu, jobs = time_dry_run(config_path, args.root)
            times.append(elapsed)
            cpu_times.append(cpu)
            print(
                f"run {repeat}: {elapsed:.2f} s wall, {cpu:.2f} s CPU"
                f" ({sum(jobs.values())} jobs: {jobs})"
            )
    median = statistics.median(times)
    print(
        f"median: {median:.2f} s wall, {statistics.median(cpu_times):.2f} s CPU"
        f" over {len(times)} runs (goal <= {args.goal:g} s wall)"
    )
    if jobs.get("cell") != CELLS:
        print(f"error: planned {jobs.get('cell')} cell jobs, expected {CELLS}", file=sys.stderr)
        return 1
    return 0 if median <= args.goal else 1


if __name__ == "__main__":
    sys.exit(main())
