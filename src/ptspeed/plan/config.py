"""The workflow config, checked and completed before any job is planned.

:func:`prepare_config` is the one entry point; ``workflow/rules/common.smk`` calls it on
Snakemake's ``config``. It checks, in this order, and stops at the first problem:

1. no config file asks Snakemake to evaluate template code (YTE's ``__use_yte__``);
2. the data is plain: string keys, bounded nesting, finite numbers of sane magnitude;
3. the JSON Schema (``workflow/schemas/config.schema.yaml``): shapes, names, ranges. ``$`` in
   a pattern means the end of the text, as in JSON Schema's ECMA-262 regexes (Python's ``$``
   would also accept a trailing newline), and an integer is never a float or a boolean;
4. the paths: ``results`` and ``env_cache`` stay inside the project or go to an absolute
   directory that is not the system's, requirement lock files exist under ``envs/``;
5. the cross-references of :func:`ptspeed.plan.matrix.check_config` (models, knobs, comparisons,
   steps, and every cell against the cell command's own check; a suite's members are models
   by then: :mod:`ptspeed.plan.suites`) and each comparison's ``claim`` against the groups of
   ``config/claims.yaml``.

Every problem is a :class:`ConfigError` whose message is one line naming the key, e.g.
``models.mlp.cpu.batch_size: -1 is less than the minimum of 1``. Nothing here evaluates a config
value: values are compared and matched, never run. The one exception is a model's
``module:attribute`` source: the module is imported (its attribute looked up, not called) where
it can be found, as every cell of it will import it.
"""

from __future__ import annotations

import functools
import json
import math
import os
import re
from collections.abc import Callable, Iterable, Iterator, Mapping
from pathlib import Path
from typing import Any

import yaml
from jsonschema import Draft202012Validator, ValidationError, validators
from jsonschema.exceptions import best_match

from ptspeed.errors import ConfigError, InputError
from ptspeed.plan.layout import runs_csv_of
from ptspeed.plan.matrix import check_config
from ptspeed.plan.schema import PROJECT_DIR, SCHEMA_PATH, fill_defaults, load_schema
from ptspeed.plan.settings import Settings
from ptspeed.plan.suites import expand_suites

__all__ = ["effective_config_json", "prepare_config", "schema_errors"]

# The published figures the report checks (rules aggregate and report read the same file).
CLAIMS_FILE = Path("config") / "claims.yaml"
YTE_SWITCH = "__use_yte__"

MAX_DEPTH = 32
MAX_INTEGER = 2**63
MAX_TEXT_CHARS = 4096
MAX_MESSAGE_CHARS = 400
SHOWN_VALUE_CHARS = 60

# Directories of the operating system: never a place for results or built environments.
SYSTEM_DIRECTORIES = tuple(
    Path(p)
    for p in (
        "/bin", "/boot", "/dev", "/etc", "/lib", "/lib32", "/lib64", "/libx32", "/proc",
        "/run", "/sbin", "/sys", "/usr", "/var/lib", "/var/log", "/var/cache", "/var/spool",
        "/var/mail", "/var/run", "/var/lock", "/var/backups",
    )
)  # fmt: skip
# The project's own directories (code, config, tooling): results written there would mix with it.
PROJECT_OWN_DIRECTORIES = (
    ".git", ".snakemake", ".venv", "config", "docker", "envs", "profiles", "report", "scripts",
    "src", "tests", "workflow",
)  # fmt: skip

DetectDeviceClass = Callable[[str], str]


def prepare_config(
    raw: Any,
    detect_device_class: DetectDeviceClass,
    project_dir: str | os.PathLike[str] = PROJECT_DIR,
    config_files: Iterable[str | os.PathLike[str]] = (),
    schema_path: str | os.PathLike[str] = SCHEMA_PATH,
) -> Settings:
    """Check ``raw`` (Snakemake's config), fill in the schema's defaults in place (and the
    suites' members as models) and return its settings, their ``device`` the device class the
    cells use (``detect_device_class`` of the configured one).

    ``config_files`` are the files the config was read from; ``project_dir`` is the directory
    relative paths are taken from (Snakemake's working directory). Raises :class:`ConfigError`
    with a one-line message naming the key for the first problem found.
    """
    project = Path(project_dir)
    for path in config_files:
        _refuse_templates(Path(path))
    _check_plain_data(raw)
    schema = load_schema(schema_path)
    error = best_match(schema_errors(raw, schema))
    if error is not None:
        raise ConfigError(describe(error))
    fill_defaults(raw, schema)
    _check_paths(raw, project)
    device_class = detect_device_class(raw["device"])
    try:
        expand_suites(raw)
        settings = Settings.from_mapping({**raw, "device": device_class})
        check_config(settings)
        _check_claims(settings, project / CLAIMS_FILE)
    except ConfigError as exc:
        raise ConfigError(one_line(str(exc))) from None
    return settings


def effective_config_json(
    config: Mapping[str, Any], device_class: str, platform_plan: Mapping[str, Any] | None = None
) -> str:
    """The config as the cells saw it, with device auto resolved to the class used (in the
    config's order: comparisons as listed), and the plan of its platforms
    (ptspeed.plan.platforms.PlatformPlan.to_json: what could not run where, and why)."""
    return json.dumps({**config, "device": device_class, "platform_plan": platform_plan or {}})


def _check_claims(settings: Settings, claims_path: Path) -> None:
    wanted = {name: c.claim for name, c in settings.comparisons.items() if c.claim}
    if not wanted:
        return
    try:
        groups = yaml.safe_load(claims_path.read_text(encoding="utf-8"))
    except (OSError, yaml.YAMLError) as exc:
        raise ConfigError(f"claims: {claims_path} cannot be read: {exc}") from None
    known = list(groups) if isinstance(groups, Mapping) else []
    for name, claim in wanted.items():
        if claim not in known:
            raise ConfigError(
                f"comparisons.{name}.claim: {show_value(claim)} is not a claim group of "
                f"{claims_path} (groups: {', '.join(map(str, known)) or 'none'})"
            )


# --- 1. template code -----------------------------------------------------------------------


def _refuse_templates(path: Path) -> None:
    """Snakemake evaluates a config file whose first document sets ``__use_yte__: true`` as a
    YTE template (Python expressions) while reading it, before this module runs: such a run
    is refused, and config/README.md warns never to pass a config file one has not read."""
    try:
        text = path.read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError):
        return  # Snakemake read it; only the data it produced is checked below
    try:
        json.loads(text)
        return  # Snakemake reads a JSON file as JSON, never as a template
    except ValueError:
        pass
    try:
        first = next(yaml.safe_load_all(text), None)
    except yaml.YAMLError:
        first = None  # not safe YAML: judge by the text
    uses_yte = YTE_SWITCH in first if isinstance(first, Mapping) else YTE_SWITCH in text
    if uses_yte:
        raise ConfigError(
            f"{YTE_SWITCH}: {one_line(str(path))} is a YTE template, whose expressions run as "
            "code; a ptspeed config must be plain YAML or JSON data"
        )


# --- 2. plain data --------------------------------------------------------------------------


def _check_plain_data(raw: Any) -> None:
    if not isinstance(raw, Mapping):
        raise ConfigError(
            f"(top level): the config is {_type_name(raw)}, not a mapping of keys such as "
            "environments, models, variants and comparisons"
        )
    stack: list[tuple[tuple[Any, ...], Any]] = [((), raw)]
    while stack:
        path, value = stack.pop()
        if len(path) > MAX_DEPTH:
            raise ConfigError(f"{key_path(path)}: nested deeper than {MAX_DEPTH} levels")
        problem = _scalar_problem(value)
        if problem:
            raise ConfigError(f"{key_path(path)}: {problem}")
        if isinstance(value, Mapping):
            for key, item in value.items():
                if not isinstance(key, str):
                    shown = show_value(key)
                    raise ConfigError(
                        f"{key_path(path) or '(top level)'}: key {shown} is not a string"
                    )
                stack.append(((*path, key), item))
        elif isinstance(value, list):
            stack.extend(((*path, index), item) for index, item in enumerate(value))


def _scalar_problem(value: Any) -> str:
    if isinstance(value, bool) or value is None:
        return ""
    if isinstance(value, int) and abs(value) >= MAX_INTEGER:
        return "the integer is absurdly large"
    if isinstance(value, float) and not math.isfinite(value):
        return f"{value} is not a finite number"
    if isinstance(value, str) and len(value) > MAX_TEXT_CHARS:
        return f"text of {len(value)} characters (at most {MAX_TEXT_CHARS})"
    if not isinstance(value, (int, float, str, list, Mapping)):
        return f"{_type_name(value)} is not a config value (text, number, boolean, list, map)"
    return ""


# --- 3. the schema --------------------------------------------------------------------------


def _ecma_pattern(
    validator: Any, pattern: str, instance: Any, schema: Mapping[str, Any]
) -> Iterator[ValidationError]:
    if validator.is_type(instance, "string") and not _compiled(pattern).search(instance):
        yield ValidationError(f"{instance!r} does not match {pattern!r}")


@functools.cache
def _compiled(pattern: str) -> re.Pattern[str]:
    """``pattern`` with ECMA-262's ``$`` (end of text only) in Python's syntax."""
    if pattern.endswith("$") and not pattern.endswith("\\$"):
        pattern = pattern[:-1] + r"\Z"
    return re.compile(pattern)


def _is_integer(checker: Any, instance: Any) -> bool:
    return isinstance(instance, int) and not isinstance(instance, bool)


_StrictValidator = validators.extend(
    Draft202012Validator,
    validators={"pattern": _ecma_pattern},
    type_checker=Draft202012Validator.TYPE_CHECKER.redefine("integer", _is_integer),
)


def schema_errors(raw: Any, schema: Mapping[str, Any]) -> Iterator[ValidationError]:
    """Every violation of ``schema`` by ``raw``, with the strict rules described above."""
    return _StrictValidator(schema).iter_errors(raw)


def describe(error: ValidationError) -> str:
    """A schema violation as one line: ``key.path: what is wrong``."""
    where = key_path(error.absolute_path)
    if error.validator == "additionalProperties" and isinstance(error.instance, Mapping):
        allowed = list(error.schema.get("properties") or {})
        message = error.message + (f"; accepted: {', '.join(allowed)}" if allowed else "")
    elif error.validator == "required" and isinstance(error.validator_value, list):
        missing = [k for k in error.validator_value if k not in error.instance]
        where = key_path([*error.absolute_path, missing[0]]) if missing else where
        message = "required key missing"
    elif error.validator in ("type", "minProperties", "minItems", "enum"):
        message = _with_short_value(error)
    else:
        message = error.message
    text = f"{where}: {message}" if where else message
    return one_line(text)


def _with_short_value(error: ValidationError) -> str:
    """jsonschema's message with the offending value shortened (a whole mapping can be long)."""
    shown = show_value(error.instance)
    if error.validator == "type":
        return f"{shown} is not of type {error.validator_value!r}"
    if error.validator == "enum":
        return f"{shown} is not one of {', '.join(map(str, error.validator_value))}"
    return f"{shown} should be non-empty"


# --- 4. paths -------------------------------------------------------------------------------


def _check_paths(config: Mapping[str, Any], project: Path) -> None:
    _check_output_directory("results", config["results"], project)
    earlier = config["compare"]["earlier"]
    if earlier:
        try:
            runs_csv_of(project / os.path.expanduser(earlier))
        except InputError as error:
            raise ConfigError(f"compare.earlier: {error}") from None
    _check_output_directory("env_cache", os.path.expanduser(config["env_cache"]), project)
    for index, directory in enumerate(config["model_paths"]):
        if not (project / os.path.expanduser(directory)).is_dir():
            raise ConfigError(f"model_paths[{index}]: {directory} is not a directory")
    for name, env in config["environments"].items():
        requirements = env.get("requirements")
        if env["kind"] == "venv" and requirements and not (project / requirements).is_file():
            present = sorted(p.name for p in (project / "envs").glob("*.txt"))
            raise ConfigError(
                f"environments.{name}.requirements: {requirements} does not exist "
                f"(lock files in envs/: {', '.join(present) or 'none'})"
            )


def _check_output_directory(key: str, value: str, project: Path) -> None:
    """A directory the workflow writes (and Snakemake deletes outputs in) must be the user's:
    inside the project (not its code) or an absolute path outside the system's directories."""
    path = Path(os.path.normpath(value))
    if not path.is_absolute():
        if path.parts[:1] == ("..",):
            raise ConfigError(
                f"{key}: {value!r} leads outside the project directory; give a directory "
                "inside it, or an absolute path"
            )
        _check_inside_project(key, value, path)
        return
    if path == Path(path.anchor) or any(_is_within(path, s) for s in SYSTEM_DIRECTORIES):
        raise ConfigError(f"{key}: {value!r} is a system directory; give a directory of your own")
    resolved_project = Path(os.path.normpath(project.absolute()))
    if _is_within(path, resolved_project):
        _check_inside_project(key, value, path.relative_to(resolved_project))


def _check_inside_project(key: str, value: str, relative: Path) -> None:
    if relative == Path("."):
        raise ConfigError(
            f"{key}: {value!r} is the project directory itself; give a subdirectory such as "
            "'results'"
        )
    if relative.parts[0] in PROJECT_OWN_DIRECTORIES:
        raise ConfigError(
            f"{key}: {value!r} is inside the project's {relative.parts[0]}/ directory, which "
            "holds its code or tooling; give another directory"
        )


def _is_within(path: Path, directory: Path) -> bool:
    return path == directory or directory in path.parents


# --- messages -------------------------------------------------------------------------------

_PLAIN_KEY = re.compile(r"[A-Za-z0-9_][A-Za-z0-9_.+-]*")


def key_path(parts: Iterable[Any]) -> str:
    """``models.mlp.cpu.batch_size``; a part that is not a plain name is shown quoted."""
    shown = []
    for part in parts:
        if isinstance(part, int) and not isinstance(part, bool):
            shown.append(f"[{part}]")
        elif isinstance(part, str) and _PLAIN_KEY.fullmatch(part):
            shown.append(("." if shown else "") + part)
        else:
            shown.append(("." if shown else "") + show_value(part))
    return "".join(shown)


def show_value(value: Any) -> str:
    """A value as a message shows it: its repr, shortened; containers by their size."""
    if isinstance(value, Mapping):
        return f"a mapping of {len(value)} keys" if value else "{}"
    if isinstance(value, list):
        return f"a list of {len(value)} items" if value else "[]"
    if isinstance(value, int) and not isinstance(value, bool) and abs(value) >= MAX_INTEGER:
        return "an absurdly large integer"
    text = repr(value)
    return text if len(text) <= SHOWN_VALUE_CHARS else text[: SHOWN_VALUE_CHARS - 1] + "…"


def one_line(text: str) -> str:
    """``text`` on one line (every kind of line break and space run becomes one space),
    shortened to :data:`MAX_MESSAGE_CHARS`."""
    line = " ".join(text.split())
    return line if len(line) <= MAX_MESSAGE_CHARS else line[: MAX_MESSAGE_CHARS - 1] + "…"


def _type_name(value: Any) -> str:
    if value is None:
        return "empty"
    names = {dict: "a mapping", list: "a list", str: "text", bool: "a boolean"}
    return names.get(type(value), f"a value of type {type(value).__name__}")
