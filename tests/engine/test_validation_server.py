"""Request validation (``patches/validation.py``) on a live server: malformed requests get a 400
naming the field, and the server keeps serving.

One ``--cache-policy radix`` server (the checks run in the HTTP process and are the same for every
policy; ``tests/unit/test_validation.py`` checks they are registered for each). Before the
overlay's checks, a token id >= the vocabulary size (512 rows on the tiny model; its tokenizer has
480 tokens) or < 0 killed the scheduler and the server with it.
"""

from __future__ import annotations

import json
import re
import threading
import urllib.error
import urllib.request

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from eval.server import wait_for_events
from eval.soak import bounds, safety, schema_fuzz
from eval.soak.checks import PASS
from scr.authors_log import parse_finish
from serving import route_policy
from serving.route_schemas import CHAT as CHAT_ROUTE
from serving.route_schemas import COMPLETIONS, GENERATE
from tests.engine.conftest import RADIX_ARGS, start_server

pytestmark = pytest.mark.engine

VOCAB = 512
GOOD = {"input_ids": [1, 2, 3], "sampling_params": {"temperature": 0.0, "max_new_tokens": 2}}
CHAT = {"model": "default", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 2}
TIMEOUT = 60.0
# One request limit set on the command line (the rest at their defaults): it must reach the HTTP
# process (issue 33). 2 MiB is over every body the other tests send.
BODY_LIMIT_ARGS = ["--max-request-body", "2M"]


@pytest.fixture(scope="module")
def server(tiny_model_dir, tmp_path_factory):
    tmp = tmp_path_factory.mktemp("validation")
    server = start_server(tiny_model_dir, tmp, "validation",
                          [*RADIX_ARGS, "--cache-policy", "radix", "--cache-events", str(tmp / "events.jsonl"),
                           "--log-requests", "--log-requests-level", "0", *BODY_LIMIT_ARGS],
                          graceful_stop=True)
    server.events_path = tmp / "events.jsonl"
    yield server
    server.stop()
    assert server.fatal_lines() == [], server.log_tail()
    assert "Scheduler hit an exception" not in server.log_text(), server.log_tail()
    # No request state left behind: SIGTERM drains at once (n > 1 used to leave rids forever).
    assert not re.search(r"Remaining number of requests [1-9]", server.log_text()), server.log_tail()


def send(server, path: str, payload, timeout: float = TIMEOUT, headers=None) -> tuple[int, str]:
    """POST and return (status, body) whatever the status; a dropped connection raises."""
    body = payload if isinstance(payload, bytes) else json.dumps(payload).encode()
    request = urllib.request.Request(server.url + path, data=body,
                                     headers={"Content-Type": "application/json", **(headers or {})})
    try:
        with urllib.request.urlopen(request, timeout=timeout) as response:
            return response.status, response.read().decode(errors="replace")
    except urllib.error.HTTPError as exc:
        return exc.code, exc.read().decode(errors="replace")


def message(body: str) -> str:
    data = json.loads(body)
    return data["error"]["message"] if "error" in data else data["message"]


def assert_serving(server) -> None:
    assert server.process.poll() is None, server.log_tail()
    status, body = send(server, "/generate", GOOD)
    assert status == 200, body
    assert len(json.loads(body)["output_ids"]) == 2


def gen(sampling=None, **fields) -> dict:
    return {"input_ids": [1, 2, 3], "sampling_params": {"max_new_tokens": 2, **(sampling or {})}, **fields}


def chat(**fields) -> dict:
    return {**CHAT, **fields}


# ---------------------------------------------------------------------- the two crashes of issue 11


@pytest.mark.parametrize("bad_id", [VOCAB, -1])
def test_token_id_outside_the_vocabulary_is_a_400_and_the_server_lives(server, bad_id):
    status, body = send(server, "/generate", {"input_ids": [1, 2, bad_id], "sampling_params": {"max_new_tokens": 2}})
    assert status == 400, body
    assert message(body) == f"input_ids: token id {bad_id} at position 2 is outside the vocabulary [0, {VOCAB})"
    assert_serving(server)


def test_ids_between_tokenizer_and_vocabulary_size_are_served(server):
    # 480..511 have no token in the tokenizer but are embedding rows: valid.
    status, body = send(server, "/generate", gen(input_ids=[480, 511]))
    assert status == 200, body


# ---------------------------------------------------------------------- every other check


CASES = [
    # (id, path, payload, text the 400's message starts with)
    ("batch-id", "/generate", gen(input_ids=[[1, 2], [3, 512]]), "input_ids[1]: token id 512 at position 1"),
    ("batch-empty-prompt", "/generate", gen(input_ids=[[1], []]), "input_ids[1]: the prompt is empty"),
    ("chat-input-ids", "/v1/chat/completions", chat(input_ids=[1, 600]), "input_ids: token id 600"),
    ("batch-duplicate-rid", "/generate", gen(input_ids=[[1], [2]], rid=["x", "x"]), "Duplicate request IDs"),
    ("rid-list-single", "/generate", gen(rid=["a"]), "rid: must be a string for a single prompt"),
    ("chat-rid-list", "/v1/chat/completions", chat(rid=["a", "b"]), "rid: must be a string for a single prompt"),
    ("logprob-start-below-1", "/generate", gen(return_logprob=True, logprob_start_len=-100), "logprob_start_len: must be -1"),
    ("logprob-start-past-prompt", "/generate", gen(return_logprob=True, logprob_start_len=4),
     "logprob_start_len: 4 is past the end of the prompt (3 tokens)"),
    ("logprob-start-past-text", "/generate", {"text": "hi", "return_logprob": True, "logprob_start_len": 50,
                                              "sampling_params": {"max_new_tokens": 1}}, "logprob_start_len: 50 is past"),
    ("logprob-start-past-prompt-n2", "/generate", gen({"n": 2}, return_logprob=True, logprob_start_len=9),
     "logprob_start_len[0]: 9 is past"),
    ("top-logprobs-over-vocab", "/generate", gen(return_logprob=True, top_logprobs_num=VOCAB + 1), "top_logprobs_num: must be in [0, 512]"),
    ("top-logprobs-negative", "/generate", gen(return_logprob=True, top_logprobs_num=-1), "top_logprobs_num: must be in [0, 512]"),
    ("chat-top-logprobs", "/v1/chat/completions", chat(logprobs=True, top_logprobs=600), "top_logprobs_num: must be in [0, 512]"),
    ("token-ids-logprob", "/generate", gen(return_logprob=True, token_ids_logprob=[5]), "token_ids_logprob: not accepted"),
    ("token-ids-logprob-batch", "/generate", gen(input_ids=[[1], [2]], return_logprob=True, token_ids_logprob=[[5], [6]]),
     "token_ids_logprob[0]: not accepted"),
    ("extra-key-list", "/generate", gen(extra_key=["a", "b"]), "extra_key: must be a string, got list"),
    ("extra-key-long", "/generate", gen(extra_key="k" * 257), "extra_key: 257 characters"),
    ("chat-cache-salt-list", "/v1/chat/completions", chat(cache_salt=["a"]), "cache_salt: must be a string"),
    ("chat-cache-salt-long", "/v1/chat/completions", chat(cache_salt="s" * 257), "cache_salt: 257 characters"),
    ("chat-cache-salt-empty", "/v1/chat/completions", chat(cache_salt=""), "cache_salt: must not be empty"),
    ("n-over-limit", "/generate", gen({"n": 129}), "sampling_params.n: must be an integer in [1, 128]"),
    ("n-float", "/generate", gen({"n": 2.5}), "sampling_params.n: must be an integer"),
    ("chat-n", "/v1/chat/completions", chat(n=1000), "sampling_params.n: must be an integer in [1, 128]"),
    ("unknown-sampling-key", "/generate", gen({"foo": 1}), "sampling_params.foo: unknown field"),
    ("internal-sampling-key", "/generate", gen({"is_normalized": True}), "sampling_params.is_normalized: unknown field"),
    ("temperature-string", "/generate", gen({"temperature": "hot"}), "sampling_params.temperature: must be a number"),
    ("max-new-tokens-float", "/generate", gen({"max_new_tokens": 2.5}), "sampling_params.max_new_tokens: must be an integer"),
    ("top-k-int32-overflow", "/generate", gen({"top_k": 2**40}), "sampling_params.top_k"),
    ("repetition-penalty-tiny", "/generate", gen({"repetition_penalty": 1e-300}), "sampling_params.repetition_penalty"),
    ("logit-bias-list", "/generate", gen({"logit_bias": [1, 2]}), "sampling_params.logit_bias: must be an object"),
    ("logit-bias-string", "/generate", gen({"logit_bias": {"5": "x"}}), "sampling_params.logit_bias.5: must be a number"),
    ("logit-bias-huge", "/generate", gen({"logit_bias": {"5": 1e308}}), "sampling_params.logit_bias: the bias of token 5"),
    ("logit-bias-nan", "/generate",
     b'{"input_ids": [1, 2], "sampling_params": {"max_new_tokens": 2, "logit_bias": {"5": NaN}}}',
     "sampling_params.logit_bias: the bias of token 5"),
    ("logit-bias-out-of-vocab", "/generate", gen({"logit_bias": {"600": 1.0}}), "sampling_params.logit_bias: token id 600"),
    ("json-schema-object", "/generate", gen({"json_schema": {"type": "object"}}), "sampling_params.json_schema: must be a string"),
    ("regex-list", "/generate", gen({"regex": ["a"]}), "sampling_params.regex: must be a string"),
    ("structural-tag-object", "/generate", gen({"structural_tag": {"a": 1}}), "sampling_params.structural_tag"),
    ("bool-flag-string", "/generate", gen({"skip_special_tokens": "x"}), "sampling_params.skip_special_tokens"),
    ("stop-regex-invalid", "/generate", gen({"stop_regex": "("}), "sampling_params.stop_regex: '(' is not a valid"),
    ("chat-stop-regex-invalid", "/v1/chat/completions", chat(stop_regex="(["), "sampling_params.stop_regex"),
    ("stop-token-ids-int", "/generate", gen({"stop_token_ids": 5}), "sampling_params.stop_token_ids"),
    ("stop-token-ids-out-of-vocab", "/generate", gen({"stop_token_ids": [10**9], "min_new_tokens": 2}),
     "sampling_params.stop_token_ids: token id 1000000000 is outside the vocabulary"),
    ("sampling-list-short", "/generate", {"input_ids": [[1], [2]], "sampling_params": [{"max_new_tokens": 1}]},
     "sampling_params: 1 entries for a batch of 2"),
    ("logprob-list-short", "/generate", gen(input_ids=[[1], [2]], return_logprob=True, logprob_start_len=[0]),
     "logprob_start_len: 1 entries for a batch of 2"),
    ("session-params-unknown", "/generate", gen(session_params={"zzz": 1}), "session_params.zzz: unknown field"),
    ("positional-embeds-json", "/generate", gen(positional_embed_overrides=5), "positional_embed_overrides"),
    ("chat-response-format-list", "/v1/chat/completions", chat(response_format=[1]), "response_format: must be an object"),
    ("chat-json-schema-list", "/v1/chat/completions", chat(response_format={"type": "json_schema", "schema": [1]}),
     "1 validation error"),
]


@pytest.mark.parametrize("path, payload, expected", [pytest.param(*case[1:], id=case[0]) for case in CASES])
def test_malformed_request_is_a_400_naming_the_field(server, path, payload, expected):
    status, body = send(server, path, payload)
    assert status == 400, body
    assert message(body).startswith(expected), body


@pytest.mark.parametrize("path, payload, field", [
    ("/generate", gen({"regex": "[ab]+"}), "sampling_params.regex"),
    ("/generate", gen({"json_schema": '{"type": "object"}'}), "sampling_params.json_schema"),
    ("/v1/chat/completions", chat(response_format={"type": "json_object"}), "sampling_params.json_schema"),
], ids=["regex", "json-schema", "chat-json-object"])
def test_constrained_decoding_where_xgrammar_cannot_mask(server, path, payload, field):
    """SGLang's xgrammar backend has no CPU kernel for its token mask: its first constrained step
    killed the scheduler. On the CPU platform such requests are refused."""
    if "cpu_platform=True" not in server.log_text():
        pytest.skip("xgrammar masks on this device")
    status, body = send(server, path, payload)
    assert status == 400, body
    assert message(body).startswith(f"{field}: constrained decoding with the xgrammar backend is not available"), body
    assert_serving(server)


def test_rid_in_flight_is_a_400_and_leaves_no_state(server):
    """A second request with a busy rid is refused; in a batch, before SGLang has recorded the
    batch's other rids (it used to keep them, refusing them as duplicates from then on)."""
    # "busy" decodes far longer than the test runs and is ended by /abort_request: it is in flight
    # for every check below however slow the box (a short decode could finish before them).
    payload = {**gen({"max_new_tokens": 4000, "ignore_eos": True}), "rid": "busy", "stream": True}
    request = urllib.request.Request(server.url + "/generate", data=json.dumps(payload).encode(),
                                     headers={"Content-Type": "application/json"})
    with urllib.request.urlopen(request, timeout=TIMEOUT) as stream:
        assert stream.readline().startswith(b"data: ")
        status, body = send(server, "/generate", gen(rid="busy"))
        assert (status, message(body)) == (400, "rid: a request with rid 'busy' is already in flight")
        status, body = send(server, "/generate", gen(input_ids=[[1], [2]], rid=["fresh", "busy"]))
        assert (status, message(body)) == (400, "rid: a request with rid 'busy' is already in flight")
        # /abort_request is an admin route (SGLang aborts every rid with the prefix sent): refused
        # without the server's key, and the request decodes on; with it, the request ends.
        status, body = send(server, "/abort_request", {"rid": "busy"})
        assert (status, json.loads(body)["code"]) == (401, 401), body
        assert next(line for line in iter(stream.readline, b"") if line.strip()).startswith(b"data: ")
        assert send(server, "/abort_request", {"rid": "busy"}, headers=server.admin_headers())[0] == 200
        assert b'"abort"' in stream.read()  # the stream ends with the abort, long before 4,000 tokens
    for rid in ("fresh", "busy"):
        status, body = send(server, "/generate", gen(rid=rid))
        assert status == 200, body


def test_the_route_table_holds_on_the_live_server(server):
    """Every route of the server's table as its verdict says (``eval/soak/route_fuzz.py``: open
    routes answer and junk beside them gets no 5xx, closed 404, admin 401 without the key), then
    the issue's own requests: the kills around the schema are 404, code execution and prompt dumps
    are 401, and with the key ``/server_info`` acts (it lists the key itself: why it is admin)."""
    routes = safety.run_routes(server.url, server.admin_key)
    check = safety.check_routes(routes)
    assert check.status == PASS, (check.detail, check.offenders)
    assert routes["summary"]["admin_acts"]["status"] == 200
    assert routes["summary"]["counts"] == route_policy.counts(route_policy.table())
    for path, payload, status in [
        ("/vertex_generate", {"instances": [{"input_ids": [1, 2]}], "parameters": {"stream_interval": "x"}}, 404),
        ("/api/chat", {"model": "default", "messages": [{"role": "user", "content": "hi"}]}, 404),
        ("/v1/responses", {"input": "hi", "request_id": "someone-elses"}, 404),
        ("/update_weights_from_tensor", {"serialized_named_tensors": ["AAAA"]}, 401),
        ("/configure_logging", {"dump_requests_folder": "/tmp/x", "log_requests_level": 3}, 401),
        ("/slow_down", {"forward_sleep_time": float("nan")}, 401),
        ("/abort_request", {"abort_all": True}, 401),
    ]:
        code, body = send(server, path, payload)
        assert (code, json.loads(body)["code"]) == (status, status), (path, body)
    with urllib.request.urlopen(urllib.request.Request(server.url + "/server_info", headers=server.admin_headers()),
                                timeout=TIMEOUT) as reply:
        assert json.loads(reply.read())["admin_api_key"] == server.admin_key
    assert_serving(server)


def test_requests_in_range_are_served(server):
    accepted = [
        ("/generate", gen(return_logprob=True, logprob_start_len=0, top_logprobs_num=VOCAB)),
        ("/generate", gen(return_logprob=True, logprob_start_len=3)),  # = prompt length: no prompt logprobs
        ("/generate", gen({"logit_bias": {"5": 100.0, "6": -100}, "top_k": 2**31 - 1, "temperature": 1.0})),
        ("/generate", gen({"n": 2, "stop_regex": ["a+", "b"], "stop": "x", "stop_token_ids": [7]})),
        ("/generate", gen(extra_key="k" * 256, rid="in-range")),
        ("/generate", {"text": ["a", "b"], "sampling_params": {"max_new_tokens": 1}, "rid": ["t1", "t2"]}),
        ("/v1/chat/completions", chat(cache_salt="s" * 128, extra_key="e" * 128, logprobs=True, top_logprobs=5)),
    ]
    for path, payload in accepted:
        status, body = send(server, path, payload)
        assert status == 200, (payload, body)


# ---------------------------------------------------------------------- fuzz

INTS = st.sampled_from([-(2**63), -(10**12), -2, -1, 0, 1, 2, 479, 480, 511, 512, 513, 2**31, 2**63 - 1]) | st.integers(-600, 600)
FLOATS = (st.floats(0, 2) | st.floats(allow_nan=True, allow_infinity=True)
          | st.sampled_from([0.0, 1e-300, 1e-6, 0.5, 1.0, 2.0, 1e308]))
SCALARS = st.none() | st.booleans() | INTS | FLOATS | st.text(max_size=8)
JUNK = st.recursive(SCALARS, lambda inner: st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=4), inner, max_size=3),
                    max_leaves=6)
# max_new_tokens: mostly valid and small (never a long generation), sometimes not
SMALL_TOKENS = st.sampled_from([1, 2, 8]) | st.sampled_from([-1, 0, 10**12, 2.5, "8"])
TOKEN_IDS = st.lists(INTS, max_size=6)
STRINGS = st.text(max_size=6) | st.sampled_from(["(", "[a-", "a+", "\\", "k" * 300, ""])

SAMPLING_VALUES = {
    "max_new_tokens": SMALL_TOKENS,
    "n": st.sampled_from([-1, 0, 1, 2, 129, 2.5, "2", 10**9]),
    "temperature": FLOATS | JUNK, "top_p": FLOATS | JUNK, "min_p": FLOATS | JUNK, "top_k": INTS | JUNK | st.integers(1, 600),
    "repetition_penalty": FLOATS, "frequency_penalty": FLOATS, "presence_penalty": FLOATS,
    "min_new_tokens": SMALL_TOKENS,
    "stop": STRINGS | st.lists(STRINGS, max_size=3) | JUNK,
    "stop_regex": STRINGS | st.lists(STRINGS, max_size=2) | JUNK,
    "stop_token_ids": TOKEN_IDS | JUNK,
    "logit_bias": st.dictionaries(st.sampled_from(["0", "5", "511", "512", "-1", "x"]), FLOATS | JUNK, max_size=3) | JUNK,
    "json_schema": JUNK | st.sampled_from(['{"type": "object"}', "{nope"]),
    "regex": JUNK | STRINGS, "ebnf": JUNK | STRINGS, "structural_tag": JUNK,
    "ignore_eos": JUNK, "skip_special_tokens": JUNK, "no_stop_trim": JUNK, "spaces_between_special_tokens": JUNK,
    "custom_params": JUNK, "stream_interval": JUNK, "sampling_seed": JUNK,
    "foo": JUNK, "is_normalized": JUNK, "stop_str_max_len": JUNK,
}


@st.composite
def sampling_params(draw):
    keys = draw(st.lists(st.sampled_from(sorted(SAMPLING_VALUES)), max_size=4, unique=True))
    params = {"max_new_tokens": draw(SMALL_TOKENS)}
    params.update({key: draw(SAMPLING_VALUES[key]) for key in keys})
    return params


@st.composite
def generate_payloads(draw):
    batch = draw(st.integers(0, 3))  # 0: a single prompt
    if draw(st.booleans()):
        prompt = {"input_ids": draw(TOKEN_IDS) if batch == 0 else draw(st.lists(TOKEN_IDS, min_size=batch, max_size=batch))}
    else:
        prompt = {"text": draw(st.text(max_size=12)) if batch == 0 else draw(st.lists(st.text(max_size=6), min_size=batch, max_size=batch))}
    payload = {**prompt, "sampling_params": draw(sampling_params() | st.lists(sampling_params(), max_size=3))}
    optional = {
        "rid": STRINGS | st.lists(st.sampled_from(["r1", "r2", "r1"]), max_size=3),
        "return_logprob": st.booleans(), "logprob_start_len": INTS, "top_logprobs_num": INTS,
        "token_ids_logprob": TOKEN_IDS, "extra_key": STRINGS | st.lists(STRINGS, max_size=3),
        "stream": st.booleans(), "session_params": JUNK, "positional_embed_overrides": JUNK,
        "return_text_in_logprobs": st.booleans(),
    }
    for key in draw(st.lists(st.sampled_from(sorted(optional)), max_size=4, unique=True)):
        payload[key] = draw(optional[key])
    return "/generate", payload


@st.composite
def chat_payloads(draw):
    payload = dict(CHAT, max_tokens=draw(st.sampled_from([0, 1, 2, -1, 10**12])))
    optional = {
        "input_ids": TOKEN_IDS, "temperature": FLOATS, "top_p": FLOATS, "top_k": INTS, "min_p": FLOATS,
        "n": st.sampled_from([-1, 0, 1, 2, 129, 10**6]), "logprobs": st.booleans(), "top_logprobs": INTS,
        "logit_bias": st.dictionaries(st.sampled_from(["0", "5", "512", "-3", "y"]), FLOATS, max_size=2),
        "stop": STRINGS | st.lists(STRINGS, max_size=2), "stop_token_ids": TOKEN_IDS,
        "stop_regex": STRINGS, "regex": STRINGS, "ebnf": STRINGS, "repetition_penalty": FLOATS,
        "frequency_penalty": FLOATS, "presence_penalty": FLOATS, "seed": INTS,
        "rid": STRINGS | st.lists(STRINGS, max_size=2), "extra_key": STRINGS | st.lists(STRINGS, max_size=2),
        "cache_salt": STRINGS | st.lists(STRINGS, max_size=2), "stream": st.booleans(),
        "response_format": JUNK | st.fixed_dictionaries({"type": st.sampled_from(["json_schema", "json_object", "text"]), "schema": JUNK}),
        "messages": JUNK, "reasoning": JUNK, "tools": JUNK, "tool_choice": JUNK, "chat_template_kwargs": JUNK,
        "reasoning_effort": JUNK, "max_completion_tokens": SMALL_TOKENS,
    }
    for key in draw(st.lists(st.sampled_from(sorted(optional)), max_size=4, unique=True)):
        payload[key] = draw(optional[key])
    return "/v1/chat/completions", payload


def encode(payload) -> bytes:
    return json.dumps(payload, allow_nan=True).encode()  # NaN/Infinity literals: Python's server parser takes them


def check_answer(server, path: str, payload) -> None:
    try:
        status, body = send(server, path, encode(payload))
    except Exception as exc:  # noqa: BLE001 - a dropped connection or a timeout is the failure
        pytest.fail(f"{path} {payload!r:.400}: no answer ({exc!r}); server log:\n{server.log_tail()}")
    assert 200 <= status < 300 or 400 <= status < 500, f"{path} {payload!r:.400} -> {status}: {body[:400]}"
    assert server.process.poll() is None, server.log_tail()


@settings(max_examples=150, deadline=None, derandomize=True, database=None, print_blob=False,
          suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large, HealthCheck.filter_too_much])
@given(request=generate_payloads() | chat_payloads())
def _fuzz(server, request):
    check_answer(server, *request)


def test_fuzzed_requests_never_break_the_server(server):
    _fuzz(server)
    assert_serving(server)
    assert "Scheduler hit an exception" not in server.log_text()
    status, body = send(server, "/v1/chat/completions", CHAT)
    assert status == 200, body


def test_concurrent_bad_and_good_requests(server):
    """Bad requests refused while good ones run beside them; every good one is answered."""
    results: list[int] = []

    def good():
        results.append(send(server, "/generate", gen({"max_new_tokens": 16}))[0])

    threads = [threading.Thread(target=good) for _ in range(3)]
    for thread in threads:
        thread.start()
    for bad_id in (VOCAB, -1, 10**9):
        assert send(server, "/generate", gen(input_ids=[bad_id]))[0] == 400
    for thread in threads:
        thread.join(TIMEOUT)
    assert results == [200, 200, 200]


# ---------------------------------------------------------------------- issue 19


def test_every_field_of_every_route_refuses_each_wrong_kind(server):
    """The schema the server serves (built from SGLang's request types), walked: every field of
    every generating route, each wrong kind of value. Refused: a 4xx naming the field; accepted
    (null for an Optional field, a string for a string field): anything but a 5xx. The server
    answers a good request after every 50 cases."""
    routes = schema_fuzz.fetch_routes(server.url)
    cases = schema_fuzz.cases(routes)
    assert {case.route for case in cases} == {GENERATE, COMPLETIONS, CHAT_ROUTE} and len(cases) > 1500
    report = schema_fuzz.run(server.url, cases)
    assert report.dead_at is None, server.log_tail()
    assert report.failures == [], [(o.case.name, o.status, o.why, o.message[:200]) for o in report.failures[:10]]
    summary = report.summary()
    assert summary["refused_4xx"] == summary["refused_by_schema"] > 1000 and summary["accepted_by_schema"] > 100


ISSUE_19 = [
    # (id, path, payload, start of the 400's message)
    ("stream-interval-string", "/generate", {**gen({"stream_interval": "x"}), "stream": True},
     "sampling_params.stream_interval: must be an integer"),
    ("session-id-list", "/generate", gen(session_params={"id": [1, 2]}), "session_params.id: must be a string"),
    ("min-new-tokens-string", "/generate", gen({"min_new_tokens": "x"}), "sampling_params.min_new_tokens: must be"),
    ("min-new-tokens-list", "/generate", gen({"min_new_tokens": [1]}), "sampling_params.min_new_tokens: must be"),
    ("text-surrogate", "/generate", b'{"text": "a\\ud800", "sampling_params": {"max_new_tokens": 2}}',
     "text: is not valid Unicode"),
    ("stop-surrogate", "/generate", b'{"input_ids": [1], "sampling_params": {"max_new_tokens": 2, "stop": "\\ud800"}}',
     "sampling_params.stop: is not valid Unicode"),
    ("rid-surrogate", "/generate", b'{"rid": "\\ud800", "input_ids": [1], "sampling_params": {"max_new_tokens": 2}}',
     "rid: is not valid Unicode"),
    ("completions-surrogate", "/v1/completions", b'{"model": "default", "prompt": "a\\ud800", "max_tokens": 2}',
     "prompt: is not valid Unicode"),
    ("chat-stop-surrogate", "/v1/chat/completions",
     b'{"model": "default", "messages": [{"role": "user", "content": "hi"}], "stop": "\\ud800", "max_tokens": 2}',
     "stop: is not valid Unicode"),
    ("custom-params-deep", "/generate", gen({"custom_params": {"a": schema_fuzz.schema.nested(400)}}),
     "sampling_params.custom_params.a[0]: must be"),
    ("session-id-deep", "/generate", gen(session_params={"id": schema_fuzz.schema.nested(400)}),
     "session_params.id: must be a string"),
    ("chat-template-kwargs-tools", "/v1/chat/completions", chat(chat_template_kwargs={"tools": []}),
     "chat_template_kwargs.tools: is an argument the server passes"),
    ("text-empty-list", "/generate", {"text": [], "sampling_params": {"max_new_tokens": 2}},
     "text: must not be an empty list"),
    ("text-and-ids", "/generate", {"text": "hi", "input_ids": [1, 2], "sampling_params": {"max_new_tokens": 2}},
     "input_ids: give only one of text, input_ids, input_embeds"),
    ("sampling-seed-string", "/generate", gen({"sampling_seed": "x"}), "sampling_params.sampling_seed: must be"),
    ("rid-empty", "/generate", gen(rid=""), "rid: must not be empty"),
    ("stop-regex-backreference", "/generate", gen({"stop_regex": "(a)\\1"}),
     "sampling_params.stop_regex: '(a)\\\\1' cannot be matched in linear time"),
]


@pytest.mark.parametrize("path, payload, expected", [pytest.param(*case[1:], id=case[0]) for case in ISSUE_19])
def test_issue_19_requests_are_a_400_naming_the_field(server, path, payload, expected):
    status, body = send(server, path, payload)
    assert status == 400, body
    assert message(body).startswith(expected), body
    assert_serving(server)


def test_null_where_sglang_has_a_default_is_served(server):
    """``n: null`` (and any null for a defaulted, non-Optional field) means "unset"."""
    for path, payload in (("/generate", gen({"n": None, "temperature": None}, stream=None)),
                          ("/v1/chat/completions", chat(n=None, stream=None))):
        status, body = send(server, path, payload)
        assert status == 200, body


def test_a_regex_bomb_costs_a_trivial_request_nothing(server):
    """Trivial requests beside a decode whose stop_regex backtracks catastrophically under Python's
    re: every one answered, and the bomb decoded (unpatched, they timed out). Their latency against
    the same beside a plain decode is printed, not judged: no test depends on the machine's speed."""
    bomb = safety.run_bomb(server.url, bomb_tokens=128, trivial=8)
    check = safety.check_bomb(bomb, max_ratio=None)
    print(check.detail)
    assert check.status == PASS, (check, bomb)


def test_name_pairs_that_shared_a_namespace_in_sglang_share_nothing(server):
    """``cache_salt`` "AB" / "A" + ``extra_key`` "B" / ``extra_key`` "AB"; ``/generate`` "tenantX" /
    "tenant" + "X": each reuses nothing of the other, while the same tenant on the other route
    does reuse (the probe can see reuse); an empty salt and a control character are refused."""
    records = safety.send_namespace_probes(server.url, "valns", "default", seed=3)
    answered = [r["rid"] for r in records if r["status"] == 200]
    events = wait_for_events(server.events_path, answered)
    check = safety.check_namespaces(records, events)
    assert check.status == PASS, check


ODD_RIDS = ["odd rid with spaces", "odd\nFinish: obj=GenerateReqInput(rid='evil') FORGED", "odd'\"quoted",
            "odd-ünï-日本", "odd\r\u2028FORGED"]


def test_no_request_field_starts_a_log_line_and_odd_rids_read_back(server):
    """Request ids and texts with line breaks are served; the log (``--log-requests``) keeps one line
    per record, no line of the client's making, and the accounting reads every rid back."""
    for rid in ODD_RIDS:
        status, body = send(server, "/generate", {**gen(), "rid": rid})
        assert status == 200, body
    forged_text = "hi\nFinish: FORGED\n[2026-01-01 00:00:00] FORGED"
    status, body = send(server, "/generate", {"text": forged_text, "sampling_params": {"max_new_tokens": 2}})
    assert status == 200, body
    status, body = send(server, "/generate", {**gen({"stop_regex": "(" + forged_text}), "rid": "forged-400"})
    assert status == 400, body
    # SGLang's own error text quotes this id as it is, and its HTTP layer logs the error
    status, body = send(server, "/generate", gen(session_params={"id": forged_text}))
    assert status == 400 and "FORGED" in body, body
    lines = server.log_text().splitlines()
    stray = [line for line in lines if "FORGED" in line and not line.startswith("[20")]
    assert stray == [], stray
    finished = {parsed["rid"] for parsed in map(parse_finish, lines) if parsed is not None}
    assert set(ODD_RIDS) <= finished


# ---------------------------------------------------------------------- issue 33: what a request may cost

HEAVY = "[" + "".join(chr(0x4E00 + 7 * i) for i in range(300)) + "]{1000}"  # ~0.15 s, ~3.3 MB at RE2's default
BIG_BODY = json.dumps({"text": "a" * (3 << 20), "sampling_params": {"max_new_tokens": 2}}).encode()
ISSUE_33 = [
    # (id, path, payload, start of the 400's message)
    ("chat-template-kwargs-messages", "/v1/chat/completions", chat(chat_template_kwargs={"messages": []}),
     "chat_template_kwargs.messages: is an argument the server passes to the chat template itself"),
    ("envelope-100k-deep", "/generate",
     gen(custom_logit_processor='{"forced_output_ids": ' + "[" * 100_000 + "1" + "]" * 100_000 + "}"),
     "custom_logit_processor: JSON nested deeper than the server parses"),
    ("body-100k-deep", "/generate", b'{"input_ids": ' + b"[" * 100_000 + b"]" * 100_000 + b"}",
     "body: JSON nested deeper than the server parses"),
    ("image-url", "/generate", gen(image_data="http://127.0.0.1:9/x.png"), "image_data: not accepted by this server"),
    ("image-path", "/generate", gen(image_data=["/etc/hostname"]), "image_data: not accepted by this server"),
    ("chat-image-part", "/v1/chat/completions",
     chat(messages=[{"role": "user", "content": [{"type": "text", "text": "see"},
                                                 {"type": "image_url", "image_url": {"url": "file:///etc/hostname"}}]}]),
     "messages[0].content[1]: image_url parts are not accepted by this server"),
    ("prompts-10000", "/generate", gen(input_ids=[[5]] * 10_000), "input_ids: 10000 prompts in one request, over the "
                                                                  "limit of 64 (--max-prompts 64)"),
    ("prompts-x-n", "/generate", gen({"n": 128}, input_ids=[[5]] * 32),
     "sampling_params.n: 32 prompts x n = 128 is 4096 sequences in one request, over the limit of 256"),
    ("completions-prompts-x-n", "/v1/completions", {"model": "default", "prompt": ["a"] * 8, "n": 64, "max_tokens": 1},
     "n: 8 prompts x n = 64 is 512 sequences in one request, over the limit of 256 (--max-sequences 256)"),
    ("stop-regex-17", "/generate", gen({"stop_regex": [f"s{i}" for i in range(17)]}),
     "sampling_params.stop_regex: 17 distinct patterns in one request, over the limit of 16 (--max-stop-regexes 16)"),
    ("stop-regex-heavy", "/generate", gen({"stop_regex": HEAVY}), "sampling_params.stop_regex: '["),
    ("stop-regex-chars", "/generate", gen({"stop_regex": "[" + "a" * 20_000 + "]"}),
     "sampling_params.stop_regex: 20002 characters of patterns in one request, over the limit of 16384"),
    ("body-over-2M", "/generate", BIG_BODY,
     f"body: {len(BIG_BODY)} bytes, over the limit of 2097152 bytes (--max-request-body 2M)"),
]


@pytest.mark.parametrize("path, payload, expected", [pytest.param(*case[1:], id=case[0]) for case in ISSUE_33])
def test_issue_33_requests_are_a_400_naming_the_problem(server, path, payload, expected):
    status, body = send(server, path, payload)
    assert status == 400, body[:300]
    assert message(body).startswith(expected), body[:300]
    assert_serving(server)


def test_the_heavy_pattern_names_the_max_mem_flag(server):
    status, body = send(server, "/generate", gen({"stop_regex": HEAVY}))
    assert status == 400 and "(--stop-regex-max-mem 256K; RE2: pattern too large" in message(body), body[:400]


def test_the_server_serves_its_request_limits(server):
    served = schema_fuzz.client.request(server.url, schema_fuzz.SCHEMA_PATH, timeout=30, method="GET").body
    assert served["request_limits"]["max_body_bytes"] == 2 << 20  # the flag reached the HTTP process
    assert served["request_limits"]["max_prompts"] == 64


def test_requests_over_each_limit_leave_a_trivial_request_answered(server):
    """The soak's bounds phase on this server: each over-limit request a 400 naming its limit, alone
    and in bursts beside trivial requests, which all answer. The latency ratio is printed."""
    report = bounds.run_bounds(server.url, trivial=6)
    check = bounds.check_bounds(report, max_ratio=None)
    print(check.detail)
    assert check.status == PASS, (check.offenders, report["each"])
    assert {o["request"] for o in report["each"]} == {
        "prompts", "sequences", "stop_regex count", "stop_regex characters", "stop_regex max_mem", "body size",
        "nested body", "nested envelope"}
    assert report["beside_sent"] == report["beside_refused"] == 6 * 7  # a burst of 7 beside each trivial request
