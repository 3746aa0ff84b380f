"""The workflow config as typed, immutable settings, built once from the validated mapping.

:func:`ptspeed.plan.config.prepare_config` validates Snakemake's config against the JSON Schema
(workflow/schemas/config.schema.yaml), fills the schema's defaults and expands the suites; then
:meth:`Settings.from_mapping` turns it into the tree below, which the planner, the environments,
the aggregation and the report read instead of the mapping. A script that reads the effective
config (``results/config.json``) builds its settings once, at its edge
(:func:`ptspeed.plan.schema.settings_from`, which fills the defaults an older snapshot lacks).

The defaults live in the schema alone: every key with a default is read here as given. A field
with a default below is one the schema leaves optional without a default (an environment's
``requirements``, a model's ``source``): its default says "not given". Standard library only, so
that any side may import it.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import MISSING, Field, dataclass, field, fields
from types import MappingProxyType
from typing import Any, TypeVar

__all__ = [
    "Cluster",
    "Compare",
    "Comparison",
    "Conditions",
    "Containers",
    "Environment",
    "Model",
    "PlatformSettings",
    "Settings",
    "Side",
    "SizeTable",
    "Steps",
    "Suite",
    "frozen",
    "thawed",
]

EMPTY: Mapping[str, Any] = MappingProxyType({})
PROBE = "probe"
Section = TypeVar("Section")


def frozen(value: Any) -> Any:
    """``value`` with every mapping a read-only mapping and every list a tuple, recursively."""
    if isinstance(value, Mapping):
        return MappingProxyType({key: frozen(item) for key, item in value.items()})
    if isinstance(value, (list, tuple)):
        return tuple(frozen(item) for item in value)
    return value


def thawed(value: Any) -> Any:
    """The plain data of ``value`` (settings, read-only mappings, tuples): dicts and lists."""
    if hasattr(value, "to_mapping"):
        return value.to_mapping()
    if isinstance(value, Mapping):
        return {key: thawed(item) for key, item in value.items()}
    if isinstance(value, tuple):
        return [thawed(item) for item in value]
    return value


def _section(cls: type[Section], mapping: Mapping[str, Any], **built: Any) -> Section:
    """``cls`` from the keys of ``mapping`` named as its fields (``built``: fields made by the
    caller); a key the mapping lacks takes the field's default (a field without one is required
    and its absence a :class:`KeyError`)."""
    values: dict[str, Any] = {}
    for item in fields(cls):  # type: ignore[arg-type]
        if item.name in built:
            values[item.name] = built[item.name]
        elif item.name in mapping:
            values[item.name] = frozen(mapping[item.name])
        elif item.default is MISSING and item.default_factory is MISSING:
            raise KeyError(item.name)
    return cls(**values)


class _Plain:
    """Settings that give back the mapping they were built from: the keys given, not those
    left at a field's default (which says "not given")."""

    def to_mapping(self) -> dict[str, Any]:
        return {
            item.name: thawed(getattr(self, item.name))
            for item in fields(self)  # type: ignore[arg-type]
            if _given(item, getattr(self, item.name))
        }


def _given(item: Field[Any], value: Any) -> bool:
    if item.default is not MISSING:
        return value != item.default
    if item.default_factory is not MISSING:
        return value != item.default_factory()
    return value is not None


@dataclass(frozen=True)
class Steps(_Plain):
    warmup: int
    measured: int
    numerics: int
    profiled: int


@dataclass(frozen=True)
class Compare(_Plain):
    earlier: str
    min_effect: float


@dataclass(frozen=True)
class Conditions(_Plain):
    """When a trial counts as perturbed (ptspeed.analysis.conditions), and its reruns."""

    keep_perturbed: bool
    max_other_cpu_share: float
    min_cpu_left_ratio: float
    min_window_s: float
    min_clock_fraction: float
    throttle_reasons: tuple[str, ...]
    max_other_gpu_processes: int
    max_steal_share: float
    max_probe_deviation: float
    reruns: int


@dataclass(frozen=True)
class Cluster(_Plain):
    partition: str
    account: str
    account_required: bool
    partition_required: bool
    constraint: str
    qos: str
    cpus_per_task: int
    gpu_request: str


@dataclass(frozen=True)
class PlatformSettings(_Plain):
    """A platform as configured; ``gpu``: ``probe`` or ``{name, capability}``."""

    partition: str
    constraint: str
    gres_type: str
    gpu: str | Mapping[str, str]

    @property
    def probed(self) -> bool:
        return self.gpu == PROBE


@dataclass(frozen=True)
class Containers(_Plain):
    runtime: str
    images: str
    builder: str
    registry: str
    push: bool | str  # --config passes nested values as text: "true"
    image_dir: str
    ca_bundle: str

    @property
    def pushes(self) -> bool:
        return self.push in (True, "true")


@dataclass(frozen=True)
class Environment(_Plain):
    """An environment; the text fields are '' where the config gives none."""

    kind: str
    requirements: str = ""
    python: str = ""
    container: str = ""
    base_image: str = ""
    image: str = ""


@dataclass(frozen=True)
class SizeTable(_Plain):
    """A model's sizes on one device class as written (None: a size left at its default)."""

    batch_size: int
    image_size: int | None = None
    seq_len: int | None = None
    shape: Mapping[str, int] = field(default_factory=lambda: EMPTY)


@dataclass(frozen=True)
class Model(_Plain):
    """A model: its source ('' a name of the zoo), its suite ('' none), its sizes per device
    class (None: none for that class)."""

    source: str = ""
    suite: str = ""
    cpu: SizeTable | None = None
    cuda: SizeTable | None = None

    @classmethod
    def from_mapping(cls, entry: Mapping[str, Any]) -> Model:
        if "batch_size" in entry:  # one table for every device class
            table = _section(SizeTable, entry)
            return cls(cpu=table, cuda=table)
        tables = {key: _section(SizeTable, entry[key]) for key in ("cpu", "cuda") if key in entry}
        return _section(cls, entry, **tables)

    def sizes(self, device_class: str) -> SizeTable | None:
        """The sizes table on ``device_class`` (None: none, or not a device class)."""
        return getattr(self, device_class, None) if device_class in ("cpu", "cuda") else None


@dataclass(frozen=True)
class Suite(_Plain):
    """A suite of models of one family: its ``models`` or its ``pattern`` (of its ``task``)."""

    family: str
    models: tuple[str, ...] = ()
    pattern: str = ""
    task: str = ""
    exclude: tuple[str, ...] = ()
    cpu: SizeTable | None = None
    cuda: SizeTable | None = None

    @classmethod
    def from_mapping(cls, entry: Mapping[str, Any]) -> Suite:
        tables = {key: _section(SizeTable, entry[key]) for key in ("cpu", "cuda") if key in entry}
        return _section(cls, entry, **tables)


@dataclass(frozen=True)
class Side(_Plain):
    env: str
    variant: str


@dataclass(frozen=True)
class Comparison(_Plain):
    baseline: Side
    candidate: Side
    title: str = ""
    claim: str = ""

    @classmethod
    def from_mapping(cls, entry: Mapping[str, Any]) -> Comparison:
        sides = {side: _section(Side, entry[side]) for side in ("baseline", "candidate")}
        return _section(cls, entry, **sides)

    @property
    def sides(self) -> tuple[Side, Side]:
        return self.baseline, self.candidate


def _named(build: Any, entries: Mapping[str, Any]) -> Mapping[str, Any]:
    return MappingProxyType({name: build(entry) for name, entry in entries.items()})


@dataclass(frozen=True)
class Settings(_Plain):
    """The whole config. ``device`` is ``auto`` until the planner resolves it (the effective
    config a script reads holds the class the cells used); ``platform_plan`` is the plan the
    effective config carries (ptspeed.plan.platforms.PlatformPlan.to_json; empty before)."""

    results: str
    env_cache: str
    device: str
    trials: int | None  # None: a config read for the tables that names none (see settings_from)
    threads: int
    steps: Steps
    timeout_s: float
    mem_mb: int
    oom_retry: bool
    compare: Compare
    conditions: Conditions
    cluster: Cluster
    platforms: Mapping[str, PlatformSettings]
    containers: Containers
    environments: Mapping[str, Environment]
    models: Mapping[str, Model]
    model_paths: tuple[str, ...]
    suites: Mapping[str, Suite]
    variants: Mapping[str, str]
    modes: tuple[str, ...]
    comparisons: Mapping[str, Comparison]
    platform_plan: Mapping[str, Any] = field(default_factory=lambda: EMPTY)

    @classmethod
    def from_mapping(cls, mapping: Mapping[str, Any]) -> Settings:
        """The settings of a validated config whose defaults are filled in."""
        return _section(
            cls,
            mapping,
            steps=_section(Steps, mapping["steps"]),
            compare=_section(Compare, mapping["compare"]),
            conditions=_section(Conditions, mapping["conditions"]),
            cluster=_section(Cluster, mapping["cluster"]),
            platforms=_named(lambda e: _section(PlatformSettings, e), mapping["platforms"]),
            containers=_section(Containers, mapping["containers"]),
            environments=_named(lambda e: _section(Environment, e), mapping["environments"]),
            models=_named(Model.from_mapping, mapping["models"]),
            suites=_named(Suite.from_mapping, mapping["suites"]),
            comparisons=_named(Comparison.from_mapping, mapping["comparisons"]),
        )

    def model_sizes(self, model: str, device_class: str) -> SizeTable | None:
        """The sizes table of ``model`` on ``device_class`` (None: none, or no such model)."""
        entry = self.models.get(model)
        return entry.sizes(device_class) if entry is not None else None

    def env_variant_pairs(self) -> list[tuple[str, str]]:
        """The (environment, variant) pairs the comparisons need, in first-mentioned order."""
        pairs: dict[tuple[str, str], None] = {}
        for comparison in self.comparisons.values():
            for side in comparison.sides:
                pairs[(side.env, side.variant)] = None
        return list(pairs)
