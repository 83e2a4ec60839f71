"""``scr.kvreuse_env``: the authors' ``KVREUSE_*`` variables, their parsing, the dead ones, the
single-phase selectors, and precedence under ``--cache-policy-set`` (``docs/scr.md`` §2.1, §2.2)."""
# Spec: docs/scr.md

from __future__ import annotations

import dataclasses

import pytest

from scr.kvreuse_env import AUTHORS_DEFAULTS, ENV_VARS, IGNORED_ENV, env_text, from_env, resolve
from scr.settings import ScrConfig

DEFAULT = ScrConfig()


def test_every_field_has_an_env_var_in_field_order():
    assert list(ENV_VARS) == [f.name for f in dataclasses.fields(ScrConfig)]


def test_authors_defaults_are_their_table_in_order():
    # config.DEFAULTS (§2.1), written out: the [scr] start-up line prints these, in this order.
    assert list(AUTHORS_DEFAULTS.items()) == [
        ("KVREUSE_ENABLED", "1"), ("KVREUSE_MAX_BLOCKS", "6"), ("KVREUSE_SPLICE_RETRY", "8"),
        ("KVREUSE_MB_MIN_GAP", "0"), ("KVREUSE_V6_MIN_EXTEND", "16"), ("KVREUSE_SSM_MODE", "fork"),
        ("KVREUSE_FORCE", "1"), ("KVREUSE_MIN_EXTRA_TOKENS", "1024"), ("KVREUSE_MIN_EXTRA_FRAC", "0.15"),
        ("KVREUSE_MAX_SESSIONS", "16"), ("KVREUSE_SIDE_SESSIONS", "12"), ("KVREUSE_SIDE_TOKENS", "30000"),
        ("KVREUSE_BUDGET_FRAC", "0.25"), ("KVREUSE_TRACE", "1"), ("KVREUSE_DEBUG", "1"),
    ]


@pytest.mark.parametrize(
    "value, text",
    [
        pytest.param(True, "1", id="true-1"),
        pytest.param(False, "0", id="false-0"),
        pytest.param(6, "6", id="int"),
        pytest.param(0.2, "0.2", id="float"),
        pytest.param("fork", "fork", id="mode"),
    ],
)
def test_env_text(value, text):
    assert env_text(value) == text


SINGLE_PHASE_AT_DEFAULT = {"KVREUSE_V6": "1", "KVREUSE_PIN_ONLY": "0", "KVREUSE_LEAD_FREEZE": "0"}


@pytest.mark.parametrize(
    "env",
    [
        pytest.param(AUTHORS_DEFAULTS, id="authors-defaults"),
        pytest.param({}, id="empty"),
        pytest.param({"KVREUSE_MAX_BLOCK": "1", "PATH": "/bin"}, id="unknown-names-ignored"),
        *(pytest.param({var: raw}, id=f"single-phase-selector-at-default-{var}")
          for var, raw in SINGLE_PHASE_AT_DEFAULT.items()),
        *(pytest.param({var: "not a number"}, id=f"dead-knob-ignored-even-when-malformed-{var}")
          for var in IGNORED_ENV),
    ],
)
def test_env_gives_the_defaults(env):
    assert from_env(env) == DEFAULT


@pytest.mark.parametrize(
    "var, raw, name, expected",
    [
        pytest.param("KVREUSE_ENABLED", "1", "enabled", True, id="ENABLED-1"),
        pytest.param("KVREUSE_MAX_BLOCKS", "3", "max_blocks", 3, id="MAX_BLOCKS-3"),
        pytest.param("KVREUSE_SPLICE_RETRY", "0", "splice_retry", 0, id="SPLICE_RETRY-0"),
        pytest.param("KVREUSE_MB_MIN_GAP", "256", "mb_min_gap", 256, id="MB_MIN_GAP-256"),
        pytest.param("KVREUSE_V6_MIN_EXTEND", "32", "min_extend", 32, id="V6_MIN_EXTEND-32"),
        pytest.param("KVREUSE_SSM_MODE", "strict", "ssm_mode", "strict", id="SSM_MODE-strict"),
        pytest.param("KVREUSE_SSM_MODE", "none", "ssm_mode", "none", id="SSM_MODE-none"),
        pytest.param("KVREUSE_MAX_SESSIONS", "256", "max_sessions", 256, id="MAX_SESSIONS-256"),
        pytest.param("KVREUSE_SIDE_SESSIONS", "8", "side_sessions", 8, id="SIDE_SESSIONS-8"),
        pytest.param("KVREUSE_SIDE_TOKENS", "34000", "side_tokens", 34000, id="SIDE_TOKENS-34000"),
        pytest.param("KVREUSE_TRACE", "0", "trace", False, id="TRACE-0"),
        pytest.param("KVREUSE_DEBUG", "0", "debug", False, id="DEBUG-0"),
        pytest.param("KVREUSE_NO_REROTATE", "1", "no_rerotate", True, id="NO_REROTATE-1"),
        pytest.param("KVREUSE_V6_MIN_TAIL", "128", "min_tail", 128, id="V6_MIN_TAIL-128"),
        pytest.param("KVREUSE_SSM_SNAP", "release", "ssm_snap", "release", id="SSM_SNAP-release"),
        pytest.param("KVREUSE_EVICT_FLOOR_FRAC", "0.5", "evict_floor_frac", 0.5, id="EVICT_FLOOR_FRAC-0.5"),
        pytest.param("KVREUSE_EVICT_ON_ALLOC_FAIL", "0", "evict_on_alloc_fail", False, id="EVICT_ON_ALLOC_FAIL-0"),
        pytest.param("KVREUSE_EVICT_MARGIN", "0", "evict_margin", 0, id="EVICT_MARGIN-0"),
        pytest.param("KVREUSE_FASTDIFF", "0", "fastdiff", False, id="FASTDIFF-0"),
        pytest.param("KVREUSE_CDC_TARGET", "128", "cdc_target", 128, id="CDC_TARGET-128"),
        pytest.param("KVREUSE_FASTDIFF_MIN", "4096", "fastdiff_min", 4096, id="FASTDIFF_MIN-4096"),
        pytest.param("KVREUSE_CDC_EXTEND", "0", "cdc_extend", False, id="CDC_EXTEND-0"),
        pytest.param("KVREUSE_MATCH_WINDOW", "4096", "match_window", 4096, id="MATCH_WINDOW-4096"),
        pytest.param("KVREUSE_MATCH_MIN_TOKENS", "512", "match_min_tokens", 512, id="MATCH_MIN_TOKENS-512"),
        pytest.param("KVREUSE_MATCH_MIN_RATIO", "0.6", "match_min_ratio", 0.6, id="MATCH_MIN_RATIO-0.6"),
        pytest.param("KVREUSE_MATCH_MIN_PREFIX_FRAC", "0.25", "match_min_prefix_frac", 0.25, id="MIN_PREFIX_FRAC"),
        pytest.param("KVREUSE_MATCH_MIN_OVERLAP", "0.75", "match_min_overlap", 0.75, id="MATCH_MIN_OVERLAP-0.75"),
        pytest.param("KVREUSE_MATCH_AMBIG_MARGIN", "0", "match_ambig_margin", 0.0, id="MATCH_AMBIG_MARGIN-0"),
        pytest.param("KVREUSE_T6_GUARD", "0", "t6_guard", False, id="T6_GUARD-0"),
        pytest.param("KVREUSE_SSM", "0", "ssm", False, id="SSM-0"),
        pytest.param("KVREUSE_RELOCATED_IN_TREE", "0", "relocated_in_tree", False, id="RELOCATED_IN_TREE-0"),
        pytest.param("KVREUSE_SESSION_IDENTITY", "rid", "session_identity", "rid", id="SESSION_IDENTITY-rid"),
        pytest.param("KVREUSE_MAX_BLOCKS", " 3 ", "max_blocks", 3, id="int-python-int-strips-spaces"),
        pytest.param("KVREUSE_MATCH_MIN_RATIO", "1", "match_min_ratio", 1.0, id="float-from-int-text"),
    ],
)
def test_env_valid(var, raw, name, expected):
    config = from_env({var: raw})
    assert config == dataclasses.replace(DEFAULT, **{name: expected})
    assert type(getattr(config, name)) is type(expected)


def test_env_valid_cases_cover_every_field():
    marks = test_env_valid.pytestmark[0].args[1]
    assert {case.values[2] for case in marks} == set(ENV_VARS)


@pytest.mark.parametrize(
    "raw, expected",
    [
        pytest.param("1", True, id="1-on"),
        pytest.param("0", False, id="0-off"),
        pytest.param("true", False, id="true-off-needs-exactly-1"),
        pytest.param("yes", False, id="yes-off"),
        pytest.param(" 1", False, id="padded-off"),
        pytest.param("", False, id="empty-off"),
    ],
)
def test_env_enabled_requires_exactly_1(raw, expected):
    assert from_env({"KVREUSE_ENABLED": raw}).enabled is expected


@pytest.mark.parametrize(
    "var, raw, message",
    [
        pytest.param("KVREUSE_MAX_BLOCKS", "six", "KVREUSE_MAX_BLOCKS='six' (max_blocks): expected an integer", id="MAX_BLOCKS-word"),
        pytest.param("KVREUSE_MAX_BLOCKS", "0", "KVREUSE_MAX_BLOCKS='0' (max_blocks): must be >= 1", id="MAX_BLOCKS-0"),
        pytest.param("KVREUSE_SPLICE_RETRY", "-1", "KVREUSE_SPLICE_RETRY='-1' (splice_retry): must be >= 0", id="SPLICE_RETRY-neg"),
        pytest.param("KVREUSE_MB_MIN_GAP", "1.5", "KVREUSE_MB_MIN_GAP='1.5' (mb_min_gap): expected an integer", id="MB_MIN_GAP-float"),
        pytest.param("KVREUSE_V6_MIN_EXTEND", "0", "KVREUSE_V6_MIN_EXTEND='0' (min_extend): must be >= 1", id="V6_MIN_EXTEND-0"),
        pytest.param("KVREUSE_SSM_MODE", "FORK", "KVREUSE_SSM_MODE='FORK' (ssm_mode): expected one of fork, strict, none", id="SSM_MODE-case"),
        pytest.param("KVREUSE_MAX_SESSIONS", "0", "KVREUSE_MAX_SESSIONS='0' (max_sessions): must be >= 1", id="MAX_SESSIONS-0"),
        pytest.param("KVREUSE_SIDE_SESSIONS", "x", "KVREUSE_SIDE_SESSIONS='x' (side_sessions): expected an integer", id="SIDE_SESSIONS-word"),
        pytest.param("KVREUSE_SIDE_TOKENS", "", "KVREUSE_SIDE_TOKENS='' (side_tokens): empty value", id="SIDE_TOKENS-empty"),
        pytest.param("KVREUSE_TRACE", "true", "KVREUSE_TRACE='true' (trace): expected 0 or 1", id="TRACE-true"),
        pytest.param("KVREUSE_DEBUG", "2", "KVREUSE_DEBUG='2' (debug): expected 0 or 1", id="DEBUG-2"),
        pytest.param("KVREUSE_NO_REROTATE", "yes", "KVREUSE_NO_REROTATE='yes' (no_rerotate): expected 0 or 1", id="NO_REROTATE-yes"),
        pytest.param("KVREUSE_V6_MIN_TAIL", "0", "KVREUSE_V6_MIN_TAIL='0' (min_tail): must be >= 1", id="V6_MIN_TAIL-0"),
        pytest.param("KVREUSE_SSM_SNAP", "prefill-end", "KVREUSE_SSM_SNAP='prefill-end' (ssm_snap): expected one of prefill_end, release", id="SSM_SNAP-dash"),
        pytest.param("KVREUSE_EVICT_FLOOR_FRAC", "20%", "KVREUSE_EVICT_FLOOR_FRAC='20%' (evict_floor_frac): expected a number", id="EVICT_FLOOR_FRAC-percent"),
        pytest.param("KVREUSE_EVICT_FLOOR_FRAC", "1.2", "KVREUSE_EVICT_FLOOR_FRAC='1.2' (evict_floor_frac): must be within [0, 1]", id="EVICT_FLOOR_FRAC-1.2"),
        pytest.param("KVREUSE_EVICT_ON_ALLOC_FAIL", "off", "KVREUSE_EVICT_ON_ALLOC_FAIL='off' (evict_on_alloc_fail): expected 0 or 1", id="EVICT_ON_ALLOC_FAIL-off"),
        pytest.param("KVREUSE_EVICT_MARGIN", "-5", "KVREUSE_EVICT_MARGIN='-5' (evict_margin): must be >= 0", id="EVICT_MARGIN-neg"),
        pytest.param("KVREUSE_FASTDIFF", "", "KVREUSE_FASTDIFF='' (fastdiff): empty value", id="FASTDIFF-empty"),
        pytest.param("KVREUSE_CDC_TARGET", "48", "KVREUSE_CDC_TARGET='48' (cdc_target): must be a power of two (it is used as a bit mask)", id="CDC_TARGET-48"),
        pytest.param("KVREUSE_FASTDIFF_MIN", "2k", "KVREUSE_FASTDIFF_MIN='2k' (fastdiff_min): expected an integer", id="FASTDIFF_MIN-2k"),
        pytest.param("KVREUSE_CDC_EXTEND", "True", "KVREUSE_CDC_EXTEND='True' (cdc_extend): expected 0 or 1", id="CDC_EXTEND-True"),
        pytest.param("KVREUSE_MATCH_WINDOW", "0", "KVREUSE_MATCH_WINDOW='0' (match_window): must be >= 1", id="MATCH_WINDOW-0"),
        pytest.param("KVREUSE_MATCH_MIN_TOKENS", "1e3", "KVREUSE_MATCH_MIN_TOKENS='1e3' (match_min_tokens): expected an integer", id="MATCH_MIN_TOKENS-1e3"),
        pytest.param("KVREUSE_MATCH_MIN_RATIO", "high", "KVREUSE_MATCH_MIN_RATIO='high' (match_min_ratio): expected a number", id="MATCH_MIN_RATIO-word"),
        pytest.param("KVREUSE_MATCH_MIN_PREFIX_FRAC", "-0.5", "KVREUSE_MATCH_MIN_PREFIX_FRAC='-0.5' (match_min_prefix_frac): must be within [0, 1]", id="MIN_PREFIX_FRAC-neg"),
        pytest.param("KVREUSE_MATCH_MIN_OVERLAP", "nan", "KVREUSE_MATCH_MIN_OVERLAP='nan' (match_min_overlap): must be within [0, 1]", id="MIN_OVERLAP-nan"),
        pytest.param("KVREUSE_MATCH_AMBIG_MARGIN", "", "KVREUSE_MATCH_AMBIG_MARGIN='' (match_ambig_margin): empty value", id="AMBIG_MARGIN-empty"),
        pytest.param("KVREUSE_T6_GUARD", "on", "KVREUSE_T6_GUARD='on' (t6_guard): expected 0 or 1", id="T6_GUARD-on"),
        pytest.param("KVREUSE_SSM", "-1", "KVREUSE_SSM='-1' (ssm): expected 0 or 1", id="SSM-neg"),
        pytest.param("KVREUSE_RELOCATED_IN_TREE", "yes", "KVREUSE_RELOCATED_IN_TREE='yes' (relocated_in_tree): "
                     "expected 0 or 1", id="RELOCATED_IN_TREE-yes"),
        pytest.param("KVREUSE_SESSION_IDENTITY", "conversation", "KVREUSE_SESSION_IDENTITY='conversation' "
                     "(session_identity): expected one of content, session_id, rid", id="SESSION_IDENTITY-word"),
    ],
)  # fmt: skip
def test_env_invalid(var, raw, message):
    with pytest.raises(ValueError) as info:
        from_env({var: raw})
    assert str(info.value) == message


def test_env_invalid_cases_cover_every_field_but_enabled():
    marks = test_env_invalid.pytestmark[0].args[1]
    covered = {case.values[0] for case in marks}
    assert covered == set(ENV_VARS.values()) - {"KVREUSE_ENABLED"}


@pytest.mark.parametrize(
    "make",
    [
        pytest.param(lambda: from_env({"KVREUSE_MATCH_WINDOW": "512"}), id="from-the-config"),
        # validation runs per layer: a bad env layer fails before the settings are applied
        pytest.param(lambda: resolve({"KVREUSE_MATCH_WINDOW": "512"}, {"match_min_tokens": "256"}),
                     id="env-layer-validated-before-settings-apply"),
    ],
)
def test_env_cross_field_error(make):
    with pytest.raises(ValueError) as info:
        make()
    assert str(info.value) == "match_min_tokens=1024: must be <= match_window=512, or no session could ever match"


@pytest.mark.parametrize(
    "var, raw, message",
    [
        pytest.param(
            "KVREUSE_V6", "0",
            "KVREUSE_V6='0': selects the single-phase path, which this port does not implement "
            "(only KVREUSE_V6=1 is accepted)",
            id="V6-0",
        ),
        pytest.param(
            "KVREUSE_PIN_ONLY", "1",
            "KVREUSE_PIN_ONLY='1': selects the single-phase path, which this port does not implement "
            "(only KVREUSE_PIN_ONLY=0 is accepted)",
            id="PIN_ONLY-1",
        ),
        pytest.param(
            "KVREUSE_LEAD_FREEZE", "1",
            "KVREUSE_LEAD_FREEZE='1': selects the single-phase path, which this port does not implement "
            "(only KVREUSE_LEAD_FREEZE=0 is accepted)",
            id="LEAD_FREEZE-1",
        ),
    ],
)
def test_env_single_phase_selectors_rejected(var, raw, message):
    with pytest.raises(ValueError) as info:
        from_env({var: raw})
    assert str(info.value) == message


@pytest.mark.parametrize(
    "script_env, changes",
    [
        # examples/serve_qwen36.sh with KVREUSE_MAX_BLOCKS=3 (§14.7), on top of config.DEFAULTS.
        pytest.param({"KVREUSE_MAX_BLOCKS": "3"}, {"max_blocks": 3}, id="k3"),
        pytest.param({"KVREUSE_ENABLED": "0"}, {"enabled": False}, id="scr-off"),
    ],
)
def test_env_example_scripts(script_env, changes):
    assert from_env(dict(AUTHORS_DEFAULTS, **script_env)) == dataclasses.replace(DEFAULT, **changes)


def test_env_applies_on_top_of_base():
    base = ScrConfig(max_blocks=2, side_sessions=4)
    config = from_env({"KVREUSE_SIDE_SESSIONS": "6"}, base=base)
    assert (config.max_blocks, config.side_sessions) == (2, 6)


def test_env_does_not_mutate_its_input():
    env = {"KVREUSE_MAX_BLOCKS": "3"}
    from_env(env)
    assert env == {"KVREUSE_MAX_BLOCKS": "3"}


@pytest.mark.parametrize(
    "env, settings, expected",
    [
        pytest.param({}, {}, {"max_blocks": 6}, id="default"),
        pytest.param({"KVREUSE_MAX_BLOCKS": "3"}, {}, {"max_blocks": 3}, id="env-over-default"),
        pytest.param({}, {"max_blocks": "2"}, {"max_blocks": 2}, id="setting-over-default"),
        pytest.param({"KVREUSE_MAX_BLOCKS": "3"}, {"max_blocks": "2"}, {"max_blocks": 2}, id="setting-over-env"),
        pytest.param(dict(AUTHORS_DEFAULTS, KVREUSE_MAX_BLOCKS="3"), {"max_blocks": "5"}, {"max_blocks": 5},
                     id="setting-over-scripts"),
        pytest.param({"KVREUSE_SIDE_SESSIONS": "4", "KVREUSE_TRACE": "0"}, {"trace": "1"},
                     {"side_sessions": 4, "trace": True}, id="mixed-fields"),
    ],
)
def test_precedence(env, settings, expected):
    config = resolve(env, settings)
    assert {name: getattr(config, name) for name in expected} == expected
