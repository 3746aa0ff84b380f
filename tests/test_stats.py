"""Tests for ptspeed.analysis.stats and ptspeed.analysis.ranks: known answers, coverage on
simulated trials, and properties."""

import dataclasses
import itertools
import math
import random
import statistics
from collections.abc import Callable

import pytest
import scipy.stats
from hypothesis import given, settings
from hypothesis import strategies as st

from ptspeed.analysis import ranks, stats
from ptspeed.analysis.ranks import (
    Ratio,
    compare_to_claim,
    mann_whitney_p,
    smallest_p_value,
    speedup,
)
from ptspeed.analysis.stats import median_ci, quantile, summarise, trials_with_range_interval

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


@pytest.mark.parametrize("confidence", [0.8, 0.9, 0.95, 0.99])
def test_trials_with_range_interval_are_those_whose_range_falls_short(confidence: float) -> None:
    """The Method section's "with 5 trials or fewer it is the range": the range, shown with a
    coverage below the requested one, up to that many trials, and not one more."""
    most = trials_with_range_interval(confidence)
    for n in range(1, most + 2):
        low, high, achieved = median_ci([float(i) for i in range(n)], confidence)
        assert (achieved < confidence) == (n <= most)
        assert n > most or (low, high) == (0.0, float(n - 1))
    assert trials_with_range_interval(0.95) == 5


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


def test_p_value_matches_scipy_documentation_example() -> None:
    assert mann_whitney_p(MALES, FEMALES) == pytest.approx(1 / 9, rel=1e-12)


def test_fully_separated_five_against_five_reach_the_floor() -> None:
    fast, slow = [6.0, 7.0, 8.0, 9.0, 10.0], [1.0, 2.0, 3.0, 4.0, 5.0]
    assert mann_whitney_p(fast, slow) == pytest.approx(2 / 252)
    assert mann_whitney_p(slow, fast) == pytest.approx(smallest_p_value(5, 5))


def test_tied_values_use_the_tie_corrected_normal_approximation() -> None:
    # Pooled ranks: 1, 2, 3, 5, 5, 5 (x: 1, 2, 3) -> U_x = 0, U_y = 9; t = 3 tie term 24 / 30.
    sd = math.sqrt(9 / 12 * (7 - 24 / 30))
    expected = math.erfc((9 - 4.5 - 0.5) / sd / math.sqrt(2))
    assert mann_whitney_p([1.0, 2.0, 3.0], [4.0, 4.0, 4.0]) == pytest.approx(expected)


def u_statistic(x: list[float], y: list[float]) -> int:
    return sum(a > b for a in x for b in y)


@pytest.mark.parametrize(("n_x", "n_y"), [(1, 1), (1, 6), (3, 3), (3, 4), (5, 5), (2, 9), (6, 6)])
def test_u_counts_match_enumeration(n_x: int, n_y: int) -> None:
    pooled = list(range(n_x + n_y))
    counts = [0] * (n_x * n_y + 1)
    for chosen in itertools.combinations(pooled, n_x):
        counts[u_statistic(list(chosen), [v for v in pooled if v not in chosen])] += 1
    assert ranks.mann_whitney_u_counts(n_x, n_y) == tuple(counts)


@pytest.mark.parametrize(("n_x", "n_y"), [(3, 3), (3, 5), (4, 4), (5, 5), (6, 6), (4, 9)])
def test_u_tail_sums_match_scipy_exact_distribution(n_x: int, n_y: int) -> None:
    # scipy's one-sided exact p-value of "x is stochastically less" is P(U <= U_x).
    rng = random.Random(n_x * 100 + n_y)
    counts = ranks.mann_whitney_u_counts(n_x, n_y)
    for _ in range(5):
        values = [float(v) for v in rng.sample(range(1000), n_x + n_y)]
        x, y = values[:n_x], values[n_x:]
        u = u_statistic(x, y)
        expected = scipy.stats.mannwhitneyu(x, y, alternative="less", method="exact").pvalue
        assert sum(counts[: u + 1]) / math.comb(n_x + n_y, n_x) == pytest.approx(expected)


@pytest.mark.parametrize(
    ("n_x", "n_y", "rank", "coverage"),
    [
        (2, 2, 1, 1 - 2 / 6),
        (3, 3, 1, 1 - 2 / 20),  # 0.90: the default run's 3 trials a side
        (3, 4, 1, 1 - 2 / 35),  # 0.943
        (3, 5, 1, 1 - 2 / 56),  # 0.964
        (4, 4, 1, 1 - 2 / 70),  # 0.971
        (5, 5, 3, 1 - 2 * 4 / 252),  # 0.968: P(U <= 2) = (1 + 1 + 2) / 252
        (6, 6, 6, 1 - 2 * 19 / 924),  # 0.959: P(U <= 5) = (1 + 1 + 2 + 3 + 5 + 7) / 924
    ],
)
def test_shift_interval_ranks_and_coverage(n_x: int, n_y: int, rank: int, coverage: float) -> None:
    assert ranks.shift_interval_rank(n_x, n_y, 0.95) == (rank, pytest.approx(coverage))
    assert ranks.shift_interval_rank(n_y, n_x, 0.95) == (rank, pytest.approx(coverage))


def test_four_trials_a_side_reach_95_percent() -> None:
    assert ranks.trials_for_confidence(0.95) == 4
    assert ranks.trials_for_confidence(0.90) == 3
    assert ranks.trials_for_confidence(0.99) == 5  # 1 - 2 / 252 = 0.992
    assert smallest_p_value(3, 3) == pytest.approx(0.1)


def test_three_against_three_is_the_range_of_pairwise_ratios_at_90_percent() -> None:
    baseline, candidate = [100.0, 104.0, 98.0], [130.0, 120.0, 141.0]
    ratios = sorted(c / b for b in baseline for c in candidate)
    ratio = speedup(baseline, candidate)
    assert ratio.estimate == ratios[4]  # the median of the 9 ratios
    assert (ratio.low, ratio.high) == (ratios[0], ratios[-1])
    assert ratio.achieved_confidence == pytest.approx(0.9)
    assert ratio.confidence == 0.95
    assert "cannot reach 0.95" in ratio.method
    assert ratio.p_value == pytest.approx(0.1)
    assert not ratio.significant  # the interval excludes 1, yet p cannot fall below 0.1


def test_hodges_lehmann_estimate_by_definition() -> None:
    rng = random.Random(5)
    baseline = [rng.lognormvariate(4.0, 0.1) for _ in range(4)]
    candidate = [rng.lognormvariate(4.2, 0.1) for _ in range(6)]
    shifts = [math.log(c) - math.log(b) for b in baseline for c in candidate]
    assert speedup(baseline, candidate).estimate == pytest.approx(
        math.exp(statistics.median(shifts)), rel=1e-12
    )


def test_interval_is_the_moses_interval_from_scipy_tail_probabilities() -> None:
    # The oracle: the largest k with 1 - 2 P(U <= k - 1) >= 0.95, P from scipy's exact test.
    rng = random.Random(9)
    baseline = [rng.lognormvariate(4.0, 0.1) for _ in range(7)]
    candidate = [rng.lognormvariate(4.1, 0.1) for _ in range(6)]
    ratios = sorted(c / b for b in baseline for c in candidate)
    tail = scipy_u_tail(7, 6)
    rank = max(k for k in range(1, 22) if 1 - 2 * tail(k - 1) >= 0.95)
    ratio = speedup(baseline, candidate)
    assert (ratio.low, ratio.high) == (ratios[rank - 1], ratios[-rank])
    assert ratio.achieved_confidence == pytest.approx(1 - 2 * tail(rank - 1))


def scipy_u_tail(n_x: int, n_y: int) -> Callable[[int], float]:
    """P(U <= u) from scipy's exact one-sided test on data arranged to give U = u."""

    def tail(u: int) -> float:
        for chosen in itertools.combinations(range(n_x + n_y), n_x):
            x = [float(v) for v in chosen]
            y = [float(v) for v in range(n_x + n_y) if v not in chosen]
            if u_statistic(x, y) == u:
                return scipy.stats.mannwhitneyu(x, y, alternative="less", method="exact").pvalue
        raise AssertionError(f"no split gives U = {u}")

    return tail


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


def simulated_coverage(
    n_baseline: int, n_candidate: int, simulations: int, seed: int
) -> tuple[float, float]:
    """(share of intervals covering the true ratio, the achieved confidence they claim) on
    lognormal trials (sigma 0.1, about a 10 % spread) with a true speedup of exp(0.3)."""
    rng = random.Random(seed)
    true_ratio = math.exp(0.3)
    covered, claimed = 0, set()
    for _ in range(simulations):
        baseline = [rng.lognormvariate(4.0, 0.1) for _ in range(n_baseline)]
        candidate = [rng.lognormvariate(4.3, 0.1) for _ in range(n_candidate)]
        ratio = speedup(baseline, candidate)
        covered += ratio.low <= true_ratio <= ratio.high
        claimed.add(ratio.achieved_confidence)
    assert len(claimed) == 1  # the achieved level depends on the trial counts alone
    return covered / simulations, claimed.pop()


@pytest.mark.slow
@pytest.mark.parametrize(("n_baseline", "n_candidate"), [(3, 3), (4, 4), (5, 5), (6, 6), (3, 5)])
def test_shift_interval_covers_the_true_ratio_at_its_stated_level(
    n_baseline: int, n_candidate: int
) -> None:
    # Multiplicative noise is a shift of log throughput, the model under which the interval's
    # coverage is exact: the simulated coverage must match the stated level within 3 standard
    # errors of the simulation, never fall short of it.
    simulations = 1500
    coverage, claimed = simulated_coverage(n_baseline, n_candidate, simulations, seed=n_baseline)
    error = 3 * math.sqrt(claimed * (1 - claimed) / simulations)
    assert claimed - error <= coverage <= claimed + error


# --- properties --------------------------------------------------------------------------------


@FAST
@given(trials)
def test_interval_brackets_the_median(samples: list[float]) -> None:
    summary = summarise(samples)
    assert summary.low <= summary.median <= summary.high
    assert summary.q25 <= summary.median <= summary.q75
    assert 0.0 <= summary.achieved_confidence < 1.0


@FAST
@given(two_or_more_trials, two_or_more_trials)
def test_ratio_interval_brackets_the_estimate(
    baseline: list[float], candidate: list[float]
) -> None:
    ratio = speedup(baseline, candidate)
    slack = 1e-12 * ratio.estimate  # a geometric mean of two ratios may round one ulp past
    assert ratio.low - slack <= ratio.estimate <= ratio.high + slack
    assert 0.0 <= ratio.p_value <= 1.0
    assert 0.0 < ratio.achieved_confidence < 1.0


@FAST
@given(trials, trials)
def test_swapping_sides_inverts_the_estimate_and_interval(
    baseline: list[float], candidate: list[float]
) -> None:
    forward, backward = speedup(baseline, candidate), speedup(candidate, baseline)
    assert forward.estimate * backward.estimate == pytest.approx(1.0, rel=1e-12)
    if forward.n_baseline >= 2 and forward.n_candidate >= 2:
        assert forward.low * backward.high == pytest.approx(1.0, rel=1e-12)
        assert forward.achieved_confidence == backward.achieved_confidence


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
    original = speedup(baseline, candidate)
    scaled = speedup([scale * b for b in baseline], [scale * c for c in candidate])
    assert close(scaled.estimate, original.estimate)
    assert close(scaled.low, original.low)
    assert close(scaled.high, original.high)


@FAST
@given(two_or_more_trials)
def test_identical_samples_are_not_significantly_different(samples: list[float]) -> None:
    ratio = speedup(samples, list(samples))
    assert ratio.estimate == pytest.approx(1.0, rel=1e-12)
    assert ratio.p_value == pytest.approx(1.0)
    assert not ratio.significant


# --- speedups, claims and the noisy flag on constructed cases ----------------------------------


def test_clear_speedup_is_significant() -> None:
    baseline = [100.0, 101.0, 99.0, 100.5, 99.5, 100.2]
    candidate = [130.0, 131.0, 129.0, 130.5, 129.5, 130.2]
    ratio = speedup(baseline, candidate)
    assert ratio.estimate == pytest.approx(1.3, rel=2e-3)
    assert 1.0 < ratio.low <= ratio.high
    assert ratio.p_value == pytest.approx(2 / math.comb(12, 6))
    assert ratio.significant
    assert ratio.achieved_confidence >= 0.95
    assert ratio.method.startswith("Hodges–Lehmann ratio, exact Mann–Whitney")
    assert (ratio.n_baseline, ratio.n_candidate) == (6, 6)


@pytest.mark.parametrize(
    ("baseline", "candidate"), [([100.0], [120.0, 121.0]), ([1.0, 2.0], [3.0])]
)
def test_too_few_trials_give_no_interval(baseline: list[float], candidate: list[float]) -> None:
    ratio = speedup(baseline, candidate)
    assert not math.isnan(ratio.estimate)
    assert math.isnan(ratio.low) and math.isnan(ratio.high) and math.isnan(ratio.p_value)
    assert math.isnan(ratio.achieved_confidence)
    assert not ratio.significant
    assert ratio.method.startswith("not estimated")
    assert compare_to_claim(ratio, 1.2) == "not measured"


def measured(low: float, high: float) -> Ratio:
    return Ratio(
        estimate=(low + high) / 2,
        low=low,
        high=high,
        confidence=0.95,
        achieved_confidence=0.95,
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
        mann_whitney_p([], [1.0])
    with pytest.raises(ValueError, match="no data"):
        median_ci([])
    with pytest.raises(ValueError, match="no data"):
        quantile([], 0.5)


@pytest.mark.parametrize("bad", [math.nan, math.inf, -math.inf])
def test_non_finite_samples_are_refused(bad: float) -> None:
    with pytest.raises(ValueError, match="finite"):
        summarise([1.0, bad])
    with pytest.raises(ValueError, match="finite"):
        speedup([1.0, bad], [2.0])


def test_speedup_needs_positive_throughputs() -> None:
    with pytest.raises(ValueError, match="positive"):
        speedup([0.0, 1.0], [1.0, 2.0])


@pytest.mark.parametrize("confidence", [0.0, 1.0, -0.5, 1.5])
def test_confidence_must_be_a_probability(confidence: float) -> None:
    with pytest.raises(ValueError, match="strictly between 0 and 1"):
        summarise([1.0, 2.0], confidence)
    with pytest.raises(ValueError, match="strictly between 0 and 1"):
        speedup([1.0, 2.0], [1.0, 2.0], confidence)


@pytest.mark.parametrize(
    ("achieved", "note"), [(0.9, "90%"), (0.9714, ""), (0.95, ""), (0.9429, "94%"), (math.nan, "")]
)
def test_confidence_note_names_a_level_below_the_request(achieved: float, note: str) -> None:
    assert stats.confidence_note(0.95, achieved) == note
