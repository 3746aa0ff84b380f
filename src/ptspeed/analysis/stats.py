"""Statistics for benchmark trials: medians with intervals, speedups with intervals, a rank test.

Each benchmark cell is run as several independent trials, each giving one throughput. This
module turns those numbers into

* a :class:`Summary` of one cell (:func:`summarise`): the median with a distribution-free
  confidence interval, quartiles, mean, standard deviation and a ``noisy`` flag;
* a :class:`Ratio` between two cells (:func:`speedup`): the Hodges–Lehmann ratio (the median
  of all pairwise candidate / baseline ratios) with its exact distribution-free (Moses)
  interval, whose achieved confidence is stated, and a two-sided Mann–Whitney U p-value;
* a verdict on a published speedup (:func:`compare_to_claim`).

The approach follows asv's statistics (``asv_runner/statistics.py``, ``asv/_stats.py``):
medians rather than means, because benchmark noise is one-sided (interference only ever slows
a trial down) and a single disturbed trial must not move the estimate; order-statistic
intervals that assume nothing about the shape of the distribution; and a rank test for
"is there a difference at all". Results are frozen dataclasses rather than dicts.

Every interval states the confidence it has at its n: with few trials the order-statistic
intervals cannot reach the requested level, and then the widest one is returned with its exact
(lower) coverage instead of a nominal figure it does not have.

The module is pure and deterministic: no I/O, no resampling; the standard library and scipy
(the Mann–Whitney test). It runs only on the host side (aggregation, compare, report), never
inside a benchmark environment.
"""

import math
import statistics
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from functools import lru_cache

import scipy.stats

__all__ = [
    "NOISE_CV",
    "NOISE_RELATIVE_HALF_WIDTH",
    "Ratio",
    "Summary",
    "compare_to_claim",
    "confidence_note",
    "mann_whitney_p",
    "mann_whitney_u_counts",
    "median_ci",
    "quantile",
    "shift_interval_rank",
    "smallest_p_value",
    "speedup",
    "summarise",
    "trials_for_confidence",
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


@dataclass(frozen=True)
class Ratio:
    """A speedup of a candidate over a baseline, with an interval and a test.

    Attributes:
        estimate: The Hodges–Lehmann ratio ``exp(median_ij(log c_j - log b_i))``: the median
            of the pairwise candidate / baseline ratios; above 1 means the candidate has the
            higher throughput.
        low: Lower end of the exact (Moses) interval; NaN when not estimated.
        high: Upper end of the exact (Moses) interval; NaN when not estimated.
        confidence: Requested coverage of ``[low, high]``, e.g. 0.95.
        achieved_confidence: Exact coverage of ``[low, high]`` under the shift model; at least
            ``confidence`` unless too few trials allow it (then below it); NaN when not
            estimated.
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
    achieved_confidence: float
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


def speedup(
    baseline: Iterable[float],
    candidate: Iterable[float],
    confidence: float = 0.95,
    alpha: float = 0.05,
) -> Ratio:
    """Speedup of a candidate over a baseline: the Hodges–Lehmann ratio with its exact interval.

    Throughput noise is multiplicative, so the sides are compared on the log scale, where a
    speedup is a shift: ``log c = log b + delta``. With ``d_ij = log c_j - log b_i`` over all
    ``N = n_b n_c`` pairs sorted ascending as ``d_(1) <= ... <= d_(N)``:

    * the estimate is ``exp(median(d))``, the Hodges–Lehmann shift: the median of the
      pairwise ratios ``c_j / b_i`` (for even N the geometric mean of the middle two);
    * the interval is ``[exp d_(k), exp d_(N + 1 - k)]``, the Moses interval that inverts the
      Mann–Whitney test. Under the shift model (both sides' log throughputs from one
      continuous distribution, shifted by delta) the number of pairs with ``d_ij < delta`` is
      the Mann–Whitney statistic U under the null hypothesis, so ``P(d_(k) > delta) = P(U <=
      k - 1)`` and the coverage is exactly ``1 - 2 P(U <= k - 1)`` (U is symmetric). The
      largest k reaching ``confidence`` gives the narrowest such interval; where even k = 1
      (all pairs: ``[min ratio, max ratio]``) falls short, that interval is returned with its
      exact coverage ``1 - 2 / C(n_b + n_c, n_b)``: 0.90 with 3 trials a side; 4 a side
      reach 0.971. The null distribution of U is :func:`mann_whitney_u_counts`.

    The coverage is exact when the two sides' log throughputs differ by a shift (multiplicative
    noise of one shape on both sides), whatever that shape. Simulated with 10,000 lognormal
    pairs of samples (sigma 0.1, true ratio exp(0.3)), the share of intervals covering the
    true ratio was 0.9005 at 3 against 3 (stated 0.900), 0.972 at 4 against 4 (0.971), 0.971 at
    5 (0.968), 0.957 at 6 (0.959), 0.963 at 3 against 5 (0.964), and 0.969 at 5 with one-sided
    interference added to both sides (0.968). Where the sides' spreads differ a lot it covers
    less than stated: 0.954 at 5 against 5 and 0.861 at 3 against 3 with sigma 0.05 against
    0.15 (stated 0.968, 0.900).

    The p-value is ``scipy.stats.mannwhitneyu`` (two-sided), ``method="exact"`` when no value
    is tied and ``method="asymptotic"`` (normal, tie-corrected, continuity-corrected)
    otherwise; it cannot fall below :func:`smallest_p_value`. A speedup is ``significant``
    only when the test rejects at ``alpha`` *and* the interval excludes 1, so that the two
    never tell different stories.

    With fewer than 2 trials on either side there is no interval: ``low``, ``high``,
    ``achieved_confidence`` and ``p_value`` are NaN, ``significant`` is False and ``method``
    says why; ``estimate`` is still the Hodges–Lehmann ratio.

    Args:
        baseline: Baseline trials, finite and positive (e.g. throughput in samples/s).
        candidate: Candidate trials, finite and positive.
        confidence: Requested coverage of the interval, strictly between 0 and 1.
        alpha: Significance level, strictly between 0 and 1.

    Returns:
        A :class:`Ratio`.

    Raises:
        ValueError: if a side is empty, a trial is not finite and positive, or a parameter is
            out of range.
    """
    _check_probability("confidence", confidence)
    _check_probability("alpha", alpha)
    base, cand = _positive_sorted("baseline", baseline), _positive_sorted("candidate", candidate)
    # log is increasing, so the ratios sort as the shifts d_ij do; their ends are exact.
    ratios = sorted(c / b for b in base for c in cand)
    middle = len(ratios) // 2
    odd = len(ratios) % 2
    estimate = ratios[middle] if odd else math.sqrt(ratios[middle - 1] * ratios[middle])
    common = {"estimate": estimate, "confidence": confidence, "alpha": alpha}
    sizes = {"n_baseline": len(base), "n_candidate": len(cand)}
    if len(base) < 2 or len(cand) < 2:
        return Ratio(
            **common,
            **sizes,
            low=math.nan,
            high=math.nan,
            achieved_confidence=math.nan,
            method=(
                "not estimated: an interval needs at least 2 trials per side "
                f"(baseline {len(base)}, candidate {len(cand)})"
            ),
            p_value=math.nan,
            significant=False,
        )
    rank, achieved = shift_interval_rank(len(base), len(cand), confidence)
    low, high = ratios[rank - 1], ratios[len(ratios) - rank]
    p_value = mann_whitney_p(base, cand)
    return Ratio(
        **common,
        **sizes,
        low=low,
        high=high,
        achieved_confidence=achieved,
        method=_shift_interval_method(len(base), len(cand), confidence, achieved),
        p_value=p_value,
        significant=p_value < alpha and not low <= 1.0 <= high,
    )


def mann_whitney_p(x: Sequence[float], y: Sequence[float]) -> float:
    """Two-sided Mann–Whitney U p-value of ``scipy.stats.mannwhitneyu``: ``method="exact"``
    when no value is tied (scipy's exact null distribution assumes distinct values), else
    ``method="asymptotic"`` (normal approximation with tie and continuity corrections).

    Raises:
        ValueError: if either sample is empty.
    """
    if len(x) == 0 or len(y) == 0:
        raise ValueError("the Mann–Whitney U test needs at least one value in each sample")
    pooled = [*x, *y]
    method = "exact" if len(set(pooled)) == len(pooled) else "asymptotic"
    result = scipy.stats.mannwhitneyu(x, y, alternative="two-sided", method=method)
    return float(result.pvalue)


def shift_interval_rank(n_x: int, n_y: int, confidence: float) -> tuple[int, float]:
    """The rank k of the Moses interval ``[d_(k), d_(n_x n_y + 1 - k)]`` of a shift, and its
    exact coverage ``1 - 2 P(U <= k - 1)``, U the null Mann–Whitney statistic.

    k is the largest rank whose coverage reaches ``confidence``; when even k = 1 falls short,
    k = 1 and the coverage returned is that of the widest interval, ``1 - 2 / C(n_x + n_y,
    n_x)``, below ``confidence``.

    Raises:
        ValueError: if a size is below 1 or the confidence is not in (0, 1).
    """
    _check_probability("confidence", confidence)
    if n_x < 1 or n_y < 1:
        raise ValueError(f"sample sizes must be at least 1, got {n_x} and {n_y}")
    counts = mann_whitney_u_counts(n_x, n_y)
    total = math.comb(n_x + n_y, n_x)
    rank, below = 1, counts[0]  # below = #{U <= rank - 1}
    # Coverage falls as the rank rises; past the middle the interval would be empty.
    while 2 * (rank + 1) <= len(counts) and 1 - 2 * (below + counts[rank]) / total >= confidence:
        below += counts[rank]
        rank += 1
    return rank, 1 - 2 * below / total


def smallest_p_value(n_x: int, n_y: int) -> float:
    """The smallest two-sided exact Mann–Whitney p-value any data can give with these sample
    sizes (complete separation): ``2 / C(n_x + n_y, n_x)``. With 3 trials a side it is 0.1, so
    no difference can be significant at 0.05; 4 a side give 0.029."""
    return min(1.0, 2.0 / math.comb(n_x + n_y, n_x))


def trials_for_confidence(confidence: float) -> int:
    """The fewest trials per side (equal on both sides) whose widest shift interval (all
    pairs) reaches ``confidence``: the smallest n with ``1 - 2 / C(2n, n) >= confidence``;
    4 at 0.95."""
    _check_probability("confidence", confidence)
    n = 1
    while 1 - smallest_p_value(n, n) < confidence:
        n += 1
    return n


@lru_cache(maxsize=256)
def mann_whitney_u_counts(n_x: int, n_y: int) -> tuple[int, ...]:
    """How many of the ``C(n_x + n_y, n_x)`` equally likely rank assignments (no ties) give
    the Mann–Whitney statistic U = 0, 1, ..., n_x n_y.

    scipy keeps this distribution private (``scipy.stats._mannwhitneyu``), so it is counted
    here: the counts are the coefficients of the Gaussian binomial coefficient
    ``[n_x + n_y choose n_x]_q = prod_{i=1}^{n_x} (1 - q**(n_y + i)) / (1 - q**i)``, expanded
    as power series truncated after q**(n_x n_y), which is exact because the product is a
    polynomial of that degree; dividing by ``1 - q**i`` is a running sum with stride i.
    The tests check the tail sums against ``scipy.stats.mannwhitneyu(method="exact")``.
    """
    degree = n_x * n_y
    counts = [1] + [0] * degree
    for i in range(1, n_x + 1):
        for power in range(degree, n_y + i - 1, -1):
            counts[power] -= counts[power - n_y - i]
        for power in range(i, degree + 1):
            counts[power] += counts[power - i]
    return tuple(counts)


def compare_to_claim(ratio: Ratio, claimed: float) -> str:
    """Verdict on a published speedup, given the measured one.

    Args:
        ratio: The measured speedup (candidate over baseline).
        claimed: The published speedup, on the same scale (e.g. 1.3 for "30 % faster").

    The verdict is only as strong as the interval's ``achieved_confidence``: with 3 trials a
    side the interval covers 90 %, not 95 %, so "below" and "above" are 90 % statements there
    (a claim outside a narrower interval is found wrong more readily); state it beside the
    verdict (:func:`confidence_note`).

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


def confidence_note(requested: float, achieved: float) -> str:
    """``""`` when an interval reaches the requested confidence, else its achieved level, e.g.
    ``"90%"``; NaN (no interval) gives ``""``. Levels are floored to the percent shown, so
    that 0.9714 never reads as more than it is."""
    if math.isnan(achieved) or achieved >= requested:
        return ""
    return f"{math.floor(achieved * 100 + 1e-9):.0f}%"


def _shift_interval_method(n_x: int, n_y: int, confidence: float, achieved: float) -> str:
    method = "Hodges–Lehmann ratio, exact Mann–Whitney (Moses) interval of the log shift"
    if achieved < confidence:
        method += (
            f"; {n_x} and {n_y} trials cannot reach {confidence:g}, all pairs cover {achieved:.4g}"
        )
    return method


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


def _median_of_sorted(values: Sequence[float]) -> float:
    """Median of values in ascending order, as ``statistics.median``; no checks (hot loop)."""
    middle = len(values) // 2
    if len(values) % 2:
        return values[middle]
    return (values[middle - 1] + values[middle]) / 2.0
