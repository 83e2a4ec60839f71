"""BCP run metrics as BCP's ``scripts_evaluation/evaluate_run.py`` defines them (docs/eval.md §1.9).

Input: one record (dict) per question of a run. Fields read:

| field              | type              | meaning                                                           |
|--------------------|-------------------|-------------------------------------------------------------------|
| ``query_id``       | str (required)    | unique within the run                                             |
| ``status``         | str               | ``"completed"`` (default) or anything else = scored wrong, unjudged |
| ``correct``        | bool or None      | the judge's verdict; None (unjudged, judge parse error) = wrong   |
| ``confidence``     | float or None     | the judge's confidence in percent [0, 100]                        |
| ``parse_error``    | bool              | the judge's reply did not parse (counted; ``correct`` is None)    |
| ``tool_call_counts`` | {name: int}     | calls per tool; else ``search_calls`` (int) counts as ``search``  |
| ``retrieved_docids`` | [str]           | union of docids returned by search calls (§1.7)                   |
| ``evidence_docids``  | [str]           | the evidence qrels of the question                                |
| ``response``       | str               | final answer text, for the citation metrics (optional)            |

Output of :func:`score_run` (percentages are 0-100, unrounded; :func:`bcp_summary` rounds to 2
decimals and uses the evaluator's key names):

* ``accuracy``: judged-correct / all records (incomplete runs and parse errors count as wrong).
* ``recall``: mean over questions *with evidence labels* of |retrieved ∩ evidence| / |evidence|;
  None if no question has labels.
* ``avg_tool_stats``: per tool name, the mean count over all records (missing = 0), with names
  containing "retrieval" counted as ``search``; ``search_calls`` is its ``search`` entry.
* ``calibration_error``: Hendrycks' binned RMS calibration error (p=2, β=100) over completed,
  judged records with a confidence: sort by confidence, bins of 100 items, the last bin takes the
  remainder, sqrt(Σ_bins |bin| / N · (mean confidence − accuracy in bin)²), in percent. 0.0 when
  fewer than 100 such records (as the evaluator does). Ties in confidence are ordered by numpy's
  default ``argsort`` over the records in the given order, as in the reference implementation.
* ``citations``: parsed from ``[n]``, ``[n, m]`` and ``【n】`` in ``response`` (unique per
  response). coverage = share of responses with >= 1 citation; per_response = mean number cited;
  precision = mean over responses with citations of |cited ∩ evidence| / |cited|; recall = mean
  over responses with evidence labels of |cited ∩ evidence| / |evidence|. The averaging
  denominators of precision/recall are our reading of §1.9 [U]. None when no record has a response.
"""
# Spec: docs/eval.md

from __future__ import annotations

import re
from typing import Iterable

import numpy as np

from eval.bcp.tools import SEARCH, normalize_tool_name

CALIBRATION_BETA = 100
_CITATION = re.compile(r"\[(\d+(?:\s*,\s*\d+)*)\]|【(\d+(?:\s*,\s*\d+)*)】")


def is_correct(record: dict) -> bool:
    return record.get("status", "completed") == "completed" and record.get("correct") is True


def evidence_recall(retrieved: Iterable[str], evidence: Iterable[str]) -> float | None:
    """|retrieved ∩ evidence| / |evidence| as a fraction; None without evidence labels."""
    evidence = set(evidence)
    if not evidence:
        return None
    return len(evidence & set(retrieved)) / len(evidence)


def tool_counts(record: dict) -> dict[str, int]:
    if record.get("tool_call_counts") is not None:
        counts: dict[str, int] = {}
        for name, n in record["tool_call_counts"].items():
            key = normalize_tool_name(name)
            counts[key] = counts.get(key, 0) + int(n)
        return counts
    return {SEARCH: int(record.get("search_calls", 0))}


def calibration_error(confidence: Iterable[float], correct: Iterable[bool], beta: int = CALIBRATION_BETA) -> float:
    """Binned RMS calibration error (p=2) in percent; confidence in percent, 0.0 below ``beta`` items."""
    conf = np.asarray(list(confidence), dtype=float) / 100.0
    corr = np.asarray(list(correct), dtype=float)
    if len(conf) != len(corr):
        raise ValueError("confidence and correct differ in length")
    total = len(conf)
    if total < beta:
        return 0.0
    order = np.argsort(conf)
    conf, corr = conf[order], corr[order]
    starts = list(range(0, (total // beta) * beta, beta))
    ends = starts[1:] + [total]
    squared = sum((e - s) / total * (conf[s:e].mean() - corr[s:e].mean()) ** 2 for s, e in zip(starts, ends))
    return float(np.sqrt(squared) * 100.0)


def citations(text: str) -> list[str]:
    """Unique docids cited as [n], [n, m] or 【n】, in order of first appearance."""
    found: list[str] = []
    for m in _CITATION.finditer(text):
        for docid in re.split(r"\s*,\s*", m.group(1) or m.group(2)):
            if docid not in found:
                found.append(docid)
    return found


def citation_metrics(records: list[dict]) -> dict | None:
    with_response = [r for r in records if isinstance(r.get("response"), str)]
    if not with_response:
        return None
    cited = [set(citations(r["response"])) for r in with_response]
    evidence = [set(r.get("evidence_docids") or ()) for r in with_response]
    precisions = [len(c & e) / len(c) for c, e in zip(cited, evidence) if c]
    recalls = [len(c & e) / len(e) for c, e in zip(cited, evidence) if e]
    return {
        "coverage": 100.0 * sum(bool(c) for c in cited) / len(cited),
        "per_response": sum(len(c) for c in cited) / len(cited),
        "precision": 100.0 * float(np.mean(precisions)) if precisions else None,
        "recall": 100.0 * float(np.mean(recalls)) if recalls else None,
    }


def score_run(records: list[dict]) -> dict:
    """All §1.9 metrics over one run's per-question records (see the module docstring)."""
    if not records:
        raise ValueError("no records")
    ids = [r["query_id"] for r in records]
    if len(set(ids)) != len(ids):
        raise ValueError("duplicate query_id in records")
    n = len(records)
    per_query, recalls = [], []
    for r in records:
        rec = evidence_recall(r.get("retrieved_docids") or (), r.get("evidence_docids") or ())
        if rec is not None:
            recalls.append(rec)
        per_query.append({"query_id": r["query_id"], "correct": is_correct(r),
                          "recall": None if rec is None else 100.0 * rec})
    counts = [tool_counts(r) for r in records]
    names = sorted({k for c in counts for k in c})
    avg_tools = {k: sum(c.get(k, 0) for c in counts) / n for k in names}
    judged = [r for r in records if r.get("status", "completed") == "completed"
              and r.get("correct") is not None and r.get("confidence") is not None]
    return {
        "num_queries": n,
        "num_correct": sum(q["correct"] for q in per_query),
        "num_completed": sum(r.get("status", "completed") == "completed" for r in records),
        "num_parse_errors": sum(bool(r.get("parse_error")) for r in records),
        "accuracy": 100.0 * sum(q["correct"] for q in per_query) / n,
        "recall": 100.0 * float(np.mean(recalls)) if recalls else None,
        "avg_tool_stats": avg_tools,
        "search_calls": avg_tools.get(SEARCH, 0.0),
        "calibration_items": len(judged),
        "calibration_error": calibration_error([float(r["confidence"]) for r in judged],
                                               [r["correct"] is True for r in judged]),
        "citations": citation_metrics(records),
        "per_query_metrics": per_query,
    }


def bcp_summary(scores: dict, *, llm: str = "", retriever: str = "", link: str = "", date: str = "") -> dict:
    """``evaluation_summary.json`` keys of BCP's evaluator, values rounded to 2 decimals."""
    def r2(x):
        return None if x is None else round(x, 2)

    return {
        "LLM": llm,
        "Accuracy (%)": r2(scores["accuracy"]),
        "Recall (%)": r2(scores["recall"]),
        "avg_tool_stats": {k: r2(v) for k, v in scores["avg_tool_stats"].items()},
        "Calibration Error (%)": r2(scores["calibration_error"]),
        "Retriever": retriever,
        "Link": link,
        "Evaluation Date": date,
        "per_query_metrics": scores["per_query_metrics"],
    }
