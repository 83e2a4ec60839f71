"""The metrics of a judged run (``docs/eval.md`` §1.9): ``scores.json``, ``summary.json``,
``per_question.csv`` and BCP's ``evaluation_summary.json``.

Unjudged or unparsable questions count wrong, and the summary's ``not_a_result`` says why a run is
not a result (judge failures, unjudged questions, a stub server, a run stamped ``--not-a-result``).
"""
# Spec: docs/eval.md

from __future__ import annotations

import csv
import dataclasses
import time
from pathlib import Path

from eval.bcp import journal as journal_mod
from eval.bcp.judging import read_judgments
from eval.bcp.manifest import load_run

PER_QUESTION_FIELDS = ("query_id", "status", "judged", "correct", "parse_error", "confidence", "search_calls",
                       "recall", "lm_calls", "steps", "free_ctx_turns", "ctx_accepted", "ctx_rejected", "nudges",
                       "retries_on_limit", "prompt_tokens", "completion_tokens", "wall_s")


def per_question_row(record: dict, judgment: dict, query) -> dict:
    """One ``per_question.csv`` row: the verdict, evidence recall and the agent's counters."""
    evidence = set(query.evidence_docids)
    retrieved = set(record.get("retrieved_docids") or [])
    stats = record.get("agent_stats", {})
    return {
        "query_id": record["query_id"], "status": record["status"], "judged": bool(judgment.get("judged")),
        "correct": bool(judgment.get("correct")), "parse_error": bool(judgment.get("parse_error")),
        "confidence": judgment.get("confidence"),
        "search_calls": sum(v for k, v in record.get("tool_call_counts", {}).items() if "search" in k or "retrieval" in k),
        "recall": (len(retrieved & evidence) / len(evidence)) if evidence else None,
        "lm_calls": stats.get("lm_calls", 0), "steps": record.get("steps", 0),
        "free_ctx_turns": stats.get("free_ctx_turns", 0), "ctx_accepted": stats.get("ctx_accepted", 0),
        "ctx_rejected": stats.get("ctx_rejected", 0), "nudges": stats.get("nudges", 0),
        "retries_on_limit": stats.get("retries_on_limit", 0),
        "prompt_tokens": record["tokens"]["prompt"], "completion_tokens": record["tokens"]["completion"],
        "wall_s": record.get("wall_s"),
    }


def metrics_input(records: list[dict], judgments: dict, queries_by_id: dict) -> list[dict]:
    """One evaluation record per question, in the shape ``metrics.score_run`` reads."""
    out = []
    for record in records:
        qid = record["query_id"]
        judgment = judgments.get(qid, {})
        query = queries_by_id[qid]
        out.append({
            "query_id": qid, "status": record["status"],
            "correct": (bool(judgment.get("correct")) if judgment.get("judged") and not judgment.get("parse_error")
                        else None),
            "parse_error": bool(judgment.get("parse_error")), "confidence": judgment.get("confidence"),
            "retrieved_docids": record.get("retrieved_docids") or [], "evidence_docids": list(query.evidence_docids),
            "gold_docids": list(query.gold_docids), "tool_call_counts": record.get("tool_call_counts") or {},
            "response": record["result"][-1]["output"] if record.get("result") else "",
        })
    return out


def not_a_result_reasons(manifest: dict, rows: list[dict]) -> list[str]:
    reasons = []
    if manifest.get("not_a_result"):
        reasons.append(str(manifest["not_a_result"]))
    if manifest.get("server", {}).get("kind") != "real":
        reasons.append(f"server kind {manifest.get('server', {}).get('kind')!r}")
    parse_errors = sum(r["parse_error"] for r in rows)
    if parse_errors:
        reasons.append(f"{parse_errors} judge failure(s): the judge's output did not parse")
    unjudged = sum(1 for r in rows if r["status"] == "completed" and not r["judged"])
    if unjudged:
        reasons.append(f"{unjudged} completed question(s) not judged")
    return reasons


def run_summary(manifest: dict, rows: list[dict], scores: dict) -> dict:
    return {
        "run_id": manifest.get("run_id"), "policy": manifest.get("policy"), "questions": len(rows),
        "completed": sum(r["status"] == "completed" for r in rows),
        "judged": sum(r["judged"] for r in rows),
        "judge_parse_errors": sum(r["parse_error"] for r in rows),
        "correct": sum(r["correct"] for r in rows),
        "not_a_result": not_a_result_reasons(manifest, rows),
        "metrics": scores,
        "tokens": {"prompt": sum(r["prompt_tokens"] for r in rows), "completion": sum(r["completion_tokens"] for r in rows)},
    }


def write_scores(run_dir: Path, manifest: dict, summary: dict, rows: list[dict]) -> None:
    from eval.bcp import metrics

    journal_mod.write_json_atomic(run_dir / "scores.json", {"summary": summary, "per_question": rows})
    journal_mod.write_json_atomic(run_dir / "summary.json", summary)
    journal_mod.write_json_atomic(run_dir / "evaluation_summary.json", metrics.bcp_summary(
        summary["metrics"], llm=str(manifest.get("model", {}).get("served")),
        retriever=manifest.get("retrieval", {}).get("backend", ""), date=time.strftime("%Y-%m-%d")))
    with open(run_dir / "per_question.csv", "w", newline="") as f:
        writer = csv.DictWriter(f, fieldnames=PER_QUESTION_FIELDS)
        writer.writeheader()
        writer.writerows(rows)


def score(run_dir: Path, queries_by_id: dict) -> dict:
    """Metrics of the run (§1.9) from run files + judgments; writes scores.json, per_question.csv,
    summary.json. Unjudged or unparsable questions count wrong; their numbers are reported."""
    from eval.bcp import metrics

    manifest, records = load_run(run_dir)
    judgments = read_judgments(run_dir)
    rows = [per_question_row(r, judgments.get(r["query_id"], {}), queries_by_id[r["query_id"]]) for r in records]
    scores = metrics.score_run(metrics_input(records, judgments, queries_by_id))
    scores = scores if isinstance(scores, dict) else dataclasses.asdict(scores)
    summary = run_summary(manifest, rows, scores)
    write_scores(run_dir, manifest, summary, rows)
    return summary
