"""eval.bcp.startup: the server's start-up record against what a run was told (handcrafted files)."""

from __future__ import annotations

import json

import pytest

from eval.bcp.startup import given_settings, last_startup, startup_mismatches
from policy.events import startup_record
from policy.registry import PolicyError

EXACT = {"piece_tokens": 256, "retain_every": 512, "spec_drop": 0, "max_snapshots": 0, "dump_snapshots": ""}


def record(policy="exact", settings=None, pid=1):
    return startup_record(policy, dict(EXACT if settings is None else settings), {"sglang": "0.5.16"},
                          ["--cache-policy", policy], pid, 1.0)


@pytest.mark.parametrize("policy, settings, problems", [
    pytest.param("exact", {}, [], id="same-policy-no-settings"),
    pytest.param("exact", {"piece_tokens": 256}, [], id="same-setting"),
    pytest.param("radix", {}, ["policy: the server runs 'exact', the run was told 'radix'"], id="other-policy"),
    pytest.param("exact", {"piece_tokens": 832},
                 ["setting piece_tokens: the server runs 256, the run was told 832"], id="other-value"),
    pytest.param("exact", {"side_tokens": 1},
                 ["setting side_tokens: the server's start-up record has no such setting"], id="unknown-setting"),
])
def test_startup_mismatches(policy, settings, problems):
    assert startup_mismatches(record(), policy, settings) == problems


def test_values_compare_as_json_reads_them():
    # A tuple setting reads back as a list; a typed bool equals the record's true.
    served = record("x", {"ratios": [0.25, 0.5], "on": True})
    assert startup_mismatches(served, "x", {"ratios": (0.25, 0.5), "on": True}) == []


@pytest.mark.parametrize("policy, given, typed", [
    pytest.param("exact", [("piece_tokens", "256")], {"piece_tokens": 256}, id="int"),
    pytest.param("scr", [("debug", "0"), ("side_tokens", "4096")], {"debug": False, "side_tokens": 4096},
                 id="bool-and-int"),
    pytest.param("exact", [("piece_tokens", " 256 "), ("piece_tokens", "512")], {"piece_tokens": 512},
                 id="stripped-later-wins"),
    pytest.param("radix", [], {}, id="none"),
])
def test_given_settings_are_typed_like_the_policy_config(policy, given, typed):
    assert given_settings(policy, given) == typed


@pytest.mark.parametrize("policy, given", [
    pytest.param("exact", [("nope", "1")], id="unknown-key"),
    pytest.param("exact", [("piece_tokens", "many")], id="bad-value"),
])  # a setting without '=' is refused when the flag is parsed (eval.cli_types.key_value)
def test_bad_settings_are_policy_errors(policy, given):
    with pytest.raises(PolicyError):
        given_settings(policy, given)


def test_last_startup_reads_the_last_record_of_the_file(tmp_path):
    events = tmp_path / "events.jsonl"
    assert last_startup(events) is None  # no file
    events.write_text(json.dumps({"rid": "a.1.0000", "policy": "exact"}) + "\n")
    assert last_startup(events) is None  # an older server: request events only
    lines = [record(pid=1), {"rid": "a.1.0000"}, record(pid=2), {"rid": "a.1.0001"}]
    events.write_text("".join(json.dumps(line) + "\n" for line in lines))
    assert last_startup(events)["pid"] == 2
