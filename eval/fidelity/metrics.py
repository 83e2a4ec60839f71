"""Pure computations of ``python -m eval.fidelity``: how far an ``scr`` answer is from a cold read.

No I/O, no server. Inputs are what SGLang's ``/generate`` returns in ``meta_info``: the generated
ids, the logprob of each chosen token and, per generated position, the top-K ``(logprob, token_id)``
pairs. Definitions (the same words are used in the table and the JSON rows):

* **first divergence**: the smallest position ``i`` where the scr and the cold greedy ids differ;
  None when all N positions agree. After it the two continuations condition on different text,
  so nothing later is compared.
* **greedy agreement**: tokens equal up to the first divergence, divided by N (1.0 = identical
  answers; 0.0 = the first token already differs).
* **max |Δ logprob|**: the largest ``|logprob_scr(t_i) - logprob_cold(t_i)|`` of the chosen tokens
  at positions before the first divergence (the tokens are the same there); None when the first
  token already differs.
* **KL(cold || scr) of the first generated token**, over the cold read's top-K token set S: both
  distributions are renormalised over S and ``KL = Σ_{t∈S} p(t) (log p(t) - log q(t))``. A token of
  S missing from scr's own top-K list has scr logprob at most scr's smallest listed one; that
  bound is used for it, and the row counts such tokens in ``kl_missing`` (0 when the two top-K
  sets agree, which is when the value is exact).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Iterable, Mapping, Sequence

NOTE = ("On the tiny random model (eval/tiny_model.py) these numbers show the machinery and the ordering "
        "only, not the real model's quality.")


def first_divergence(scr_ids: Sequence[int], cold_ids: Sequence[int]) -> int | None:
    """First position where the two id lists differ; a shorter list differs where it ends."""
    for i, (a, b) in enumerate(zip(scr_ids, cold_ids)):
        if a != b:
            return i
    if len(scr_ids) != len(cold_ids):
        return min(len(scr_ids), len(cold_ids))
    return None


def agreement(scr_ids: Sequence[int], cold_ids: Sequence[int], tokens: int) -> tuple[int, float]:
    """(tokens equal up to the first divergence, that count / ``tokens``), counted within ``tokens``."""
    if tokens <= 0:
        raise ValueError(f"tokens={tokens}: must be >= 1")
    div = first_divergence(scr_ids[:tokens], cold_ids[:tokens])
    agree = min(tokens, len(scr_ids), len(cold_ids)) if div is None else div
    return agree, agree / tokens


def max_abs_dlogprob(scr_logprobs: Sequence[float], cold_logprobs: Sequence[float], upto: int) -> float | None:
    """Largest |Δ| of the chosen tokens' logprobs over positions ``[0, upto)``; None when ``upto`` is 0."""
    pairs = list(zip(scr_logprobs, cold_logprobs))[:upto]
    if not pairs:
        return None
    return max(abs(a - b) for a, b in pairs)


def _log_normalise(logprobs: Sequence[float]) -> list[float]:
    top = max(logprobs)
    log_total = top + math.log(sum(math.exp(v - top) for v in logprobs))
    return [v - log_total for v in logprobs]


@dataclass(frozen=True)
class TopKKl:
    kl: float  # KL(cold || scr) over the cold top-K set, both renormalised over it
    missing: int  # tokens of the cold set absent from scr's top-K (their scr logprob was bounded)
    overlap: int  # tokens in both top-K sets


def kl_topk(cold_top: Iterable[tuple[float, int]], scr_top: Iterable[tuple[float, int]]) -> TopKKl:
    """KL(cold || scr) of one position over the cold top-K set (see the module docstring)."""
    cold = {token: lp for lp, token in cold_top}
    scr = {token: lp for lp, token in scr_top}
    if not cold:
        raise ValueError("the cold read has no top logprobs")
    if not scr:
        raise ValueError("the scr answer has no top logprobs")
    floor = min(scr.values())
    tokens = sorted(cold)
    p = _log_normalise([cold[t] for t in tokens])
    q = _log_normalise([scr.get(t, floor) for t in tokens])
    kl = sum(math.exp(lp) * (lp - lq) for lp, lq in zip(p, q))
    overlap = sum(1 for t in tokens if t in scr)
    # Rounding can leave a tiny negative value for identical distributions.
    return TopKKl(max(kl, 0.0), len(tokens) - overlap, overlap)


def compare_outputs(scr: Mapping, cold: Mapping, tokens: int) -> dict:
    """Fidelity fields of one request from two parsed answers.

    ``scr`` / ``cold``: ``{"output_ids": [...], "logprobs": [...], "top": [[(lp, id), ...], ...]}``
    (the chosen tokens' logprobs and the per-position top-K lists, as ``parse_answer`` returns).
    """
    div = first_divergence(scr["output_ids"][:tokens], cold["output_ids"][:tokens])
    agree, fraction = agreement(scr["output_ids"], cold["output_ids"], tokens)
    kl = kl_topk(cold["top"][0], scr["top"][0])
    return {
        "agree_tokens": agree, "greedy_agreement": fraction, "first_divergence": div,
        "max_abs_dlogprob": max_abs_dlogprob(scr["logprobs"], cold["logprobs"], agree),
        "kl_first": kl.kl, "kl_missing": kl.missing, "topk_overlap": kl.overlap,
    }


def _mean(values: list[float]) -> float | None:
    return sum(values) / len(values) if values else None


def _max(values: list[float]) -> float | None:
    return max(values) if values else None


def arm_summary(rows: Sequence[Mapping]) -> dict:
    """Per-arm numbers of the table; moved share is averaged over rows whose events are known."""
    shares = [r["moved_share"] for r in rows if r.get("moved_share") is not None]
    kls = [r["kl_first"] for r in rows if r.get("kl_first") is not None]
    dlps = [r["max_abs_dlogprob"] for r in rows if r.get("max_abs_dlogprob") is not None]
    known = [r for r in rows if r.get("moved") is not None]
    return {
        "requests": len(rows),
        "relocated": sum(1 for r in known if r["moved"] > 0) if known else None,
        "mean_moved_share": _mean(shares),
        "greedy_agreement": _mean([r["greedy_agreement"] for r in rows]),
        "identical": sum(1 for r in rows if r["first_divergence"] is None),
        "mean_kl": _mean(kls),
        "max_kl": _max(kls),
        "max_abs_dlogprob": _max(dlps),
    }


def summarise(rows: Sequence[Mapping]) -> dict[str, dict]:
    """``arm_summary`` per arm, arms in first-seen order."""
    arms: dict[str, list] = {}
    for row in rows:
        arms.setdefault(row["arm"], []).append(row)
    return {arm: {"knobs": _knob_text(arm_rows[0]), **arm_summary(arm_rows)} for arm, arm_rows in arms.items()}


def _knob_text(row: Mapping) -> str:
    knobs = row.get("knobs") or {}
    return ",".join(f"{k}={v}" for k, v in knobs.items()) or "none (server settings)"


def fmt(value, kind: str = "g") -> str:
    """One table cell: ``unknown`` for None; shares as %, floats in 4 significant digits."""
    if value is None:
        return "unknown" if kind in ("share", "count") else "-"
    if kind == "share":
        return f"{value:.1%}"
    if kind == "count":
        return str(value)
    if isinstance(value, float):
        return f"{value:.4g}"
    return str(value)


ARM_COLUMNS = (
    ("arm", "arm", "s"), ("knobs", "knobs", "s"), ("requests", "requests", "count"),
    ("relocated", "relocated", "count"), ("mean_moved_share", "mean moved share", "share"),
    ("greedy_agreement", "greedy agreement", "share"), ("identical", "identical answers", "count"),
    ("mean_kl", "mean KL(1st)", "g"), ("max_kl", "max KL(1st)", "g"),
    ("max_abs_dlogprob", "max abs Δlogprob", "g"),
)
ROW_COLUMNS = (
    ("scenario", "scenario", "s"), ("turn", "turn", "s"), ("arm", "arm", "s"), ("rid", "rid", "s"),
    ("prompt_tokens", "prompt", "count"), ("moved", "moved", "count"), ("blocks", "blocks", "count"),
    ("moved_share", "moved share", "share"), ("greedy_agreement", "agreement", "share"),
    ("first_divergence", "first divergence", "s"), ("max_abs_dlogprob", "max abs Δlogprob", "g"),
    ("kl_first", "KL(1st)", "g"), ("kl_missing", "KL bounded", "count"),
)


def _table(columns, records: Sequence[Mapping]) -> list[str]:
    lines = ["| " + " | ".join(label for _, label, _ in columns) + " |",
             "|" + "|".join("---" if kind == "s" else "---:" for _, _, kind in columns) + "|"]
    for record in records:
        cells = []
        for key, _, kind in columns:
            value = record.get(key)
            cells.append("none" if key == "first_divergence" and value is None else fmt(value, kind))
        lines.append("| " + " | ".join(cells) + " |")
    return lines


def markdown(summary: Mapping[str, Mapping], rows: Sequence[Mapping], tokens: int, top: int) -> str:
    """``table.md``: the note, the per-arm summary, then one line per request."""
    arms = [{"arm": arm, **values} for arm, values in summary.items()]
    lines = [
        f"Fidelity of scr answers against a cold read of the same prompt ({tokens} greedy tokens, "
        f"KL of the first token over the cold top-{top}).",
        "",
        f"**Note:** {NOTE}",
        "",
        *_table(ARM_COLUMNS, arms),
        "",
        *_table(ROW_COLUMNS, rows),
        "",
        "greedy agreement = tokens equal up to the first divergence / N; max abs Δlogprob = largest "
        "|Δ logprob| of the chosen tokens before it; KL(cold || scr) renormalised over the cold top-K set "
        "(KL bounded = cold top-K tokens missing from scr's top-K, given scr's smallest listed logprob); "
        "moved share = moved / prompt tokens (unknown without --events).",
    ]
    return "\n".join(lines)
