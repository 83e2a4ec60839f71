"""serving/schema.py: what a refusal says, where the words are the client's only guide.

* The expected type in words (``describe``, ``_plural``): a list of objects, of JSON values, of
  nulls, never "a list of None".
* A value nested past ``MAX_DEPTH`` inside a union is refused as too deep, whichever option went
  deepest, not as a type mismatch: the client must learn that the nesting is the problem (the
  value may well have the right shape)."""

from __future__ import annotations

from serving import schema
from serving.schema import MAX_DEPTH, Json, ListOf, MapOf, Null, OneOf, Scalar
from tests.unit.test_schema_strict_integers import problem


def test_lists_of_objects_json_values_and_nulls_are_described_in_words():
    assert ListOf(MapOf(Json())).describe() == "a list of objects"
    assert ListOf(Json()).describe() == "a list of JSON values"
    assert ListOf(ListOf(Null())).describe() == "a list of lists of nulls"
    assert MapOf(ListOf(MapOf(Scalar("int")))).describe() == "an object with lists of objects as values"
    assert problem(5, ListOf(MapOf(Json()))) == "f: must be a list of objects, got 5"


def test_a_value_too_deep_for_a_union_is_refused_as_too_deep():
    node = OneOf((ListOf(Scalar("int")), ListOf(Json())))  # both options take a list
    found = problem(schema.nested(MAX_DEPTH + 8), node)
    assert found is not None and found.endswith(f"nested deeper than {MAX_DEPTH} levels"), found
    assert problem(schema.nested(MAX_DEPTH - 2), node) is None
    assert problem(["x", [1]], node) is None  # any JSON list fits the second option
