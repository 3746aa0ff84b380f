"""Tests for ptspeed.stats: known answers, coverage on simulated trials, and properties."""

import dataclasses
import itertools
import math
import random
import statistics

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from ptspeed import stats
from ptspeed.stats import (
    Ratio,
    compare_to_claim,
    mann_whitney_u,
    median_ci,
    quantile,
    speedup,
    summarise,
)

FAST = settings(max_examples=40, deadline=None, derandomize=True)

throughputs = st.floats(min_value=1.0, max_value=1e4, allow_nan=False, allow_infinity=False)
trials = st.lists(throughputs, min_size=1, max_size=25)
two_or_more_trials = st.lists(throughputs, min_size=2, max_size=12)


def close(a: float, b: float) -> bool:
    return math.isclose(a, b, rel_tol=1e-9, abs_tol=1e-9)


# --- known answers: summaries ------------------------------------------------------------------


@FAST
@given(trials)
def test_median_quartiles_mean_stdev_match_statistics_module(samples: list[float]) -> None:
    summary = summarise(samples)
    assert summary.n == len(samples)
    assert close(summary.median, statistics.median(samples))
    assert close(summary.mean, statistics.fmean(samples))
    if len(samples) >= 2:
        q25, _, q75 = statistics.quantiles(samples, n=4, method="inclusive")
        assert close(summary.q25, q25)
        assert close(summary.q75, q75)
        assert close(summary.iqr, q75 - q25)
        assert close(summary.stdev, statistics.stdev(samples))


@pytest.mark.parametrize(
    ("p", "expected"),
    [(0.0, 1.0), (0.25, 1.75), (0.5, 2.5), (0.75, 3.25), (1.0, 4.0), (1 / 3, 2.0)],
)
def test_quantile_interpolates_linearly(p: float, expected: float) -> None:
    assert quantile([1.0, 2.0, 3.0, 4.0], p) == pytest.approx(expected)


def test_order_of_input_does_not_matter() -> None:
    shuffled = [7.0, 1.0, 9.0, 3.0, 5.0, 2.0, 8.0, 4.0, 6.0]
    assert quantile(shuffled, 0.25) == 3.0
    assert median_ci(shuffled) == median_ci(sorted(shuffled)) == (2.0, 8.0, 492 / 512)
    assert summarise(shuffled) == summarise(sorted(shuffled))


# Published table of the distribution-free 95 % interval of the median (ranks j, n + 1 - j).
MEDIAN_CI_95_RANKS = {
    6: 1, 7: 1, 8: 1, 9: 2, 10: 2, 11: 2, 12: 3, 13: 3, 14: 3, 15: 4, 16: 4, 17: 5, 18: 5,
    19: 5, 20: 6,
}  # fmt: skip


@pytest.mark.parametrize(("n", "rank"), MEDIAN_CI_95_RANKS.items())
def test_median_ci_ranks_match_table(n: int, rank: int) -> None:
    low, high, achieved = median_ci([float(i) for i in range(1, n + 1)], 0.95)
    assert (low, high) == (rank, n + 1 - rank)
    coverage = sum(math.comb(n, i) for i in range(rank, n + 1 - rank)) / 2**n
    assert achieved == pytest.approx(coverage)
    assert achieved >= 0.95


def test_median_ci_for_twenty_trials_covers_95_86_percent() -> None:
    _, _, achieved = median_ci(list(range(20)), 0.95)
    assert achieved == pytest.approx(0.9586, abs=5e-5)


@pytest.mark.parametrize("n", [2, 3, 4, 5])
def test_too_few_trials_give_the_range_and_its_actual_coverage(n: int) -> None:
    summary = summarise([10.0 + i for i in range(n)])
    assert (summary.low, summary.high) == (10.0, 10.0 + n - 1)
    assert summary.achieved_confidence == pytest.approx(1 - 2 / 2**n)
    assert summary.achieved_confidence < summary.confidence
    assert "cannot reach" in summary.method


def test_single_trial_has_a_degenerate_interval() -> None:
    summary = summarise([123.0])
    assert summary.median == summary.low == summary.high == 123.0
    assert summary.achieved_confidence == 0.0
    assert math.isnan(summary.stdev)
    assert math.isnan(summary.cv)
    assert not summary.noisy


def test_summary_is_frozen() -> None:
    summary = summarise([1.0, 2.0])
    with pytest.raises(dataclasses.FrozenInstanceError):
        summary.median = 3.0  # type: ignore[misc]


# --- known answers: Mann–Whitney U -------------------------------------------------------------

# The example in scipy.stats.mannwhitneyu's documentation (Conover's males and females).
MALES = [19.0, 22.0, 16.0, 29.0, 24.0]
FEMALES = [20.0, 11.0, 17.0, 12.0]


def test_mann_whitney_matches_scipy_documentation_example() -> None:
    assert mann_whitney_u(MALES, FEMALES) == (17.0, pytest.approx(1 / 9, rel=1e-12))
    u, p = mann_whitney_u(MALES, FEMALES, method="asymptotic")
    assert u == 17.0
    assert p == pytest.approx(0.11134688653314041, rel=1e-12)


def test_fully_separated_five_against_five() -> None:
    fast, slow = [6.0, 7.0, 8.0, 9.0, 10.0], [1.0, 2.0, 3.0, 4.0, 5.0]
    assert mann_whitney_u(fast, slow) == (25.0, pytest.approx(2 / 252))
    assert mann_whitney_u(slow, fast) == (0.0, pytest.approx(2 / 252))


def test_u_counts_pairs_with_ties_as_halves() -> None:
    x, y = [1.0, 2.0, 2.0, 5.0], [2.0, 3.0, 0.5]
    pairs = sum(1.0 if a > b else 0.5 if a == b else 0.0 for a in x for b in y)
    assert mann_whitney_u(x, y)[0] == pairs


def test_asymptotic_with_ties_by_hand() -> None:
    # Pooled ranks: 1, 2, 3.5, 3.5 (x: 1, 3.5) -> R_x = 4.5, U_x = 1.5, U_y = 2.5.
    # Variance = 4/12 * (5 - (2**3 - 2) / 12) = 1.5; z = (2.5 - 2 - 0.5) / sqrt(1.5) = 0.
    u, p = mann_whitney_u([1.0, 3.0], [2.0, 3.0])
    assert u == 1.5
    assert p == 1.0
    # Pooled ranks: 1, 2, 3, 5, 5, 5 (x: 1, 2, 3) -> U_x = 0, U_y = 9; t = 3 tie term 24 / 30.
    u, p = mann_whitney_u([1.0, 2.0, 3.0], [4.0, 4.0, 4.0])
    sd = math.sqrt(9 / 12 * (7 - 24 / 30))
    assert u == 0.0
    assert p == pytest.approx(math.erfc((9 - 4.5 - 0.5) / sd / math.sqrt(2)))


def brute_force_exact_p(x: list[float], y: list[float]) -> float:
    """Two-sided exact p-value by enumerating every split of the pooled sample."""
    pooled = x + y
    observed = mann_whitney_u(x, y, method="exact")[0]
    extreme = max(observed, len(x) * len(y) - observed)
    at_least = total = 0
    for chosen in itertools.combinations(range(len(pooled)), len(x)):
        rest = [pooled[i] for i in range(len(pooled)) if i not in chosen]
        u = sum(pooled[i] > b for i in chosen for b in rest)
        at_least += max(u, len(x) * len(y) - u) >= extreme
        total += 1
    return min(1.0, at_least / total)


@pytest.mark.parametrize(("n_x", "n_y"), [(1, 1), (1, 6), (3, 4), (5, 5), (2, 9), (6, 6)])
def test_exact_p_matches_enumeration(n_x: int, n_y: int) -> None:
    rng = random.Random(n_x * 100 + n_y)
    for _ in range(3):
        values = rng.sample(range(1000), n_x + n_y)
        x, y = [float(v) for v in values[:n_x]], [float(v) for v in values[n_x:]]
        assert mann_whitney_u(x, y)[1] == pytest.approx(brute_force_exact_p(x, y), rel=1e-12)


def test_exact_and_asymptotic_agree_at_twenty_per_side() -> None:
    rng = random.Random(7)
    x = [rng.gauss(0.0, 1.0) for _ in range(20)]
    y = [rng.gauss(0.5, 1.0) for _ in range(20)]
    exact = mann_whitney_u(x, y, method="exact")[1]
    assert mann_whitney_u(x, y)[1] == exact
    assert mann_whitney_u(x, y, method="asymptotic")[1] == pytest.approx(exact, abs=0.01)


def test_larger_samples_use_the_normal_approximation() -> None:
    x = [float(i) for i in range(21)]
    y = [i + 0.5 for i in range(21)]
    assert mann_whitney_u(x, y) == mann_whitney_u(x, y, method="asymptotic")


@pytest.mark.parametrize("method", ["exact", "asymptotic"])
def test_mann_whitney_matches_scipy(method: str) -> None:
    scipy_stats = pytest.importorskip("scipy.stats")
    rng = random.Random(11)
    for n_x, n_y in [(3, 5), (8, 8), (12, 20), (20, 17)]:
        x = [rng.lognormvariate(0.0, 0.3) for _ in range(n_x)]
        y = [rng.lognormvariate(0.2, 0.3) for _ in range(n_y)]
        if method == "asymptotic":  # also exercise the tie correction
            x, y = [round(v, 1) for v in x], [round(v, 1) for v in y]
        expected = scipy_stats.mannwhitneyu(
            x, y, use_continuity=True, alternative="two-sided", method=method
        )
        u, p = mann_whitney_u(x, y, method=method)  # type: ignore[arg-type]
        assert u == pytest.approx(expected.statistic)
        assert p == pytest.approx(expected.pvalue, rel=1e-9)


def test_exact_refuses_ties() -> None:
    with pytest.raises(ValueError, match="tied"):
        mann_whitney_u([1.0, 2.0], [2.0, 3.0], method="exact")


def test_unknown_method_is_refused() -> None:
    with pytest.raises(ValueError, match="unknown method"):
        mann_whitney_u([1.0], [2.0], method="permutation")  # type: ignore[arg-type]


# --- coverage on simulated trials --------------------------------------------------------------


def test_median_interval_covers_the_true_median_at_its_nominal_rate() -> None:
    # Lognormal(0, 0.5) has median 1. With n = 9 the interval is (X_(2), X_(8)), whose exact
    # coverage is 492 / 512 = 0.961 for any continuous distribution.
    rng = random.Random(20240601)
    simulations = 400
    covered = 0
    for _ in range(simulations):
        summary = summarise([rng.lognormvariate(0.0, 0.5) for _ in range(9)])
        covered += summary.low <= 1.0 <= summary.high
    assert covered / simulations >= 0.93


@pytest.mark.parametrize(("n", "simulations", "floor"), [(5, 200, 0.80), (15, 150, 0.88)])
def test_bootstrap_interval_covers_the_true_ratio(n: int, simulations: int, floor: float) -> None:
    # Percentile bootstrap intervals carry no coverage guarantee at small n: the bootstrap
    # distribution of a median of n trials is discrete and, with few trials, can be too narrow or
    # too wide (textbook results put it below nominal for smooth statistics; for medians of 5-15
    # lognormal trials it came out near 0.97 in 7000 simulations). The floors only catch a
    # broken interval, not a slightly miscalibrated one.
    rng = random.Random(n)
    true_ratio = math.exp(0.3)
    covered = 0
    for i in range(simulations):
        baseline = [rng.lognormvariate(0.0, 0.2) for _ in range(n)]
        candidate = [rng.lognormvariate(0.3, 0.2) for _ in range(n)]
        ratio = speedup(baseline, candidate, resamples=1000, seed=i)
        covered += ratio.low <= true_ratio <= ratio.high
    assert covered / simulations >= floor


# --- properties --------------------------------------------------------------------------------


@FAST
@given(trials)
def test_interval_brackets_the_median(samples: list[float]) -> None:
    summary = summarise(samples)
    assert summary.low <= summary.median <= summary.high
    assert summary.q25 <= summary.median <= summary.q75
    assert 0.0 <= summary.achieved_confidence < 1.0


@FAST
@given(two_or_more_trials, two_or_more_trials, st.integers(0, 2**32))
def test_ratio_interval_brackets_the_estimate(
    baseline: list[float], candidate: list[float], seed: int
) -> None:
    ratio = speedup(baseline, candidate, resamples=200, seed=seed)
    slack = 1e-12 * ratio.estimate  # interpolation may round one ulp past an order statistic
    assert ratio.low - slack <= ratio.estimate <= ratio.high + slack
    assert 0.0 <= ratio.p_value <= 1.0


@FAST
@given(trials, trials)
def test_swapping_sides_inverts_the_estimate(baseline: list[float], candidate: list[float]) -> None:
    forward = speedup(baseline, candidate, resamples=50)
    backward = speedup(candidate, baseline, resamples=50)
    assert forward.estimate * backward.estimate == pytest.approx(1.0, rel=1e-12)


@FAST
@given(trials, st.floats(min_value=1e-3, max_value=1e3))
def test_scaling_leaves_relative_spread_unchanged(samples: list[float], scale: float) -> None:
    original = summarise(samples)
    scaled = summarise([scale * value for value in samples])
    assert close(scaled.median, scale * original.median)
    if original.n >= 2:
        assert close(scaled.cv, original.cv)
    assert close(scaled.relative_half_width, original.relative_half_width)


@FAST
@given(two_or_more_trials, two_or_more_trials, st.floats(min_value=1e-3, max_value=1e3))
def test_scaling_both_sides_leaves_the_ratio_unchanged(
    baseline: list[float], candidate: list[float], scale: float
) -> None:
    original = speedup(baseline, candidate, resamples=100)
    scaled = speedup([scale * b for b in baseline], [scale * c for c in candidate], resamples=100)
    assert close(scaled.estimate, original.estimate)
    assert close(scaled.low, original.low)
    assert close(scaled.high, original.high)


@FAST
@given(two_or_more_trials)
def test_identical_samples_are_not_significantly_different(samples: list[float]) -> None:
    ratio = speedup(samples, list(samples), resamples=100)
    assert ratio.estimate == 1.0
    assert ratio.p_value == pytest.approx(1.0)
    assert not ratio.significant


def test_speedup_is_deterministic_given_a_seed() -> None:
    baseline, candidate = [100.0, 103.0, 98.0, 101.0], [110.0, 108.0, 115.0, 111.0]
    assert speedup(baseline, candidate, seed=3) == speedup(baseline, candidate, seed=3)
    assert speedup(baseline, candidate, seed=3) != speedup(baseline, candidate, seed=4)


# --- speedups, claims and the noisy flag on constructed cases ----------------------------------


def test_clear_speedup_is_significant() -> None:
    baseline = [100.0, 101.0, 99.0, 100.5, 99.5, 100.2]
    candidate = [130.0, 131.0, 129.0, 130.5, 129.5, 130.2]
    ratio = speedup(baseline, candidate)
    assert ratio.estimate == pytest.approx(130.1 / 100.1)
    assert 1.0 < ratio.low <= ratio.high
    assert ratio.p_value == pytest.approx(2 / math.comb(12, 6))
    assert ratio.significant
    assert ratio.method == "bootstrap percentile, 10000 resamples (seed 0)"
    assert (ratio.n_baseline, ratio.n_candidate) == (6, 6)


@pytest.mark.parametrize(
    ("baseline", "candidate"), [([100.0], [120.0, 121.0]), ([1.0, 2.0], [3.0])]
)
def test_too_few_trials_give_no_interval(baseline: list[float], candidate: list[float]) -> None:
    ratio = speedup(baseline, candidate)
    assert not math.isnan(ratio.estimate)
    assert math.isnan(ratio.low) and math.isnan(ratio.high) and math.isnan(ratio.p_value)
    assert not ratio.significant
    assert ratio.method.startswith("not estimated")
    assert compare_to_claim(ratio, 1.2) == "not measured"


def measured(low: float, high: float) -> Ratio:
    return Ratio(
        estimate=(low + high) / 2,
        low=low,
        high=high,
        confidence=0.95,
        method="constructed",
        n_baseline=5,
        n_candidate=5,
        p_value=0.01,
        significant=True,
        alpha=0.05,
    )


@pytest.mark.parametrize(
    ("low", "high", "claimed", "verdict"),
    [
        (1.2, 1.4, 1.3, "consistent"),
        (1.2, 1.4, 1.2, "consistent"),
        (1.2, 1.4, 1.4, "consistent"),
        (1.2, 1.4, 2.0, "below"),
        (1.2, 1.4, 1.1, "above"),
        (0.9, 1.1, 1.5, "below"),
        (math.nan, math.nan, 1.3, "not measured"),
    ],
)
def test_compare_to_claim(low: float, high: float, claimed: float, verdict: str) -> None:
    assert compare_to_claim(measured(low, high), claimed) == verdict


def test_compare_to_a_nan_claim_is_refused() -> None:
    with pytest.raises(ValueError, match="NaN"):
        compare_to_claim(measured(1.0, 2.0), math.nan)


def test_quiet_cell_is_not_noisy() -> None:
    summary = summarise([100.0, 100.5, 99.5, 100.2, 99.8, 100.1, 99.9])
    assert summary.cv < stats.NOISE_CV
    assert summary.relative_half_width < stats.NOISE_RELATIVE_HALF_WIDTH
    assert not summary.noisy


def test_high_cv_is_noisy(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(stats, "NOISE_RELATIVE_HALF_WIDTH", math.inf)
    samples = [100.0 + 8.0 * (-1) ** i for i in range(30)]  # cv ~ 0.08, median CI 92..108
    assert summarise(samples).noisy
    assert not summarise([100.0 + 3.0 * (-1) ** i for i in range(30)]).noisy  # cv ~ 0.03


def test_wide_median_interval_is_noisy(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(stats, "NOISE_CV", math.inf)
    assert summarise([85.0, 100.0, 100.0, 100.0, 115.0]).noisy  # half-width 15 %
    assert not summarise([95.0, 100.0, 100.0, 100.0, 105.0]).noisy  # half-width 5 %


# --- invalid input -----------------------------------------------------------------------------


def test_empty_input_is_refused() -> None:
    with pytest.raises(ValueError, match="zero samples"):
        summarise([])
    with pytest.raises(ValueError, match="baseline has no trials"):
        speedup([], [1.0, 2.0])
    with pytest.raises(ValueError, match="candidate has no trials"):
        speedup([1.0, 2.0], [])
    with pytest.raises(ValueError, match="at least one value"):
        mann_whitney_u([], [1.0])
    with pytest.raises(ValueError, match="no data"):
        median_ci([])
    with pytest.raises(ValueError, match="no data"):
        quantile([], 0.5)


@pytest.mark.parametrize("bad", [math.nan, math.inf, -math.inf])
def test_non_finite_samples_are_refused(bad: float) -> None:
    with pytest.raises(ValueError, match="finite"):
        summarise([1.0, bad])
    with pytest.raises(ValueError, match="finite"):
        mann_whitney_u([1.0, bad], [2.0])


def test_speedup_needs_positive_throughputs() -> None:
    with pytest.raises(ValueError, match="positive"):
        speedup([0.0, 1.0], [1.0, 2.0])


@pytest.mark.parametrize("confidence", [0.0, 1.0, -0.5, 1.5])
def test_confidence_must_be_a_probability(confidence: float) -> None:
    with pytest.raises(ValueError, match="strictly between 0 and 1"):
        summarise([1.0, 2.0], confidence)
    with pytest.raises(ValueError, match="strictly between 0 and 1"):
        speedup([1.0, 2.0], [1.0, 2.0], confidence)


def test_resamples_must_be_positive() -> None:
    with pytest.raises(ValueError, match="resamples"):
        speedup([1.0, 2.0], [1.0, 2.0], resamples=0)
