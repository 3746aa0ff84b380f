"""The report's sections on what ran and how: the environments as their records report them,
and the method (steps, trials, intervals, tests, tolerances, backend settings).

The method's text is report/templates/method.md.j2; every number in it is injected here from the
constant the code applies (:func:`code_constants`, read from its module when the text is made) or
from the run's settings (:func:`run_settings`, the one place this module reads them).
"""

from __future__ import annotations

import re
from collections.abc import Callable, Mapping
from typing import Any

import pandas as pd

from ptspeed.analysis import change_verdict, columns, conditions, late_numerics, ranks, stats
from ptspeed.analysis.columns import RUNS_COLUMNS
from ptspeed.cell.measurement import breakdown, numerics, probe_work, telemetry
from ptspeed.plan.schema import default_settings
from ptspeed.plan.settings import Environment, Settings
from ptspeed.render.comparison import rule_sentence
from ptspeed.render.formatting import (
    BLANK,
    format_int,
    format_text,
    is_blank,
    markdown_table,
)
from ptspeed.render.page import Block, ReportInputs, Section
from ptspeed.render.tables import COMPILER_HEADER, Column, Row, Table, given, text
from ptspeed.render.templates import template_environment

# The first column of the environments and method tables: what each row gives.
SETTING = Column("", given("name"))
METHOD_TABLE = [SETTING, Column("setting", given("value"), wrap=True)]

BACKEND_SETTINGS = {
    "TF32 matmul": "tf32_matmul",
    "TF32 cuDNN": "tf32_cudnn",
    "cudnn.benchmark": "cudnn_benchmark",
    "float32 matmul precision": "float32_matmul_precision",
}


ENVIRONMENT_FIELDS = {
    "torch": "torch",
    "torchvision": "torchvision",
    "transformers": "transformers",
    "CUDA": "cuda",
    "cuDNN": "cudnn",
    "GPU": "gpu",
    **BACKEND_SETTINGS,
    "driver": "gpu_driver",
    "CPU": "cpu_model",
    "logical CPUs": "cpu_count",
    "threads": "torch_threads",
    "Python": "python",
    "container": "container_image",
    "container digest": "container_digest",
    "git commit": "git_commit",
    "host": "hostname",
}


def environments_section(inputs: ReportInputs) -> Section:
    runs = inputs.runs
    recorded = runs[~runs["status"].isin(["missing", "unreadable"]) & runs["env"].notna()]
    recorded = recorded.assign(gpu=recorded["device_name"].where(recorded["device_index"].notna()))
    groups = {env: recorded[recorded["env"] == env] for env in sorted(recorded["env"].unique())}
    settings = inputs.settings
    rows = _environment_rows(recorded.columns, groups, settings.environments)
    columns = [SETTING, *(Column(env, _of_env(env), wrap=True) for env in groups)]
    records = [{"name": name, "by_env": values} for name, values in rows.items()]
    return Section(
        id="environments",
        title="Environments",
        intro=(
            "What each environment was, as its records report it (several values: the records "
            "disagree; GPU blank on the CPU), with the backend settings they state."
        ),
        blocks=[
            *platform_blocks(settings, recorded),
            Block(table=Table.of(columns, records if groups else [])),
            *source_blocks(recorded),
        ],
    )


SOURCE_TABLE = [
    Column("model", text("model")),
    Column("source", text("source")),
    Column("shape", text("shape"), wrap=True),
]


def source_blocks(recorded: pd.DataFrame) -> list[Block]:
    """Where each model not of ptspeed's zoo came from, and the shape it was built at, as its
    records say (none for a run of the zoo's models alone)."""
    if recorded.empty or not {"source", "shape"} <= set(recorded.columns):
        return []
    sourced = recorded[~recorded["source"].map(is_blank).astype(bool)]
    rows = sourced[["model", "source", "shape"]].drop_duplicates().to_dict("records")
    if not rows:
        return []
    note = "Built from their libraries' code with random weights, or from the user's module."
    return [Block(heading="Models by source", note=note, table=Table.of(SOURCE_TABLE, rows))]


def platform_blocks(settings: Settings, recorded: pd.DataFrame) -> list[Block]:
    """What each platform can run: one row per environment, its GPU code, and per platform
    'runs' or why it cannot (from the plan; for a probed GPU, from its cells' records)."""
    plan = settings.platform_plan
    platforms = [p for p in plan.get("platforms", []) if p.get("name")]
    if not platforms:
        return []
    cannot = {(row["platform"], row["env"]): row["reason"] for row in plan.get("cannot_run", [])}
    codes = plan.get("codes") or {}
    rows = []
    for env in settings.environments:
        row = {"env": env, "code": _code_label(codes.get(env))}
        for platform in platforms:
            name = platform["name"]
            reason = cannot.get((name, env))
            row[name] = f"cannot: {reason}" if reason else _probed(recorded, name, env, platform)
        rows.append(row)
    columns = [
        Column("environment", given("env")),
        Column("GPU code it carries", given("code"), wrap=True),
        *(Column(f"{p['name']}: {p['gpu_label']}", given(p["name"]), wrap=True) for p in platforms),
    ]
    note = (
        "Cells a platform's GPU cannot run (rule: Method, GPU code) were not submitted there; a "
        f"probed platform's cells check on arrival. {_platform_devices(recorded, platforms)}"
    )
    return [Block(table=Table.of(columns, rows), heading="What each platform can run", note=note)]


def _platform_devices(recorded: pd.DataFrame, platforms: list[Mapping[str, Any]]) -> str:
    """The device each platform's cells ran on, as their records say: 'Device: a100 cuda.'"""
    if not {"platform", "device"} <= set(recorded.columns):
        return ""
    devices = (
        f"{p['name']} {_distinct(recorded.loc[recorded['platform'] == p['name'], 'device'])}"
        for p in platforms
    )
    return f"Device of each platform's cells: {'; '.join(devices)}."


def _code_label(code: Mapping[str, Any] | None) -> str:
    if not code:
        return "unknown (checked by each cell)"
    flags = code.get("arch_flags") or "none (CPU-only build)"
    cuda = code.get("cuda_version")
    return f"torch {code.get('torch_version')}" + (f", CUDA {cuda}" if cuda else "") + f": {flags}"


def _probed(recorded: pd.DataFrame, platform: str, env: str, declared: Mapping[str, Any]) -> str:
    """'runs' where the plan knew the GPU; for a probed one, what its records found."""
    if declared.get("capability") is not None:
        return "runs"
    if "platform" not in recorded.columns:
        return "not yet run"
    cells = recorded[(recorded["platform"] == platform) & (recorded["env"] == env)]
    refused = cells[cells["reason"].astype(str).str.contains("has no code for", regex=False)]
    if len(refused):
        return f"cannot: {refused['reason'].iloc[0]}"
    ran = cells[cells["status"] == "ok"]
    return f"runs on {_distinct(ran['device_name'])}" if len(ran) else "not yet run"


def _environment_rows(
    recorded: pd.Index, groups: Mapping[str, pd.DataFrame], configured: Mapping[str, Environment]
) -> dict[str, dict[str, str]]:
    """Each row's label and its value per environment (the records' distinct values)."""
    fields = {
        label: {env: _distinct(group[column]) for env, group in groups.items()}
        for label, column in ENVIRONMENT_FIELDS.items()
        if column in recorded
    }
    return {
        "kind": {env: _kind(configured.get(env)) for env in groups},
        "records": {env: str(len(group)) for env, group in groups.items()},
        # Backend settings only where some record states them (older records lack them).
        **{
            label: values
            for label, values in fields.items()
            if label not in BACKEND_SETTINGS or set(values.values()) != {BLANK}
        },
    }


def _kind(spec: Environment | None) -> str:
    """How an environment was realised; an image a site brings, with its reference."""
    if spec is None:
        return format_text(None)
    if spec.kind == "image":
        return f"brought: {spec.image}"
    return format_text(spec.kind)


def _of_env(env: str) -> Callable[[Row], str]:
    return lambda row: row["by_env"][env]


def _distinct(values: pd.Series) -> str:
    texts = [format_int(v) if isinstance(v, float) else str(v) for v in values if not is_blank(v)]
    return ", ".join(dict.fromkeys(texts)) or BLANK


METHOD_TEMPLATE = "method.md.j2"
METHOD_RULES_HEADER = """# The method's rules and their parameters

Generated by `python3 scripts/docs.py` from the report's Method section (`ptspeed.render.method`)
at the default config (`config/config.yaml`), so every number is the one the code applies; do
not edit by hand. A report states the same rules at its own run's config.
"""


def method_rules() -> str:
    """The Method section at the default config, as the guide's Markdown page."""
    runs, empty = pd.DataFrame(columns=RUNS_COLUMNS), pd.DataFrame()
    section = method_section(ReportInputs(runs, empty, empty, default_settings(), claims={}))
    tables = [
        markdown_table(["", "how"], [[str(cell) for cell in row] for row in block.table.rows])
        for block in section.blocks
        if block.table is not None
    ]
    return "\n".join([METHOD_RULES_HEADER, *tables])


def method_section(inputs: ReportInputs) -> Section:
    """How the numbers were made: report/templates/method.md.j2 with the code's constants, the
    run's configuration and what its records state."""
    rendered = (
        template_environment()
        .get_template(METHOD_TEMPLATE)
        .render(
            code=code_constants(),
            run=run_settings(inputs.settings),
            records={"backend_settings": _backend_settings(inputs.runs)},
        )
    )
    return Section(
        id="method",
        title="Method",
        intro="How the numbers above were made.",
        blocks=[Block(table=Table.of(METHOD_TABLE, method_rows(rendered)))],
    )


def method_rows(text: str) -> list[dict[str, str]]:
    """The rendered template's rows: a "## name" line starts one, the lines up to the next are
    its text (folded into one line)."""
    chunks = re.split(r"^## ", text, flags=re.MULTILINE)[1:]
    rows = []
    for chunk in chunks:
        name, _, value = chunk.partition("\n")
        rows.append({"name": name.strip(), "value": " ".join(value.split())})
    return rows


def code_constants() -> dict[str, Any]:
    """The constants the code applies, read from their modules when the text is made."""
    return {
        "confidence": columns.CONFIDENCE,
        "alpha": columns.ALPHA,
        "range_only_trials": stats.trials_with_range_interval(columns.CONFIDENCE),
        "trials_for_confidence": ranks.trials_for_confidence(columns.CONFIDENCE),
        "noise_cv": stats.NOISE_CV,
        "noise_half_width": stats.NOISE_RELATIVE_HALF_WIDTH,
        "compiler_header": COMPILER_HEADER,
        "nvml_energy_step_s": telemetry.NVML_ENERGY_STEP_S,
        "nvml_energy_min_window_s": telemetry.NVML_ENERGY_MIN_WINDOW_S,
        "nvml_power_average_s": telemetry.NVML_POWER_AVERAGE_S,
        "numerics_tolerances": numerics.TOLERANCES,
        "eager_error_multiplier": numerics.EAGER_ERROR_MULTIPLIER,
        "spread_error_multiplier": numerics.SPREAD_ERROR_MULTIPLIER,
        "late_tolerances": late_numerics.LATE_TOLERANCES,
        "eager_spread_multiplier": late_numerics.EAGER_SPREAD_MULTIPLIER,
        "batch_norm_drift": late_numerics.BATCH_NORM_DRIFT,
        "probe_work": probe_work.WORK,
        "min_probed_trials": conditions.MIN_PROBED_TRIALS,
        "probe_spread_multiplier": conditions.PROBE_SPREAD_MULTIPLIER,
        "probe_spread": conditions.PROBE_SPREAD,
        "default_probe_deviation": default_settings().conditions.max_probe_deviation,
        "breakdown_sum_tolerance": breakdown.SUM_TOLERANCE,
    }


def run_settings(settings: Settings) -> dict[str, Any]:
    """What the Method section reads of a run's settings, with what its trials can reach."""
    trials = settings.trials
    counted = trials or 0
    return {
        "device": settings.device,
        "trials": trials,
        "warmup": settings.steps.warmup,
        "measured": settings.steps.measured,
        "numerics": settings.steps.numerics,
        "timeout_s": settings.timeout_s,
        "conditions": settings.conditions.to_mapping(),
        "compare_rule": rule_sentence(change_verdict.Rule.of(settings)),
        "pairs_coverage": (
            ranks.shift_interval_rank(counted, counted, columns.CONFIDENCE)[1]
            if counted >= 2
            else None
        ),
        "smallest_p": ranks.smallest_p_value(counted, counted) if counted >= 1 else None,
    }


def _backend_settings(runs: pd.DataFrame) -> list[str]:
    """What each environment's records say it ran with, e.g. ``"torch-2.0: TF32 matmul
    False, …"``; these settings are what each column's numbers were made with."""
    present = [c for c in BACKEND_SETTINGS.values() if c in runs.columns]
    recorded = runs[runs["env"].notna()]
    parts = []
    for env in sorted(recorded["env"].unique()):
        group = recorded[recorded["env"] == env]
        settings = [
            f"{label} {_distinct(group[column])}"
            for label, column in BACKEND_SETTINGS.items()
            if column in present and _distinct(group[column]) != BLANK
        ]
        if settings:
            parts.append(f"{env}: " + ", ".join(settings))
    return parts
