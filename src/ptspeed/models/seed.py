"""The two example models of the seed article: a 1000→1000→10 MLP and an LSTM language model."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch
from torch import nn
from torch.nn import functional

from ptspeed.models import Batch, Layer, Layering, ModelSpec, Sizes

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
    return _lstm_output_loss(model(batch["tokens"]), batch)


def _lstm_output_loss(logits: torch.Tensor, batch: Batch) -> torch.Tensor:
    return functional.cross_entropy(logits.reshape(-1, LSTM_VOCAB), batch["targets"].reshape(-1))


def _mlp_output_loss(output: torch.Tensor, batch: Batch) -> torch.Tensor:
    return functional.cross_entropy(output, batch["y"])


def _mlp_layers(model: SimpleModel) -> list[Layer]:
    return [
        Layer("fc1", model.fc1, lambda x, batch: torch.relu(model.fc1(batch["x"]))),
        Layer("fc2", model.fc2, lambda x, batch: model.fc2(x)),
    ]


def _lstm_layers(model: LanguageModel) -> list[Layer]:
    """The embedding, each LSTM layer on its own (a one-layer LSTM sharing the parameters of
    layer k: stacked LSTM layers without dropout are exactly that) and the vocabulary head."""
    lstms = [_lstm_layer(model.lstm, k) for k in range(model.lstm.num_layers)]
    return [
        Layer("embedding", model.embedding, lambda x, batch: model.embedding(batch["tokens"])),
        *(Layer(f"lstm.{k}", lstm, _first_output(lstm)) for k, lstm in enumerate(lstms)),
        Layer("fc", model.fc, lambda x, batch: model.fc(x)),
    ]


def _lstm_layer(lstm: nn.LSTM, k: int) -> nn.LSTM:
    size = lstm.input_size if k == 0 else lstm.hidden_size
    layer = nn.LSTM(size, lstm.hidden_size, 1, bias=lstm.bias, batch_first=lstm.batch_first)
    for name in layer._flat_weights_names:  # weight_ih_l0, ...: point them at layer k's
        setattr(layer, name, getattr(lstm, name.replace("_l0", f"_l{k}")))
    layer.flatten_parameters()  # cuDNN wants the layer's weights in one buffer (CUDA only)
    return layer


def _first_output(module: nn.Module) -> Callable[[Any, Batch], Any]:
    return lambda x, batch: module(x)[0]


SPECS = {
    "mlp": ModelSpec(
        name="mlp",
        description="The seed's SimpleModel: Linear 1000→1000, ReLU, Linear 1000→10",
        build=lambda sizes: SimpleModel(),
        make_batch=_mlp_batch,
        loss=lambda model, batch: _mlp_output_loss(model(batch["x"]), batch),
        infer=lambda model, batch: model(batch["x"]),
        blocks=("Linear",),
        layering=Layering(_mlp_layers, _mlp_output_loss),
    ),
    "lstm-lm": ModelSpec(
        name="lstm-lm",
        description="The seed's LanguageModel: embedding 10000×1024, 4-layer LSTM, vocab head",
        build=lambda sizes: LanguageModel(),
        make_batch=_lstm_batch,
        loss=_lstm_loss,
        infer=lambda model, batch: model(batch["tokens"]),
        blocks=("Embedding", "LSTM", "Linear"),
        layering=Layering(_lstm_layers, _lstm_output_loss),
    ),
}
