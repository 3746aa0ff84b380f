"""The numerics gate: an optimised variant must compute what eager computes.

Train mode compares the loss of each leading step (same initial weights, same batch, same
optimizer); infer mode compares the first output tensor. Errors are relative:
|v - r| / |r| for losses, ||v - r|| / ||r|| for outputs.

The reference is an eager fp64 run where one can be made, as in PyTorch's own compile
benchmarks: the variant's error against fp64 is set beside eager fp32's own error against
fp64. The variant passes when its error is at most the largest of: the tolerance of its
precision; 5 x eager fp32's own error (ill-conditioned cases where fp32 itself drifts: batch
norm over a handful of values, chaotic early training); 3 x the difference between two eager
fp32 runs whose random ops (dropout) are seeded differently (a compiled graph draws its own
dropout masks, so it cannot match eager's exactly; a model without random ops adds nothing).
Tolerances: fp32 0.5 % (reassociation and the approximations compilers use for
transcendental functions), fp16 2 %, bf16 5 % (11 and 8 significant bits). A deliberately
wrong result (10 % off) fails all of them. Without an fp64 run the variant is compared with
eager fp32.
"""

from __future__ import annotations

import math
from typing import Any

from ptspeed.record import NumericsCheck

TOLERANCES = {"fp32": 5e-3, "fp16": 2e-2, "bf16": 5e-2}
FP32_ERROR_MULTIPLIER = 5.0
RESEEDED_ERROR_MULTIPLIER = 3.0
TINY = 1e-12


def not_checked(reason: str) -> NumericsCheck:
    return NumericsCheck(checked=False, reason=reason)


def relative_error(value: Any, reference: Any) -> float:
    """Relative error of a float or a tensor against its reference; inf when incomparable."""
    if isinstance(value, float) and isinstance(reference, float):
        if math.isnan(value) or math.isnan(reference):
            return math.inf
        return abs(value - reference) / max(abs(reference), TINY)
    if value is None or reference is None or tuple(value.shape) != tuple(reference.shape):
        return math.inf
    difference = float((value.double() - reference.double()).norm())
    scale = max(float(reference.double().norm()), TINY)
    return difference / scale if math.isfinite(difference) else math.inf


def _worst(values: list[Any], references: list[Any]) -> float:
    return max((relative_error(v, r) for v, r in zip(values, references, strict=True)), default=0.0)


def compare(
    values: list[Any],
    fp32_values: list[Any],
    fp64_values: list[Any] | None,
    precision: str,
    mode: str,
    reseeded_values: list[Any] | None = None,
) -> NumericsCheck:
    """Judge the variant's ``values`` against the eager references (see the module doc).

    ``reseeded_values``: eager fp32 with random ops (dropout) seeded differently; their
    distance from ``fp32_values`` is the part of any difference that random masks alone make.
    """
    tolerance = TOLERANCES[precision]
    reseeded_error = _worst(reseeded_values, fp32_values) if reseeded_values else 0.0
    if fp64_values:
        error = _worst(values, fp64_values)
        fp32_error = _worst(fp32_values, fp64_values)
    else:
        error, fp32_error = _worst(values, fp32_values), math.nan
    allowed = max(
        tolerance,
        FP32_ERROR_MULTIPLIER * fp32_error if fp64_values else 0.0,
        RESEEDED_ERROR_MULTIPLIER * reseeded_error,
    )
    return NumericsCheck(
        checked=True,
        compared="loss" if mode == "train" else "output",
        precision=precision,
        reference="fp64" if fp64_values else "fp32",
        tolerance=tolerance,
        eager_fp32_error=_finite(fp32_error),
        eager_reseeded_error=_finite(reseeded_error),
        allowed_error=_finite(allowed),
        max_relative_error=_finite(error),
        variant_values=[_summary(v) for v in values],
        reference_values=[_summary(r) for r in fp32_values],
        fp64_values=[_summary(r) for r in fp64_values or []],
        passed=error <= allowed,
    )


def mismatch_reason(check: NumericsCheck) -> str:
    error = check.max_relative_error
    found = f"{error:.3g}" if error is not None else "a non-finite amount"
    return (
        f"{check.compared} differs from eager {check.reference} by {found} "
        f"(allowed {check.allowed_error:.3g} for {check.precision})"
    )


def _finite(number: float) -> float | None:
    return number if math.isfinite(number) else None


def _summary(value: Any) -> float:
    """A JSON-safe number standing for a compared value (the loss, or an output's norm)."""
    if value is None:
        return 0.0
    number = value if isinstance(value, float) else float(value.double().norm())
    return number if math.isfinite(number) else 0.0
