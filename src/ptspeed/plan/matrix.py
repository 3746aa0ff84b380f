"""The benchmark matrix: a validated config turned into the list of cells to run.

The JSON Schema (workflow/schemas/config.schema.yaml) checks shapes and fills defaults;
this module checks what a schema cannot: cross-references (a comparison naming an
environment or variant that does not exist), models against the zoo or their sources, knob
strings, and sizes against each model's limits. Every problem is one line naming the key.
"""

from __future__ import annotations

import math
import shlex
from collections.abc import Container, Iterable, Iterator, Mapping
from dataclasses import asdict
from typing import Any

from ptspeed.cell.arguments import to_arguments
from ptspeed.cell.checks import check_cell
from ptspeed.cell.record import CellSpec
from ptspeed.cell.variants.knobs import parse_knobs
from ptspeed.errors import BadInput, ConfigError
from ptspeed.models import (
    REGISTRY,
    Sizes,
    accepted_references,
    check_sizes,
    parse_reference,
    shape_text,
    sizes_used,
)
from ptspeed.models.catalog import check_known
from ptspeed.plan.layout import Cell, configured_sizes, configured_table, size_label
from ptspeed.plan.platforms import configured_platforms

MINUTES_OF_SLACK = 5


def model_sizes(config: Mapping[str, Any], model: str, device_class: str) -> Sizes:
    """The sizes of the cells of ``model`` on ``device_class``."""
    sizes = configured_sizes(config, model, device_class)
    if sizes is None:
        raise ConfigError(f"models.{model}.{device_class}: no sizes for this device class")
    return Sizes(**sizes)


def check_config(config: Mapping[str, Any], device_class: str) -> None:
    """Raise :class:`ConfigError` for the first cross-reference or value that cannot work."""
    environments, variants = config["environments"], config["variants"]
    if not config["models"]:
        raise ConfigError("models: none given (name models, or suites of them)")
    for model in config["models"]:
        _check_model(config, model)
        try:
            check_sizes(
                model_reference(config, model),
                model_sizes(config, model, device_class),
                model_shape(config, model, device_class),
            )
        except BadInput as exc:
            raise ConfigError(f"models.{model}.{device_class}.{exc}") from None
    for name, knobs in variants.items():
        try:
            parse_knobs(knobs)
        except BadInput as exc:
            raise ConfigError(f"variants.{name}: {exc}") from None
    for name, comparison in config["comparisons"].items():
        for side in ("baseline", "candidate"):
            env, variant = comparison[side]["env"], comparison[side]["variant"]
            if env not in environments:
                raise ConfigError(
                    f"comparisons.{name}.{side}.env: {env!r} is not an environment "
                    f"(defined: {', '.join(environments)})"
                )
            if variant not in variants:
                raise ConfigError(
                    f"comparisons.{name}.{side}.variant: {variant!r} is not a variant "
                    f"(defined: {', '.join(variants)})"
                )
        if comparison["baseline"] == comparison["candidate"]:
            raise ConfigError(f"comparisons.{name}: baseline and candidate are the same")
    _check_environments(environments)
    _check_every_cell_runs(config, device_class)


def _check_model(config: Mapping[str, Any], model: str) -> None:
    """A zoo name, or a source that names something (where it can be looked up here: the
    family's library, the user's module in ``model_paths``)."""
    source = config["models"][model].get("source", "")
    if not source and model not in REGISTRY:
        raise ConfigError(
            f"models.{model}: unknown model (accepted: {accepted_references()}, the last four "
            "as a source of a name of your own)"
        )
    if not source:
        return
    try:
        check_known(parse_reference(source), config.get("model_paths", ()))
    except BadInput as exc:
        raise ConfigError(f"models.{model}.source: {exc}") from None


def model_reference(config: Mapping[str, Any], model: str) -> str:
    """What names ``model`` to :func:`ptspeed.models.get_model`: its source, else its name."""
    return str(config["models"][model].get("source") or model)


def model_shape(config: Mapping[str, Any], model: str, device_class: str) -> str:
    """The cell command's ``--shape`` of ``model`` on ``device_class`` ('' for none)."""
    table = configured_table(config, model, device_class) or {}
    return shape_text(table.get("shape", {}))


def _check_every_cell_runs(config: Mapping[str, Any], device_class: str) -> None:
    """Every cell passes the cell command's own input check, so that no accepted config ends
    in cells that exit with a usage error and write no record."""
    last_trial = config["trials"] - 1
    for cell in cells(config, device_class):
        if cell.trial != last_trial:
            continue
        try:
            check_cell(cell_spec(config, cell, device_class))
        except BadInput as exc:
            raise ConfigError(
                f"variants.{cell.variant} on models.{cell.model} ({cell.mode}, environment "
                f"{cell.env}): the cell command would refuse it: {exc}"
            ) from None


def cell_spec(
    config: Mapping[str, Any], cell: Cell, device_class: str, threads: int = 0
) -> CellSpec:
    """What the cell command of ``cell`` is asked to run (``threads``: its CPU threads)."""
    sizes = model_sizes(config, cell.model, device_class)
    steps = config["steps"]
    compiles = variant_compiles(config, cell.variant)
    return CellSpec(
        model=cell.model,
        source=config["models"][cell.model].get("source", ""),
        shape=model_shape(config, cell.model, device_class),
        variant=cell.variant,
        knobs=config["variants"][cell.variant],
        mode=cell.mode,
        batch_size=sizes.batch_size,
        image_size=sizes.image_size,
        seq_len=sizes.seq_len,
        env=cell.env,
        platform=cell.platform,
        trial=cell.trial,
        warmup_steps=steps["warmup"],
        measured_steps=steps["measured"],
        numerics_steps=steps["numerics"],
        # The trials of a cell run the same seeded computation: the first one's numerics gate
        # (about half a warm compiled trial's time on the CPU) stands for the later ones.
        numerics_by_first_trial=cell.trial > 0,
        device=device_class,
        threads=threads,
        timeout_s=config["timeout_s"],
        # A compiled cell's trials share its compiler cache: trial 0 compiles cold, the later
        # trials (which wait for it, rule cell) warm.
        compiler_cache=f"{config['results']}/cache/compiler/{cell.key}" if compiles else "",
        compiler_cache_cold=compiles and cell.trial == 0,
        # The first trial (and its reruns) alone runs a few profiled steps after its window.
        **profiled_steps(config, cell),
    )


def profiled_steps(config: Mapping[str, Any], cell: Cell) -> dict[str, Any]:
    """The profiling fields of ``cell``'s spec: its first trial profiles ``steps.profiled``
    steps and keeps the trace at ``<results>/traces/<cell key>.json.gz``; other trials none.
    A rerun of the first trial (trial ``trials``, ``2 × trials``, …: it ran perturbed) profiles
    again, over the same trace, so that the breakdown can come from a quiet trial."""
    first = cell.trial % config["trials"] == 0
    steps = config["steps"].get("profiled", 0) if first else 0
    if not steps:
        return {}
    return {"profile_steps": steps, "profile_trace": f"{config['results']}/{cell.trace}"}


def variant_compiles(config: Mapping[str, Any], variant: str) -> bool:
    """Whether the configured variant runs torch.compile (its cells get a compiler cache)."""
    return parse_knobs(config["variants"][variant]).compile_mode is not None


def cell_command_line(
    config: Mapping[str, Any], wildcards: Mapping[str, str], device_class: str, threads: int
) -> str:
    """The shell arguments (all but ``--out``) of ``python -m ptspeed cell`` in the workflow's
    job of ``wildcards``; ``threads``: the job's, which a CPU cell gives torch."""
    cell_threads = threads if device_class == "cpu" else 0
    spec = cell_spec(config, Cell.from_wildcards(wildcards), device_class, cell_threads)
    return shlex.join(to_arguments(spec, config["oom_retry"]))


def _check_environments(environments: Mapping[str, Any]) -> None:
    for name, env in environments.items():
        if env["kind"] == "venv" and not (env.get("requirements") and env.get("python")):
            raise ConfigError(f"environments.{name}: kind venv needs requirements and python")
        if env["kind"] == "container" and not env.get("container"):
            raise ConfigError(f"environments.{name}: kind container needs container")
        if env.get("image") and env["kind"] != "image":
            raise ConfigError(
                f"environments.{name}.image: only kind image takes an image (kind is {env['kind']})"
            )
        if env["kind"] == "image" and not env.get("image"):
            raise ConfigError(
                f"environments.{name}: kind image needs image (a .sif path, docker://…@sha256:…, "
                "oras://…@sha256:… or library://…:sha256.…)"
            )


def env_variant_pairs(config: Mapping[str, Any]) -> list[tuple[str, str]]:
    """The (environment, variant) pairs the comparisons need, in first-mentioned order."""
    pairs: dict[tuple[str, str], None] = {}
    for comparison in config["comparisons"].values():
        for side in ("baseline", "candidate"):
            pairs[(comparison[side]["env"], comparison[side]["variant"])] = None
    return list(pairs)


def cells(
    config: Mapping[str, Any],
    device_class: str,
    cannot_run: Container[tuple[str, str]] = (),
) -> Iterator[Cell]:
    """Every cell of the matrix, on every platform, but for the (platform, environment) pairs
    of ``cannot_run``. Trials are the outer loop, so that in order of listing the trials of
    baseline and candidate alternate instead of running back to back."""
    pairs = env_variant_pairs(config)
    platforms = [platform.name for platform in configured_platforms(config)]
    for trial in range(config["trials"]):
        for platform in platforms:
            for model in config["models"]:
                sizes = asdict(model_sizes(config, model, device_class))
                table = configured_table(config, model, device_class) or {}
                size = size_label(sizes, sizes_used(model, table))
                for mode in config["modes"]:
                    for env, variant in pairs:
                        if (platform, env) not in cannot_run:
                            yield Cell(env, model, variant, mode, size, trial, platform)


def trial_groups(planned: Iterable[Cell]) -> dict[Cell, tuple[str, Cell | None]]:
    """Cluster jobs of one node: the cells of one trial of one (platform, model, mode, size),
    every side of the comparisons there, form one group job, so that trial k of a baseline and
    of its candidate run back to back on the same node. Each cell with its group's name and
    the cell that runs just before it (None: the first). The order is the comparisons' (the
    baseline first) on even trials and the reverse on odd ones: neither side always runs
    first, on a node warmer or cooler than the other's."""
    groups: dict[str, list[Cell]] = {}
    for cell in planned:
        name = f"{cell.platform or 'cells'}.{cell.model}.{cell.mode}.{cell.size}.trial{cell.trial}"
        groups.setdefault(name, []).append(cell)
    chained: dict[Cell, tuple[str, Cell | None]] = {}
    for name, members in groups.items():
        order = members if members[0].trial % 2 == 0 else members[::-1]
        for before, cell in zip([None, *order[:-1]], order, strict=True):
            chained[cell] = (name, before)
    return chained


def runtime_minutes(config: Mapping[str, Any]) -> int:
    """The scheduler's time request of one cell: its own limit plus slack for start-up."""
    return math.ceil(config["timeout_s"] / 60) + MINUTES_OF_SLACK
