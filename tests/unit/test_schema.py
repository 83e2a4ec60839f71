"""serving/schema.py: schemas from Python types, the strict check, null as unset, the JSON form.

The classes here stand in for SGLang's three kinds of request type (a dataclass like
``GenerateReqInput``, a msgspec struct like ``SamplingParams``, a pydantic model like the OpenAI
requests), duck-typed the way the module reads them; the real classes are covered by
``tests/integration/test_request_schema.py``.
"""

from __future__ import annotations

import dataclasses
import enum
import typing
from types import SimpleNamespace
from typing import Any, Dict, List, Literal, Optional, Set, Union

import pytest

from serving import schema
from serving.schema import (
    MAX_DEPTH,
    Json,
    ListOf,
    MapOf,
    OneOf,
    Scalar,
    SchemaError,
    Struct,
    check,
    from_type,
    struct_of,
    without_unset_nulls,
)


@dataclasses.dataclass
class Inner:
    name: str
    weight: float = 1.0


@dataclasses.dataclass
class Request:  # the shape of GenerateReqInput
    text: Optional[Union[List[str], str]] = None
    input_ids: Optional[Union[List[List[int]], List[int]]] = None
    stream: bool = False
    params: Optional[Dict[str, Any]] = None
    inner: Optional[Inner] = None
    tags: Optional[Set[int]] = None
    required_thing: int = dataclasses.field(kw_only=True)  # no default: required


class Color(enum.Enum):
    RED = "red"
    BLUE = "blue"


class MsgspecLike:  # SamplingParams: __struct_fields__ with defaults for the last fields
    __struct_fields__ = ("count", "temperature", "stop", "color")
    __struct_defaults__ = (1.0, None, Color.RED)
    __annotations__ = {"count": int, "temperature": float, "stop": Optional[Union[str, List[str]]], "color": Color}


class Info:
    def __init__(self, annotation, required=False, alias=None):
        self.annotation, self._required, self.alias = annotation, required, alias

    def is_required(self):
        return self._required


class PydanticLike:  # the OpenAI models: model_fields, a before validator on one field
    model_fields = {
        "messages": Info(List[Dict[str, str]], required=True),
        "effort": Info(Union[Literal["low", "high"], float]),
        "max_tokens": Info(Optional[int]),
        "n": Info(int),
        "the_model": Info(str, alias="model"),
        "nested": Info(Optional["PydanticLike"]),
    }
    model_config = {}
    __pydantic_decorators__ = SimpleNamespace(field_validators={
        "v": SimpleNamespace(info=SimpleNamespace(fields=("effort",), mode="before"))})


PydanticLike.model_fields["nested"] = Info(Optional[PydanticLike])


def problem(value, node, path=("f",)) -> str | None:
    try:
        check(value, node, path)
    except SchemaError as exc:
        return str(exc)
    return None


# ----------------------------------------------------------------------------------- from types


@pytest.mark.parametrize("tp, node, nullable", [
    (int, Scalar("int"), False),
    (float, Scalar("float"), False),
    (bool, Scalar("bool"), False),
    (str, Scalar("str"), False),
    (Optional[int], Scalar("int"), True),
    (Union[str, List[str], None], OneOf((Scalar("str"), ListOf(Scalar("str")))), True),
    (Set[int], ListOf(Scalar("int")), False),
    (Dict[str, float], MapOf(Scalar("float")), False),
    (dict, MapOf(Json()), False),
    (Any, Json(), False),
    (Union[int, Any], Json(), False),
    (Literal["a", "b", None], schema.Literal(("a", "b")), True),
    (Color, schema.Literal(("red", "blue")), False),
    (typing.Annotated[List[int], "meta"], ListOf(Scalar("int")), False),
    (Optional[SimpleNamespace], Json(), True),  # a class with no JSON shape
])
def test_from_type(tp, node, nullable):
    assert from_type(tp) == (node, nullable)


def test_dataclass_fields_nullability_and_requirement():
    struct = struct_of(Request)
    assert struct.fields["stream"] == schema.Field(Scalar("bool"), nullable=False, required=False)
    assert struct.fields["text"].nullable and not struct.fields["text"].required
    assert struct.fields["required_thing"].required
    assert isinstance(struct.fields["inner"].node, Struct) and struct.fields["inner"].node.name == "Inner"
    assert not struct.closed


def test_msgspec_struct_is_closed_and_its_defaults_align_with_the_last_fields():
    struct = struct_of(MsgspecLike)
    assert struct.closed
    assert struct.fields["count"].required and not struct.fields["temperature"].required
    assert struct.fields["color"].node == schema.Literal(("red", "blue"))


def test_pydantic_model_aliases_before_validators_and_self_reference():
    struct = struct_of(PydanticLike)
    assert set(struct.fields) == {"messages", "effort", "max_tokens", "n", "model", "nested"}
    assert struct.fields["effort"].node == Json()  # SGLang's own validator types it
    assert struct.fields["messages"].required
    assert struct.fields["nested"].node is struct  # the same object: no endless recursion


def test_refine_replaces_an_untyped_field():
    refined = struct_of(Request, {("Request", "params"): MapOf(Scalar("int"))})
    assert refined.fields["params"].node == MapOf(Scalar("int"))
    assert problem({"params": {"a": "x"}}, refined) == "f.params.a: must be an integer, got 'x'"


# ---------------------------------------------------------------------------------------- check


@pytest.mark.parametrize("value, node, expected", [
    (5, Scalar("int"), None),
    (True, Scalar("int"), "f: must be an integer, got True"),
    (5.0, Scalar("int"), "f: must be an integer, got 5.0"),
    ("5", Scalar("int"), "f: must be an integer, got '5'"),
    (5, Scalar("float"), None),
    (False, Scalar("float"), "f: must be a number, got False"),
    (2**63, Scalar("int"), "f: 9223372036854775808 is outside the signed 64-bit range"),
    (-(2**63), Scalar("int"), None),
    (1, Scalar("bool"), "f: must be true or false, got 1"),
    ([1, 2], Scalar("str"), "f: must be a string, got a list"),
    ({"a": 1}, Scalar("str"), "f: must be a string, got an object"),
    (None, Scalar("str"), "f: must be a string, got null"),
    ("a\ud800b", Scalar("str"), "f: is not valid Unicode (lone surrogate U+D800 at index 1)"),
    ("\U0001F600", Scalar("str"), None),  # a real astral character
    ("x", schema.Literal(("a", "b")), "f: must be one of 'a', 'b', got 'x'"),
    (1, schema.Literal((True,)), "f: must be one of True, got 1"),
    ([1, "x"], ListOf(Scalar("int")), "f[1]: must be an integer, got 'x'"),
    ([1, 2**70], ListOf(Scalar("int")), "f[1]: 1180591620717411303424 is outside the signed 64-bit range"),
    ({"k": 1, "j": "x"}, MapOf(Scalar("int")), "f.j: must be an integer, got 'x'"),
    ({"\ud800": 1}, MapOf(Scalar("int")), "f.\\ud800: key is not valid Unicode (lone surrogate U+D800 at index 0)"),
    ({"a": ["\ud801"]}, Json(), "f.a[0]: is not valid Unicode (lone surrogate U+D801 at index 0)"),
])  # fmt: skip
def test_scalars_lists_maps(value, node, expected):
    assert problem(value, node) == expected


def test_unions_name_the_deepest_field_when_one_option_has_the_value_shape():
    node = OneOf((Scalar("str"), ListOf(Scalar("str"))))
    assert problem(["a", 5], node) == "f[1]: must be a string, got 5"
    assert problem("\ud800", node) == "f: is not valid Unicode (lone surrogate U+D800 at index 0)"
    assert problem(5, node) == "f: must be a string or a list of strings, got 5"
    ids = OneOf((ListOf(ListOf(Scalar("int"))), ListOf(Scalar("int"))))
    assert problem([1, 2], ids) is None and problem([[1], [2]], ids) is None
    assert problem([[1], ["x"]], ids).startswith("f: must be a list of lists of integers or a list of integers")


@pytest.mark.parametrize("levels, ok", [(MAX_DEPTH - 1, True), (MAX_DEPTH + 1, False), (500, False)])
def test_nesting_is_bounded_without_recursing_past_the_limit(levels, ok):
    value = schema.nested(levels)
    found = problem({"x": value}, MapOf(Json()))
    assert (found is None) == ok
    if not ok:
        assert found.endswith(f"nested deeper than {MAX_DEPTH} levels")


def test_structs_unknown_required_and_null():
    open_struct = struct_of(Request)
    assert problem({"required_thing": 1, "whatever": {"k": "\ud800"}}, open_struct).startswith("f.whatever.k: is not valid")
    assert problem({"required_thing": 1, "unknown": [1]}, open_struct) is None  # open: ignored, as pydantic does
    assert problem({}, open_struct) == "f.required_thing: is required"
    assert problem({"required_thing": None}, open_struct) == "f.required_thing: must not be null"
    assert problem({"required_thing": 1, "stream": None}, open_struct) is None  # defaulted: null is "unset"
    assert problem({"required_thing": 1, "text": None}, open_struct) is None  # Optional: null is a value
    closed = struct_of(MsgspecLike)
    assert problem({"count": 1, "colour": "red"}, closed) == (
        "f.colour: unknown field (known: color, count, stop, temperature)")
    assert problem([1], closed) == "f: must be an object (MsgspecLike), got a list"


def test_without_unset_nulls_drops_only_defaulted_non_optional_fields():
    struct = struct_of(Request)
    body = {"required_thing": 1, "stream": None, "text": None, "inner": {"name": "n", "weight": None}}
    out = without_unset_nulls(body, struct)
    assert out == {"required_thing": 1, "text": None, "inner": {"name": "n"}}
    assert body["stream"] is None  # not mutated
    untouched = {"required_thing": 1, "text": "hi"}
    assert without_unset_nulls(untouched, struct) is untouched
    params = OneOf((ListOf(struct_of(MsgspecLike)), struct_of(MsgspecLike)))
    assert without_unset_nulls([{"count": 1, "temperature": None}], params) == [{"count": 1}]
    assert without_unset_nulls({"count": 1, "stop": None}, params) == {"count": 1, "stop": None}


# ----------------------------------------------------------------------------------- JSON form


def test_json_round_trip_keeps_the_schema_and_self_references():
    struct = struct_of(PydanticLike)
    data = schema.to_json(struct)
    again = schema.from_json(data)
    assert schema.to_json(again) == data
    assert again.fields["nested"].node is again
    assert problem({"messages": [{"role": 1}]}, again) == problem({"messages": [{"role": 1}]}, struct)


def test_walk_fields_reaches_struct_fields_through_unions_not_lists():
    struct = struct_of(Request, {("Request", "params"): OneOf((ListOf(struct_of(MsgspecLike)), struct_of(MsgspecLike)))})
    paths = [schema.format_path(path) for path, _ in schema.walk_fields(struct)]
    assert "params.count" in paths and "inner.name" in paths and "text" in paths
    assert len(paths) == len(set(paths))


def test_wrong_values_cover_every_kind_the_issue_names():
    kinds = dict(schema.wrong_values())
    assert {"string", "list", "object", "null", "huge int", "huge string", "nested", "lone surrogate"} <= set(kinds)
    assert problem(kinds["nested"], Json()) is not None


def test_format_path():
    assert schema.format_path(("messages", 0, "content")) == "messages[0].content"
    assert schema.format_path(()) == ""


def test_nested_unions_of_structs_cost_linear_work():
    """Five struct options that each hold the same union (the shape of xgrammar's structural tags):
    a value nested past the limit used to be judged once per combination of options (5^depth)."""
    union = OneOf(())
    options = tuple(Struct(f"Option{i}", {"content": schema.Field(union), f"only{i}": schema.Field(Scalar("int"))})
                    for i in range(5))
    object.__setattr__(union, "options", options)
    value: dict = {"only0": 1}
    for _ in range(MAX_DEPTH + 5):
        value = {"content": value, "only0": "not an int"}
    walk = schema._Walk()
    found = walk.problem(value, union, ("f",), 0)
    assert found is not None and walk.steps < 20 * (MAX_DEPTH + 5) * len(options)


def test_a_type_tag_selects_the_union_option():
    union = OneOf((Struct("A", {"type": schema.Field(schema.Literal(("a",)), nullable=False, required=True),
                                "x": schema.Field(Scalar("int"))}),
                   Struct("B", {"type": schema.Field(schema.Literal(("b",)), nullable=False, required=True),
                                "x": schema.Field(Scalar("str"))})))
    assert problem({"type": "a", "x": 1}, union) is None
    assert problem({"type": "b", "x": 1}, union) == "f.x: must be a string, got 1"
