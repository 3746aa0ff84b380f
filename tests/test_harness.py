"""The in-process harness: every model and knob at a tiny size, the numerics gate, faults."""

from __future__ import annotations

import dataclasses
import importlib.util
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch
from helpers import (
    DROPOUT_SPEC,
    DropoutNet,
    assert_measured,
    assert_valid_json_record,
    by_cost,
    is_heavy,
    knob_cases,
    tiny_cell,
)

from ptspeed.cell.harness import GATE_IN_FIRST_TRIAL, run_cell
from ptspeed.cell.measurement import timing
from ptspeed.cell.record import Record
from ptspeed.models import REGISTRY

HAS_FLOP_COUNTER = importlib.util.find_spec("torch.utils.flop_counter") is not None


@pytest.mark.slow
@pytest.mark.parametrize("mode", ["train", "infer"])
@pytest.mark.parametrize("model", by_cost(REGISTRY))
def test_every_model_runs_a_tiny_cell(model: str, mode: str, tmp_path: Path) -> None:
    spec = tiny_cell(model, mode=mode)
    record = run_cell(spec)
    assert_measured(record, spec)
    if HAS_FLOP_COUNTER:
        assert record.metrics.flops_per_sample > 0
        assert record.metrics.achieved_flops_per_s == pytest.approx(
            record.metrics.flops_per_sample * record.metrics.throughput_samples_per_s
        )
    assert record.numerics.checked is False
    assert record.numerics.reason == "eager fp32 is the reference itself"
    assert record.provenance.torch == torch.__version__
    assert_valid_json_record(record, tmp_path)


# ResNet-50 trains without a numerics check here: at tiny sizes its last batch norm normalises
# a handful of values, so any reordering of the sums (channels_last) is amplified past the
# fp32 bound, and the fp64 reference of a training step takes half a minute on a small CPU.
NO_NUMERICS = {"numerics_steps": 0}
SUPPORTED_ON_CPU: list[tuple[str, str, str, dict[str, Any]]] = [
    ("mlp", "eager", "train", {}),
    ("mlp", "compile+backend=eager", "train", {}),
    ("mlp", "compile+backend=eager", "infer", {}),
    ("mlp", "compile=max-autotune+backend=aot_eager", "train", {}),
    ("mlp", "compile", "train", {}),  # inductor: a real C++ compile
    ("mlp", "amp", "train", {}),
    ("mlp", "amp", "infer", {}),
    ("mlp", "amp=bf16", "train", {}),
    ("resnet50", "channels_last", "train", NO_NUMERICS),
    ("resnet50", "channels_last", "infer", {}),
    ("mlp", "loader=0", "train", {}),
    ("mlp", "loader=2", "train", {}),
    ("mlp", "loader=2", "infer", {}),
    ("mlp", "loader=1+prefetch_factor=4+persistent", "train", {}),
    ("mlp", "jit=script", "train", {}),
    ("mlp", "jit=script", "infer", {}),
    ("mlp", "jit=trace", "train", {}),
    ("mlp", "jit=trace+amp=bf16", "train", {}),
    ("mlp", "jit=trace", "infer", {}),
    # The transformers models' knobs on their tiny configurations: the same classes and code
    # paths as the full-size models, which every_model_runs_a_tiny_cell runs.
    ("bert-tiny", "jit=trace", "train", {}),
    ("bert-tiny", "jit=trace", "infer", {}),
    ("bert-tiny", "attn=sdpa", "train", {}),
    ("gpt2-tiny", "attn=sdpa", "infer", {}),
    ("gpt2-tiny", "attn=eager", "infer", {}),
]


@pytest.mark.slow
@pytest.mark.parametrize(
    ("model", "knobs", "mode", "fields"),
    [
        pytest.param(*case, id="-".join(case[:3]), marks=[pytest.mark.slow] * is_heavy(*case[:2]))
        for case in SUPPORTED_ON_CPU
    ],
)
def test_supported_knobs_run_and_match_eager(
    model: str, knobs: str, mode: str, fields: dict[str, Any]
) -> None:
    spec = tiny_cell(model, knobs, mode, **fields)
    record = run_cell(spec)
    assert_measured(record, spec)
    if knobs != "eager" and spec.numerics_steps:
        assert record.numerics.checked, record.numerics.reason
        assert record.numerics.passed is True
        assert record.numerics.reference == "fp64"


UNSUPPORTED_ON_CPU = [
    ("mlp", "amp=fp16", "amp=fp16 (fp16 autocast with GradScaler) needs a CUDA device"),
    ("mlp", "channels_last", "channels_last applies to image models"),
    ("mlp", "cudagraphs", "cudagraphs needs a CUDA device"),
    ("resnet50", "cudagraphs", "cudagraphs needs a CUDA device"),
    ("mlp", "loader=2+pin", "pin (pinned host memory) needs a CUDA device"),
    ("mlp", "memfrac=0.8", "memfrac (set_per_process_memory_fraction) needs a CUDA device"),
    ("mlp", "loader=1+pin+prefetch", "prefetch (host-to-device copies on a side CUDA stream"),
    ("mlp", "attn=sdpa", "attn applies to models with transformers' attention"),
    ("resnet50", "attn=eager", "attn applies to models with transformers' attention"),
]


@pytest.mark.parametrize(("model", "knobs", "reason"), UNSUPPORTED_ON_CPU)
def test_unsupported_knobs_are_recorded_with_a_reason(
    model: str, knobs: str, reason: str, tmp_path: Path
) -> None:
    record = run_cell(tiny_cell(model, knobs))
    assert record.status == "unsupported"
    assert record.reason.startswith(reason)
    assert record.metrics.throughput_samples_per_s is None
    assert record.provenance.torch == torch.__version__
    assert_valid_json_record(record, tmp_path)


@pytest.mark.skipif(torch.cuda.is_available(), reason="needs a machine without CUDA")
def test_cuda_requested_without_a_gpu_is_unsupported() -> None:
    record = run_cell(tiny_cell("mlp", device="cuda"))
    assert record.status == "unsupported"
    assert "no CUDA device" in record.reason


@pytest.mark.slow
@pytest.mark.parametrize("mode", ["train", "infer"])
def test_a_wrong_variant_is_a_numerics_mismatch(mode: str, tmp_path: Path) -> None:
    record = run_cell(tiny_cell("mlp", mode=mode, fault="numerics"))
    assert record.status == "numerics_mismatch"
    compared = "loss" if mode == "train" else "output"
    assert record.reason.startswith(f"{compared} differs from eager fp64 by 0.1 (allowed ")
    assert record.reason.endswith(" for fp32)")
    assert record.numerics.checked and record.numerics.passed is False
    assert record.numerics.allowed_error < 0.1
    assert record.numerics.max_relative_error == pytest.approx(0.1, rel=1e-3)
    assert_valid_json_record(record, tmp_path)


@pytest.mark.slow
@pytest.mark.parametrize(("knobs", "precision"), [("loader=0", "fp32"), ("amp=bf16", "bf16")])
@pytest.mark.parametrize("mode", ["train", "infer"])
def test_a_correct_variant_passes_the_numerics_gate(knobs: str, precision: str, mode: str) -> None:
    record = run_cell(tiny_cell("mlp", knobs, mode, warmup_steps=2, numerics_steps=2))
    check = record.numerics
    assert record.status == "ok", record.reason
    assert check.checked and check.passed is True
    assert check.reference == "fp64"
    assert check.precision == precision
    assert check.compared == ("loss, gradients, update" if mode == "train" else "output")
    # The two steps after the one-off work, and one after the measured window.
    assert len(check.variant_values) == len(check.fp64_values) == 3
    assert check.max_relative_error <= check.allowed_error


@pytest.mark.slow
def test_the_fp64_reference_keeps_fp64_precision() -> None:
    check = run_cell(tiny_cell("mlp", "loader=0", numerics_steps=1)).numerics
    fp64_loss = check.fp64_values[0]
    assert float(np.float32(fp64_loss)) != fp64_loss, "the fp64 loss was rounded to fp32"
    assert check.eager_error > 0


def test_numerics_steps_zero_skips_the_check() -> None:
    record = run_cell(tiny_cell("mlp", "loader=0", numerics_steps=0))
    assert record.status == "ok"
    assert record.numerics.checked is False
    assert record.numerics.reason == "numerics_steps is 0"


@pytest.mark.slow
def test_a_later_trial_leaves_the_gate_to_the_first_and_runs_the_same_steps() -> None:
    """A wrong variant's later trial is not judged in the cell (aggregation gives it trial 0's
    verdict) but runs as many steps as trial 0, so that its last loss is the same trajectory's."""
    first = run_cell(
        tiny_cell("mlp", "loader=0", warmup_steps=1, numerics_steps=2, fault="numerics")
    )
    later = run_cell(
        tiny_cell(
            "mlp",
            "loader=0",
            warmup_steps=1,
            numerics_steps=2,
            fault="numerics",
            numerics_by_first_trial=True,
        )
    )
    assert first.status == "numerics_mismatch"
    assert later.status == "ok", later.reason
    assert later.numerics.checked is False
    assert later.numerics.reason == GATE_IN_FIRST_TRIAL
    assert later.metrics.warmup_steps_run == first.metrics.warmup_steps_run == 2
    assert later.metrics.loss_last == first.metrics.loss_last


@pytest.mark.slow
@pytest.mark.parametrize("knobs", knob_cases(["loader=0", "loader=2", "compile+backend=aot_eager"]))
def test_random_ops_see_the_same_random_numbers_as_the_reference(
    knobs: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr("ptspeed.cell.harness.get_model", lambda name, shape="": DROPOUT_SPEC)
    record = run_cell(tiny_cell("mlp", knobs, batch_size=8, warmup_steps=2, numerics_steps=2))
    assert record.status == "ok", record.reason
    # fp32 code on the same weights, batch and random numbers: equal to eager fp32.
    assert record.numerics.variant_values == pytest.approx(record.numerics.reference_values)


@pytest.mark.slow
def test_compiled_dropout_passes_within_the_spread_of_reseeded_eager(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # Inductor draws its own dropout masks, so the compiled loss cannot equal eager's; the
    # gate allows what eager itself moves under another seed, and says how much that was.
    monkeypatch.setattr("ptspeed.cell.harness.get_model", lambda name, shape="": DROPOUT_SPEC)
    record = run_cell(tiny_cell("mlp", "compile", batch_size=8, warmup_steps=2, numerics_steps=2))
    assert record.status == "ok", record.reason
    assert record.numerics.eager_spread_error > 0
    assert record.numerics.max_relative_error <= record.numerics.allowed_error


@pytest.mark.slow
def test_a_wrong_variant_with_light_dropout_is_still_caught(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # BERT's and GPT-2's dropout (p = 0.1) over a batch moves the loss by about 1 %; a 10 %
    # error stands out. (Heavy dropout on a tiny batch moves it by more than 10 %: not caught.)
    light = dataclasses.replace(DROPOUT_SPEC, build=lambda sizes: DropoutNet(p=0.1))
    monkeypatch.setattr("ptspeed.cell.harness.get_model", lambda name, shape="": light)
    record = run_cell(
        tiny_cell("mlp", "eager", batch_size=8, warmup_steps=2, numerics_steps=2, fault="numerics")
    )
    assert record.status == "numerics_mismatch", record.reason


def test_an_exception_is_a_failed_record(tmp_path: Path) -> None:
    record = run_cell(tiny_cell("mlp", fault="error"))
    assert record.status == "failed"
    assert record.reason == "RuntimeError: injected fault: error in the first step"
    assert "Traceback (most recent call last)" in record.detail
    assert "_inject_fault" in record.detail
    assert record.finished_at >= record.started_at and record.duration_s > 0
    assert_valid_json_record(record, tmp_path)


def test_a_simulated_oom_is_an_oom_record_naming_the_batch_size(tmp_path: Path) -> None:
    record = run_cell(tiny_cell("mlp", fault="oom", batch_size=3))
    assert record.status == "oom"
    assert record.reason.startswith("out of memory at batch_size 3: ")
    assert "can't allocate memory" in record.reason
    assert "Traceback (most recent call last)" in record.detail
    data = assert_valid_json_record(record, tmp_path)
    assert Record.from_dict(data) == record


def test_bad_knobs_in_process_are_a_failed_record_not_a_crash() -> None:
    record = run_cell(dataclasses.replace(tiny_cell("mlp"), knobs="turbo"))
    assert record.status == "failed"
    assert "knobs: unknown knob 'turbo'" in record.reason


@pytest.mark.parametrize(("mode", "copies"), [("train", 1), ("infer", 0)])
def test_only_train_mode_keeps_an_output_of_the_window(
    mode: str, copies: int, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A variant whose warm-up outran eager's (here by its numerics steps) reaches eager's
    last step inside its window: train mode keeps that step's loss for the late check; infer
    mode has no late check and copies nothing there (a GPT-2 logits copy is 1.6 GB of peak
    memory at batch 64)."""
    made = []
    real_copy = timing._copy
    monkeypatch.setattr(timing, "_copy", lambda output: made.append(1) or real_copy(output))
    spec = tiny_cell("mlp", "loader=0", mode, warmup_steps=1, numerics_steps=3, measured_steps=4)
    record = run_cell(spec)
    assert record.status == "ok", record.reason
    assert len(made) == copies
