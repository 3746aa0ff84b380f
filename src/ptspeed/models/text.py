"""Text models from transformers, built from their configs with random weights.

The hub is switched off before transformers is imported: nothing is ever downloaded. The
attention implementation is pinned to transformers' "eager" one so that the model code is
the same in every PyTorch column (newer transformers would pick SDPA on newer torch only).
"""

from __future__ import annotations

import os

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")
os.environ.setdefault("HF_DATASETS_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_NO_ADVISORY_WARNINGS", "1")

import importlib
import types

import torch
import transformers
from torch import nn

from ptspeed.models import Batch, ModelSpec, Sizes

MASKED_FRACTION = 0.15


def _provide_torch_compiler_is_compiling() -> None:
    """torch 2.0 has no ``torch.compiler``; transformers probes ``torch.compiler.is_compiling``
    inside the code dynamo traces, and the AttributeError there aborts the compile. Pointing
    it at dynamo's own ``is_compiling`` keeps the same transformers usable on torch 2.0."""
    if hasattr(torch, "compiler"):
        return
    try:
        dynamo = importlib.import_module("torch._dynamo")
    except ImportError:  # torch 1.13: no dynamo, nothing is compiled
        return
    torch.compiler = types.SimpleNamespace(is_compiling=dynamo.is_compiling)


_provide_torch_compiler_is_compiling()
IGNORED_LABEL = -100


def _bert(sizes: Sizes) -> nn.Module:
    config = transformers.BertConfig(attn_implementation="eager")  # bert-base-uncased sizes
    return transformers.BertForMaskedLM(config)


def _gpt2(sizes: Sizes) -> nn.Module:
    config = transformers.GPT2Config(attn_implementation="eager")  # the 124M model
    return transformers.GPT2LMHeadModel(config)


def _masked_lm_batch(sizes: Sizes, generator: torch.Generator) -> Batch:
    shape = (sizes.batch_size, sizes.seq_len)
    tokens = torch.randint(0, transformers.BertConfig().vocab_size, shape, generator=generator)
    masked = torch.rand(shape, generator=generator) < MASKED_FRACTION
    masked[:, 0] = True  # every sequence contributes to the loss
    labels = torch.where(masked, tokens, torch.full_like(tokens, IGNORED_LABEL))
    return {"input_ids": tokens, "labels": labels}


def _causal_lm_batch(sizes: Sizes, generator: torch.Generator) -> Batch:
    shape = (sizes.batch_size, sizes.seq_len)
    tokens = torch.randint(0, transformers.GPT2Config().vocab_size, shape, generator=generator)
    return {"input_ids": tokens}


SPECS = {
    "bert-base": ModelSpec(
        name="bert-base",
        description="BERT-base (110M) masked language model, 15% masked tokens",
        build=_bert,
        make_batch=_masked_lm_batch,
        loss=lambda model, batch: model(input_ids=batch["input_ids"], labels=batch["labels"]).loss,
        infer=lambda model, batch: model(input_ids=batch["input_ids"]).logits,
        blocks=("BertLayer",),
    ),
    "gpt2": ModelSpec(
        name="gpt2",
        description="GPT-2 (124M) causal language model",
        build=_gpt2,
        make_batch=_causal_lm_batch,
        loss=lambda model, batch: (
            model(input_ids=batch["input_ids"], labels=batch["input_ids"]).loss
        ),
        infer=lambda model, batch: model(input_ids=batch["input_ids"]).logits,
        blocks=("GPT2Block",),
    ),
}
