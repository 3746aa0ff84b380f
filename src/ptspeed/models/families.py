"""Models of the libraries' families, by name, with random weights and synthetic batches.

``torchvision:<name>``: a builder of ``torchvision.models.get_model`` (classification,
detection, segmentation); ``transformers:<model_type>``: the architecture's config with its
defaults changed by a shape (layers, hidden, heads, kv_heads, intermediate, vocab), trained with
its seq2seq-LM, masked-LM, causal-LM or image-classification head; ``timm:<name>``: a
``timm.create_model`` name. What the environment's libraries cannot make is
:class:`~ptspeed.errors.Unsupported` with the reason; each library is imported only when one of
its models is asked for.
"""

from __future__ import annotations

import functools
from collections.abc import Callable, Mapping
from typing import Any

import torch
from torch import nn
from torch.nn import functional

from ptspeed.errors import BadInput, Unsupported
from ptspeed.models import SHAPE_KEYS, Batch, ModelSpec, Reference, Sizes
from ptspeed.models.catalog import importable, timm_names, torchvision_tasks, transformers_heads

IMAGE_LIMITS = {"image_size": (32, 2048)}
DETECTION_LIMITS = {"image_size": (64, 2048)}
SEGMENTATION_CLASSES = 21  # Pascal VOC's, torchvision's default
# Builders whose training output carries auxiliary classifiers unless switched off.
AUXILIARY_CLASSIFIERS = ("googlenet", "inception_v3")
# Builders that take the input's side as an argument (a ViT's position embeddings are sized
# for it), and the argument's form.
IMAGE_SIZE_ARGUMENTS: dict[str, Callable[[int], dict[str, Any]]] = {
    "vit_": lambda side: {"image_size": side},
    "maxvit_": lambda side: {"input_size": (side, side)},
}
# Detection builders that take no min_size/max_size (SSD resizes to its own fixed side).
FIXED_SIDE_DETECTORS = ("ssd300_", "ssdlite320_")
MAX_SEQ_LEN = 65536


def family_spec(reference: Reference, shape: Mapping[str, int]) -> ModelSpec:
    """The spec of ``reference`` (a family's), ``shape`` applied (transformers only)."""
    if not importable(reference.kind):
        raise Unsupported(f"model {reference}: {reference.kind} is not installed here")
    if reference.kind == "torchvision":
        return torchvision_spec(reference)
    if reference.kind == "transformers":
        return transformers_spec(reference, shape)
    return timm_spec(reference)


# --- torchvision ----------------------------------------------------------------------------


def torchvision_spec(reference: Reference) -> ModelSpec:
    import torchvision

    from ptspeed.models import vision

    name = reference.name
    task = torchvision_tasks().get(name)
    if task is None:
        raise Unsupported(
            f"model {reference}: torchvision {torchvision.__version__} here has no "
            "classification, detection or segmentation builder of that name"
        )
    if name.startswith("keypointrcnn"):
        raise Unsupported(f"model {reference}: ptspeed makes no synthetic keypoint targets")
    common = {
        "name": str(reference),
        "description": f"torchvision {name} ({task}), random weights",
        "image_model": True,
        "unstaged_reason": f"ptspeed has no layering of {reference} (not cut into stages)",
    }
    if task == "detection":
        return ModelSpec(
            build=functools.partial(_detector, name),
            make_batch=vision.detection_batch,
            loss=vision.detection_loss,
            infer=vision.detection_infer,
            ragged_output=True,
            limits=DETECTION_LIMITS,
            **common,
        )
    if task == "segmentation":
        return ModelSpec(
            build=functools.partial(_segmenter, name),
            make_batch=_segmentation_batch,
            loss=lambda model, batch: functional.cross_entropy(
                model(batch["images"])["out"], batch["masks"]
            ),
            infer=lambda model, batch: model(batch["images"])["out"],
            limits=IMAGE_LIMITS,
            **common,
        )
    return ModelSpec(
        build=functools.partial(_classifier, name),
        make_batch=vision.image_batch,
        loss=lambda model, batch: vision.image_loss(model(batch["images"]), batch),
        infer=lambda model, batch: model(batch["images"]),
        limits=IMAGE_LIMITS,
        **common,
    )


def _classifier(name: str, sizes: Sizes) -> nn.Module:
    import torchvision

    options: dict[str, Any] = {"aux_logits": False} if name in AUXILIARY_CLASSIFIERS else {}
    if name == "googlenet":
        options["init_weights"] = True  # its default warns that it will change
    for prefix, argument in IMAGE_SIZE_ARGUMENTS.items():
        if name.startswith(prefix):
            options.update(argument(sizes.image_size))
    return torchvision.models.get_model(name, weights=None, **options)


def _detector(name: str, sizes: Sizes) -> nn.Module:
    """As the zoo's Mask R-CNN: the model's transform keeps the synthetic image's side."""
    import torchvision

    side = {"min_size": sizes.image_size, "max_size": sizes.image_size}
    options = {} if name.startswith(FIXED_SIDE_DETECTORS) else side
    return torchvision.models.get_model(name, weights=None, weights_backbone=None, **options)


def _segmenter(name: str, sizes: Sizes) -> nn.Module:
    import torchvision

    return torchvision.models.get_model(
        name, weights=None, weights_backbone=None, num_classes=SEGMENTATION_CLASSES
    )


def _segmentation_batch(sizes: Sizes, generator: torch.Generator) -> Batch:
    side, n = sizes.image_size, sizes.batch_size
    return {
        "images": torch.randn(n, 3, side, side, generator=generator),
        "masks": torch.randint(0, SEGMENTATION_CLASSES, (n, side, side), generator=generator),
    }


# --- transformers ---------------------------------------------------------------------------


def transformers_spec(reference: Reference, shape: Mapping[str, int]) -> ModelSpec:
    from ptspeed.models import text  # the hub switched off, torch.compiler on torch 2.0

    transformers = text.transformers
    heads = transformers_heads()
    if reference.name not in heads:
        raise Unsupported(
            f"model {reference}: transformers {transformers.__version__} here has no model type "
            f"{reference.name!r} with a causal-LM, masked-LM, seq2seq-LM or image head"
        )
    head, class_name = heads[reference.name]
    fields = config_fields(reference, shape)
    config = transformers.AutoConfig.for_model(reference.name, **fields)

    def build(sizes: Sizes, attn: str | None = None) -> nn.Module:
        sized = {"image_size": sizes.image_size} if head == "image" else {}

        def make_config(**extra: Any) -> Any:
            return transformers.AutoConfig.for_model(reference.name, **fields, **sized, **extra)

        return text.build_with_attention(class_name, make_config, attn)

    blocks = tuple(getattr(getattr(transformers, class_name), "_no_split_modules", None) or ())
    return ModelSpec(
        name=str(reference),
        description=f"transformers {class_name} ({_shape_words(config)}), random weights",
        build=build,
        make_batch=functools.partial(_TRANSFORMERS_BATCHES[head], config),
        loss=_TRANSFORMERS_LOSSES[head],
        infer=_TRANSFORMERS_INFERENCE[head],
        image_model=head == "image",
        blocks=blocks,
        attention=text.attention_implementation,
        sdpa_mask_check=head == "masked",
        unstaged_reason=f"ptspeed has no layering of {reference} (not cut into stages)",
        limits=_transformers_limits(head, config),
    )


def config_fields(reference: Reference, shape: Mapping[str, int]) -> dict[str, int]:
    """The config's constructor arguments for ``shape``, by the names of its config class (its
    attribute_map: T5's d_model for hidden). A hidden size without an intermediate one scales
    the intermediate size with it."""
    from transformers import CONFIG_MAPPING

    config_class = CONFIG_MAPPING[reference.name]
    default = config_class()
    fields = {}
    for key, value in shape.items():
        name = config_class.attribute_map.get(SHAPE_KEYS[key], SHAPE_KEYS[key])
        if getattr(default, name, None) is None and key != "kv_heads":
            raise BadInput(f"shape: {reference} has no {key} (its config has no {name})")
        fields[name] = value
    intermediate = getattr(default, "intermediate_size", None)
    if "hidden" in shape and "intermediate" not in shape and isinstance(intermediate, int):
        fields["intermediate_size"] = round(intermediate * shape["hidden"] / default.hidden_size)
    return fields


def _shape_words(config: Any) -> str:
    words = [
        f"{key} {getattr(config, name)}"
        for key, name in SHAPE_KEYS.items()
        if isinstance(getattr(config, name, None), int)
    ]
    return ", ".join(words)


def _transformers_limits(head: str, config: Any) -> dict[str, tuple[int, int]]:
    if head == "image":
        return {"image_size": (getattr(config, "patch_size", 1) or 1, 2048)}
    positions = getattr(config, "max_position_embeddings", None)
    return {"seq_len": (2, positions if isinstance(positions, int) else MAX_SEQ_LEN)}


def _tokens_batch(head: str, config: Any, sizes: Sizes, generator: torch.Generator) -> Batch:
    from ptspeed.models import text

    if head == "masked":
        return text.masked_lm_batch(config.vocab_size, sizes, generator)
    batch = text.causal_lm_batch(config.vocab_size, sizes, generator)
    if head == "seq2seq":  # the decoder reads the targets shifted right, from token 0
        labels = text.causal_lm_batch(config.vocab_size, sizes, generator)["input_ids"]
        batch["labels"] = labels
        batch["decoder_input_ids"] = torch.cat(
            [torch.zeros_like(labels[:, :1]), labels[:, :-1]], dim=1
        )
    return batch


def _pixels_batch(config: Any, sizes: Sizes, generator: torch.Generator) -> Batch:
    side, n = sizes.image_size, sizes.batch_size
    channels = getattr(config, "num_channels", 3)
    return {
        "pixel_values": torch.randn(n, channels, side, side, generator=generator),
        "labels": torch.randint(0, config.num_labels, (n,), generator=generator),
    }


_TRANSFORMERS_BATCHES: dict[str, Callable[..., Batch]] = {
    "seq2seq": functools.partial(_tokens_batch, "seq2seq"),
    "masked": functools.partial(_tokens_batch, "masked"),
    "causal": functools.partial(_tokens_batch, "causal"),
    "image": _pixels_batch,
}
_TRANSFORMERS_LOSSES: dict[str, Callable[[Any, Batch], Any]] = {
    "seq2seq": lambda model, batch: model(**batch).loss,
    "masked": lambda model, batch: model(**batch).loss,
    "causal": lambda model, batch: model(**batch, labels=batch["input_ids"]).loss,
    "image": lambda model, batch: model(**batch).loss,
}
_TRANSFORMERS_INFERENCE: dict[str, Callable[[Any, Batch], Any]] = {
    "seq2seq": lambda model, batch: (
        model(input_ids=batch["input_ids"], decoder_input_ids=batch["labels"]).logits
    ),
    "masked": lambda model, batch: model(input_ids=batch["input_ids"]).logits,
    "causal": lambda model, batch: model(input_ids=batch["input_ids"]).logits,
    "image": lambda model, batch: model(pixel_values=batch["pixel_values"]).logits,
}


# --- timm -----------------------------------------------------------------------------------


def timm_spec(reference: Reference) -> ModelSpec:
    import timm

    from ptspeed.models import vision

    if reference.name not in timm_names():
        raise Unsupported(f"model {reference}: timm {timm.__version__} here has no such model")
    return ModelSpec(
        name=str(reference),
        description=f"timm {reference.name}, random weights",
        build=lambda sizes: timm.create_model(reference.name, pretrained=False),
        make_batch=vision.image_batch,
        loss=lambda model, batch: vision.image_loss(model(batch["images"]), batch),
        infer=lambda model, batch: model(batch["images"]),
        image_model=True,
        unstaged_reason=f"ptspeed has no layering of {reference} (not cut into stages)",
        limits=IMAGE_LIMITS,
    )
