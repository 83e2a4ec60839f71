"""Grading a run's answers (``docs/eval.md`` §1.7-§1.8): one ``judge/<qid>.json`` per question.

Only completed questions are sent to the judge; the others are wrong without a judgment. A judge
reply that does not parse is a judge failure: recorded, counted wrong, never a result.
"""
# Spec: docs/eval.md

from __future__ import annotations

import hashlib
import json
from pathlib import Path

from eval.bcp import journal as journal_mod
from eval.bcp.manifest import MANIFEST, load_run
from eval.bcp.server_info import served_model_name


def judge_one(judge, query, record: dict, run_dir: Path) -> dict:
    """Grade one run record (completed ones only; others are wrong without a judgment, §1.7) and
    store ``judge/<qid>.json``. A judge reply that does not parse is a judge failure: recorded,
    counted wrong, never a result."""
    path = run_dir / "judge" / f"{journal_mod.safe_qid(query.query_id)}.json"
    if record.get("status") != "completed":
        judgment = {"query_id": query.query_id, "judged": False, "correct": False, "parse_error": False,
                    "reason": f"status {record.get('status')!r}: scored wrong without judging"}
    else:
        response = record["result"][-1]["output"]
        try:
            judgment = dict(judge.grade(query, response))
        except Exception as exc:  # a judge that fails is recorded, not fatal
            judgment = {"correct": False, "parse_error": True, "judge_error": f"{type(exc).__name__}: {exc}"}
        judgment = {"query_id": query.query_id, "judged": True, **judgment}
        judgment["correct"] = bool(judgment.get("correct")) and not judgment.get("parse_error")
    journal_mod.write_json_atomic(path, judgment)
    return judgment


class JudgeAdapter:
    """Wraps ``eval/bcp/judge.py``'s ``Judge`` as ``grade(query, response) -> dict``: the verdict,
    and ``parse_error`` (with the parser's reason and the raw judge text) when the reply is not a
    judgment."""

    def __init__(self, judge):
        self.judge = judge

    def grade(self, query, response: str) -> dict:
        result = self.judge.judge(query.text, response, query.answer)
        judgment = result.judgment
        return {"correct": result.correct, "parse_error": result.error is not None, "error": result.error,
                "confidence": result.confidence, "extracted_answer": judgment.extracted_answer if judgment else None,
                "cached": result.cached, "key": result.key, "raw": result.raw}

    def describe(self) -> dict:
        return {"model": self.judge.model, "decoding": self.judge.decoding,
                "template_sha256": hashlib.sha256(self.judge.template.encode()).hexdigest()[:16]}


def make_judge(url: str, model: str | None, cache_path: Path, max_tokens: int = 4096) -> JudgeAdapter:
    """The judge server at ``url`` (its first served model unless ``model`` is given)."""
    from eval.bcp import judge as judge_mod

    model = model or served_model_name(url) or "default"
    return JudgeAdapter(judge_mod.Judge(url, model=model, cache_path=cache_path, max_tokens=max_tokens))


def judge_run(run_dir: Path, judge, queries_by_id: dict) -> list[dict]:
    """Judge every finished question of the run and record the judge in the manifest."""
    manifest, records = load_run(run_dir)
    out = [judge_one(judge, queries_by_id[record["query_id"]], record, run_dir) for record in records]
    manifest["judge"] = judge.describe() if hasattr(judge, "describe") else {}
    journal_mod.write_json_atomic(run_dir / MANIFEST, manifest)
    return out


def read_judgments(run_dir: Path) -> dict[str, dict]:
    judged = {}
    for path in sorted((run_dir / "judge").glob("*.json")) if (run_dir / "judge").is_dir() else []:
        data = json.loads(path.read_text())
        judged[str(data["query_id"])] = data
    return judged
