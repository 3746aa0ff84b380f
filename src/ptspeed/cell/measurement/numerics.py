"""The numerics gate: an optimised variant must compute what eager computes.

The gate checks *check steps*: the first ``numerics_steps`` steps of the variant after its
one-off work (a CUDA graph's capture, cudagraph trees' recording), so that what is checked is
what is measured (a replayed graph, not the eager calls before its capture). Before each check
step the harness takes a snapshot of the model's state, the optimizer's momentum and the random
number generators; the eager references then run one step from that same snapshot. Nothing
drifts between a check step and its references, so the comparison can be tight even where
training itself is chaotic (batch norm over a handful of values, early training).

Compared, as relative errors (``||v - r|| / ||r||`` over all tensors together):

* train: the loss, the gradients (before the optimizer uses them) and the update (parameters
  after the step minus before), so a wrong backward pass, a wrong DDP/FSDP reduction, a skipped
  optimizer or GradScaler step are each caught on their own;
* infer: the output, as a fixed strided sample of its elements (bounded memory however large
  the logits).

The reference is an eager fp64 step where one can run; as in PyTorch's own compile benchmarks,
an eager step at the variant's precision (fp32 with TF32 off, TF32, or fp16/bf16 autocast)
measures how far that precision itself is from fp64. For each quantity the variant passes
when its error is at most the largest of: the tolerance of its precision; 5 x eager's own
error at that precision against fp64 (low-precision gradients); 3 x eager's *spread*: how far
an eager step moves when the snapshot's weights are perturbed by one fp32 rounding unit (an
ill-conditioned step, such as batch norm over a handful of values, amplifies any reordering
of sums, which is all a correct fp32 variant such as channels_last does) and, for variants
that draw their own random numbers (compiled graphs, CUDA graphs; on CUDA also TorchScript
and SDPA attention), its random ops seeded differently (their dropout masks cannot match
eager's). Tolerances: fp32 0.5 %
(reassociation, compilers' approximations of transcendental functions), TF32 1 % (10-bit
mantissa in matmuls and convolutions), fp16 2 %, bf16 5 % (11 and 8 significant bits).
Without an fp64 step the variant is compared with the eager step at its precision. A
non-finite value is an infinite error.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from ptspeed.cell.record import NumericsCheck

TOLERANCES = {"fp32": 5e-3, "tf32": 1e-2, "fp16": 2e-2, "bf16": 5e-2}
EAGER_ERROR_MULTIPLIER = 5.0
SPREAD_ERROR_MULTIPLIER = 3.0
TINY = 1e-12
TRAIN_QUANTITIES = ("loss", "gradients", "update")
INFER_QUANTITIES = ("output",)
OPTIONAL_QUANTITIES = ("gradients",)


@dataclass
class StepValues:
    """What one step produced, on the host: the loss (a float) or a sample of the output, and
    in train mode the gradients and the update by parameter name (None where unavailable,
    e.g. gradients sharded by FSDP)."""

    loss: float | None = None
    output: Any = None
    gradients: dict[str, Any] | None = None
    update: dict[str, Any] | None = None

    def quantity(self, name: str) -> Any:
        return getattr(self, name)


def not_checked(reason: str) -> NumericsCheck:
    return NumericsCheck(checked=False, reason=reason)


def relative_error(value: Any, reference: Any) -> float:
    """Relative error of a float, a tensor or a name → tensor mapping against its reference
    (mappings: the norm over all tensors together); inf when incomparable or non-finite."""
    if value is None or reference is None:
        return math.inf
    if isinstance(value, float) or isinstance(reference, float):
        return _scalar_error(value, reference)
    if isinstance(value, Mapping):
        return _mapping_error(value, reference)
    if tuple(value.shape) != tuple(reference.shape):
        return math.inf
    return _ratio(_difference_norm(value, reference), float(reference.double().norm()))


def _scalar_error(value: Any, reference: Any) -> float:
    if not isinstance(value, float) or not isinstance(reference, float):
        return math.inf
    return _ratio(abs(value - reference), abs(reference))


def _mapping_error(value: Mapping[str, Any], reference: Any) -> float:
    if not isinstance(reference, Mapping) or set(value) != set(reference):
        return math.inf
    difference_squared = reference_squared = 0.0
    for name, tensor in reference.items():
        if tuple(value[name].shape) != tuple(tensor.shape):
            return math.inf
        difference_squared += _difference_norm(value[name], tensor) ** 2
        reference_squared += float(tensor.double().norm()) ** 2
    return _ratio(math.sqrt(difference_squared), math.sqrt(reference_squared))


def _difference_norm(value: Any, reference: Any) -> float:
    """``||value - reference||`` in fp64. The subtraction promotes (fp64 where either is) and
    copies nothing first: converting both sides of a 100 M-parameter model cost seconds a step;
    two fp32 values close enough to matter subtract exactly (Sterbenz)."""
    return float((value - reference).double().norm())


def _ratio(difference: float, scale: float) -> float:
    if not (math.isfinite(difference) and math.isfinite(scale)):
        return math.inf
    return difference / max(scale, TINY)


def compared_quantities(mode: str, values: StepValues) -> tuple[str, ...]:
    """The quantities compared: all of the mode's, but gradients where a check step has none
    (FSDP shards them; its update, gathered whole, still shows a wrong reduction)."""
    names = TRAIN_QUANTITIES if mode == "train" else INFER_QUANTITIES
    return tuple(
        name
        for name in names
        if name not in OPTIONAL_QUANTITIES or values.quantity(name) is not None
    )


@dataclass
class StepErrors:
    """One check step's relative errors by quantity: the variant's against the reference
    (fp64, else eager at its precision), eager's against fp64 ({} without fp64), and eager's
    spread (an eager step from perturbed weights, reseeded for variants with their own random
    numbers, against eager)."""

    variant: dict[str, float]
    eager: dict[str, float]
    spread: dict[str, float]
    values: tuple[float | None, float | None, float | None]  # variant, eager, fp64 summaries


def step_errors(
    mode: str,
    variant: StepValues,
    eager: StepValues,
    fp64: StepValues | None,
    spread: StepValues | None = None,
) -> StepErrors:
    """Compare one check step's values with the eager steps from the same snapshot."""
    reference = fp64 or eager
    quantities = compared_quantities(mode, variant)
    return StepErrors(
        variant={q: relative_error(variant.quantity(q), reference.quantity(q)) for q in quantities},
        eager={q: relative_error(eager.quantity(q), fp64.quantity(q)) for q in quantities if fp64},
        spread={
            q: relative_error(spread.quantity(q), eager.quantity(q)) for q in quantities if spread
        },
        values=(_summary(variant, mode), _summary(eager, mode), fp64 and _summary(fp64, mode)),
    )


def judge(steps: list[StepErrors], precision: str, with_fp64: bool) -> NumericsCheck:
    """The verdict over all check steps: each quantity's worst error against its bound."""
    tolerance = TOLERANCES[precision]
    errors = _worst_by_quantity(step.variant for step in steps)
    eager_errors = _worst_by_quantity(step.eager for step in steps)
    spread_errors = _worst_by_quantity(step.spread for step in steps)
    allowed = {
        q: max(
            tolerance,
            EAGER_ERROR_MULTIPLIER * eager_errors.get(q, 0.0),
            SPREAD_ERROR_MULTIPLIER * spread_errors.get(q, 0.0),
        )
        for q in errors
    }
    worst = max(errors, key=lambda q: _excess(errors[q], allowed[q]))
    return NumericsCheck(
        checked=True,
        compared=", ".join(errors),
        precision=precision,
        reference="fp64" if with_fp64 else f"eager {precision}",
        tolerance=tolerance,
        check_steps=len(steps),
        worst_quantity=worst,
        errors=_finite_map(errors),
        allowed_errors=_finite_map(allowed),
        eager_error=_finite(eager_errors[worst]) if worst in eager_errors else None,
        eager_spread_error=_finite(spread_errors.get(worst, 0.0)),
        allowed_error=_finite(allowed[worst]),
        max_relative_error=_finite(errors[worst]),
        variant_values=[step.values[0] for step in steps],
        reference_values=[step.values[1] for step in steps],
        fp64_values=[step.values[2] for step in steps] if with_fp64 else [],
        passed=all(errors[q] <= allowed[q] for q in errors),
    )


def _worst_by_quantity(per_step: Any) -> dict[str, float]:
    worst: dict[str, float] = {}
    for errors in per_step:
        for quantity, error in errors.items():
            worst[quantity] = max(worst.get(quantity, 0.0), error)
    return worst


def _excess(error: float, allowed: float) -> float:
    return math.inf if not math.isfinite(error) else error / max(allowed, TINY)


def mismatch_reason(check: NumericsCheck) -> str:
    error = check.max_relative_error
    found = f"{error:.3g}" if error is not None else "a non-finite amount"
    return (
        f"{check.worst_quantity} differs from eager {check.reference} by {found} "
        f"(allowed {check.allowed_error:.3g} for {check.precision})"
    )


def _finite(number: float) -> float | None:
    return number if math.isfinite(number) else None


def _finite_map(numbers: Mapping[str, float]) -> dict[str, float | None]:
    return {name: _finite(number) for name, number in numbers.items()}


def _summary(values: StepValues, mode: str) -> float | None:
    """A JSON number standing for a step: its loss (train) or its output sample's norm (infer);
    null when non-finite, so a NaN loss is never shown as a number."""
    if mode == "train":
        number = values.loss
    else:
        number = None if values.output is None else float(values.output.double().norm())
    return number if number is not None and math.isfinite(number) else None
