"""The request limits (``serving/request_limits.py``) and the byte-bounded cache that keeps compiled
stop regexes (``serving/byte_lru.py``): every rule at, below and above its boundary."""

from __future__ import annotations

import pytest

from serving import request_limits
from serving.byte_lru import ByteLRU
from serving.request_limits import (
    FLAGS, KIB, LIMITS_ENV, MIB, RequestLimits, batch_problem, body_size_problem, format_size, parse_size,
    stop_regex_entry_bytes, stop_regex_problem, stop_regexes_of,
)

DEFAULTS = RequestLimits()
SMALL = RequestLimits(max_prompts=4, max_sequences=8, max_stop_regexes=2, max_stop_regex_chars=10)


# ------------------------------------------------------------------------------------ sizes


@pytest.mark.parametrize("text, value", [
    ("0", 0), ("1", 1), ("1024", 1024), ("1K", KIB), ("256k", 256 * KIB), ("32M", 32 * MIB), ("2G", 2 << 30),
    ("32MiB", 32 * MIB), ("64KiB", 64 * KIB), (" 7 ", 7),
])
def test_parse_size(text, value):
    assert parse_size(text) == value


@pytest.mark.parametrize("text", ["", "M", "1.5M", "-1", "1T", "32 M", "ten", "0x10", "1KB1"])
def test_parse_size_refuses(text):
    with pytest.raises(ValueError, match="is not a size"):
        parse_size(text)


@pytest.mark.parametrize("value, text", [(0, "0"), (1, "1"), (1000, "1000"), (KIB, "1K"), (1536, "1536"),
                                         (256 * KIB, "256K"), (32 * MIB, "32M"), (3 << 30, "3G"), (MIB + 1, str(MIB + 1))])
def test_format_size_is_exact_and_reads_back(value, text):
    assert format_size(value) == text
    assert parse_size(text) == value


# ---------------------------------------------------------------------------- the settings


def test_defaults():
    assert (DEFAULTS.max_body_bytes, DEFAULTS.max_prompts, DEFAULTS.max_sequences, DEFAULTS.max_stop_regexes,
            DEFAULTS.max_stop_regex_chars, DEFAULTS.stop_regex_max_mem, DEFAULTS.stop_regex_cache_bytes) == (
        32 * MIB, 64, 256, 16, 16_384, 256 * KIB, 64 * MIB)
    assert set(FLAGS) == set(RequestLimits.__dataclass_fields__)


@pytest.mark.parametrize("name", sorted(FLAGS))
@pytest.mark.parametrize("value", [0, -1, True, 2.0, "5", None])
def test_each_limit_must_be_a_positive_integer(name, value):
    with pytest.raises(ValueError, match=f"{FLAGS[name]} must be a positive integer"):
        RequestLimits(**{name: value})


def test_stop_regex_max_mem_has_a_floor():
    assert RequestLimits(stop_regex_max_mem=16 * KIB).stop_regex_max_mem == 16 * KIB
    with pytest.raises(ValueError, match="--stop-regex-max-mem must be at least 16K"):
        RequestLimits(stop_regex_max_mem=16 * KIB - 1)


def test_json_round_trip_and_refusals():
    limits = RequestLimits(max_prompts=3, stop_regex_cache_bytes=5 * MIB)
    assert RequestLimits.from_json(limits.to_json()) == limits
    assert RequestLimits.from_json("{}") == DEFAULTS
    with pytest.raises(ValueError, match="unknown request limits"):
        RequestLimits.from_json('{"max_promts": 3}')
    with pytest.raises(ValueError, match="must be a JSON object"):
        RequestLimits.from_json("[1]")
    with pytest.raises(ValueError):
        RequestLimits.from_json("{nope")


def test_shown_names_the_flag_as_typed():
    assert DEFAULTS.shown("max_prompts") == "--max-prompts 64"
    assert DEFAULTS.shown("max_body_bytes") == "--max-request-body 32M"
    assert DEFAULTS.shown("stop_regex_max_mem") == "--stop-regex-max-mem 256K"
    assert RequestLimits(max_body_bytes=1000).shown("max_body_bytes") == "--max-request-body 1000"


def test_current_reads_the_launchers_environment(monkeypatch):
    monkeypatch.delenv(LIMITS_ENV, raising=False)
    assert request_limits.current() == DEFAULTS
    monkeypatch.setenv(LIMITS_ENV, SMALL.to_json())
    assert request_limits.current() == SMALL
    monkeypatch.setenv(LIMITS_ENV, "")
    assert request_limits.current() == DEFAULTS


# ------------------------------------------------------------------------------- batch size


@pytest.mark.parametrize("prompts, n", [(1, 1), (4, 1), (4, 2), (1, 8), (2, 4), (3, 2)])
def test_batch_within_the_limits(prompts, n):
    assert batch_problem(prompts, n, SMALL, "text") is None


@pytest.mark.parametrize("prompts, n, expected", [
    (5, 1, "text: 5 prompts in one request, over the limit of 4 (--max-prompts 4)"),
    (10_000, 1, "text: 10000 prompts in one request, over the limit of 4 (--max-prompts 4)"),
    (4, 3, "sampling_params.n: 4 prompts x n = 3 is 12 sequences in one request, over the limit of 8 (--max-sequences 8)"),
    (1, 9, "sampling_params.n: 1 prompts x n = 9 is 9 sequences in one request, over the limit of 8 (--max-sequences 8)"),
])
def test_batch_over_a_limit(prompts, n, expected):
    assert batch_problem(prompts, n, SMALL, "text").startswith(expected)


def test_prompt_limit_is_reported_before_the_sequence_limit():
    assert batch_problem(5, 100, SMALL, "input_ids").startswith("input_ids: 5 prompts")


# ------------------------------------------------------------------------------- stop regexes


@pytest.mark.parametrize("params, found", [
    (None, []), ({}, []), ({"stop_regex": None}, []), ({"stop_regex": "a+"}, ["a+"]),
    ({"stop_regex": ["a", "b"]}, ["a", "b"]), ({"stop_regex": ["a", 5, None]}, ["a"]), ({"stop_regex": 5}, []),
    ([{"stop_regex": "a"}, {"stop_regex": ["a", "b"]}, "junk", {}], ["a", "a", "b"]),
])
def test_stop_regexes_of(params, found):
    assert stop_regexes_of(params) == found


@pytest.mark.parametrize("patterns", [[], ["a"], ["a", "b"], ["a", "a", "a", "b"], ["abcde", "fghij"], ["a", 5]])
def test_stop_regexes_within_the_limits(patterns):
    assert stop_regex_problem(patterns, SMALL) is None


@pytest.mark.parametrize("patterns, expected", [
    (["a", "b", "c"], "sampling_params.stop_regex: 3 distinct patterns in one request, over the limit of 2 "
                      "(--max-stop-regexes 2)"),
    (["abcdef", "ghijk"], "sampling_params.stop_regex: 11 characters of patterns in one request, over the limit "
                          "of 10 (--max-stop-regex-chars 10)"),
    (["x" * 11], "sampling_params.stop_regex: 11 characters"),
])
def test_stop_regexes_over_a_limit(patterns, expected):
    assert stop_regex_problem(patterns, SMALL).startswith(expected)


def test_repeated_patterns_count_once():
    assert stop_regex_problem(["abcdefghij"] * 50, SMALL) is None


# -------------------------------------------------------------------------------- body, cache


def test_body_size_messages():
    limits = RequestLimits(max_body_bytes=MIB)
    assert body_size_problem(2 * MIB, limits, declared=True) == (
        f"body: {2 * MIB} bytes, over the limit of {MIB} bytes (--max-request-body 1M)")
    assert body_size_problem(MIB + 10, limits, declared=False) == (
        f"body: more than {MIB} bytes, over the limit of {MIB} bytes (--max-request-body 1M)")


def test_entry_bytes_charge_the_worst_case():
    assert stop_regex_entry_bytes("", 3 * KIB) == 4 * KIB
    assert stop_regex_entry_bytes("ab", 3 * KIB) == 4 * KIB + 6
    assert stop_regex_entry_bytes("\u00e9", 3 * KIB) == 4 * KIB + 6  # UTF-8 bytes, not characters
    assert stop_regex_entry_bytes("\ud800", 3 * KIB) == 4 * KIB + 3  # cannot occur (refused earlier); no crash
    # the default cache holds ~190 patterns at the default max_mem
    assert DEFAULTS.stop_regex_cache_bytes // stop_regex_entry_bytes("a" * 100, DEFAULTS.stop_regex_max_mem) == 191


def test_byte_lru_keeps_by_recency_within_its_bytes():
    made = []
    cache = ByteLRU(10, cost=len)

    def make(key):
        made.append(key)
        return key.upper()

    assert cache.get_or_make("aaaa", lambda: make("aaaa")) == "AAAA"
    assert cache.get_or_make("bbbb", lambda: make("bbbb")) == "BBBB"
    assert cache.charged == 8 and len(cache) == 2
    assert cache.get_or_make("aaaa", lambda: make("aaaa")) == "AAAA"  # a hit; "bbbb" is now the oldest
    assert made == ["aaaa", "bbbb"]
    cache.get_or_make("cc", lambda: make("cc"))
    assert cache.charged == 10 and cache.evictions == 0
    cache.get_or_make("ddd", lambda: make("ddd"))  # 13 > 10: "bbbb" goes
    assert "bbbb" not in cache and {"aaaa", "cc", "ddd"} <= set(cache._entries) and cache.charged == 9
    assert cache.evictions == 1
    cache.get_or_make("bbbb", lambda: make("bbbb"))  # made again, never refused
    assert made[-1] == "bbbb" and cache.charged <= 10


def test_byte_lru_returns_but_does_not_keep_an_entry_over_its_capacity():
    cache = ByteLRU(5, cost=len)
    cache.get_or_make("ab", lambda: 1)
    assert cache.get_or_make("x" * 6, lambda: 2) == 2
    assert "x" * 6 not in cache and "ab" in cache and cache.charged == 2
    empty = ByteLRU(0, cost=len)
    assert empty.get_or_make("a", lambda: 3) == 3 and len(empty) == 0


def test_byte_lru_keeps_nothing_when_make_raises():
    cache = ByteLRU(10, cost=len)

    def fail():
        raise KeyError("bad")

    with pytest.raises(KeyError):
        cache.get_or_make("a", fail)
    assert len(cache) == 0 and cache.charged == 0


def test_byte_lru_put_replaces_and_clear_empties():
    cache = ByteLRU(10, cost=lambda key: 4)
    cache.put("a", 1)
    cache.put("a", 2)
    assert cache.charged == 4 and cache.get_or_make("a", lambda: 3) == 2
    cache.clear()
    assert len(cache) == 0 and cache.charged == 0
    with pytest.raises(ValueError):
        ByteLRU(-1, cost=len)


# ------------------------------------------------------------------- batch size on a raw body


@pytest.mark.parametrize("args, count", [
    ({}, None), ({"text": "a"}, 1), ({"text": ["a", "b"]}, 2), ({"text": []}, 0), ({"text": 5}, None),
    ({"input_ids": [1, 2, 3]}, 1), ({"input_ids": [[1], [2]]}, 2), ({"input_ids": []}, 1), ({"input_ids": "x"}, None),
    ({"input_embeds": [[0.1, 0.2]]}, 1), ({"input_embeds": [[[0.1]], [[0.2]]]}, 2), ({"input_embeds": []}, 0),
    ({"text": "a", "input_ids": [[1], [2]]}, 1),  # the first given decides, as in SGLang
])
def test_prompt_count(args, count):
    assert request_limits.prompt_count(**args) == count


GENERATE_FIELDS = (("text", "input_ids", "input_embeds"), "sampling_params.n")


@pytest.mark.parametrize("body, fields, expected", [
    ({"input_ids": [[1]] * 5}, GENERATE_FIELDS, "input_ids: 5 prompts in one request, over the limit of 4"),
    ({"text": ["a"] * 3, "sampling_params": {"n": 3}}, GENERATE_FIELDS, "sampling_params.n: 3 prompts x n = 3 is 9"),
    ({"text": ["a"] * 3, "sampling_params": [{"n": 3}, {"n": 3}, {"n": 3}]}, GENERATE_FIELDS,
     "sampling_params.n: 3 prompts x n = 3"),
    ({"prompt": ["a"] * 5}, (("prompt",), "n"), "prompt: 5 prompts"),
    ({"prompt": [[1, 2]] * 5}, (("prompt",), "n"), "prompt: 5 prompts"),
    ({"prompt": [1, 2, 3], "n": 9}, (("prompt",), "n"), "n: 1 prompts x n = 9 is 9 sequences"),
    ({"messages": [{"role": "user", "content": "x"}], "n": 9}, (("messages",), "n"), "n: 1 prompts x n = 9"),
])
def test_body_batch_over_a_limit(body, fields, expected):
    assert request_limits.body_batch_problem(body, *fields, SMALL).startswith(expected)


@pytest.mark.parametrize("body, fields", [
    ({}, GENERATE_FIELDS), ({"input_ids": [[1]] * 4, "sampling_params": {"n": 2}}, GENERATE_FIELDS),
    ({"text": "a", "sampling_params": {"n": "x"}}, GENERATE_FIELDS),  # not an integer: the schema names it later
    ({"text": ["a"] * 2, "sampling_params": {"n": True}}, GENERATE_FIELDS),
    ({"text": ["a"] * 2, "sampling_params": "junk"}, GENERATE_FIELDS),
    ({"text": ["a"] * 2, "sampling_params": []}, GENERATE_FIELDS),
    ({"prompt": "a", "n": 8}, (("prompt",), "n")), ({"prompt": None}, (("prompt",), "n")),
    ({"messages": None, "n": 100}, (("messages",), "n")),
])
def test_body_batch_within_the_limits_or_left_to_the_schema(body, fields):
    assert request_limits.body_batch_problem(body, *fields, SMALL) is None
