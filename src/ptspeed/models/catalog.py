"""What the model families and a user's modules hold: names checked before any job.

A reference that parses (:func:`ptspeed.models.parse_reference`) may still name nothing:
``torchvision:nosuch``, ``mypkg:missing``. Where the library or the module can be imported here
(the process that plans the workflow, or the cell command before it starts its worker), the name
is looked up and refused in one line; where it cannot, the cell looks it up in its own
environment and its record says why it could not run. The libraries are imported when a
reference of theirs is checked, never when this module is.
"""

from __future__ import annotations

import functools
import importlib.util
import sys
from collections.abc import Iterable, Iterator
from contextlib import contextmanager
from pathlib import Path

from ptspeed.errors import BadInput
from ptspeed.models import Reference, find_attribute, import_user_module

# torchvision's builders ptspeed can train, by the submodule of torchvision.models that
# registers them (video, optical flow and quantized models take inputs or steps of their own).
TORCHVISION_TASKS = {"": "classification", "detection": "detection", "segmentation": "segmentation"}
# The heads a transformers architecture is trained with, in order of preference (BERT has a
# causal-LM head too, but is a masked LM), each transformers' mapping of model types to classes.
TRANSFORMERS_HEADS = {
    "seq2seq": "MODEL_FOR_SEQ_TO_SEQ_CAUSAL_LM_MAPPING_NAMES",
    "masked": "MODEL_FOR_MASKED_LM_MAPPING_NAMES",
    "causal": "MODEL_FOR_CAUSAL_LM_MAPPING_NAMES",
    "image": "MODEL_FOR_IMAGE_CLASSIFICATION_MAPPING_NAMES",
}


def importable(module: str) -> bool:
    """Whether ``module`` can be found here (without importing it)."""
    try:
        return importlib.util.find_spec(module) is not None
    except (ImportError, ValueError):
        return False


@functools.cache
def torchvision_tasks() -> dict[str, str]:
    """Every builder name of :data:`TORCHVISION_TASKS`, with its task."""
    import torchvision.models

    models = torchvision.models
    tasks = {}
    for submodule, task in TORCHVISION_TASKS.items():
        module = getattr(models, submodule) if submodule else models
        tasks.update(dict.fromkeys(models.list_models(module=module), task))
    return tasks


@functools.cache
def transformers_heads() -> dict[str, tuple[str, str]]:
    """Every model type with a head of :data:`TRANSFORMERS_HEADS`: (head, model class name)."""
    from transformers.models.auto import modeling_auto as mappings

    heads: dict[str, tuple[str, str]] = {}
    for head, mapping_name in TRANSFORMERS_HEADS.items():
        for model_type, classes in getattr(mappings, mapping_name).items():
            class_name = classes[0] if isinstance(classes, (tuple, list)) else classes
            heads.setdefault(model_type, (head, class_name))
    return heads


@functools.cache
def timm_names() -> frozenset[str]:
    import timm

    return frozenset(timm.list_models())


def family_names(family: str) -> list[str]:
    """The names ``family`` knows here (sorted); [] when its library is not installed here."""
    if not importable(family):
        return []
    if family == "torchvision":
        return sorted(torchvision_tasks())
    if family == "transformers":
        return sorted(transformers_heads())
    return sorted(timm_names())


def check_known(reference: Reference, search_paths: Iterable[str | Path] = ()) -> None:
    """:class:`BadInput`, one line naming the model and what is accepted, when ``reference``
    names nothing that is here; nothing when it does, or when its library or module cannot be
    found here (``search_paths``: directories searched for a user's module first)."""
    if reference.kind == "zoo":
        return
    if reference.kind == "module":
        _check_user_module(reference, search_paths)
        return
    known = family_names(reference.kind)
    if known and reference.name not in known:
        raise BadInput(
            f"model: {reference} is not a {_what(reference.kind)} (e.g. {', '.join(known[:6])}; "
            f"`python -m ptspeed models --family {reference.kind}` lists them)"
        )


def _what(family: str) -> str:
    return {
        "torchvision": "classification, detection or segmentation builder of torchvision",
        "transformers": "model type with a causal-LM, masked-LM, seq2seq-LM or "
        "image-classification head in transformers",
        "timm": "model name of timm",
    }[family]


def _check_user_module(reference: Reference, search_paths: Iterable[str | Path]) -> None:
    with _searched(search_paths):
        if not importable(reference.module):
            return  # perhaps installed in the cell's environment alone: the cell will say
        module = import_user_module(reference)
    find_attribute(module, reference)


@contextmanager
def _searched(paths: Iterable[str | Path]) -> Iterator[None]:
    added = [str(Path(path).resolve()) for path in paths]
    sys.path[:0] = added
    try:
        yield
    finally:
        for path in added:
            sys.path.remove(path)
