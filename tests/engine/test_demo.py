"""The demo end to end (what ``./scripts/demo.sh`` prints), with its numbers derived independently.

Under ``radix`` with ``no_buffer`` and 64-token prefill chunks, SGLang keeps recurrent states at
every multiple of 64 inside a prompt and at the prompt's end, and a prompt may resume at the
deepest such state on a cached prompt that is not past the shared prefix nor past len - 1.
"""

from __future__ import annotations

import pytest
from transformers import AutoTokenizer

from eval import demo

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


def test_demo_table(tiny_model_dir, tmp_path):
    assert "--chunked-prefill-size" in demo.SERVER_ARGS and str(CHUNK) in demo.SERVER_ARGS
    rows = demo.run(tiny_model_dir, tmp_path, policy="radix")
    tokenizer = AutoTokenizer.from_pretrained(tiny_model_dir)
    prompts = [
        tokenizer.apply_chat_template(messages, add_generation_prompt=True, tokenize=True, return_dict=True)["input_ids"]
        for _, _, messages in demo.conversation_turns()
    ]
    assert [row["kind"] for row in rows] == ["first", "append", "edited", "append"]
    for index, (row, prompt) in enumerate(zip(rows, prompts)):
        assert row["prompt_tokens"] == len(prompt)
        assert row["prefix_reused"] == expected_reuse(prompt, prompts[:index]), row["label"]
        assert row["moved"] == 0
        assert row["read"] == row["prompt_tokens"] - row["prefix_reused"]
        assert row["decode_tokens"] == 12
    reuse = [row["prefix_reused"] for row in rows]
    assert reuse[0] == 0 and reuse[1] > 0 and reuse[2] < reuse[1] and reuse[3] > 0
    table = demo.format_table(rows)
    assert table.splitlines()[0].split() == ["request", "prompt", "change", "prompt", "reused", "moved", "read",
                                              "decode", "seconds"]
    assert len(table.splitlines()) == 2 + len(rows)
