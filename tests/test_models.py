"""The model registry: size limits, lookup, and determinism of weights and batches."""

from __future__ import annotations

from typing import Any

import pytest
import torch
from helpers import by_cost

from ptspeed.cell.steps import build_model
from ptspeed.errors import BadInput
from ptspeed.models import MAX_BATCH, REGISTRY, Batch, Sizes, check_sizes, get_model

TINY: dict[str, Sizes] = {
    "mlp": Sizes(batch_size=2),
    "lstm-lm": Sizes(batch_size=2, seq_len=8),
    "resnet50": Sizes(batch_size=2, image_size=32),
    "mask-rcnn": Sizes(batch_size=2, image_size=64),
    "bert-base": Sizes(batch_size=2, seq_len=8),
    "gpt2": Sizes(batch_size=2, seq_len=8),
    "bert-tiny": Sizes(batch_size=2, seq_len=8),
    "gpt2-tiny": Sizes(batch_size=2, seq_len=8),
}
CPU = torch.device("cpu")


def test_tiny_sizes_cover_the_registry() -> None:
    assert set(TINY) == set(REGISTRY)


@pytest.mark.parametrize(
    ("model", "sizes", "message"),
    [
        ("alexnet", Sizes(2), "model: unknown 'alexnet' (accepted: mlp, lstm-lm, resnet50"),
        ("mlp", Sizes(0), f"batch_size: 0 must be from 1 to {MAX_BATCH}"),
        ("mlp", Sizes(-3), "batch_size: -3 must be from 1"),
        ("mlp", Sizes(MAX_BATCH + 1), f"batch_size: {MAX_BATCH + 1} must be from 1"),
        ("resnet50", Sizes(2, image_size=31), "image_size: 31 is outside 32..2048 for resnet50"),
        ("resnet50", Sizes(2, image_size=4096), "image_size: 4096 is outside 32..2048"),
        ("mask-rcnn", Sizes(2, image_size=63), "image_size: 63 is outside 64..2048 for mask-rcnn"),
        ("bert-base", Sizes(2, seq_len=7), "seq_len: 7 is outside 8..512 for bert-base"),
        ("bert-base", Sizes(2, seq_len=513), "seq_len: 513 is outside 8..512"),
        ("gpt2", Sizes(2, seq_len=1025), "seq_len: 1025 is outside 2..1024 for gpt2"),
        ("lstm-lm", Sizes(2, seq_len=0), "seq_len: 0 is outside 1..8192 for lstm-lm"),
    ],
)
def test_check_sizes_rejects_out_of_range_sizes(model: str, sizes: Sizes, message: str) -> None:
    with pytest.raises(BadInput) as caught:
        check_sizes(model, sizes)
    assert str(caught.value).startswith(message)


@pytest.mark.parametrize("model", sorted(REGISTRY))
def test_check_sizes_accepts_the_limits(model: str) -> None:
    check_sizes(model, TINY[model])
    limits = REGISTRY[model].limits
    for field_name, (low, high) in limits.items():
        for value in (low, high):
            check_sizes(model, Sizes(**{"batch_size": MAX_BATCH, field_name: value}))


def test_sizes_a_model_ignores_are_not_checked() -> None:
    check_sizes("mlp", Sizes(2, image_size=0, seq_len=0))
    check_sizes("resnet50", Sizes(2, image_size=64, seq_len=0))


def test_unknown_model_is_bad_input() -> None:
    with pytest.raises(BadInput, match=r"^model: unknown 'vgg16' \(accepted: mlp, "):
        get_model("vgg16")


@pytest.mark.parametrize("model", sorted(REGISTRY))
def test_registry_entries_resolve_to_their_spec(model: str) -> None:
    spec = get_model(model)
    assert spec.name == model
    assert spec.image_model == ("image_size" in REGISTRY[model].uses)
    assert set(REGISTRY[model].limits) == set(REGISTRY[model].uses)


def make_batch(model: str, seed: int) -> Batch:
    return get_model(model).make_batch(TINY[model], torch.Generator().manual_seed(seed))


def same_tensors(a: dict[str, Any], b: dict[str, Any]) -> bool:
    return a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)


@pytest.mark.parametrize("model", sorted(REGISTRY))
def test_batches_are_seeded_and_batch_first(model: str) -> None:
    batch = make_batch(model, seed=0)
    assert batch and all(len(t) == TINY[model].batch_size for t in batch.values())
    assert same_tensors(batch, make_batch(model, seed=0))
    assert not same_tensors(batch, make_batch(model, seed=1))


@pytest.mark.parametrize("model", by_cost(sorted(REGISTRY)))
def test_initial_weights_are_seeded(model: str) -> None:
    spec, sizes = get_model(model), TINY[model]
    first = build_model(spec, sizes, 0, CPU).state_dict()
    assert same_tensors(first, build_model(spec, sizes, 0, CPU).state_dict())
    assert not same_tensors(first, build_model(spec, sizes, 1, CPU).state_dict())
