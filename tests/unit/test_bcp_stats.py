"""eval.bcp.stats against scipy and the §5.8 arithmetic."""
# Spec: docs/eval.md

from __future__ import annotations

import itertools
import math
import random
from collections import Counter
from fractions import Fraction

import numpy as np
import pytest
from scipy import stats as sp

from eval.bcp.stats import (PairedTable, align, binom_cdf_half, compare_arms, mcnemar_exact, noise_floor,
                            paired_bootstrap, paired_table, tost, wald_paired_ci, wald_se, wilson)


@pytest.mark.parametrize("k, n", [(0, 10), (10, 10), (1, 2), (7, 20), (500, 830), (830, 830), (3, 1000)])
@pytest.mark.parametrize("conf", [0.95, 0.90])
def test_wilson_matches_scipy(k, n, conf):
    ci = sp.binomtest(k, n).proportion_ci(confidence_level=conf, method="wilson")
    assert wilson(k, n, conf) == pytest.approx((ci.low, ci.high), abs=1e-12)


def test_wilson_spec_example_and_errors():
    # §5.8: p = 60.2%, n = 830 -> [56.8, 63.5] (the spec truncates 56.87 to one decimal).
    lo, hi = wilson(500, 830)
    assert 100 * lo == pytest.approx(56.87, abs=0.005) and 100 * hi == pytest.approx(63.52, abs=0.005)
    for bad in [(1, 0), (-1, 5), (6, 5)]:
        with pytest.raises(ValueError):
            wilson(*bad)


@pytest.mark.parametrize("b, c", [(5, 5), (3, 12), (0, 7), (7, 0), (40, 62), (100, 130), (83, 83), (1, 0), (20, 21)])
def test_mcnemar_matches_scipy_binomtest(b, c):
    expected = sp.binomtest(min(b, c), b + c, 0.5, alternative="two-sided").pvalue
    assert mcnemar_exact(b, c) == pytest.approx(expected, rel=1e-9, abs=1e-15)


def test_mcnemar_no_discordant_pairs():
    assert mcnemar_exact(0, 0) == 1.0


@pytest.mark.parametrize("k, n", [(0, 1), (3, 10), (40, 102), (415, 830)])
def test_binomial_cdf_matches_scipy(k, n):
    assert binom_cdf_half(k, n) == pytest.approx(sp.binom.cdf(k, n, 0.5), rel=1e-10)


@pytest.mark.parametrize("discordance, se_pp, half95, half90", [
    (0.10, 1.10, 2.15, 1.81), (0.15, 1.34, 2.63, 2.21), (0.20, 1.55, 3.04, 2.55),
    (0.25, 1.74, 3.40, 2.85), (0.30, 1.90, 3.73, 3.13),
])
def test_wald_se_reproduces_the_spec_power_table(discordance, se_pp, half95, half90):
    # The spec uses d * n discordant pairs unrounded; a whole number of pairs moves the last digit.
    n = 830
    discordant = round(discordance * n)
    table = PairedTable(n11=400, b=discordant // 2, c=discordant - discordant // 2, n00=n - 400 - discordant)
    assert 100 * wald_se(table) == pytest.approx(se_pp, abs=0.01)
    lo, hi = wald_paired_ci(table, 0.95)
    assert 100 * (hi - lo) / 2 == pytest.approx(half95, abs=0.01)
    lo, hi = wald_paired_ci(table, 0.90)
    assert 100 * (hi - lo) / 2 == pytest.approx(half90, abs=0.01)


def test_paired_table_and_align():
    base = [True, True, False, False, True]
    arm = [True, False, True, False, False]
    t = paired_table(base, arm)
    assert (t.n11, t.b, t.c, t.n00) == (1, 2, 1, 1)
    assert t.diff == pytest.approx(-1 / 5) and t.discordance == pytest.approx(3 / 5)
    a, b = align({"q2": True, "q1": False}, {"q1": True, "q2": True})
    assert (a, b) == ([False, True], [True, True])
    with pytest.raises(ValueError, match="different questions"):
        align({"q1": True}, {"q2": True})
    with pytest.raises(ValueError):
        paired_table([True], [True, False])


@pytest.mark.parametrize("b, c, n, margin", [(40, 45, 830, 0.03), (60, 40, 830, 0.03), (100, 130, 830, 0.03),
                                              (10, 12, 100, 0.05), (3, 30, 200, 0.03)])
def test_tost_matches_two_one_sided_z_tests(b, c, n, margin):
    table = PairedTable(n11=n - b - c - 10, b=b, c=c, n00=10)
    d = (c - b) / n
    se = math.sqrt(b + c - (b - c) ** 2 / n) / n
    result = tost(table, margin)
    assert result.p_lower == pytest.approx(sp.norm.sf((d + margin) / se), abs=1e-12)
    assert result.p_upper == pytest.approx(sp.norm.cdf((d - margin) / se), abs=1e-12)
    lo, hi = d - sp.norm.ppf(0.95) * se, d + sp.norm.ppf(0.95) * se
    assert (result.ci_low, result.ci_high) == pytest.approx((lo, hi), abs=1e-12)
    assert result.equivalent == (-margin < lo and hi < margin)
    assert result.equivalent == (result.p < 0.05)


def test_tost_decisions():
    assert tost(PairedTable(700, 40, 45, 45), 0.03).equivalent            # diff 0.6 pp, SE ~1.1 pp
    assert not tost(PairedTable(600, 100, 130, 0), 0.03).equivalent       # diff 3.6 pp
    assert not tost(PairedTable(60, 10, 12, 18), 0.03).equivalent         # too few questions
    assert tost(PairedTable(50, 0, 0, 50), 0.03).equivalent               # identical outcomes
    assert not tost(PairedTable(50, 0, 5, 45), 0.03).equivalent           # +5 pp, all discordance one way
    assert not tost(PairedTable(45, 5, 0, 50), 0.03).equivalent
    with pytest.raises(ValueError):
        tost(PairedTable(1, 1, 1, 1), 0)


def _outcomes(table: PairedTable, seed: int = 0):
    pairs = ([(1, 1)] * table.n11 + [(1, 0)] * table.b + [(0, 1)] * table.c + [(0, 0)] * table.n00)
    np.random.default_rng(seed).shuffle(pairs)
    return [p[0] for p in pairs], [p[1] for p in pairs]


# ----------------------------------------------------------------------------- paired bootstrap
#
# Percentile convention of ``paired_bootstrap`` (pinned by test_bootstrap_percentile_convention):
# with M resampled mean differences sorted as v_0 <= ... <= v_{M-1} and alpha = 1 - conf,
# low/high are numpy's default ("linear", Hyndman-Fan type 7) quantiles at alpha/2 and 1 - alpha/2:
# the value at the 0-based position h = (M - 1) p, interpolated linearly between v_floor(h) and
# v_ceil(h). scipy.stats.bootstrap(method="percentile") uses the same quantile rule. ``se`` is the
# sample standard deviation (ddof=1) of the M resampled differences. Resampling is paired: one
# index per question draws that question's (baseline, arm) pair.


def _half_width_tolerance_check(tol, ci95, ci90):
    """A tolerance is only meaningful if it cannot confuse the 95% interval with the 90% one."""
    gap = min(ci90[0] - ci95[0], ci95[1] - ci90[1])
    assert 0 < tol < gap, f"tolerance {tol} does not separate the 90% from the 95% interval (gap {gap})"


def test_bootstrap_is_seeded_and_near_the_wald_interval():
    n, table = 830, PairedTable(450, 60, 80, 240)
    base, arm = _outcomes(table)
    boot = paired_bootstrap(base, arm, num_resamples=20_000, seed=1)  # default conf: 95%
    assert boot == paired_bootstrap(base, arm, num_resamples=20_000, seed=1)
    assert boot != paired_bootstrap(base, arm, num_resamples=20_000, seed=2)
    assert boot.diff == pytest.approx(table.diff)
    assert (boot.num_resamples, boot.seed) == (20_000, 1)
    # Resampled differences live on the grid k / n; at n = 830 the 95% and 90% Wald ends are
    # ~3.7 grid steps apart, and the bootstrap ends sit within one step of Wald's.
    tol = 1 / n
    wald95, wald90 = wald_paired_ci(table, 0.95), wald_paired_ci(table, 0.90)
    _half_width_tolerance_check(tol, wald95, wald90)
    assert (boot.low, boot.high) == pytest.approx(wald95, abs=tol)
    boot90 = paired_bootstrap(base, arm, num_resamples=20_000, seed=1, conf=0.90)
    assert (boot90.low, boot90.high) == pytest.approx(wald90, abs=tol)
    assert boot.se == pytest.approx(wald_se(table), rel=0.03)


def _scipy_percentile_ci(base, arm, conf, seed):
    def stat(x, y, axis=-1):
        return np.mean(y, axis=axis) - np.mean(x, axis=axis)

    res = sp.bootstrap((np.array(base, float), np.array(arm, float)), stat, paired=True, vectorized=True,
                       n_resamples=20_000, batch=2_000, method="percentile", confidence_level=conf,
                       rng=np.random.default_rng(seed))
    return res.confidence_interval.low, res.confidence_interval.high


def test_bootstrap_matches_scipy_percentile_bootstrap():
    """Against scipy's paired percentile bootstrap (independent resamples, so not bit-equal)."""
    n = 830
    base, arm = _outcomes(PairedTable(450, 60, 80, 240), seed=3)
    ref95, ref90 = _scipy_percentile_ci(base, arm, 0.95, 100), _scipy_percentile_ci(base, arm, 0.90, 100)
    # Both sides quantise to the grid k / 830; 20k resamples each put the ends at most one grid
    # step apart, while scipy's own 90% and 95% ends are >= 3 steps apart.
    tol = 1.5 / n
    _half_width_tolerance_check(tol, ref95, ref90)
    ours95 = paired_bootstrap(base, arm, num_resamples=20_000, seed=0)  # default conf: 95%
    ours90 = paired_bootstrap(base, arm, num_resamples=20_000, seed=0, conf=0.90)
    assert (ours95.low, ours95.high) == pytest.approx(ref95, abs=tol)
    assert (ours90.low, ours90.high) == pytest.approx(ref90, abs=tol)


def _exact_bootstrap(base, arm):
    """Exact distribution of the resampled mean difference: all n**n equally likely index tuples.

    Returns {value: probability} with Fractions (value = sum / n), independent of numpy.
    """
    n = len(base)
    d = [int(a) - int(b) for b, a in zip(base, arm)]
    counts = Counter(sum(d[i] for i in idx) for idx in itertools.product(range(n), repeat=n))
    return {Fraction(s, n): Fraction(c, n ** n) for s, c in sorted(counts.items())}


def _exact_quantile(dist, p):
    """The p-quantile of the exact distribution: the smallest v with P[V <= v] >= p.

    A Monte Carlo percentile (any interpolation rule) converges to this value whenever no atom's
    CDF equals p; also returns the distance from p to the nearest CDF value, so a case can show
    that it is far from such a tie.
    """
    cdf, out = Fraction(0), None
    nearest = Fraction(1)
    for v, prob in dist.items():
        cdf += prob
        nearest = min(nearest, abs(cdf - p))
        if out is None and cdf >= p:
            out = v
    return out, nearest


def _exact_ci(dist, conf):
    alpha = 1 - Fraction(conf)
    (lo, m_lo), (hi, m_hi) = _exact_quantile(dist, alpha / 2), _exact_quantile(dist, 1 - alpha / 2)
    return (float(lo), float(hi)), min(m_lo, m_hi)


def _exact_se(dist):
    mean = sum(v * p for v, p in dist.items())
    return math.sqrt(sum((v - mean) ** 2 * p for v, p in dist.items()))


# (baseline, arm) on 4-6 questions; per-question differences arm - baseline in {-1, 0, 1}.
EXACT_CASES = [
    pytest.param([0, 1, 1, 0, 1, 0], [1, 0, 1, 0, 0, 1], id="n6-two-up-two-down"),  # d = +1 -1 0 0 -1 +1
    pytest.param([1, 1, 0, 1, 0], [0, 1, 0, 1, 1], id="n5-one-up-one-down"),          # d = -1 0 0 0 +1
    pytest.param([1, 0, 1, 0], [0, 0, 1, 1], id="n4-one-up-one-down"),                # d = -1 0 0 +1
    pytest.param([1, 1, 1, 0, 0, 1], [1, 1, 0, 0, 1, 1], id="n6-last-but-one-up"),    # d = 0 0 -1 0 +1 0
]


@pytest.mark.parametrize("base, arm", EXACT_CASES)
def test_bootstrap_equals_exact_enumeration(base, arm):
    """The percentile interval equals the exact bootstrap interval from all n**n resamples.

    The cases are chosen so that (a) the exact 95% and 90% intervals differ at both ends by at
    least one grid step 1/n, and (b) every CDF value is > 0.008 away from the levels 0.025, 0.05,
    0.95, 0.975 (about 7 Monte Carlo standard errors at 20k resamples), so the Monte Carlo
    percentile lands on the exact atom and a tolerance of 1e-12 is fair.
    """
    n = len(base)
    dist = _exact_bootstrap(base, arm)
    assert sum(dist.values()) == 1
    exact95, margin95 = _exact_ci(dist, "0.95")
    exact90, margin90 = _exact_ci(dist, "0.90")
    assert min(margin95, margin90) > Fraction(8, 1000)  # the case is what the docstring says
    tol = 1e-12
    _half_width_tolerance_check(tol, exact95, exact90)
    assert min(exact90[0] - exact95[0], exact95[1] - exact90[1]) >= 1 / n - 1e-12

    ours95 = paired_bootstrap(base, arm, num_resamples=20_000, seed=5)  # the default conf is 95%
    ours90 = paired_bootstrap(base, arm, num_resamples=20_000, seed=5, conf=0.90)
    assert (ours95.low, ours95.high) == pytest.approx(exact95, abs=tol)
    assert (ours90.low, ours90.high) == pytest.approx(exact90, abs=tol)
    assert ours95.diff == pytest.approx(float(sum(Fraction(a - b, n) for b, a in zip(base, arm))), abs=1e-15)
    assert ours95.se == pytest.approx(_exact_se(dist), rel=0.03)


@pytest.mark.parametrize("position", [0, 3, 5], ids=["first", "middle", "last"])
def test_bootstrap_draws_every_question(position):
    """Only one question is discordant (arm right, baseline wrong); a resampler that never draws
    it (e.g. indices in range(n - 1) for the last one) would give the interval [0, 0] and se 0.

    Exactly: the number of draws of that question is K ~ Binomial(6, 1/6), the resampled
    difference is K / 6, its 95% interval is [0, 3/6] (P[K <= 2] = 0.938, P[K <= 3] = 0.991)
    and its sd is sqrt(6 * 1/6 * 5/6) / 6 = 0.152.
    """
    n = 6
    base, arm = [1] * n, [1] * n
    base[position] = 0
    dist = _exact_bootstrap(base, arm)
    exact95, margin = _exact_ci(dist, "0.95")
    assert exact95 == (0.0, 0.5) and margin > Fraction(8, 1000)
    se = _exact_se(dist)
    assert se == pytest.approx(math.sqrt(6 * (1 / 6) * (5 / 6)) / 6, rel=1e-12)

    boot = paired_bootstrap(base, arm, num_resamples=20_000, seed=11)
    assert boot.diff == pytest.approx(1 / 6)
    assert (boot.low, boot.high) == pytest.approx(exact95, abs=1e-12)
    assert boot.se == pytest.approx(se, rel=0.03)


class _ScriptedRng:
    """Stands in for ``np.random.default_rng(seed)``: ``integers(0, n, size=(rows, n))`` hands out
    the next ``rows`` prescribed index rows, so the resampled differences are known exactly."""

    def __init__(self, rows, n):
        self.rows, self.n, self.used = np.asarray(rows), n, 0

    def integers(self, low, high=None, size=None, **kw):
        assert (low, high) == (0, self.n) and kw == {}, "resampler must draw indices uniformly from 0..n-1"
        rows, cols = size
        assert cols == self.n and self.used + rows <= len(self.rows)
        out = self.rows[self.used: self.used + rows]
        self.used += rows
        return out


@pytest.mark.parametrize("chunk", [1000, 4, 1], ids=lambda c: f"chunk{c}")
@pytest.mark.parametrize("conf, low, high", [
    # M = 17 resamples with sorted differences v_k = (k - 6) / 10, k = 0..16, so v_0 = -0.6, v_16 = 1.0.
    # 95%: h = 16 * 0.025 = 0.4  -> v_0 + 0.4 (v_1 - v_0) = -0.56;  h = 16 * 0.975 = 15.6 -> 0.96.
    # 90%: h = 16 * 0.05  = 0.8  -> -0.52;                          h = 16 * 0.95  = 15.2 -> 0.92.
    # (Nearest/lower/higher rules or an index off by one would give a multiple of 0.1 instead.)
    pytest.param(0.95, -0.56, 0.96, id="95%"),
    pytest.param(0.90, -0.52, 0.92, id="90%"),
])
def test_bootstrap_percentile_convention(monkeypatch, chunk, conf, low, high):
    n = 10
    base = [0, 1] + [1] * (n - 2)  # question 0: arm right only (+1); question 1: baseline right only (-1)
    arm = [1, 0] + [1] * (n - 2)
    values = list(range(-6, 11))  # resampled difference k / 10 for each of these k
    random.Random(4).shuffle(values)
    rows = [[0] * k + [2] * (n - k) if k >= 0 else [1] * -k + [2] * (n + k) for k in values]
    rng = _ScriptedRng(rows, n)
    seeds = []
    monkeypatch.setattr(np.random, "default_rng", lambda seed=None: seeds.append(seed) or rng)
    boot = paired_bootstrap(base, arm, num_resamples=len(rows), seed=7, conf=conf, chunk=chunk)
    assert seeds == [7] and rng.used == len(rows)
    assert boot.diff == 0.0
    assert (boot.low, boot.high) == pytest.approx((low, high), abs=1e-12)
    assert boot.se == pytest.approx(float(np.std(np.array(values) / 10, ddof=1)), rel=1e-12)
    assert (boot.num_resamples, boot.seed) == (17, 7)


def test_noise_floor_and_compare_arms():
    plain1 = {f"q{i}": i % 3 != 0 for i in range(90)}
    plain2 = {f"q{i}": (i % 3 != 0) != (i % 10 == 0) for i in range(90)}
    scr = {f"q{i}": (i % 3 != 0) != (i % 15 == 1) for i in range(90)}
    floor = noise_floor(plain1, plain2)
    assert floor["b"] + floor["c"] == 9 and floor["discordance"] == pytest.approx(9 / 90)
    assert floor["mcnemar_p"] == pytest.approx(sp.binomtest(min(floor["b"], floor["c"]), 9).pvalue)
    out = compare_arms(plain1, scr, margin=0.05, num_resamples=500, aa=(plain1, plain2))
    assert out["baseline"]["correct"] == 60 and out["baseline"]["n"] == 90
    assert out["arm"]["wilson"] == pytest.approx(list(wilson(out["arm"]["correct"], 90)))
    assert out["paired"]["b"] + out["paired"]["c"] == 6
    assert out["paired"]["diff"] == pytest.approx((out["arm"]["correct"] - 60) / 90)
    assert out["bootstrap"]["num_resamples"] == 500 and out["tost"]["margin"] == 0.05
    assert out["noise_floor"] == floor
    assert compare_arms(plain1, scr, num_resamples=10)["noise_floor"] is None
    with pytest.raises(ValueError):
        compare_arms(plain1, {"q0": True})
