"""The two request hooks of ``patches/validation.py`` on SGLang 0.5.16's own request classes (no
server): ``around_body_validation`` (FastAPI's body validation) checks the raw JSON of a body
whose model is one of SGLang's generating requests against the route's schema and answers a 400
naming the field, hands SGLang the body with unset nulls removed, and leaves other models and
other locations alone; ``around_compute_extra_key`` makes the request's namespace from both names
(``policy.namespace``), refusing a bad one as a request error."""

from __future__ import annotations

from types import SimpleNamespace

import pytest

pytestmark = pytest.mark.integration

from fastapi import HTTPException  # noqa: E402
from sglang.srt.managers.io_struct import GenerateReqInput  # noqa: E402

from patches import validation  # noqa: E402
from policy.namespace import namespace  # noqa: E402
from serving.request_checks import RequestError  # noqa: E402


class Original:
    """FastAPI's own validation: records what it was handed."""

    def __init__(self):
        self.seen = []

    def __call__(self, *, field, value, values, loc):
        self.seen.append(value)
        return value, []


def body_of(model):
    return SimpleNamespace(field_info=SimpleNamespace(annotation=model))


def call(original, model, value, loc=("body",)):
    return validation.around_body_validation(original, field=body_of(model), value=value, values={}, loc=loc)


def test_a_body_the_route_schema_refuses_is_a_400_naming_the_field():
    original = Original()
    with pytest.raises(HTTPException) as refused:
        call(original, GenerateReqInput, {"input_ids": [1, True]})
    assert refused.value.status_code == 400
    assert refused.value.detail == "input_ids: must be a list of lists of integers or a list of integers, got a list"
    assert original.seen == []  # SGLang never sees it


def test_sglang_validates_the_checked_body():
    original = Original()
    assert call(original, GenerateReqInput, {"input_ids": [1, 2], "stream": None}) == ({"input_ids": [1, 2]}, [])


class NotSglangs:
    pass


@pytest.mark.parametrize("model, loc", [(NotSglangs, ("body",)), (GenerateReqInput, ("query",)),
                                        (GenerateReqInput, ("body", "input_ids"))])
def test_other_models_and_locations_are_left_to_fastapi(model, loc):
    original = Original()
    bad = {"input_ids": [1, True]}
    assert call(original, model, bad, loc) == (bad, []) and original.seen == [bad]


@pytest.mark.parametrize("loc", [("body",), ("body", "response_format")])
def test_a_crash_of_a_body_validator_becomes_a_validation_error_at_its_location(loc):
    def crashing(*, field, value, values, loc):
        return value.get("type"), []  # SGLang's mode="before" validators assume an object

    value, errors = call(crashing, NotSglangs, [1], loc)
    assert value is None and errors[0]["loc"] == loc and errors[0]["msg"].startswith("malformed request body")


def test_the_namespace_is_made_from_both_names():
    request = SimpleNamespace(cache_salt="tenant", extra_key="conv-1")
    assert validation.around_compute_extra_key(None, None, request) == namespace("tenant", "conv-1")
    assert validation.around_compute_extra_key(None, None, SimpleNamespace()) is None
    with pytest.raises(RequestError, match="^cache_salt / extra_key: must not be empty"):
        validation.around_compute_extra_key(None, None, SimpleNamespace(cache_salt="tenant", extra_key=""))
