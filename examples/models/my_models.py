"""A user's own model for ptspeed, outside the package: config/user-model.yaml runs it.

ptspeed imports this module in each cell's environment (the config's model_paths put this
directory on the cells' PYTHONPATH) and asks for ``my_models:small_transformer``: a
ptspeed.models.ModelSpec, or, as here, a function returning one.
"""

from __future__ import annotations

import torch
from torch import nn
from torch.nn import functional

from ptspeed.models import ModelSpec, Sizes

VOCAB = 1000
WIDTH = 64
HEADS = 4
LAYERS = 2


class SmallTransformer(nn.Module):
    """A two-layer transformer encoder classifying each token's successor."""

    def __init__(self) -> None:
        super().__init__()
        self.embedding = nn.Embedding(VOCAB, WIDTH)
        layer = nn.TransformerEncoderLayer(WIDTH, HEADS, 4 * WIDTH, batch_first=True)
        self.encoder = nn.TransformerEncoder(layer, LAYERS)
        self.head = nn.Linear(WIDTH, VOCAB)

    def forward(self, tokens: torch.Tensor) -> torch.Tensor:
        return self.head(self.encoder(self.embedding(tokens)))


def _batch(sizes: Sizes, generator: torch.Generator) -> dict[str, torch.Tensor]:
    tokens = torch.randint(0, VOCAB, (sizes.batch_size, sizes.seq_len + 1), generator=generator)
    return {"tokens": tokens[:, :-1], "targets": tokens[:, 1:]}


def _loss(model: nn.Module, batch: dict[str, torch.Tensor]) -> torch.Tensor:
    logits = model(batch["tokens"])
    return functional.cross_entropy(logits.reshape(-1, VOCAB), batch["targets"].reshape(-1))


def small_transformer() -> ModelSpec:
    return ModelSpec(
        name="small-transformer",
        description="A user's 2-layer transformer encoder (width 64), next-token loss",
        build=lambda sizes: SmallTransformer(),
        make_batch=_batch,
        loss=_loss,
        infer=lambda model, batch: model(batch["tokens"]),
        blocks=("TransformerEncoderLayer",),
        limits={"seq_len": (1, 4096)},
    )
