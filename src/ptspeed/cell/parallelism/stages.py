"""Model parallelism: a model's layers cut into consecutive stages, one process each.

``modelpar=N`` and ``pipeline=N+chunks=M`` run as N ranks under torchrun, like ddp (see
:mod:`ptspeed.cell.parallelism.distributed`): rank r holds stage r on ``cuda:r`` (NCCL) or on the
CPU (gloo). The model's :class:`ptspeed.models.Layering` lists its layers in order (ResNet-50: the
stem, 16 bottlenecks, pooling with the classifier; BERT: embeddings, 12 encoder layers, the
masked-LM head; GPT-2: embeddings, 12 blocks, final norm with the vocabulary head; the LSTM
LM: embedding, 4 LSTM layers, the vocabulary head). :func:`balanced_split` cuts them into N
contiguous stages minimising the largest stage's parameter count; the split is recorded as
``metrics.stage_split``, e.g. ``0-7 stem..layer3.0 8.5M | 8-17 layer3.1..fc 17.0M``. Every
rank builds the whole model (the same seeded weights) and frees what its stage does not hold.
A parameter used by two stages (GPT-2's and BERT's tied embedding and vocabulary head) lives
on both, and its gradient is summed between them before the optimizer step, as Megatron-LM
does with tied embeddings.

The schedule is hand-written GPipe on ``torch.distributed.send``/``recv``, the same in torch
1.13, 2.0 and 2.14 (``torch.distributed.pipelining`` exists in 2.4+ only, and 1.13's
``torch.distributed.pipeline.sync.Pipe`` runs one process over several GPUs): every
micro-batch's forward, stage to stage, then every micro-batch's backward in reverse order,
gradients accumulated, then each stage's optimizer step. ``modelpar`` is the same with one
micro-batch (naive model parallelism: one stage busy at a time). Each activation is preceded
by a small header (dtype and shape) and followed by the random generator's state, so that the
next stage draws dropout masks where the previous left off
(:mod:`ptspeed.cell.microbatch`). The loss, computed by the last stage, is broadcast to
every rank as the step's output; in inference the last stage returns the output. The numerics gate
compares rank 0's gathered loss, gradients and update with eager over the same micro-batches.

Ran on the CPU with 2 gloo processes (tiny sizes): modelpar=2 and pipeline=2+chunks=2 for
ResNet-50, BERT-base, GPT-2 and the LSTM LM in torch 2.14.1, pipeline=2+chunks=2 for the MLP
and GPT-2 in 1.13.1, ResNet-50 and modelpar=2 inference of the MLP in 2.0.1: every loss equal
to eager's over the same micro-batches, to the last bit. Not run on CUDA yet (NCCL: written
against the documented send/recv, gather_object and broadcast_object_list, one GPU per rank).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from typing import Any

import torch
import torch.distributed as dist

from ptspeed.cell.measurement.reference import host_copy
from ptspeed.cell.microbatch import split, step_seed, weights
from ptspeed.cell.parallelism.distributed import Rank
from ptspeed.cell.record import CellSpec
from ptspeed.cell.record_window import Metrics
from ptspeed.cell.steps import LEARNING_RATE, MOMENTUM, Step, _autocast_factory
from ptspeed.cell.variants.knobs import Knobs
from ptspeed.errors import Unsupported
from ptspeed.models import Batch, Layer, Layering, ModelSpec, get_model

MAX_DIMS = 8
DTYPES = (torch.float32, torch.float16, torch.bfloat16, torch.float64)


def parameter_count(module: Any) -> int:
    return sum(p.numel() for p in {id(p): p for p in module.parameters()}.values())


def balanced_split(sizes: list[int], stages: int) -> list[range]:
    """``stages`` contiguous, non-empty ranges of ``sizes`` whose largest sum is smallest
    (among equals, the one with the earliest cuts latest: the first stages fuller)."""
    if not 1 <= stages <= len(sizes):
        raise ValueError(f"cannot cut {len(sizes)} layers into {stages} stages")
    prefix = [0]
    for size in sizes:
        prefix.append(prefix[-1] + size)
    # best[k][i]: the smallest largest-stage sum of the first i layers in k stages.
    infinity = float("inf")
    best = [[infinity] * (len(sizes) + 1) for _ in range(stages + 1)]
    cut = [[0] * (len(sizes) + 1) for _ in range(stages + 1)]
    best[0][0] = 0
    for k in range(1, stages + 1):
        for i in range(k, len(sizes) + 1):
            for j in range(k - 1, i):
                largest = max(best[k - 1][j], prefix[i] - prefix[j])
                if largest <= best[k][i]:
                    best[k][i], cut[k][i] = largest, j
    ranges, end = [], len(sizes)
    for k in range(stages, 0, -1):
        ranges.append(range(cut[k][end], end))
        end = cut[k][end]
    return ranges[::-1]


def describe_split(names: list[str], sizes: list[int], ranges: list[range]) -> str:
    """e.g. ``0-7 stem..layer3.0 8.5M | 8-17 layer3.1..fc 17.0M``."""
    parts = []
    for stage in ranges:
        first, last = stage[0], stage[-1]
        count = sum(sizes[i] for i in stage) / 1e6
        parts.append(f"{first}-{last} {names[first]}..{names[last]} {count:.1f}M")
    return " | ".join(parts)


def staged_layers(model_spec: ModelSpec, model: Any, stages: int) -> tuple[list[Layer], Layering]:
    """The model's layers and layering; :class:`Unsupported` when it cannot be cut so."""
    layering = model_spec.layering
    if layering is None:
        why = model_spec.unstaged_reason or "it has no layering (ptspeed.models.Layering)"
        raise Unsupported(f"{model_spec.name} cannot be cut into stages: {why}")
    layers = layering.layers(model)
    if stages > len(layers):
        raise Unsupported(f"{model_spec.name} has {len(layers)} layers, fewer than {stages} stages")
    return layers, layering


class StageRank(Rank):
    """Rank r of a modelpar/pipeline cell: stage r of the model, and the GPipe schedule."""

    model_spec: ModelSpec
    stage_split = ""
    layers: list[Layer]
    layering: Layering
    owned: set[int]
    names: list[str]
    held: list[tuple[str, torch.Tensor]]
    shared: list[tuple[torch.Tensor, Any]]

    @classmethod
    def from_environment(cls, spec: CellSpec) -> StageRank:
        placement = super().from_environment(spec)
        assert isinstance(placement, StageRank)
        placement.model_spec = get_model(spec.model_reference, spec.shape)
        return placement

    @property
    def first(self) -> bool:
        return self.rank == 0

    @property
    def last(self) -> bool:
        return self.rank == self.world_size - 1

    def wrap(
        self, model: Any, knobs: Knobs, device: torch.device, blocks: tuple[str, ...] = ()
    ) -> tuple[Any, Knobs]:
        """Keep this rank's stage of ``model`` (the rest freed); the model, whole in name,
        stays what the numerics capture reads parameters from."""
        if knobs.channels_last:
            model = model.to(memory_format=torch.channels_last)
        layers, self.layering = staged_layers(self.model_spec, model, self.world_size)
        sizes = [parameter_count(layer.module) for layer in layers]
        ranges = balanced_split(sizes, self.world_size)
        self.stage_split = describe_split([layer.name for layer in layers], sizes, ranges)
        holders = [_tensor_ids(layers[i].module for i in stage) for stage in ranges]
        self.layers = [layers[i] for i in ranges[self.rank]]
        self.owned = holders[self.rank]
        self.names = [name for name, _ in model.named_parameters()]
        self.held = [(n, p) for n, p in model.named_parameters() if id(p) in self.owned]
        self.shared = self._tied_groups(model, holders)
        _free_all_but(model, self.owned)
        return model, dataclasses.replace(knobs, channels_last=False)

    def _tied_groups(self, model: Any, holders: list[set[int]]) -> list[tuple[torch.Tensor, Any]]:
        """A process group for each parameter held by several stages (every rank makes every
        group, as new_group requires); the ones this rank takes part in."""
        groups = []
        for parameter in model.parameters():
            ranks = [r for r, ids in enumerate(holders) if id(parameter) in ids]
            if len(ranks) > 1:
                group = dist.new_group(ranks=ranks)
                if self.rank in ranks:
                    groups.append((parameter, group))
        return groups

    def global_batch(self, batch_size: int) -> int:
        return batch_size  # one batch goes through all the stages

    def combine(self, metrics: Metrics) -> Metrics:
        return dataclasses.replace(super().combine(metrics), stage_split=self.stage_split)

    def make_step(
        self,
        model_spec: ModelSpec,
        model: Any,
        knobs: Knobs,
        mode: str,
        device: torch.device,
        fault: str = "",
    ) -> Step:
        model.train(mode == "train")
        parameters = [p for _, p in self.held if p.requires_grad]
        optimizer = torch.optim.SGD(parameters, lr=LEARNING_RATE, momentum=MOMENTUM)
        schedule = GPipe(self, model_spec, knobs, device, mode)
        if mode == "infer":
            return Step(schedule.infer)
        return Step(_trained(schedule, optimizer, parameters, fault), optimizer)

    # --- what the numerics capture reads: gathered on rank 0 (collectives) ---

    def full_state(self, model: Any) -> dict[str, Any]:
        state = model.state_dict(keep_vars=True).items()
        return self._gathered(host_copy((n, t) for n, t in state if id(t) in self.owned))

    def gradients(self, model: Any) -> dict[str, Any] | None:
        held = ((n, p.grad) for n, p in self.held if p.grad is not None)
        gathered = self._gathered(host_copy(held))
        return gathered if self.reports else None

    def momentum(self, optimizer: torch.optim.Optimizer | None) -> list[torch.Tensor | None]:
        """Every parameter's momentum buffer in the whole model's order (rank 0)."""
        if optimizer is None:
            return []
        named = ((n, optimizer.state.get(p, {}).get("momentum_buffer")) for n, p in self.held)
        gathered = self._gathered(host_copy((n, b) for n, b in named if b is not None))
        return [gathered.get(name) for name in self.names] if self.reports else []

    def reported_output(self, sample: Any) -> Any:
        """The last stage's output sample, on every rank."""
        carrier = [sample]
        dist.broadcast_object_list(carrier, src=self.world_size - 1)
        return carrier[0]

    def _gathered(self, mine: dict[str, Any]) -> dict[str, Any]:
        parts: list[Any] | None = [None] * self.world_size if self.reports else None
        dist.gather_object(mine, parts, dst=0)
        merged: dict[str, Any] = {}
        for part in parts or []:
            merged.update(part)
        return merged


def _tensor_ids(modules: Any) -> set[int]:
    return {id(t) for module in modules for t in (*module.parameters(), *module.buffers())}


def _free_all_but(model: Any, kept: set[int]) -> None:
    """Replace the data of every parameter and buffer not in ``kept`` with an empty tensor."""
    with torch.no_grad():
        for tensor in (*model.parameters(), *model.buffers()):
            if id(tensor) not in kept:
                tensor.data = torch.empty(0, dtype=tensor.dtype, device=tensor.device)


def _trained(
    schedule: GPipe, optimizer: torch.optim.Optimizer, parameters: list[torch.Tensor], fault: str
) -> Callable[[Batch], torch.Tensor]:
    """A training step: the schedule's forward and backward, tied gradients summed, the
    optimizer step. Faults as in :func:`ptspeed.cell.steps.make_step`."""
    calls = 0

    def train_step(batch: Batch) -> torch.Tensor:
        nonlocal calls
        calls += 1
        optimizer.zero_grad(set_to_none=True)
        loss = schedule.train(batch)
        schedule.sum_tied_gradients()
        if fault == "grad":
            for parameter in parameters:
                if parameter.grad is not None:
                    parameter.grad.mul_(2.0)
        if not (fault == "skip-step" and calls == 1):
            optimizer.step()
        return loss

    return train_step


class GPipe:
    """This rank's part of the GPipe schedule: forwards of all micro-batches, then backwards."""

    def __init__(
        self,
        placement: StageRank,
        model_spec: ModelSpec,
        knobs: Knobs,
        device: torch.device,
        mode: str,
    ) -> None:
        self.placement = placement
        self.model_spec = model_spec
        self.chunks = knobs.chunks
        self.device = device
        self.channels_last = knobs.channels_last
        self.autocast = _autocast_factory(knobs, device)
        self.train_mode = mode == "train"
        self.link = Link(placement.rank, placement.world_size, device)

    def _forward(self, piece: Batch, seed: int, m: int) -> tuple[Any, Any]:
        """One micro-batch through this stage: (its input, its output)."""
        if self.placement.first:
            torch.manual_seed(seed + m)
            x = None
        else:
            x = self.link.receive_activation()
            self.link.receive_generator()
            if self.channels_last and x.dim() == 4:
                x = x.contiguous(memory_format=torch.channels_last)
            x.requires_grad_(self.train_mode and x.is_floating_point())
        with self.autocast():
            y = x
            for layer in self.placement.layers:
                y = layer.run(y, piece)
        if not self.placement.last:
            self.link.send_activation(y)
            self.link.send_generator()
        return x, y

    def train(self, batch: Batch) -> torch.Tensor:
        pieces = split(batch, self.chunks)
        seed = step_seed() if self.placement.first else 0
        kept, losses = [], []
        shares = weights(self.model_spec, pieces) if self.placement.last else []
        for m, piece in enumerate(pieces):
            x, y = self._forward(piece, seed, m)
            if self.placement.last:
                with self.autocast():
                    y = self.placement.layering.loss(y, piece) * shares[m]
                losses.append(y.detach())
            kept.append((x, y))
        for x, y in reversed(kept):
            if self.placement.last:
                y.backward()
            else:
                torch.autograd.backward(y, self.link.receive_gradient(y))
            if not self.placement.first:
                self.link.send_gradient(x.grad)
        loss = torch.stack(losses).sum() if losses else torch.zeros((), device=self.device)
        dist.broadcast(loss, src=self.placement.world_size - 1)
        return loss

    def infer(self, batch: Batch) -> Any:
        seed = step_seed() if self.placement.first else 0
        outputs = []
        with torch.no_grad():
            for m, piece in enumerate(split(batch, self.chunks)):
                outputs.append(self._forward(piece, seed, m)[1])
        return torch.cat(outputs) if self.placement.last else None

    def sum_tied_gradients(self) -> None:
        for parameter, group in self.placement.shared:
            if parameter.grad is not None:
                dist.all_reduce(parameter.grad, group=group)


class Link:
    """Point-to-point traffic with the previous and next stage (rank - 1, rank + 1)."""

    def __init__(self, rank: int, world_size: int, device: torch.device) -> None:
        self.previous, self.next = rank - 1, rank + 1
        self.device = device
        self.cuda = device.type == "cuda"

    def send_activation(self, y: torch.Tensor) -> None:
        header = [DTYPES.index(y.dtype), y.dim(), *y.shape]
        header += [0] * (MAX_DIMS + 2 - len(header))
        dist.send(torch.tensor(header, dtype=torch.int64, device=self.device), self.next)
        dist.send(y.detach().contiguous(), self.next)

    def receive_activation(self) -> torch.Tensor:
        header = torch.zeros(MAX_DIMS + 2, dtype=torch.int64, device=self.device)
        dist.recv(header, self.previous)
        dtype, dims, *shape = header.tolist()
        x = torch.empty(shape[:dims], dtype=DTYPES[dtype], device=self.device)
        dist.recv(x, self.previous)
        return x

    def send_gradient(self, gradient: torch.Tensor) -> None:
        dist.send(gradient.contiguous(), self.previous)

    def receive_gradient(self, y: torch.Tensor) -> torch.Tensor:
        gradient = torch.empty(y.shape, dtype=y.dtype, device=self.device)
        dist.recv(gradient, self.next)
        return gradient

    def _generator_state(self) -> torch.Tensor:
        if self.cuda:
            return torch.cuda.get_rng_state(self.device)
        return torch.get_rng_state()

    def send_generator(self) -> None:
        dist.send(self._generator_state().to(self.device), self.next)

    def receive_generator(self) -> None:
        state = torch.empty_like(self._generator_state(), device=self.device)
        dist.recv(state, self.previous)
        if self.cuda:
            torch.cuda.set_rng_state(state.cpu(), self.device)
        else:
            torch.set_rng_state(state)
