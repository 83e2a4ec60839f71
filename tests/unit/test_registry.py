"""``policy.registry``: names, lookup, ``key=value`` parsing, typed config resolution, ``PolicySpec``."""

from __future__ import annotations

import dataclasses
from pathlib import Path

import pytest

from exact_cache.config import ExactConfig
from exact_cache.policy import ExactPolicy
from policy import registry
from policy.radix import RadixConfig, RadixPolicy
from policy.api import PLANS_AT
from policy.registry import PolicyError, PolicySpec
from tests.unit.conftest import FAKE_POLICY
from tests.unit.fake_policy import FakeConfig, FakePolicy

FAKE = FAKE_POLICY  # registered by the ``fake_policy`` fixture (tests/unit/conftest.py)
FAKE_SETTINGS = "piece_tokens, ratio, enabled, mode, label"


# ---------------------------------------------------------------------- names and lookup


def test_names_contains_radix():
    assert "radix" in registry.names()
    assert registry.names() == tuple(sorted(registry.names()))


def test_names_exact():
    assert registry.names() == ("exact", "radix", "scr")


@pytest.mark.parametrize(
    "lookup, expected",
    [
        pytest.param(registry.policy_class, RadixPolicy, id="policy_class"),
        pytest.param(registry.config_class, RadixConfig, id="config_class"),
    ],
)
def test_radix_lookup(lookup, expected):
    assert lookup("radix") is expected


@pytest.mark.parametrize(
    "lookup, expected",
    [
        pytest.param(registry.policy_class, ExactPolicy, id="policy_class"),
        pytest.param(registry.config_class, ExactConfig, id="config_class-explicit-attribute"),
    ],
)
def test_exact_lookup(lookup, expected):
    assert lookup("exact") is expected


def test_exact_setting_names():
    assert registry.setting_names("exact") == (
        "piece_tokens", "retain_every", "spec_drop", "max_snapshots", "dump_snapshots", "cut", "message_end",
        "message_end_id", "min_piece", "message_keeps", "keeps",
    )


@pytest.mark.parametrize(
    "settings, expected",
    [
        pytest.param({}, ExactConfig(), id="defaults"),
        pytest.param(
            {"piece_tokens": "64", "retain_every": "256", "spec_drop": "1", "max_snapshots": "8"},
            ExactConfig(piece_tokens=64, retain_every=256, spec_drop=1, max_snapshots=8),
            id="all-four",
        ),
    ],
)
def test_resolve_exact(settings, expected):
    assert registry.resolve_config("exact", settings) == expected


def test_resolve_exact_rejects_with_policy_name():
    with pytest.raises(PolicyError) as info:
        registry.resolve_config("exact", {"piece_tokens": "100"})
    assert str(info.value) == "cache policy 'exact': piece_tokens=100: must be a positive multiple of 64"


def test_fake_lookup_by_naming_convention(fake_policy):
    assert registry.names() == tuple(sorted(["exact", "radix", "scr", FAKE]))
    assert registry.policy_class(fake_policy) is FakePolicy
    assert registry.config_class(fake_policy) is FakeConfig
    assert registry.setting_names(fake_policy) == ("piece_tokens", "ratio", "enabled", "mode", "label")


@pytest.mark.parametrize(
    "lookup",
    [
        pytest.param(registry.policy_class, id="policy_class"),
        pytest.param(registry.config_class, id="config_class"),
        pytest.param(registry.setting_names, id="setting_names"),
        pytest.param(lambda name: registry.resolve_config(name, {}), id="resolve_config"),
        pytest.param(lambda name: PolicySpec.resolve(name), id="PolicySpec.resolve"),
    ],
)
def test_unknown_policy_lists_valid_names(lookup):
    with pytest.raises(PolicyError) as info:
        lookup("nope")
    assert str(info.value) == "unknown cache policy 'nope'; valid policies: exact, radix, scr"


def test_unknown_policy_lists_registered_names(fake_policy):
    with pytest.raises(PolicyError) as info:
        registry.policy_class("nope")
    assert str(info.value) == f"unknown cache policy 'nope'; valid policies: exact, radix, scr, {FAKE}"


def test_register_rejects_path_without_colon():
    with pytest.raises(ValueError) as info:
        registry.register("bad", "tests.unit.fake_policy.FakePolicy")
    assert str(info.value) == "expected 'module:attribute', got 'tests.unit.fake_policy.FakePolicy'"
    assert "bad" not in registry.names()


@pytest.mark.parametrize("policy, when", [("radix", "match"), ("exact", "tree"), ("scr", "enqueue")])
def test_each_policy_says_when_it_plans(policy, when):
    assert registry.plans_at(policy) == when and when in PLANS_AT


def test_a_policy_that_says_nothing_plans_at_the_match(fake_policy):
    assert registry.plans_at(fake_policy) == "match"


def test_plans_at_of_an_unknown_policy():
    with pytest.raises(PolicyError, match="unknown cache policy 'nope'"):
        registry.plans_at("nope")


def test_the_registry_names_no_module_of_patches():
    source = Path(registry.__file__).read_text()
    assert "patches." not in source.replace("patches/", "")


def test_policy_error_is_a_value_error():
    assert issubclass(PolicyError, ValueError)


# ---------------------------------------------------------------------- parse_assignments


@pytest.mark.parametrize(
    "items, expected",
    [
        pytest.param([], {}, id="empty"),
        pytest.param(["a=1"], {"a": "1"}, id="one"),
        pytest.param(["a=1", "b=x"], {"a": "1", "b": "x"}, id="two"),
        pytest.param(["a=1", "b=2", "a=3"], {"a": "3", "b": "2"}, id="later-key-wins"),
        pytest.param([" a = 1 ", "\tb=\tx\n"], {"a": "1", "b": "x"}, id="whitespace-stripped"),
        pytest.param(["a=b=c"], {"a": "b=c"}, id="value-contains-equals"),
        pytest.param(["a="], {"a": ""}, id="empty-value"),
        pytest.param(["a= "], {"a": ""}, id="blank-value"),
    ],
)
def test_parse_assignments(items, expected):
    assert registry.parse_assignments(items) == expected


@pytest.mark.parametrize(
    "items, message",
    [
        pytest.param(["novalue"], "--cache-policy-set expects key=value, got 'novalue'", id="missing-equals"),
        pytest.param(["a=1", "oops"], "--cache-policy-set expects key=value, got 'oops'", id="names-bad-item"),
        pytest.param(["=1"], "--cache-policy-set expects key=value, got '=1'", id="empty-key"),
        pytest.param(["  =1"], "--cache-policy-set expects key=value, got '  =1'", id="blank-key"),
        pytest.param([""], "--cache-policy-set expects key=value, got ''", id="empty-item"),
    ],
)
def test_parse_assignments_rejects(items, message):
    with pytest.raises(PolicyError) as info:
        registry.parse_assignments(items)
    assert str(info.value) == message


# ---------------------------------------------------------------------- resolve_config: radix


def test_resolve_radix_defaults():
    assert registry.resolve_config("radix", {}) == RadixConfig()
    assert registry.setting_names("radix") == ()


def test_resolve_radix_unknown_key_lists_none():
    with pytest.raises(PolicyError) as info:
        registry.resolve_config("radix", {"foo": "1"})
    assert str(info.value) == "cache policy 'radix' has no setting 'foo'; valid settings: (none)"


# ---------------------------------------------------------------------- resolve_config: typed values

BOOL_SPELLINGS = [
    ("1", True), ("0", False),
    ("true", True), ("false", False), ("TRUE", True), ("False", False),
    ("yes", True), ("no", False), ("YES", True), ("No", False),
    ("on", True), ("off", False), ("On", True), ("OFF", False),
]


@pytest.mark.parametrize("raw, expected", [pytest.param(r, e, id=r) for r, e in BOOL_SPELLINGS])
def test_bool_spellings(fake_policy, raw, expected):
    assert registry.resolve_config(fake_policy, {"enabled": raw}) == FakeConfig(enabled=expected)


@pytest.mark.parametrize(
    "settings, expected",
    [
        pytest.param({}, FakeConfig(), id="defaults"),
        pytest.param({"piece_tokens": "64"}, FakeConfig(piece_tokens=64), id="int"),
        pytest.param({"piece_tokens": "1024"}, FakeConfig(piece_tokens=1024), id="int-large"),
        pytest.param({"ratio": "0.25"}, FakeConfig(ratio=0.25), id="float"),
        pytest.param({"ratio": "2"}, FakeConfig(ratio=2.0), id="float-from-integer-text"),
        pytest.param({"ratio": "1e-3"}, FakeConfig(ratio=0.001), id="float-exponent"),
        pytest.param({"mode": "strict"}, FakeConfig(mode="strict"), id="literal-strict"),
        pytest.param({"mode": "none"}, FakeConfig(mode="none"), id="literal-none-is-a-string"),
        pytest.param({"label": "hello world"}, FakeConfig(label="hello world"), id="str"),
        pytest.param({"label": ""}, FakeConfig(label=""), id="str-empty"),
        pytest.param(
            {"piece_tokens": "128", "ratio": "0.75", "enabled": "off", "mode": "none", "label": "y"},
            FakeConfig(piece_tokens=128, ratio=0.75, enabled=False, mode="none", label="y"),
            id="all-five",
        ),
    ],
)
def test_typed_values(fake_policy, settings, expected):
    config = registry.resolve_config(fake_policy, settings)
    assert config == expected
    for f in dataclasses.fields(FakeConfig):
        assert type(getattr(config, f.name)) is type(getattr(expected, f.name)), f.name


@pytest.mark.parametrize(
    "settings, message",
    [
        pytest.param(
            {"enabled": "maybe"},
            "enabled='maybe': expected a boolean (1/0, true/false, yes/no, on/off)",
            id="bool-bad",
        ),
        pytest.param(
            {"enabled": "2"},
            "enabled='2': expected a boolean (1/0, true/false, yes/no, on/off)",
            id="bool-two",
        ),
        pytest.param({"piece_tokens": "abc"}, "piece_tokens='abc': expected an integer", id="int-bad"),
        pytest.param({"piece_tokens": "64.0"}, "piece_tokens='64.0': expected an integer", id="int-decimal"),
        pytest.param({"ratio": "half"}, "ratio='half': expected a number", id="float-bad"),
        pytest.param({"mode": "fast"}, "mode='fast': expected one of fork, strict, none", id="literal-bad"),
        pytest.param({"mode": "FORK"}, "mode='FORK': expected one of fork, strict, none", id="literal-case"),
        pytest.param(
            {"piece_tokens": "100"},
            "cache policy 'unit_test_policy': piece_tokens must be a positive multiple of 64, got 100",
            id="post-init-not-multiple",
        ),
        pytest.param(
            {"piece_tokens": "0"},
            "cache policy 'unit_test_policy': piece_tokens must be a positive multiple of 64, got 0",
            id="post-init-zero",
        ),
        pytest.param(
            {"piece_tokens": "-64"},
            "cache policy 'unit_test_policy': piece_tokens must be a positive multiple of 64, got -64",
            id="post-init-negative",
        ),
        pytest.param(
            {"bogus": "1"},
            f"cache policy 'unit_test_policy' has no setting 'bogus'; valid settings: {FAKE_SETTINGS}",
            id="unknown-key",
        ),
        pytest.param(
            {"Ratio": "1"},
            f"cache policy 'unit_test_policy' has no setting 'Ratio'; valid settings: {FAKE_SETTINGS}",
            id="unknown-key-case",
        ),
    ],
)
def test_typed_values_rejected(fake_policy, settings, message):
    with pytest.raises(PolicyError) as info:
        registry.resolve_config(fake_policy, settings)
    assert str(info.value) == message


def test_post_init_error_is_not_chained(fake_policy):
    with pytest.raises(PolicyError) as info:
        registry.resolve_config(fake_policy, {"piece_tokens": "65"})
    assert info.value.__cause__ is None
    assert info.value.__suppress_context__ is True


# ---------------------------------------------------------------------- PolicySpec


@pytest.mark.parametrize(
    "policy, assignments, events_path, expected_config",
    [
        pytest.param("radix", [], None, {}, id="radix-defaults"),
        pytest.param("radix", [], "/tmp/events.jsonl", {}, id="radix-events"),
        pytest.param(
            FAKE, [], None,
            {"piece_tokens": 832, "ratio": 0.5, "enabled": True, "mode": "fork", "label": "x"},
            id="fake-defaults",
        ),
        pytest.param(
            FAKE, ["piece_tokens=64", "enabled=no", "mode=strict", "label=a=b", "piece_tokens=192"],
            "/tmp/e.jsonl",
            {"piece_tokens": 192, "ratio": 0.5, "enabled": False, "mode": "strict", "label": "a=b"},
            id="fake-settings",
        ),
    ],
)
def test_spec_round_trip_and_build(fake_policy, policy, assignments, events_path, expected_config):
    spec = PolicySpec.resolve(policy, assignments, events_path)
    assert spec == PolicySpec(policy=policy, config=expected_config, events_path=events_path)

    again = PolicySpec.from_json(spec.to_json())
    assert again == spec

    resolved = registry.resolve_config(policy, registry.parse_assignments(assignments))
    built = again.build()
    assert type(built) is registry.policy_class(policy)
    assert built.name == policy
    assert built.config == resolved


def test_spec_to_json_exact():
    spec = PolicySpec.resolve("radix", [], "/x/e.jsonl")
    assert spec.to_json() == '{"config": {}, "events_path": "/x/e.jsonl", "policy": "radix"}'


@pytest.mark.parametrize(
    "text, expected",
    [
        pytest.param('{"policy": "radix"}', PolicySpec("radix", {}, None), id="minimal"),
        pytest.param('{"policy": "radix", "config": null}', PolicySpec("radix", {}, None), id="null-config"),
    ],
)
def test_spec_from_json_defaults(text, expected):
    assert PolicySpec.from_json(text) == expected


def test_spec_resolve_rejects_bad_setting(fake_policy):
    with pytest.raises(PolicyError) as info:
        PolicySpec.resolve(fake_policy, ["ratio=x"])
    assert str(info.value) == "ratio='x': expected a number"


@pytest.mark.parametrize(
    "policy, expected",
    [
        ("radix", {}),
        ("exact", {"piece_tokens": 832, "retain_every": 6656, "spec_drop": 0, "max_snapshots": 0,
                   "dump_snapshots": "", "cut": "grid", "message_end": "<|im_end|>", "message_end_id": -1,
                   "min_piece": 64, "message_keeps": 0, "keeps": "ends"}),
    ],
)
def test_setting_defaults(policy, expected):
    assert registry.setting_defaults(policy) == expected


def test_setting_defaults_of_the_fake_policy_follow_its_fields(fake_policy):
    assert registry.setting_defaults(fake_policy) == {
        "piece_tokens": 832, "ratio": 0.5, "enabled": True, "mode": "fork", "label": "x"}


@dataclasses.dataclass(frozen=True)
class _FactoryConfig:
    required: int
    tags: tuple = dataclasses.field(default_factory=lambda: ("a", "b"))
    limit: int = 4


class _FactoryPolicy:
    config_class = _FactoryConfig


def test_setting_defaults_call_default_factories_and_show_missing_defaults_as_none(monkeypatch):
    """A field with a ``default_factory`` shows the factory's value (as built by the dataclass
    itself), one without any default shows None."""
    monkeypatch.setitem(registry._IMPLEMENTATIONS, "factory_test", f"{__name__}:_FactoryPolicy")
    built = _FactoryConfig(required=0)
    assert registry.setting_defaults("factory_test") == {"required": None, "tags": built.tags, "limit": built.limit}


def test_fake_policy_registration_did_not_leak():
    """Last in the file, after the fixture has registered and removed the test-only policy."""
    assert FAKE not in registry._IMPLEMENTATIONS
    assert registry.names() == ("exact", "radix", "scr")
