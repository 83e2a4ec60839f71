"""eval.bcp.judge: the strict parser, prompt rendering, request payload and the on-disk cache."""

from __future__ import annotations

import json

import pytest

from eval.bcp.judge import (Judge, JudgeError, Judgment, JudgmentParseError, chat_completions_url,
                            parse_judgment, render, TEMPLATES)

PLAIN = """extracted_final_answer: Bradaxos

reasoning: The response names Bradaxos, which is the correct answer.

correct: yes

confidence: 85%"""


GOOD = [
    pytest.param(PLAIN, Judgment(True, "Bradaxos", 85.0, "The response names Bradaxos, which is the correct answer."),
                 id="plain"),
    pytest.param("**extracted_final_answer:** Paris\n**reasoning:** differs\n**correct:** no\n**confidence:** 40",
                 Judgment(False, "Paris", 40.0, "differs"), id="bold-colon-inside"),
    pytest.param("**extracted_final_answer**: 1931\n**reasoning**: same year\n**correct**: Yes\n**confidence**: 100%",
                 Judgment(True, "1931", 100.0, "same year"), id="bold-colon-outside"),
    pytest.param("extracted_final_answer: x\nreasoning: r\ncorrect: yes",
                 Judgment(True, "x", 100.0, "r"), id="confidence-absent-is-100"),
    pytest.param("correct: no", Judgment(False, None, 100.0, ""), id="verdict-only"),
    pytest.param("CORRECT: NO\nConfidence: 150", Judgment(False, None, 100.0, ""), id="upper-case-clipped-high"),
    pytest.param("correct: yes\nconfidence: -5%", Judgment(True, None, 0.0, ""), id="clipped-low"),
    pytest.param("correct: **yes**.\nconfidence: 72.5 %", Judgment(True, None, 72.5, ""), id="bold-value-decimal"),
    pytest.param("<think>correct: no, maybe?\nconfidence: high</think>\ncorrect: yes\nconfidence: 60",
                 Judgment(True, None, 60.0, ""), id="think-block-ignored"),
    pytest.param("Here is my grading.\n\n- extracted_final_answer: A\n- reasoning: line one\nline two\n- correct: no",
                 Judgment(False, "A", 100.0, "line one\nline two"), id="bullets-multiline-reasoning"),
    pytest.param("extracted_final_answer: Q\n\n[correct_answer]: Q\n\nreasoning: match\n\ncorrect: yes\n\nconfidence: 90",
                 Judgment(True, "Q", 90.0, "match"), id="bcp-repeats-correct-answer"),
    pytest.param("correct_answer: Paris\ncorrect: yes", Judgment(True, None, 100.0, ""), id="correct-answer-not-verdict"),
    pytest.param("extracted final answer: 7\ncorrect: yes", Judgment(True, "7", 100.0, ""), id="spaces-in-label"),
    pytest.param("correct: yes\ncorrect: Yes", Judgment(True, None, 100.0, ""), id="repeated-same-verdict"),
]


@pytest.mark.parametrize("text, expected", GOOD)
def test_parse_good(text, expected):
    assert parse_judgment(text) == expected


BAD = [
    pytest.param("", "no 'correct:' verdict", id="empty"),
    pytest.param("extracted_final_answer: x\nreasoning: fine\nconfidence: 90", "no 'correct:' verdict", id="no-verdict"),
    pytest.param("The answer is correct.", "no 'correct:' verdict", id="prose"),
    pytest.param("correct: maybe", "not yes/no", id="maybe"),
    pytest.param("correct: not sure", "not yes/no", id="not-sure"),
    pytest.param("correct:", "not yes/no", id="empty-verdict"),
    pytest.param("correct: yes\ncorrect: no", "conflicting verdicts", id="conflict"),
    pytest.param("correct: yes\nconfidence: high", "not a number", id="word-confidence"),
    pytest.param("correct: yes\nconfidence: 80\nconfidence: 90", "conflicting confidences", id="two-confidences"),
    pytest.param("<think>correct: yes", "unterminated", id="unterminated-think"),
    pytest.param("correct - yes", "no 'correct:' verdict", id="dash-not-colon"),
]


@pytest.mark.parametrize("text, message", BAD)
def test_parse_bad_raises(text, message):
    with pytest.raises(JudgmentParseError, match=message):
        parse_judgment(text)


def test_render_fills_once_and_keeps_braces():
    for template in TEMPLATES.values():
        prompt = render(template, "Q?", "Answer {correct_answer} {x}", "A")
        assert "[question]: Q?" in prompt and "[correct_answer]: A" in prompt
        assert "Answer {correct_answer} {x}" in prompt  # the response's braces are not substituted
        for label in ("extracted_final_answer:", "reasoning:", "correct:", "confidence:"):
            assert label in prompt
    with pytest.raises(ValueError, match="placeholder"):
        render("no placeholders", "q", "r", "a")


class FakePost:
    def __init__(self, replies):
        self.replies = list(replies)
        self.payloads = []

    def __call__(self, payload):
        self.payloads.append(payload)
        return {"choices": [{"message": {"role": "assistant", "content": self.replies.pop(0)}}]}


def test_payload_is_temperature_zero_single_user_message(tmp_path):
    post = FakePost([PLAIN])
    judge = Judge(post, "judge-model", tmp_path / "cache.jsonl")
    result = judge.judge("Q?", "Exact Answer: Bradaxos", "Bradaxos")
    assert result.correct and result.confidence == 85.0 and not result.cached and result.error is None
    (payload,) = post.payloads
    assert payload["model"] == "judge-model" and payload["temperature"] == 0.0 and payload["max_tokens"] == 4096
    assert payload["chat_template_kwargs"] == {"enable_thinking": False}
    assert [m["role"] for m in payload["messages"]] == ["user"]
    assert payload["messages"][0]["content"] == render(TEMPLATES["bcp"], "Q?", "Exact Answer: Bradaxos", "Bradaxos")
    assert "chat_template_kwargs" not in Judge(post, "m", None, enable_thinking=None).payload("p")


def test_cache_hit_avoids_a_second_call_across_instances(tmp_path):
    cache = tmp_path / "judge" / "cache.jsonl"
    post = FakePost([PLAIN, "correct: no\nconfidence: 10"])
    first = Judge(post, "judge-model", cache).judge("Q?", "resp", "Bradaxos")
    again = Judge(post, "judge-model", cache)
    hit = again.judge("Q?", "resp", "Bradaxos")
    assert len(post.payloads) == 1 and again.num_calls == 0
    assert hit.cached and hit.judgment == first.judgment and hit.key == first.key
    # Any change of question, response, answer, model or template is a miss.
    miss = Judge(post, "other-model", cache).judge("Q?", "resp", "Bradaxos")
    assert not miss.cached and not miss.correct and len(post.payloads) == 2
    assert len(cache.read_text().splitlines()) == 2


@pytest.mark.parametrize("change", ["question", "response", "answer", "model", "template"])
def test_cache_key_covers_inputs(tmp_path, change):
    base = Judge(FakePost([]), "m", None)
    other = Judge(FakePost([]), "m2" if change == "model" else "m", None,
                  template="browsecomp" if change == "template" else "bcp")
    args = {"question": "q", "response": "r", "answer": "a"}
    if change in args:
        args[change] += "!"
    assert base.key("q", "r", "a") != other.key(args["question"], args["response"], args["answer"])


def test_parse_error_is_a_wrong_result_and_is_cached(tmp_path):
    post = FakePost(["I think it is right."])
    judge = Judge(post, "m", tmp_path / "c.jsonl")
    result = judge.judge("q", "r", "a")
    assert result.judgment is None and not result.correct and "verdict" in result.error
    assert result.raw == "I think it is right." and result.confidence is None
    assert Judge(post, "m", tmp_path / "c.jsonl").judge("q", "r", "a").cached


def test_bad_endpoint_reply_raises_and_is_not_cached(tmp_path):
    judge = Judge(lambda payload: {"error": "overloaded"}, "m", tmp_path / "c.jsonl")
    with pytest.raises(JudgeError):
        judge.judge("q", "r", "a")
    assert not (tmp_path / "c.jsonl").exists()


def test_truncated_cache_line_is_skipped(tmp_path):
    cache = tmp_path / "c.jsonl"
    post = FakePost([PLAIN])
    Judge(post, "m", cache).judge("q", "r", "a")
    cache.write_text(cache.read_text() + '{"key": "abc", "ra')
    with pytest.warns(UserWarning, match="unreadable"):
        assert Judge(post, "m", cache).judge("q", "r", "a").cached


@pytest.mark.parametrize("url, expected", [
    ("http://127.0.0.1:8000", "http://127.0.0.1:8000/v1/chat/completions"),
    ("http://h:1/v1/", "http://h:1/v1/chat/completions"),
    ("http://h:1/v1/chat/completions", "http://h:1/v1/chat/completions"),
])
def test_chat_completions_url(url, expected):
    assert chat_completions_url(url) == expected


def test_http_post_round_trip(tmp_path):
    """The URL form of ``post`` against a loopback server (no external network)."""
    import threading
    from http.server import BaseHTTPRequestHandler, HTTPServer

    seen = []

    class Handler(BaseHTTPRequestHandler):
        def do_POST(self):
            seen.append((self.path, json.loads(self.rfile.read(int(self.headers["Content-Length"])))))
            body = json.dumps({"choices": [{"message": {"content": "correct: yes"}}]}).encode()
            self.send_response(200)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, *args):
            pass

    server = HTTPServer(("127.0.0.1", 0), Handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        judge = Judge(f"http://127.0.0.1:{server.server_port}", "m", None)
        assert judge.judge("q", "r", "a").correct
    finally:
        server.shutdown()
        server.server_close()
    assert seen[0][0] == "/v1/chat/completions" and seen[0][1]["model"] == "m"
