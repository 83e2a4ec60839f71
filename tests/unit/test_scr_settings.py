"""``scr.settings``: ``ScrConfig`` defaults and validation, the ``--cache-policy-set`` layer
(``merge``), and the settings table generated from field metadata (``docs/scr.md`` §2.1, §2.2)."""
# Spec: docs/scr.md

from __future__ import annotations

import dataclasses
from pathlib import Path

import pytest

from scr.settings import TABLE_HEADER, ScrConfig, merge, settings_table

DEFAULT = ScrConfig()
NAMES = [f.name for f in dataclasses.fields(ScrConfig)]
README = Path(__file__).resolve().parents[2] / "scr" / "README.md"


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
        pytest.param("relocated_in_tree", True, id="relocated_in_tree-True"),
        pytest.param("session_identity", "content", id="session_identity-content"),
    ],
)
def test_default(name, expected):
    assert getattr(DEFAULT, name) == expected
    assert type(getattr(DEFAULT, name)) is type(expected)


def test_default_cases_cover_every_field():
    marks = test_default.pytestmark[0].args[1]
    assert [case.values[0] for case in marks] == NAMES
    assert len(NAMES) == 31


@pytest.mark.parametrize("key", ["help", "env", "spec"])
def test_every_field_states_its_metadata(key):
    assert [f.name for f in dataclasses.fields(ScrConfig) if not f.metadata[key]] == []


def test_env_names_are_distinct_kvreuse_variables():
    names = [f.metadata["env"] for f in dataclasses.fields(ScrConfig)]
    assert len(set(names)) == len(names) and all(n.startswith("KVREUSE_") for n in names)


def test_settings_table_has_one_row_per_field_in_order():
    rows = settings_table().removeprefix(TABLE_HEADER).splitlines()
    assert [row.split(" | ")[0].removeprefix("| ") for row in rows] == [f"`{name}`" for name in NAMES]
    assert rows[1] == (
        "| `max_blocks` | `6` | `KVREUSE_MAX_BLOCKS` | §2.1 | 3 | K: most blocks relocated per request (§6.5 step 3) |"
    )


def test_readme_table_is_the_generated_one():
    text = README.read_text()
    begin, end = "<!-- settings table: begin -->\n", "<!-- settings table: end -->"
    in_readme = text[text.index(begin) + len(begin):text.index(end)]
    assert in_readme == settings_table(), "scr/README.md is stale: paste the output of python -m scr.settings"


def test_config_is_frozen():
    with pytest.raises(dataclasses.FrozenInstanceError):
        DEFAULT.max_blocks = 3


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
            "scr has no setting 'max_block'; valid settings: " + ", ".join(NAMES),
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
