"""Models by reference: a user's module:attribute, the libraries' families, suites; names
refused in one line before any job, and cells of each run from the command line."""

from __future__ import annotations

import copy
import json
import sys
from pathlib import Path
from typing import Any

import pytest
import torch
from helpers import TINY_CELL, USER_MODEL_MODULE, ptspeed, read_valid_record, settings_of

from ptspeed.cell.steps import build_model
from ptspeed.errors import BadInput, ConfigError, Unsupported
from ptspeed.models import (
    ModelSpec,
    Reference,
    Sizes,
    check_sizes,
    get_model,
    parse_reference,
    parse_shape,
    shape_text,
)
from ptspeed.models.catalog import check_known
from ptspeed.models.families import config_fields
from ptspeed.plan.matrix import cell_spec, cells, check_config
from ptspeed.plan.suites import expand_suites, model_name

LLAMA_SHAPE = "layers=2,hidden=64,heads=4,kv_heads=2,vocab=512"
CPU = torch.device("cpu")


@pytest.fixture
def user_models(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """A directory outside the package holding ``mymodels.py``, on sys.path."""
    directory = tmp_path / "user"
    directory.mkdir()
    (directory / "mymodels.py").write_text(USER_MODEL_MODULE, encoding="utf-8")
    monkeypatch.syspath_prepend(str(directory))
    return directory


# --- references -----------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("text", "reference"),
    [
        ("resnet50", Reference("zoo", "", "resnet50")),
        ("torchvision:resnet18", Reference("torchvision", "torchvision", "resnet18")),
        ("transformers:qwen2", Reference("transformers", "transformers", "qwen2")),
        ("timm:vit_small.augreg", Reference("timm", "timm", "vit_small.augreg")),
        ("my.pkg:make.spec", Reference("module", "my.pkg", "make.spec")),
    ],
)
def test_references_parse(text: str, reference: Reference) -> None:
    assert parse_reference(text) == reference
    assert str(reference) == text


@pytest.mark.parametrize(
    ("text", "message"),
    [
        (
            "transformers:",
            "model: 'transformers:' names no transformers model "
            "(accepted: transformers:<model_type>)",
        ),
        (
            "torchvision:",
            "model: 'torchvision:' names no torchvision model (accepted: torchvision:<name>)",
        ),
        ("vgg16", "model: unknown 'vgg16' (accepted: mlp, lstm-lm, "),
        (":spec", "model: unknown ':spec' (accepted: "),
        ("pkg:", "model: unknown 'pkg:' (accepted: "),
    ],
)
def test_bad_references_are_one_line_naming_what_is_accepted(text: str, message: str) -> None:
    with pytest.raises(BadInput) as caught:
        parse_reference(text)
    assert str(caught.value).startswith(message)
    assert "module:attribute" in str(caught.value) or "accepted: t" in str(caught.value)
    assert "\n" not in str(caught.value)


def test_shapes_round_trip_and_refuse_unknown_keys() -> None:
    assert parse_shape(LLAMA_SHAPE) == {
        "layers": 2,
        "hidden": 64,
        "heads": 4,
        "kv_heads": 2,
        "vocab": 512,
    }
    assert shape_text({"vocab": 512, "layers": 2}) == "layers=2,vocab=512"
    with pytest.raises(BadInput, match=r"^shape: unknown 'width' \(accepted: layers, hidden"):
        parse_shape("width=3")
    with pytest.raises(BadInput, match=r"^shape: layers='0' is not a positive whole number"):
        parse_shape("layers=0")
    with pytest.raises(BadInput, match=r"^shape: torchvision:resnet18 takes none"):
        check_sizes("torchvision:resnet18", Sizes(2), "layers=2")


@pytest.mark.parametrize(
    ("reference", "message"),
    [
        (
            "torchvision:nosuch",
            "model: torchvision:nosuch is not a classification, detection or segmentation "
            "builder of torchvision (e.g. alexnet",
        ),
        ("transformers:nosuch", "model: transformers:nosuch is not a model type with a causal-LM"),
        (
            "mymodels:missing",
            "model: mymodels has no attribute 'missing' (accepted: a ptspeed.models.ModelSpec",
        ),
    ],
)
def test_names_nothing_knows_are_refused(user_models: Path, reference: str, message: str) -> None:
    with pytest.raises(BadInput) as caught:
        check_known(parse_reference(reference))
    assert str(caught.value).startswith(message)


def test_known_names_and_modules_found_elsewhere_pass(user_models: Path) -> None:
    for reference in ("torchvision:resnet18", "transformers:llama", "mymodels:TINY", "nowhere:x"):
        check_known(parse_reference(reference))


# --- a user's model -------------------------------------------------------------------------


def test_a_users_spec_is_the_attribute_or_what_its_function_returns(user_models: Path) -> None:
    assert get_model("mymodels:TINY").description == "a user's linear classifier"
    spec = get_model("mymodels:tiny")
    assert isinstance(spec, ModelSpec) and spec.limits == {"seq_len": (4, 64)}
    with pytest.raises(BadInput, match=r"^model: mymodels:NOT_A_SPEC gives a int \(accepted"):
        get_model("mymodels:NOT_A_SPEC")
    with pytest.raises(Unsupported, match=r"module nowhere is not importable in this environment"):
        get_model("nowhere:spec")


def test_a_missing_dependency_of_a_users_module_is_its_own_failure(user_models: Path) -> None:
    (user_models / "broken.py").write_text("import no_such_dependency\n", encoding="utf-8")
    with pytest.raises(ModuleNotFoundError, match="no_such_dependency"):
        get_model("broken:spec")


def test_a_users_model_runs_as_a_cell_from_the_command_line(
    user_models: Path, tmp_path: Path
) -> None:
    out = tmp_path / "cell.json"
    arguments = [*TINY_CELL, "--variant", "compile", "--knobs", "compile", "--seq-len", "8"]
    arguments[arguments.index("mlp")] = "mymodels:tiny"
    result = ptspeed("cell", *arguments, "--out", str(out), env={"PYTHONPATH": str(user_models)})
    assert result.returncode == 0, result.stderr[-3000:]
    record = read_valid_record(out)
    assert record.status == "ok", record.reason
    assert record.cell.model == "mymodels:tiny"
    assert record.numerics.passed is True  # the gate ran: compiled against eager
    out.unlink()
    arguments[arguments.index("8")] = "65"  # outside the spec's own limits
    ptspeed("cell", *arguments, "--out", str(out), env={"PYTHONPATH": str(user_models)})
    record = read_valid_record(out)
    assert (record.status, record.reason) == ("failed", record.reason)
    assert "seq_len: 65 is outside 4..64 for tiny" in record.reason


# --- the families ---------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("reference", "shape", "sizes", "description"),
    [
        (
            "torchvision:resnet18",
            "",
            Sizes(2, image_size=32),
            "torchvision resnet18 (classification)",
        ),
        ("torchvision:lraspp_mobilenet_v3_large", "", Sizes(2, image_size=32), "(segmentation)"),
        (
            "transformers:llama",
            LLAMA_SHAPE,
            Sizes(2, seq_len=8),
            "LlamaForCausalLM (layers 2, hidden 64, heads 4, kv_heads 2, "
            "intermediate 172, vocab 512)",
        ),
        (
            "transformers:vit",
            "layers=1,hidden=32,heads=2",
            Sizes(2, image_size=32),
            "ViTForImageClassification (layers 1",
        ),
        (
            "transformers:t5",
            "layers=1,hidden=32,heads=2,vocab=128",
            Sizes(2, seq_len=8),
            "T5ForConditionalGeneration",
        ),
        (
            "transformers:bert",
            "layers=1,hidden=32,heads=2,vocab=128",
            Sizes(2, seq_len=8),
            "BertForMaskedLM",
        ),
    ],
)
def test_family_models_train_and_infer(
    reference: str, shape: str, sizes: Sizes, description: str
) -> None:
    spec = get_model(reference, shape)
    assert description in spec.description
    assert spec.layering is None and reference in spec.unstaged_reason
    model = build_model(spec, sizes, 0, CPU)
    batch = spec.make_batch(sizes, torch.Generator().manual_seed(0))
    loss = spec.loss(model.train(), batch)
    loss.backward()
    assert torch.isfinite(loss)
    with torch.no_grad():
        output = spec.infer(model.eval(), batch)
    assert output.shape[0] == sizes.batch_size


def test_a_transformers_shape_sets_its_configs_own_fields() -> None:
    t5 = parse_reference("transformers:t5")
    assert config_fields(t5, {"hidden": 32, "heads": 2}) == {"d_model": 32, "num_heads": 2}
    llama = parse_reference("transformers:llama")
    assert config_fields(llama, {"hidden": 2048}) == {  # 4096 → 11008: the ratio is kept
        "hidden_size": 2048,
        "intermediate_size": 5504,
    }
    with pytest.raises(BadInput, match=r"^shape: transformers:vit has no vocab"):
        config_fields(parse_reference("transformers:vit"), {"vocab": 100})


def test_the_attention_knob_reaches_a_family_model() -> None:
    spec = get_model("transformers:llama", LLAMA_SHAPE)
    assert spec.blocks == ("LlamaDecoderLayer",)
    for attn in ("eager", "sdpa"):
        model = build_model(spec, Sizes(2, seq_len=8), 0, CPU, attn)
        assert spec.attention(model) == attn


def test_what_an_environment_lacks_is_unsupported_with_the_reason(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    with pytest.raises(
        Unsupported, match=r"transformers 4\.\d+\.\d+ here has no model type 'nosuch'"
    ):
        get_model("transformers:nosuch")
    with pytest.raises(Unsupported, match=r"no synthetic keypoint targets"):
        get_model("torchvision:keypointrcnn_resnet50_fpn")
    monkeypatch.setitem(sys.modules, "timm", None)  # an environment without timm
    with pytest.raises(Unsupported, match=r"timm is not installed here"):
        get_model("timm:resnet18")


# --- the config -----------------------------------------------------------------------------

PLAN: dict[str, Any] = {
    "results": "results",
    "trials": 1,
    "timeout_s": 600,
    "steps": {"warmup": 1, "measured": 2, "numerics": 1},
    "modes": ["train"],
    "model_paths": [],
    "environments": {"host": {"kind": "host"}},
    "models": {
        "mlp": {"cpu": {"batch_size": 4}},
        "llama-small": {
            "source": "transformers:llama",
            "cpu": {
                "batch_size": 2,
                "seq_len": 16,
                "shape": {"layers": 2, "hidden": 64, "heads": 4},
            },
        },
    },
    "variants": {"eager": "eager", "compile": "compile"},
    "comparisons": {
        "compiler": {
            "baseline": {"env": "host", "variant": "eager"},
            "candidate": {"env": "host", "variant": "compile"},
        }
    },
}


def test_a_sourced_model_plans_its_cells_with_source_shape_and_the_sizes_it_sets() -> None:
    config = copy.deepcopy(PLAN)
    check_config(settings_of(config, "cpu"))
    planned = [c for c in cells(settings_of(config, "cpu")) if c.model == "llama-small"]
    assert {c.size for c in planned} == {"b2-s16"}
    spec = cell_spec(settings_of(config, "cpu"), planned[0])
    assert (spec.source, spec.shape) == ("transformers:llama", "layers=2,hidden=64,heads=4")
    assert spec.model_reference == "transformers:llama"


@pytest.mark.parametrize(
    ("source", "message"),
    [
        (
            "torchvision:nosuch",
            "models.x.source: model: torchvision:nosuch is not a classification",
        ),
        (
            "transformers:",
            "models.x.source: model: 'transformers:' names no transformers model "
            "(accepted: transformers:<model_type>)",
        ),
        ("mymodels:missing", "models.x.source: model: mymodels has no attribute 'missing'"),
    ],
)
def test_bad_sources_are_refused_naming_the_model(
    user_models: Path, source: str, message: str
) -> None:
    config = copy.deepcopy(PLAN)
    config["models"]["x"] = {"source": source, "cpu": {"batch_size": 2}}
    config["model_paths"] = [str(user_models)]
    with pytest.raises(ConfigError) as caught:
        check_config(settings_of(config, "cpu"))
    assert str(caught.value).startswith(message)


def test_a_shape_on_a_model_that_takes_none_is_refused() -> None:
    config = copy.deepcopy(PLAN)
    config["models"]["mlp"]["cpu"]["shape"] = {"layers": 2}
    with pytest.raises(ConfigError, match=r"^models\.mlp\.cpu\.shape: mlp takes none"):
        check_config(settings_of(config, "cpu"))


# --- suites ---------------------------------------------------------------------------------


def test_a_suite_becomes_models_of_its_family() -> None:
    config = copy.deepcopy(PLAN)
    sizes = {"batch_size": 2, "image_size": 32}
    config["suites"] = {
        "listed": {"family": "torchvision", "models": ["resnet18", "alexnet"], "cpu": sizes},
        "matched": {
            "family": "torchvision",
            "pattern": "resnet*",
            "task": "classification",
            "exclude": ["resnet18", "resnet152"],
            "cpu": sizes,
        },
    }
    expand_suites(config)
    assert config["models"]["alexnet"] == {
        "source": "torchvision:alexnet",
        "suite": "listed",
        "cpu": sizes,
    }
    matched = [name for name, entry in config["models"].items() if entry.get("suite") == "matched"]
    assert matched == ["resnet101", "resnet34", "resnet50"]
    assert model_name("ResNet-50_v2+x") == "resnet-50_v2-x"


def test_a_suite_model_named_as_a_configured_one_clashes() -> None:
    config = copy.deepcopy(PLAN)
    config["suites"] = {"s": {"family": "torchvision", "pattern": "resnet50"}}
    config["models"]["resnet50"] = {"cpu": {"batch_size": 2}}
    with pytest.raises(ConfigError, match=r"^suites\.s: its member resnet50 is named resnet50"):
        expand_suites(config)


@pytest.mark.parametrize(
    ("suite", "message"),
    [
        ({"family": "torchvision"}, "suites.s: give models (a list) or pattern, one of the two"),
        (
            {"family": "torchvision", "pattern": "zz*"},
            "suites.s.pattern: 'zz*' matches no torchvision model",
        ),
        (
            {"family": "transformers", "pattern": "*", "task": "detection"},
            "suites.s.task: only torchvision",
        ),
    ],
)
def test_a_suite_that_selects_nothing_is_refused(suite: dict[str, Any], message: str) -> None:
    config = copy.deepcopy(PLAN)
    config["suites"] = {"s": suite}
    with pytest.raises(ConfigError) as caught:
        expand_suites(config)
    assert str(caught.value) == message or str(caught.value).startswith(message)


def test_the_record_names_its_source(tmp_path: Path) -> None:
    out = tmp_path / "cell.json"
    arguments = [*TINY_CELL, "--image-size", "32"]
    arguments[arguments.index("mlp")] = "r18"
    result = ptspeed("cell", *arguments, "--source", "torchvision:resnet18", "--out", str(out))
    assert result.returncode == 0, result.stderr[-3000:]
    data = json.loads(out.read_text(encoding="utf-8"))
    assert (data["cell"]["model"], data["cell"]["source"]) == ("r18", "torchvision:resnet18")
    assert data["status"] == "ok", data["reason"]


def test_a_timm_model_trains_where_timm_is_installed() -> None:
    pytest.importorskip("timm")  # in no environment of envs/; a user's may carry it
    check_known(parse_reference("timm:resnet18"))
    with pytest.raises(BadInput, match=r"^model: timm:nosuch is not a model name of timm"):
        check_known(parse_reference("timm:nosuch"))
    spec, sizes = get_model("timm:resnet18"), Sizes(2, image_size=32)
    model = build_model(spec, sizes, 0, CPU)
    loss = spec.loss(model.train(), spec.make_batch(sizes, torch.Generator().manual_seed(0)))
    assert torch.isfinite(loss)
