"""serving/route_schemas.py: on ``/generate`` a field the server sets itself is refused when a
client sends a value for it other than SGLang's own default.

``SERVER_SET`` is this test's own list, read off SGLang 0.5.16's ``GenerateReqInput``
(``sglang/srt/managers/io_struct.py``: the comments name who sets each), not the module's table:
a field dropped from ``route_schemas.SERVER_ONLY`` must fail here. ``received_time``, for one: the
tokenizer manager takes it as the request's creation time (``_init_req_state``), which its time
stats and logged timestamps are measured from (issue 37: on a route no schema covers, the
same field ends the tokenizer manager). ``tests/integration/test_server_only_fields.py`` checks
the same list against SGLang's real classes.

The classes below stand in for SGLang's request types, with only the fields ``build_routes``
reads (``schema.struct_of`` takes any dataclass)."""

from __future__ import annotations

import dataclasses
from typing import Any, Dict, List, Optional, Union

import pytest

from serving.route_schemas import GENERATE, build_routes
from serving.schema import SchemaError

# field -> (a value a client might send, SGLang's default)
SERVER_SET: dict[str, tuple[Any, Any]] = {
    "received_time": (1.0e9, None),
    "http_worker_ipc": ("ipc:///tmp/other-worker", None),
    "lora_id": ("adapter-7", None),
    "return_bytes": (True, False),
    "need_wait_for_mm_inputs": (True, None),
    "num_items_assigned": ({"image": [1]}, None),
    "mm_data_mooncake": ([1], None),
    "encoder_urls": (["http://encoder"], None),
}


@dataclasses.dataclass
class SamplingParams:
    max_new_tokens: Optional[int] = None
    custom_params: Optional[Dict[str, Any]] = None


@dataclasses.dataclass
class SessionParams:
    id: Optional[str] = None


@dataclasses.dataclass
class GenerateReqInput:
    text: Optional[Union[List[str], str]] = None
    input_ids: Optional[List[int]] = None
    sampling_params: Optional[Dict[str, Any]] = None
    session_params: Optional[Dict[str, Any]] = None
    rid: Optional[str] = None
    extra_key: Optional[Union[List[str], str]] = None
    lora_id: Optional[Union[List[Optional[str]], str]] = None
    http_worker_ipc: Optional[str] = dataclasses.field(default=None, kw_only=True)
    return_bytes: bool = False
    received_time: Optional[float] = None
    need_wait_for_mm_inputs: Optional[bool] = None
    num_items_assigned: Optional[Dict[str, List[int]]] = None
    mm_data_mooncake: Optional[List[Any]] = None
    encoder_urls: Optional[List[str]] = None


@dataclasses.dataclass
class CompletionRequest:
    prompt: Union[List[int], str] = ""
    session_params: Optional[Dict[str, Any]] = None
    custom_params: Optional[Dict[str, Any]] = None


@dataclasses.dataclass
class ChatCompletionRequest:
    messages: List[Dict[str, Any]] = dataclasses.field(default_factory=list)
    session_params: Optional[Dict[str, Any]] = None
    custom_params: Optional[Dict[str, Any]] = None
    chat_template_kwargs: Optional[Dict[str, Any]] = None


BODY = {"input_ids": [1, 2, 3], "sampling_params": {"max_new_tokens": 4}}


@pytest.fixture(scope="module")
def generate():
    routes = build_routes(GenerateReqInput, SamplingParams, SessionParams, CompletionRequest, ChatCompletionRequest,
                          ("tools", "chat_template"))
    return routes[GENERATE]


def assert_refused_and_default_accepted(route, name: str) -> None:
    """A client's value for server-set field ``name`` is refused naming it; SGLang's default passes
    (the router spells every field out at its default: what the server would set)."""
    value, default = SERVER_SET[name]
    with pytest.raises(SchemaError) as refused:
        route.check({**BODY, name: value})
    assert refused.value.path == (name,) and "not accepted in a request" in refused.value.problem
    assert route.check({**BODY, name: default}) == {**BODY, name: default}


@pytest.mark.parametrize("name", SERVER_SET)
def test_a_client_value_for_a_server_set_field_is_refused_naming_it(generate, name):
    assert_refused_and_default_accepted(generate, name)


@pytest.mark.parametrize("name", SERVER_SET)
def test_null_passes(generate, name):
    """``null`` is no value: the field stays unset, as the server's default."""
    assert generate.check({**BODY, name: None}).get(name) is None


def test_the_refusal_survives_the_json_round_trip_a_client_rebuilds(generate):
    from serving.schema import to_json

    rebuilt = type(generate).from_json(GENERATE, to_json(generate.body), generate.rules_json())
    for name, (value, _) in SERVER_SET.items():
        with pytest.raises(SchemaError, match=f"^{name}: not accepted"):
            rebuilt.check({**BODY, name: value})
