"""Golden tables: the committed records of tests/fixtures/golden give the committed CSVs.

The records (``records/<env>/<model>/<variant>/<mode>/<size>/trial<N>.json``, the workflow's
layout) cover every status aggregation tells apart: ok trials, a failed and an unsupported
one, a stale record (its path names batch 8, it holds 16), a listed path with no file, a file
that is not JSON, and a trial whose late loss strays from its eager cell (numerics_mismatch);
two environments, three models, a comparison with a published claim (with a model the matrix
does not run) and one without. workflow/scripts/aggregate.py reads them as the workflow's aggregate
rule does, and its four CSVs must equal the expected ones beside the records: every column
is deterministic (no resampling), so the comparison is exact.

The expected tables were written by the aggregation code as it stood before a refactor; a
change that means to alter the tables regenerates them, from the repository root, with
``python tests/test_aggregate_golden.py`` (records and tables both) and commits the diff.
"""

from __future__ import annotations

import dataclasses
import os
import shutil
import sys
from pathlib import Path
from typing import Any

import pandas as pd
import pytest
import yaml
from helpers import CLAIMS, CONFIG, ROOT, make_record, run_aggregate_script

from ptspeed.analysis.columns import read_table
from ptspeed.cell.record import Record, write_record

GOLDEN = Path("tests/fixtures/golden")  # relative to ROOT, so record_path reads the same anywhere
EXPECTED = GOLDEN / "expected"
TABLES = ("runs", "summary", "speedups", "steps")
GOLDEN_CLAIMS: dict[str, Any] = {
    "pytorch-2.0-upgrade": {
        **CLAIMS["pytorch-2.0-upgrade"],
        "device": "A100",
        "precision": "fp32",
        "models": {
            **CLAIMS["pytorch-2.0-upgrade"]["models"],
            "bert-base": {"baseline": 10, "candidate": 16, "speedup": 1.6},
            "vit": {"speedup": 1.3},  # not in the matrix: a row saying so
        },
    }
}
LABELS = {"resnet50": "b8-i96", "bert-base": "b4-s64", "gpt2": "b2-s64"}

# (env, model, variant, trial, status, samples/s, last loss, compiler cache, reason)
CELLS = [
    ("torch-1.13", "resnet50", "eager", 0, "ok", 100.0, 6.9, "", ""),
    ("torch-1.13", "resnet50", "eager", 1, "ok", 120.0, 6.9, "", ""),
    ("torch-1.13", "resnet50", "eager", 2, "ok", 110.0, 6.9, "", ""),
    ("torch-1.13", "resnet50", "eager", 3, "ok", 105.0, 6.9, "", ""),
    ("torch-2.0", "resnet50", "compile", 0, "ok", 150.0, 6.95, "cold", ""),
    ("torch-2.0", "resnet50", "compile", 1, "ok", 180.0, 7.0, "warm", ""),
    ("torch-2.0", "resnet50", "compile", 2, "failed", None, None, "", "RuntimeError: boom"),
    ("torch-2.0", "resnet50", "compile", 3, "ok", 170.0, 7.1, "warm", ""),
    ("torch-2.0", "resnet50", "eager", 0, "ok", 132.0, 7.0, "", ""),
    ("torch-2.0", "resnet50", "eager", 1, "ok", 132.0, 7.0, "", ""),
    ("torch-1.13", "bert-base", "eager", 0, "ok", 10.0, 2.0, "", ""),
    ("torch-1.13", "bert-base", "eager", 1, "ok", 12.0, 2.0, "", ""),
    ("torch-2.0", "bert-base", "eager", 0, "ok", 14.0, 2.0, "", ""),
    ("torch-2.0", "bert-base", "compile", 0, "ok", 22.0, 2.01, "cold", ""),
    ("torch-2.0", "bert-base", "compile", 1, "ok", 24.0, 2.5, "warm", ""),  # strays: mismatch
    ("torch-1.13", "gpt2", "eager", 0, "ok", 40.0, 3.0, "", ""),
    ("torch-2.0", "gpt2", "compile", 0, "unsupported", None, None, "", "needs torch>=2.0 | fake"),
]
# What the compiler did in compiled trials: (graphs, graph breaks, recompilations, reasons).
# resnet50's failed trial 2 and bert-base's mismatched trial 1 must stay out of the medians.
COMPILER = {
    ("resnet50", 0): (1, 0, 0, []),
    ("resnet50", 1): (2, 1, 0, ["Unsupported: builtin print"]),
    ("resnet50", 2): (9, 9, 9, ["a failed trial's break"]),
    ("resnet50", 3): (2, 1, 1, ["Unsupported: builtin print", "data-dependent Tensor.item()"]),
    ("bert-base", 0): (3, 2, 0, ["attention mask: dynamic shape", "Unsupported: builtin print"]),
    ("bert-base", 1): (4, 3, 1, ["a mismatched trial's break"]),
}
STALE = ("torch-2.0", "resnet50", "eager", 2)  # holds batch 16 where its path names 8
MISSING = ("torch-2.0", "resnet50", "eager", 3)
CORRUPT = ("torch-2.0", "gpt2", "compile", 1)


def record_path(env: str, model: str, variant: str, trial: int) -> Path:
    cell = Path(env, model, variant, "train", LABELS[model])
    return GOLDEN / "records" / cell / f"trial{trial}.json"


def golden_record(cell: tuple[Any, ...]) -> Record:
    env, model, variant, trial, status, rate, loss, cache, reason = cell
    record = make_record(env, model, variant, trial, status, rate, reason)
    late_step = record.cell.warmup_steps + record.cell.measured_steps if loss else None
    metrics = dataclasses.replace(
        record.metrics,
        loss_last=loss,
        late_loss=loss,
        late_loss_step=late_step,
        compiler_cache=cache,
    )
    if variant == "compile" and (model, trial) in COMPILER:
        graphs, breaks, recompilations, reasons = COMPILER[(model, trial)]
        metrics = dataclasses.replace(
            metrics,
            compiled_graphs=graphs,
            graph_breaks=breaks,
            recompilations=recompilations,
            graph_break_reasons=reasons,
        )
    return dataclasses.replace(record, metrics=metrics)


def listed_paths() -> list[Path]:
    """Every path the run lists, in the order the tables keep."""
    places = [cell[:4] for cell in CELLS[:10]] + [STALE, MISSING] + [c[:4] for c in CELLS[10:]]
    return [record_path(*place) for place in [*places, CORRUPT]]


def write_golden_records() -> None:
    """The record files, the config and claims, and the list of record paths (run from ROOT)."""
    shutil.rmtree(GOLDEN / "records", ignore_errors=True)
    for cell in CELLS:
        write_record(golden_record(cell), record_path(*cell[:4]))
    stale = make_record(*STALE, "ok", 125.0, batch_size=16)
    write_record(stale, record_path(*STALE))
    record_path(*CORRUPT).write_text('{"cell": {"model": "gp', encoding="utf-8")
    for name, data in (("config", CONFIG), ("claims", GOLDEN_CLAIMS)):
        text = yaml.safe_dump(data, allow_unicode=True, sort_keys=False)
        (GOLDEN / f"{name}.yaml").write_text(text, encoding="utf-8")
    listing = "".join(f"{path}\n" for path in listed_paths())
    (GOLDEN / "records.txt").write_text(listing, encoding="utf-8")


def aggregate(out_dir: Path) -> None:
    """workflow/scripts/aggregate.py on the golden inputs, as the workflow's aggregate rule runs
    it."""
    result = run_aggregate_script(
        "--config", str(GOLDEN / "config.yaml"), "--claims", str(GOLDEN / "claims.yaml"),
        "--records-from", str(GOLDEN / "records.txt"), "--out-dir", str(out_dir),
    )  # fmt: skip
    assert result.returncode == 0, result.stderr


@pytest.fixture(scope="module")
def tables(tmp_path_factory: pytest.TempPathFactory) -> Path:
    out_dir = tmp_path_factory.mktemp("golden") / "tables"
    aggregate(out_dir)
    return out_dir


def test_golden_inputs_cover_every_status() -> None:
    runs = read_table(ROOT / EXPECTED / "runs.csv")
    assert set(runs["status"]) == {
        *("ok", "failed", "unsupported", "numerics_mismatch"),
        *("stale", "missing", "unreadable"),
    }
    assert set(runs["env"].dropna()) == {"torch-1.13", "torch-2.0"}
    speedups = read_table(ROOT / EXPECTED / "speedups.csv")
    assert "consistent with the claim" in set(speedups["verdict"])


@pytest.mark.slow
@pytest.mark.parametrize("name", TABLES)
def test_the_same_records_give_the_same_table(tables: Path, name: str) -> None:
    expected = ROOT / EXPECTED / f"{name}.csv"
    pd.testing.assert_frame_equal(read_table(tables / f"{name}.csv"), read_table(expected))
    actual_text = (tables / f"{name}.csv").read_text(encoding="utf-8")
    assert actual_text == expected.read_text(encoding="utf-8")


def main() -> int:
    """Rewrite the golden records and expected tables with the code as it stands."""
    os.chdir(ROOT)
    write_golden_records()
    aggregate(EXPECTED)
    return 0


if __name__ == "__main__":
    sys.exit(main())
