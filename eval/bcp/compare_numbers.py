"""The numbers behind the BCP comparison table: per-question token provenance and PFLOPs of an
arm, bootstrap intervals of a mean and of a paired ratio, and how the table prints numbers."""

from __future__ import annotations

import statistics

import numpy as np

from eval.bcp.compare_arms import Arm


def question_tokens(arm: Arm, body_params: float, pair_flops: int) -> dict[str, dict]:
    """Per question: prompt P, reused R, moved M, read F, decode D, requests and PFLOPs (the
    accounting's, no-cache naive, and with attention)."""
    from eval.accounting.flops import naive_pflops, with_attention_pflops

    out = {q: {"P": 0, "R": 0, "M": 0, "F": 0, "D": 0, "requests": 0, "pflops": 0.0, "naive": 0.0, "attn": 0.0}
           for q in arm.records}
    for qid, _, row in arm.requests:
        t = out[qid]
        t["P"] += row.prompt_tokens
        t["R"] += row.prefix_reused
        t["M"] += row.moved
        t["F"] += row.read
        t["D"] += row.decode
        t["requests"] += 1
        t["pflops"] += row.pflops
        t["naive"] += naive_pflops(row.prompt_tokens, row.decode, body_params)
        t["attn"] += with_attention_pflops(row.prompt_tokens, row.read, row.decode, body_params, pair_flops)
    return out


def mean_ci(values: list[float], seed: int = 0, resamples: int = 10_000) -> tuple[float, float, float]:
    """Mean with a bootstrap 95% interval over questions."""
    x = np.asarray(values, dtype=float)
    if x.size == 0:
        return float("nan"), float("nan"), float("nan")
    rng = np.random.default_rng(seed)
    means = x[rng.integers(0, x.size, size=(resamples, x.size))].mean(axis=1)
    lo, hi = np.quantile(means, [0.025, 0.975])
    return float(x.mean()), float(lo), float(hi)


def ratio_ci(base: list[float], arm: list[float], seed: int = 0, resamples: int = 10_000) -> tuple[float, float, float]:
    """Ratio of means arm/base with a paired bootstrap over questions."""
    a, b = np.asarray(base, dtype=float), np.asarray(arm, dtype=float)
    if a.size == 0 or a.sum() == 0:
        return float("nan"), float("nan"), float("nan")
    rng = np.random.default_rng(seed)
    idx = rng.integers(0, a.size, size=(resamples, a.size))
    den = a[idx].sum(axis=1)
    ratios = np.where(den > 0, b[idx].sum(axis=1) / np.where(den > 0, den, 1), np.nan)
    lo, hi = np.nanquantile(ratios, [0.025, 0.975])
    return float(b.sum() / a.sum()), float(lo), float(hi)


def wilcoxon_p(base: list[float], arm: list[float]) -> str:
    """The Wilcoxon signed-rank p of paired per-question values; "—" when all differences are 0
    or scipy cannot tell."""
    try:
        from scipy.stats import wilcoxon

        diffs = np.asarray(arm) - np.asarray(base)
        return "—" if not np.any(diffs) else f"{wilcoxon(diffs).pvalue:.3g}"
    except Exception:
        return "—"


def pct(x, digits=1) -> str:
    return "—" if x is None or (isinstance(x, float) and np.isnan(x)) else f"{100 * x:.{digits}f}%"


def num(x, digits=2) -> str:
    if x is None or (isinstance(x, float) and np.isnan(x)):
        return "—"
    return f"{x:,.{digits}f}" if isinstance(x, float) else f"{x:,}"


def citations(c) -> str:
    if not c:
        return "—"
    return f"{num(c.get('coverage'), 1)} / {num(c.get('precision'), 1)} / {num(c.get('recall'), 1)}"


def mean(values):
    return float(statistics.fmean(values)) if values else float("nan")


def median(values):
    return float(statistics.median(values)) if values else float("nan")


def count(items) -> dict:
    out = {}
    for item in items:
        out[item] = out.get(item, 0) + 1
    return out
