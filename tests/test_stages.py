"""Model parallelism (modelpar, pipeline): knobs, the balanced split, each model's layers, the
micro-batched reference, a stage in this process (world size 1) and, marked slow, real torchrun
jobs of 2 CPU processes (gloo) for ResNet-50, BERT-base, GPT-2 and the LSTM LM at tiny sizes.
"""

from __future__ import annotations

import itertools
import json
from pathlib import Path
from typing import Any

import pytest
import torch
from helpers import benchmark_python, tiny_cell

from ptspeed.cell.checks import check_cell
from ptspeed.cell.harness import run_cell
from ptspeed.cell.microbatch import micro_batched, split, weights
from ptspeed.cell.parallelism.stages import (
    balanced_split,
    describe_split,
    parameter_count,
    staged_layers,
)
from ptspeed.cell.record import CellSpec, Record
from ptspeed.cell.variants.knobs import parse_knobs
from ptspeed.cell.variants.support import unsupported_reason
from ptspeed.errors import BadInput, Unsupported
from ptspeed.launch.watchdog import run_cell_in_worker
from ptspeed.launch.worker import placement_of
from ptspeed.models import Sizes, get_model

CELL_TIMEOUT_S = 600.0
TINY = {"image_size": 32, "seq_len": 8}


def cell(knobs: str, model: str = "mlp", mode: str = "train", **fields: Any) -> CellSpec:
    """The harness tests' tiny cell at batch 4, with 1 thread per process."""
    settings: dict[str, Any] = {
        "batch_size": 4,
        "threads": parse_knobs(knobs).world_size,
        "timeout_s": CELL_TIMEOUT_S,
        **TINY,
        **fields,
    }
    return tiny_cell(model, knobs, mode, **settings)


# --- knobs ------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("text", "parallel", "world_size", "chunks"),
    [
        ("modelpar=2", "modelpar", 2, 1),
        ("pipeline=4", "pipeline", 4, 2),
        ("pipeline=2+chunks=8", "pipeline", 2, 8),
        ("chunks=3+pipeline=2+amp=bf16", "pipeline", 2, 3),
        ("modelpar=1+channels_last", "modelpar", 1, 1),
    ],
)
def test_staged_knobs(text: str, parallel: str, world_size: int, chunks: int) -> None:
    knobs = parse_knobs(text)
    assert (knobs.parallel, knobs.world_size, knobs.chunks) == (parallel, world_size, chunks)


@pytest.mark.parametrize(
    ("text", "fragment"),
    [
        ("modelpar", "modelpar= must be an integer from 1 to 64"),
        ("pipeline=65", "pipeline=65 must be an integer from 1 to 64"),
        ("pipeline=2+chunks=0", "chunks=0 must be an integer from 1 to 1024"),
        ("chunks=2", "chunks needs pipeline"),
        ("modelpar=2+chunks=2", "chunks needs pipeline"),
        ("modelpar=2+pipeline=2", "modelpar and pipeline cannot be combined"),
        ("ddp+modelpar=2", "modelpar with ddp is not supported"),
        ("pipeline=2+fsdp", "pipeline with fsdp is not supported"),
        ("modelpar=2+procs=2", "the stage count is the process count"),
        ("pipeline=2+compile", "compiling each stage is untested"),
        ("modelpar=2+cudagraphs", "capturing send/recv between stages is untested"),
        ("pipeline=2+jit=script", "TorchScript of each stage is untested"),
    ],
)
def test_bad_staged_knobs_are_one_clear_line(text: str, fragment: str) -> None:
    with pytest.raises(BadInput) as caught:
        parse_knobs(text)
    message = str(caught.value)
    assert message.startswith("knobs: ") and fragment in message and "\n" not in message


def test_staged_variants_and_their_limits() -> None:
    def reason(text: str, device: str) -> str:
        return unsupported_reason(parse_knobs(text), device, (2, 14), (3, 10), True)

    assert "no GradScaler across them" in reason("pipeline=2+amp=fp16", "cuda")
    assert reason("pipeline=2+amp=bf16", "cpu") == reason("modelpar=2", "cuda") == ""
    with pytest.raises(BadInput, match="batch_size: 2 is smaller than chunks=4"):
        check_cell(cell("pipeline=2+chunks=4", batch_size=2))


# --- the split --------------------------------------------------------------------------------


def brute_force_largest(sizes: list[int], stages: int) -> int:
    cuts = itertools.combinations(range(1, len(sizes)), stages - 1)
    return min(
        max(sum(sizes[a:b]) for a, b in itertools.pairwise((0, *c, len(sizes)))) for c in cuts
    )


@pytest.mark.parametrize(
    ("sizes", "stages"),
    [([5, 1, 1, 1, 1, 1], 2), ([1, 2, 3, 4, 5, 6, 7], 3), ([9], 1), ([3, 3, 3], 3), ([0, 0, 7], 2)],
)
def test_the_split_is_contiguous_and_minimises_the_largest_stage(
    sizes: list[int], stages: int
) -> None:
    ranges = balanced_split(sizes, stages)
    assert [i for stage in ranges for i in stage] == list(range(len(sizes)))
    assert len(ranges) == stages and all(len(stage) > 0 for stage in ranges)
    assert max(sum(sizes[i] for i in stage) for stage in ranges) == brute_force_largest(
        sizes, stages
    )


def test_a_split_is_described_by_layer_ranges_names_and_parameters() -> None:
    ranges = balanced_split([4_000_000, 1_000_000, 3_000_000], 2)
    assert describe_split(["a", "b", "c"], [4_000_000, 1_000_000, 3_000_000], ranges) == (
        "0-0 a..a 4.0M | 1-2 b..c 4.0M"
    )


# The splits in two stages, as the records show them.
SPLITS = {
    "mlp": "0-0 fc1..fc1 1.0M | 1-1 fc2..fc2 0.0M",
    "lstm-lm": "0-2 embedding..lstm.1 27.0M | 3-5 lstm.2..fc 27.0M",
    "resnet50": "0-14 stem..layer4.0 14.6M | 15-17 layer4.1..fc 11.0M",
    "bert-base": "0-6 embeddings..encoder.5 66.4M | 7-13 encoder.6..head 66.6M",
    "gpt2": "0-6 embedding..h.5 81.9M | 7-13 h.6..head 81.1M",
    "bert-tiny": "0-1 embeddings..encoder.0 4.2M | 2-3 encoder.1..head 4.2M",
    "gpt2-tiny": "0-1 embedding..h.0 6.8M | 2-3 h.1..head 6.6M",
}


@pytest.mark.slow
@pytest.mark.parametrize("name", list(SPLITS))
def test_each_models_layers_compute_its_own_loss_and_output(name: str) -> None:
    """The layers run one after the other are the model: the same loss (dropout drawn in the
    same order) and inference output, in fp64; and the two-stage split is the recorded one."""
    spec, sizes = get_model(name), Sizes(2, **TINY)
    torch.manual_seed(0)
    model = spec.build(sizes).double()
    batch = spec.make_batch(sizes, torch.Generator().manual_seed(0))
    batch = {k: v.double() if v.is_floating_point() else v for k, v in batch.items()}
    layers, layering = staged_layers(spec, model, 2)

    def through_layers() -> torch.Tensor:
        output = None
        for layer in layers:
            output = layer.run(output, batch)
        return output

    model.train()
    torch.manual_seed(1)
    expected = spec.loss(model, batch)
    torch.manual_seed(1)
    assert layering.loss(through_layers(), batch).item() == pytest.approx(expected.item(), 1e-12)
    model.eval()
    with torch.no_grad():
        torch.testing.assert_close(through_layers(), spec.infer(model, batch), rtol=1e-12, atol=0)
    sizes_of_layers = [parameter_count(layer.module) for layer in layers]
    names = [layer.name for layer in layers]
    assert (
        describe_split(names, sizes_of_layers, balanced_split(sizes_of_layers, 2)) == SPLITS[name]
    )


def test_models_that_cannot_be_cut_say_why() -> None:
    with pytest.raises(Unsupported, match="mask-rcnn cannot be cut into stages: Mask R-CNN takes"):
        staged_layers(get_model("mask-rcnn"), None, 2)
    model = get_model("mlp").build(Sizes(2))
    with pytest.raises(Unsupported, match="mlp has 2 layers, fewer than 3 stages"):
        staged_layers(get_model("mlp"), model, 3)


# --- micro-batches ----------------------------------------------------------------------------


def test_micro_batches_weigh_by_what_the_loss_averages_over() -> None:
    spec, sizes = get_model("bert-base"), Sizes(5, seq_len=8)
    batch = spec.make_batch(sizes, torch.Generator().manual_seed(0))
    pieces = split(batch, 3)
    assert [len(p["input_ids"]) for p in pieces] == [2, 2, 1]
    masked = [int((p["labels"] != -100).sum()) for p in pieces]
    assert weights(spec, pieces) == pytest.approx([m / sum(masked) for m in masked])
    assert weights(get_model("mlp"), split(get_model("mlp").make_batch(sizes, None), 3)) == (
        pytest.approx([0.4, 0.4, 0.2])
    )


def test_the_micro_batched_reference_is_whole_batch_eager_without_batch_norm() -> None:
    spec, sizes = get_model("mlp"), Sizes(5)
    torch.manual_seed(0)
    model = spec.build(sizes).double()
    batch = spec.make_batch(sizes, torch.Generator().manual_seed(0))
    batch["x"] = batch["x"].double()
    whole = spec.loss(model, batch)
    assert micro_batched(spec, 3).loss(model, batch).item() == pytest.approx(whole.item(), 1e-12)
    torch.testing.assert_close(micro_batched(spec, 2).infer(model, batch), spec.infer(model, batch))


# --- a stage in this process (world size 1) ---------------------------------------------------


@pytest.mark.slow
@pytest.mark.parametrize(
    ("knobs", "mode"), [("pipeline=1+chunks=3", "train"), ("modelpar=1", "infer")]
)
def test_a_single_stage_measures_and_matches_eager(
    knobs: str, mode: str, single_rank_group: None
) -> None:
    spec = cell(knobs, mode=mode, warmup_steps=2, numerics_steps=2)
    record = run_cell(spec, placement_of(spec))
    assert record.status == "ok", record.reason
    metrics = record.metrics
    assert metrics.stage_split == "0-1 fc1..fc2 1.0M"
    assert (metrics.world_size, metrics.distributed_backend) == (1, "gloo")
    assert metrics.throughput_samples_per_s == pytest.approx(4 * 2 / metrics.measured_wall_s)
    assert record.numerics.passed and record.numerics.reason == ""
    assert max(record.numerics.errors.values()) < 1e-3


@pytest.mark.slow
def test_a_wrong_staged_step_fails_the_numerics_gate(single_rank_group: None) -> None:
    spec = cell("pipeline=1", fault="grad")
    record = run_cell(spec, placement_of(spec))
    assert record.status == "numerics_mismatch", record.reason


def test_an_uncuttable_model_is_unsupported_in_a_stage(single_rank_group: None) -> None:
    spec = cell("modelpar=1", model="mask-rcnn", image_size=64, batch_size=1)
    record = run_cell(spec, placement_of(spec))
    assert record.status == "unsupported"
    assert record.reason.startswith("mask-rcnn cannot be cut into stages")


# --- real torchrun jobs of 2 processes --------------------------------------------------------


def run_job(spec: CellSpec, tmp_path: Path, python: str | None = None) -> Record:
    out = tmp_path / f"{spec.model}-{spec.variant}-{spec.mode}.json"
    record = run_cell_in_worker(spec, out, **({"python": python} if python else {}))
    assert Record.from_dict(json.loads(out.read_text())).status == record.status
    return record


def assert_staged(record: Record, spec: CellSpec) -> None:
    metrics = record.metrics
    assert record.status == "ok", f"{record.reason}\n{record.detail}"
    assert metrics.world_size == 2 and metrics.distributed_backend == "gloo"
    assert metrics.stage_split == SPLITS[spec.model]
    assert metrics.measured_wall_s == max(metrics.rank_measured_wall_s)
    samples = spec.batch_size * spec.measured_steps  # the batch goes through both stages
    assert metrics.throughput_samples_per_s == pytest.approx(samples / metrics.measured_wall_s)
    numerics = record.numerics
    assert numerics.checked and numerics.passed and numerics.reason == "", numerics
    # The stages compute what eager computes over the same micro-batches, to the last bit
    # where the sums are the same (at these sizes ResNet-50's batch norm over a handful of
    # values leaves eager fp32 itself far from fp64, so the fp64 errors say little).
    assert numerics.variant_values == pytest.approx(numerics.reference_values, rel=1e-6)


@pytest.mark.slow
# Each model's layering once (the transformers' on their tiny configurations, the same classes)
# and each knob twice (modelpar is the pipeline's schedule with one micro-batch): eight 2-process
# jobs of full-size models would cost CI minutes and add no path.
@pytest.mark.parametrize(
    ("model", "knobs"),
    [
        ("resnet50", "pipeline=2+chunks=2"),
        ("bert-tiny", "modelpar=2"),
        ("gpt2-tiny", "pipeline=2+chunks=2"),
        ("lstm-lm", "modelpar=2"),
    ],
)
def test_two_stages_train_like_eager(model: str, knobs: str, tmp_path: Path) -> None:
    spec = cell(knobs, model=model)
    assert_staged(run_job(spec, tmp_path), spec)


@pytest.mark.slow
def test_a_two_stage_pipeline_infers_like_eager(tmp_path: Path) -> None:
    spec = cell("pipeline=2+chunks=3", mode="infer", batch_size=5)
    record = run_job(spec, tmp_path)
    assert_staged(record, spec)
    assert set(record.numerics.errors) == {"output"}


@pytest.mark.slow
@pytest.mark.crossversion
def test_a_pipeline_under_torch_1_13(tmp_path: Path) -> None:
    spec = cell("pipeline=2+chunks=2", model="gpt2-tiny")
    record = run_job(spec, tmp_path, python=benchmark_python("torch-1.13"))
    assert record.provenance.torch.startswith("1.13.1")
    assert_staged(record, spec)
