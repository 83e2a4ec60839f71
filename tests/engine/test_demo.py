"""The demo end to end (what ``./scripts/demo.sh`` prints), with its numbers derived independently.

Under ``radix`` with ``no_buffer`` and 64-token prefill chunks, SGLang keeps recurrent states at
every multiple of 64 inside a prompt and at the prompt's end, and a prompt may resume at the
deepest such state on a cached prompt that is not past the shared prefix nor past len - 1.
"""

from __future__ import annotations

import pytest
from transformers import AutoTokenizer

from eval import demo, report
from exact_cache.replay import replay

pytestmark = pytest.mark.engine

CHUNK = 64  # --chunked-prefill-size in eval.demo.SERVER_ARGS


def expected_reuse(prompt: list[int], earlier: list[list[int]]) -> int:
    best = 0
    for old in earlier:
        shared = next((i for i, (a, b) in enumerate(zip(old, prompt)) if a != b), min(len(old), len(prompt)))
        limit = min(shared, len(prompt) - 1)
        states = [c for c in range(CHUNK, len(old), CHUNK)] + [len(old)]
        best = max([best] + [c for c in states if c <= limit])
    return best


def chat_prompts(model_dir) -> list[list[int]]:
    tokenizer = AutoTokenizer.from_pretrained(model_dir)
    return [
        tokenizer.apply_chat_template(messages, add_generation_prompt=True, tokenize=True, return_dict=True)["input_ids"]
        for _, _, messages in demo.conversation_turns()
    ]


def check_rows(rows, prompts, expected_reused):
    assert [row["kind"] for row in rows] == ["first", "append", "edited", "append"]
    for row, prompt, reused in zip(rows, prompts, expected_reused):
        assert row["prompt_tokens"] == len(prompt)
        assert row["prefix_reused"] == reused, row["label"]
        assert row["moved"] == 0
        assert row["read"] == row["prompt_tokens"] - row["prefix_reused"]
        assert row["decode_tokens"] == 12


def test_demo_table(tiny_model_dir, tmp_path):
    assert "--chunked-prefill-size" in demo.SERVER_ARGS and str(CHUNK) in demo.SERVER_ARGS
    assert demo.POLICY_ARGS["exact"] == ["--cache-policy-set", f"piece_tokens={CHUNK}",
                                         "--cache-policy-set", "retain_every=256"]
    prompts = chat_prompts(tiny_model_dir)
    rows = {policy: demo.run(tiny_model_dir, tmp_path, policy=policy) for policy in ("radix", "exact")}
    check_rows(rows["radix"], prompts, [expected_reuse(p, prompts[:i]) for i, p in enumerate(prompts)])
    check_rows(rows["exact"], prompts, replay(prompts, piece=CHUNK, retain_every=256))
    radix = [row["prefix_reused"] for row in rows["radix"]]
    assert radix[0] == 0 and radix[1] > 0 and radix[2] < radix[1] and radix[3] > 0
    table = demo.format_table(rows).splitlines()
    assert table[0].split() == ["request", "prompt", "change", "prompt", "|", "radix", "|", "exact"]
    assert table[1].split() == ["|", "reused", "moved", "read", "seconds"] * 2
    assert len(table) == 3 + len(prompts)
    assert table[3].split()[:3] == ["turn", "1", "first"]
    # The accounting reads the same events: consistent, and classes as the conversation was built.
    for policy in ("radix", "exact"):
        ingested, failures = report.ingest(tmp_path / f"events-{policy}.jsonl", tmp_path / f"report-{policy}")
        assert failures == []
        assert [row.klass for row in ingested if row.conversation == f"demo-{policy}"] == [
            "first", "append", "edited", "append"]
