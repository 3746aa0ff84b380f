"""Models: one small API, random weights, synthetic batches, no downloads.

A model is a :class:`ModelSpec` (the public interface: see its docstring): how to build it, how
to make a batch (a dict of tensors with the batch in the first dimension, so a DataLoader can
serve it sample by sample), and how to get the training loss and the inference output. The
harness sees nothing else.

A model is named by a *reference*, one of:

- a name of ptspeed's own zoo (``REGISTRY``: ``resnet50``, ``bert-base``, ...);
- ``torchvision:<name>``: a classification, detection or segmentation builder of
  ``torchvision.models.get_model``; ``transformers:<model_type>``: an architecture whose config
  the installed transformers can make (``llama``, ``qwen2``, ``t5``, ``vit``), resized by a
  :data:`SHAPE_KEYS` shape; ``timm:<name>``: a ``timm.create_model`` name
  (:mod:`ptspeed.models.families`);
- ``module:attribute``: a user's own model, the attribute a ModelSpec or a function of no
  arguments returning one, the module importable in the cell's environment (an installed
  package, or a directory on PYTHONPATH: the workflow's ``model_paths``).

Importing this module does not import torch: the names and size limits are known up front so
that bad input is refused before any process loads a framework.
"""

from __future__ import annotations

import importlib
import re
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

from ptspeed.errors import BadInput, Unsupported

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
    """A model as the harness runs it: the public interface of a user's model.

    Required: ``name``, ``description``; ``build(sizes)``, the model (a ``torch.nn.Module``)
    at :class:`Sizes` (the harness seeds torch before it and moves the model to the device);
    ``make_batch(sizes, generator)``, one synthetic batch, a dict of tensors on the CPU with the
    batch first, drawn from the ``torch.Generator`` given; ``loss(model, batch)``, the training
    loss (a scalar tensor) of one batch; ``infer(model, batch)``, the inference output (tensors,
    compared element-wise with eager's unless ``ragged_output``).

    Optional: ``image_model`` (channels_last applies to its inputs); ``blocks``, the class names
    FSDP wraps one unit each; ``attention`` with ``build(sizes, attn=...)`` for a model with
    several attention implementations; ``layering`` for modelpar and pipeline (else
    ``unstaged_reason`` says why not); ``limits``, the sizes it takes, e.g.
    ``{"seq_len": (1, 4096)}``, checked before it is built.
    """

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
    # The sizes beyond the batch the model takes, each with its lowest and highest value.
    limits: Mapping[str, tuple[int, int]] = field(default_factory=dict)


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


FAMILIES = ("torchvision", "transformers", "timm")
# A transformers model's shape overrides, each the config field it sets (through the config
# class's attribute_map: GPT-2's n_layer, T5's d_model).
SHAPE_KEYS = {
    "layers": "num_hidden_layers",
    "hidden": "hidden_size",
    "heads": "num_attention_heads",
    "kv_heads": "num_key_value_heads",
    "intermediate": "intermediate_size",
    "vocab": "vocab_size",
}
_DOTTED = r"[A-Za-z_][A-Za-z0-9_]*(?:\.[A-Za-z_][A-Za-z0-9_]*)*"
_USER_MODEL = re.compile(rf"(?P<module>{_DOTTED}):(?P<attribute>{_DOTTED})")
_FAMILY_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.-]*")


@dataclass(frozen=True)
class Reference:
    """A parsed model reference: ``kind`` is ``zoo``, a family of :data:`FAMILIES`, or
    ``module``; ``module`` the family or the module path; ``name`` the family's model name or
    the module's attribute (a zoo name for ``zoo``)."""

    kind: str
    module: str
    name: str

    def __str__(self) -> str:
        return self.name if self.kind == "zoo" else f"{self.module}:{self.name}"


_FORMS = {
    "torchvision": "torchvision:<name>",
    "transformers": "transformers:<model_type>",
    "timm": "timm:<name>",
}


def accepted_references() -> str:
    return f"{', '.join(REGISTRY)}, {', '.join(_FORMS.values())} or module:attribute"


def parse_reference(text: str) -> Reference:
    """The reference ``text`` stands for; :class:`BadInput` naming it and the accepted forms."""
    if text in REGISTRY:
        return Reference("zoo", "", text)
    family, colon, name = text.partition(":")
    if colon and family in FAMILIES:
        if _FAMILY_NAME.fullmatch(name):
            return Reference(family, family, name)
        raise BadInput(f"model: {text!r} names no {family} model (accepted: {_FORMS[family]})")
    user = _USER_MODEL.fullmatch(text)
    if user:
        return Reference("module", user["module"], user["attribute"])
    raise BadInput(f"model: unknown {text!r} (accepted: {accepted_references()})")


def parse_shape(text: str) -> dict[str, int]:
    """``layers=2,hidden=128`` as a dict; :class:`BadInput` naming what is wrong."""
    shape: dict[str, int] = {}
    for item in filter(None, text.split(",")):
        key, _, value = item.partition("=")
        if key not in SHAPE_KEYS:
            raise BadInput(f"shape: unknown {key!r} (accepted: {', '.join(SHAPE_KEYS)})")
        if not value.isdigit() or int(value) < 1:
            raise BadInput(f"shape: {key}={value!r} is not a positive whole number")
        shape[key] = int(value)
    return shape


def shape_text(shape: Mapping[str, int]) -> str:
    """The cell command's form of a shape: ``layers=2,hidden=128`` in :data:`SHAPE_KEYS` order."""
    return ",".join(f"{key}={shape[key]}" for key in SHAPE_KEYS if key in shape)


def check_sizes(model: str, sizes: Sizes, shape: str = "") -> None:
    """Raise :class:`BadInput` naming the field when ``sizes`` (and ``shape``) cannot work for
    the model ``model`` refers to. A model outside the zoo brings its own limits, which the
    cell checks once the spec is loaded (:func:`check_spec_sizes`)."""
    reference = parse_reference(model)
    if not 1 <= sizes.batch_size <= MAX_BATCH:
        raise BadInput(f"batch_size: {sizes.batch_size} must be from 1 to {MAX_BATCH}")
    if shape and reference.kind != "transformers":
        raise BadInput(f"shape: {model} takes none (only transformers:<model_type> models do)")
    parse_shape(shape)
    if reference.kind == "zoo":
        _check_limits(model, REGISTRY[model].limits, sizes)


def check_spec_sizes(spec: ModelSpec, sizes: Sizes) -> None:
    """:class:`BadInput` naming the field when ``sizes`` is outside ``spec.limits``."""
    _check_limits(spec.name, spec.limits, sizes)


def _check_limits(model: str, limits: Mapping[str, tuple[int, int]], sizes: Sizes) -> None:
    for field_name, (low, high) in limits.items():
        value = getattr(sizes, field_name)
        if not low <= value <= high:
            raise BadInput(f"{field_name}: {value} is outside {low}..{high} for {model}")


def sizes_used(model: str, configured: Mapping[str, Any]) -> tuple[str, ...]:
    """The sizes beyond the batch that ``model`` uses: the zoo's entry says; for any other
    model, those its configured sizes table sets (``configured``: the table's keys)."""
    if model in REGISTRY:
        return REGISTRY[model].uses
    return tuple(key for key in ("image_size", "seq_len") if key in configured)


def get_model(name: str, shape: str = "") -> ModelSpec:
    """The spec ``name`` refers to (a zoo name or a reference: see the module's docstring),
    ``shape`` applied (transformers models). Raises :class:`BadInput` for a name that cannot
    be one, :class:`~ptspeed.errors.Unsupported` where this environment cannot make it."""
    reference = parse_reference(name)
    if reference.kind == "zoo":
        module = importlib.import_module(REGISTRY[name].module)
        return module.SPECS[name]
    if reference.kind == "module":
        return user_spec(reference)
    from ptspeed.models import families  # torch and the family's library: only when asked

    return families.family_spec(reference, parse_shape(shape))


def user_spec(reference: Reference) -> ModelSpec:
    """The ModelSpec of ``module:attribute``: the attribute itself, or what calling it returns."""
    try:
        module = import_user_module(reference)
    except ModuleNotFoundError as exc:
        if exc.name is None or not f"{reference.module}.".startswith(f"{exc.name}."):
            raise  # the user's module is there; something it imports is not: its failure
        raise Unsupported(
            f"model {reference}: module {reference.module} is not importable in this "
            "environment (install it there, or name its directory in the config's model_paths)"
        ) from exc
    target = find_attribute(module, reference)
    spec = target() if callable(target) and not isinstance(target, ModelSpec) else target
    if not isinstance(spec, ModelSpec):
        raise BadInput(
            f"model: {reference} gives a {type(spec).__name__} (accepted: a "
            "ptspeed.models.ModelSpec, or a function returning one)"
        )
    return spec


def import_user_module(reference: Reference) -> Any:
    """The module of a ``module:attribute`` reference, imported as each of its cells will: the
    one module ptspeed imports by a name the config gives (the user's own code, by design)."""
    return importlib.import_module(reference.module)


def find_attribute(module: Any, reference: Reference) -> Any:
    """``module``'s (dotted) attribute ``reference.name``; :class:`BadInput` when it has none."""
    target = module
    for part in reference.name.split("."):
        if not hasattr(target, part):
            raise BadInput(
                f"model: {reference.module} has no attribute {reference.name!r} (accepted: a "
                "ptspeed.models.ModelSpec, or a function returning one)"
            )
        target = getattr(target, part)
    return target
