"""Building the step a cell times: knobs applied to a model, and the batches fed to it.

A *step* is a callable taking a batch and returning the loss (train) or the output (infer).
Everything here runs before the clock starts; the returned callables do only the work a
user's own training loop would do.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import torch

from ptspeed.cell.variants.jit import ONE_OFF_CALLS as JIT_ONE_OFF_CALLS
from ptspeed.cell.variants.jit import TorchScriptModel
from ptspeed.cell.variants.knobs import Knobs
from ptspeed.errors import Unsupported
from ptspeed.models import Batch, ModelSpec, Sizes

LEARNING_RATE = 1e-3
MOMENTUM = 0.9
DTYPES = {"fp16": torch.float16, "bf16": torch.bfloat16}
CUDA_GRAPH_WARMUP_CALLS = 3
# torch.compile modes that capture CUDA graphs (cudagraph trees): a compiled function runs
# once in warm-up, is recorded on its next call, and replayed from the third call on.
COMPILE_MODES_WITH_CUDAGRAPHS = ("reduce-overhead", "max-autotune")
CUDAGRAPH_TREES_ONE_OFF_CALLS = 2


def build_model(
    model_spec: ModelSpec,
    sizes: Sizes,
    seed: int,
    device: torch.device,
    attn: str | None = None,
) -> Any:
    """The model with its seeded initial weights, on ``device``; ``attn``: the attention
    implementation of a model that has several (None: the library's default)."""
    torch.manual_seed(seed)
    options = {"attn": attn} if model_spec.attention is not None else {}
    return model_spec.build(sizes, **options).to(device)


def prepare_model(model: torch.nn.Module, knobs: Knobs, mode: str) -> Any:
    """Put ``model`` in train/eval mode and apply the model-level knobs; return what to call."""
    model.train(mode == "train")
    if knobs.channels_last:
        model = model.to(memory_format=torch.channels_last)
    if knobs.compile_mode is not None:
        mode_arg = None if knobs.compile_mode == "default" else knobs.compile_mode
        return torch.compile(model, mode=mode_arg, backend=knobs.compile_backend)
    if knobs.jit is not None:
        if mode == "infer" and knobs.amp is not None:
            raise Unsupported(
                "jit with amp in infer mode: torch.jit.optimize_for_inference's module ignores "
                "autocast and computes in fp32 (tried on the CPU in torch 1.13.1 to 2.14.1)"
            )
        return TorchScriptModel(model, knobs.jit, freeze=mode == "infer")
    return model


@dataclass
class Step:
    """One step of a cell: call it with a batch; it returns the loss (train) or the output.

    ``optimizer`` is the step's optimizer (train mode), so the numerics check can read and
    restore its state; ``one_off_calls`` is how many first calls hold one-off work of a knob
    (CUDA graph capture, cudagraph trees' recording) and produce no steady-state values.
    """

    run: Callable[[Batch], Any]
    optimizer: torch.optim.Optimizer | None = None
    one_off_calls: int = 0
    scaler: Any = None  # the GradScaler of an fp16 step
    # A fixed loss scale instead of GradScaler's (the numerics references set it per step).
    loss_scale: float = 1.0

    def __call__(self, batch: Batch) -> Any:
        return self.run(batch)


def make_step(
    spec: ModelSpec,
    model: torch.nn.Module,
    knobs: Knobs,
    mode: str,
    device: torch.device,
    fault: str = "",
    static_loss_scale: bool = False,
) -> Step:
    """The step for ``mode``. ``fault`` (tests of the suite only): ``grad`` doubles the
    gradients after every backward pass; ``skip-step`` skips the first optimizer step.
    ``static_loss_scale``: fp16 scales the loss by ``Step.loss_scale`` instead of a GradScaler."""
    net = prepare_model(model, knobs, mode)
    autocast = _autocast_factory(knobs, device)
    if mode == "infer":

        def infer_step(batch: Batch) -> Any:
            with torch.no_grad(), autocast():
                return spec.infer(net, batch)

        step = Step(infer_step)
    else:
        step = _train_step(spec, net, model, knobs, device, autocast, fault, static_loss_scale)
    step.one_off_calls = JIT_ONE_OFF_CALLS if knobs.jit else compiled_one_off_calls(knobs, device)
    if knobs.cudagraphs:
        # A loader's pin-memory thread calls CUDA while the main thread captures: the default
        # (global) capture mode takes that for an error in the capture.
        loader = bool(knobs.loader_workers) or knobs.pin_memory
        graph = CudaGraphStep(step.run, thread_local=loader)
        return Step(graph, step.optimizer, CudaGraphStep.ONE_OFF_CALLS, step.scaler)
    return step


def compiled_one_off_calls(knobs: Knobs, device: torch.device) -> int:
    """Calls of a compiled step whose outputs come from cudagraph trees' warm-up and recording
    rather than a replay: 0 without CUDA graphs (compilation itself happens in the first call,
    whose values are the compiled code's)."""
    if knobs.compile_mode in COMPILE_MODES_WITH_CUDAGRAPHS and device.type == "cuda":
        return CUDAGRAPH_TREES_ONE_OFF_CALLS
    return 0


def _train_step(
    spec: ModelSpec,
    net: Any,
    model: torch.nn.Module,
    knobs: Knobs,
    device: torch.device,
    autocast: Callable[[], Any],
    fault: str,
    static_loss_scale: bool,
) -> Step:
    optimizer = torch.optim.SGD(model.parameters(), lr=LEARNING_RATE, momentum=MOMENTUM)
    fp16 = knobs.precision(device.type) == "fp16"
    scaler = _grad_scaler() if fp16 and not static_loss_scale else None
    parameters = [p for p in model.parameters() if p.requires_grad]
    calls = 0

    def train_step(batch: Batch) -> torch.Tensor:
        nonlocal calls
        calls += 1
        optimizer.zero_grad(set_to_none=True)
        with autocast():
            loss = spec.loss(net, batch)
        if scaler is not None:
            scaler.scale(loss).backward()
        elif step.loss_scale != 1.0:
            (loss * step.loss_scale).backward()
            _scale_gradients(parameters, 1.0 / step.loss_scale)
        else:
            loss.backward()
        if fault == "grad":
            _scale_gradients(parameters, 2.0)
        if fault == "skip-step" and calls == 1:
            return loss.detach()
        if scaler is not None:
            scaler.step(optimizer)
            scaler.update()
        else:
            optimizer.step()
        return loss.detach()

    step = Step(train_step, optimizer, scaler=scaler)
    return step


def _scale_gradients(parameters: list[torch.Tensor], factor: float) -> None:
    with torch.no_grad():
        for parameter in parameters:
            if parameter.grad is not None:
                parameter.grad.mul_(factor)


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

    ONE_OFF_CALLS = CUDA_GRAPH_WARMUP_CALLS + 1  # side-stream warm-up calls and the capture

    def __init__(self, step: Callable[[Batch], Any], thread_local: bool = False) -> None:
        self._step = step
        # torch >= 2.1: only this thread's CUDA calls are checked during the capture.
        self._capture_options = {"capture_error_mode": "thread_local"} if thread_local else {}
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
        with torch.cuda.graph(self._graph, **self._capture_options):
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
    batch copied to the device inside the step, as a real input pipeline does; with prefetch,
    the next batch's copy starts on a side stream before the step that precedes it.
    """
    if knobs.loader_workers is None:
        resident = to_device(host_batch, device, knobs.channels_last)
        return lambda: resident
    next_host_batch = _host_batches(host_batch, knobs, total_steps)
    if knobs.prefetch:
        return SideStreamPrefetcher(next_host_batch, device, knobs.channels_last)
    return lambda: to_device(
        next_host_batch(), device, knobs.channels_last, non_blocking=knobs.pin_memory
    )


def _host_batches(host_batch: Batch, knobs: Knobs, total_steps: int) -> Callable[[], Batch]:
    """The loader's batches on the host, one per call: one epoch covers the whole cell."""
    batch_size = len(next(iter(host_batch.values())))
    workers = knobs.loader_workers or 0
    # DataLoader refuses prefetch_factor without workers (torch 1.13 even its default).
    ahead = {"prefetch_factor": knobs.prefetch_factor} if knobs.prefetch_factor else {}
    loader = torch.utils.data.DataLoader(
        RepeatedBatch(host_batch, batch_size * total_steps),
        batch_size=batch_size,
        num_workers=workers,
        pin_memory=knobs.pin_memory,
        drop_last=True,
        persistent_workers=knobs.persistent_workers,
        **ahead,
    )
    batches = iter(loader)

    def next_batch() -> Batch:
        nonlocal batches
        try:
            return next(batches)
        except StopIteration:
            batches = iter(loader)
            return next(batches)

    return next_batch


class SideStreamPrefetcher:
    """Batch k+1's host-to-device copy on a side CUDA stream while step k runs.

    Each call hands over the batch copied during the previous step (the current stream
    waits for its copy) and starts the next copy at once, before the caller launches the
    step's kernels, so the two overlap. The handed-over tensors are recorded on the current
    stream: the caching allocator must not reuse their memory for the side stream's next copy
    while the step still reads them.
    """

    def __init__(self, host_batches: Callable[[], Batch], device: torch.device, nhwc: bool):
        self._host_batches = host_batches
        self._device = device
        self._nhwc = nhwc
        self._stream = torch.cuda.Stream(device)
        self._next: Batch | None = None

    def __call__(self) -> Batch:
        batch = self._next if self._next is not None else self._copy_next()
        current = torch.cuda.current_stream(self._device)
        current.wait_stream(self._stream)
        for tensor in batch.values():
            tensor.record_stream(current)
        self._next = self._copy_next()
        return batch

    def _copy_next(self) -> Batch:
        host = self._host_batches()
        with torch.cuda.stream(self._stream):
            return to_device(host, self._device, self._nhwc, non_blocking=True)
