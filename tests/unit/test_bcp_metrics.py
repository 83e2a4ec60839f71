"""eval.bcp.metrics: §1.9 metrics against values computed by hand."""
# Spec: docs/eval.md

from __future__ import annotations

import math

import pytest

from eval.bcp.metrics import bcp_summary, calibration_error, citations, score_run

RECORDS = [
    {"query_id": "1", "status": "completed", "correct": True, "confidence": 90,
     "tool_call_counts": {"search": 3, "get_document": 1},
     "retrieved_docids": ["10", "30"], "evidence_docids": ["10", "20"],
     "response": "Explanation: see [10] and [11, 20] again 【10】.\nExact Answer: X\nConfidence: 90%"},
    {"query_id": "2", "status": "completed", "correct": None, "parse_error": True, "confidence": None,
     "tool_call_counts": {"local_knowledge_base_retrieval": 2},
     "retrieved_docids": ["40"], "evidence_docids": [],
     "response": "No citations here."},
    {"query_id": "3", "status": "max_iterations", "correct": True, "confidence": 80, "search_calls": 5,
     "retrieved_docids": ["50"], "evidence_docids": ["50"]},
    {"query_id": "4", "status": "completed", "correct": False, "confidence": 30, "tool_call_counts": {},
     "retrieved_docids": [], "evidence_docids": ["60", "61", "62"],
     "response": "Explanation: [60]\nExact Answer: Y"},
]


def test_hand_computed_run():
    s = score_run(RECORDS)
    assert s["num_queries"] == 4 and s["num_correct"] == 1 and s["num_completed"] == 3
    assert s["num_parse_errors"] == 1
    # Only q1 counts: q2 unparsed, q3 not completed (even though judged correct), q4 wrong.
    assert s["accuracy"] == 25.0
    # q1 1/2, q3 1/1, q4 0/3; q2 has no evidence labels and is left out.
    assert s["recall"] == pytest.approx(100 * (0.5 + 1 + 0) / 3)
    assert s["avg_tool_stats"] == {"get_document": 0.25, "search": (3 + 2 + 5 + 0) / 4}
    assert s["search_calls"] == 2.5
    assert s["calibration_items"] == 2 and s["calibration_error"] == 0.0  # < 100 items
    assert [q["correct"] for q in s["per_query_metrics"]] == [True, False, False, False]
    assert [q["recall"] for q in s["per_query_metrics"]] == [50.0, None, 100.0, 0.0]
    c = s["citations"]
    # Responses: q1 cites {10, 11, 20}, q2 none, q4 {60}. q3 has no response.
    assert c["coverage"] == pytest.approx(100 * 2 / 3)
    assert c["per_response"] == pytest.approx((3 + 0 + 1) / 3)
    assert c["precision"] == pytest.approx(100 * (2 / 3 + 1 / 1) / 2)
    assert c["recall"] == pytest.approx(100 * (2 / 2 + 1 / 3) / 2)


def test_summary_keys_and_rounding():
    summary = bcp_summary(score_run(RECORDS), llm="qwen", retriever="bm25s")
    assert summary["Accuracy (%)"] == 25.0 and summary["Recall (%)"] == 50.0
    assert summary["avg_tool_stats"] == {"get_document": 0.25, "search": 2.5}
    assert summary["Calibration Error (%)"] == 0.0 and summary["LLM"] == "qwen"
    assert round(100 / 3, 2) == bcp_summary({**score_run(RECORDS), "accuracy": 100 / 3})["Accuracy (%)"]


def _judged(n, confidence, num_correct, start=0):
    return [{"query_id": str(start + i), "correct": i < num_correct, "confidence": confidence} for i in range(n)]


@pytest.mark.parametrize("records, expected", [
    pytest.param(_judged(99, 70, 40), 0.0, id="99-items-not-computed"),
    pytest.param(_judged(100, 70, 40), 30.0, id="one-bin"),
    # Two bins of 100: |0.1 - 0| and |0.9 - 1| -> sqrt(0.5*0.01 + 0.5*0.01) = 0.1.
    pytest.param(_judged(100, 10, 0) + _judged(100, 90, 100, start=100), 10.0, id="two-bins"),
    # 250 items: bins [0,100) and [100,250) (the last absorbs the remainder); the sorted order puts
    # the 50% items first even though they come last in the input.
    pytest.param(_judged(150, 80, 60) + _judged(100, 50, 50, start=150),
                 100 * math.sqrt(150 / 250 * 0.4 ** 2), id="remainder-in-last-bin"),
    pytest.param(_judged(100, 100, 100) + _judged(100, 0, 0, start=100), 0.0, id="perfect"),
])
def test_calibration_error(records, expected):
    assert score_run(records)["calibration_error"] == pytest.approx(expected, abs=1e-9)


def test_calibration_excludes_unjudged_and_incomplete():
    good = _judged(100, 70, 40)
    noise = [{"query_id": "x1", "correct": None, "confidence": None},
             {"query_id": "x2", "status": "failed", "correct": True, "confidence": 0}]
    s = score_run(good + noise)
    assert s["calibration_items"] == 100 and s["calibration_error"] == pytest.approx(30.0)
    assert s["accuracy"] == pytest.approx(100 * 40 / 102)


def test_calibration_error_function_validates():
    with pytest.raises(ValueError):
        calibration_error([50, 60], [True])


@pytest.mark.parametrize("text, expected", [
    ("[1]", ["1"]), ("[12, 7] then [7]", ["12", "7"]), ("【3】【4】", ["3", "4"]), ("[1,2,3]", ["1", "2", "3"]),
    ("[a] [ 5 ] (6) [7 8]", []), ("see [100]]", ["100"]),
], ids=["single", "pair-dedup", "full-width", "no-spaces", "not-citations", "extra-bracket"])
def test_citations(text, expected):
    assert citations(text) == expected


def test_input_errors():
    with pytest.raises(ValueError):
        score_run([])
    with pytest.raises(ValueError, match="duplicate"):
        score_run([{"query_id": "1"}, {"query_id": "1"}])
    s = score_run([{"query_id": "1", "correct": True}])
    assert s["accuracy"] == 100.0 and s["recall"] is None and s["citations"] is None
    assert s["avg_tool_stats"] == {"search": 0.0}
