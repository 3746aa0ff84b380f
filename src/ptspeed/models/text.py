"""Text models from transformers, built from their configs with random weights.

The hub is switched off before transformers is imported: nothing is ever downloaded. The
attention implementation is the attn knob's (``sdpa``: torch's fused
scaled_dot_product_attention, ``eager``: transformers' matmul-softmax code), else what
transformers picks for the torch it runs with: transformers 4.46.3 picks SDPA from torch
2.1.1 on and refuses it below, so the default differs between PyTorch columns and every
record says which one ran (``metrics.attn_implementation``).
"""

from __future__ import annotations

import os

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")
os.environ.setdefault("HF_DATASETS_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_NO_ADVISORY_WARNINGS", "1")

import functools
import importlib
import types
from collections.abc import Callable
from typing import Any

import torch
import transformers
from torch import nn

from ptspeed.errors import Unsupported
from ptspeed.models import Batch, Layer, Layering, ModelSpec, Sizes

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


# The small configurations keep the base models' classes, vocabularies and code paths (every
# knob, layering and check runs as on the base model) at BERT-Tiny's sizes (Turc et al. 2019:
# 2 layers, width 128, 2 heads): a few million parameters, where the per-kernel overhead that
# CUDA graphs and torch.compile remove dominates the step.
TINY_BERT = {
    "num_hidden_layers": 2,
    "hidden_size": 128,
    "num_attention_heads": 2,
    "intermediate_size": 512,
}
TINY_GPT2 = {"n_layer": 2, "n_embd": 128, "n_head": 2}  # GPT-2's inner width is 4 x n_embd


def _build(
    model_class: str,
    config_class: str,
    fields: dict[str, int],
    sizes: Sizes,
    attn: str | None = None,
) -> nn.Module:
    """transformers' ``model_class`` with ``config_class``'s defaults changed by ``fields``. The
    classes are named, not imported, so that transformers loads a model's code only when one
    is built."""
    config_type = getattr(transformers, config_class)
    return build_with_attention(model_class, lambda **extra: config_type(**fields, **extra), attn)


def build_with_attention(
    model_class: str, make_config: Callable[..., Any], attn: str | None
) -> nn.Module:
    """transformers' ``model_class`` of the config ``make_config(**extra)`` makes, with ``attn``
    attention (None: transformers' default); Unsupported, with transformers' reason, where this
    transformers and torch cannot build it."""
    model_type = getattr(transformers, model_class)
    if attn is None:
        return model_type(make_config())
    try:
        model = model_type(make_config(attn_implementation=attn))
    except (ImportError, ValueError) as exc:
        what = f"attn={attn} in transformers {transformers.__version__}"
        raise Unsupported.because(what, exc) from exc
    if attention_implementation(model) != attn:  # a transformers without attn_implementation
        raise Unsupported(
            f"attn={attn}: transformers {transformers.__version__} builds "
            f"{attention_implementation(model)} attention only"
        )
    return model


def attention_implementation(model: nn.Module) -> str:
    """The attention a built model runs: transformers' choice, 'eager' for a transformers
    that has no other (no ``_attn_implementation``)."""
    return getattr(model.config, "_attn_implementation", None) or "eager"


def masked_lm_batch(vocab: int, sizes: Sizes, generator: torch.Generator) -> Batch:
    """Tokens of a ``vocab``-word vocabulary, MASKED_FRACTION of them (and the first of each
    sequence) to predict."""
    shape = (sizes.batch_size, sizes.seq_len)
    tokens = torch.randint(0, vocab, shape, generator=generator)
    masked = torch.rand(shape, generator=generator) < MASKED_FRACTION
    masked[:, 0] = True  # every sequence contributes to the loss
    labels = torch.where(masked, tokens, torch.full_like(tokens, IGNORED_LABEL))
    return {"input_ids": tokens, "labels": labels}


def causal_lm_batch(vocab: int, sizes: Sizes, generator: torch.Generator) -> Batch:
    shape = (sizes.batch_size, sizes.seq_len)
    return {"input_ids": torch.randint(0, vocab, shape, generator=generator)}


def _masked_lm_loss(logits: torch.Tensor, batch: Batch) -> torch.Tensor:
    """BertForMaskedLM's loss: the mean over the masked tokens."""
    labels = batch["labels"]
    return nn.functional.cross_entropy(logits.view(-1, logits.size(-1)), labels.view(-1))


def _masked_count(batch: Batch) -> torch.Tensor:
    return (batch["labels"] != IGNORED_LABEL).sum()


def _causal_lm_loss(logits: torch.Tensor, batch: Batch) -> torch.Tensor:
    """GPT2LMHeadModel's loss: each position predicts the next token."""
    shifted = logits[..., :-1, :].contiguous()
    labels = batch["input_ids"][..., 1:].contiguous()
    return nn.functional.cross_entropy(shifted.view(-1, shifted.size(-1)), labels.view(-1))


def _bert_layers(model: transformers.BertForMaskedLM) -> list[Layer]:
    """The embeddings, each encoder layer, the masked-LM head (no padding: no attention mask,
    which BertModel would make all zeros)."""
    embeddings, head = model.bert.embeddings, model.cls
    return [
        Layer("embeddings", embeddings, lambda x, batch: embeddings(input_ids=batch["input_ids"])),
        *(_block(f"encoder.{i}", layer) for i, layer in enumerate(model.bert.encoder.layer)),
        Layer("head", head, lambda x, batch: head(x)),
    ]


def _gpt2_layers(model: transformers.GPT2LMHeadModel) -> list[Layer]:
    """Token and position embeddings, each block (causal masks of their own), the final layer
    norm with the vocabulary head (whose weight is the token embedding's)."""
    body = model.transformer

    def embed(x: object, batch: Batch) -> torch.Tensor:
        tokens = batch["input_ids"]
        positions = torch.arange(tokens.size(-1), device=tokens.device).unsqueeze(0)
        return body.drop(body.wte(tokens) + body.wpe(positions))

    embedding = nn.ModuleList([body.wte, body.wpe, body.drop])
    head = nn.ModuleList([body.ln_f, model.lm_head])
    return [
        Layer("embedding", embedding, embed),
        *(_block(f"h.{i}", block) for i, block in enumerate(body.h)),
        Layer("head", head, lambda x, batch: model.lm_head(body.ln_f(x))),
    ]


def _block(name: str, block: nn.Module) -> Layer:
    return Layer(name, block, lambda x, batch: block(x)[0])


def _bert_spec(name: str, description: str, **fields: int) -> ModelSpec:
    return ModelSpec(
        name=name,
        description=description,
        build=functools.partial(_build, "BertForMaskedLM", "BertConfig", fields),
        make_batch=functools.partial(masked_lm_batch, transformers.BertConfig().vocab_size),
        loss=lambda model, batch: model(input_ids=batch["input_ids"], labels=batch["labels"]).loss,
        infer=lambda model, batch: model(input_ids=batch["input_ids"]).logits,
        blocks=("BertLayer",),
        attention=attention_implementation,
        sdpa_mask_check=True,
        layering=Layering(_bert_layers, _masked_lm_loss, _masked_count),
    )


def _gpt2_spec(name: str, description: str, **fields: int) -> ModelSpec:
    return ModelSpec(
        name=name,
        description=description,
        build=functools.partial(_build, "GPT2LMHeadModel", "GPT2Config", fields),
        make_batch=functools.partial(causal_lm_batch, transformers.GPT2Config().vocab_size),
        loss=lambda model, batch: (
            model(input_ids=batch["input_ids"], labels=batch["input_ids"]).loss
        ),
        infer=lambda model, batch: model(input_ids=batch["input_ids"]).logits,
        blocks=("GPT2Block",),
        attention=attention_implementation,
        layering=Layering(_gpt2_layers, _causal_lm_loss),
    )


SPECS = {
    # The configs' defaults are bert-base-uncased's and the 124M GPT-2's sizes.
    "bert-base": _bert_spec(
        "bert-base", "BERT-base (110M) masked language model, 15% masked tokens"
    ),
    "gpt2": _gpt2_spec("gpt2", "GPT-2 (124M) causal language model"),
    "bert-tiny": _bert_spec(
        "bert-tiny", "BERT-Tiny (4.4M: 2 layers, width 128) masked language model", **TINY_BERT
    ),
    "gpt2-tiny": _gpt2_spec(
        "gpt2-tiny", "GPT-2 at BERT-Tiny's sizes (7.0M: 2 layers, width 128)", **TINY_GPT2
    ),
}
