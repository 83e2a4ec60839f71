"""policy/namespace.py: ``namespace()`` refuses a bad name in either place, salt or ``extra_key``.

The module's rule is that both names are non-empty, at most 256 characters and free of control
characters (``name_problem``); the route schemas check them before a request is queued, and
``namespace`` checks both again, so that a caller that skipped the schema (a tool building keys,
a test) still cannot make a namespace from an empty name or one holding ``SEP``. A check of the
salt alone would let such an ``extra_key`` through silently."""

from __future__ import annotations

import pytest

from policy.namespace import MAX_NAME_CHARS, SEP, name_problem, namespace

BAD = ["", f"a{SEP}b", SEP, "a\nb", "a\x7fb", "a\x9fb", "a" * (MAX_NAME_CHARS + 1), 5, ["a"]]


@pytest.mark.parametrize("bad", BAD, ids=repr)
@pytest.mark.parametrize("place", ["cache_salt", "extra_key"])
@pytest.mark.parametrize("other", [None, "tenant"])
def test_a_bad_name_is_refused_in_either_place_with_its_problem(bad, place, other):
    names = {"cache_salt": other, "extra_key": other, place: bad}
    with pytest.raises(ValueError) as refused:
        namespace(names["cache_salt"], names["extra_key"])
    assert str(refused.value) == name_problem(bad)

