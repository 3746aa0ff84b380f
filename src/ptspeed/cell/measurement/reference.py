"""The cell's side of the numerics gate: check steps captured, eager reference steps replayed.

Before each check step, :class:`CheckCapture` copies the model's state, the optimizer's
momentum, the GradScaler's scale and the random number generators to the host (a
:class:`Snapshot`); after it, the loss or a sample of the output, the gradients and the update.
:func:`check_numerics` then loads every snapshot into an eager fp64 model and an eager model at
the variant's precision (fp32 with TF32 off, TF32, or fp16/bf16 autocast) and runs one step
from it, so the comparison never carries the drift of earlier steps (see
:mod:`ptspeed.cell.measurement.numerics`). Reference models run after the variant's model is freed.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any

import torch

from ptspeed.cell.measurement import numerics
from ptspeed.cell.memory import release_memory
from ptspeed.cell.microbatch import micro_batched
from ptspeed.cell.record import CellSpec, NumericsCheck
from ptspeed.cell.steps import Step, build_model, make_step, to_device
from ptspeed.cell.variants.knobs import STAGED, Knobs
from ptspeed.models import Batch, ModelSpec, Sizes

# An output is compared on this many elements, evenly strided over it: bounded memory on the
# host however large the logits (GPT-2 at 64 x 128 has 412 M of them).
OUTPUT_SAMPLE_ELEMENTS = 1 << 16
FP32_ROUNDING_UNIT = 2.0**-24


@dataclass
class Snapshot:
    """The state a check step starts from, on the host. ``momentum`` is in parameter order;
    ``restorable`` is false where an eager model cannot take it (FSDP's flat momentum)."""

    state: dict[str, torch.Tensor]
    momentum: list[torch.Tensor | None]
    rng: tuple[torch.Tensor, torch.Tensor | None]
    scale: float | None = None
    restorable: bool = True


@dataclass
class CheckCapture:
    """Copies what a check step starts from and what it produces (train and infer)."""

    model: Any
    step: Step
    placement: Any
    mode: str
    device: torch.device
    parameter_names: list[str] = field(default_factory=list)
    # False where the gate is left to the cell's first trial: the check steps still run (and
    # GradScaler's skips still lengthen them) as there, but nothing is copied to the host.
    copies: bool = True

    def before(self) -> Snapshot:
        if not self.copies:
            rng, scale = _rng_state(self.device), loss_scale(self.step)
            return Snapshot({}, [], rng, scale, restorable=False)
        state = self.placement.full_state(self.model)
        momentum = self.placement.momentum(self.step.optimizer)
        restorable = not any(m is not None for m in momentum) or len(momentum) == len(
            self.parameter_names
        )
        return Snapshot(state, momentum, _rng_state(self.device), loss_scale(self.step), restorable)

    def after(self, snapshot: Snapshot, output: Any) -> numerics.StepValues | None:
        """The step's values; None when GradScaler skipped the step (an fp16 overflow, which
        eager, without a scaler, never has)."""
        if snapshot.scale is not None and loss_scale(self.step) < snapshot.scale:
            return None
        if not self.copies:
            return numerics.StepValues()
        if self.mode == "infer":
            return numerics.StepValues(output=self.placement.reported_output(output_sample(output)))
        after = self.placement.full_state(self.model)
        gradients = self.placement.gradients(self.model)
        return numerics.StepValues(
            loss=float(output.double().item()),
            gradients=gradients,
            update=_update(snapshot.state, after, self.parameter_names),
        )


def output_sample(output: Any) -> torch.Tensor | None:
    """A fixed, evenly strided sample of an output's elements, in fp64 on the host."""
    if not isinstance(output, torch.Tensor):
        return None
    flat = output.detach().reshape(-1)
    if flat.numel() > OUTPUT_SAMPLE_ELEMENTS:
        # Integer positions: an fp32 linspace rounds its last one up to numel() past 2**24
        # elements (a device-side assert on CUDA).
        steps = torch.arange(OUTPUT_SAMPLE_ELEMENTS, device=flat.device, dtype=torch.int64)
        last = OUTPUT_SAMPLE_ELEMENTS - 1
        flat = flat[torch.div(steps * (flat.numel() - 1), last, rounding_mode="floor")]
    return flat.double().cpu()


def host_copy(tensors: Iterator[tuple[str, torch.Tensor]]) -> dict[str, torch.Tensor]:
    return {name: tensor.detach().to("cpu", copy=True) for name, tensor in tensors}


def momentum_buffers(optimizer: torch.optim.Optimizer | None) -> list[torch.Tensor | None]:
    if optimizer is None:
        return []
    parameters = optimizer.param_groups[0]["params"]
    buffers = (optimizer.state.get(p, {}).get("momentum_buffer") for p in parameters)
    return [None if b is None else b.detach().to("cpu", copy=True) for b in buffers]


def _rng_state(device: torch.device) -> tuple[torch.Tensor, torch.Tensor | None]:
    cuda = torch.cuda.get_rng_state(device) if device.type == "cuda" else None
    return torch.get_rng_state(), cuda


def loss_scale(step: Step) -> float | None:
    """GradScaler's loss scale (a read of the device); None without a scaler."""
    return float(step.scaler.get_scale()) if step.scaler is not None else None


def _update(
    before: dict[str, torch.Tensor], after: dict[str, torch.Tensor], names: list[str]
) -> dict[str, torch.Tensor] | None:
    """Parameters after the step minus before, rounded once to fp32 (the subtraction promotes
    to fp64 where either side is; no copy of either side first)."""
    if not after:
        return None
    return {name: (after[name] - before[name]).float() for name in names}


@dataclass
class ReferenceModel:
    """An eager model in ``dtype`` that runs one step from any snapshot."""

    model: Any
    step: Step
    batch: Batch
    mode: str
    device: torch.device

    tf32: bool = False  # whether TF32 stays as the cell set it (a TF32 variant's precision)

    @classmethod
    def build(
        cls,
        spec: CellSpec,
        model_spec: ModelSpec,
        host_batch: Batch,
        device: torch.device,
        dtype: torch.dtype,
        precision: str = "fp32",
        attn: str | None = None,
    ) -> ReferenceModel:
        """Eager in ``dtype``; with a ``precision`` of fp16/bf16, eager autocast (fp16 with the
        loss scale of each snapshot), with tf32, eager with the cell's TF32 settings; ``attn``:
        the attention implementation (see Knobs.reference_attention)."""
        sizes = Sizes(spec.batch_size, spec.image_size, spec.seq_len)
        model = build_model(model_spec, sizes, spec.seed, device, attn).to(dtype)
        autocast = Knobs(amp=precision if precision in ("fp16", "bf16") else None)
        step = make_step(model_spec, model, autocast, spec.mode, device, static_loss_scale=True)
        batch = {
            name: tensor.to(dtype) if tensor.is_floating_point() else tensor
            for name, tensor in to_device(host_batch, device, channels_last=False).items()
        }
        return cls(model, step, batch, spec.mode, device, tf32=precision == "tf32")

    def step_from(
        self, snapshot: Snapshot, seed: int | None = None, perturb: bool = False
    ) -> numerics.StepValues:
        """One eager step from ``snapshot``; random ops from its generators, or from ``seed``;
        with ``perturb``, every weight moved by about one fp32 rounding unit."""
        self.model.load_state_dict(snapshot.state)
        if perturb:
            _perturb(self.model, snapshot.rng[0])
        if self.step.optimizer is not None:
            _restore_momentum(self.step.optimizer, snapshot.momentum)
        self.step.loss_scale = snapshot.scale or 1.0
        if seed is None:
            _restore_rng(snapshot.rng, self.device)
        else:
            torch.manual_seed(seed)
        with contextlib.nullcontext() if self.tf32 else strict_fp32():
            output = self.step(self.batch)
        if self.mode == "infer":
            return numerics.StepValues(output=output_sample(output))
        names = [name for name, _ in self.model.named_parameters()]
        return numerics.StepValues(
            loss=float(output.double().item()),
            gradients={
                n: p.grad.detach().float().cpu()
                for n, p in self.model.named_parameters()
                if p.grad is not None
            },
            update=_update(snapshot.state, host_copy(self.model.named_parameters()), names),
        )


def _perturb(model: Any, seed_state: torch.Tensor) -> None:
    """Move each parameter by a random fraction of an fp32 rounding unit, ``|p| * 2**-24 * N``:
    what a reordered sum does to a value, at the scale of the weights."""
    generator = torch.Generator().manual_seed(int(seed_state.sum()))
    with torch.no_grad():
        for parameter in model.parameters():
            # fp32: drawing a 100 M-parameter model's noise in fp64 took seconds a step.
            noise = torch.randn(parameter.shape, generator=generator, dtype=torch.float32)
            relative = (noise * FP32_ROUNDING_UNIT).to(parameter.device, parameter.dtype)
            parameter.add_(parameter * relative)


def _restore_momentum(optimizer: torch.optim.Optimizer, momentum: list[Any]) -> None:
    optimizer.state.clear()
    for parameter, buffer in zip(optimizer.param_groups[0]["params"], momentum, strict=False):
        if buffer is not None:
            optimizer.state[parameter]["momentum_buffer"] = buffer.to(
                parameter.device, parameter.dtype, copy=True
            )


def _restore_rng(rng: tuple[torch.Tensor, torch.Tensor | None], device: torch.device) -> None:
    torch.set_rng_state(rng[0])
    if rng[1] is not None:
        torch.cuda.set_rng_state(rng[1], device)


@contextlib.contextmanager
def strict_fp32() -> Iterator[None]:
    """No TF32 in the reference: its fp32 must be IEEE fp32, whatever the cell switched on."""
    saved = torch.backends.cuda.matmul.allow_tf32, torch.backends.cudnn.allow_tf32
    torch.backends.cuda.matmul.allow_tf32 = torch.backends.cudnn.allow_tf32 = False
    try:
        yield
    finally:
        torch.backends.cuda.matmul.allow_tf32, torch.backends.cudnn.allow_tf32 = saved


def check_numerics(
    spec: CellSpec,
    model_spec: ModelSpec,
    knobs: Knobs,
    host_batch: Batch,
    checks: list[tuple[Snapshot, numerics.StepValues]],
    device: torch.device,
    precision: str,
) -> NumericsCheck:
    """Run the eager references from every check step's snapshot and judge the variant:
    against fp64, within what eager at the variant's precision is off fp64 itself."""
    restorable = [(s, v) for s, v in checks if s.restorable]
    if not restorable:
        return numerics.not_checked("no check step could be restored in an eager model")
    snapshots = [snapshot for snapshot, _ in restorable]
    if knobs.parallel in STAGED:  # eager over the same micro-batches, seeded as the stages
        model_spec = micro_batched(model_spec, knobs.chunks)
    attn = knobs.reference_attention
    fp64, fp64_missing = _fp64_steps(spec, model_spec, host_batch, device, snapshots, attn)
    own_random = knobs.draws_own_random(device.type)
    eager = ReferenceModel.build(
        spec, model_spec, host_batch, device, torch.float32, precision, attn
    )
    try:
        steps = [
            numerics.step_errors(
                spec.mode,
                values,
                eager.step_from(snapshot),
                fp64[index] if fp64 else None,
                eager.step_from(snapshot, spec.seed + 1 + index if own_random else None, True),
            )
            for index, (snapshot, values) in enumerate(restorable)
        ]
    finally:
        del eager
        release_memory(device)
    check = numerics.judge(steps, precision, with_fp64=bool(fp64))
    skipped = len(checks) - len(restorable)
    not_restorable = f"{skipped} check step(s) not restorable (FSDP momentum)" if skipped else ""
    notes = [fp64_missing, not_restorable]
    check.reason = "; ".join(note for note in notes if note)
    return check


def _fp64_steps(
    spec: CellSpec,
    model_spec: ModelSpec,
    host_batch: Batch,
    device: torch.device,
    snapshots: list[Snapshot],
    attn: str | None,
) -> tuple[list[numerics.StepValues], str]:
    """The fp64 step from each snapshot, or none and why (out of memory, no fp64 kernels):
    the check then falls back to eager fp32."""
    reference = None
    try:
        reference = ReferenceModel.build(
            spec, model_spec, host_batch, device, torch.float64, attn=attn
        )
        return [reference.step_from(snapshot) for snapshot in snapshots], ""
    except Exception as exc:
        return [], f"no fp64 reference ({type(exc).__name__}: {' '.join(str(exc).split())[:200]})"
    finally:
        del reference
        release_memory(device)
