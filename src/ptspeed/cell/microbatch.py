"""Micro-batches of a staged variant (modelpar, pipeline), and the eager step it must match.

A staged step splits the batch into ``chunks`` micro-batches (``tensor_split``: sizes differ by
one at most) and weighs each micro-batch's loss by its share of the terms the whole batch's
loss averages over (its samples; BERT's masked tokens), so that the sum of the weighted
micro-batch losses is the whole batch's loss. Each micro-batch's random numbers (dropout) come
from a generator seeded with ``seed + m``, ``seed`` drawn from the default generator at the
start of the step, and travel from stage to stage with the activations
(:mod:`ptspeed.cell.parallelism.stages`): the stages then draw exactly what one process running the
micro-batches one after the other draws.

:func:`micro_batched` is that eager step for the numerics gate: the model's own forward and
loss over the same micro-batches, seeded the same way, in one process. With batch norm the
statistics are those of each micro-batch, in the pipeline as in its reference (GPipe's
semantics); without it the reference equals whole-batch eager up to the order of sums.
"""

from __future__ import annotations

import dataclasses
from typing import Any

import torch

from ptspeed.models import Batch, ModelSpec

SEED_BOUND = 2**62


def split(batch: Batch, chunks: int) -> list[Batch]:
    """``chunks`` micro-batches along the first dimension of every tensor of ``batch``."""
    pieces = {name: tensor.tensor_split(chunks) for name, tensor in batch.items()}
    return [{name: pieces[name][m] for name in batch} for m in range(chunks)]


def weights(model_spec: ModelSpec, micro_batches: list[Batch]) -> list[float]:
    """Each micro-batch's share of the whole batch's loss terms."""
    layering = model_spec.layering
    count = layering.count if layering is not None and layering.count else _samples
    counts = [float(count(piece)) for piece in micro_batches]
    total = sum(counts) or 1.0
    return [c / total for c in counts]


def _samples(batch: Batch) -> int:
    return len(next(iter(batch.values())))


def step_seed() -> int:
    """The seed of this step's micro-batches, drawn from the default generator."""
    return int(torch.randint(0, SEED_BOUND, (1,)).item())


def micro_batched(model_spec: ModelSpec, chunks: int) -> ModelSpec:
    """``model_spec`` whose loss and inference output go micro-batch by micro-batch, seeded as
    the stages seed them: the eager reference of a staged variant."""

    def loss(model: Any, batch: Batch) -> Any:
        seed, pieces = step_seed(), split(batch, chunks)
        terms = []
        for m, (piece, weight) in enumerate(zip(pieces, weights(model_spec, pieces), strict=True)):
            torch.manual_seed(seed + m)
            terms.append(model_spec.loss(model, piece) * weight)
        return torch.stack(terms).sum()

    def infer(model: Any, batch: Batch) -> Any:
        seed, outputs = step_seed(), []
        for m, piece in enumerate(split(batch, chunks)):
            torch.manual_seed(seed + m)
            outputs.append(model_spec.infer(model, piece))
        return torch.cat(outputs)

    return dataclasses.replace(model_spec, loss=loss, infer=infer)
