"""The patched server with ``--cache-policy radix`` on the tiny hybrid model (CPU)."""

from __future__ import annotations

import json

import pytest
from transformers import AutoTokenizer

from eval.server import output_record, wait_for_events
from tests.engine.prompts import prompt_ids

pytestmark = pytest.mark.engine


def test_chat_completion_answers(radix_server, tiny_model_dir):
    messages = [{"role": "user", "content": "Write a function that adds two numbers."}]
    response = radix_server.chat(messages, max_tokens=8, ignore_eos=True)
    tokenizer = AutoTokenizer.from_pretrained(tiny_model_dir)
    expected_prompt = tokenizer.apply_chat_template(
        messages, add_generation_prompt=True, tokenize=True, return_dict=True
    )["input_ids"]
    assert response["usage"]["prompt_tokens"] == len(expected_prompt)
    assert response["usage"]["completion_tokens"] == 8
    assert response["choices"][0]["finish_reason"] == "length"
    assert isinstance(response["choices"][0]["message"]["content"], str)


def test_repeated_prompt_hits_and_matches_the_miss_bit_for_bit(radix_server):
    prompt = prompt_ids(seed=1, length=100)
    miss = output_record(radix_server.generate(prompt, 12))
    hit = output_record(radix_server.generate(prompt, 12))
    # no_buffer keeps exact recurrent states at forward ends: 32, 64, 96 (chunk size 32),
    # and the match may cover at most len - 1 = 99 tokens.
    assert miss["cached_tokens"] == 0
    assert hit["cached_tokens"] == 96
    assert hit["output_ids"] == miss["output_ids"]
    assert hit["logprobs"] == miss["logprobs"]  # exact float equality, not a tolerance


def test_shared_prefix_resumes_at_the_deepest_state(radix_server):
    first = prompt_ids(seed=2, length=100)
    radix_server.generate(first, 4)
    branch = first[:70] + prompt_ids(seed=3, length=30)
    record = output_record(radix_server.generate(branch, 4))
    # The tree matches 70 tokens, but the deepest recurrent state on that path is at 64.
    assert record["cached_tokens"] == 64


def test_events_file_records_each_request(radix_server):
    prompt = prompt_ids(seed=4, length=80)
    sent = {}
    for rid in ("events-a", "events-b"):
        sent[rid] = output_record(radix_server.generate(prompt, 5, rid=rid))
    events = wait_for_events(radix_server.events_path, sent)
    for rid, record in sent.items():
        event = events[rid]
        assert event["policy"] == "radix"
        assert event["prompt_tokens"] == 80 == record["prompt_tokens"]
        assert event["prefix_reused"] == record["cached_tokens"]
        assert event["moved"] == 0
        assert event["read"] == 80 - record["cached_tokens"]
        assert event["decode_tokens"] == 5
        assert event["finish_reason"] == "length"
        assert event["plan_resume"] == record["cached_tokens"]
        assert event["queued_ts"] <= event["finished_ts"]
    assert events["events-a"]["prefix_reused"] == 0
    assert events["events-b"]["prefix_reused"] == 64


def test_cache_salt_separates_namespaces(radix_server):
    prompt = prompt_ids(seed=5, length=100)
    radix_server.generate(prompt, 2, extra_key="tenant-a")
    same = output_record(radix_server.generate(prompt, 2, extra_key="tenant-a"))
    other = output_record(radix_server.generate(prompt, 2, extra_key="tenant-b"))
    assert same["cached_tokens"] == 96
    assert other["cached_tokens"] == 0


def test_logprobs_match_the_transformers_reference(radix_server, tiny_model_dir):
    """End-to-end check of the CPU kernels: SGLang's logprobs against HF transformers (fp32).

    The server reads the 90-token prompt in three 32-token forwards and decodes token by token;
    transformers runs one teacher-forced forward with its own torch GDN implementation.
    """
    import torch
    from transformers import Qwen3_5ForConditionalGeneration

    prompt = prompt_ids(seed=6, length=90)
    record = output_record(radix_server.generate(prompt, 6))
    model = Qwen3_5ForConditionalGeneration.from_pretrained(tiny_model_dir, dtype=torch.float32).eval()
    with torch.no_grad():
        logits = model(input_ids=torch.tensor([prompt + record["output_ids"]])).logits[0]
    logprobs = logits.float().log_softmax(-1)
    positions = range(len(prompt) - 1, len(prompt) - 1 + len(record["output_ids"]))
    reference = [logprobs[p, token].item() for p, token in zip(positions, record["output_ids"])]
    assert max(abs(a - b) for a, b in zip(record["logprobs"], reference)) < 1e-4
    top2 = logprobs[list(positions)].topk(2, dim=-1)
    for (best, second), (best_id, _), token in zip(top2.values.tolist(), top2.indices.tolist(), record["output_ids"]):
        assert token == best_id or best - second < 1e-4  # greedy agrees unless a near-tie


def test_workload_and_its_accounting(radix_server, tmp_path):
    """The scripted agent workload against the real server; its events pass the accounting checks."""
    from eval import report, workload

    records = workload.run(radix_server.post, tmp_path, conversations=2, max_tokens=6, run_name="wl", progress=False)
    rids = [r["rid"] for r in records]
    assert rids == [f"wl.c{c}.{t}" for c in range(2) for t in range(5)]
    assert [r["kind"] for r in records[:5]] == ["first", "tool", "tool", "edit", "append"]
    events = wait_for_events(radix_server.events_path, rids)
    assert all(events[rid]["prompt_tokens"] == r["usage"]["prompt_tokens"] for rid, r in zip(rids, records))
    ingested, failures = report.ingest(radix_server.events_path, tmp_path / "report")
    assert failures == []
    classes = {row.rid: row.klass for row in ingested}
    for c in range(2):
        # The edit deletes a tool output from the middle: the reuse stops well short of the
        # previous prompt. Appending turns reuse it.
        assert [classes[f"wl.c{c}.{t}"] for t in range(5)] == ["first", "append", "append", "edited", "append"]
    lines = (tmp_path / "client.jsonl").read_text().splitlines()
    assert len(lines) == 10 and json.loads(lines[3])["kind"] == "edit"


def test_events_file_starts_with_the_startup_record(radix_server):
    """One start-up record, written by the launcher before SGLang started, first in the file."""
    from policy.events import read_startups

    first_line = json.loads(radix_server.events_path.read_text().splitlines()[0])
    (startup,) = read_startups(str(radix_server.events_path))
    assert first_line == startup
    assert (startup["policy"], startup["settings"], startup["versions"]["sglang"]) == ("radix", {}, "0.5.16")
    assert startup["versions"]["overlay"] and startup["versions"]["torch"]
    args = startup["server_args"]
    assert args[args.index("--chunked-prefill-size") + 1] == "32" and "--cache-policy" not in args
