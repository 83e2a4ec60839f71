"""Paired statistics for "same accuracy" between two arms (docs/eval.md §5.8).

All proportions and differences are fractions (0.03 = 3 percentage points). Arms are compared
question by question: per question i a pair (baseline_i, arm_i) in {0,1}^2, tabulated as

               arm right   arm wrong
    base right    n11         b = n10
    base wrong    c = n01     n00

and the difference is ``arm - baseline`` = (c - b) / n.

* :func:`wilson`: Wilson score interval of one arm's accuracy.
* :func:`mcnemar_exact`: two-sided exact McNemar p = min(1, 2 P[X <= min(b, c)]),
  X ~ Binomial(b + c, 1/2) (a test for a *difference*; non-significance is not equivalence).
* :func:`wald_paired_ci`: difference ± z SE, SE = sqrt(b + c - (b - c)^2 / n) / n (§5.8).
* :func:`paired_bootstrap`: resample questions with replacement (seeded numpy Generator),
  percentile CI of the accuracy difference.
* :func:`tost`: two one-sided z-tests with the Wald SE against the margin ±δ (default 3 pp, the
  §5.8 suggestion); "equivalent" iff both reject at α, i.e. iff the (1 - 2α) = 90% Wald CI lies
  inside (-δ, δ). With no discordant pair SE = 0 and the decision is |difference| < δ.
* :func:`noise_floor`: the same paired quantities for two runs of one arm (A/A), whose
  discordance is the noise floor to set beside an A/B discordance.
* :func:`compare_arms`: everything above for one pair of arms (optionally with an A/A pair).

Standard library (math.comb, statistics.NormalDist) and numpy only; tests check against scipy.
"""
# Spec: docs/eval.md

from __future__ import annotations

import math
from dataclasses import asdict, dataclass
from statistics import NormalDist
from typing import Mapping, Sequence

import numpy as np

DEFAULT_MARGIN = 0.03


def _z(conf: float) -> float:
    if not 0 < conf < 1:
        raise ValueError(f"confidence level must be in (0, 1), got {conf}")
    return NormalDist().inv_cdf(1 - (1 - conf) / 2)


def wilson(k: int, n: int, conf: float = 0.95) -> tuple[float, float]:
    """Wilson score interval for k successes out of n."""
    if n <= 0 or not 0 <= k <= n:
        raise ValueError(f"need 0 <= k <= n and n > 0, got k={k}, n={n}")
    z = _z(conf)
    p = k / n
    denom = 1 + z * z / n
    center = (p + z * z / (2 * n)) / denom
    half = z / denom * math.sqrt(p * (1 - p) / n + z * z / (4 * n * n))
    return max(0.0, center - half), min(1.0, center + half)


@dataclass(frozen=True)
class PairedTable:
    n11: int  # both right
    b: int    # baseline right, arm wrong
    c: int    # baseline wrong, arm right
    n00: int  # both wrong

    @property
    def n(self) -> int:
        return self.n11 + self.b + self.c + self.n00

    @property
    def diff(self) -> float:
        """Accuracy of the arm minus accuracy of the baseline."""
        return (self.c - self.b) / self.n

    @property
    def discordance(self) -> float:
        return (self.b + self.c) / self.n


def paired_table(baseline: Sequence[bool], arm: Sequence[bool]) -> PairedTable:
    if len(baseline) != len(arm) or not baseline:
        raise ValueError("need two equally long, non-empty outcome lists")
    pairs = list(zip(map(bool, baseline), map(bool, arm)))
    return PairedTable(pairs.count((True, True)), pairs.count((True, False)),
                       pairs.count((False, True)), pairs.count((False, False)))


def align(baseline: Mapping[str, bool], arm: Mapping[str, bool]) -> tuple[list[bool], list[bool]]:
    """Outcomes of both arms in one question order; both must cover the same questions."""
    if set(baseline) != set(arm):
        only_a, only_b = sorted(set(baseline) - set(arm)), sorted(set(arm) - set(baseline))
        raise ValueError(f"arms cover different questions: only baseline {only_a[:5]}, only arm {only_b[:5]}")
    ids = sorted(baseline)
    return [bool(baseline[i]) for i in ids], [bool(arm[i]) for i in ids]


def binom_cdf_half(k: int, n: int) -> float:
    """P[X <= k] for X ~ Binomial(n, 1/2), exact."""
    return sum(math.comb(n, i) for i in range(k + 1)) / 2 ** n


def mcnemar_exact(b: int, c: int) -> float:
    """Two-sided exact McNemar p-value from the discordant counts."""
    if b + c == 0:
        return 1.0
    return min(1.0, 2 * binom_cdf_half(min(b, c), b + c))


def wald_se(table: PairedTable) -> float:
    b, c, n = table.b, table.c, table.n
    return math.sqrt(max(0.0, b + c - (b - c) ** 2 / n)) / n


def wald_paired_ci(table: PairedTable, conf: float = 0.95) -> tuple[float, float]:
    half = _z(conf) * wald_se(table)
    return table.diff - half, table.diff + half


@dataclass(frozen=True)
class Bootstrap:
    diff: float
    low: float
    high: float
    se: float
    num_resamples: int
    seed: int


def paired_bootstrap(baseline: Sequence[bool], arm: Sequence[bool], *, num_resamples: int = 10_000,
                     seed: int = 0, conf: float = 0.95, chunk: int = 1_000) -> Bootstrap:
    """Percentile CI of mean(arm) - mean(baseline), resampling questions jointly."""
    a = np.asarray(baseline, dtype=float)
    b = np.asarray(arm, dtype=float)
    if a.shape != b.shape or a.size == 0:
        raise ValueError("need two equally long, non-empty outcome lists")
    per_question = b - a
    rng = np.random.default_rng(seed)
    diffs = np.empty(num_resamples)
    for start in range(0, num_resamples, chunk):
        rows = min(chunk, num_resamples - start)
        idx = rng.integers(0, a.size, size=(rows, a.size))
        diffs[start: start + rows] = per_question[idx].mean(axis=1)
    alpha = 1 - conf
    low, high = np.quantile(diffs, [alpha / 2, 1 - alpha / 2])
    return Bootstrap(float(per_question.mean()), float(low), float(high), float(diffs.std(ddof=1)),
                     num_resamples, seed)


@dataclass(frozen=True)
class Tost:
    diff: float
    se: float
    margin: float
    alpha: float
    p_lower: float  # H0: diff <= -margin
    p_upper: float  # H0: diff >= +margin
    ci_low: float   # the (1 - 2 alpha) Wald CI
    ci_high: float
    equivalent: bool

    @property
    def p(self) -> float:
        return max(self.p_lower, self.p_upper)


def tost(table: PairedTable, margin: float = DEFAULT_MARGIN, alpha: float = 0.05) -> Tost:
    """Equivalence of paired accuracies within ±margin by two one-sided Wald z-tests."""
    if margin <= 0:
        raise ValueError("margin must be positive")
    d, se = table.diff, wald_se(table)
    if se == 0:
        inside = abs(d) < margin
        p_lo = 0.0 if d > -margin else 1.0
        p_hi = 0.0 if d < margin else 1.0
        return Tost(d, 0.0, margin, alpha, p_lo, p_hi, d, d, inside)
    norm = NormalDist()
    p_lo = 1 - norm.cdf((d + margin) / se)
    p_hi = norm.cdf((d - margin) / se)
    lo, hi = wald_paired_ci(table, 1 - 2 * alpha)
    return Tost(d, se, margin, alpha, p_lo, p_hi, lo, hi, p_lo < alpha and p_hi < alpha)


def _paired_summary(table: PairedTable, conf: float) -> dict:
    lo, hi = wald_paired_ci(table, conf)
    return {**asdict(table), "n": table.n, "diff": table.diff, "discordance": table.discordance,
            "mcnemar_p": mcnemar_exact(table.b, table.c), "wald_se": wald_se(table),
            "wald_ci": [lo, hi]}


def noise_floor(run1: Mapping[str, bool], run2: Mapping[str, bool], conf: float = 0.95) -> dict:
    """A/A: two runs of one arm on the same questions; their discordance is the noise floor."""
    table = paired_table(*align(run1, run2))
    return _paired_summary(table, conf)


def arm_summary(outcomes: Sequence[bool], conf: float = 0.95) -> dict:
    k, n = sum(map(bool, outcomes)), len(outcomes)
    lo, hi = wilson(k, n, conf)
    return {"n": n, "correct": k, "accuracy": k / n, "wilson": [lo, hi]}


def compare_arms(baseline: Mapping[str, bool], arm: Mapping[str, bool], *, margin: float = DEFAULT_MARGIN,
                 conf: float = 0.95, num_resamples: int = 10_000, seed: int = 0,
                 aa: tuple[Mapping[str, bool], Mapping[str, bool]] | None = None) -> dict:
    """Per-arm Wilson CIs, the paired table, McNemar, Wald and bootstrap CIs, TOST, A/A floor."""
    a, b = align(baseline, arm)
    table = paired_table(a, b)
    boot = paired_bootstrap(a, b, num_resamples=num_resamples, seed=seed, conf=conf)
    test = tost(table, margin)
    return {
        "baseline": arm_summary(a, conf),
        "arm": arm_summary(b, conf),
        "paired": _paired_summary(table, conf),
        "bootstrap": asdict(boot),
        "tost": {**asdict(test), "p": test.p},
        "noise_floor": noise_floor(*aa, conf=conf) if aa is not None else None,
    }
