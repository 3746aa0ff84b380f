"""Compare's judgement rule (stated in full in :mod:`ptspeed.analysis.compare`): a cell's
ratio new / old divided by its machine's (:func:`corrected`, its interval widened by the
machine's and by the A/A spread two runs of identical code differ by), and the mark and words
that follow (:func:`judged`) by the numbers of a :class:`Rule`.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from ptspeed.analysis import ranks
from ptspeed.analysis.machine_change import MACHINE_CHANGE, Machine
from ptspeed.plan.settings import Settings

FASTER, SLOWER, SAME, NOT_COMPARABLE = "+", "-", " ", "x"
# Two runs of identical code differ by up to this ratio (95 %): measured, see the docstring of
# ptspeed.analysis.compare.
AA_SPREAD = 0.05


@dataclass(frozen=True)
class Rule:
    """The numbers a verdict uses: the minimum effect, the A/A spread and the shortest
    window a change is called in (seconds)."""

    min_effect: float
    aa_spread: float
    min_window_s: float

    @classmethod
    def of(cls, settings: Settings) -> Rule:
        """The rule a run's settings set."""
        return cls(settings.compare.min_effect, AA_SPREAD, settings.conditions.min_window_s)


def corrected(
    ratio: ranks.Ratio, machine: Machine | None, aa_spread: float
) -> tuple[float, float, float]:
    """(c, low, high): the cell's ratio divided by its machine's, and an interval whose
    half-widths on the log scale are the ratio's, the machine's and ``log(1 + aa_spread)``
    added in quadrature (independent errors; each about 95 %)."""
    m, m_low, m_high = machine.bounds() if machine is not None else (1.0, 1.0, 1.0)
    between = math.log1p(aa_spread)
    c = ratio.estimate / m
    up = math.hypot(math.log(ratio.high / ratio.estimate), math.log(m / m_low), between)
    down = math.hypot(math.log(ratio.estimate / ratio.low), math.log(m_high / m), between)
    return c, c * math.exp(-down), c * math.exp(up)


def judged(
    ratio: ranks.Ratio, rule: Rule, machine: Machine | None = None, window_s: float = math.inf
) -> tuple[str, str]:
    """The mark and its words by the rule :mod:`ptspeed.analysis.compare` states (``window_s``:
    the shorter side's median measured window)."""
    if math.isnan(ratio.low):
        return SAME, "too few ok trials for a test (2 per side needed)"
    floor = ranks.smallest_p_value(ratio.n_baseline, ratio.n_candidate)
    if floor >= ratio.alpha:
        return SAME, (
            f"too few ok trials to detect a change ({ratio.n_baseline} and "
            f"{ratio.n_candidate}: p >= {floor:.2g} whatever they measure)"
        )
    c, low, high = corrected(ratio, machine, rule.aa_spread)
    m = machine.bounds()[0] if machine is not None else 1.0
    beyond = abs(c - 1.0) > rule.min_effect
    if beyond and (high < 1.0 or low > 1.0):
        return _beyond(ratio, c, m, rule, window_s)
    if beyond:
        return SAME, _within_noise(ratio, c, machine, rule)
    if ratio.significant and abs(ratio.estimate - 1.0) > rule.min_effect:
        explained = f"x{ratio.estimate:.2f}, as the machine's own change explains"
        return SAME, f"{explained} ({_beside(c, m)})"
    if ratio.significant:
        return SAME, f"significant, but within the {rule.min_effect:.0%} threshold"
    return SAME, "no significant change"


def _beyond(ratio: ranks.Ratio, c: float, m: float, rule: Rule, window_s: float) -> tuple[str, str]:
    """The verdict on a change beyond the minimum effect whose whole interval lies on one
    side of no change: called, unless the cell moved against it or its windows are short."""
    slower = c < 1.0
    word = "slower" if slower else "faster"
    if (ratio.high < 1.0) if not slower else (ratio.low > 1.0):
        moved = "slower" if ratio.high < 1.0 else "faster"
        return SAME, (
            f"x{ratio.estimate:.2f}: {moved} than before, but by less than the machine "
            f"({_beside(c, m)}): a changed machine moves cells less than its probe, so not "
            f"called {word}"
        )
    if window_s < rule.min_window_s:
        return SAME, (
            f"{word} by the numbers, but its windows ({window_s:.2f} s) are shorter than the "
            f"{rule.min_window_s:g} s a change is called on (conditions.min_window_s): "
            "lengthen steps.measured"
        )
    if abs(m - 1.0) > MACHINE_CHANGE:
        return (SLOWER if slower else FASTER), f"{word} beyond the machine ({_beside(c, m)})"
    return (SLOWER if slower else FASTER), word


def _within_noise(ratio: ranks.Ratio, c: float, machine: Machine | None, rule: Rule) -> str:
    """Words for a change beyond the minimum effect whose interval reaches no change: which
    noise lets it (the runs' own spread, the machine's probe, or the trials themselves)."""
    _, low, high = corrected(ratio, machine, 0.0)
    if high < 1.0 or low > 1.0:
        return (
            f"x{c:.2f} beside the machine, within the ±{rule.aa_spread:.0%} two runs of identical "
            "code differ by (A/A): repeat the runs to tell"
        )
    if ratio.significant:
        return f"x{c:.2f} beside the machine, but not significant beside its probe's own noise"
    return "no significant change"


def _beside(c: float, m: float) -> str:
    return f"machine x{m:.2f}; ratio / machine x{c:.2f}"
