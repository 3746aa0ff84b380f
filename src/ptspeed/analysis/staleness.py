"""Does a record measure what the current config asks for?

A record carries the cell it measured (its ``CellSpec``). Aggregation compares that cell with
the configuration the tables are made for, so that a record left over from an older config
(other knobs, sizes or steps), a record copied from another machine, or a file put at the wrong
path is never counted as a measurement of the current matrix. Such a record is *stale*: it keeps
a row in the runs table, with the reason, and counts for nothing else.

What is compared: the record's place (the path names environment, model, variant, mode, sizes
and trial), membership of the matrix (the pair is compared, the model, mode and trial are
configured), the knob string of the variant, the sizes for the device class, the warm-up,
measured and numerics steps, and the device class. A record of an out-of-memory retry
(``retried_from_batch_size``) matches at half the configured batch size. Pure: no I/O, no
torch.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any

from ptspeed.analysis.reruns import trial_limit
from ptspeed.models import REGISTRY
from ptspeed.plan.layout import (
    CELL_PATTERN,
    DEFAULT_SIZES,
    DEVICE_CLASSES,
    SIZE_KEYS,
    configured_sizes,
    platform_directory,
    size_label,
)
from ptspeed.plan.settings import Settings

STALE = "stale"
STEP_FIELDS = {"warmup": "warmup_steps", "measured": "measured_steps", "numerics": "numerics_steps"}
PLACE_FIELDS = ("env", "model", "variant", "mode", "trial")


def stale_reason(cell: Mapping[str, Any], path_cell: Mapping[str, Any], settings: Settings) -> str:
    """Why the recorded ``cell`` is not the one ``settings`` ask for at its path ('' if it is).

    ``cell`` maps CellSpec field names to the recorded values; ``path_cell`` is the cell the
    record's path names in the workflow layout ({} elsewhere); ``settings`` are the effective
    config's (the device class resolved).
    """
    problems = _misplaced(cell, path_cell)
    outside = _outside_matrix(cell, settings)
    if outside:
        return "; ".join([*problems, *outside])
    return "; ".join([*problems, *_differences(cell, settings)])


def describe_cell(cell: Mapping[str, Any]) -> str:
    """``env/model/variant/mode/b8-i224-s128/trial0``."""
    fields = {key: cell.get(key) for key in PLACE_FIELDS}
    fields["platform"] = platform_directory(cell.get("platform") or "")
    return CELL_PATTERN.format(**fields, size=size_label({key: cell.get(key) for key in SIZE_KEYS}))


def _misplaced(cell: Mapping[str, Any], path_cell: Mapping[str, Any]) -> list[str]:
    if not path_cell:
        return []
    place_differs = any(cell.get(key) != path_cell.get(key) for key in PLACE_FIELDS)
    place_differs |= (cell.get("platform") or "") != (path_cell.get("platform") or "")
    # A path's size label names only the sizes its model uses.
    sizes_differ = not _sizes_match(cell, path_cell, _used_sizes(cell.get("model")))
    if place_differs or sizes_differ:
        return [f"its path names {describe_cell(path_cell)} but it holds {describe_cell(cell)}"]
    return []


def _outside_matrix(cell: Mapping[str, Any], settings: Settings) -> list[str]:
    env, variant, model = cell.get("env"), cell.get("variant"), cell.get("model")
    problems = []
    if (env, variant) not in settings.env_variant_pairs():
        problems.append(f"{env}/{variant} is not compared in the config")
    if model not in settings.models:
        problems.append(f"model {model} is not in the config")
    platform = cell.get("platform") or ""
    if platform and platform not in settings.platforms:
        problems.append(f"platform {platform} is not in the config's platforms")
    if cell.get("mode") not in settings.modes:
        problems.append(f"mode {cell.get('mode')} is not in the config's modes")
    trial, limit = cell.get("trial"), trial_limit(settings)
    if _is_int(trial) and limit is not None and not 0 <= trial < limit:
        problems.append(
            f"trial {trial} is outside the config's {settings.trials} trials and their "
            f"{settings.conditions.reruns} reruns"
        )
    return problems


def _differences(cell: Mapping[str, Any], settings: Settings) -> list[str]:
    problems = []
    knobs = settings.variants.get(cell.get("variant"))
    if knobs is not None and cell.get("knobs") != knobs:
        problems.append(f"knobs {cell.get('knobs')!r}, the config's {knobs!r}")
    problems.extend(_device_and_sizes(cell, settings))
    for key, field in STEP_FIELDS.items():
        wanted = getattr(settings.steps, key)
        if cell.get(field) != wanted:
            problems.append(f"{field} {cell.get(field)}, the config's {wanted}")
    return problems


def _device_and_sizes(cell: Mapping[str, Any], settings: Settings) -> list[str]:
    configured, recorded = settings.device, _device_class(cell.get("device"))
    if configured in DEVICE_CLASSES and recorded in DEVICE_CLASSES and configured != recorded:
        return [f"device {cell.get('device')}, the config's {configured}"]
    device = configured if configured in DEVICE_CLASSES else recorded
    model = cell.get("model")
    expected = configured_sizes(settings, model, device) if isinstance(model, str) else None
    if expected is None or _sizes_match(cell, expected):
        return []
    recorded_sizes = {key: cell.get(key) for key in SIZE_KEYS}
    return [f"sizes {_show_sizes(recorded_sizes)}, the config's {_show_sizes(expected)}"]


def _device_class(device: Any) -> str | None:
    """'cpu' or 'cuda' for a recorded device ('cuda:1' included); None for 'auto' or odd values,
    which are not compared."""
    if not isinstance(device, str):
        return None
    name = device.split(":", 1)[0]
    return name if name in DEVICE_CLASSES else None


def _used_sizes(model: Any) -> tuple[str, ...]:
    entry = REGISTRY.get(model) if isinstance(model, str) else None
    return tuple(entry.uses) if entry else tuple(DEFAULT_SIZES)


def _sizes_match(
    cell: Mapping[str, Any], expected: Mapping[str, Any], keys: Iterable[str] = DEFAULT_SIZES
) -> bool:
    """Sizes equal, the batch size possibly halved by an out-of-memory retry of it."""
    if any(cell.get(key) != expected.get(key) for key in keys if key in DEFAULT_SIZES):
        return False
    batch, wanted = cell.get("batch_size"), expected.get("batch_size")
    retried_from = cell.get("retried_from_batch_size")
    if _is_int(retried_from) and retried_from == wanted and _is_int(wanted):
        return batch == wanted // 2
    return batch == wanted


def _show_sizes(sizes: Mapping[str, Any]) -> str:
    return ", ".join(f"{key} {value}" for key, value in sizes.items())


def _is_int(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)
