"""The knobs of the model's code and input pipeline in real cells: TorchScript, the attention
implementation, prefetching, and what torch.compile did (graphs, breaks, recompilations)."""

from __future__ import annotations

import contextlib
import dataclasses
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import torch
from helpers import (
    DROPOUT_SPEC,
    assert_measured,
    assert_valid_json_record,
    benchmark_python,
    tiny_cell,
)
from torch import nn
from torch.nn import functional
from transformers.utils import is_torch_sdpa_available

from ptspeed.cell import steps
from ptspeed.cell.device import torch_version
from ptspeed.cell.harness import run_cell
from ptspeed.cell.record import Record
from ptspeed.cell.variants.knobs import parse_knobs
from ptspeed.launch.watchdog import run_cell_in_worker
from ptspeed.models import Batch
from ptspeed.plan.config import ConfigError, prepare_config


def assert_ok_and_checked(record: Record) -> None:
    assert record.status == "ok", f"{record.reason}\n{record.detail}"
    assert record.numerics.checked, record.numerics.reason
    assert record.numerics.passed is True
    assert record.numerics.reference == "fp64"


# --- TorchScript --------------------------------------------------------------------------------


@pytest.mark.slow
@pytest.mark.parametrize(
    ("knobs", "mode", "fields"),
    [
        ("jit=script", "infer", {}),
        ("jit=trace+channels_last", "infer", {}),
        # Batch norm over 64 values per channel: a correct step is within fp32's bound.
        ("jit=script", "train", {"image_size": 64, "batch_size": 4}),
    ],
)
def test_resnet50_as_torchscript_computes_what_eager_does(
    knobs: str, mode: str, fields: dict[str, Any], tmp_path: Path
) -> None:
    spec = tiny_cell("resnet50", knobs, mode, **fields)
    record = run_cell(spec)
    assert_measured(record, spec)
    assert_ok_and_checked(record)
    # Profiling, then the optimised graph: both calls before the check steps and the window.
    assert record.metrics.one_off_steps == record.numerics.first_check_step == 2
    assert_valid_json_record(record, tmp_path)


@pytest.mark.slow
@pytest.mark.timeout(1500)  # 75 s on an idle 2-core machine, most of it the fp64 reference
def test_mask_rcnn_trains_scripted() -> None:
    # Scripted, torchvision's detection models return (losses, detections) in either mode.
    record = run_cell(tiny_cell("mask-rcnn", "jit=script"))
    assert_ok_and_checked(record)


@pytest.mark.slow
@pytest.mark.parametrize(
    ("model", "knobs", "reason"),
    [
        ("bert-tiny", "jit=script", "jit: torch.jit.script cannot take the model: RuntimeError: "),
        # Its output holds the attention cache beside the logits: no one TorchScript type.
        (
            "gpt2-tiny",
            "jit=trace",
            "jit: torch.jit.trace cannot take the model: RuntimeError: Tracer",
        ),
    ],
)
def test_a_model_torchscript_cannot_take_is_unsupported_with_torchs_reason(
    model: str, knobs: str, reason: str
) -> None:
    record = run_cell(tiny_cell(model, knobs, "infer"))
    assert record.status == "unsupported"
    assert record.reason.startswith(reason)
    assert "\n" not in record.reason and len(record.reason) < 300


def test_jit_with_amp_in_infer_mode_is_unsupported() -> None:
    record = run_cell(tiny_cell("mlp", "jit=script+amp=bf16", "infer"))
    assert record.status == "unsupported"
    assert "optimize_for_inference's module ignores autocast" in record.reason


class Output(dict):
    """A model output read by attribute, as transformers' ModelOutput is."""

    def __getattr__(self, name: str) -> Any:
        return self[name]


class KeywordNet(nn.Module):
    """Called with keywords and returning an Output, like the transformers models."""

    def __init__(self) -> None:
        super().__init__()
        self.layer = nn.Linear(16, 4)

    def forward(self, x: torch.Tensor, y: torch.Tensor) -> Output:
        logits = self.layer(x)
        return Output(loss=functional.cross_entropy(logits, y), logits=logits)


KEYWORD_SPEC = dataclasses.replace(
    DROPOUT_SPEC,
    build=lambda sizes: KeywordNet(),
    loss=lambda model, batch: model(x=batch["x"], y=batch["y"]).loss,
    infer=lambda model, batch: model(x=batch["x"], y=batch["y"]).logits,
)


@pytest.mark.slow
@pytest.mark.skipif(torch_version() < (2, 0), reason="tracing with keywords needs torch >= 2.0")
@pytest.mark.parametrize("mode", ["train", "infer"])
def test_a_keyword_called_model_is_traced_and_keeps_its_output_type(
    mode: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr("ptspeed.cell.harness.get_model", lambda name, shape="": KEYWORD_SPEC)
    record = run_cell(tiny_cell("mlp", "jit=trace", mode, batch_size=8))
    assert_ok_and_checked(record)


@pytest.mark.slow
@pytest.mark.parametrize("knobs", ["jit=script", "jit=trace"])
def test_torchscript_on_the_cpu_draws_eagers_dropout_masks(
    knobs: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    # Why the gate need not allow for other dropout masks here (it does on CUDA).
    monkeypatch.setattr("ptspeed.cell.harness.get_model", lambda name, shape="": DROPOUT_SPEC)
    record = run_cell(tiny_cell("mlp", knobs, batch_size=8, warmup_steps=2, numerics_steps=2))
    assert_ok_and_checked(record)
    assert record.numerics.variant_values == pytest.approx(record.numerics.reference_values)
    assert record.numerics.eager_spread_error < 1e-3


@pytest.mark.slow
def test_a_wrong_torchscript_step_is_caught() -> None:
    record = run_cell(tiny_cell("mlp", "jit=script", fault="grad"))
    assert record.status == "numerics_mismatch", record.reason


# --- attention ----------------------------------------------------------------------------------


@pytest.mark.slow
def test_the_attention_a_text_model_ran_with_is_recorded() -> None:
    default = run_cell(tiny_cell("gpt2-tiny", "eager", "infer"))
    chosen = run_cell(tiny_cell("gpt2-tiny", "attn=eager", "infer"))
    assert default.status == chosen.status == "ok"
    # transformers picks SDPA where its torch has it (from 2.1.1 on in transformers 4.46.3).
    expected = "sdpa" if is_torch_sdpa_available() else "eager"
    assert default.metrics.attn_implementation == expected
    assert chosen.metrics.attn_implementation == "eager"
    image = run_cell(tiny_cell("resnet50", "eager", "infer"))
    assert image.metrics.attn_implementation == ""


# --- the loader and prefetching -----------------------------------------------------------------


class FakeStream:
    """Stands for a CUDA stream: remembers what it waited for."""

    def __init__(self, log: list[str], name: str) -> None:
        self.log, self.name = log, name

    def wait_stream(self, other: FakeStream) -> None:
        self.log.append(f"{self.name} waits for {other.name}")


class FakeTensor:
    def __init__(self, log: list[str], value: int) -> None:
        self.log, self.value = log, value

    def record_stream(self, stream: FakeStream) -> None:
        self.log.append(f"batch {self.value} used on {stream.name}")


def test_the_prefetcher_copies_the_next_batch_before_the_step_runs(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    log: list[str] = []
    side, current = FakeStream(log, "side"), FakeStream(log, "current")
    in_side_stream = []
    monkeypatch.setattr(torch.cuda, "Stream", lambda device: side)
    monkeypatch.setattr(torch.cuda, "current_stream", lambda device: current)
    monkeypatch.setattr(torch.cuda, "stream", lambda stream: EnteredStream(in_side_stream, stream))

    def copy(batch: Batch, device: Any, nhwc: bool, non_blocking: bool) -> Batch:
        assert non_blocking and in_side_stream == [side]
        log.append(f"copy {batch['x']}")
        return {"x": FakeTensor(log, batch["x"])}

    monkeypatch.setattr(steps, "to_device", copy)
    host = iter(range(10))
    prefetcher = steps.SideStreamPrefetcher(lambda: {"x": next(host)}, torch.device("cuda"), False)
    assert [prefetcher()["x"].value for _ in range(3)] == [0, 1, 2]
    assert log[:5] == [
        "copy 0",
        "current waits for side",
        "batch 0 used on current",
        "copy 1",  # batch 1 is on its way while step 0 runs
        "current waits for side",
    ]


class EnteredStream:
    """A context manager that notes the stream it makes current."""

    def __init__(self, entered: list[Any], stream: Any) -> None:
        self.entered, self.stream = entered, stream

    def __enter__(self) -> None:
        self.entered.append(self.stream)

    def __exit__(self, *exc: object) -> None:
        self.entered.remove(self.stream)


def test_the_loader_takes_prefetch_factor_and_persistent_workers(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    made: list[dict[str, Any]] = []
    real = torch.utils.data.DataLoader

    def loader(*args: Any, **kwargs: Any) -> Any:
        made.append(kwargs)
        return real(*args, **kwargs)

    monkeypatch.setattr(torch.utils.data, "DataLoader", loader)
    batch = {"x": torch.zeros(2, 3)}
    steps.batch_supplier(batch, parse_knobs("loader=1+prefetch_factor=3+persistent"), CPU, 4)()
    steps.batch_supplier(batch, parse_knobs("loader=0"), CPU, 4)()
    assert made[0]["prefetch_factor"] == 3 and made[0]["persistent_workers"] is True
    assert "prefetch_factor" not in made[1] and made[1]["persistent_workers"] is False


CPU = torch.device("cpu")


# --- what the compiler did ----------------------------------------------------------------------


class BreakingNet(nn.Module):
    """A graph break on a value read back from a tensor; the code after it is guarded on that
    value, so it compiles again when the value changes."""

    def __init__(self) -> None:
        super().__init__()
        self.first = nn.Linear(16, 16)
        self.second = nn.Linear(16, 4)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        hidden = torch.relu(self.first(x))
        if float(hidden.sum()) < 0:
            hidden = -hidden
        return self.second(hidden)


BREAKING_SPEC = dataclasses.replace(DROPOUT_SPEC, build=lambda sizes: BreakingNet())


@pytest.mark.slow
@pytest.mark.skipif(torch_version() < (2, 0), reason="torch.compile needs torch >= 2.0")
def test_a_compiled_cell_records_graphs_and_compile_time_by_phase() -> None:
    record = run_cell(tiny_cell("mlp", "compile+backend=eager"))
    metrics = record.metrics
    assert record.status == "ok", record.reason
    assert metrics.compiled_graphs == 1
    assert metrics.graph_breaks == 0 and metrics.graph_break_reasons == []
    assert metrics.recompilations == 0 and metrics.recompile_reasons == []
    assert metrics.compile_time_by_phase_s
    assert all(seconds >= 0 for seconds in metrics.compile_time_by_phase_s.values())


@pytest.mark.slow
@pytest.mark.skipif(torch_version() < (2, 0), reason="torch.compile needs torch >= 2.0")
def test_graph_breaks_and_recompilations_are_recorded_with_their_reasons(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    monkeypatch.setattr("ptspeed.cell.harness.get_model", lambda name, shape="": BREAKING_SPEC)
    record = run_cell(tiny_cell("mlp", "compile+backend=eager", batch_size=4, warmup_steps=3))
    metrics = record.metrics
    assert record.status == "ok", record.reason
    assert metrics.compiled_graphs >= 2
    assert metrics.graph_breaks >= 1
    assert len(metrics.graph_break_reasons) >= 1
    assert all(reason and "\n" not in reason for reason in metrics.graph_break_reasons)
    assert metrics.recompilations >= 1 and metrics.recompile_reasons
    assert_valid_json_record(record, tmp_path)


@pytest.mark.slow
def test_a_cell_that_does_not_compile_records_no_compiler_stats() -> None:
    metrics = run_cell(tiny_cell("mlp", "jit=script")).metrics
    assert metrics.compiled_graphs is None and metrics.graph_breaks is None
    assert metrics.recompilations is None and metrics.compile_time_by_phase_s == {}


@pytest.mark.slow
@pytest.mark.skipif(torch_version() < (2, 0), reason="torch.compile needs torch >= 2.0")
def test_an_inductor_compile_records_its_graph_and_phases() -> None:
    record = run_cell(tiny_cell("mlp", "compile"))
    assert record.status == "ok", record.reason
    assert record.metrics.compiled_graphs >= 1
    assert record.metrics.graph_breaks == 0
    assert len(record.metrics.compile_time_by_phase_s) >= 2


# --- the older environments ---------------------------------------------------------------------

# (env, model, knobs, mode, status, reason fragment)
OLDER_ENVIRONMENTS = [
    ("torch-1.13", "mlp", "jit=script", "train", "ok", ""),
    ("torch-1.13", "mlp", "jit=trace", "infer", "ok", ""),
    ("torch-1.13", "resnet50", "jit=trace", "infer", "ok", ""),
    (
        "torch-1.13",
        "gpt2-tiny",
        "jit=trace",
        "infer",
        "unsupported",
        "takes positional inputs only",
    ),
    ("torch-1.13", "gpt2-tiny", "attn=sdpa", "infer", "unsupported", "Please install torch>=2.1.1"),
    ("torch-2.0", "mlp", "jit=trace", "train", "ok", ""),
    ("torch-2.0", "resnet50", "jit=script", "infer", "ok", ""),
    ("torch-2.0", "bert-tiny", "jit=trace", "infer", "ok", ""),
    ("torch-2.0", "gpt2-tiny", "attn=sdpa", "infer", "unsupported", "Please install torch>=2.1.1"),
    ("torch-2.0", "mlp", "compile+backend=eager", "train", "ok", ""),
]


@pytest.mark.slow
@pytest.mark.crossversion
@pytest.mark.parametrize(
    ("env", "model", "knobs", "mode", "status", "fragment"), OLDER_ENVIRONMENTS
)
@pytest.mark.timeout(900)
def test_the_knobs_in_the_older_environments(
    env: str, model: str, knobs: str, mode: str, status: str, fragment: str, tmp_path: Path
) -> None:
    spec = dataclasses.replace(tiny_cell(model, knobs, mode), env=env, timeout_s=600.0)
    record = run_cell_in_worker(spec, tmp_path / "cell.json", python=benchmark_python(env))
    assert record.provenance.torch.startswith({"torch-1.13": "1.13.1", "torch-2.0": "2.0.1"}[env])
    assert record.status == status, f"{record.reason}\n{record.detail}"
    assert fragment in record.reason
    if status == "ok":
        assert record.numerics.checked and record.numerics.passed
    if model == "bert-tiny":
        assert record.metrics.attn_implementation == "eager"  # transformers' only one there
    if "compile" in knobs:
        assert record.metrics.compiled_graphs == 1 and record.metrics.compile_time_by_phase_s


# --- the config ---------------------------------------------------------------------------------

NEW_VARIANTS = {
    "script": "jit=script",
    "trace": "jit=trace+amp=bf16",
    "sdpa": "attn=sdpa",
    "plain-attention": "attn=eager",
    "prefetch": "loader=2+pin+prefetch",
    "workers": "loader=2+prefetch_factor=4+persistent",
}


def config_with(variants: dict[str, str], results: Path) -> dict[str, Any]:
    return {
        "results": str(results),
        "device": "cpu",
        "environments": {"here": {"kind": "host"}},
        "models": {"bert-base": {"cpu": {"batch_size": 2, "seq_len": 16}}},
        "variants": {"eager": "eager", **variants},
        "comparisons": {
            "jit": {
                "baseline": {"env": "here", "variant": "eager"},
                "candidate": {"env": "here", "variant": next(iter(variants))},
            }
        },
    }


def test_the_config_takes_the_new_knobs(tmp_path: Path) -> None:
    settings = prepare_config(config_with(NEW_VARIANTS, tmp_path), lambda device: "cpu")
    assert settings.device == "cpu"


@pytest.mark.parametrize(
    ("knobs", "message"),
    [
        ("jit=fast", "variants.bad: knobs: jit=fast is not one of script, trace"),
        ("attn=flash", "variants.bad: knobs: attn=flash is not one of sdpa, eager"),
        ("jit=trace+cudagraphs", "variants.bad: knobs: jit and cudagraphs cannot be combined"),
        ("loader=0+persistent", "variants.bad: knobs: persistent needs loader=N with N >= 1"),
    ],
)
def test_the_config_refuses_a_bad_new_knob_in_one_line(
    knobs: str, message: str, tmp_path: Path
) -> None:
    with pytest.raises(ConfigError) as caught:
        prepare_config(config_with({"bad": knobs}, tmp_path), lambda device: "cpu")
    assert str(caught.value).startswith(message)
    assert "\n" not in str(caught.value)


@pytest.mark.parametrize("thread_local", [True, False])
def test_a_cuda_graph_beside_a_loader_is_captured_thread_local(
    thread_local: bool, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A loader's pin-memory thread calls CUDA during the capture: the capture checks only its
    own thread's calls (capture_error_mode='thread_local'), else the global default."""
    given: list[dict[str, str]] = []

    @contextlib.contextmanager
    def graph(cuda_graph: object, **options: str) -> Iterator[None]:
        given.append(options)
        yield

    monkeypatch.setattr(torch.cuda, "CUDAGraph", object)
    monkeypatch.setattr(torch.cuda, "graph", graph)
    step = steps.CudaGraphStep(lambda batch: batch["x"] * 2, thread_local=thread_local)
    step._capture({"x": torch.ones(2)})
    assert given == [{"capture_error_mode": "thread_local"} if thread_local else {}]
