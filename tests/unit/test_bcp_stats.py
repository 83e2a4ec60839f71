"""eval.bcp.stats against scipy and the §5.8 arithmetic."""
# Spec: docs/eval.md

from __future__ import annotations

import math

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


def test_bootstrap_is_seeded_and_near_the_wald_interval():
    table = PairedTable(450, 60, 80, 240)
    base, arm = _outcomes(table)
    boot = paired_bootstrap(base, arm, num_resamples=4000, seed=1)
    assert boot == paired_bootstrap(base, arm, num_resamples=4000, seed=1)
    assert boot != paired_bootstrap(base, arm, num_resamples=4000, seed=2)
    assert boot.diff == pytest.approx(table.diff)
    lo, hi = wald_paired_ci(table, 0.95)
    assert boot.low == pytest.approx(lo, abs=0.004) and boot.high == pytest.approx(hi, abs=0.004)
    assert boot.se == pytest.approx(wald_se(table), rel=0.1)


def test_bootstrap_matches_scipy_percentile_bootstrap():
    base, arm = _outcomes(PairedTable(450, 60, 80, 240), seed=3)
    ours = paired_bootstrap(base, arm, num_resamples=5000, seed=0)
    ref = sp.bootstrap((np.array(base, float), np.array(arm, float)), lambda x, y: np.mean(y) - np.mean(x),
                       paired=True, vectorized=False, n_resamples=5000, method="percentile",
                       rng=np.random.default_rng(0)).confidence_interval
    assert ours.low == pytest.approx(ref.low, abs=0.005) and ours.high == pytest.approx(ref.high, abs=0.005)


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
