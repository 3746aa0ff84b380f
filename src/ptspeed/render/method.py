"""The report's sections on what ran and how: the environments as their records report them,
and the method (steps, trials, intervals, tests, tolerances, backend settings).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any

import pandas as pd

from ptspeed.analysis import late_numerics, ranks, stats
from ptspeed.analysis.columns import ALPHA, CONFIDENCE, RUNS_COLUMNS
from ptspeed.analysis.compare import Rule
from ptspeed.analysis.conditions import (
    MIN_PROBED_TRIALS,
    PROBE_SPREAD,
    PROBE_SPREAD_MULTIPLIER,
    settings,
)
from ptspeed.cell.measurement import probe_work
from ptspeed.cell.measurement.numerics import EAGER_ERROR_MULTIPLIER, TOLERANCES
from ptspeed.cell.measurement.telemetry import (
    NVML_ENERGY_MIN_WINDOW_S,
    NVML_ENERGY_STEP_S,
    NVML_POWER_AVERAGE_S,
)
from ptspeed.plan.schema import default_settings
from ptspeed.render.breakdown import PROFILING_METHOD
from ptspeed.render.comparison import rule_sentence
from ptspeed.render.formatting import (
    BLANK,
    format_int,
    format_text,
    is_blank,
    markdown_table,
    plural,
)
from ptspeed.render.page import Block, ReportInputs, Section
from ptspeed.render.tables import COMPILER_HEADER, Column, Row, Table, given, text

# The first column of the environments and method tables: what each row gives.
SETTING = Column("", given("name"))
METHOD_TABLE = [SETTING, Column("setting", given("value"), wrap=True)]

VERDICT_METHOD = (
    "consistent with the claim: the published speedup lies in the measured interval; below "
    "the claim: the whole interval lies below the published speedup (the speedup falls short "
    "of it); above the claim: the whole interval lies above it; not measured: the reason (a "
    "side without counted trials, none ok or all judged perturbed; a claim made on another "
    "device)"
)
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
    config = config_of(inputs)
    rows = _environment_rows(recorded.columns, groups, config.get("environments") or {})
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
            *platform_blocks(config, recorded),
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


def platform_blocks(config: Mapping[str, Any], recorded: pd.DataFrame) -> list[Block]:
    """What each platform can run: one row per environment, its GPU code, and per platform
    'runs' or why it cannot (from the plan; for a probed GPU, from its cells' records)."""
    plan = config.get("platform_plan") or {}
    platforms = [p for p in plan.get("platforms", []) if p.get("name")]
    if not platforms:
        return []
    cannot = {(row["platform"], row["env"]): row["reason"] for row in plan.get("cannot_run", [])}
    codes = plan.get("codes") or {}
    rows = []
    for env in config.get("environments") or {}:
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
    recorded: pd.Index, groups: Mapping[str, pd.DataFrame], configured: Mapping[str, Any]
) -> dict[str, dict[str, str]]:
    """Each row's label and its value per environment (the records' distinct values)."""
    fields = {
        label: {env: _distinct(group[column]) for env, group in groups.items()}
        for label, column in ENVIRONMENT_FIELDS.items()
        if column in recorded
    }
    return {
        "kind": {env: _kind(configured.get(env) or {}) for env in groups},
        "records": {env: str(len(group)) for env, group in groups.items()},
        # Backend settings only where some record states them (older records lack them).
        **{
            label: values
            for label, values in fields.items()
            if label not in BACKEND_SETTINGS or set(values.values()) != {BLANK}
        },
    }


def _kind(spec: Mapping[str, Any]) -> str:
    """How an environment was realised; an image a site brings, with its reference."""
    if spec.get("kind") == "image":
        return f"brought: {spec.get('image')}"
    return format_text(spec.get("kind"))


def _of_env(env: str) -> Callable[[Row], str]:
    return lambda row: row["by_env"][env]


def _distinct(values: pd.Series) -> str:
    texts = [format_int(v) if isinstance(v, float) else str(v) for v in values if not is_blank(v)]
    return ", ".join(dict.fromkeys(texts)) or BLANK


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


def config_of(inputs: ReportInputs) -> Mapping[str, Any]:
    """The run's config as this section's rules read it: its settings as plain data."""
    return inputs.settings.to_mapping()


def method_section(inputs: ReportInputs) -> Section:
    config = config_of(inputs)
    steps = config.get("steps") if isinstance(config.get("steps"), Mapping) else {}
    tolerances = ", ".join(f"{name} {value:.0%}" for name, value in TOLERANCES.items())
    pairs = [
        ["device class", format_text(config.get("device"))],
        ["trials per cell", f"{format_text(config.get('trials'))}, each its own process"],
        ["warm-up steps", f"{format_text(steps.get('warmup'))} (the first holds compilation)"],
        ["measured steps", format_text(steps.get("measured"))],
        ["numerics steps", f"{format_text(steps.get('numerics'))} leading steps checked"],
        ["cell timeout", f"{format_text(config.get('timeout_s'))} s"],
        ["throughput", "batch size × measured steps / their wall time, one value per trial"],
        [
            "sizes",
            "a cell's batch size and the sizes its model uses (image side, sequence length); a "
            "size the model does not use is blank in the tables",
        ],
        [
            "n",
            "the ok trials a value comes from; a speedup's, the trials it counts (not those "
            "judged perturbed, see perturbed trials): where a side counts fewer than the "
            "configured trials, how many and why stand beside the speedup",
        ],
        [
            "median interval",
            f"distribution-free order-statistic (binomial) interval of the median, "
            f"{CONFIDENCE:.0%} requested; with 5 trials or fewer it is the range, shown with "
            "its actual coverage",
        ],
        [
            "speedup",
            "Hodges–Lehmann shift of log throughput (candidate − baseline), exponentiated: the "
            "median of the candidate / baseline ratios of all trial pairs",
        ],
        ["speedup interval", _speedup_interval_method(config)],
        ["significance", _significance_method(config)],
        ["cv", "standard deviation / mean of a cell's ok throughputs"],
        [
            "noisy",
            f"cv > {stats.NOISE_CV:.0%} or median interval half-width > "
            f"{stats.NOISE_RELATIVE_HALF_WIDTH:.0%} of the median",
        ],
        [
            "compile time",
            "a cell's median first step beyond the median first step of the same environment's "
            "eager cell (cold and warm compiler caches apart where the records say which)",
        ],
        [
            COMPILER_HEADER,
            "graphs torch.compile compiled, its graph breaks and recompilations: medians over "
            "the ok trials; in the seed table baseline → candidate where both compiled",
        ],
        [
            "energy",
            "energy of each trial's measured window, its counters read where the window's "
            "clock starts and stops (the GPU's energy counter through NVML, summed over "
            "ranks; the CPU packages' RAPL counters on the CPU), over the samples it "
            "processed: the median over the ok trials with its interval. NVML's counter moves "
            f"in steps of about {NVML_ENERGY_STEP_S:g} s, so a window shorter than "
            f"{NVML_ENERGY_MIN_WINDOW_S:g} s has no energy (it says why); its power reading "
            f"averages over {NVML_POWER_AVERAGE_S:g} s, so a window's mean power is its energy "
            "over its length, and a shorter window has no maximum power",
        ],
        ["verdict", VERDICT_METHOD],
        [
            "numerics tolerance",
            "loss, gradients and update (train) or output (infer) of the first steps after the "
            "knob's one-off work, each against an eager fp64 step from the same snapshot "
            f"(relative error): tolerances {tolerances}; allowed = max(tolerance, "
            f"{EAGER_ERROR_MULTIPLIER:g} × eager's own error at that precision, 3 × how far eager "
            "moves when its weights move by one fp32 rounding unit and, for compiled and "
            "graph-captured variants, its dropout masks change); run in each cell's first "
            "trial, whose verdict its later trials and reruns (the same seeded computation) "
            "take",
        ],
        ["late numerics check", _late_check_method()],
        [
            "stale record",
            "a record of another cell than the configuration asks for (e.g. left by an older "
            "configuration): listed with the failures, not counted",
        ],
        [
            "retried at half the batch",
            "a trial that ran out of memory runs again at half the batch size (oom_retry); it "
            "is summarised at the batch size it ran, and a speedup pairs only cells of one "
            "batch size",
        ],
        ["perturbed trials", _perturbed_method(config)],
        [
            "GPU code",
            "a build runs on a GPU where it carries a cubin of the GPU's major version at or "
            "below its minor version, or PTX at or below its capability (CUDA's rule); a run on "
            "several platforms submits each cell only where it can run",
        ],
        ["where the time went", PROFILING_METHOD],
        [
            "trials on a cluster",
            "under SLURM each trial of a model's comparisons is one job: its sides back to back "
            "on one node, the baseline first on even trials and last on odd ones; the seed table "
            "names the nodes and any trial whose sides ran on different nodes (a rerun runs on "
            "its own). The interval stays the unpaired one above, not a paired (signed-rank) "
            "interval of each trial's ratio: the pairing keeps node-to-node differences out of "
            "each side's comparison, and the unpaired interval, which does not rely on it, is "
            "the wider and holds for reruns and runs on one machine alike",
        ],
        [
            "against an earlier run",
            "scripts/compare.py's rule (compare.earlier): per cell the Hodges–Lehmann ratio new "
            "/ old with its exact interval, and per environment the machine's ratio from the "
            f"probes of the same trials; {rule_sentence(Rule.of(config))}",
        ],
        ["TF32 and cudnn.benchmark", _backend_settings(inputs.runs)],
    ]
    rows = [{"name": name, "value": value} for name, value in pairs]
    return Section(
        id="method",
        title="Method",
        intro="How the numbers above were made.",
        blocks=[Block(table=Table.of(METHOD_TABLE, rows))],
    )


def _configured_trials(config: Mapping[str, Any]) -> int | None:
    trials = config.get("trials")
    return trials if isinstance(trials, int) and not isinstance(trials, bool) and trials else None


def _speedup_interval_method(config: Mapping[str, Any]) -> str:
    needed = ranks.trials_for_confidence(CONFIDENCE)
    text = (
        "exact distribution-free (Moses) interval of that shift, the inversion of the "
        "Mann–Whitney test: from the k-th smallest to the k-th largest pairwise ratio, k the "
        f"largest rank whose exact coverage 1 − 2 P(U ≤ k − 1) reaches {CONFIDENCE:.0%}; "
        f"{needed} ok trials a side reach {CONFIDENCE:.0%}; with fewer the widest interval (all "
        "pairs) is shown with the confidence it has. Exact when both sides' noise has one shape "
        "(a shift of log throughput); it covers somewhat less where their spreads differ widely"
    )
    trials = _configured_trials(config)
    if trials is None or trials < 2:
        return text
    _, achieved = ranks.shift_interval_rank(trials, trials, CONFIDENCE)
    return text + f"; this run's {trials} trials a side give {achieved:.1%}"


def _significance_method(config: Mapping[str, Any]) -> str:
    text = (
        "two-sided Mann–Whitney U test (exact; the normal approximation with tie correction "
        f"where trials tie); significant when p < {ALPHA:g} and the interval excludes 1"
    )
    trials = _configured_trials(config)
    if trials is None:
        return text
    floor = ranks.smallest_p_value(trials, trials)
    text += (
        f"; with {trials} trials a side p cannot fall below 2 / C({2 * trials}, {trials}) "
        f"= {floor:.2g}"
    )
    return text + (", so no difference can be significant" if floor >= ALPHA else "")


def _late_check_method() -> str:
    bounds = late_numerics.LATE_TOLERANCES.items()
    tolerances = ", ".join(f"{name} {value:.1%}" for name, value in bounds)
    return (
        "each train-mode variant's loss at eager's last step (the configured warm-up and "
        "measured steps, whatever warm-up the variant needed) against the same environment's "
        "eager cell (same model, sizes and seed: the same seeded trajectory); relative error "
        f"allowed: the largest of the precision's bound ({tolerances}), "
        f"{late_numerics.EAGER_SPREAD_MULTIPLIER:g} × the eager trials' own spread and the "
        "loss's bound in the trial's own numerics gate; models with batch norm are not checked "
        f"({late_numerics.BATCH_NORM_DRIFT}); a non-finite loss always fails; a failing trial "
        "becomes numerics_mismatch and leaves the statistics"
    )


def _perturbed_method(config: Mapping[str, Any]) -> str:
    """The rules that judge a trial perturbed, with this run's thresholds."""
    rules = settings(config)
    throttles = ", ".join(rules["throttle_reasons"]) or "none"
    fate = (
        "kept in the speedups (conditions.keep_perturbed)"
        if rules["keep_perturbed"]
        else "left out of the speedups (and their n)"
    )
    return (
        "each ok trial's conditions, sampled at its measured window's start and end (never "
        "inside it), judged when the tables are made: perturbed when other processes took more "
        f"than {rules['max_other_cpu_share']:.0%} of its CPUs' time over the window (/proc/stat's "
        "non-idle time of those CPUs minus the CPU time of the cell's own processes) or left it "
        f"less than {rules['min_cpu_left_ratio']:.0%} of the CPU share they left the run's median "
        f"trial; when the hypervisor took more than {rules['max_steal_share']:.1%} of its CPUs' "
        f"time (steal; windows under {rules['min_window_s']:g} s are too short to judge by CPU "
        "time); when the highest CPU or GPU "
        f"SM clock seen was below {rules['min_clock_fraction']:.0%} of its maximum; when a GPU "
        f"throttle reason was active ({throttles}); when more than "
        f"{rules['max_other_gpu_processes']} other process(es) used its GPU; when GradScaler "
        "skipped optimizer steps inside the window (fp16 overflow: steps without an update, "
        f"faster than real ones); or by the machine-speed probe: {_probe_method(rules)}. A "
        f"perturbed trial stays in runs and the cell statistics, marked, and is {fate}. Once "
        "every trial has run, each perturbed one runs again as a new record (trial number + "
        "trials), and a rerun judged perturbed again runs again, up to "
        f"{plural(rules['reruns'], 'time')} (conditions.reruns), unless every rule that flagged "
        "it also flagged the attempt it repeats (a rule that flags a trial however often it "
        "runs describes the rule or a machine that stays so, not a passing load: the report "
        "says how many stopped so). One judgement: the trials of each round are judged against "
        "the median trial of the rounds up to theirs, when their reruns are decided and again, "
        "identically, in the tables, which count exactly the trials the reruns left"
    )


def _probe_method(rules: Mapping[str, Any]) -> str:
    """The probe rule with this run's threshold, and what the default rests on."""
    limit = float(rules["max_probe_deviation"])
    default = float(settings(None)["max_probe_deviation"])
    measured = PROBE_SPREAD
    text = (
        f"just before and just after the window each trial times a fixed work ({probe_work.WORK}); "
        f"the trial is perturbed when both ends lie more than {limit:.0%} off the median of its "
        "like probes in the same direction (like: the same environment and build, platform, "
        f"device and threads; at least {MIN_PROBED_TRIALS} trials probed), or "
        f"{PROBE_SPREAD_MULTIPLIER:g} × those probes' own robust spread where that is wider (a "
        "build or machine noisier than the one measured). "
    )
    if measured.trials:
        text += (
            f"On {measured.machine} ({measured.build}, {measured.threads} thread(s), "
            f"{measured.load}) the ends of {measured.trials} trials' probes lay within "
            f"±{measured.largest:.0%} of their median (robust spread {measured.spread:.1%}); "
            f"the default, {default:.0%}, is {default / measured.largest:.1f} times that"
        )
    return text


def _backend_settings(runs: pd.DataFrame) -> str:
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
    if not parts:
        return "not recorded by these records (older cells); see each column's torch defaults"
    return (
        "each column ran with the settings its records state (also in Environments): "
        + "; ".join(parts)
    )
