"""Platforms: the GPU types of a cluster, each with where its jobs go and what it can run.

The config's ``platforms`` block names each GPU type: its SLURM partition, node constraint and
gres type, and its GPU (a name and compute capability, or ``probe``: learned from the GPU its
cells' records name). Every cell is planned once per platform, except where the environment
carries no GPU code for the platform's GPU (:mod:`ptspeed.cell.gpu_code`): such cells are not
planned, and :func:`platform_plan` says why. A config without platforms is one unnamed platform,
the machine the run is on, and plans as it always did.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import asdict, dataclass, field
from typing import Any

from ptspeed.cell.gpu_code import GpuCode, unsupported_reason
from ptspeed.errors import ConfigError
from ptspeed.plan.settings import PlatformSettings, Settings

# Each platform key and the cell job's resource it becomes (snakemake-executor-plugin-slurm).
PLATFORM_RESOURCES = {"partition": "slurm_partition", "constraint": "constraint"}
# Resources the executor leaves out when empty (it passes an empty constraint on, as -C '').
EMPTY_MEANS_UNSET = ("slurm_partition",)


@dataclass(frozen=True)
class Platform:
    """One GPU type of the cluster ('' name: the one machine of a run without platforms)."""

    name: str
    partition: str = ""
    constraint: str = ""
    gres_type: str = ""
    gpu_name: str = ""
    capability: tuple[int, int] | None = None  # None: probed, or no GPU declared

    @property
    def gpu_label(self) -> str:
        """``NVIDIA H100 (sm_90)``, ``probed`` or ''."""
        if self.capability is None:
            return "learned from its cells' records" if self.name else ""
        major, minor = self.capability
        return f"{self.gpu_name or 'GPU'} (sm_{major}{minor})"


@dataclass(frozen=True)
class PlatformPlan:
    """The platforms of a run and the (platform, environment) pairs that cannot run there."""

    platforms: tuple[Platform, ...]
    cannot_run: Mapping[tuple[str, str], str] = field(default_factory=dict)
    codes: Mapping[str, GpuCode | None] = field(default_factory=dict)

    @property
    def names(self) -> list[str]:
        return [platform.name for platform in self.platforms]

    def to_json(self) -> dict[str, Any]:
        """The plan as the effective config carries it to the tables and the report."""
        return {
            "platforms": [
                {**asdict(platform), "gpu_label": platform.gpu_label} for platform in self.platforms
            ],
            "cannot_run": [
                {"platform": platform, "env": env, "reason": reason}
                for (platform, env), reason in self.cannot_run.items()
            ],
            "codes": {env: code.to_json() if code else None for env, code in self.codes.items()},
        }


def configured_platforms(settings: Settings) -> tuple[Platform, ...]:
    """The config's platforms in order; one unnamed platform when it names none."""
    if not settings.platforms:
        return (Platform(""),)
    return tuple(_platform(name, entry) for name, entry in settings.platforms.items())


def _platform(name: str, entry: PlatformSettings) -> Platform:
    capability, gpu_name = None, ""
    if isinstance(entry.gpu, Mapping):
        where = f"platforms.{name}.gpu.capability"
        capability = parse_capability(str(entry.gpu["capability"]), where)
        gpu_name = str(entry.gpu.get("name") or "")
    return Platform(
        name=name,
        partition=entry.partition,
        constraint=entry.constraint,
        gres_type=entry.gres_type,
        gpu_name=gpu_name,
        capability=capability,
    )


def parse_capability(text: str, where: str) -> tuple[int, int]:
    """``(9, 0)`` for ``"9.0"``; :class:`ConfigError` naming ``where`` otherwise."""
    major, dot, minor = text.partition(".")
    if not (dot and major.isdigit() and minor.isdigit()):
        raise ConfigError(f"{where}: {text!r} is not a compute capability such as 8.0 or 9.0")
    return int(major), int(minor)


def platform_plan(settings: Settings, codes: Mapping[str, GpuCode | None]) -> PlatformPlan:
    """The platforms and what cannot run on each: an environment whose GPU code (``codes``,
    ptspeed.envs.gpu_code.environment_codes) has nothing the platform's GPU runs. Platforms
    whose GPU is probed, and environments whose code is unknown (a container of the user's),
    are planned: their cells check on arrival."""
    platforms = configured_platforms(settings)
    reasons = {
        (platform.name, env): unsupported_reason(code, platform.capability, platform.gpu_name)
        for platform in platforms
        for env, code in codes.items()
        if platform.capability is not None and code is not None
    }
    cannot_run = {}
    for (name, env), reason in reasons.items():
        if reason:
            runs_on = [p.name for p in platforms if reasons.get((p.name, env)) == ""]
            elsewhere = f"; it runs on platform {', '.join(runs_on)}" if runs_on else ""
            cannot_run[(name, env)] = f"{reason} (platform {name}{elsewhere})"
    return PlatformPlan(platforms, cannot_run, dict(codes))


def platform_resources(platform: Platform, cluster_resources: Mapping[str, str]) -> dict[str, str]:
    """A cell job's scheduler resources on ``platform``: the cluster block's, with the
    platform's partition and constraint in place of the cluster's where it sets them."""
    resources = dict(cluster_resources)
    for key, resource in PLATFORM_RESOURCES.items():
        value = getattr(platform, key)
        if value:
            resources[resource] = value
    return resources


def cell_job_resources(plan: PlatformPlan, cluster_resources: Mapping[str, str]) -> dict[str, Any]:
    """The scheduler resources of the rule cell but its GPUs (ptspeed.plan.cluster.gpu_request,
    from the platform's gres type): constants for a run of one platform; else, per resource, a
    function of the job's wildcards giving its platform's value."""
    by_platform: dict[str, dict[str, str]] = {
        platform.name: platform_resources(platform, cluster_resources)
        for platform in plan.platforms
    }
    if len(by_platform) == 1:
        return next(iter(by_platform.values()))
    keys = dict.fromkeys(key for resources in by_platform.values() for key in resources)
    for key in keys:
        lacking = [name for name, resources in by_platform.items() if key not in resources]
        if key in EMPTY_MEANS_UNSET:
            for name in lacking:
                by_platform[name][key] = ""
        elif lacking:
            raise ConfigError(
                f"platforms.{lacking[0]}: sets no {_config_key(key)} where other platforms do; "
                f"set it on every platform or on none (SLURM would be given an empty value)"
            )
    return {key: _per_platform(by_platform, key) for key in keys}


def _config_key(resource: str) -> str:
    return {v: k for k, v in PLATFORM_RESOURCES.items()}.get(resource, resource)


def _per_platform(by_platform: Mapping[str, Mapping[str, str]], key: str) -> Any:
    values = {resources[key] for resources in by_platform.values()}
    if len(values) == 1:
        return values.pop()

    def value(wildcards: Any) -> str:
        return by_platform[platform_of(wildcards)][key]

    return value


def platform_of(wildcards: Any) -> str:
    """The platform name of a cell job's wildcards ('' in a run without platforms)."""
    return str(wildcards.platform).rstrip("/")
