"""The two example models of the seed article: a 1000→1000→10 MLP and an LSTM language model."""

from __future__ import annotations

import torch
from torch import nn
from torch.nn import functional

from ptspeed.models import Batch, ModelSpec, Sizes

MLP_FEATURES = 1000
MLP_CLASSES = 10
LSTM_VOCAB = 10000
LSTM_HIDDEN = 1024
LSTM_LAYERS = 4


class SimpleModel(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.fc1 = nn.Linear(MLP_FEATURES, MLP_FEATURES)
        self.fc2 = nn.Linear(MLP_FEATURES, MLP_CLASSES)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.fc2(torch.relu(self.fc1(x)))


class LanguageModel(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.embedding = nn.Embedding(LSTM_VOCAB, LSTM_HIDDEN)
        self.lstm = nn.LSTM(LSTM_HIDDEN, LSTM_HIDDEN, LSTM_LAYERS, batch_first=True)
        self.fc = nn.Linear(LSTM_HIDDEN, LSTM_VOCAB)

    def forward(self, tokens: torch.Tensor) -> torch.Tensor:
        hidden, _ = self.lstm(self.embedding(tokens))
        return self.fc(hidden)


def _mlp_batch(sizes: Sizes, generator: torch.Generator) -> Batch:
    return {
        "x": torch.randn(sizes.batch_size, MLP_FEATURES, generator=generator),
        "y": torch.randint(0, MLP_CLASSES, (sizes.batch_size,), generator=generator),
    }


def _lstm_batch(sizes: Sizes, generator: torch.Generator) -> Batch:
    tokens = torch.randint(
        0, LSTM_VOCAB, (sizes.batch_size, sizes.seq_len + 1), generator=generator
    )
    return {"tokens": tokens[:, :-1].contiguous(), "targets": tokens[:, 1:].contiguous()}


def _lstm_loss(model: nn.Module, batch: Batch) -> torch.Tensor:
    logits = model(batch["tokens"])
    return functional.cross_entropy(logits.reshape(-1, LSTM_VOCAB), batch["targets"].reshape(-1))


SPECS = {
    "mlp": ModelSpec(
        name="mlp",
        description="The seed's SimpleModel: Linear 1000→1000, ReLU, Linear 1000→10",
        build=lambda sizes: SimpleModel(),
        make_batch=_mlp_batch,
        loss=lambda model, batch: functional.cross_entropy(model(batch["x"]), batch["y"]),
        infer=lambda model, batch: model(batch["x"]),
        blocks=("Linear",),
    ),
    "lstm-lm": ModelSpec(
        name="lstm-lm",
        description="The seed's LanguageModel: embedding 10000×1024, 4-layer LSTM, vocab head",
        build=lambda sizes: LanguageModel(),
        make_batch=_lstm_batch,
        loss=_lstm_loss,
        infer=lambda model, batch: model(batch["tokens"]),
        blocks=("Embedding", "LSTM", "Linear"),
    ),
}
