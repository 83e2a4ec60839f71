"""serving/field_rules.py ``regular_expressions``: a ``stop_regex`` is refused when Python cannot
parse it, and also when the server's own stop-regex matcher refuses it (``Context.regex_problem``:
``patches/stop_regex.pattern_problem``, the patterns it cannot match in linear time), with the
matcher's reason, for every pattern of a list. Here the matcher is a stand-in; the real one is
checked in ``tests/integration/test_request_schema.py``."""

from __future__ import annotations

import pytest

from serving.field_rules import Context, RequestError, regular_expressions
from serving.request_checks import check_sampling_params

NO_LOOKAHEAD = "look-ahead cannot be matched in linear time"


def matcher(pattern: str) -> str | None:
    return NO_LOOKAHEAD if "(?=" in pattern else None


def test_a_pattern_the_matcher_refuses_is_refused_with_its_reason():
    context = Context(vocab_size=512, regex_problem=matcher)
    assert regular_expressions("a(?=b)", context) == NO_LOOKAHEAD
    assert regular_expressions(["ok", "a(?=b)"], context) == NO_LOOKAHEAD
    assert regular_expressions(["ok", r"\d+"], context) is None
    assert regular_expressions("a(?=b)", Context(vocab_size=512)) is None  # without a matcher: re alone


def test_python_parses_first_and_the_matcher_sees_only_valid_patterns():
    seen: list[str] = []
    context = Context(vocab_size=512, regex_problem=lambda p: seen.append(p))
    assert "is not a valid regular expression" in regular_expressions(["x", "(", "y"], context)
    assert seen == ["x"]


def test_the_request_check_names_the_field():
    with pytest.raises(RequestError, match=f"^sampling_params.stop_regex: {NO_LOOKAHEAD}$"):
        check_sampling_params({"stop_regex": ["a", "b(?=c)"]}, 512, regex_problem=matcher)
    check_sampling_params({"stop_regex": ["a", "b"]}, 512, regex_problem=matcher)
