"""serving/schema.py: an integer is a JSON integer, never ``true`` / ``false``, wherever it stands.

Why a file of its own: Python's ``bool`` is an ``int`` (``isinstance(True, int)``), so every
place that reads integers can let a boolean through by accident, and the token-id fast path of
``list_problem`` (one C pass over a list of ints, what keeps a 100k-token ``input_ids`` cheap) is
such a place: a list like ``[1, true]`` would reach the scheduler as token id 1. The rule is stated
once in the module docstring ("an integer field takes a JSON integer (not ``"5"``, not ``true``)");
these tests hold every path to it: a scalar, a list on and off the fast path, nested lists, map
values, a union of lists, and a struct field like ``input_ids``.
"""

from __future__ import annotations

import pytest

from serving.schema import INT_RANGE, ListOf, MapOf, OneOf, Scalar, SchemaError, Struct, check, fits
from serving.schema import Field as SchemaField

INTS = ListOf(Scalar("int"))


def problem(value, node) -> str | None:
    try:
        check(value, node, ("f",))
    except SchemaError as exc:
        return str(exc)
    return None


@pytest.mark.parametrize("value, where, got", [
    ([1, True], "f[1]", "True"),
    ([True], "f[0]", "True"),
    ([False, 2, 3], "f[0]", "False"),
    ([5, 6, 7, 8, False], "f[4]", "False"),
    ([0, 1, True, 0], "f[2]", "True"),  # True == 1 and min/max of the list are in range: only the type tells
])  # fmt: skip
def test_a_boolean_in_a_list_of_integers_is_refused_naming_its_index(value, where, got):
    assert problem(value, INTS) == f"{where}: must be an integer, got {got}"


def test_the_fast_path_still_takes_every_list_of_plain_integers():
    low, high = INT_RANGE
    for value in ([], [0], [1, 2, 3], list(range(10_000)), [low, high, 0]):
        assert problem(value, INTS) is None
    assert problem([1, high + 1], INTS) == f"f[1]: {high + 1} is outside the signed 64-bit range"
    assert problem([low - 1], INTS) == f"f[0]: {low - 1} is outside the signed 64-bit range"


def test_booleans_are_refused_in_nested_lists_maps_and_unions_of_integer_lists():
    assert problem([[1, 2], [3, True]], ListOf(INTS)) == "f[1][1]: must be an integer, got True"
    assert problem({"a": 1, "b": False}, MapOf(Scalar("int"))) == "f.b: must be an integer, got False"
    prompts = OneOf((ListOf(INTS), INTS))  # input_ids: one prompt or a batch
    assert fits([1, 2], prompts) and fits([[1], [2, 3]], prompts)
    assert not fits([1, True], prompts) and not fits([[1], [True]], prompts)


def test_a_boolean_token_id_is_refused_in_a_request_field():
    body = Struct("GenerateReqInput", {"input_ids": SchemaField(INTS), "stream": SchemaField(Scalar("bool"))})
    assert problem({"input_ids": [1, 2, 3], "stream": True}, body) is None
    assert problem({"input_ids": [1, True, 3]}, body) == "f.input_ids[1]: must be an integer, got True"


def test_a_list_of_numbers_refuses_booleans_too():
    numbers = ListOf(Scalar("float"))
    assert problem([1, 2.5], numbers) is None
    assert problem([1.0, True], numbers) == "f[1]: must be a number, got True"
