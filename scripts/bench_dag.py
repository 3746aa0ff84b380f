"""Time how long Snakemake takes to plan a 2,000-cell matrix (a dry run).

    python scripts/bench_dag.py [--repeats 3] [--goal 20] [--cpu-goal 8] [--root CHECKOUT]
        [--profile FILE]

Writes a config of exactly 2,000 cells (5 environments: 3 venv and 2 host; 2 variants;
4 models; 2 modes; 25 trials) into a temporary directory, runs
``snakemake -n --cores 2 --configfile CONFIG`` from the repository root REPEATS times, and
prints the wall time of each run (and its CPU time: on a busy machine the steadier figure)
and their median. Exits 1 when the median wall time exceeds GOAL seconds, the median CPU time
exceeds CPU_GOAL seconds, or the dry run does not plan exactly 2,000 cell jobs.

With SLURM's client tools installed and no controller answering, every Snakemake start waits
about 10 s for ``scontrol show config`` (the slurm executor plugin asks it when it is loaded):
wall time, not CPU time.

With --profile, one more dry run (not timed) runs under cProfile and writes its statistics
to FILE (``python -m pstats FILE``); the line printed says how much of the profiled time went
to the workflow's own functions (the checkout's Snakefile, rules and package), the rest being
Snakemake's, its plugins' and Python's.
"""

from __future__ import annotations

import argparse
import pstats
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


def dry_run(config_path: Path) -> list[str]:
    return [str(SNAKEMAKE), "-n", "--cores", "2", "--configfile", str(config_path)]


def time_dry_run(config_path: Path, root: Path) -> tuple[float, float, dict[str, int]]:
    """Wall seconds, CPU seconds and the planned jobs of one dry run."""
    command = dry_run(config_path)
    cpu, start = children_cpu_s(), time.perf_counter()
    done = subprocess.run(command, cwd=root, capture_output=True, text=True, timeout=600)
    elapsed, cpu = time.perf_counter() - start, children_cpu_s() - cpu
    if done.returncode != 0:
        raise SystemExit(f"snakemake failed ({done.returncode}):\n{done.stderr[-3000:]}")
    return elapsed, cpu, planned_jobs(done.stdout + done.stderr)


def profile_dry_run(config_path: Path, root: Path, output: Path) -> str:
    """Profile one dry run into ``output``; a line on the share of the checkout's own code."""
    command = [sys.executable, "-m", "cProfile", "-o", str(output), *dry_run(config_path)]
    subprocess.run(command, cwd=root, capture_output=True, text=True, timeout=600, check=True)
    # (file, line, function) -> (calls, primitive calls, own time, cumulative time, callers)
    stats = pstats.Stats(str(output)).stats  # type: ignore[attr-defined]
    own_root = str(root.resolve())
    total = sum(entry[2] for entry in stats.values())
    own = sum(entry[2] for (file, _, _), entry in stats.items() if file.startswith(own_root))
    return (
        f"profile: {output}: {total:.2f} s profiled, of which in the workflow's own functions "
        f"{own:.2f} s ({own / total:.0%}), Snakemake, its plugins and Python the rest"
    )


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=3, help="dry runs to time")
    parser.add_argument("--goal", type=float, default=20.0, help="seconds the median may take")
    parser.add_argument(
        "--cpu-goal", type=float, default=8.0, help="CPU seconds the median may take"
    )
    parser.add_argument("--root", type=Path, default=ROOT, help="checkout to run (this one)")
    parser.add_argument("--profile", type=Path, help="cProfile one more dry run into this file")
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
        if args.profile:
            print(profile_dry_run(config_path, args.root, args.profile))
    median, median_cpu = statistics.median(times), statistics.median(cpu_times)
    print(
        f"median: {median:.2f} s wall, {median_cpu:.2f} s CPU over {len(times)} runs"
        f" (goal <= {args.goal:g} s wall, <= {args.cpu_goal:g} s CPU)"
    )
    if jobs.get("cell") != CELLS:
        print(f"error: planned {jobs.get('cell')} cell jobs, expected {CELLS}", file=sys.stderr)
        return 1
    return 0 if median <= args.goal and median_cpu <= args.cpu_goal else 1


if __name__ == "__main__":
    sys.exit(main())
