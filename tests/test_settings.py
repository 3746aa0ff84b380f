"""ptspeed.plan.settings: the config as typed, immutable settings, built once."""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path

import pytest
import yaml

from ptspeed.plan.config import prepare_config
from ptspeed.plan.schema import default_config, default_settings, settings_from
from ptspeed.plan.settings import SizeTable, frozen, thawed

ROOT = Path(__file__).resolve().parents[1]
SMALL = {
    "environments": {"base": {"kind": "host"}},
    "models": {"mlp": {"cpu": {"batch_size": 4}}},
    "variants": {"eager": "eager", "compile": "compile"},
    "comparisons": {
        "compile": {
            "baseline": {"env": "base", "variant": "eager"},
            "candidate": {"env": "base", "variant": "compile"},
        }
    },
}


def test_default_config_builds_every_part() -> None:
    settings = default_settings()
    config = default_config()
    assert settings.trials == config["trials"]
    assert settings.steps.measured == config["steps"]["measured"]
    assert settings.conditions.throttle_reasons == tuple(config["conditions"]["throttle_reasons"])
    assert settings.cluster.gpu_request == config["cluster"]["gpu_request"]
    assert list(settings.environments) == list(config["environments"])
    assert list(settings.comparisons) == list(config["comparisons"])
    resnet = settings.model_sizes("resnet50", "cuda")
    assert resnet == SizeTable(**config["models"]["resnet50"]["cuda"])


def test_small_config_takes_the_schema_defaults() -> None:
    settings = settings_from(SMALL)
    assert settings.results == "results"
    assert settings.modes == ("train",)
    assert settings.platforms == {} and settings.suites == {}
    assert settings.environments["base"].requirements == ""
    assert settings.model_sizes("mlp", "cpu") == SizeTable(batch_size=4)
    assert settings.model_sizes("mlp", "cuda") is None
    assert settings.env_variant_pairs() == [("base", "eager"), ("base", "compile")]
    assert not settings.containers.pushes
    assert settings.trials is None  # read for the tables: no count of trials to judge by


@pytest.mark.parametrize("build", [default_settings, lambda: settings_from(SMALL)])
def test_round_trip(build) -> None:
    settings = build()
    mapping = settings.to_mapping()
    assert settings_from(json.loads(json.dumps(mapping))) == settings
    assert thawed(frozen(mapping)) == mapping


def test_a_shape_and_one_table_for_all() -> None:
    config = {
        **SMALL,
        "models": {
            "tiny": {
                "source": "transformers:gpt2",
                "cpu": {"batch_size": 2, "shape": {"layers": 2}},
            },
            "old": {"batch_size": 3, "seq_len": 16},
        },
    }
    settings = settings_from(config)
    assert settings.models["tiny"].sizes("cpu").shape == {"layers": 2}
    assert settings.model_sizes("old", "cuda") == SizeTable(batch_size=3, seq_len=16)


def test_settings_are_immutable() -> None:
    settings = default_settings()
    with pytest.raises(dataclasses.FrozenInstanceError):
        settings.trials = 1  # type: ignore[misc]
    with pytest.raises(dataclasses.FrozenInstanceError):
        settings.steps.warmup = 1  # type: ignore[misc]
    with pytest.raises(TypeError):
        settings.variants["new"] = "eager"  # type: ignore[index]
    assert isinstance(settings.modes, tuple)


def test_prepare_config_gives_the_settings_with_the_device_resolved() -> None:
    raw = yaml.safe_load((ROOT / "config" / "config.yaml").read_text(encoding="utf-8"))
    settings = prepare_config(raw, lambda requested: "cpu", ROOT)
    assert settings.device == "cpu"
    assert settings.trials == raw["trials"]
