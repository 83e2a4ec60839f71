"""Request checks (``serving/request_checks.py``, ``serving/field_rules.py``): each check's
accept/reject boundary and exact message prefix; then the glue (``patches.validation``): that
``patches.plugin.install`` registers the validation hooks whatever the policy (no SGLang import:
the registry is a stub) and what the hooks do with their arguments."""

from __future__ import annotations

from types import SimpleNamespace

import pytest

from patches import plugin, validation
from serving import field_rules, request_checks, request_limits
from serving.field_rules import (
    MAX_ABS_LOGIT_BIAS,
    MAX_EXTRA_KEY_CHARS,
    MAX_N,
    MAX_TOP_K,
    MIN_REPETITION_PENALTY,
    Context,
    RequestError,
    check_field,
)
from serving.request_checks import (
    check_batch_lengths,
    check_extra_key,
    check_generate_request,
    check_logprob_start_len,
    check_openai_request,
    check_parallel_n,
    check_positional_embed_overrides,
    check_request_rids,
    check_rids,
    check_sampling_params,
    check_session_params,
    check_token_ids,
    check_tokenized_prompt,
    check_top_logprobs_num,
    field_table_drift,
    per_request,
)

SAMPLING_FIELDS_ALL = request_checks.SAMPLING_FIELDS
VOCAB = 512  # the tiny model: 512 embedding rows, a 480-token tokenizer


def rejects(call, *args, match: str):
    with pytest.raises(RequestError, match=match):
        call(*args)


def test_request_error_is_a_value_error():
    # SGLang's HTTP layer turns ValueError (only) into a 400.
    assert issubclass(RequestError, ValueError)


# ---------------------------------------------------------------------- token ids

@pytest.mark.parametrize("ids", [[0], [511], [0, 479, 480, 511], None], ids=["zero", "last-row", "past-tokenizer", "none"])
def test_token_ids_accepts(ids):
    check_token_ids(ids, VOCAB)


@pytest.mark.parametrize("ids, match", [
    ([512], r"input_ids: token id 512 at position 0 is outside the vocabulary \[0, 512\)"),
    ([1, 2, -1], r"input_ids: token id -1 at position 2 is outside"),
    ([1, 10**12], "token id 1000000000000 at position 1"),
    ([], "input_ids: the prompt is empty"),
    ([1, "2"], "position 1 is '2', not an integer"),
    # Valid ends, bad middle: the fast path must not look only at min and max.
    ([0, 2.5, 3], "position 1 is 2.5, not an integer"),
    ([0, True, 5], "position 1 is True, not an integer"),
    ([0, None, 5], "position 1 is None, not an integer"),
])
def test_token_ids_rejects(ids, match):
    rejects(check_token_ids, ids, VOCAB, match=match)


def test_token_ids_names_the_field():
    rejects(check_token_ids, [5, 600], VOCAB, "input_ids[3]", match=r"^input_ids\[3\]: token id 600")


# ---------------------------------------------------------------------- rids

@pytest.mark.parametrize("rids, in_flight", [(["a"], {}), (["a", "b"], {"c": 1}), ([], {"a": 1}), (["a"], ["b"])])
def test_rids_accepts(rids, in_flight):
    check_rids(rids, in_flight)


@pytest.mark.parametrize("rids, in_flight, match", [
    (["a"], {"a": object()}, "rid: a request with rid 'a' is already in flight"),
    (["new", "busy"], {"busy": object()}, "rid 'busy' is already in flight"),
    (["x", "x"], {}, "rid: 'x' appears more than once"),
    ([["a"]], {}, "rid: must be a string, got list"),
    ([5], {}, "rid: must be a string, got int"),
])
def test_rids_rejects(rids, in_flight, match):
    rejects(check_rids, rids, in_flight, match=match)


# ---------------------------------------------------------------------- logprob fields

@pytest.mark.parametrize("value, prompt_len, return_logprob", [
    (-1, None, True), (0, None, True), (10**6, None, True), (None, 3, True),  # length unknown yet (text)
    (-1, 3, True), (0, 3, True), (2, 3, True), (3, 3, True),  # = length: no prompt logprobs
    (7, 3, False),  # ignored without return_logprob
])
def test_logprob_start_len_accepts(value, prompt_len, return_logprob):
    check_logprob_start_len(value, "logprob_start_len", prompt_len, return_logprob)


def test_logprob_start_len_past_the_prompt():
    rejects(check_logprob_start_len, 4, "logprob_start_len", 3, True,
            match=r"^logprob_start_len: 4 is past the end of the prompt \(3 tokens\)")


@pytest.mark.parametrize("value, match", [
    (-2, "logprob_start_len: must be -1 .* got -2"),
    (-100, "got -100"),
    (1.5, "must be an integer"),
    (True, "must be an integer"),
])
def test_logprob_start_len_rejects(value, match):
    rejects(check_logprob_start_len, value, match=match)


@pytest.mark.parametrize("value", [0, 1, VOCAB, None])
def test_top_logprobs_num_accepts(value):
    check_top_logprobs_num(value, VOCAB)


@pytest.mark.parametrize("value, match", [
    (-1, r"top_logprobs_num: must be in \[0, 512\] .* got -1"),
    (VOCAB + 1, "got 513"),
    (2.0, "must be an integer"),
])
def test_top_logprobs_num_rejects(value, match):
    rejects(check_top_logprobs_num, value, VOCAB, match=match)


def test_token_ids_logprob_is_refused():
    request_checks.check_token_ids_logprob(None)
    for value in ([5], [0, 511], [], [[1]]):
        rejects(request_checks.check_token_ids_logprob, value, match="^token_ids_logprob: not accepted by this server")
    rejects(request_checks.check_token_ids_logprob, [], "token_ids_logprob[1]", match=r"^token_ids_logprob\[1\]: not accepted")


# ---------------------------------------------------------------------- extra_key / cache_salt

@pytest.mark.parametrize("value", [None, "tenant-a", "k" * MAX_EXTRA_KEY_CHARS, "salt\x1fkey", "\x1fkey"])
def test_extra_key_accepts(value):
    """A name from /generate, or an OpenAI namespace (policy/namespace.py) made of two names."""
    check_extra_key(value)


@pytest.mark.parametrize("value, match", [
    ("k" * (MAX_EXTRA_KEY_CHARS + 1), "extra_key: 257 characters, at most 256"),
    (["a"], "extra_key: must be a string, got list"),
    (5, "must be a string, got int"),
    ("", "extra_key: must not be empty"),
    ("a\nb", "extra_key: must not contain control characters"),
    ("a\x1f", "extra_key: must not be empty"),  # a namespace whose extra_key part is empty
])
def test_extra_key_rejects(value, match):
    rejects(check_extra_key, value, match=match)


@pytest.mark.parametrize("request_fields, expected", [
    ({}, None),
    ({"cache_salt": "s", "extra_key": "e"}, None),
    ({"cache_salt": "s" * 256, "extra_key": "e" * 256}, None),
    ({"cache_salt": ["a", "b"]}, "cache_salt: must be a string, got list"),
    ({"extra_key": ["a"]}, "extra_key: must be a string, got list"),
    ({"cache_salt": ""}, "cache_salt: must not be empty"),
    ({"cache_salt": "s" * 257}, "cache_salt: 257 characters"),
    ({"extra_key": "a\x1fb"}, "extra_key: must not contain control characters"),
])
def test_openai_request(request_fields, expected):
    message = check_openai_request(SimpleNamespace(**request_fields))
    assert message == expected if expected is None else message.startswith(expected)


def test_an_empty_rid_is_refused():
    rejects(request_checks.check_rids, [""], match="^rid: must not be empty")


# ---------------------------------------------------------------------- n

@pytest.mark.parametrize("params", [None, {}, {"n": 1}, {"n": MAX_N}, {"n": None}, [{"n": 2}, {"n": 2}], [{}]])
def test_parallel_n_accepts(params):
    check_parallel_n(params)


@pytest.mark.parametrize("params, match", [
    ({"n": MAX_N + 1}, r"sampling_params.n: must be an integer in \[1, 128\], got 129"),
    ({"n": 0}, "got 0"),
    ({"n": -1}, "got -1"),
    ({"n": 2.5}, "got 2.5"),
    ({"n": "2"}, "got '2'"),
    ([{"n": 2}, {"n": 10**9}], r"sampling_params\[1\].n"),
    ([], "sampling_params: an empty list"),
])
def test_parallel_n_rejects(params, match):
    rejects(check_parallel_n, params, match=match)


@pytest.mark.parametrize("fields", [
    {"input_embeds": [[0.1, 0.2]]}, {"input_embeds": [[[0.1]]]}, {"input_embeds": None, "input_ids": [1]},
    {"input_embeds": [], "text": "x"},  # text given: input_embeds is dropped by SGLang
])
def test_before_normalization_accepts(fields):
    request_checks.check_before_normalization(SimpleNamespace(**{"sampling_params": None, "text": None, "input_ids": None, **fields}))


@pytest.mark.parametrize("fields, match", [
    ({"input_embeds": []}, "input_embeds: must be a non-empty list"),
    ({"input_embeds": [[]]}, "input_embeds: must be a non-empty list"),
    ({"input_embeds": [1.0]}, "input_embeds"),
    ({"input_embeds": [[0.1]], "sampling_params": {"n": 0}}, "sampling_params.n"),
])
def test_before_normalization_rejects(fields, match):
    obj = SimpleNamespace(**{"sampling_params": None, "text": None, "input_ids": None, **fields})
    rejects(request_checks.check_before_normalization, obj, match=match)


# ---------------------------------------------------------------------- sampling params

@pytest.mark.parametrize("params", [
    None, {},
    {"max_new_tokens": 0}, {"max_new_tokens": None}, {"max_new_tokens": 10**15},  # huge: SGLang's length check
    {"top_k": -1}, {"top_k": 1}, {"top_k": MAX_TOP_K},
    {"temperature": 0}, {"temperature": 0.7}, {"top_p": 1}, {"min_p": 0.0},
    {"repetition_penalty": MIN_REPETITION_PENALTY}, {"repetition_penalty": 2.0},
    {"repetition_penalty": 0}, {"repetition_penalty": -1.0},  # <= 0: SGLang's own (0, 2] check
    {"stop": "x"}, {"stop": ["x", "y"]}, {"stop": []}, {"stop_regex": r"\d+"}, {"stop_regex": ["a|b"]},
    {"stop_token_ids": []}, {"stop_token_ids": [0, 511]},
    {"logit_bias": {}}, {"logit_bias": {"0": MAX_ABS_LOGIT_BIAS}, "temperature": 1.0},
    {"logit_bias": {"511": -MAX_ABS_LOGIT_BIAS}}, {"logit_bias": {"5": 0}},
    {"json_schema": '{"type": "object"}'}, {"regex": "[a-z]+"}, {"ebnf": 'root ::= "a"'}, {"structural_tag": "{}"},
    {"ignore_eos": True}, {"skip_special_tokens": False}, {"no_stop_trim": None},
    {"custom_params": {"a": 1}}, {"sampling_seed": 3}, {"stream_interval": 2}, {"n": 3},
])
def test_sampling_params_accepts(params):
    check_sampling_params(params, VOCAB)


@pytest.mark.parametrize("params, match", [
    ([1], "sampling_params: must be an object, got list"),
    ({"foo": 1}, "sampling_params: unknown parameter.s. foo"),
    ({"is_normalized": True}, "unknown parameter.s. is_normalized"),
    ({"stop_strs": ["a"], "zz": 1}, "stop_strs, zz"),
    ({"max_new_tokens": 2.5}, "sampling_params.max_new_tokens: must be an integer, got 2.5"),
    ({"max_new_tokens": "8"}, "max_new_tokens: must be an integer"),
    ({"top_k": 1.0}, "sampling_params.top_k: must be an integer"),
    ({"top_k": MAX_TOP_K + 1}, r"sampling_params.top_k: must be -1 \(all\) or in \[1, 2147483647\]"),
    ({"temperature": "hot"}, "sampling_params.temperature: must be a number, got 'hot'"),
    ({"top_p": [1]}, "sampling_params.top_p: must be a number"),
    ({"temperature": True}, "temperature: must be a number, got True"),
    ({"repetition_penalty": MIN_REPETITION_PENALTY / 2}, r"repetition_penalty: must be in \[0.001, 2\]"),
    ({"repetition_penalty": 1e-300}, "repetition_penalty"),
    ({"ignore_eos": "x"}, "sampling_params.ignore_eos: must be true or false, got 'x'"),
    ({"skip_special_tokens": 1}, "skip_special_tokens: must be true or false"),
    ({"json_schema": {"type": "object"}}, "sampling_params.json_schema: must be a string, got dict"),
    ({"regex": ["a"]}, "sampling_params.regex: must be a string, got list"),
    ({"ebnf": 5}, "sampling_params.ebnf: must be a string"),
    ({"structural_tag": {"a": 1}}, "structural_tag: must be a string"),
    ({"stop": {"a": 1}}, "sampling_params.stop: must be a string or a list of strings"),
    ({"stop": [1, 2]}, "sampling_params.stop: must be a string or a list of strings"),
    ({"stop_regex": "("}, r"sampling_params.stop_regex: '\(' is not a valid regular expression"),
    ({"stop_regex": ["ok", "[a-"]}, "is not a valid regular expression"),
    ({"stop_regex": [1]}, "stop_regex: must be a string or a list of strings"),
    ({"stop_token_ids": 5}, "sampling_params.stop_token_ids: must be a list of integer token ids"),
    ({"stop_token_ids": [[1]]}, "stop_token_ids: must be a list of integer"),
    ({"stop_token_ids": ["a"]}, "stop_token_ids"),
    ({"stop_token_ids": [1, 10**9], "min_new_tokens": 2}, r"sampling_params.stop_token_ids: token id 1000000000 is outside the vocabulary \[0, 512\)"),
    ({"stop_token_ids": [512]}, "token id 512 is outside"),
    ({"stop_token_ids": [-5]}, "token id -5 is outside"),
    ({"logit_bias": [1, 2]}, "sampling_params.logit_bias: must be an object mapping token ids to numbers, got list"),
    ({"logit_bias": {"5": "x"}}, r"logit_bias: the bias of token 5 must be a number in \[-100, 100\], got 'x'"),
    ({"logit_bias": {"5": float("nan")}}, "bias of token 5 must be a number"),
    ({"logit_bias": {"5": float("inf")}}, "got inf"),
    ({"logit_bias": {"5": float("-inf")}}, "got -inf"),
    ({"logit_bias": {"5": MAX_ABS_LOGIT_BIAS + 0.5}}, "got 100.5"),
    ({"logit_bias": {"5": 1e308}}, "got 1e"),
    ({"logit_bias": {"512": 1.0}}, r"logit_bias: token id 512 is outside the vocabulary \[0, 512\)"),
    ({"logit_bias": {"-1": 1.0}}, "token id -1 is outside"),
    ({"logit_bias": {"x": 1.0}}, "logit_bias: key 'x' is not a token id"),
])
def test_sampling_params_rejects(params, match):
    rejects(check_sampling_params, params, VOCAB, match=match)


@pytest.mark.parametrize("backend, device, refused", [
    ("xgrammar", "cpu", True), ("xgrammar", None, True), ("xgrammar", "cuda", False), ("xgrammar", "npu", False),
    ("llguidance", "cpu", False), ("outlines", "cpu", False), ("none", "cpu", False),
])
def test_grammar_unavailable(backend, device, refused):
    assert (request_checks.grammar_unavailable(backend, device) is not None) == refused


@pytest.mark.parametrize("name", ["json_schema", "regex", "ebnf", "structural_tag"])
def test_grammar_refused_where_unavailable(name):
    reason = request_checks.grammar_unavailable("xgrammar", "cpu")
    rejects(check_sampling_params, {name: "x"}, VOCAB, "sampling_params", SAMPLING_FIELDS_ALL, reason,
            match=f"^sampling_params.{name}: constrained decoding with the xgrammar backend is not available on device cpu")
    check_sampling_params({name: "x"}, VOCAB)  # a server that can: SGLang compiles it
    check_sampling_params({name: None, "temperature": 0}, VOCAB, no_grammar=reason)


def test_sampling_params_names_the_batch_entry():
    rejects(check_sampling_params, {"top_k": 2.5}, VOCAB, "sampling_params[1]", match=r"^sampling_params\[1\].top_k")


# ---------------------------------------------------------------------- other fields

@pytest.mark.parametrize("value", [None, {}, {"id": "s", "rid": "r", "offset": 3, "replace": True, "drop_previous_output": False}])
def test_session_params_accepts(value):
    check_session_params(value)


@pytest.mark.parametrize("value, match", [
    ({"zzz": 1}, "session_params: unknown field.s. zzz"),
    ("s", "session_params: must be an object"),
])
def test_session_params_rejects(value, match):
    rejects(check_session_params, value, match=match)


class FakeEmbeds:
    pass


@pytest.mark.parametrize("value", [None, FakeEmbeds(), [None, FakeEmbeds()]])
def test_positional_embed_overrides_accepts(value):
    check_positional_embed_overrides(value, FakeEmbeds)


@pytest.mark.parametrize("value", [5, {"a": 1}, "x", [1], [None, {"embeds": []}]])
def test_positional_embed_overrides_rejects(value):
    rejects(check_positional_embed_overrides, value, FakeEmbeds, match="positional_embed_overrides: not accepted")


def test_batch_lengths():
    obj = SimpleNamespace(sampling_params=[{}, {}], return_logprob=[True, False, True], extra_key=None)
    check_batch_lengths(obj, 2)
    rejects(check_batch_lengths, obj, 3, match="sampling_params: 2 entries for a batch of 3 requests")
    obj = SimpleNamespace(video_data=["x"])
    rejects(check_batch_lengths, obj, 2, match="video_data: 1 entries for a batch of 2")


# ---------------------------------------------------------------------- a whole normalized request

def single(**fields):
    base = dict(is_single=True, rid="r1", text=None, input_ids=[1, 2, 3], input_embeds=None,
                sampling_params={"max_new_tokens": 2}, logprob_start_len=-1, top_logprobs_num=0,
                extra_key=None, session_params=None, positional_embed_overrides=None)
    return SimpleNamespace(**{**base, **fields})


def batch(**fields):
    base = dict(is_single=False, rid=["a", "b"], text=None, input_ids=[[1, 2], [3, 4]], input_embeds=None,
                sampling_params=[{}, {}], logprob_start_len=[-1, -1], top_logprobs_num=[0, 0],
                extra_key=None, session_params=None, positional_embed_overrides=None)
    return SimpleNamespace(**{**base, **fields})


@pytest.mark.parametrize("obj", [
    single(), single(input_ids=[511]), single(text="hello", input_ids=None), single(token_ids_logprob=None),
    single(logprob_start_len=3, return_logprob=True), single(logprob_start_len=9, return_logprob=False),
    single(text="hi", input_ids=None, logprob_start_len=9, return_logprob=True),
    single(input_ids=None, text="x", extra_key="k" * MAX_EXTRA_KEY_CHARS),
    batch(), batch(extra_key=["s", "t"]), batch(input_ids=None, text=["a", "b"]), batch(token_ids_logprob=[None, None]),
    # a request of a batch as SGLang builds it (``obj[i]``: no ``is_single`` attribute)
    SimpleNamespace(**{k: v for k, v in vars(single(rid="sub")).items() if k != "is_single"}),
], ids=["single", "last-row", "text", "no-token-ids-logprob", "logprob-start-at-end", "logprob-start-unused",
        "logprob-start-text", "extra-key-limit", "batch", "batch-extra-key",
        "batch-text", "batch-no-token-ids-logprob", "sub-request"])
def test_generate_request_accepts(obj):
    check_generate_request(obj, VOCAB, in_flight={"other": 1})


@pytest.mark.parametrize("obj, match", [
    (single(input_ids=[1, 512]), r"^input_ids: token id 512 at position 1 is outside the vocabulary"),
    (single(input_ids=[-1]), r"^input_ids: token id -1"),
    (batch(input_ids=[[1], [2, 512]]), r"^input_ids\[1\]: token id 512"),
    (batch(input_ids=[[1], []]), r"^input_ids\[1\]: the prompt is empty"),
    (single(rid=["a", "b"]), "^rid: must be a string for a single prompt, got list"),
    (single(rid="busy"), "^rid: a request with rid 'busy' is already in flight"),
    (batch(rid=["new", "busy"]), "^rid: a request with rid 'busy' is already in flight"),
    (batch(rid=["x", "x"]), "^rid: 'x' appears more than once"),
    (batch(sampling_params=[{}]), "^sampling_params: 1 entries for a batch of 2"),
    (batch(logprob_start_len=[-1]), "^logprob_start_len: 1 entries for a batch of 2"),
    (single(logprob_start_len=-2), "^logprob_start_len: must be -1"),
    (batch(logprob_start_len=[0, -5]), r"^logprob_start_len\[1\]: must be -1"),
    (single(logprob_start_len=4, return_logprob=True), "^logprob_start_len: 4 is past the end of the prompt .3 tokens."),
    (batch(logprob_start_len=[2, 3], return_logprob=[False, True]), r"^logprob_start_len\[1\]: 3 is past the end of the prompt .2"),
    (single(top_logprobs_num=VOCAB + 1), r"^top_logprobs_num: must be in \[0, 512\]"),
    (batch(top_logprobs_num=[-1, 0]), r"^top_logprobs_num\[0\]"),
    (single(extra_key=["a", "b"]), "^extra_key: must be a string, got list"),
    (single(extra_key="k" * (MAX_EXTRA_KEY_CHARS + 1)), "^extra_key: 257 characters"),
    (batch(extra_key=["ok", "k" * 300]), r"^extra_key\[1\]: 300 characters"),
    (single(sampling_params={"top_k": 2**40}), "^sampling_params.top_k"),
    (batch(sampling_params=[{}, {"logit_bias": [1]}]), r"^sampling_params\[1\].logit_bias"),
    (single(session_params={"zzz": 1}), "^session_params: unknown field"),
    (single(positional_embed_overrides=5), "^positional_embed_overrides: not accepted"),
    (batch(sampling_params=[{}, {"regex": "a+"}]), r"^sampling_params\[1\].regex: constrained decoding"),
    (single(token_ids_logprob=[5]), "^token_ids_logprob: not accepted"),
    (batch(token_ids_logprob=[None, []]), r"^token_ids_logprob\[1\]: not accepted"),
])
def test_generate_request_rejects(obj, match):
    no_grammar = request_checks.grammar_unavailable("xgrammar", "cpu")
    rejects(check_generate_request, obj, VOCAB, {"busy": 1}, FakeEmbeds, no_grammar, match=match)


# ---------------------------------------------------------------------- the rule machinery and its tables

def test_check_field_reports_the_first_broken_rule():
    def never(value, context):
        return "never"

    check_field("f", None, (never,))  # absent: SGLang fills it in
    rejects(check_field, "f", 1, (field_rules.integer, never), match="^f: never$")
    rejects(check_field, "f", "x", (field_rules.integer, never), match="^f: must be an integer, got 'x'$")


@pytest.mark.parametrize("params, message", [
    # every type row comes before any range row: the type error wins whatever the field order
    ({"top_k": 2**40, "temperature": "hot"}, "sampling_params.temperature: must be a number, got 'hot'"),
    ({"repetition_penalty": 1e-9, "ignore_eos": 1}, "sampling_params.ignore_eos: must be true or false, got 1"),
    ({"regex": 5, "json_schema": "{}"}, "sampling_params.regex: must be a string, got int"),
    ({"logit_bias": [], "stop": 1}, "sampling_params.stop: must be a string or a list of strings, got 1"),
    ({"stop_token_ids": [9999], "stop_regex": "("}, "sampling_params.stop_regex: '(' is not a valid regular expression"),
], ids=["type-before-range", "bool-before-penalty", "grammar-type", "stop-before-bias", "regex-before-ids"])
def test_sampling_rules_report_in_table_order(params, message):
    with pytest.raises(RequestError) as info:
        check_sampling_params(params, VOCAB)
    assert str(info.value).startswith(message)


def test_grammar_refusal_follows_the_type_rows():
    reason = request_checks.grammar_unavailable("xgrammar", "cpu")
    rejects(check_sampling_params, {"ebnf": 5, "regex": "a"}, VOCAB, "sampling_params", SAMPLING_FIELDS_ALL, reason,
            match="^sampling_params.ebnf: must be a string, got int$")
    check_sampling_params({"regex": "a"}, VOCAB, no_grammar="")  # no reason given: nothing refused


@pytest.mark.parametrize("value, context, expected", [
    (-1, Context(), None),
    (-2, Context(), "must be -1 (none) or a prompt position >= 0, got -2"),
    (5, Context(prompt_len=4), "5 is past the end of the prompt (4 tokens)"),
    (5, Context(prompt_len=4, return_logprob=False), None),
    (5, Context(prompt_len=None), None),
], ids=["none", "below", "past-end", "unused", "length-unknown"])
def test_logprob_start_rule(value, context, expected):
    assert field_rules.logprob_start(value, context) == expected


@pytest.mark.parametrize("struct_fields, expected", [
    ({"SamplingParams": request_checks.SAMPLING_FIELDS | request_checks.SAMPLING_INTERNAL_FIELDS,
      "SessionParams": tuple(request_checks.SESSION_FIELDS)}, None),
    ({"SessionParams": ("id", "rid", "offset", "replace", "drop_previous_output", "new_one")},
     "SessionParams fields changed (SGLang internals changed?): ['new_one']; update serving/request_checks.py"),
    ({"SamplingParams": ("max_new_tokens",)}, "SamplingParams fields changed"),
], ids=["same", "added", "removed"])
def test_field_table_drift(struct_fields, expected):
    drift = field_table_drift(struct_fields)
    assert drift == expected if expected is None else drift.startswith(expected)


@pytest.mark.parametrize("value, single, count, expected", [
    ([1, 2], True, 1, [[1, 2]]),
    ([1, 2, 3], False, 2, [1, 2]),
    (None, False, 3, [None, None, None]),
    ("k", False, 2, ["k", "k"]),
], ids=["single-keeps-list", "batch-list-cut", "batch-none", "batch-scalar"])
def test_per_request(value, single, count, expected):
    assert per_request(value, single, count) == expected


# ---------------------------------------------------------------------- after tokenization, other requests

@pytest.mark.parametrize("fields, input_ids, match", [
    ({"input_ids": [1]}, [1, 512], r"^input_ids: token id 512 at position 1"),
    ({"input_ids": None, "text": "hi"}, [], r"^text \(tokenized\): the prompt is empty"),
    ({"input_ids": None, "logprob_start_len": 3, "return_logprob": True}, [1, 2], "^logprob_start_len: 3 is past the end"),
], ids=["ids", "text", "logprob-start"])
def test_tokenized_prompt_rejects(fields, input_ids, match):
    rejects(check_tokenized_prompt, SimpleNamespace(**fields), input_ids, VOCAB, match=match)


@pytest.mark.parametrize("fields, input_ids", [
    ({"input_ids": [1]}, [1, 511]),
    ({"input_ids": None, "logprob_start_len": 3}, [1, 2]),  # return_logprob absent: unused
    ({"input_embeds": [[0.1]]}, [999]),  # embeddings: the ids are placeholders
    ({}, None),
], ids=["ids", "logprob-unused", "embeds", "no-ids"])
def test_tokenized_prompt_accepts(fields, input_ids):
    check_tokenized_prompt(SimpleNamespace(**fields), input_ids, VOCAB)


def test_request_rids_of_an_embedding_request():
    check_request_rids(SimpleNamespace(is_single=False, rid=["a", "b"]), {"c": 1})
    rejects(check_request_rids, SimpleNamespace(rid="c"), {"c": 1}, match="^rid: a request with rid 'c' is already")
    rejects(check_request_rids, SimpleNamespace(is_single=False, rid=["a", "a"]), match="^rid: 'a' appears more than once")


def test_hooks_hand_back_the_original_result():
    manager = SimpleNamespace(model_config=SimpleNamespace(vocab_size=VOCAB))
    assert validation.after_validate_one("kept", manager, SimpleNamespace(input_ids=[1]), [1]) == "kept"
    with pytest.raises(RequestError, match="^input_ids: token id 512"):
        validation.after_validate_one("kept", manager, SimpleNamespace(input_ids=[512]), [512])
    assert validation.after_openai_validate("SGLang's error", None, SimpleNamespace(cache_salt=5)) == "SGLang's error"
    assert validation.after_openai_validate(None, None, SimpleNamespace(cache_salt=5)).startswith("cache_salt: must be")


# ---------------------------------------------------------------------- registration, every policy

@pytest.mark.parametrize("policy", [None, "radix", "exact", "scr"])
def test_plugin_registers_validation_for_every_policy(fake_sglang, monkeypatch, policy):
    from policy.registry import SPEC_ENV, PolicySpec

    if policy is None:
        monkeypatch.delenv(SPEC_ENV, raising=False)
    else:
        monkeypatch.setenv(SPEC_ENV, PolicySpec.resolve(policy).to_json())
    plugin.install()
    registered = {(target, kind) for target, _, kind in fake_sglang.hooks}
    assert {
        (validation.NORMALIZE, "before"),
        (validation.INIT_REQ_STATE, "before"),
        (validation.VALIDATE_ONE, "after"),
        (validation.CHAT_VALIDATE, "after"),
        (validation.COMPLETION_VALIDATE, "after"),
        (validation.BODY_VALIDATION, "around"),
        (validation.EXTRA_KEY, "around"),
        (validation.request_bodies.REQUEST_JSON, "around"),
    } <= registered
    assert set(validation.TARGETS) <= set(plugin.installed_targets())
    assert len([t for t, _, _ in fake_sglang.hooks if t in validation.TARGETS]) == len(validation.TARGETS)


def test_body_validation_turns_validator_crashes_into_validation_errors():
    def original(*, field, value, values, loc):
        return value.get("type"), []  # a mode="before" validator that assumes a dict

    call = dict(field=None, values={}, loc=("body",))
    assert validation.around_body_validation(original, value={"type": "t"}, **call) == ("t", [])
    value, errors = validation.around_body_validation(original, value=[1], **call)
    assert value is None and errors[0]["loc"] == ("body",)
    assert errors[0]["msg"].startswith("malformed request body: 'list' object has no attribute 'get'")
    with pytest.raises(AttributeError):  # not a request body: not ours to answer
        validation.around_body_validation(original, field=None, value=[1], values={}, loc=("query", "x"))


@pytest.mark.parametrize("fields, expected", [
    ({"rid": None, "input_ids": [1, 2]}, ["u0"]),  # a single prompt: SGLang made n rids of it
    ({"rid": None, "input_ids": [[1], [2], [3]]}, ["u0", "u1", "u2"]),
    ({"rid": "r", "text": "hi"}, ["r_0"]),
    ({"rid": "r", "text": ["a", "b"]}, ["r_0", "r_1"]),
    ({"rid": ["a", "b"], "input_ids": [[1], [2]]}, ["a", "b"]),  # the client's list: untouched
    ({"rid": None, "input_embeds": [[0.1, 0.2]]}, ["u0"]),
    ({"rid": None, "input_embeds": [[[0.1]], [[0.2]]]}, ["u0", "u1"]),
])
def test_align_parallel_rids(fields, expected):
    for sampling in ({"n": 3}, [{"n": 3}, {"n": 3}]):
        obj = SimpleNamespace(**{"text": None, "input_ids": None, "input_embeds": None, "sampling_params": sampling, **fields})
        names = iter(f"u{i}" for i in range(10))
        request_checks.align_parallel_rids(obj, lambda: next(names))
        assert obj.rid == expected


@pytest.mark.parametrize("sampling", [None, {}, {"n": 1}, {"n": None}, [{"n": 1}], []])
def test_align_parallel_rids_leaves_n1_alone(sampling):
    obj = SimpleNamespace(rid=None, text="hi", input_ids=None, input_embeds=None, sampling_params=sampling)
    request_checks.align_parallel_rids(obj)
    assert obj.rid is None


# ---------------------------------------------------------------------- request limits (issue 33)

LIMITS = request_limits.RequestLimits(max_prompts=3, max_sequences=6, max_stop_regexes=2, max_stop_regex_chars=12)


def unnormalized(**fields):
    return SimpleNamespace(**{"sampling_params": None, "text": None, "input_ids": None, "input_embeds": None, **fields})


@pytest.mark.parametrize("obj", [
    unnormalized(text="x"), unnormalized(text=["a", "b", "c"]), unnormalized(input_ids=[[1], [2], [3]]),
    unnormalized(input_ids=[1, 2, 3, 4, 5]),  # one prompt of five tokens
    unnormalized(text=["a", "b"], sampling_params={"n": 3}), unnormalized(text="a", sampling_params={"n": 6}),
    unnormalized(text=["a", "b"], sampling_params=[{"n": 3}, {"n": 3}]),
    unnormalized(input_embeds=[[[0.1]], [[0.2]], [[0.3]]]),
    unnormalized(text="a", sampling_params={"stop_regex": ["abcdef", "ghijkl"]}),
    unnormalized(text=["a", "b"], sampling_params=[{"stop_regex": "abc"}, {"stop_regex": ["abc", "def"]}]),
    unnormalized(sampling_params={"stop_regex": "a"}),  # no prompt: SGLang's own error comes later
])
def test_request_limits_accept(obj):
    request_checks.check_request_limits(obj, LIMITS)


@pytest.mark.parametrize("obj, message", [
    (unnormalized(text=["a"] * 4), "text: 4 prompts in one request, over the limit of 3 (--max-prompts 3)"),
    (unnormalized(input_ids=[[1]] * 10_000), "input_ids: 10000 prompts in one request"),
    (unnormalized(input_embeds=[[[0.1]]] * 4), "input_embeds: 4 prompts"),
    (unnormalized(text=["a", "b", "c"], sampling_params={"n": 3}),
     "sampling_params.n: 3 prompts x n = 3 is 9 sequences in one request, over the limit of 6 (--max-sequences 6)"),
    (unnormalized(text="a", sampling_params=[{"n": 7}]), "sampling_params.n: 1 prompts x n = 7 is 7 sequences"),
    (unnormalized(text="a", sampling_params={"stop_regex": ["a", "b", "c"]}),
     "sampling_params.stop_regex: 3 distinct patterns in one request, over the limit of 2 (--max-stop-regexes 2)"),
    (unnormalized(text=["a", "b"], sampling_params=[{"stop_regex": "a"}, {"stop_regex": ["b", "c"]}]),
     "sampling_params.stop_regex: 3 distinct patterns"),
    (unnormalized(text="a", sampling_params={"stop_regex": "x" * 13}),
     "sampling_params.stop_regex: 13 characters of patterns in one request, over the limit of 12 "
     "(--max-stop-regex-chars 12)"),
])
def test_request_limits_refuse_naming_the_flag(obj, message):
    with pytest.raises(RequestError) as info:
        request_checks.check_request_limits(obj, LIMITS)
    assert str(info.value).startswith(message), str(info.value)


def test_request_limits_run_before_sglang_normalizes(monkeypatch):
    """The normalize hook reads this server's limits (the launcher's env var)."""
    monkeypatch.delenv(request_limits.LIMITS_ENV, raising=False)
    with pytest.raises(RequestError, match="--max-prompts 64"):
        validation.before_normalize(unnormalized(text=["a"] * 65))
    monkeypatch.setenv(request_limits.LIMITS_ENV, LIMITS.to_json())
    with pytest.raises(RequestError, match="--max-prompts 3"):
        validation.before_normalize(unnormalized(text=["a"] * 4))
