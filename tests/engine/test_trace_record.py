"""Recording a trace from a served run: ``--cache-trace`` writes the exact ids the server read and
produced (checked against the ``/generate`` answers and the tokenizer's rendering of a chat
prompt), ``eval.traces.record`` joins them into a trace; and the long-context tiny model
(``max_positions=131072``) serves a 10,000-token prompt (past the default tiny model's 8,192
positions) with ``--context-length 16384`` under ``scr``, whose start-up check needs the rotary
table to cover the context length."""

from __future__ import annotations

import json

import pytest
from transformers import AutoTokenizer

from eval.server import output_record
from eval.tiny_model import LONG_CONTEXT_POSITIONS, cached_build
from eval.traces.format import read_trace
from eval.traces.record import ServerTrace, record_trace
from tests.conftest import ARTIFACTS
from tests.engine.conftest import RADIX_ARGS, start_server
from tests.engine.prompts import prompt_ids

pytestmark = pytest.mark.engine

MESSAGES = [{"role": "system", "content": "Be brief."},
            {"role": "user", "content": "Which build step missed the cache, and why?"}]


@pytest.fixture(scope="module")
def traced_server(tiny_model_dir, tmp_path_factory):
    tmp = tmp_path_factory.mktemp("trace")
    server = start_server(tiny_model_dir, tmp, "radix-trace",
                          [*RADIX_ARGS, "--cache-policy", "radix", "--cache-trace", str(tmp / "server_trace.jsonl")])
    server.trace_path = tmp / "server_trace.jsonl"
    yield server
    server.stop()
    assert server.fatal_lines() == [], server.log_tail()


def test_long_context_model_serves_a_prompt_past_the_default_8k(tmp_path):
    model = cached_build(ARTIFACTS, max_positions=LONG_CONTEXT_POSITIONS)
    config = json.loads((model / "config.json").read_text())
    assert config["text_config"]["max_position_embeddings"] == LONG_CONTEXT_POSITIONS
    server = start_server(model, tmp_path, "long-scr", [
        "--context-length", "16384", "--max-total-tokens", "20480", "--chunked-prefill-size", "4096",
        "--max-running-requests", "1", "--cache-policy", "scr", "--cache-policy-set", "side_sessions=1",
        "--cache-policy-set", "side_tokens=4096"], state_pool=False)
    try:
        prompt = prompt_ids(21, 10_000)  # past the default tiny model's 8,192 positions
        record = output_record(server.generate(prompt, 4, rid="long.0"))
        # All of it read (nothing cached), so positions 8,192 .. 9,999 went through the model.
        assert (record["prompt_tokens"], record["cached_tokens"], len(record["output_ids"])) == (10_000, 0, 4)
        # scr started: its rotary check passed (table rows >= the context length)
        assert "rotary=True" in server.log_text()
    finally:
        server.stop()
    assert server.fatal_lines() == [], server.log_tail()
    # The values: the independent reference (chunked GDN form, fresh RoPE at every position) reads the
    # same 10,000 tokens; a RoPE table cut at 8,192 or a wrong position past it would not agree.
    from tests.engine.conftest import assert_equals_reference
    from tests.reference.hybrid_reference import Reference

    assert_equals_reference(Reference(model, gdn="chunk"), prompt, record, "10,000-token read")


def test_server_trace_has_the_exact_ids(traced_server, tiny_model_dir, tmp_path):
    sent = {}
    for turn, (seed, salt) in enumerate([(11, None), (12, "tenant-a"), (11, None)]):
        rid = f"tr.g.{turn}"
        prompt = prompt_ids(seed, 70 + turn)
        extra = {"extra_key": salt} if salt else {}
        sent[rid] = (prompt, output_record(traced_server.generate(prompt, 5, rid=rid, **extra))["output_ids"], salt)
    chat = traced_server.chat(MESSAGES, max_tokens=6, ignore_eos=True, rid="tr.chat.0", cache_salt="tenant-b")
    server = ServerTrace(traced_server.trace_path, [*sent, "tr.chat.0"])
    server.wait(timeout=15)
    assert server.missing() == []
    for rid, (prompt, output, salt) in sent.items():
        row = server.finished[rid]
        assert (row["prompt_ids"], row["completion_ids"], row["cache_salt"]) == (prompt, output, salt)
        assert row["finish_reason"] == "length"
    tokenizer = AutoTokenizer.from_pretrained(tiny_model_dir)
    rendered = tokenizer.apply_chat_template(MESSAGES, add_generation_prompt=True, tokenize=True,
                                             return_dict=True)["input_ids"]
    row = server.finished["tr.chat.0"]
    assert row["prompt_ids"] == list(rendered) and row["cache_salt"] == "tenant-b"
    assert len(row["completion_ids"]) == chat["usage"]["completion_tokens"] == 6

    calls = [(rid, "g", turn) for turn, rid in enumerate(sent)] + [("tr.chat.0", "chat", 0, MESSAGES, "chat")]
    trace = record_trace(traced_server.trace_path, calls, tmp_path / "trace.jsonl", timeout=5)
    assert read_trace(tmp_path / "trace.jsonl") == trace
    assert [c.prompt_ids for c in trace[:3]] == [p for p, _, _ in sent.values()]
    assert trace[3].messages == MESSAGES and trace[3].prompt_ids == list(rendered)


def test_one_line_per_request(traced_server):
    rows = [json.loads(line) for line in traced_server.trace_path.read_text().splitlines()]
    assert len({row["rid"] for row in rows}) == len(rows)  # one line per request, no duplicates
