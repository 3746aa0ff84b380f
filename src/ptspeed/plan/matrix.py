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
from ptspeed.plan.layout import Cell, configured_sizes, size_label
from ptspeed.plan.platforms import configured_platforms
from ptspeed.plan.settings import Comparison, Environment, Settings

MINUTES_OF_SLACK = 5


def model_sizes(settings: Settings, model: str) -> Sizes:
    """The sizes of the cells of ``model`` on the settings' device class."""
    sizes = configured_sizes(settings, model, settings.device)
    if sizes is None:
        raise ConfigError(f"models.{model}.{settings.device}: no sizes for this device class")
    return Sizes(**sizes)


def check_config(settings: Settings) -> None:
    """Raise :class:`ConfigError` for the first cross-reference or value that cannot work."""
    environments, variants = settings.environments, settings.variants
    if not settings.models:
        raise ConfigError("models: none given (name models, or suites of them)")
    for model in settings.models:
        _check_model(settings, model)
        try:
            check_sizes(
                model_reference(settings, model),
                model_sizes(settings, model),
                model_shape(settings, model),
            )
        except BadInput as exc:
            raise ConfigError(f"models.{model}.{settings.device}.{exc}") from None
    for name, knobs in variants.items():
        try:
            parse_knobs(knobs)
        except BadInput as exc:
            raise ConfigError(f"variants.{name}: {exc}") from None
    for name, comparison in settings.comparisons.items():
        _check_sides(name, comparison, settings)
    _check_environments(environments)
    _check_every_cell_runs(settings)


def _check_sides(name: str, comparison: Comparison, settings: Settings) -> None:
    environments, variants = settings.environments, settings.variants
    for side, chosen in zip(("baseline", "candidate"), comparison.sides, strict=True):
        if chosen.env not in environments:
            raise ConfigError(
                f"comparisons.{name}.{side}.env: {chosen.env!r} is not an environment "
                f"(defined: {', '.join(environments)})"
            )
        if chosen.variant not in variants:
            raise ConfigError(
                f"comparisons.{name}.{side}.variant: {chosen.variant!r} is not a variant "
                f"(defined: {', '.join(variants)})"
            )
    if comparison.baseline == comparison.candidate:
        raise ConfigError(f"comparisons.{name}: baseline and candidate are the same")


def _check_model(settings: Settings, model: str) -> None:
    """A zoo name, or a source that names something (where it can be looked up here: the
    family's library, the user's module in ``model_paths``)."""
    source = settings.models[model].source
    if not source and model not in REGISTRY:
        raise ConfigError(
            f"models.{model}: unknown model (accepted: {accepted_references()}, the last four "
            "as a source of a name of your own)"
        )
    if not source:
        return
    try:
        check_known(parse_reference(source), settings.model_paths)
    except BadInput as exc:
        raise ConfigError(f"models.{model}.source: {exc}") from None


def model_reference(settings: Settings, model: str) -> str:
    """What names ``model`` to :func:`ptspeed.models.get_model`: its source, else its name."""
    return settings.models[model].source or model


def model_shape(settings: Settings, model: str) -> str:
    """The cell command's ``--shape`` of ``model`` on the settings' device class ('' none)."""
    table = settings.model_sizes(model, settings.device)
    return shape_text(table.shape) if table is not None else ""


def _check_every_cell_runs(settings: Settings) -> None:
    """Every cell passes the cell command's own input check, so that no accepted config ends
    in cells that exit with a usage error and write no record."""
    last_trial = settings.trials - 1
    for cell in cells(settings):
        if cell.trial != last_trial:
            continue
        try:
            check_cell(cell_spec(settings, cell))
        except BadInput as exc:
            raise ConfigError(
                f"variants.{cell.variant} on models.{cell.model} ({cell.mode}, environment "
                f"{cell.env}): the cell command would refuse it: {exc}"
            ) from None


def cell_spec(settings: Settings, cell: Cell, threads: int = 0) -> CellSpec:
    """What the cell command of ``cell`` is asked to run (``threads``: its CPU threads)."""
    sizes = model_sizes(settings, cell.model)
    steps = settings.steps
    compiles = variant_compiles(settings, cell.variant)
    return CellSpec(
        model=cell.model,
        source=settings.models[cell.model].source,
        shape=model_shape(settings, cell.model),
        variant=cell.variant,
        knobs=settings.variants[cell.variant],
        mode=cell.mode,
        batch_size=sizes.batch_size,
        image_size=sizes.image_size,
        seq_len=sizes.seq_len,
        env=cell.env,
        platform=cell.platform,
        trial=cell.trial,
        warmup_steps=steps.warmup,
        measured_steps=steps.measured,
        numerics_steps=steps.numerics,
        # The trials of a cell run the same seeded computation: the first one's numerics gate
        # (about half a warm compiled trial's time on the CPU) stands for the later ones.
        numerics_by_first_trial=cell.trial > 0,
        device=settings.device,
        threads=threads,
        timeout_s=settings.timeout_s,
        # A compiled cell's trials share its compiler cache: trial 0 compiles cold, the later
        # trials (which wait for it, rule cell) warm.
        compiler_cache=f"{settings.results}/cache/compiler/{cell.key}" if compiles else "",
        compiler_cache_cold=compiles and cell.trial == 0,
        # The first trial (and its reruns) alone runs a few profiled steps after its window.
        **profiled_steps(settings, cell),
    )


def profiled_steps(settings: Settings, cell: Cell) -> dict[str, Any]:
    """The profiling fields of ``cell``'s spec: its first trial profiles ``steps.profiled``
    steps and keeps the trace at ``<results>/traces/<cell key>.json.gz``; other trials none.
    A rerun of the first trial (trial ``trials``, ``2 × trials``, …: it ran perturbed) profiles
    again, over the same trace, so that the breakdown can come from a quiet trial."""
    first = cell.trial % settings.trials == 0
    steps = settings.steps.profiled if first else 0
    if not steps:
        return {}
    return {"profile_steps": steps, "profile_trace": f"{settings.results}/{cell.trace}"}


def variant_compiles(settings: Settings, variant: str) -> bool:
    """Whether the configured variant runs torch.compile (its cells get a compiler cache)."""
    return parse_knobs(settings.variants[variant]).compile_mode is not None


def cell_command_line(settings: Settings, wildcards: Mapping[str, str], threads: int) -> str:
    """The shell arguments (all but ``--out``) of ``python -m ptspeed cell`` in the workflow's
    job of ``wildcards``; ``threads``: the job's, which a CPU cell gives torch."""
    cell_threads = threads if settings.device == "cpu" else 0
    spec = cell_spec(settings, Cell.from_wildcards(wildcards), cell_threads)
    return shlex.join(to_arguments(spec, settings.oom_retry))


def _check_environments(environments: Mapping[str, Environment]) -> None:
    for name, env in environments.items():
        if env.kind == "venv" and not (env.requirements and env.python):
            raise ConfigError(f"environments.{name}: kind venv needs requirements and python")
        if env.kind == "container" and not env.container:
            raise ConfigError(f"environments.{name}: kind container needs container")
        if env.image and env.kind != "image":
            raise ConfigError(
                f"environments.{name}.image: only kind image takes an image (kind is {env.kind})"
            )
        if env.kind == "image" and not env.image:
            raise ConfigError(
                f"environments.{name}: kind image needs image (a .sif path, docker://…@sha256:…, "
                "oras://…@sha256:… or library://…:sha256.…)"
            )


def cells(settings: Settings, cannot_run: Container[tuple[str, str]] = ()) -> Iterator[Cell]:
    """Every cell of the matrix, on every platform, but for the (platform, environment) pairs
    of ``cannot_run``. Trials are the outer loop, so that in order of listing the trials of
    baseline and candidate alternate instead of running back to back."""
    pairs = settings.env_variant_pairs()
    platforms = [platform.name for platform in configured_platforms(settings)]
    for trial in range(settings.trials):
        for platform in platforms:
            for model in settings.models:
                size = _size_label_of(settings, model)
                for mode in settings.modes:
                    for env, variant in pairs:
                        if (platform, env) not in cannot_run:
                            yield Cell(env, model, variant, mode, size, trial, platform)


def _size_label_of(settings: Settings, model: str) -> str:
    sizes = asdict(model_sizes(settings, model))
    table = settings.model_sizes(model, settings.device)
    return size_label(sizes, sizes_used(model, table.to_mapping() if table else {}))


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


def runtime_minutes(settings: Settings) -> int:
    """The scheduler's time request of one cell: its own limit plus slack for start-up."""
    return math.ceil(settings.timeout_s / 60) + MINUTES_OF_SLACK
