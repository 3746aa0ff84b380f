"""Statistics for benchmark trials: medians with intervals, speedups with intervals, a rank test.

Each benchmark cell is run as several independent trials, each giving one throughput. This
module turns those numbers into

* a :class:`Summary` of one cell (:func:`summarise`): the median with a distribution-free
  confidence interval, quartiles, mean, standard deviation and a ``noisy`` flag;
* a :class:`Ratio` between two cells (:func:`speedup`): the ratio of medians with a bootstrap
  percentile interval and a two-sided Mann–Whitney U p-value;
* a verdict on a published speedup (:func:`compare_to_claim`).

The approach follows asv's statistics (``asv_runner/statistics.py``, ``asv/_stats.py``):
medians rather than means, because benchmark noise is one-sided (interference only ever slows
a trial down) and a single disturbed trial must not move the estimate; order-statistic
intervals that assume nothing about the shape of the distribution; and a rank test for
"is there a difference at all". Results are frozen dataclasses rather than dicts.

The module is pure: standard library only, no I/O, importable under Python 3.10, and
deterministic (the bootstrap draws from ``random.Random(seed)``).
"""

import math
import random
import statistics
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from functools import lru_cache
from typing import Literal

__all__ = [
    "EXACT_MAX_SIZE",
    "NOISE_CV",
    "NOISE_RELATIVE_HALF_WIDTH",
    "Ratio",
    "Summary",
    "compare_to_claim",
    "mann_whitney_u",
    "median_ci",
    "quantile",
    "speedup",
    "summarise",
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

EXACT_MAX_SIZE = 20
"""Largest sample size (on each side) for which :func:`mann_whitney_u` uses the exact null
distribution; beyond it the normal approximation is accurate and the exact table grows large."""


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


RatioResampler = Callable[[Sequence[float], Sequence[float], int, int], Sequence[float]]


@dataclass(frozen=True)
class Ratio:
    """A speedup of a candidate over a baseline, with an interval and a test.

    Attributes:
        estimate: ``median(candidate) / median(baseline)``; above 1 means the candidate has
            the higher throughput.
        low: Lower end of the bootstrap percentile interval; NaN when not estimated.
        high: Upper end of the bootstrap percentile interval; NaN when not estimated.
        confidence: Nominal coverage of ``[low, high]``.
        method: How the interval was obtained, or why it was not.
        n_baseline: Number of baseline trials.
        n_candidate: Number of candidate trials.
        p_value: Two-sided Mann–Whitney U p-value for "both sides come from the same
            distribution"; NaN when not estimated.
        significant: ``p_value < alpha`` and the interval excludes 1.
        alpha: Significance level used for ``significant``.
    """

    estimate: float
    low: float
    high: float
    confidence: float
    method: str
    n_baseline: int
    n_candidate: int
    p_value: float
    significant: bool
    alpha: float


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
    _check_probability("confidence", confidence)
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
    values = _finite_sorted("samples", samples)
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


def mann_whitney_u(
    x: Iterable[float],
    y: Iterable[float],
    *,
    method: Literal["auto", "exact", "asymptotic"] = "auto",
) -> tuple[float, float]:
    """Two-sided Mann–Whitney U (Wilcoxon rank-sum) test.

    ``U_x`` counts the pairs (x_i, y_j) with x_i > y_j, ties counting one half; equivalently
    ``U_x = R_x - n_x (n_x + 1) / 2`` with R_x the sum of the mid-ranks of x in the pooled
    sample. Under the null hypothesis (both samples from one continuous distribution) every
    assignment of the pooled ranks to x is equally likely.

    * Exact (no ties, n_x and n_y at most :data:`EXACT_MAX_SIZE`): the number of assignments
      with ``U = u`` is the coefficient of q**u in the Gaussian binomial coefficient
      ``[n_x + n_y choose n_x]_q = prod_{i=1}^{n_x} (1 - q**(n_y + i)) / (1 - q**i)``, which
      is expanded with exact integers. The distribution is symmetric about ``n_x n_y / 2``, so
      ``p = min(1, 2 P(U >= max(U_x, U_y)))`` with ``U_y = n_x n_y - U_x``.
    * Asymptotic (otherwise): U is approximately normal with mean ``n_x n_y / 2`` and variance
      ``n_x n_y / 12 * ((N + 1) - sum(t**3 - t) / (N (N - 1)))``, N = n_x + n_y, t the sizes
      of the groups of tied values; with continuity correction
      ``z = (max(U_x, U_y) - n_x n_y / 2 - 1/2) / sd`` and ``p = min(1, 2 (1 - Phi(z)))``.
      If every value is tied the variance is 0 and p = 1.

    These are the conventions of ``scipy.stats.mannwhitneyu(x, y, alternative="two-sided",
    use_continuity=True)`` with ``method="exact"`` or ``"asymptotic"``.

    Args:
        x: First sample, at least one finite value.
        y: Second sample, at least one finite value.
        method: ``"auto"`` (exact when allowed, as above), ``"exact"`` or ``"asymptotic"``.

    Returns:
        ``(U_x, p_value)``.

    Raises:
        ValueError: if a sample is empty or not finite, the method is unknown, or ``"exact"``
            is requested for tied data (the exact table assumes distinct values).
    """
    xs, ys = _finite_sorted("x", x), _finite_sorted("y", y)
    if not xs or not ys:
        raise ValueError("the Mann–Whitney U test needs at least one value in each sample")
    ranks, tie_sizes = _midranks([*xs, *ys])
    n_x, n_y = len(xs), len(ys)
    u_x = math.fsum(ranks[:n_x]) - n_x * (n_x + 1) / 2
    u_larger = max(u_x, n_x * n_y - u_x)
    has_ties = any(size > 1 for size in tie_sizes)
    if method == "auto":
        small = n_x <= EXACT_MAX_SIZE and n_y <= EXACT_MAX_SIZE
        method = "exact" if small and not has_ties else "asymptotic"
    if method == "exact":
        if has_ties:
            raise ValueError("the exact Mann–Whitney U distribution assumes no tied values")
        return u_x, _exact_two_sided_p(n_x, n_y, round(u_larger))
    if method == "asymptotic":
        return u_x, _normal_two_sided_p(n_x, n_y, u_larger, tie_sizes)
    raise ValueError(f"unknown method {method!r}: use 'auto', 'exact' or 'asymptotic'")


def speedup(
    baseline: Iterable[float],
    candidate: Iterable[float],
    confidence: float = 0.95,
    resamples: int = 10_000,
    seed: int = 0,
    alpha: float = 0.05,
    resample_ratios: RatioResampler | None = None,
) -> Ratio:
    """Speedup of a candidate over a baseline: ratio of median throughputs, with an interval.

    The interval is a bootstrap percentile interval. Each of ``resamples`` rounds draws
    n_baseline trials from the baseline and n_candidate from the candidate, independently and
    with replacement (the two cells are independent experiments), and records
    ``median(candidate*) / median(baseline*)``; the interval is the ``(1 - confidence) / 2``
    and ``(1 + confidence) / 2`` quantiles (:func:`quantile`) of those ratios. The percentile
    interval is invariant under monotone maps, so swapping the sides maps it (up to Monte Carlo
    error) to its reciprocal. Its coverage is only approximate with few trials: the bootstrap
    distribution of a median of n values is discrete (for odd n it takes only the n sample
    values), so the ends jump between order statistics. Simulated on lognormal trials with 5
    and 15 per side it covered the true ratio about 97 % of the time at a nominal 95 %.

    The p-value is :func:`mann_whitney_u` on the raw trials. A speedup is ``significant``
    only when the test rejects at ``alpha`` *and* the interval excludes 1, so that the two
    never tell different stories.

    With fewer than 2 trials on either side there is nothing to resample: ``low``, ``high``
    and ``p_value`` are NaN, ``significant`` is False and ``method`` says why; ``estimate`` is
    still the ratio of medians.

    Args:
        baseline: Baseline trials, finite and positive (e.g. throughput in samples/s).
        candidate: Candidate trials, finite and positive.
        confidence: Nominal coverage of the interval, strictly between 0 and 1.
        resamples: Number of bootstrap rounds B, at least 1.
        seed: Seed of the ``random.Random`` that draws the resamples.
        alpha: Significance level, strictly between 0 and 1.
        resample_ratios: Draws the sorted bootstrap ratios given (sorted baseline, sorted
            candidate, resamples, seed); by default :func:`bootstrap_ratios`. A faster
            implementation must draw the same resamples (see ptspeed.aggregate).

    Returns:
        A :class:`Ratio`.

    Raises:
        ValueError: if a side is empty, a trial is not finite and positive, or a parameter is
            out of range.
    """
    _check_probability("confidence", confidence)
    _check_probability("alpha", alpha)
    if resamples < 1:
        raise ValueError(f"resamples must be at least 1, got {resamples}")
    base, cand = _positive_sorted("baseline", baseline), _positive_sorted("candidate", candidate)
    estimate = _median_of_sorted(cand) / _median_of_sorted(base)
    if len(base) < 2 or len(cand) < 2:
        return Ratio(
            estimate=estimate,
            low=math.nan,
            high=math.nan,
            confidence=confidence,
            method=(
                "not estimated: the bootstrap needs at least 2 trials per side "
                f"(baseline {len(base)}, candidate {len(cand)})"
            ),
            n_baseline=len(base),
            n_candidate=len(cand),
            p_value=math.nan,
            significant=False,
            alpha=alpha,
        )
    ratios = (resample_ratios or bootstrap_ratios)(base, cand, resamples, seed)
    tail = (1.0 - confidence) / 2.0
    low, high = quantile(ratios, tail), quantile(ratios, 1.0 - tail)
    _, p_value = mann_whitney_u(base, cand)
    return Ratio(
        estimate=estimate,
        low=low,
        high=high,
        confidence=confidence,
        method=f"bootstrap percentile, {resamples} resamples (seed {seed})",
        n_baseline=len(base),
        n_candidate=len(cand),
        p_value=p_value,
        significant=p_value < alpha and not low <= 1.0 <= high,
        alpha=alpha,
    )


def compare_to_claim(ratio: Ratio, claimed: float) -> str:
    """Verdict on a published speedup, given the measured one.

    Args:
        ratio: The measured speedup (candidate over baseline).
        claimed: The published speedup, on the same scale (e.g. 1.3 for "30 % faster").

    Returns:
        ``"consistent"`` if ``low <= claimed <= high``; ``"below"`` if ``high < claimed``
        (the measured speedup falls short of the claim); ``"above"`` if ``low > claimed``;
        ``"not measured"`` if the interval is NaN.

    Raises:
        ValueError: if ``claimed`` is NaN.
    """
    if math.isnan(claimed):
        raise ValueError("the claimed speedup is NaN")
    if math.isnan(ratio.low) or math.isnan(ratio.high):
        return "not measured"
    if ratio.high < claimed:
        return "below"
    if ratio.low > claimed:
        return "above"
    return "consistent"


def _check_probability(name: str, value: float) -> None:
    if not 0.0 < value < 1.0:
        raise ValueError(f"{name} must lie strictly between 0 and 1, got {value}")


def _finite_sorted(name: str, samples: Iterable[float]) -> list[float]:
    values = sorted(float(value) for value in samples)
    if not all(math.isfinite(value) for value in values):
        raise ValueError(f"{name} must be finite numbers, got {values}")
    return values


def _positive_sorted(name: str, samples: Iterable[float]) -> list[float]:
    values = _finite_sorted(name, samples)
    if not values:
        raise ValueError(f"{name} has no trials: a speedup needs at least one on each side")
    if values[0] <= 0:
        raise ValueError(f"{name} must be positive (throughputs), got {values}")
    return values


def _relative_half_width(low: float, high: float, median: float) -> float:
    return (high - low) / 2.0 / abs(median) if median != 0 else math.nan


def _median_rank_coverage(n: int, rank: int) -> float:
    """P(X_(rank) <= median <= X_(n + 1 - rank)) = P(rank <= Binomial(n, 1/2) <= n - rank)."""
    inside = sum(math.comb(n, i) for i in range(rank, n - rank + 1))
    return inside / 2**n


def _median_ci_method(n: int, confidence: float, achieved: float) -> str:
    method = "order-statistic (binomial) interval of the median"
    if achieved < confidence:
        method += f"; {n} trials cannot reach {confidence:g}, range covers {achieved:.4g}"
    return method


def _midranks(values: Sequence[float]) -> tuple[list[float], list[int]]:
    """1-based ranks of ``values`` in their own order, tied values sharing their mean rank;
    and the sizes of the groups of equal values."""
    order = sorted(range(len(values)), key=values.__getitem__)
    ranks = [0.0] * len(values)
    tie_sizes = []
    start = 0
    while start < len(order):
        stop = start + 1
        while stop < len(order) and values[order[stop]] == values[order[start]]:
            stop += 1
        for position in range(start, stop):
            ranks[order[position]] = (start + 1 + stop) / 2.0
        tie_sizes.append(stop - start)
        start = stop
    return ranks, tie_sizes


@lru_cache(maxsize=256)
def _u_counts(n_x: int, n_y: int) -> tuple[int, ...]:
    """Number of rank assignments giving U = 0, 1, ..., n_x n_y (no ties).

    Coefficients of ``prod_{i=1}^{n_x} (1 - q**(n_y + i)) / (1 - q**i)``, computed as power
    series truncated after q**(n_x n_y); exact because the product is a polynomial of that
    degree. Dividing by ``1 - q**i`` is a running sum with stride i.
    """
    degree = n_x * n_y
    counts = [1] + [0] * degree
    for i in range(1, n_x + 1):
        for power in range(degree, n_y + i - 1, -1):
            counts[power] -= counts[power - n_y - i]
        for power in range(i, degree + 1):
            counts[power] += counts[power - i]
    return tuple(counts)


def _exact_two_sided_p(n_x: int, n_y: int, u_larger: int) -> float:
    counts = _u_counts(min(n_x, n_y), max(n_x, n_y))
    upper_tail = sum(counts[u_larger:]) / math.comb(n_x + n_y, n_x)
    return min(1.0, 2.0 * upper_tail)


def _normal_two_sided_p(n_x: int, n_y: int, u_larger: float, tie_sizes: Sequence[int]) -> float:
    total = n_x + n_y
    tie_term = sum(size**3 - size for size in tie_sizes) / (total * (total - 1))
    variance = n_x * n_y / 12.0 * ((total + 1) - tie_term)
    if variance <= 0:
        return 1.0
    z = (u_larger - n_x * n_y / 2.0 - 0.5) / math.sqrt(variance)
    # 2 (1 - Phi(z)) = erfc(z / sqrt 2), accurate far into the tail.
    return min(1.0, math.erfc(z / math.sqrt(2.0)))


def bootstrap_ratios(
    base: Sequence[float], cand: Sequence[float], resamples: int, seed: int
) -> Sequence[float]:
    """Sorted ratios of medians of ``resamples`` rounds; each round draws the baseline's
    ``choices(k=n_base)`` then the candidate's ``choices(k=n_cand)`` from ``Random(seed)``."""
    rng = random.Random(seed)
    n_base, n_cand = len(base), len(cand)
    ratios = []
    for _ in range(resamples):
        base_resample = sorted(rng.choices(base, k=n_base))
        cand_resample = sorted(rng.choices(cand, k=n_cand))
        ratios.append(_median_of_sorted(cand_resample) / _median_of_sorted(base_resample))
    ratios.sort()
    return ratios


def _median_of_sorted(values: Sequence[float]) -> float:
    """Median of values in ascending order, as ``statistics.median``; no checks (hot loop)."""
    middle = len(values) // 2
    if len(values) % 2:
        return values[middle]
    return (values[middle - 1] + values[middle]) / 2.0
