"""``scr.config``: ``ScrConfig`` defaults and validation, ``KVREUSE_*`` parsing, precedence, and
the per-request ``cache_salt`` knobs (``scr_spec.md`` §2)."""

from __future__ import annotations

import dataclasses

import pytest

from scr import config as scr_config
from scr.config import (
    AUTHORS_DEFAULTS,
    ENV_VARS,
    IGNORED_ENV,
    RequestKnobs,
    ScrConfig,
    UnsupportedKnob,
    from_env,
    merge,
    parse_request_knobs,
    resolve,
)

DEFAULT = ScrConfig()


# ---------------------------------------------------------------------- defaults


@pytest.mark.parametrize(
    "name, expected",
    [
        pytest.param("enabled", True, id="enabled-config.DEFAULTS-1"),
        pytest.param("max_blocks", 6, id="max_blocks-K6"),
        pytest.param("splice_retry", 8, id="splice_retry-8"),
        pytest.param("mb_min_gap", 0, id="mb_min_gap-off"),
        pytest.param("min_extend", 16, id="min_extend-kext16"),
        pytest.param("ssm_mode", "fork", id="ssm_mode-fork"),
        pytest.param("max_sessions", 16, id="max_sessions-16"),
        pytest.param("side_sessions", 12, id="side_sessions-12"),
        pytest.param("side_tokens", 30000, id="side_tokens-30000"),
        pytest.param("trace", True, id="trace-on"),
        pytest.param("debug", True, id="debug-on"),
        pytest.param("no_rerotate", False, id="no_rerotate-off"),
        pytest.param("min_tail", 64, id="min_tail-64"),
        pytest.param("ssm_snap", "prefill_end", id="ssm_snap-prefill_end"),
        pytest.param("evict_floor_frac", 0.20, id="evict_floor_frac-0.20"),
        pytest.param("evict_on_alloc_fail", True, id="evict_on_alloc_fail-on"),
        pytest.param("evict_margin", 2048, id="evict_margin-2048"),
        pytest.param("fastdiff", True, id="fastdiff-on"),
        pytest.param("cdc_target", 64, id="cdc_target-64"),
        pytest.param("fastdiff_min", 2048, id="fastdiff_min-2048"),
        pytest.param("cdc_extend", True, id="cdc_extend-on"),
        pytest.param("match_window", 8192, id="match_window-8192"),
        pytest.param("match_min_tokens", 1024, id="match_min_tokens-1024"),
        pytest.param("match_min_ratio", 0.55, id="match_min_ratio-0.55"),
        pytest.param("match_min_prefix_frac", 0.5, id="match_min_prefix_frac-0.5"),
        pytest.param("match_min_overlap", 0.5, id="match_min_overlap-0.5"),
        pytest.param("match_ambig_margin", 0.15, id="match_ambig_margin-0.15"),
        pytest.param("t6_guard", True, id="t6_guard-on"),
        pytest.param("ssm", True, id="ssm-shadow-on"),
        pytest.param("timing", False, id="timing-off"),
        pytest.param("timing_every", 50, id="timing_every-50"),
        pytest.param("relocated_in_tree", False, id="relocated_in_tree-False"),
    ],
)
def test_default(name, expected):
    assert getattr(DEFAULT, name) == expected
    assert type(getattr(DEFAULT, name)) is type(expected)


def test_every_field_has_a_default_case_and_an_env_var():
    names = [f.name for f in dataclasses.fields(ScrConfig)]
    assert list(ENV_VARS) == names
    assert len(names) == 32


def test_docstring_table_lists_every_field_with_its_env_var():
    for name, var in ENV_VARS.items():
        assert f"| {name:<21} | {var:<32} |" in scr_config.__doc__


def test_authors_defaults_give_the_field_defaults():
    assert from_env(AUTHORS_DEFAULTS) == DEFAULT


def test_empty_env_gives_the_defaults():
    assert from_env({}) == DEFAULT


def test_config_is_frozen():
    with pytest.raises(dataclasses.FrozenInstanceError):
        DEFAULT.max_blocks = 3


# ---------------------------------------------------------------------- validation


@pytest.mark.parametrize(
    "settings, message",
    [
        pytest.param({"enabled": 1}, "enabled=1: expected a boolean", id="enabled-int"),
        pytest.param({"max_blocks": 0}, "max_blocks=0: must be >= 1", id="max_blocks-0"),
        pytest.param({"max_blocks": True}, "max_blocks=True: expected an integer", id="max_blocks-bool"),
        pytest.param({"max_blocks": 6.0}, "max_blocks=6.0: expected an integer", id="max_blocks-float"),
        pytest.param({"splice_retry": -1}, "splice_retry=-1: must be >= 0", id="splice_retry-negative"),
        pytest.param({"mb_min_gap": -1}, "mb_min_gap=-1: must be >= 0", id="mb_min_gap-negative"),
        pytest.param({"min_extend": 0}, "min_extend=0: must be >= 1", id="min_extend-0"),
        pytest.param({"ssm_mode": "fast"}, "ssm_mode='fast': expected one of fork, strict, none", id="ssm_mode"),
        pytest.param({"max_sessions": 0}, "max_sessions=0: must be >= 1", id="max_sessions-0"),
        pytest.param({"side_sessions": 0}, "side_sessions=0: must be >= 1", id="side_sessions-0"),
        pytest.param({"side_tokens": 0}, "side_tokens=0: must be >= 1", id="side_tokens-0"),
        pytest.param({"trace": "1"}, "trace='1': expected a boolean", id="trace-str"),
        pytest.param({"debug": None}, "debug=None: expected a boolean", id="debug-None"),
        pytest.param({"no_rerotate": 0}, "no_rerotate=0: expected a boolean", id="no_rerotate-int"),
        pytest.param({"min_tail": 0}, "min_tail=0: must be >= 1", id="min_tail-0"),
        pytest.param({"ssm_snap": "end"}, "ssm_snap='end': expected one of prefill_end, release", id="ssm_snap"),
        pytest.param({"evict_floor_frac": 1.5}, "evict_floor_frac=1.5: must be within [0, 1]", id="floor-above-1"),
        pytest.param({"evict_floor_frac": float("nan")}, "evict_floor_frac=nan: must be within [0, 1]", id="floor-nan"),
        pytest.param({"evict_floor_frac": "0.2"}, "evict_floor_frac='0.2': expected a number", id="floor-str"),
        pytest.param({"evict_on_alloc_fail": 1}, "evict_on_alloc_fail=1: expected a boolean", id="evict_on_fail-int"),
        pytest.param({"evict_margin": -1}, "evict_margin=-1: must be >= 0", id="evict_margin-negative"),
        pytest.param({"fastdiff": "yes"}, "fastdiff='yes': expected a boolean", id="fastdiff-str"),
        pytest.param(
            {"cdc_target": 48}, "cdc_target=48: must be a power of two (it is used as a bit mask)", id="cdc_target-48"
        ),
        pytest.param(
            {"cdc_target": 0}, "cdc_target=0: must be a power of two (it is used as a bit mask)", id="cdc_target-0"
        ),
        pytest.param({"fastdiff_min": -1}, "fastdiff_min=-1: must be >= 0", id="fastdiff_min-negative"),
        pytest.param({"cdc_extend": 1}, "cdc_extend=1: expected a boolean", id="cdc_extend-int"),
        pytest.param({"match_window": 0}, "match_window=0: must be >= 1", id="match_window-0"),
        pytest.param({"match_min_tokens": 0}, "match_min_tokens=0: must be >= 1", id="match_min_tokens-0"),
        pytest.param({"match_min_ratio": -0.1}, "match_min_ratio=-0.1: must be within [0, 1]", id="min_ratio"),
        pytest.param(
            {"match_min_prefix_frac": 1.01}, "match_min_prefix_frac=1.01: must be within [0, 1]", id="min_prefix_frac"
        ),
        pytest.param({"match_min_overlap": 2}, "match_min_overlap=2: must be within [0, 1]", id="min_overlap"),
        pytest.param(
            {"match_ambig_margin": -0.01}, "match_ambig_margin=-0.01: must be within [0, 1]", id="ambig_margin"
        ),
        pytest.param({"t6_guard": None}, "t6_guard=None: expected a boolean", id="t6_guard-None"),
        pytest.param({"ssm": 1}, "ssm=1: expected a boolean", id="ssm-int"),
        pytest.param({"timing": "0"}, "timing='0': expected a boolean", id="timing-str"),
        pytest.param({"timing_every": 0}, "timing_every=0: must be >= 1", id="timing_every-0"),
        pytest.param(
            {"match_min_tokens": 9000},
            "match_min_tokens=9000: must be <= match_window=8192, or no session could ever match",
            id="min_tokens-above-window",
        ),
    ],
)
def test_validation_error(settings, message):
    with pytest.raises(ValueError) as info:
        ScrConfig(**settings)
    assert str(info.value) == message


@pytest.mark.parametrize(
    "settings",
    [
        pytest.param({"max_blocks": 1, "min_extend": 1, "min_tail": 1}, id="smallest-plan-knobs"),
        pytest.param({"cdc_target": 1}, id="cdc_target-1-is-2**0"),
        pytest.param({"cdc_target": 4096}, id="cdc_target-4096"),
        pytest.param({"match_min_tokens": 8192}, id="min_tokens-equal-to-window"),
        pytest.param({"evict_floor_frac": 0, "match_min_ratio": 1}, id="fraction-ends-int"),
        pytest.param({"splice_retry": 0, "mb_min_gap": 0, "evict_margin": 0, "fastdiff_min": 0}, id="zeros"),
    ],
)
def test_valid_edge_values(settings):
    config = ScrConfig(**settings)
    for name, value in settings.items():
        assert getattr(config, name) == value


# ---------------------------------------------------------------------- environment


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
        pytest.param("KVREUSE_TIMING", "1", "timing", True, id="TIMING-1"),
        pytest.param("KVREUSE_TIMING_EVERY", "10", "timing_every", 10, id="TIMING_EVERY-10"),
        pytest.param("KVREUSE_RELOCATED_IN_TREE", "1", "relocated_in_tree", True, id="RELOCATED_IN_TREE-1"),
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
        pytest.param("KVREUSE_TIMING", "01", "KVREUSE_TIMING='01' (timing): expected 0 or 1", id="TIMING-01"),
        pytest.param("KVREUSE_TIMING_EVERY", "0", "KVREUSE_TIMING_EVERY='0' (timing_every): must be >= 1", id="TIMING_EVERY-0"),
        pytest.param("KVREUSE_RELOCATED_IN_TREE", "yes", "KVREUSE_RELOCATED_IN_TREE='yes' (relocated_in_tree): "
                     "expected 0 or 1", id="RELOCATED_IN_TREE-yes"),
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


def test_env_cross_field_error_comes_from_the_config():
    with pytest.raises(ValueError) as info:
        from_env({"KVREUSE_MATCH_WINDOW": "512"})
    assert str(info.value) == "match_min_tokens=1024: must be <= match_window=512, or no session could ever match"


@pytest.mark.parametrize("var", IGNORED_ENV, ids=IGNORED_ENV)
def test_env_dead_knobs_are_ignored_even_when_malformed(var):
    assert from_env({var: "not a number"}) == DEFAULT


def test_env_unknown_names_are_ignored():
    assert from_env({"KVREUSE_MAX_BLOCK": "1", "PATH": "/bin"}) == DEFAULT


@pytest.mark.parametrize(
    "var, raw",
    [
        pytest.param("KVREUSE_V6", "1", id="V6-1"),
        pytest.param("KVREUSE_PIN_ONLY", "0", id="PIN_ONLY-0"),
        pytest.param("KVREUSE_LEAD_FREEZE", "0", id="LEAD_FREEZE-0"),
    ],
)
def test_env_single_phase_selectors_at_default_are_accepted(var, raw):
    assert from_env({var: raw}) == DEFAULT


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


def test_env_example_script_k3():
    # examples/serve_qwen36.sh with KVREUSE_MAX_BLOCKS=3 (§14.7), on top of config.DEFAULTS.
    env = dict(AUTHORS_DEFAULTS, KVREUSE_MAX_BLOCKS="3")
    assert from_env(env) == dataclasses.replace(DEFAULT, max_blocks=3)


def test_env_example_script_scr_off():
    env = dict(AUTHORS_DEFAULTS, KVREUSE_ENABLED="0")
    assert from_env(env) == dataclasses.replace(DEFAULT, enabled=False)


def test_env_applies_on_top_of_base():
    base = ScrConfig(max_blocks=2, side_sessions=4)
    config = from_env({"KVREUSE_SIDE_SESSIONS": "6"}, base=base)
    assert (config.max_blocks, config.side_sessions) == (2, 6)


def test_env_does_not_mutate_its_input():
    env = {"KVREUSE_MAX_BLOCKS": "3"}
    from_env(env)
    assert env == {"KVREUSE_MAX_BLOCKS": "3"}


# ---------------------------------------------------------------------- merge and precedence


@pytest.mark.parametrize(
    "overrides, expected",
    [
        pytest.param({"max_blocks": "3"}, {"max_blocks": 3}, id="int-text"),
        pytest.param({"max_blocks": 4}, {"max_blocks": 4}, id="int-value"),
        pytest.param({"trace": "false"}, {"trace": False}, id="bool-registry-spelling"),
        pytest.param({"trace": "off", "debug": "0"}, {"trace": False, "debug": False}, id="bools"),
        pytest.param({"ssm_mode": "none"}, {"ssm_mode": "none"}, id="literal"),
        pytest.param({"match_min_ratio": "0.7"}, {"match_min_ratio": 0.7}, id="float-text"),
        pytest.param({}, {}, id="nothing"),
    ],
)
def test_merge(overrides, expected):
    assert merge(DEFAULT, overrides) == dataclasses.replace(DEFAULT, **expected)


@pytest.mark.parametrize(
    "overrides, message",
    [
        pytest.param(
            {"max_block": "3"},
            "scr has no setting 'max_block'; valid settings: " + ", ".join(ENV_VARS),
            id="unknown-key",
        ),
        pytest.param({"max_blocks": "x"}, "max_blocks='x': expected an integer", id="bad-int-text"),
        pytest.param({"max_blocks": 0}, "max_blocks=0: must be >= 1", id="out-of-range"),
        pytest.param(
            {"ssm_mode": "fast"}, "ssm_mode='fast': expected one of fork, strict, none", id="bad-literal"
        ),
    ],
)
def test_merge_errors(overrides, message):
    with pytest.raises(ValueError) as info:
        merge(DEFAULT, overrides)
    assert str(info.value) == message


@pytest.mark.parametrize(
    "env, settings, expected",
    [
        pytest.param({}, {}, 6, id="default"),
        pytest.param({"KVREUSE_MAX_BLOCKS": "3"}, {}, 3, id="env-over-default"),
        pytest.param({}, {"max_blocks": "2"}, 2, id="setting-over-default"),
        pytest.param({"KVREUSE_MAX_BLOCKS": "3"}, {"max_blocks": "2"}, 2, id="setting-over-env"),
        pytest.param(dict(AUTHORS_DEFAULTS, KVREUSE_MAX_BLOCKS="3"), {"max_blocks": "5"}, 5, id="setting-over-scripts"),
    ],
)
def test_precedence(env, settings, expected):
    assert resolve(env, settings).max_blocks == expected


def test_precedence_mixed_fields():
    config = resolve({"KVREUSE_SIDE_SESSIONS": "4", "KVREUSE_TRACE": "0"}, {"trace": "1"})
    assert (config.side_sessions, config.trace) == (4, True)


def test_env_layer_is_validated_before_settings_apply():
    # Validation runs per layer: a bad env layer fails before the settings are applied.
    with pytest.raises(ValueError):
        resolve({"KVREUSE_MATCH_WINDOW": "512"}, {"match_min_tokens": "256"})


# ---------------------------------------------------------------------- per-request knobs


@pytest.mark.parametrize(
    "salt, expected",
    [
        pytest.param(None, RequestKnobs(), id="no-salt"),
        pytest.param("tenant-a", RequestKnobs(namespace="tenant-a"), id="plain-salt"),
        pytest.param("kvreuse:off", RequestKnobs(namespace="kvreuse:off", off=True), id="off"),
        pytest.param(
            "KVREUSE:off", RequestKnobs(namespace="KVREUSE:off"), id="prefix-is-case-sensitive"
        ),
        pytest.param(
            "kvreuse:offline",
            RequestKnobs(namespace="kvreuse:offline", ignored=(("offline", "unknown kvreuse switch"),)),
            id="off-must-be-exact",
        ),
        pytest.param(
            "tenant-kvreuse:off", RequestKnobs(namespace="tenant-kvreuse:off"), id="prefix-must-lead"
        ),
        pytest.param(
            "kvreuse:knobs:maxblocks=3",
            RequestKnobs(namespace="kvreuse:knobs:maxblocks=3", overrides={"max_blocks": 3}),
            id="maxblocks",
        ),
        pytest.param(
            "kvreuse:knobs:maxblocks=0,minext=-2",
            RequestKnobs(
                namespace="kvreuse:knobs:maxblocks=0,minext=-2", overrides={"max_blocks": 1, "min_extend": 1}
            ),
            id="maxblocks-minext-clamped-to-1-like-the-planner",
        ),
        pytest.param(
            "kvreuse:knobs:mintail=128,ssm=none,rerot=0",
            RequestKnobs(
                namespace="kvreuse:knobs:mintail=128,ssm=none,rerot=0",
                overrides={"min_tail": 128, "ssm_mode": "none", "no_rerotate": True},
            ),
            id="mintail-ssm-rerot-off",
        ),
        pytest.param(
            "kvreuse:knobs:rerot=YES",
            RequestKnobs(namespace="kvreuse:knobs:rerot=YES", overrides={"no_rerotate": False}),
            id="rerot-true-word-case-insensitive",
        ),
        pytest.param(
            "kvreuse:knobs:pin=0,v6=1,lead=off,force=no,min_extra=512,maxblocks=2",
            RequestKnobs(
                namespace="kvreuse:knobs:pin=0,v6=1,lead=off,force=no,min_extra=512,maxblocks=2",
                overrides={"max_blocks": 2},
                ignored=(
                    ("min_extra=512", "single-phase path only (its gain test): no effect"),
                    ("pin=0", "single-phase knob at its two-phase value: no effect"),
                    ("v6=1", "single-phase knob at its two-phase value: no effect"),
                    ("lead=off", "single-phase knob at its two-phase value: no effect"),
                    ("force=no", "single-phase knob at its two-phase value: no effect"),
                ),
            ),
            id="single-phase-knobs-at-two-phase-values-have-no-effect",
        ),
        pytest.param(
            "kvreuse:knobs:pin=1,pin=0",
            RequestKnobs(
                namespace="kvreuse:knobs:pin=1,pin=0",
                ignored=(("pin=0", "single-phase knob at its two-phase value: no effect"),),
            ),
            id="single-phase-knob-later-wins",
        ),
        pytest.param(
            "kvreuse:knobs: maxblocks = 2 ,,maxblocks=4,",
            RequestKnobs(namespace="kvreuse:knobs: maxblocks = 2 ,,maxblocks=4,", overrides={"max_blocks": 4}),
            id="spaces-empty-items-later-wins",
        ),
        pytest.param(
            "kvreuse:knobs:maxblocks,zz=1,maxblocks=two,ssm=FORK,mintail=0,min_extra=x,minext=8",
            RequestKnobs(
                namespace="kvreuse:knobs:maxblocks,zz=1,maxblocks=two,ssm=FORK,mintail=0,min_extra=x,minext=8",
                overrides={"min_extend": 8},
                ignored=(
                    ("maxblocks", "expected key=value"),
                    ("zz=1", "unknown knob"),
                    ("maxblocks=two", "expected an integer"),
                    ("ssm=FORK", "expected one of fork, strict, none"),
                    ("mintail=0", "must be >= 1"),
                    ("min_extra=x", "single-phase path only (its gain test): no effect"),
                ),
            ),
            id="malformed-items-ignored-and-reported",
        ),
        pytest.param(
            "kvreuse:knobs:",
            RequestKnobs(namespace="kvreuse:knobs:"),
            id="empty-knob-list",
        ),
        pytest.param(
            "kvreuse:knobs:maxblocks=3tenant-b",
            RequestKnobs(
                namespace="kvreuse:knobs:maxblocks=3tenant-b",
                ignored=(("maxblocks=3tenant-b", "expected an integer"),),
            ),
            id="extra_key-concatenated-onto-the-last-value",
        ),
    ],
)
def test_parse_request_knobs(salt, expected):
    assert parse_request_knobs(salt) == expected


NOT_PORTED = "selects the single-phase path, which this port does not implement"


@pytest.mark.parametrize(
    "salt, message",
    [
        pytest.param("kvreuse:knobs:pin=1",
                     f"cache_salt knob pin='1': {NOT_PORTED} (only pin=0 is accepted); for a control run "
                     "that relocates nothing use cache_salt 'kvreuse:off' (plain radix cache)", id="pin"),
        pytest.param("kvreuse:knobs:v6=0",
                     f"cache_salt knob v6='0': {NOT_PORTED} (only v6=1 is accepted); leave the knob out: "
                     "the two-phase path is the default", id="v6-off"),
        pytest.param("kvreuse:knobs:lead=yes",
                     f"cache_salt knob lead='yes': {NOT_PORTED} (only lead=0 is accepted); leave the knob out: "
                     "the radix cache serves the leading run", id="lead"),
        pytest.param("kvreuse:knobs:force=true",
                     "cache_salt knob force='true': applies to the single-phase path only, which this port does "
                     "not implement (only force=0 is accepted); leave the knob out: the two-phase path has no "
                     "gain test to skip", id="force"),
    ],
)  # fmt: skip
def test_single_phase_knobs_raise(salt, message):
    with pytest.raises(UnsupportedKnob) as info:
        parse_request_knobs(salt)
    assert str(info.value) == message
    assert isinstance(info.value, ValueError)


@pytest.mark.parametrize(
    "salt, knob",
    [
        pytest.param("kvreuse:knobs:maxblocks=3,PIN = ON", None, id="key-is-case-sensitive-so-unknown"),
        pytest.param("kvreuse:knobs:maxblocks=3, pin = ON ", "pin", id="after-a-supported-knob"),
        pytest.param("kvreuse:knobs:v6=1,v6=off", "v6", id="later-wins"),
        pytest.param("kvreuse:knobs:force=1,lead=1", "force", id="first-in-the-salt-named"),
    ],
)
def test_single_phase_knob_anywhere_in_the_salt_raises(salt, knob):
    if knob is None:
        assert parse_request_knobs(salt).ignored == (("PIN = ON", "unknown knob"),)
        return
    with pytest.raises(UnsupportedKnob) as info:
        parse_request_knobs(salt)
    assert str(info.value).startswith(f"cache_salt knob {knob}=")


def test_admit_lets_an_unsupported_knob_propagate_before_any_session_change():
    from scr.policy import ScrPolicy

    policy = ScrPolicy(DEFAULT)
    with pytest.raises(UnsupportedKnob, match="pin="):
        policy.admit(list(range(3000)), "kvreuse:knobs:pin=1")
    assert len(policy.sessions) == 0


def test_env_and_knob_refusals_share_their_wording():
    with pytest.raises(UnsupportedKnob) as env:
        from_env({"KVREUSE_PIN_ONLY": "1"})
    with pytest.raises(UnsupportedKnob) as knob:
        parse_request_knobs("kvreuse:knobs:pin=1")
    assert NOT_PORTED in str(env.value) and NOT_PORTED in str(knob.value)


def test_knobs_apply():
    knobs = parse_request_knobs("kvreuse:knobs:maxblocks=3,ssm=strict")
    config = knobs.apply(DEFAULT)
    assert config == dataclasses.replace(DEFAULT, max_blocks=3, ssm_mode="strict")
    assert DEFAULT.max_blocks == 6


def test_knobs_apply_without_overrides_is_identity():
    assert parse_request_knobs("tenant-a").apply(DEFAULT) is DEFAULT
