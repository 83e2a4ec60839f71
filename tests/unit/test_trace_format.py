"""The trace reader (``eval/traces/format.py``): every kind of bad line is an error naming the
file and line, good lines round-trip, turns must follow each other per conversation."""

from __future__ import annotations

import json

import pytest

from eval.traces.format import (TraceCall, TraceError, by_conversation, parse_line, read_trace, trace_render,
                                write_trace)

GOOD = {"conversation": "q1", "turn": 0, "prompt_ids": [1, 2, 3], "completion_ids": [4], "cache_salt": None}


def line(**changes) -> str:
    data = {**GOOD, **changes}
    return json.dumps({k: v for k, v in data.items() if v is not ...})


@pytest.mark.parametrize("text, message", [
    ("{not json", "not JSON"),
    ("[1, 2]", "a JSON object"),
    (line(turn=...), "missing field(s) turn"),
    (line(cache_salt=...), "missing field(s) cache_salt"),
    (line(promt_ids=[1]), "unknown field(s) promt_ids"),
    (line(conversation=""), "conversation must be a non-empty string"),
    (line(conversation=7), "conversation must be a non-empty string"),
    (line(conversation="a b"), "white space"),
    (line(turn=-1), "turn must be an integer >= 0"),
    (line(turn=True), "turn must be an integer >= 0"),
    (line(turn=1.0), "turn must be an integer >= 0"),
    (line(prompt_ids=[]), "prompt_ids is empty"),
    (line(prompt_ids=[1, -2]), "prompt_ids must be a list of integer token ids"),
    (line(prompt_ids=[1, "2"]), "prompt_ids must be a list of integer token ids"),
    (line(completion_ids=[True]), "completion_ids must be a list of integer token ids"),
    (line(completion_ids=None), "completion_ids must be a list of integer token ids"),
    (line(cache_salt=5), "cache_salt must be a string or null"),
    (line(messages={}), "messages must be a list"),
    (line(meta=[]), "meta must be a dict"),
    (line(kind=3), "kind must be a str"),
    (line(meta={"render": "keep"}), "meta.render must be one of default, preserve"),
])
def test_bad_lines_name_the_place_and_the_problem(text, message):
    with pytest.raises(TraceError) as info:
        parse_line(text, "t.jsonl:7")
    assert str(info.value).startswith("t.jsonl:7: ") and message in str(info.value)


def test_file_errors_name_the_line(tmp_path):
    path = tmp_path / "t.jsonl"
    path.write_text(line() + "\n" + line(turn=2) + "\n")
    with pytest.raises(TraceError, match=r"t\.jsonl:2: conversation 'q1' turn 2, expected 1"):
        read_trace(path)
    path.write_text(line() + "\n\n")
    with pytest.raises(TraceError, match=r"t\.jsonl:2: blank line"):
        read_trace(path)


def test_round_trip_and_grouping(tmp_path):
    calls = [TraceCall("q1", 0, [1, 2], [3], None), TraceCall("q2", 0, [5], [], "tenant"),
             TraceCall("q1", 1, [1, 2, 3, 9], [7, 8], None, kind="search", meta={"nudged": True})]
    path = tmp_path / "t.jsonl"
    assert write_trace(calls, path) == 3
    assert read_trace(path) == calls
    assert [c.turn for c in by_conversation(calls)["q1"]] == [0, 1]
    assert calls[2].rid("bench") == "bench.q1.1"
    assert "messages" not in path.read_text().splitlines()[0]  # optional fields left out when empty


def test_a_file_has_one_rendering(tmp_path):
    """meta.render (eval/render.py) is the same on every line: one run, one rendering."""
    path = tmp_path / "t.jsonl"
    path.write_text(line(meta={"render": "preserve"}) + "\n" + line(turn=1, meta={"render": "default"}) + "\n")
    with pytest.raises(TraceError, match=r"t\.jsonl:2: meta.render 'default', earlier lines say 'preserve'"):
        read_trace(path)
    path.write_text(line(meta={"render": "preserve"}) + "\n" + line(turn=1) + "\n")
    assert trace_render(read_trace(path)) == "preserve"


def test_trace_render_falls_back_to_the_chat_template_kwargs_then_default():
    def calls(**fields):
        return [TraceCall("q1", 0, [1], [2], None, **fields)]

    assert trace_render(calls(meta={"render": "preserve"})) == "preserve"
    assert trace_render(calls(chat_template_kwargs={"enable_thinking": True, "preserve_thinking": True})) == "preserve"
    assert trace_render(calls(chat_template_kwargs={"enable_thinking": False})) == "default"
    assert trace_render(calls()) == "default" and trace_render([]) == "default"
    with pytest.raises(TraceError, match="mixes renderings"):
        trace_render(calls(meta={"render": "preserve"}) + calls(meta={"render": "default"}))
