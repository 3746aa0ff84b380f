"""The CUDA paths of the harness: run on a machine with a GPU (skipped elsewhere)."""

from __future__ import annotations

import pytest

torch = pytest.importorskip("torch")

from ptspeed.cell.harness import run_cell  # noqa: E402
from ptspeed.cell.record import CellSpec  # noqa: E402

pytestmark = [
    pytest.mark.cuda,
    pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device"),
]


def cuda_cell(knobs: str, model: str = "resnet50", mode: str = "train") -> CellSpec:
    return CellSpec(
        model=model,
        variant=knobs,
        knobs=knobs,
        mode=mode,
        batch_size=8,
        image_size=64,
        seq_len=32,
        warmup_steps=4,
        measured_steps=5,
        numerics_steps=2,
        device="cuda",
    )


@pytest.mark.parametrize(
    "knobs",
    [
        "eager",
        "amp",
        "amp=fp16",
        "amp=bf16",
        "channels_last",
        "cudagraphs",
        "amp=bf16+cudagraphs",
        "loader=2+pin",
        "memfrac=0.8",
        "compile",
        "compile=reduce-overhead",
        "loader=2+pin+prefetch",
        "loader=2+pin+prefetch+channels_last+prefetch_factor=4+persistent",
        "jit=script",
        "jit=trace+amp=bf16",
    ],
)
def test_knob_runs_on_cuda_with_events_and_allocator_peak(knobs: str) -> None:
    record = run_cell(cuda_cell(knobs))
    assert record.status == "ok", record.reason + record.detail
    assert record.metrics.memory_kind == "cuda_allocator_peak"
    assert record.metrics.peak_memory_bytes > 0
    assert len(record.metrics.step_times_s) == 5
    assert record.provenance.device_name and record.provenance.cuda
    if knobs != "eager":
        assert record.numerics.checked and record.numerics.passed


def test_cuda_event_step_times_agree_with_synchronised_wall_time() -> None:
    record = run_cell(cuda_cell("eager"))
    summed = sum(record.metrics.step_times_s)
    assert summed == pytest.approx(record.metrics.measured_wall_s, rel=0.25)


def test_inference_with_cuda_graphs() -> None:
    record = run_cell(cuda_cell("cudagraphs", model="bert-base", mode="infer"))
    assert record.status == "ok", record.reason + record.detail


@pytest.mark.parametrize(
    ("knobs", "mode"),
    [("attn=sdpa", "train"), ("attn=sdpa+amp=bf16", "train"), ("jit=trace", "infer")],
)
def test_text_model_knobs_on_cuda(knobs: str, mode: str) -> None:
    record = run_cell(cuda_cell(knobs, model="bert-base", mode=mode))
    assert record.status == "ok", record.reason + record.detail
    assert record.numerics.checked and record.numerics.passed
    if knobs.startswith("attn"):
        assert record.metrics.attn_implementation == "sdpa"
