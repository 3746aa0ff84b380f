"""The model zoo: one small API, random weights, synthetic batches, no downloads.

A model is a :class:`ModelSpec`: how to build it, how to make a batch (a dict of tensors with
the batch in the first dimension, so a DataLoader can serve it sample by sample), and how to
get the training loss and the inference output. The harness sees nothing else.

Importing this module does not import torch: the names and size limits are known up front so
that bad input is refused before any process loads a framework.
"""

from __future__ import annotations

import importlib
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from ptspeed.errors import BadInput

Batch = dict[str, Any]
# The sizes a cell takes when none is given (a model that does not use a size ignores it).
DEFAULT_IMAGE_SIZE = 224
DEFAULT_SEQ_LEN = 128


@dataclass(frozen=True)
class Sizes:
    batch_size: int
    image_size: int = DEFAULT_IMAGE_SIZE
    seq_len: int = DEFAULT_SEQ_LEN


@dataclass(frozen=True)
class Layer:
    """One layer of a model cut into stages (model parallelism,
    :mod:`ptspeed.cell.parallelism.stages`): its name, the module that holds its parameters and
    buffers, and ``run(x, batch)``: its output (one tensor) from the previous layer's output
    ``x`` (None for the first layer, which reads the batch)."""

    name: str
    module: Any
    run: Callable[[Any, Batch], Any]


@dataclass(frozen=True)
class Layering:
    """How a model is cut into stages: ``layers(model)``, its layers in order (the last one's
    output is the inference output); ``loss(output, batch)``, the training loss from that
    output, as ``ModelSpec.loss`` computes it; ``count(batch)``, how many terms the loss
    averages over (None: the samples), which weighs the micro-batches of a pipeline."""

    layers: Callable[[Any], list[Layer]]
    loss: Callable[[Any, Batch], Any]
    count: Callable[[Batch], Any] | None = None


@dataclass(frozen=True)
class ModelSpec:
    name: str
    description: str
    build: Callable[..., Any]  # (sizes), or (sizes, attn=...) with attention
    make_batch: Callable[[Sizes, Any], Batch]
    loss: Callable[[Any, Batch], Any]
    infer: Callable[[Any, Batch], Any]
    image_model: bool = False
    # True when inference outputs have data-dependent shapes (detections), so they are not
    # compared element-wise with the reference.
    ragged_output: bool = False
    # Class names of the model's repeated blocks: FSDP wraps each as its own unit.
    blocks: tuple[str, ...] = ()
    # For a model with several attention implementations (transformers'): the implementation a
    # built model uses; ``build`` then takes ``attn=`` (None: the library's default).
    attention: Callable[[Any], str] | None = None
    # Its SDPA attention checks the attention mask on the host (transformers' BERT: torch.all
    # of the mask), which a CUDA graph capture forbids.
    sdpa_mask_check: bool = False
    # The model as consecutive layers, for modelpar/pipeline; None: it cannot be cut (why).
    layering: Layering | None = None
    unstaged_reason: str = ""


@dataclass(frozen=True)
class ModelEntry:
    """What is known without importing torch: where the spec lives and which sizes it takes."""

    module: str
    uses: tuple[str, ...]
    limits: dict[str, tuple[int, int]]
    # Batch norm: a pipeline's micro-batches normalise with their own statistics (GPipe).
    batch_norm: bool = False


MAX_BATCH = 65536
REGISTRY: dict[str, ModelEntry] = {
    "mlp": ModelEntry("ptspeed.models.seed", (), {}),
    "lstm-lm": ModelEntry("ptspeed.models.seed", ("seq_len",), {"seq_len": (1, 8192)}),
    "resnet50": ModelEntry(
        "ptspeed.models.vision", ("image_size",), {"image_size": (32, 2048)}, batch_norm=True
    ),
    "mask-rcnn": ModelEntry(
        "ptspeed.models.vision", ("image_size",), {"image_size": (64, 2048)}, batch_norm=True
    ),
    "bert-base": ModelEntry("ptspeed.models.text", ("seq_len",), {"seq_len": (8, 512)}),
    "gpt2": ModelEntry("ptspeed.models.text", ("seq_len",), {"seq_len": (2, 1024)}),
    "bert-tiny": ModelEntry("ptspeed.models.text", ("seq_len",), {"seq_len": (8, 512)}),
    "gpt2-tiny": ModelEntry("ptspeed.models.text", ("seq_len",), {"seq_len": (2, 1024)}),
}


def check_sizes(model: str, sizes: Sizes) -> None:
    """Raise :class:`BadInput` naming the field when ``sizes`` cannot work for ``model``."""
    if model not in REGISTRY:
        raise BadInput(f"model: unknown {model!r} (accepted: {', '.join(REGISTRY)})")
    if not 1 <= sizes.batch_size <= MAX_BATCH:
        raise BadInput(f"batch_size: {sizes.batch_size} must be from 1 to {MAX_BATCH}")
    for field_name, (low, high) in REGISTRY[model].limits.items():
        value = getattr(sizes, field_name)
        if not low <= value <= high:
            raise BadInput(f"{field_name}: {value} is outside {low}..{high} for {model}")


def get_model(name: str) -> ModelSpec:
    if name not in REGISTRY:
        raise BadInput(f"model: unknown {name!r} (accepted: {', '.join(REGISTRY)})")
    module = importlib.import_module(REGISTRY[name].module)
    return module.SPECS[name]
