"""Statistics of one benchmark cell's trials: the median with a distribution-free interval.

Each benchmark cell is run as several independent trials, each giving one throughput. This
module turns one cell's numbers into a :class:`Summary` (:func:`summarise`): the median with a
distribution-free confidence interval, quartiles, mean, standard deviation and a ``noisy``
flag. Two cells compared (the speedup of a candidate over a baseline, its interval and rank
test, a verdict on a published speedup) are :mod:`ptspeed.analysis.ranks`.

The approach follows asv's statistics (``asv_runner/statistics.py``, ``asv/_stats.py``):
medians rather than means, because benchmark noise is one-sided (interference only ever slows
a trial down) and a single disturbed trial must not move the estimate; order-statistic
intervals that assume nothing about the shape of the distribution. Results are frozen
dataclasses rather than dicts.

Every interval states the confidence it has at its n: with few trials the order-statistic
intervals cannot reach the requested level, and then the widest one is returned with its exact
(lower) coverage instead of a nominal figure it does not have (:func:`confidence_note` words
the shortfall).

The module is pure and deterministic: no I/O, no resampling; the standard library only. It runs
only on the host side (aggregation, compare, report), never inside a benchmark environment.
"""

import math
import statistics
from collections.abc import Iterable, Sequence
from dataclasses import dataclass

__all__ = [
    "NOISE_CV",
    "NOISE_RELATIVE_HALF_WIDTH",
    "Summary",
    "check_probability",
    "confidence_note",
    "finite_sorted",
    "median_ci",
    "quantile",
    "summarise",
    "trials_with_range_interval",
]

NOISE_CV = 0.05
"""A cell whose coefficient of variation (stdev / mean) exceeds this is flagged noisy.

On a quiet, dedicated machine with warmed-up, clock-stable runs, trial-to-trial variation of
throughput is typically 1–3 %. Above 5 % something is disturbing the measurement (other
tenants, thermal or power throttling, frequency boost, data loading, garbage collection), and
the optimisations this suite compares often claim gains of 5–20 %, which such noise swamps.
"""

NOISE_RELATIVE_HALF_WIDTH = 0.10
"""A cell whose median interval half-width, relative to the median, exceeds this is noisy.

The half-width is ``(high - low) / 2 / |median|``. The coefficient of variation misses a
cell whose trials cluster in two groups or which has one wild trial among few; the median
interval catches those, because with few trials it reaches out to the extreme order statistics
(for n <= 5 it is the whole range). At 10 % the interval can no longer separate the median
from one 10 % faster or slower, i.e. the cell cannot resolve the typical claimed speedup.
"""


@dataclass(frozen=True)
class Summary:
    """One benchmark cell's trials, summarised.

    Attributes:
        n: Number of trials.
        median: Sample median.
        low: Lower end of the confidence interval of the median (an order statistic).
        high: Upper end of the confidence interval of the median (an order statistic).
        confidence: Requested coverage of ``[low, high]``, e.g. 0.95.
        achieved_confidence: Exact coverage of ``[low, high]`` for a continuous distribution;
            at least ``confidence`` unless n is too small, in which case ``[low, high]`` is
            the sample range and this is its (lower) coverage, ``1 - 2 / 2**n``; 0 for n = 1.
        method: How the interval was obtained, in words.
        q25: First quartile (linear interpolation, see :func:`quantile`).
        q75: Third quartile.
        iqr: ``q75 - q25``.
        mean: Arithmetic mean.
        stdev: Sample standard deviation (n - 1 in the denominator); NaN for n = 1.
        cv: Coefficient of variation, ``stdev / |mean|``; NaN for n = 1 or a zero mean.
        noisy: ``cv > NOISE_CV`` or ``relative_half_width > NOISE_RELATIVE_HALF_WIDTH``.
            With n = 1 neither can be measured and this is False: check ``n`` and
            ``achieved_confidence`` before trusting a single trial.
    """

    n: int
    median: float
    low: float
    high: float
    confidence: float
    achieved_confidence: float
    method: str
    q25: float
    q75: float
    iqr: float
    mean: float
    stdev: float
    cv: float
    noisy: bool

    @property
    def relative_half_width(self) -> float:
        """``(high - low) / 2 / |median|``: NaN when the median is 0."""
        return _relative_half_width(self.low, self.high, self.median)


def quantile(values: Iterable[float], p: float) -> float:
    """Quantile by linear interpolation between order statistics.

    This is Hyndman & Fan's type 7, the default of R and numpy and
    ``statistics.quantiles(..., method="inclusive")``: with x the data sorted ascending and
    ``h = (n - 1) p`` (0-based), ``Q(p) = x[floor(h)] + (h - floor(h)) (x[floor(h) + 1] -
    x[floor(h)])``. It gives the minimum at p = 0, the maximum at p = 1 and the median at
    p = 0.5.

    Args:
        values: Data, at least one value, in any order.
        p: Probability in ``[0, 1]``.

    Returns:
        The interpolated quantile.

    Raises:
        ValueError: if the data are empty or p is outside ``[0, 1]``.
    """
    sorted_values = sorted(values)
    if not sorted_values:
        raise ValueError("quantile of no data")
    if not 0.0 <= p <= 1.0:
        raise ValueError(f"quantile probability must lie in [0, 1], got {p}")
    position = (len(sorted_values) - 1) * p
    below = math.floor(position)
    above = min(below + 1, len(sorted_values) - 1)
    fraction = position - below
    return sorted_values[below] + fraction * (sorted_values[above] - sorted_values[below])


def median_ci(values: Iterable[float], confidence: float = 0.95) -> tuple[float, float, float]:
    """Distribution-free confidence interval of the median from order statistics.

    For n independent draws from a continuous distribution with median m, the number B of
    draws below m is Binomial(n, 1/2). The j-th smallest draw is at most m exactly when
    B >= j, and the k-th is at least m exactly when B <= k - 1, so
    ``P(X_(j) <= m <= X_(k)) = P(j <= B <= k - 1)`` whatever the distribution. Taking
    ``k = n + 1 - j`` (the interval symmetric in rank), the coverage is
    ``sum_{i=j}^{n-j} C(n, i) / 2**n``; the largest j whose coverage is at least
    ``confidence`` gives the narrowest such interval. This is asv's ``quantile_ci`` for the
    median, computed with exact integer binomial sums.

    When even ``j = 1`` (the sample range) covers less than ``confidence`` (n <= 5 at 95 %),
    the range is returned with its actual coverage ``1 - 2 / 2**n``; for n = 1 that is 0.

    Args:
        values: Data, at least one value, in any order.
        confidence: Requested coverage, strictly between 0 and 1.

    Returns:
        ``(low, high, achieved_confidence)``.

    Raises:
        ValueError: if the data are empty or the confidence is not in (0, 1).
    """
    check_probability("confidence", confidence)
    sorted_values = sorted(values)
    n = len(sorted_values)
    if n == 0:
        raise ValueError("confidence interval of the median of no data")
    rank = 1
    # Coverage falls as the rank rises and is 0 once the ranks cross, so this stops in time.
    while _median_rank_coverage(n, rank + 1) >= confidence:
        rank += 1
    achieved = _median_rank_coverage(n, rank)
    return sorted_values[rank - 1], sorted_values[n - rank], achieved


def summarise(samples: Iterable[float], confidence: float = 0.95) -> Summary:
    """Summarise one cell's trials.

    Args:
        samples: One value per trial (e.g. throughput in samples/s), finite.
        confidence: Requested coverage of the median interval, strictly between 0 and 1.

    Returns:
        A :class:`Summary`. The median interval is :func:`median_ci`; quartiles are
        :func:`quantile` (type 7); stdev is the sample standard deviation; ``noisy`` applies
        :data:`NOISE_CV` and :data:`NOISE_RELATIVE_HALF_WIDTH`.

    Raises:
        ValueError: if there are no samples, a sample is not finite, or the confidence is
            not in (0, 1).
    """
    values = finite_sorted("samples", samples)
    if not values:
        raise ValueError("cannot summarise zero samples: every cell needs at least one trial")
    low, high, achieved = median_ci(values, confidence)
    median = _median_of_sorted(values)
    q25, q75 = quantile(values, 0.25), quantile(values, 0.75)
    mean = statistics.fmean(values)
    stdev = statistics.stdev(values) if len(values) >= 2 else math.nan
    cv = stdev / abs(mean) if mean != 0 else math.nan
    noisy = cv > NOISE_CV or _relative_half_width(low, high, median) > NOISE_RELATIVE_HALF_WIDTH
    return Summary(
        n=len(values),
        median=median,
        low=low,
        high=high,
        confidence=confidence,
        achieved_confidence=achieved,
        method=_median_ci_method(len(values), confidence, achieved),
        q25=q25,
        q75=q75,
        iqr=q75 - q25,
        mean=mean,
        stdev=stdev,
        cv=cv,
        noisy=noisy,
    )


def confidence_note(requested: float, achieved: float) -> str:
    """``""`` when an interval reaches the requested confidence, else its achieved level, e.g.
    ``"90%"``; NaN (no interval) gives ``""``. Levels are floored to the percent shown, so
    that 0.9714 never reads as more than it is."""
    if math.isnan(achieved) or achieved >= requested:
        return ""
    return f"{math.floor(achieved * 100 + 1e-9):.0f}%"


def check_probability(name: str, value: float) -> None:
    if not 0.0 < value < 1.0:
        raise ValueError(f"{name} must lie strictly between 0 and 1, got {value}")


def finite_sorted(name: str, samples: Iterable[float]) -> list[float]:
    values = sorted(float(value) for value in samples)
    if not all(math.isfinite(value) for value in values):
        raise ValueError(f"{name} must be finite numbers, got {values}")
    return values


def _relative_half_width(low: float, high: float, median: float) -> float:
    return (high - low) / 2.0 / abs(median) if median != 0 else math.nan


def trials_with_range_interval(confidence: float) -> int:
    """The most trials whose median interval is the sample range and still covers less than
    ``confidence`` (:func:`median_ci` then shows its coverage): 5 at 0.95."""
    check_probability("confidence", confidence)
    n = 1
    while _median_rank_coverage(n + 1, 1) < confidence:
        n += 1
    return n


def _median_rank_coverage(n: int, rank: int) -> float:
    """P(X_(rank) <= median <= X_(n + 1 - rank)) = P(rank <= Binomial(n, 1/2) <= n - rank)."""
    inside = sum(math.comb(n, i) for i in range(rank, n - rank + 1))
    return inside / 2**n


def _median_ci_method(n: int, confidence: float, achieved: float) -> str:
    method = "order-statistic (binomial) interval of the median"
    if achieved < confidence:
        method += f"; {n} trials cannot reach {confidence:g}, range covers {achieved:.4g}"
    return method


def _median_of_sorted(values: Sequence[float]) -> float:
    """Median of values in ascending order, as ``statistics.median``; no checks (hot loop)."""
    middle = len(values) // 2
    if len(values) % 2:
        return values[middle]
    return (values[middle - 1] + values[middle]) / 2.0
