"""The config loader (ptspeed.plan.config.prepare_config): a corpus of bad input, each refused
with one line naming the key, and hypothesis fuzzing that it never fails any other way.

The loader is what workflow/rules/common.smk runs before any job is planned; the end-to-end
refusals (nothing run, no results directory) are in test_faults.py and test_workflow.py.
"""

from __future__ import annotations

import copy
import json
import math
import re
from pathlib import Path
from typing import Any

import pytest
import yaml
from helpers import examples, settings_of
from hypothesis import given, settings
from hypothesis import strategies as st

from ptspeed.cell.arguments import from_arguments, to_arguments
from ptspeed.cell.checks import check_cell
from ptspeed.errors import ConfigError
from ptspeed.plan.config import (
    MAX_MESSAGE_CHARS,
    SCHEMA_PATH,
    key_path,
    prepare_config,
)
from ptspeed.plan.matrix import cell_spec, cells

ROOT = Path(__file__).resolve().parents[1]
DEFAULT_CONFIG: dict[str, Any] = yaml.safe_load((ROOT / "config/config.yaml").read_text())
SCHEMA_KEYS = set(yaml.safe_load(SCHEMA_PATH.read_text())["properties"])
HOST_CONFIG: dict[str, Any] = {
    "device": "cpu",
    "environments": {"host": {"kind": "host"}, "host-b": {"kind": "host"}},
    "models": {"mlp": {"cpu": {"batch_size": 16}}},
    "variants": {"eager": "eager"},
    "comparisons": {
        "two-hosts": {
            "baseline": {"env": "host", "variant": "eager"},
            "candidate": {"env": "host-b", "variant": "eager"},
        }
    },
}


def cpu_unless_asked(requested: str) -> str:
    """The device detection of a machine without a GPU."""
    return "cpu" if requested == "auto" else requested


def prepare(raw: Any, config_files: tuple[Path, ...] = ()) -> str:
    """The device class of the settings of ``raw``, which is checked and filled in place."""
    return prepare_config(raw, cpu_unless_asked, ROOT, config_files).device


def refusal(raw: Any) -> str:
    with pytest.raises(ConfigError) as caught:
        prepare(raw)
    return str(caught.value)


def changed(change: str, value: Any = None) -> dict[str, Any]:
    """HOST_CONFIG with ``value`` at the dotted key ``change`` (a key ending in '-' is deleted)."""
    config = copy.deepcopy(HOST_CONFIG)
    *parents, last = change.split(".")
    target = config
    for key in parents:
        target = target.setdefault(key, {})
    if last.endswith("-"):
        del target[last[:-1]]
    else:
        target[last] = value
    return config


def is_one_line(message: str) -> bool:
    return message == " ".join(message.split()) and 0 < len(message) <= MAX_MESSAGE_CHARS


def names_a_key(message: str, raw: Any) -> bool:
    """The message starts with a key path whose first part is a key of the config or of the
    input (or says the top level is wrong), or it is the schema's unknown-key message, which
    quotes the key."""
    keys = list(raw) if isinstance(raw, dict) else []
    if message.startswith("Additional properties are not allowed ("):
        return any(repr(key) in message for key in keys)
    first = re.split(r"[.\[:]", message, maxsplit=1)[0]
    starts_with_input_key = any(message.startswith(key_path([key])) for key in keys)
    return (
        message.startswith("(top level): ")
        or first in SCHEMA_KEYS | {"__use_yte__"}
        or starts_with_input_key
    )


# --- what a good config gets ----------------------------------------------------------------


def test_the_default_config_passes_and_gets_its_defaults() -> None:
    config = copy.deepcopy(DEFAULT_CONFIG)
    del config["steps"], config["trials"]
    assert prepare(config) == "cpu"
    assert config["steps"] == {"warmup": 3, "measured": 10, "numerics": 2, "profiled": 3}
    assert (config["trials"], config["oom_retry"], config["modes"]) == (5, False, ["train"])
    assert config["mem_mb"] == 16000


def test_the_extended_config_passes_and_keeps_the_default_matrix() -> None:
    path = ROOT / "config/extended.yaml"
    config = yaml.safe_load(path.read_text())
    assert prepare(config, (path,)) == "cpu"
    assert config["results"] == "results/extended"  # its own, apart from the default's
    assert config["environments"] == DEFAULT_CONFIG["environments"]
    assert config["models"] == DEFAULT_CONFIG["models"]
    assert DEFAULT_CONFIG["comparisons"].items() <= config["comparisons"].items()
    assert config["conditions"] == prepared_default()["conditions"]  # the schema's defaults


def prepared_default() -> dict[str, Any]:
    config = copy.deepcopy(DEFAULT_CONFIG)
    prepare(config)
    return config


def test_a_partial_steps_block_gets_the_missing_steps() -> None:
    config = changed("steps", {"measured": 4})
    prepare(config)
    assert config["steps"] == {"measured": 4, "warmup": 3, "numerics": 2, "profiled": 3}


def test_device_auto_is_resolved_by_the_detector() -> None:
    config = changed("device", "auto")
    assert prepare_config(config, lambda requested: "cpu", ROOT).device == "cpu"
    assert config["device"] == "auto"  # the effective config records the class separately


# --- the corpus of bad input ----------------------------------------------------------------

METACHARACTERS = [";", "$(id)", "`id`", "|", "&", ">", " ", "\n", "*", "'", '"', "\\"]
BAD = [
    # cross-field rules
    (
        "comparisons.two-hosts.claim",
        "no-such-group",
        "comparisons.two-hosts.claim: 'no-such-group'",
    ),
    # unknown keys
    ("bogus", 1, "Additional properties are not allowed ('bogus' was unexpected); accepted:"),
    ("steps.warm", 3, "steps: Additional properties are not allowed ('warm' was unexpected)"),
    ("environments.host.images", "x", "environments.host: Additional properties are not"),
    ("environments.host.image", "x.sif", "environments.host.image: only kind image takes an"),
    ("environments.host", {"kind": "image"}, "environments.host: kind image needs image (a .sif"),
    # wrong types
    ("trials", "3", "trials: '3' is not of type 'integer'"),
    ("trials", 3.0, "trials: 3.0 is not of type 'integer'"),
    ("trials", True, "trials: True is not of type 'integer'"),
    ("steps", [1, 2], "steps: a list of 2 items is not of type 'object'"),
    ("timeout_s", "1h", "timeout_s: '1h' is not of type 'number'"),
    ("modes", "train", "modes: 'train' is not of type 'array'"),
    ("models.mlp.cpu.batch_size", "16", "models.mlp.cpu.batch_size: '16' is not of type"),
    ("oom_retry", "yes", "oom_retry: 'yes' is not of type 'boolean'"),
    ("device", "tpu", "device: 'tpu' is not one of auto, cpu, cuda"),
    # an empty matrix
    ("models", {}, "models: none given (name models, or suites of them)"),
    ("models-", None, "models: none given (name models, or suites of them)"),
    ("environments", {}, "environments: {} should be non-empty"),
    ("variants", {}, "variants: {} should be non-empty"),
    ("comparisons", {}, "comparisons: {} should be non-empty"),
    ("modes", [], "modes: [] should be non-empty"),
    ("comparisons-", None, "comparisons: required key missing"),
    # a comparison of an environment with itself
    (
        "comparisons.two-hosts.candidate",
        {"env": "host", "variant": "eager"},
        "comparisons.two-hosts: baseline and candidate are the same",
    ),
    # code where a knob string belongs
    ("variants.eager", "__import__('os').system('id')", "variants.eager: \"__import__('os')"),
    ("variants.eager", "eager;id", "variants.eager: 'eager;id' does not match"),
    # paths outside the project, or onto its code
    ("compare.earlier", "no/such/run", "compare.earlier: "),
    ("compare.earlier", "config", "compare.earlier: "),
    ("compare.min_effect", 1.0, "compare.min_effect: 1.0 is greater than or equal to the maximum"),
    ("compare.against", "x", "compare: Additional properties are not allowed ('against' was"),
    ("results", "/etc", "results: '/etc' is a system directory"),
    ("results", "/", "results: '/' is a system directory"),
    ("results", "/usr/local/results", "results: '/usr/local/results' is a system directory"),
    ("results", "../x", "results: '../x' leads outside the project directory"),
    ("results", "a/../../x", "results: 'a/../../x' leads outside the project directory"),
    ("results", ".", "results: '.' is the project directory itself"),
    ("results", "src/results", "results: 'src/results' is inside the project's src/ directory"),
    ("results", str(ROOT / "workflow"), f"results: '{ROOT / 'workflow'}' is inside the project's"),
    ("results", "results\n", "results: 'results\\n' does not match"),
    ("results", "$HOME/x", "results: '$HOME/x' does not match"),
    ("env_cache", "/etc/ptspeed", "env_cache: '/etc/ptspeed' is a system directory"),
    ("env_cache", "../cache", "env_cache: '../cache' leads outside the project directory"),
    (
        "environments.host",
        {"kind": "venv", "requirements": "../etc/passwd.txt", "python": "3.10"},
        "environments.host.requirements: '../etc/passwd.txt' does not match '^envs/",
    ),
    (
        "environments.host",
        {"kind": "venv", "requirements": "envs/nope.txt", "python": "3.10"},
        "environments.host.requirements: envs/nope.txt does not exist (lock files in envs/: ",
    ),
    # absurd sizes
    ("models.mlp.cpu.batch_size", 10**9, "models.mlp.cpu.batch_size: 1000000000 is greater than"),
    ("models.mlp.cpu.batch_size", 0, "models.mlp.cpu.batch_size: 0 is less than the minimum"),
    ("models.mlp.cpu.batch_size", 10**30, "models.mlp.cpu.batch_size: the integer is absurdly"),
    ("trials", 10**6, "trials: 1000000 is greater than the maximum of 100"),
    ("timeout_s", 1e12, "timeout_s: 1000000000000.0 is greater than the maximum of 604800"),
    ("timeout_s", math.nan, "timeout_s: nan is not a finite number"),
    ("timeout_s", -math.inf, "timeout_s: -inf is not a finite number"),
    ("mem_mb", 10**9, "mem_mb: 1000000000 is greater than the maximum of 16777216"),
    ("steps.measured", 10**7, "steps.measured: 10000000 is greater than the maximum of 100000"),
]


@pytest.mark.parametrize(("change", "value", "message"), BAD, ids=[b[0] for b in BAD])
def test_bad_input_is_one_line_naming_the_key(change: str, value: Any, message: str) -> None:
    config = changed(change, value)
    text = refusal(config)
    assert text.startswith(message), text
    assert is_one_line(text)
    assert names_a_key(text, config)


@pytest.mark.parametrize("character", METACHARACTERS)
@pytest.mark.parametrize("table", ["environments", "models", "variants", "comparisons"])
def test_names_with_shell_metacharacters_are_refused(table: str, character: str) -> None:
    config = copy.deepcopy(HOST_CONFIG)
    name = f"x{character}y"
    config[table][name] = copy.deepcopy(next(iter(config[table].values())))
    text = refusal(config)
    assert text.startswith(f"{table}: {name!r} does not match"), text
    assert is_one_line(text)


@pytest.mark.parametrize(
    ("raw", "message"),
    [
        (None, "(top level): the config is empty, not a mapping"),
        ([1, 2], "(top level): the config is a list, not a mapping"),
        ({1: "x"}, "(top level): key 1 is not a string"),
        ({"models": {"mlp": {True: 1}}}, "models.mlp: key True is not a string"),
        ({"results": b"x"}, "results: a value of type bytes is not a config value"),
    ],
)
def test_data_that_is_not_a_config_is_refused(raw: Any, message: str) -> None:
    text = refusal(raw)
    assert text.startswith(message), text
    assert names_a_key(text, raw)


def test_deep_or_self_referencing_data_is_refused() -> None:
    loop: list[Any] = []
    loop.append(loop)
    assert refusal(changed("modes", loop)).startswith("modes[0][0]")
    deep: Any = "train"
    for _ in range(100):
        deep = [deep]
    assert "nested deeper than" in refusal(changed("modes", deep))


def test_a_yte_template_config_file_is_refused(tmp_path: Path) -> None:
    """Snakemake evaluates YTE expressions while reading such a file (before the workflow can
    see it); the loader at least refuses to run it."""
    path = tmp_path / "config.yaml"
    path.write_text("__use_yte__: true\ntrials: ?1 + 1\n", encoding="utf-8")
    with pytest.raises(ConfigError, match=r"^__use_yte__: .* is a YTE template, whose"):
        prepare(copy.deepcopy(HOST_CONFIG), (path,))


def test_a_yte_switch_in_flow_style_or_unparsable_yaml_is_refused(tmp_path: Path) -> None:
    for text in ("{__use_yte__: true, trials: 2}\n", "__use_yte__: true\nx: !!python/name:os\n"):
        path = tmp_path / "config.yaml"
        path.write_text(text, encoding="utf-8")
        with pytest.raises(ConfigError, match=r"^__use_yte__: "):
            prepare(copy.deepcopy(HOST_CONFIG), (path,))


def test_a_json_config_file_is_never_a_template(tmp_path: Path) -> None:
    path = tmp_path / "config.json"
    path.write_text(json.dumps({**HOST_CONFIG, "title": "__use_yte__"}), encoding="utf-8")
    assert prepare(copy.deepcopy(HOST_CONFIG), (path,)) == "cpu"


def test_a_plain_config_file_is_read_as_data_only(tmp_path: Path) -> None:
    path = tmp_path / "config.yaml"
    path.write_text(yaml.safe_dump(HOST_CONFIG), encoding="utf-8")
    assert prepare(copy.deepcopy(HOST_CONFIG), (path,)) == "cpu"


# --- fuzzing --------------------------------------------------------------------------------

TEXT = st.text(st.characters(codec="utf-8", exclude_categories=["Cs"]), max_size=12)
KEYS = st.one_of(TEXT, st.sampled_from([*SCHEMA_KEYS, "cpu", "cuda", "batch_size", "env"]))
SCALARS = st.one_of(
    st.none(),
    st.booleans(),
    st.integers(),
    st.integers(min_value=-(2**70), max_value=2**70),
    st.floats(allow_nan=True, allow_infinity=True),
    TEXT,
    st.sampled_from(["eager", "compile", "host", "mlp", "train", "cpu", "auto", "results"]),
)
YAML_LIKE = st.recursive(
    SCALARS,
    lambda children: st.one_of(
        st.lists(children, max_size=4), st.dictionaries(KEYS, children, max_size=4)
    ),
    max_leaves=20,
)
FUZZ = settings(max_examples=examples(200))


def check_outcome(raw: Any) -> None:
    """prepare_config either accepts ``raw`` or refuses it with one line naming a key."""
    try:
        device_class = prepare(raw)
    except ConfigError as exc:
        text = str(exc)
        assert is_one_line(text), repr(text)
        assert names_a_key(text, raw), text
    else:
        assert device_class in ("cpu", "cuda")


@FUZZ
@given(YAML_LIKE)
def test_arbitrary_data_is_accepted_or_refused_in_one_line(raw: Any) -> None:
    check_outcome(raw)


@FUZZ
@given(st.dictionaries(KEYS, YAML_LIKE, max_size=8))
def test_arbitrary_mappings_are_accepted_or_refused_in_one_line(raw: dict[str, Any]) -> None:
    check_outcome(raw)


@st.composite
def mutated_default(draw: st.DrawFn) -> dict[str, Any]:
    """The default config with one value replaced, one key removed or one key added, at a
    place drawn anywhere in it."""
    config = copy.deepcopy(DEFAULT_CONFIG)
    target: Any = config
    while isinstance(target, dict) and target and draw(st.booleans()):
        key = draw(st.sampled_from(sorted(target)))
        if not isinstance(target[key], dict):
            break
        target = target[key]
    action = draw(st.sampled_from(["replace", "remove", "add"]))
    if action == "add" or not target:
        target[draw(KEYS)] = draw(YAML_LIKE)
    else:
        key = draw(st.sampled_from(sorted(target)))
        if action == "remove":
            del target[key]
        else:
            target[key] = draw(YAML_LIKE)
    return config


@FUZZ
@given(mutated_default())
def test_mutations_of_the_default_config_are_accepted_or_refused_in_one_line(
    raw: dict[str, Any],
) -> None:
    check_outcome(raw)


# --- what the check accepts, every cell runs ------------------------------------------------


@st.composite
def host_configs(draw: st.DrawFn) -> dict[str, Any]:
    """HOST_CONFIG with steps, sizes, modes, trials and a time limit drawn across (and past)
    the ranges the schema and the cells accept."""
    config = copy.deepcopy(HOST_CONFIG)
    config["steps"] = {name: draw(st.integers(0, 6)) for name in ("warmup", "measured", "numerics")}
    config["models"]["mlp"]["cpu"]["batch_size"] = draw(st.integers(0, 5000))
    config["modes"] = draw(st.lists(st.sampled_from(["train", "infer"]), min_size=1, unique=True))
    config["trials"] = draw(st.integers(1, 3))
    config["timeout_s"] = draw(st.sampled_from([0.5, 60, 1800]))
    config["oom_retry"] = draw(st.booleans())
    return config


@settings(max_examples=examples(150))
@given(host_configs())
def test_every_cell_of_an_accepted_config_runs(config: dict[str, Any]) -> None:
    """A config the check accepts never ends in a cell command that refuses its arguments
    (a usage error and no record): each cell's options parse back to the same spec, and the
    cell's own input check passes."""
    try:
        device_class = prepare(config)
    except ConfigError as exc:
        assert is_one_line(str(exc)) and names_a_key(str(exc), config), str(exc)
        return
    settings = settings_of(config, device_class)
    for cell in cells(settings):
        spec = cell_spec(settings, cell, threads=1)
        parsed = from_arguments(to_arguments(spec, config["oom_retry"]))
        assert parsed == spec
        check_cell(parsed)


def test_numerics_may_exceed_warmup() -> None:
    # The cell lengthens its warm-up to hold the check steps
    # (ptspeed.cell.measurement.warmup.WarmupPlan).
    prepare(changed("steps", {"warmup": 1, "numerics": 2}))


def test_a_claim_group_of_claims_yaml_is_accepted() -> None:
    prepare(changed("comparisons.two-hosts.claim", "pytorch-2.0-upgrade"))
