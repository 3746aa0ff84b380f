"""Helpers shared by the test modules: the paths of the checkout, runners of Snakemake, of the
``ptspeed`` command and of workflow/scripts/aggregate.py, a loader of scripts by their path,
and a fixture set of records.

Test modules import from here, never from each other.
"""

from __future__ import annotations

import contextlib
import errno
import importlib.util
import json
import math
import os
import re
import shutil
import ssl
import subprocess
import sys
import textwrap
from collections import Counter
from collections.abc import Iterable, Iterator
from html.parser import HTMLParser
from pathlib import Path
from types import ModuleType
from typing import Any

import pandas as pd
import pytest
import torch
import yaml
from jsonschema import Draft202012Validator
from torch import nn
from torch.nn import functional

from ptspeed.analysis.reruns import attempt_of
from ptspeed.cell.record import CellSpec, NumericsCheck, Provenance, Record, write_record
from ptspeed.cell.record_window import Metrics
from ptspeed.cell.schema import json_schema
from ptspeed.envs.venvs import build_venv, venv_python
from ptspeed.models import Batch, ModelSpec, Sizes
from ptspeed.plan.schema import settings_from
from ptspeed.plan.settings import Settings
from ptspeed.render.formatting import (
    format_int,
    format_published,
    format_rate,
    format_speedup_interval,
    format_text,
    format_verdict,
)
from ptspeed.render.report import render
from ptspeed.render.tables import SEED_TABLE, headers

ROOT = Path(__file__).resolve().parents[1]
SRC = ROOT / "src"
WORKFLOW_SCRIPTS = ROOT / "workflow" / "scripts"  # the rules' entry points
TOOLS = ROOT / "scripts"  # the developer tools and user commands
# make test-fast sets it to "fast" (see tests/conftest.py).
TIER_VARIABLE = "PTSPEED_TEST_TIER"


def load_script(path: Path) -> ModuleType:
    """The script at ``path`` as a module (its ``main`` and its functions), imported as ``python
    PATH`` runs it: with its own directory on the import path (where a tool finds _checkout)."""
    spec = importlib.util.spec_from_file_location(f"{path.stem}_script", path)
    assert spec and spec.loader
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # a dataclass of the script looks its module up
    sys.path.insert(0, str(path.parent))
    try:
        spec.loader.exec_module(module)
    finally:
        sys.path.remove(str(path.parent))
    return module


def fast_tier() -> bool:
    return os.environ.get(TIER_VARIABLE) == "fast"


def examples(full: int) -> int:
    """Hypothesis examples of a property: ``full`` in make test, an eighth (at least 10) in
    the fast tier, whose loop must stay near a minute."""
    return max(10, full // 8) if fast_tier() else full


BIN = Path(sys.executable).parent
PLAN_TIMEOUT_S = 300

TINY_STEPS = {"warmup": 1, "measured": 2, "numerics": 1}
# Two host environments, mlp, eager: the smallest matrix with a comparison.
HOSTS: dict[str, Any] = {
    "device": "cpu",
    "trials": 2,
    "threads": 1,
    "steps": TINY_STEPS,
    "environments": {"host": {"kind": "host"}, "host-b": {"kind": "host"}},
    "models": {"mlp": {"cpu": {"batch_size": 16}}},
    "variants": {"eager": "eager"},
    "comparisons": {
        "two-hosts": {
            "title": "host → host-b",
            "baseline": {"env": "host", "variant": "eager"},
            "candidate": {"env": "host-b", "variant": "eager"},
        }
    },
}

# --- Snakemake ---


def tool(name: str) -> str:
    """A command-line tool of the interpreter running the tests (its venv's bin/)."""
    beside = BIN / name
    found = str(beside) if beside.exists() else shutil.which(name)
    assert found, f"{name} is not installed (pip install -e '.[workflow,dev]')"
    return found


def snakemake(
    *args: str,
    timeout: float = PLAN_TIMEOUT_S,
    cwd: Path = ROOT,
    env: dict[str, str] | None = None,
    cores: str | None = "2",
) -> subprocess.CompletedProcess[str]:
    """Run Snakemake (from the repository root, on 2 cores unless told otherwise); stdout and
    stderr together. ``cores=None`` leaves the cores to a profile's executor."""
    return subprocess.run(
        [tool("snakemake"), *(("--cores", cores) if cores else ()), *args],
        cwd=cwd,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        timeout=timeout,
        check=False,
        env=env,
    )


# What other processes take of the CPUs (the run's other cells, whatever else the shared
# machine runs) would make the workflow judge some trials perturbed and rerun them: a test's
# records would depend on its neighbours. Tests about perturbed trials judge the CPU
# (``judge_cpu``); the others judge no window by it, nor by the machine-speed probe.
UNJUDGED_CPU = {"min_window_s": 3600, "max_probe_deviation": 10}


def write_config(
    directory: Path, config: dict[str, Any], name: str = "config.yaml", judge_cpu: bool = False
) -> Path:
    """Write ``config`` with its results directory under ``directory``; return the file."""
    config = {"results": str(directory / "results"), **config}
    if not judge_cpu:
        # Over the config's own conditions: one taken from config/config.yaml judges windows.
        config["conditions"] = {**config.get("conditions", {}), **UNJUDGED_CPU}
    path = directory / name
    path.write_text(yaml.safe_dump(config, allow_unicode=True, sort_keys=False))
    return path


def job_counts(output: str) -> Counter[str]:
    """The 'Job stats' table Snakemake prints before running (or dry-running) jobs."""
    assert "Job stats:" in output, output[-3000:]
    table = output.split("Job stats:", 1)[1].split("\n\n", 1)[0]
    rows = re.findall(r"^(\w+)\s+(\d+)\s*$", table, re.MULTILINE)
    return Counter({rule: int(count) for rule, count in rows if rule != "total"})


def planned_outputs(output: str) -> dict[str, list[str]]:
    """Each planned rule's (or checkpoint's) output files, from the job blocks of a dry run."""
    planned: dict[str, list[str]] = {}
    rule = None
    for line in output.splitlines():
        header = re.fullmatch(r"(?:local)?(?:rule|checkpoint) (\w+):", line.strip())
        if header:
            rule = header[1]
            planned.setdefault(rule, [])
        elif rule and line.strip().startswith("output: "):
            planned[rule].extend(line.strip().removeprefix("output: ").split(", "))
    return planned


def ok(result: subprocess.CompletedProcess[str]) -> str:
    assert result.returncode == 0, result.stdout[-6000:]
    return result.stdout


# --- the ptspeed command ---

TINY_CELL = [
    "--model", "mlp", "--batch-size", "2", "--warmup-steps", "1", "--measured-steps", "2",
    "--numerics-steps", "1", "--device", "cpu",
]  # fmt: skip


# A user's model module (module:attribute), written outside the package by the tests.
USER_MODEL_MODULE = textwrap.dedent(
    """
    import torch
    from torch import nn
    from ptspeed.models import ModelSpec

    def _batch(sizes, generator):
        return {
            "x": torch.randn(sizes.batch_size, 8, generator=generator),
            "y": torch.randint(0, 3, (sizes.batch_size,), generator=generator),
        }

    def tiny():
        return ModelSpec(
            name="tiny",
            description="a user's linear classifier",
            build=lambda sizes: nn.Linear(8, 3),
            make_batch=_batch,
            loss=lambda m, b: nn.functional.cross_entropy(m(b["x"]), b["y"]),
            infer=lambda m, b: m(b["x"]),
            limits={"seq_len": (4, 64)},
        )

    TINY = tiny()
    NOT_A_SPEC = 3
    """
)


def with_sources() -> dict[str, str]:
    """This process's environment with this checkout's sources first on PYTHONPATH."""
    path = os.pathsep.join(p for p in (str(SRC), os.environ.get("PYTHONPATH")) if p)
    return {**os.environ, "PYTHONPATH": path}


def ptspeed(
    *args: str, timeout: float = 120, env: dict[str, str] | None = None
) -> subprocess.CompletedProcess[str]:
    """Run ``python -m ptspeed ARGS`` as a user would, with this checkout's sources (and the
    variables of ``env`` added to this process's environment)."""
    return subprocess.run(
        [sys.executable, "-m", "ptspeed", *args],
        capture_output=True,
        text=True,
        timeout=timeout,
        env={**with_sources(), **(env or {})},
        check=False,
    )


def first_round_and_reruns(results: Path, trials: int) -> tuple[list[dict[str, Any]], list[str]]:
    """A whole run's records of the first round (trial < ``trials``), after asserting that every
    other record is a rerun the run's judge_trials listed (a perturbed trial runs again: on a
    shared machine that is the run's right, not a fault), and those reruns' paths."""
    first, later = [], []
    for path in sorted((results / "records").rglob("*.json")):
        record = json.loads(path.read_text(encoding="utf-8"))
        if attempt_of(record["cell"]["trial"], trials) == 0:
            first.append(record)
        else:
            later.append(path.relative_to(results).as_posix())
    listed = {
        rerun
        for round_ in (results / "reruns").glob("round*.json")
        for rerun in json.loads(round_.read_text(encoding="utf-8"))["reruns"]
    }
    assert set(later) == listed, f"records beyond the first round {later}, reruns listed {listed}"
    return first, later


def read_valid_record(path: Path) -> Record:
    data: dict[str, Any] = json.loads(path.read_text(encoding="utf-8"))
    Draft202012Validator(json_schema()).validate(data)
    return Record.from_dict(data)


def settings_of(config: dict[str, Any], device: str | None = None) -> Settings:
    """The settings of a test's config over :data:`CONFIG` (the matrix a config without its
    own environments, models, variants or comparisons keeps), the schema's defaults filling
    the rest (``device``: the device class the planner resolved, in place of the config's)."""
    given = {**CONFIG, **config}
    return settings_from({**given, "device": device} if device else given)


def files_in(directory: Path) -> list[str]:
    return sorted(p.name for p in directory.iterdir())


# --- records and the aggregation script ---

CONFIG: dict[str, Any] = {
    "device": "cpu",
    "environments": {"torch-1.13": {"kind": "venv"}, "torch-2.0": {"kind": "venv"}},
    "models": {
        "resnet50": {
            "cuda": {"batch_size": 64, "image_size": 224},
            "cpu": {"batch_size": 8, "image_size": 96},
        },
        "bert-base": {"cpu": {"batch_size": 4, "seq_len": 64}},
        "gpt2": {"cpu": {"batch_size": 2, "seq_len": 64}},
    },
    "variants": {"eager": "eager", "compile": "compile"},
    "modes": ["train"],
    "comparisons": {
        "upgrade-and-compile": {
            "title": "1.13 eager → 2.0 compile",
            "baseline": {"env": "torch-1.13", "variant": "eager"},
            "candidate": {"env": "torch-2.0", "variant": "compile"},
            "claim": "pytorch-2.0-upgrade",
        },
        "compile-alone": {
            "title": "2.0 eager → 2.0 compile",
            "baseline": {"env": "torch-2.0", "variant": "eager"},
            "candidate": {"env": "torch-2.0", "variant": "compile"},
        },
    },
}

CLAIMS: dict[str, Any] = {
    "pytorch-2.0-upgrade": {
        "source": "Seed article 000",
        "setup": "A100, batch 64",
        "models": {
            "resnet50": {"baseline": 125, "candidate": 185, "speedup": 1.48},
            "gpt2": {"baseline": 35, "candidate": 52, "speedup": 1.49},
        },
    }
}

SIZES = {
    "resnet50": {"batch_size": 8, "image_size": 96, "seq_len": 128},
    "bert-base": {"batch_size": 4, "image_size": 224, "seq_len": 64},
    "gpt2": {"batch_size": 2, "image_size": 224, "seq_len": 64},
}
TORCH = {"torch-1.13": ("1.13.1", "11.7"), "torch-2.0": ("2.0.1", "11.8")}


def make_record(
    env: str,
    model: str,
    variant: str,
    trial: int,
    status: str = "ok",
    samples_per_s: float | None = None,
    reason: str = "",
    **sizes: int,
) -> Record:
    torch_version, cuda = TORCH[env]
    cell = CellSpec(
        model=model,
        variant=variant,
        knobs=variant,
        mode="train",
        env=env,
        trial=trial,
        **{**SIZES[model], **sizes},
    )
    metrics = Metrics(
        throughput_samples_per_s=samples_per_s,
        step_times_s=[0.1 + trial / 100, 0.2] if status == "ok" else [],
        first_step_s=2.0 + trial if status == "ok" else None,
        peak_memory_bytes=(100 + trial) * 1024 * 1024 if status == "ok" else None,
        memory_kind="process_peak_rss",
    )
    numerics = NumericsCheck(checked=True, tolerance=1e-4, max_relative_error=1e-6, passed=True)
    provenance = Provenance(
        torch=torch_version,
        cuda=cuda,
        cudnn="8500",
        device_name="Test CPU",
        cpu_model="Test CPU",
        torch_threads=4,
        python="3.10.13",
        packages={"torch": torch_version, "torchvision": "0.15.2", "numpy": "1.24.4"},
        git_commit="1234567",
        hostname="testhost",
    )
    return Record(
        cell=cell,
        status=status,
        reason=reason,
        metrics=metrics,
        numerics=numerics,
        provenance=provenance,
    )


# (env, model, variant, trial, status, samples/s, reason)
FIXTURE_CELLS = [
    ("torch-1.13", "resnet50", "eager", 0, "ok", 100.0, ""),
    ("torch-1.13", "resnet50", "eager", 1, "ok", 120.0, ""),
    ("torch-1.13", "resnet50", "eager", 2, "ok", 110.0, ""),
    ("torch-2.0", "resnet50", "compile", 0, "ok", 150.0, ""),
    ("torch-2.0", "resnet50", "compile", 1, "ok", 180.0, ""),
    ("torch-2.0", "resnet50", "compile", 2, "failed", None, "RuntimeError: boom"),
    ("torch-2.0", "resnet50", "eager", 0, "ok", 132.0, ""),
    ("torch-2.0", "resnet50", "eager", 1, "ok", 132.0, ""),
    ("torch-1.13", "bert-base", "eager", 0, "ok", 10.0, ""),
    ("torch-1.13", "bert-base", "eager", 1, "ok", 12.0, ""),
    ("torch-2.0", "bert-base", "compile", 0, "ok", 22.0, ""),
    ("torch-1.13", "gpt2", "eager", 0, "ok", 40.0, ""),
    ("torch-2.0", "gpt2", "compile", 0, "unsupported", None, "needs torch>=2.0 | fake"),
]
CORRUPT_NAME = "corrupt.json"


def write_fixture_records(directory: Path) -> list[Path]:
    """The fixture's record files, a corrupt one and one at a size the config does not ask for."""
    paths = []
    for env, model, variant, trial, status, rate, reason in FIXTURE_CELLS:
        path = directory / f"{env}_{model}_{variant}_{trial}.json"
        write_record(make_record(env, model, variant, trial, status, rate, reason), path)
        paths.append(path)
    other_size = directory / "torch-1.13_resnet50_eager_b64.json"
    record = make_record("torch-1.13", "resnet50", "eager", 0, "ok", 999.0, batch_size=64)
    write_record(record, other_size)
    corrupt = directory / CORRUPT_NAME
    corrupt.write_text('{"cell": {"model": "resn', encoding="utf-8")
    return [*paths, other_size, corrupt]


def run_aggregate_script(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, str(WORKFLOW_SCRIPTS / "aggregate.py"), *args],
        capture_output=True,
        text=True,
        cwd=ROOT,
        check=False,
    )


def write_inputs(directory: Path) -> tuple[Path, Path]:
    config, claims = directory / "config.json", directory / "claims.yaml"
    config.write_text(pd.io.json.ujson_dumps(CONFIG), encoding="utf-8")
    claims.write_text(yaml.safe_dump(CLAIMS), encoding="utf-8")
    return config, claims


def aggregate_cli(tmp_path: Path, record_paths: list[Path]) -> Path:
    """Run workflow/scripts/aggregate.py on the fixture (records passed through --records-from)."""
    config, claims = write_inputs(tmp_path)
    listing = tmp_path / "records.txt"
    listing.write_text("\n".join(str(p) for p in record_paths) + "\n", encoding="utf-8")
    out_dir = tmp_path / "tables"
    result = run_aggregate_script(
        "--config", str(config), "--claims", str(claims),
        "--records-from", str(listing), "--out-dir", str(out_dir),
    )  # fmt: skip
    assert result.returncode == 0, result.stderr
    return out_dir


# --- the report's pages ---

TABLE_NAMES = ("runs", "summary", "speedups", "steps")
# A cell the matrix expects whose record never appeared (workflow layout: the cell is known).
ABSENT = "results/records/torch-2.0/gpt2/compile/train/b2-s64/trial1.json"


def fixture_paths(directory: Path) -> list[Path]:
    """The aggregation fixture (failures, an unsupported cell, a corrupt file) plus a missing
    record."""
    return [*write_fixture_records(directory / "records"), directory / ABSENT]


def render_tables(tables: dict[str, pd.DataFrame], out_dir: Path, **kwargs: Any) -> list[Path]:
    return render(
        tables["runs"],
        tables["summary"],
        tables["speedups"],
        settings_of(kwargs.pop("config", CONFIG)),
        kwargs.pop("claims", CLAIMS),
        out_dir,
        steps=tables.get("steps"),
        **kwargs,
    )


class PageReader(HTMLParser):
    """The tables of each <section id=...> (rows of cell texts, header first) and the images."""

    def __init__(self) -> None:
        super().__init__(convert_charrefs=True)
        self.tables: dict[str, list[list[list[str]]]] = {}
        self.images: list[dict[str, str]] = []
        self._section = ""
        self._cell: list[str] | None = None

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        attributes = {k: v or "" for k, v in attrs}
        if tag == "section":
            self._section = attributes.get("id", "")
            self.tables.setdefault(self._section, [])
        elif tag == "table":
            self.tables[self._section].append([])
        elif tag == "tr":
            self.tables[self._section][-1].append([])
        elif tag in ("td", "th"):
            self._cell = []
        elif tag == "img":
            self.images.append({**attributes, "section": self._section})

    def handle_endtag(self, tag: str) -> None:
        if tag in ("td", "th") and self._cell is not None:
            self.tables[self._section][-1][-1].append("".join(self._cell).strip())
            self._cell = None

    def handle_data(self, data: str) -> None:
        if self._cell is not None:
            self._cell.append(data)


def read_page(html: str) -> PageReader:
    reader = PageReader()
    reader.feed(html)
    return reader


def expected_seed_tables(speedups: pd.DataFrame) -> list[list[list[str]]]:
    tables = []
    for name in dict.fromkeys(speedups["comparison"]):
        rows = speedups[speedups["comparison"] == name].to_dict("records")
        tables.append([headers(SEED_TABLE), *(expected_seed_row(row) for row in rows)])
    return tables


def expected_seed_row(row: dict[str, Any]) -> list[str]:
    return [
        format_text(row["model"]),
        format_text(row["mode"]),
        format_int(row["batch_size"]),
        format_rate(row["baseline_samples_per_s"], row["baseline_trials"]),
        format_rate(row["candidate_samples_per_s"], row["candidate_trials"]),
        format_speedup_interval(
            row["speedup"], row["speedup_low"], row["speedup_high"], row["speedup_confidence"]
        ),
        format_published(
            row["published_speedup"], row["published_baseline"], row["published_candidate"]
        ),
        format_verdict(row["verdict"], row["verdict_reason"]),
    ]


def html_cells(rows: list[list[str]]) -> list[list[str]]:
    """A table as the HTML shows it: Markdown-only escaping undone."""
    return [[" ".join(cell.split()) for cell in row] for row in rows]


# --- the benchmark environments (crossversion tests) ---

CROSS_VERSION_VARIABLE = "PTSPEED_CROSS_VERSION"


def benchmark_python(env: str) -> str:
    """The python of environment ``env`` (torch-1.13, torch-2.0) as the workflow builds it:
    the schema's env_cache, the lock's hash; built on first use, reused after."""
    schema = yaml.safe_load((ROOT / "workflow/schemas/config.schema.yaml").read_text())
    cache = Path(schema["properties"]["env_cache"]["default"]).expanduser()
    venv = build_venv(env, ROOT / f"envs/{env}.txt", "3.10", cache)
    return str(venv_python(venv))


# --- the cost of a test: what the fast tier (make test-fast) leaves to make test ---

# Models whose tiny cells still take 5-30 s on the 2-core machine (the full-size BERT, GPT-2 and
# Mask R-CNN, the LSTM's fp64 reference, and the transformers import of the tiny BERT and GPT-2);
# mlp and resnet50 at tiny sizes take a second or two.
HEAVY_MODELS = frozenset({"bert-base", "gpt2", "bert-tiny", "gpt2-tiny", "mask-rcnn", "lstm-lm"})


def is_heavy(model: str, knobs: str = "eager") -> bool:
    """Whether a cell of ``model`` with ``knobs`` belongs to the slow tier: a heavy model, or a
    compile that lowers through AOTAutograd or Inductor (seconds of tracing and a C++ build);
    ``compile+backend=eager`` (Dynamo's tracing alone) stays fast."""
    compiles = "compile" in knobs and "backend=eager" not in knobs
    return model in HEAVY_MODELS or compiles


def by_cost(models: Iterable[str]) -> list[Any]:
    """``models`` as parameters of a test, the heavy ones marked slow."""
    return [pytest.param(m, marks=pytest.mark.slow) if is_heavy(m) else m for m in models]


def knob_cases(knob_strings: Iterable[str], model: str = "mlp") -> list[Any]:
    """Knob strings as parameters of a test on ``model``, the compiling ones marked slow."""
    return [
        pytest.param(k, marks=pytest.mark.slow) if is_heavy(model, k) else k for k in knob_strings
    ]


# --- a full disk ---


@contextlib.contextmanager
def small_disk(mount_point: Path, size_kib: int = 64) -> Iterator[Path]:
    """A tmpfs of ``size_kib`` mounted on ``mount_point`` (:func:`fill` fills it), unmounted
    afterwards. Skips the test where this process may not mount (not root, or no
    CAP_SYS_ADMIN in a container)."""
    mount_point.mkdir(parents=True, exist_ok=True)
    mount = shutil.which("mount")
    if mount is None:
        pytest.skip("no mount command here")
    done = subprocess.run(
        [mount, "-t", "tmpfs", "-o", f"size={size_kib}k", "tmpfs", str(mount_point)],
        capture_output=True, text=True, check=False,
    )  # fmt: skip
    if done.returncode != 0:
        pytest.skip(f"cannot mount a small tmpfs here: {done.stderr.strip()}")
    try:
        yield mount_point
    finally:
        subprocess.run(["umount", "--lazy", str(mount_point)], check=False)


def fill(directory: Path) -> None:
    """Write to ``directory`` until its file system is full."""
    with open(directory / "filler", "wb", buffering=0) as filler:
        try:
            while True:
                filler.write(b"\0" * 4096)
        except OSError as error:
            assert error.errno == errno.ENOSPC, error


# --- tiny benchmark cells (the harness tests and those that reuse its cells) ---

# Sizes per model; the three slowest on a CPU measure one step instead of two.
TINY_FIELDS: dict[str, dict[str, int]] = {
    "mlp": {},
    "lstm-lm": {"seq_len": 8},
    "resnet50": {"image_size": 32},
    "mask-rcnn": {"image_size": 64, "measured_steps": 1},
    "bert-base": {"seq_len": 8, "measured_steps": 1},
    "gpt2": {"seq_len": 8, "measured_steps": 1},
    "bert-tiny": {"seq_len": 8},
    "gpt2-tiny": {"seq_len": 8},
}


def tiny_cell(model: str, knobs: str = "eager", mode: str = "train", **fields: Any) -> CellSpec:
    """A cell small enough for a 2-core CPU: batch 2, one warm-up step, one or two measured."""
    settings: dict[str, Any] = {
        "batch_size": 2,
        "warmup_steps": 1,
        "measured_steps": 2,
        "numerics_steps": 1,
        "device": "cpu",
        **TINY_FIELDS[model],
        **fields,
    }
    return CellSpec(model=model, variant=knobs, knobs=knobs, mode=mode, **settings)


def assert_valid_json_record(record: Record, tmp_path: Path) -> dict[str, Any]:
    """Write the record as the worker does and validate the file against the schema."""
    write_record(record, tmp_path / "cell.json")
    data = json.loads((tmp_path / "cell.json").read_text(encoding="utf-8"))
    Draft202012Validator(json_schema()).validate(data)
    return data


def assert_measured(record: Record, spec: CellSpec) -> None:
    metrics = record.metrics
    assert record.status == "ok", record.reason
    assert record.reason == ""
    assert metrics.throughput_samples_per_s > 0
    assert len(metrics.step_times_s) == spec.measured_steps
    assert all(t > 0 for t in metrics.step_times_s)
    assert metrics.first_step_s > 0
    assert metrics.warmup_s >= metrics.first_step_s
    assert metrics.peak_memory_bytes > 0
    assert metrics.memory_kind == "process_peak_rss"
    if spec.mode == "train":
        assert math.isfinite(metrics.loss_first)
        assert math.isfinite(metrics.loss_last)
    else:
        assert metrics.loss_first is None and metrics.loss_last is None


class DropoutNet(nn.Module):
    """A model whose steps draw random numbers, like BERT and GPT-2 in train mode."""

    def __init__(self, p: float = 0.5) -> None:
        super().__init__()
        self.hidden = nn.Linear(16, 64)
        self.out = nn.Linear(64, 4)
        self.p = p

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.out(functional.dropout(torch.relu(self.hidden(x)), self.p, self.training))


def dropout_batch(sizes: Sizes, generator: torch.Generator) -> Batch:
    return {
        "x": torch.randn(sizes.batch_size, 16, generator=generator),
        "y": torch.randint(0, 4, (sizes.batch_size,), generator=generator),
    }


DROPOUT_SPEC = ModelSpec(
    name="mlp",
    description="dropout MLP (test only)",
    build=lambda sizes: DropoutNet(),
    make_batch=dropout_batch,
    loss=lambda model, batch: functional.cross_entropy(model(batch["x"]), batch["y"]),
    infer=lambda model, batch: model(batch["x"]),
)


# --- container images (the podman build and the Apptainer run) ---

# The Python 3.10 base that .ci/podman.sh builds from debootstrap.
CI_BASE_IMAGE = os.environ.get(
    "PTSPEED_CI_PYTHON_BASE_IMAGE", "localhost/ptspeed/debian-python3.10:bookworm"
)


def host_ca_bundle() -> str:
    """The CA bundle this machine's OpenSSL trusts (SSL_CERT_FILE first), for TLS in the build."""
    paths = ssl.get_default_verify_paths()
    for candidate in (os.environ.get(paths.openssl_cafile_env), paths.cafile):
        if candidate and Path(candidate).is_file():
            return str(Path(candidate).resolve())
    return ""


# --- a driver for Triton to link against ---


def fake_libcuda(directory: Path) -> Path:
    """``directory`` holding a libcuda.so.1 (with its soname) alone, as `apptainer exec --nv`
    may bind the driver: something to link ``-lcuda`` against. Skips without a C compiler."""
    compiler = shutil.which("cc")
    if compiler is None:
        pytest.skip("needs a C compiler")
    directory.mkdir(parents=True)
    source = directory.parent / "cuda.c"
    source.write_text("int cuInit(unsigned int flags) { return (int)flags; }\n")
    subprocess.run(
        [compiler, "-shared", "-fPIC", "-Wl,-soname,libcuda.so.1", str(source), "-o",
         str(directory / "libcuda.so.1")],
        check=True,
    )  # fmt: skip
    return directory
