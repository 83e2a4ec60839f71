"""The body schemas built from SGLang 0.5.16's own request types (``patches/validation.route_schemas``)
and the stop-regex matcher (``patches/stop_regex.py``), without a server.

Every request of issue 19 that stopped, stalled or misled the server is refused here with the
field it names; the bodies our own tools send (soak, fidelity, the BrowseComp-Plus agent with tools
and tool results) pass unchanged.
"""

from __future__ import annotations

import re

import pytest

from eval.bcp.client import ChatClient
from eval.soak.run import completions_payload, generate_payload
from patches import stop_regex, validation
from serving import route_schemas, schema
from serving.route_schemas import CHAT, COMPLETIONS, GENERATE

pytestmark = pytest.mark.integration
GEN = {"input_ids": [1, 2, 3], "sampling_params": {"max_new_tokens": 4}}
CHAT_BODY = {"model": "default", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 4}
COMPLETION_BODY = {"model": "default", "prompt": "hi", "max_tokens": 4}


@pytest.fixture(scope="module")
def routes():
    return validation.route_schemas()


def refusal(routes, route: str, body) -> str | None:
    try:
        routes[route].check(body)
    except schema.SchemaError as exc:
        return str(exc)
    return None


def sampling(**params):
    return {**GEN, "sampling_params": {"max_new_tokens": 4, **params}}


# The requests of issue 19 -> the field named and the start of the problem.
ISSUE_19 = [
    (GENERATE, {**sampling(stream_interval="x"), "stream": True}, "sampling_params.stream_interval: must be an integer"),
    (GENERATE, {**GEN, "session_params": {"id": [1, 2]}}, "session_params.id: must be a string"),
    (GENERATE, sampling(min_new_tokens="x"), "sampling_params.min_new_tokens: must be an integer"),
    (GENERATE, sampling(min_new_tokens=[1]), "sampling_params.min_new_tokens: must be an integer"),
    (GENERATE, {**GEN, "text": "a\ud800"}, "text: is not valid Unicode"),
    (GENERATE, {"text": None, **sampling(stop="\ud800")}, "sampling_params.stop: is not valid Unicode"),
    (GENERATE, {**GEN, "rid": "\ud800"}, "rid: is not valid Unicode"),
    (COMPLETIONS, {**COMPLETION_BODY, "prompt": "a\ud800"}, "prompt: is not valid Unicode"),
    (CHAT, {**CHAT_BODY, "stop": "\ud800"}, "stop: is not valid Unicode"),
    (GENERATE, sampling(custom_params={"a": schema.nested(300)}), "sampling_params.custom_params.a[0]: must be"),
    (GENERATE, {**GEN, "session_params": {"id": schema.nested(300)}}, "session_params.id: must be a string"),
    (CHAT, {**CHAT_BODY, "chat_template_kwargs": {"tools": []}}, "chat_template_kwargs.tools: is an argument"),
    (CHAT, {**CHAT_BODY, "chat_template_kwargs": {"chat_template": "{{ 1 }}"}}, "chat_template_kwargs.chat_template"),
    (CHAT, {**CHAT_BODY, "chat_template_kwargs": {"k": schema.nested(300)}}, "chat_template_kwargs.k[0][0]"),
    (GENERATE, {"text": [], "sampling_params": {}}, "text: must not be an empty list"),
    (GENERATE, {"text": "hi", "input_ids": [1, 2]}, "input_ids: give only one of text, input_ids, input_embeds"),
    (GENERATE, sampling(sampling_seed="x"), "sampling_params.sampling_seed: must be an integer"),
    (COMPLETIONS, {**COMPLETION_BODY, "cache_salt": ""}, "cache_salt: must not be empty"),
    (CHAT, {**CHAT_BODY, "cache_salt": "a\x1fb"}, "cache_salt: must not contain control characters"),
    (GENERATE, {**GEN, "extra_key": ""}, "extra_key: must not be empty"),
    (GENERATE, {**GEN, "extra_key": ["ok", ""]}, "extra_key[1]: must not be empty"),
    (GENERATE, sampling(max_new_tokens=10**30), "sampling_params.max_new_tokens: 1000000000000000000000000000000 is "
                                                "outside"),
    (GENERATE, sampling(temperture=0.5), "sampling_params.temperture: unknown field"),
    (GENERATE, sampling(stop_strs=["x"]), "sampling_params.stop_strs: unknown field"),  # internal, not API
    (GENERATE, {**GEN, "http_worker_ipc": "ipc:///tmp/x"}, "http_worker_ipc: not accepted in a request"),
    (GENERATE, {**GEN, "return_bytes": True}, "return_bytes: not accepted in a request"),
    (GENERATE, {**GEN, "logprob_start_len": "0"}, "logprob_start_len: must be"),
]


@pytest.mark.parametrize("route, body, expected", ISSUE_19, ids=[e.split(":")[0] for _, _, e in ISSUE_19])
def test_issue_19_requests_are_refused_naming_the_field(routes, route, body, expected):
    found = refusal(routes, route, body)
    assert found is not None and found.startswith(expected), found


def test_a_server_only_field_at_sglangs_default_is_accepted(routes):
    """The router spells every field of a /generate request out, server-only ones at their
    defaults (``return_bytes: false``); that is what the server would set, so it passes."""
    assert routes[GENERATE].check({**GEN, "return_bytes": False, "lora_id": None})["return_bytes"] is False
    from serving.schema import to_json

    route = routes[GENERATE]
    rebuilt = type(route).from_json(GENERATE, to_json(route.body), route.rules_json())
    assert rebuilt.server_defaults == {"return_bytes": False}
    assert rebuilt.check({**GEN, "return_bytes": False})["return_bytes"] is False


def test_null_where_sglang_has_a_default_means_unset(routes):
    """``n: null`` reached ``n > 1`` in SGLang's normalisation (a TypeError, a 500)."""
    body = sampling(n=None, temperature=None, max_new_tokens=None, stop=None)
    out = routes[GENERATE].check(body)
    assert out["sampling_params"] == {"max_new_tokens": None, "stop": None}  # Optional: null stays a value
    assert routes[GENERATE].check({**GEN, "stream": None}) == GEN
    chat = routes[CHAT].check({**CHAT_BODY, "n": None, "temperature": None})
    assert "n" not in chat and chat["temperature"] is None
    assert refusal(routes, CHAT, {**CHAT_BODY, "messages": None}) == "messages: must not be null"


def bcp_chat_bodies() -> list[dict]:
    tools = [{"type": "function", "function": {"name": "search", "description": "search the corpus",
              "parameters": {"type": "object", "properties": {"query": {"type": "string"}}, "required": ["query"],
                             "additionalProperties": False}}}]
    messages = [
        {"role": "system", "content": "You are a research agent."},
        {"role": "user", "content": "Who wrote it?"},
        {"role": "assistant", "content": "", "reasoning_content": "search first",
         "tool_calls": [{"id": "call_1", "type": "function",
                         "function": {"name": "search", "arguments": "{\"query\": \"author\"}"}}]},
        {"role": "tool", "content": "[doc 1] ...", "tool_call_id": "call_1"},
        {"role": "user", "content": [{"type": "text", "text": "and when?"}]},
    ]
    client = ChatClient(lambda path, payload: {}, sampling={"temperature": 0.6, "top_p": 0.95, "max_tokens": 64},
                        chat_template_kwargs={"enable_thinking": True}, cache_salt="run-1")
    return [client.payload(messages, tools, "q1.3"), {**client.payload(messages[:2], None, "q1.1"), "stream": True,
                                                      "stream_options": {"include_usage": True}}]


def test_the_bodies_our_tools_send_pass_unchanged(routes):
    bodies = [
        (GENERATE, generate_payload("r.1", [1, 2, 3], "tenant", 8, logprobs=True)),
        (GENERATE, {"text": ["a", "b"], "sampling_params": [{"max_new_tokens": 2}, {"max_new_tokens": 3, "n": 1}],
                    "rid": ["x", "y"], "return_logprob": [True, False]}),
        (GENERATE, {**GEN, "sampling_params": {"max_new_tokens": 2, "stop_token_ids": [5], "logit_bias": {"5": 1.5},
                                               "custom_params": {"a": [1, "b", None], "b": {"c": 1.5}}}}),
        (COMPLETIONS, completions_payload("r.2", [1, 2, 3], "tenant", 8, "default")),
        (COMPLETIONS, {**COMPLETION_BODY, "prompt": [[1, 2], [3]], "cache_salt": "s", "extra_key": "k"}),
        *((CHAT, body) for body in bcp_chat_bodies()),
        (CHAT, {**CHAT_BODY, "response_format": {"type": "json_schema", "schema": {"type": "object"}}}),
        (CHAT, {**CHAT_BODY, "tool_choice": {"type": "function", "function": {"name": "search"}}}),
        (CHAT, {**CHAT_BODY, "reasoning_effort": "0.5"}),  # SGLang's own validator reads numeric strings
    ]
    for route, body in bodies:
        assert routes[route].check(body) == body, (route, refusal(routes, route, body))


def test_the_schema_follows_sglangs_types(routes):
    """Derived, not hand-kept: every GenerateReqInput / SamplingParams / SessionParams field is there."""
    import dataclasses

    from sglang.srt.managers.io_struct import GenerateReqInput, SessionParams
    from sglang.srt.sampling.sampling_params import SamplingParams

    generate = routes[GENERATE].body
    assert set(generate.fields) == {f.name for f in dataclasses.fields(GenerateReqInput) if f.init}
    params = generate.fields["sampling_params"].node.options[1]
    assert set(params.fields) == set(SamplingParams.__struct_fields__) - route_schemas.INTERNAL_SAMPLING
    assert set(generate.fields["session_params"].node.fields) == set(SessionParams.__struct_fields__)
    counts = {route: route_schemas.field_count(r.body) for route, r in routes.items()}
    assert counts[GENERATE] >= 90 and counts[COMPLETIONS] >= 100 and counts[CHAT] >= 200, counts


# -------------------------------------------------------------------------------------- stop_regex

BOMB = "([\\s\\S]+[\\s\\S]+[\\s\\S]+)+\uffff"


def test_stop_regex_patterns_re2_cannot_match_in_linear_time_are_refused():
    assert stop_regex.pattern_problem(BOMB) is None  # accepted: RE2 matches it in linear time
    for pattern in ("(a)\\1", "(?<=a)b", "a(?=b)", "\\uffff"):
        problem = stop_regex.pattern_problem(pattern)
        assert problem is not None and "cannot be matched in linear time" in problem, pattern


@pytest.mark.parametrize("pattern, text", [
    ("\\d+\\.\\d+", "version 3.14 ok"), ("^ab", "abc"), ("c$", "abc"), ("(?i)STOP", "please stop"),
    ("x{2,3}", "axxxb"), ("[^a-z]", "abc"), ("</?tool>", "<tool>"), ("nomatch", "abc"), (".", "\n"),
])
def test_linear_search_agrees_with_re_where_both_apply(pattern, text):
    ours = stop_regex.LinearSearch.search(pattern, text)
    theirs = re.search(pattern, text)
    assert (ours is None) == (theirs is None)
    if theirs is not None:
        assert ours.group(0) == theirs.group(0)


def test_the_bomb_is_matched_over_a_long_output():
    """Python's re takes exponential time here (the scheduler stalled for every request)."""
    assert stop_regex.LinearSearch.search(BOMB, "x" * 20_000) is None
    assert stop_regex.LinearSearch.search(BOMB, "xyz\uffff") is not None


def test_install_swaps_the_schedulers_re_only():
    from sglang.srt.managers import schedule_batch

    stop_regex.install()
    stop_regex.install()  # idempotent
    assert isinstance(schedule_batch.re, stop_regex.LinearSearch)
    assert schedule_batch.re.compile is re.compile and re.search is not schedule_batch.re.search


# ------------------------------------------------------------- what a stop regex may cost (issue 33)

# The heavy pattern of issue 33: a 300-code-point class repeated 1,000 times (308 characters). Under
# RE2's default max_mem (8 MiB) it compiled for ~0.15 s into 417,004 instructions and ~3.3 MB.
HEAVY = "[" + "".join(chr(0x4E00 + 7 * i) for i in range(300)) + "]{1000}"


@pytest.fixture
def limits_env(monkeypatch):
    """Set this process's request limits as the launcher would."""
    from serving.request_limits import LIMITS_ENV, RequestLimits

    def set_limits(**values):
        limits = RequestLimits(**values)
        monkeypatch.setenv(LIMITS_ENV, limits.to_json())
        return limits

    yield set_limits
    monkeypatch.delenv(LIMITS_ENV, raising=False)
    stop_regex.cache()  # rebuilt with the defaults for the next test


def test_a_pattern_over_max_mem_is_refused_naming_the_flag(limits_env):
    limits_env()
    problem = stop_regex.pattern_problem(HEAVY)
    assert problem is not None and "one pattern may use (--stop-regex-max-mem 256K; RE2: pattern too large" in problem
    assert HEAVY not in stop_regex.cache()
    limits_env(stop_regex_max_mem=8 << 20)  # RE2's own default takes it
    assert stop_regex.pattern_problem(HEAVY) is None and HEAVY in stop_regex.cache()


def test_realistic_patterns_compile_within_the_default_max_mem(limits_env):
    limits_env()
    for pattern in ("</?(tool_call|function_call)>", "(?i)\\n\\s*(observation|final answer|action input)\\s*:",
                    "\\n\\n(?:User|Human|Assistant):", "a" * 16_000, "(?:" + "|".join(f"word{i:04d}" for i in range(300)) + ")"):
        assert stop_regex.pattern_problem(pattern) is None, pattern[:40]


def test_the_compiled_patterns_stay_within_their_bytes(limits_env):
    import re2

    from serving.request_limits import stop_regex_entry_bytes

    limits = limits_env(stop_regex_max_mem=64 << 10, stop_regex_cache_bytes=1 << 20)
    module_cache = re2._Regexp._make.cache_info().currsize
    patterns = [f"stop{i}[a-z]+" for i in range(50)]
    for pattern in patterns:
        assert stop_regex.LinearSearch.search(pattern, f"xx stop{pattern[4:-6]}abc yy") is not None
    cache = stop_regex.cache()
    per_entry = stop_regex_entry_bytes(patterns[0], limits.stop_regex_max_mem)
    assert len(cache) == limits.stop_regex_cache_bytes // per_entry < 50 and cache.charged <= limits.stop_regex_cache_bytes
    assert cache.evictions == 50 - len(cache)
    assert patterns[-1] in cache and patterns[0] not in cache  # least recently used went first
    assert stop_regex.LinearSearch.search(patterns[0], "stop0abc") is not None  # evicted: compiled again
    assert re2._Regexp._make.cache_info().currsize == module_cache  # google-re2's own cache is not used


def test_surrogates_never_reach_re2():
    assert stop_regex.pattern_problem("a\ud800") == "'a\\ud800' is not valid Unicode"


def test_install_stops_when_re2s_constructor_changed(monkeypatch):
    import re2

    class Changed:
        def __init__(self, pattern, options, extra):
            pass

    monkeypatch.setattr(re2, "_Regexp", Changed)
    with pytest.raises(RuntimeError, match="google-re2 internals changed"):
        stop_regex.install()


# ----------------------------------------------------- template arguments, server-side fetches (issue 33)

TEMPLATE_ARGUMENTS = ["messages", "add_generation_prompt", "tools", "documents", "conversation", "tokenize",
                      "return_dict", "chat_template", "continue_final_message"]


@pytest.mark.parametrize("key", TEMPLATE_ARGUMENTS)
def test_chat_template_kwargs_may_not_carry_the_templates_own_arguments(routes, key):
    """``messages`` raised "multiple values for keyword argument" inside the template call (a 500)."""
    found = refusal(routes, CHAT, {**CHAT_BODY, "chat_template_kwargs": {"enable_thinking": True, key: []}})
    assert found == (f"chat_template_kwargs.{key}: is an argument the server passes to the chat template itself; "
                     "it cannot be set here")


def test_template_kwargs_a_template_reads_are_accepted(routes):
    body = {**CHAT_BODY, "chat_template_kwargs": {"enable_thinking": False, "reasoning_effort": "low", "x": {"y": 1}}}
    assert routes[CHAT].check(body) == body


def test_the_render_arguments_come_from_transformers_source():
    assert {"messages", "tools", "documents", "add_generation_prompt"} <= set(validation.template_render_arguments())


@pytest.mark.parametrize("field, value", [
    ("image_data", "http://169.254.169.254/latest/meta-data"), ("image_data", "/etc/passwd"),
    ("image_data", ["file:///etc/hostname"]), ("video_data", "http://127.0.0.1:1/v.mp4"), ("audio_data", "/tmp/a.wav"),
    ("image_data", "data:image/png;base64,iVBORw0KGgo="), ("image_data", [["/x.png"]]),
])
def test_generate_refuses_what_sglang_would_fetch(routes, field, value):
    found = refusal(routes, GENERATE, {**GEN, field: value})
    assert found is not None and found.startswith(f"{field}: not accepted by this server: this server serves text "
                                                  "only, and SGLang would load it"), found


@pytest.mark.parametrize("part, index", [
    ({"type": "image_url", "image_url": {"url": "http://127.0.0.1:9/x.png"}}, 1),
    ({"type": "video_url", "video_url": {"url": "file:///etc/passwd"}}, 1),
    ({"type": "audio_url", "audio_url": {"url": "/dev/zero"}}, 1),
])
def test_chat_refuses_parts_sglang_would_fetch(routes, part, index):
    body = {**CHAT_BODY, "messages": [{"role": "system", "content": "s"},
                                      {"role": "user", "content": [{"type": "text", "text": "see"}, part]}]}
    found = refusal(routes, CHAT, body)
    assert found is not None and found.startswith(f"messages[1].content[{index}]: {part['type']} parts are not "
                                                  "accepted by this server"), found


def test_text_only_requests_and_null_media_pass(routes):
    assert routes[GENERATE].check({**GEN, "image_data": None, "audio_data": None}) is not None
    body = {**CHAT_BODY, "messages": [{"role": "user", "content": [{"type": "text", "text": "hi"}]}]}
    assert routes[CHAT].check(body) == body


def test_a_client_rebuilds_the_fetch_rules_from_the_served_json(routes):
    from serving.schema import to_json

    for route_name, body in ((GENERATE, {**GEN, "audio_data": "x"}),
                             (CHAT, {**CHAT_BODY, "messages": [{"role": "user", "content": [
                                 {"type": "image_url", "image_url": {"url": "x"}}]}]})):
        route = routes[route_name]
        rebuilt = type(route).from_json(route_name, to_json(route.body), route.rules_json())
        assert refusal({route_name: rebuilt}, route_name, body) == refusal(routes, route_name, body) is not None


def test_batch_size_is_refused_before_the_schema_walks_the_prompts(monkeypatch):
    """A body of a million one-token prompts: the limit is read off the raw JSON, not after walking it."""
    import types

    from sglang.srt.entrypoints.openai.protocol import CompletionRequest
    from sglang.srt.managers.io_struct import GenerateReqInput
    from fastapi import HTTPException

    from serving.request_limits import LIMITS_ENV

    monkeypatch.delenv(LIMITS_ENV, raising=False)
    walked = []
    monkeypatch.setattr(type(validation.route_schemas()[GENERATE]), "check", lambda self, body: walked.append(body))

    def field(model):
        return types.SimpleNamespace(field_info=types.SimpleNamespace(annotation=model))

    for model, body, expected in (
            (GenerateReqInput, {"input_ids": [[5]] * 1_000_000}, "input_ids: 1000000 prompts in one request, over "
                                                                 "the limit of 64 (--max-prompts 64)"),
            (CompletionRequest, {"model": "m", "prompt": ["a"] * 4, "n": 100}, "n: 4 prompts x n = 100 is 400 "
                                                                             "sequences")):
        with pytest.raises(HTTPException) as info:
            validation.around_body_validation(lambda **kw: None, field=field(model), value=body, values={},
                                              loc=("body",))
        assert info.value.status_code == 400 and info.value.detail.startswith(expected)
    assert walked == []
