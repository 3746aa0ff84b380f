"""Image models from torchvision, built with random weights (``weights=None``)."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch
import torchvision
from torch import nn
from torch.nn import functional

from ptspeed.models import Batch, Layer, Layering, ModelSpec, Sizes

IMAGENET_CLASSES = 1000
COCO_CLASSES = 91
BOXES_PER_IMAGE = 4


def _resnet50(sizes: Sizes) -> nn.Module:
    return torchvision.models.resnet50(weights=None, num_classes=IMAGENET_CLASSES)


def image_loss(logits: torch.Tensor, batch: Batch) -> torch.Tensor:
    return functional.cross_entropy(logits, batch["labels"])


def _resnet_layers(model: torchvision.models.ResNet) -> list[Layer]:
    """The stem, each bottleneck of layer1..layer4, and pooling with the classifier."""
    stem = nn.Sequential(model.conv1, model.bn1, model.relu, model.maxpool)
    stages = [model.layer1, model.layer2, model.layer3, model.layer4]
    blocks = [
        Layer(f"layer{s}.{b}", block, _call(block))
        for s, stage in enumerate(stages, start=1)
        for b, block in enumerate(stage)
    ]
    head = nn.ModuleList([model.avgpool, model.fc])
    return [
        Layer("stem", stem, lambda x, batch: stem(batch["images"])),
        *blocks,
        Layer("fc", head, lambda x, batch: model.fc(torch.flatten(model.avgpool(x), 1))),
    ]


def _call(module: nn.Module) -> Callable[[Any, Batch], Any]:
    return lambda x, batch: module(x)


def image_batch(sizes: Sizes, generator: torch.Generator) -> Batch:
    side = sizes.image_size
    return {
        "images": torch.randn(sizes.batch_size, 3, side, side, generator=generator),
        "labels": torch.randint(0, IMAGENET_CLASSES, (sizes.batch_size,), generator=generator),
    }


def _mask_rcnn(sizes: Sizes) -> nn.Module:
    # min/max size equal to the synthetic image side: the model's transform must not resize,
    # or the configured image size would not be the size that is measured.
    return torchvision.models.detection.maskrcnn_resnet50_fpn(
        weights=None,
        weights_backbone=None,
        num_classes=COCO_CLASSES,
        min_size=sizes.image_size,
        max_size=sizes.image_size,
    )


def detection_batch(sizes: Sizes, generator: torch.Generator) -> Batch:
    """Images with BOXES_PER_IMAGE random boxes each, their labels and filled box masks."""
    n, side = sizes.batch_size, sizes.image_size
    corners = torch.rand(n, BOXES_PER_IMAGE, 2, 2, generator=generator) * (side - 1)
    low, high = corners.min(dim=3).values, corners.max(dim=3).values
    high = torch.maximum(high, low + 4).clamp(max=side)
    boxes = torch.cat([low, high], dim=2)
    grid = torch.arange(side, dtype=torch.float32)
    inside_x = (grid >= boxes[..., 0:1]) & (grid < boxes[..., 2:3])
    inside_y = (grid >= boxes[..., 1:2]) & (grid < boxes[..., 3:4])
    masks = (inside_y.unsqueeze(-1) & inside_x.unsqueeze(-2)).to(torch.uint8)
    return {
        "images": torch.rand(n, 3, side, side, generator=generator),
        "boxes": boxes,
        "labels": torch.randint(1, COCO_CLASSES, (n, BOXES_PER_IMAGE), generator=generator),
        "masks": masks,
    }


def _detection_targets(batch: Batch) -> list[dict[str, torch.Tensor]]:
    return [
        {"boxes": boxes, "labels": labels, "masks": masks}
        for boxes, labels, masks in zip(
            batch["boxes"], batch["labels"], batch["masks"], strict=True
        )
    ]


def detection_loss(model: nn.Module, batch: Batch) -> torch.Tensor:
    losses = _unscripted(model(list(batch["images"]), _detection_targets(batch)), 0)
    return sum(losses.values())


def detection_infer(model: nn.Module, batch: Batch) -> list[dict[str, torch.Tensor]]:
    return _unscripted(model(list(batch["images"])), 1)


def _unscripted(output: Any, index: int) -> Any:
    """The losses (0) or detections (1): a scripted torchvision detection model returns both,
    as a tuple, in either mode (the jit knob)."""
    return output[index] if isinstance(output, tuple) else output


SPECS = {
    "resnet50": ModelSpec(
        name="resnet50",
        description="torchvision ResNet-50, 1000 classes, random weights",
        build=_resnet50,
        make_batch=image_batch,
        loss=lambda model, batch: image_loss(model(batch["images"]), batch),
        infer=lambda model, batch: model(batch["images"]),
        image_model=True,
        blocks=("Bottleneck",),
        layering=Layering(_resnet_layers, image_loss),
    ),
    "mask-rcnn": ModelSpec(
        name="mask-rcnn",
        description="torchvision Mask R-CNN ResNet-50 FPN, 91 classes, synthetic boxes and masks",
        build=_mask_rcnn,
        make_batch=detection_batch,
        loss=detection_loss,
        infer=detection_infer,
        image_model=True,
        ragged_output=True,
        blocks=("Bottleneck",),
        unstaged_reason=(
            "Mask R-CNN takes lists of images and targets and returns a dict of losses from "
            "branches (RPN, box and mask heads): no sequence of layers passing one tensor"
        ),
    ),
}
