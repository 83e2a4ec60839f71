"""policy/namespace.py: the namespace of (cache_salt, extra_key) is injective; scr reads its knobs
from the salt part."""

from __future__ import annotations

import itertools

import pytest

from policy.namespace import SEP, name_problem, namespace, salt_of, split_namespace
from scr.knobs import parse_request_knobs

NAMES = [None, "A", "B", "AB", "tenant", "X", "tenantX", "kvreuse:off", "a b", "ü"]


def test_every_pair_has_its_own_namespace():
    """Brute force over pairs of names, including the collisions of SGLang 0.5.16 ("AB" + None,
    "A" + "B", None + "AB"; "tenantX" against "tenant" + "X")."""
    seen: dict = {}
    for pair in itertools.product(NAMES, NAMES):
        key = namespace(*pair)
        assert key not in seen or seen[key] == pair, f"{pair} and {seen[key]} share namespace {key!r}"
        seen[key] = pair
        assert split_namespace(key) == pair


def test_the_known_collisions_are_apart():
    assert len({namespace("AB", None), namespace("A", "B"), namespace(None, "AB")}) == 3
    assert namespace("tenant", "X") != "tenantX"  # /generate's extra_key "tenantX" is that namespace


def test_a_salt_alone_is_the_generate_extra_key():
    """The same tenant on both routes: /generate's extra_key plays the salt's part."""
    assert namespace("tenant", None) == "tenant"
    assert namespace(None, None) is None


@pytest.mark.parametrize("name, problem", [
    ("", "must not be empty"),
    ("a" * 257, "257 characters"),
    (f"a{SEP}b", "must not contain control characters (U+001F at index 1)"),
    ("a\nb", "must not contain control characters (U+000A"),
    ("a\x85b", "must not contain control characters (U+0085"),
    (5, "must be a string, got int"),
])
def test_names_that_are_refused(name, problem):
    assert problem in name_problem(name)
    with pytest.raises(ValueError):
        namespace(name, None)


def test_names_that_are_accepted():
    for name in (None, "a" * 256, "ünï cødé", "kvreuse:knobs:ssm=none"):
        assert name_problem(name) is None


def test_scr_reads_its_knobs_from_the_salt_part():
    assert salt_of(namespace("kvreuse:off", "X")) == "kvreuse:off"
    knobs = parse_request_knobs(namespace("kvreuse:off", "X"))
    assert knobs.off and knobs.namespace == namespace("kvreuse:off", "X")
    assert not parse_request_knobs(namespace(None, "kvreuse:off")).off  # an extra_key is not a salt


def test_control_characters_are_exactly_unicode_category_cc():
    """The refused characters are the C0 and C1 controls and DEL, i.e. Unicode's category Cc: the
    bounds of the range check (0x7F, 0x9F, 0x20) are compared with the Unicode database."""
    import unicodedata

    for code in range(0x300):
        refused = name_problem(f"a{chr(code)}b") is not None
        assert refused == (unicodedata.category(chr(code)) == "Cc"), hex(code)
