"""Building the step a cell times: knobs applied to a model, and the batches fed to it.

A *step* is a callable taking a batch and returning the loss (train) or the output (infer).
Everything here runs before the clock starts; the returned callables do only the work a
user's own training loop would do.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable
from typing import Any

import torch

from ptspeed.knobs import Knobs
from ptspeed.models import Batch, ModelSpec

Step = Callable[[Batch], Any]
LEARNING_RATE = 1e-3
MOMENTUM = 0.9
DTYPES = {"fp16": torch.float16, "bf16": torch.bfloat16}
CUDA_GRAPH_WARMUP_CALLS = 3


def prepare_model(model: torch.nn.Module, knobs: Knobs, mode: str) -> torch.nn.Module:
    """Put ``model`` in train/eval mode and apply the model-level knobs; return what to call."""
    model.train(mode == "train")
    if knobs.channels_last:
        model = model.to(memory_format=torch.channels_last)
    if knobs.compile_mode is not None:
        mode_arg = None if knobs.compile_mode == "default" else knobs.compile_mode
        return torch.compile(model, mode=mode_arg, backend=knobs.compile_backend)
    return model


def make_step(
    spec: ModelSpec,
    model: torch.nn.Module,
    knobs: Knobs,
    mode: str,
    device: torch.device,
    output_scale: float = 1.0,
) -> Step:
    """The step for ``mode``. ``output_scale`` != 1 makes a deliberately wrong variant (tests)."""
    net = prepare_model(model, knobs, mode)
    autocast = _autocast_factory(knobs, device)
    if mode == "infer":

        def infer_step(batch: Batch) -> Any:
            with torch.no_grad(), autocast():
                output = spec.infer(net, batch)
            wrong = output_scale != 1.0 and isinstance(output, torch.Tensor)
            return output * output_scale if wrong else output

        step: Step = infer_step
    else:
        step = _train_step(spec, net, model, knobs, device, autocast, output_scale)
    if knobs.cudagraphs:
        return CudaGraphStep(step)
    return step


def _train_step(
    spec: ModelSpec,
    net: Any,
    model: torch.nn.Module,
    knobs: Knobs,
    device: torch.device,
    autocast: Callable[[], Any],
    output_scale: float,
) -> Step:
    optimizer = torch.optim.SGD(model.parameters(), lr=LEARNING_RATE, momentum=MOMENTUM)
    scaler = _grad_scaler() if knobs.precision(device.type) == "fp16" else None

    def train_step(batch: Batch) -> torch.Tensor:
        optimizer.zero_grad(set_to_none=True)
        with autocast():
            loss = spec.loss(net, batch)
        if scaler is not None:
            scaler.scale(loss).backward()
            scaler.step(optimizer)
            scaler.update()
        else:
            loss.backward()
            optimizer.step()
        return loss.detach() * output_scale if output_scale != 1.0 else loss.detach()

    return train_step


def _autocast_factory(knobs: Knobs, device: torch.device) -> Callable[[], Any]:
    precision = knobs.precision(device.type)
    if precision == "fp32":
        return contextlib.nullcontext
    dtype = DTYPES[precision]
    # A CUDA graph replays the kernels of its capture: autocast's cast cache must not outlive it.
    cache = not knobs.cudagraphs
    return lambda: torch.autocast(device_type=device.type, dtype=dtype, cache_enabled=cache)


def _grad_scaler() -> Any:
    amp = getattr(torch, "amp", None)
    if amp is not None and hasattr(amp, "GradScaler"):
        try:
            return amp.GradScaler("cuda")
        except TypeError:  # torch 2.0's torch.amp.GradScaler is not device-generic yet
            pass
    return torch.cuda.amp.GradScaler()


class CudaGraphStep:
    """Whole-step CUDA graph capture, as in PyTorch's "whole-network capture" recipe.

    The first calls run eagerly on a side stream (so lazy initialisation happens outside the
    capture), the next captures the step and every call then replays it after copying the new
    batch into the captured (static) input tensors. Each call is one real step.
    """

    def __init__(self, step: Step) -> None:
        self._step = step
        self._calls = 0
        self._graph: Any = None
        self._static_batch: Batch = {}
        self._static_output: Any = None

    def __call__(self, batch: Batch) -> Any:
        self._calls += 1
        if self._calls <= CUDA_GRAPH_WARMUP_CALLS:
            return self._run_on_side_stream(batch)
        if self._graph is None:
            self._capture(batch)
        for name, tensor in batch.items():
            static = self._static_batch[name]
            if tensor.data_ptr() != static.data_ptr():
                static.copy_(tensor, non_blocking=True)
        self._graph.replay()
        return self._static_output

    def _run_on_side_stream(self, batch: Batch) -> Any:
        side = torch.cuda.Stream()
        side.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(side):
            output = self._step(batch)
        torch.cuda.current_stream().wait_stream(side)
        return output

    def _capture(self, batch: Batch) -> None:
        self._static_batch = dict(batch)
        self._graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(self._graph):
            self._static_output = self._step(self._static_batch)


class RepeatedBatch(torch.utils.data.Dataset):
    """Serves the samples of one host batch, cyclically, so every loader batch is that batch."""

    def __init__(self, batch: Batch, length: int) -> None:
        self._batch = batch
        self._batch_size = len(next(iter(batch.values())))
        self._length = length

    def __len__(self) -> int:
        return self._length

    def __getitem__(self, index: int) -> Batch:
        return {name: tensor[index % self._batch_size] for name, tensor in self._batch.items()}


def to_device(
    batch: Batch, device: torch.device, channels_last: bool, non_blocking: bool = False
) -> Batch:
    moved = {}
    for name, tensor in batch.items():
        tensor = tensor.to(device, non_blocking=non_blocking)
        if channels_last and tensor.dim() == 4 and tensor.is_floating_point():
            tensor = tensor.contiguous(memory_format=torch.channels_last)
        moved[name] = tensor
    return moved


def batch_supplier(
    host_batch: Batch, knobs: Knobs, device: torch.device, total_steps: int
) -> Callable[[], Batch]:
    """Where each step's batch comes from.

    Without the loader knob: one batch resident on the device, reused (no copies in the loop).
    With it: a DataLoader over host tensors (collation, optional workers and pinning), each
    batch copied to the device inside the step, as a real input pipeline does.
    """
    if knobs.loader_workers is None:
        resident = to_device(host_batch, device, knobs.channels_last)
        return lambda: resident
    batch_size = len(next(iter(host_batch.values())))
    loader = torch.utils.data.DataLoader(
        RepeatedBatch(host_batch, batch_size * total_steps),
        batch_size=batch_size,
        num_workers=knobs.loader_workers,
        pin_memory=knobs.pin_memory,
        drop_last=True,
        persistent_workers=knobs.loader_workers > 0,
    )
    batches = iter(loader)

    def next_batch() -> Batch:
        nonlocal batches
        try:
            host = next(batches)
        except StopIteration:
            batches = iter(loader)
            host = next(batches)
        return to_device(host, device, knobs.channels_last, non_blocking=knobs.pin_memory)

    return next_batch
