"""Tests for the tiny model builder (eval/tiny_model.py) and its chat template (eval/tiny_chat_template.jinja).

The chat-template tests render with transformers' ``apply_chat_template(..., tokenize=False)`` from a
tokenizer built into a temporary folder and compare exact strings written out by hand from the Qwen3.6
rules (docs/model.md §6.4). The model tests build the whole model twice (a few seconds each) and check
byte-identical files, the config edits SGLang needs, and that transformers loads and runs it.
"""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

os.environ.setdefault("HF_HUB_OFFLINE", "1")

REPO = Path(__file__).resolve().parents[2]

from eval import tiny_model as mtm  # noqa: E402

SYSTEM = {"role": "system", "content": "You are terse."}
TOOLS = [
    {
        "type": "function",
        "function": {
            "name": "add",
            "description": "Add two integers.",
            "parameters": {
                "type": "object",
                "properties": {"a": {"type": "integer"}, "b": {"type": "integer"}},
                "required": ["a", "b"],
            },
        },
    }
]
TOOLS_SYSTEM_TURN = (
    "<|im_start|>system\n"
    "# Tools\n\n"
    "These functions are available to you:\n\n"
    "<tools>\n"
    '{"type": "function", "function": {"name": "add", "description": "Add two integers.", '
    '"parameters": {"type": "object", "properties": {"a": {"type": "integer"}, "b": {"type": "integer"}}, '
    '"required": ["a", "b"]}}}\n'
    "</tools>\n\n"
    "To call a function, reply with one block per call, in exactly this form:\n\n"
    "<tool_call>\n<function=NAME>\n<parameter=ARG>\nVALUE\n</parameter>\n</function>\n</tool_call>\n\n"
    "Give every required parameter. A value may span several lines. Write nothing after the last call.\n\n"
    "You are terse.<|im_end|>\n"
)

# Two user turns; the first assistant turn carries its reasoning inside the content.
TWO_TURNS = [
    SYSTEM,
    {"role": "user", "content": "What is 2+2?"},
    {"role": "assistant", "content": "<think>\nSimple sum.\n</think>\n\n4"},
    {"role": "user", "content": "And 3+3?"},
]
TWO_TURNS_PREFIX = "<|im_start|>system\nYou are terse.<|im_end|>\n<|im_start|>user\nWhat is 2+2?<|im_end|>\n"
TWO_TURNS_SUFFIX = "<|im_start|>user\nAnd 3+3?<|im_end|>\n"


@pytest.fixture(scope="module")
def tokenizer(tmp_path_factory):
    from transformers import AutoTokenizer

    out = tmp_path_factory.mktemp("tiny_tokenizer")
    mtm.build_tokenizer(out)
    return AutoTokenizer.from_pretrained(str(out), local_files_only=True)


def render(tok, messages, **kwargs):
    return tok.apply_chat_template(messages, tokenize=False, add_generation_prompt=True, **kwargs)


def test_default_strips_reasoning_before_last_user_query(tokenizer):
    assert render(tokenizer, TWO_TURNS) == (
        TWO_TURNS_PREFIX
        + "<|im_start|>assistant\n4<|im_end|>\n"
        + TWO_TURNS_SUFFIX
        + "<|im_start|>assistant\n<think>\n"
    )


def test_reasoning_content_field_is_stripped_the_same_way(tokenizer):
    messages = list(TWO_TURNS)
    messages[2] = {"role": "assistant", "content": "4", "reasoning_content": "  Simple sum.  "}
    assert render(tokenizer, messages) == render(tokenizer, TWO_TURNS)


def test_preserve_thinking_keeps_reasoning(tokenizer):
    assert render(tokenizer, TWO_TURNS, preserve_thinking=True) == (
        TWO_TURNS_PREFIX
        + "<|im_start|>assistant\n<think>\nSimple sum.\n</think>\n\n4<|im_end|>\n"
        + TWO_TURNS_SUFFIX
        + "<|im_start|>assistant\n<think>\n"
    )


def test_enable_thinking_false_generation_prompt(tokenizer):
    assert render(tokenizer, TWO_TURNS, enable_thinking=False) == (
        TWO_TURNS_PREFIX
        + "<|im_start|>assistant\n4<|im_end|>\n"
        + TWO_TURNS_SUFFIX
        + "<|im_start|>assistant\n<think>\n\n</think>\n\n"
    )


def test_no_generation_prompt_and_no_system(tokenizer):
    messages = [{"role": "user", "content": "hi"}, {"role": "assistant", "content": "hello"}]
    text = tokenizer.apply_chat_template(messages, tokenize=False, add_generation_prompt=False)
    # The assistant turn comes after the last user query, so it keeps an (empty) think block.
    assert text == (
        "<|im_start|>user\nhi<|im_end|>\n<|im_start|>assistant\n<think>\n\n</think>\n\nhello<|im_end|>\n"
    )


def test_agentic_loop_keeps_reasoning_after_last_user_query(tokenizer):
    messages = [
        SYSTEM,
        {"role": "user", "content": "Hi."},
        {"role": "assistant", "content": "<think>Greet back.</think>\n\nHello."},
        {"role": "user", "content": "Add 2 and 3, then 4 and 5."},
        {
            "role": "assistant",
            "content": None,  # OpenAI clients send null content with tool calls
            "reasoning_content": "I should call add.",
            "tool_calls": [{"type": "function", "function": {"name": "add", "arguments": {"a": 2, "b": 3}}}],
        },
        {"role": "tool", "content": "5"},
        {
            "role": "assistant",
            "content": "First sum done.",
            "reasoning_content": "Now the second pair.",
            "tool_calls": [
                {"type": "function", "function": {"name": "add", "arguments": {"a": 4, "b": 5}}},
                {"type": "function", "function": {"name": "add", "arguments": {"a": 1, "b": [1, 2]}}},
            ],
        },
        {"role": "tool", "content": "9"},
        {"role": "tool", "content": "oops"},
        {"role": "assistant", "content": "<think>\nAll done.\n</think>\n\n5 and 9."},
    ]
    expected = (
        TOOLS_SYSTEM_TURN
        + "<|im_start|>user\nHi.<|im_end|>\n"
        # before the last real user query: reasoning dropped, tags included
        + "<|im_start|>assistant\nHello.<|im_end|>\n"
        + "<|im_start|>user\nAdd 2 and 3, then 4 and 5.<|im_end|>\n"
        # after it: reasoning kept; no content -> the tool call follows the think block directly
        + "<|im_start|>assistant\n<think>\nI should call add.\n</think>\n\n"
        + "<tool_call>\n<function=add>\n<parameter=a>\n2\n</parameter>\n<parameter=b>\n3\n</parameter>\n"
        + "</function>\n</tool_call><|im_end|>\n"
        + "<|im_start|>user\n<tool_response>\n5\n</tool_response><|im_end|>\n"
        + "<|im_start|>assistant\n<think>\nNow the second pair.\n</think>\n\nFirst sum done.\n\n"
        + "<tool_call>\n<function=add>\n<parameter=a>\n4\n</parameter>\n<parameter=b>\n5\n</parameter>\n"
        + "</function>\n</tool_call>\n"
        + "<tool_call>\n<function=add>\n<parameter=a>\n1\n</parameter>\n<parameter=b>\n[1, 2]\n</parameter>\n"
        + "</function>\n</tool_call><|im_end|>\n"
        # consecutive tool results share one user turn
        + "<|im_start|>user\n<tool_response>\n9\n</tool_response>\n<tool_response>\noops\n</tool_response>"
        + "<|im_end|>\n"
        + "<|im_start|>assistant\n<think>\nAll done.\n</think>\n\n5 and 9.<|im_end|>\n"
        + "<|im_start|>assistant\n<think>\n"
    )
    assert render(tokenizer, messages, tools=TOOLS) == expected


def test_user_message_that_only_wraps_a_tool_response_is_not_a_query(tokenizer):
    messages = [
        {"role": "user", "content": "Q"},
        {"role": "assistant", "content": "<think>r1</think>a1"},
        {"role": "user", "content": "<tool_response>\nx\n</tool_response>"},
        {"role": "assistant", "content": "<think>r2</think>a2"},
    ]
    text = tokenizer.apply_chat_template(messages, tokenize=False, add_generation_prompt=False)
    assert text == (
        "<|im_start|>user\nQ<|im_end|>\n"
        "<|im_start|>assistant\n<think>\nr1\n</think>\n\na1<|im_end|>\n"
        "<|im_start|>user\n<tool_response>\nx\n</tool_response><|im_end|>\n"
        "<|im_start|>assistant\n<think>\nr2\n</think>\n\na2<|im_end|>\n"
    )


def test_content_forms(tokenizer):
    """List-of-parts content (SGLang's "openai" format) and a missing content key (SGLang drops null
    values) render like plain strings."""
    as_parts = [
        {"role": "user", "content": [{"type": "text", "text": "Add "}, {"type": "text", "text": "1 and 2."}]},
        {
            "role": "assistant",
            "tool_calls": [{"type": "function", "function": {"name": "add", "arguments": {"a": 1, "b": 2}}}],
        },
        {"role": "tool", "content": [{"type": "text", "text": "3"}]},
    ]
    assert render(tokenizer, as_parts) == (
        "<|im_start|>user\nAdd 1 and 2.<|im_end|>\n"
        "<|im_start|>assistant\n<think>\n\n</think>\n\n"
        "<tool_call>\n<function=add>\n<parameter=a>\n1\n</parameter>\n<parameter=b>\n2\n</parameter>\n"
        "</function>\n</tool_call><|im_end|>\n"
        "<|im_start|>user\n<tool_response>\n3\n</tool_response><|im_end|>\n"
        "<|im_start|>assistant\n<think>\n"
    )


def test_system_message_must_come_first(tokenizer):
    from jinja2.exceptions import TemplateError

    with pytest.raises(TemplateError, match="A system message may only be the first message."):
        render(tokenizer, [{"role": "user", "content": "a"}, SYSTEM])


def test_tokenizer_vocabulary_and_added_tokens(tokenizer):
    assert len(tokenizer) == 480
    ids = {t: tokenizer.convert_tokens_to_ids(t) for t in mtm.SPECIAL_TOKENS + mtm.MARKUP_TOKENS}
    assert ids == {
        "<|endoftext|>": 471,
        "<|im_start|>": 472,
        "<|im_end|>": 473,
        "<think>": 474,
        "</think>": 475,
        "<tool_call>": 476,
        "</tool_call>": 477,
        "<tool_response>": 478,
        "</tool_response>": 479,
    }
    assert (tokenizer.eos_token, tokenizer.eos_token_id) == ("<|im_end|>", 473)
    assert (tokenizer.pad_token, tokenizer.pad_token_id) == ("<|endoftext|>", 471)
    # <think>/<tool_call> are plain added tokens (as in Qwen), so skip_special_tokens keeps them.
    ids = tokenizer("<|im_start|>assistant\n<think>\nx</think><|im_end|>", add_special_tokens=False)["input_ids"]
    assert ids[0] == 472 and ids[-1] == 473 and 474 in ids and 475 in ids
    assert tokenizer.decode(ids, skip_special_tokens=True) == "assistant\n<think>\nx</think>"


def test_encode_decode_round_trip(tokenizer):
    text = render(tokenizer, TWO_TURNS, preserve_thinking=True) + "déjà vu — 数字 3.14 \t tabs\r\n😀 café"
    ids = tokenizer(text, add_special_tokens=False)["input_ids"]
    assert tokenizer.decode(ids) == text
    assert max(ids) < mtm.VOCAB_SIZE


@pytest.fixture(scope="module")
def built_twice(tmp_path_factory):
    a = mtm.build(tmp_path_factory.mktemp("tiny_a"), seed=0)
    b = mtm.build(tmp_path_factory.mktemp("tiny_b"), seed=0)
    return a, b


def test_build_is_deterministic(built_twice):
    a, b = built_twice
    hashes_a, hashes_b = mtm.sha256_files(a), mtm.sha256_files(b)
    assert sorted(hashes_a) == [
        "chat_template.jinja",
        "config.json",
        "generation_config.json",
        "model.safetensors",
        "tokenizer.json",
        "tokenizer_config.json",
    ]
    assert hashes_a == hashes_b
    assert (a / "chat_template.jinja").read_text(encoding="utf-8") == mtm.CHAT_TEMPLATE_PATH.read_text(
        encoding="utf-8"
    )


def test_other_seed_changes_only_the_weights(built_twice, tmp_path):
    a, _ = built_twice
    c = mtm.build(tmp_path / "seed1", seed=1)
    ha, hc = mtm.sha256_files(a), mtm.sha256_files(c)
    assert [k for k in ha if ha[k] != hc[k]] == ["model.safetensors"]


def test_config_has_the_fields_sglang_needs(built_twice):
    cfg = json.loads((built_twice[0] / "config.json").read_text(encoding="utf-8"))
    assert cfg["architectures"] == ["Qwen3_5ForConditionalGeneration"]
    assert cfg["model_type"] == "qwen3_5"
    assert cfg["rope_theta"] == 1e7
    assert cfg["tie_word_embeddings"] is False
    tc = cfg["text_config"]
    assert tc["model_type"] == "qwen3_5_text"
    assert tc["full_attention_interval"] == 4
    assert tc["rope_theta"] == 1e7
    assert tc["rope_parameters"] == {"partial_rotary_factor": 0.25, "rope_theta": 1e7, "rope_type": "default"}
    assert tc["layer_types"] == ["linear_attention"] * 3 + ["full_attention"] + ["linear_attention"] * 3 + [
        "full_attention"
    ]
    assert tc["attn_output_gate"] is True
    assert (tc["eos_token_id"], tc["pad_token_id"], tc["vocab_size"]) == (473, 471, 512)
    assert (tc["linear_num_key_heads"], tc["linear_num_value_heads"]) == (2, 4)
    vc = cfg["vision_config"]
    assert (vc["depth"], vc["hidden_size"], vc["num_heads"], vc["out_hidden_size"]) == (1, 32, 2, 64)
    assert vc["deepstack_visual_indexes"] == []


def test_checkpoint_names_dtypes_and_init(built_twice):
    import torch
    from safetensors.torch import load_file

    sd = load_file(str(built_twice[0] / "model.safetensors"))
    assert {v.dtype for v in sd.values()} == {torch.bfloat16}
    assert sorted({k.split(".")[0] + "." + k.split(".")[1] for k in sd if k.startswith("model.")}) == [
        "model.language_model",
        "model.visual",
    ]
    assert "lm_head.weight" in sd
    lm = "model.language_model.layers."
    assert sorted(k[len(lm + "0.linear_attn."):] for k in sd if k.startswith(lm + "0.linear_attn.")) == [
        "A_log", "conv1d.weight", "dt_bias", "in_proj_a.weight", "in_proj_b.weight", "in_proj_qkv.weight",
        "in_proj_z.weight", "norm.weight", "out_proj.weight",
    ]
    assert sd[lm + "3.self_attn.q_proj.weight"].shape == (4 * 32 * 2, 64)  # query + gate per head
    a = torch.exp(torch.cat([sd[f"{lm}{i}.linear_attn.A_log"].float() for i in (0, 1, 2, 4, 5, 6)]))
    assert bool(((a > 0.0098) & (a < 1.001)).all())
    # 1-D params are perturbed: no norm weight is exactly its default any more
    assert not bool((sd[lm + "0.input_layernorm.weight"] == 0).any())
    assert not bool((sd[lm + "0.linear_attn.norm.weight"] == 1).any())


def test_transformers_loads_and_runs_it(built_twice):
    import torch
    from transformers import AutoTokenizer, Qwen3_5ForConditionalGeneration

    out = built_twice[0]
    tok = AutoTokenizer.from_pretrained(str(out), local_files_only=True)
    model = Qwen3_5ForConditionalGeneration.from_pretrained(
        str(out), dtype=torch.float32, local_files_only=True
    ).eval()
    ids = tok(render(tok, TWO_TURNS), add_special_tokens=False)["input_ids"]
    with torch.no_grad():
        logits = model(input_ids=torch.tensor([ids])).logits
    assert tuple(logits.shape) == (1, len(ids), 512)
    assert bool(torch.isfinite(logits).all())
    gen = mtm.greedy_tokens(model, ids, 24)
    assert len(set(gen)) >= 6, gen
    info = mtm.sanity_check(out)
    assert info["distinct_generated"] >= 6
