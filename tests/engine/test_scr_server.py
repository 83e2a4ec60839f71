"""``--cache-policy scr`` on the tiny model: relocation, its accounting, fallbacks, state modes.

Conversations are token-id prompts (``/generate``). A session is matched by content (common
prefix >= 1024 tokens of the first 8192, ``docs/scr.md`` §4.3), so every edited turn keeps the
first 1200 tokens. SGLang's strict idle leak check is on (``STRICT_ENV``): a KV slot not returned
after a splice stops the scheduler, which ``fatal_lines`` reports.
"""
# Spec: docs/scr.md

from __future__ import annotations

import re

import pytest

from eval.server import output_record, wait_for_events
from scr.authors_log import parse_line
from tests.engine.conftest import start_server
from tests.engine.prompts import prompt_ids
from tests.engine.test_scr_reference import check, phase1_hit, relocations
from tests.reference.scr_reference import Conversation

pytestmark = pytest.mark.engine

SIDE = ["--cache-policy-set", "side_sessions=16", "--cache-policy-set", "side_tokens=4096"]
SCR_ARGS = ["--chunked-prefill-size", "256", "--max-running-requests", "4", "--max-total-tokens", "12288"]
MAX_BLOCKS = 6


def _server(tiny_model_dir, tmp_path_factory, name, policy_args):
    tmp = tmp_path_factory.mktemp(name)
    server = start_server(
        tiny_model_dir, tmp, name,
        [*SCR_ARGS, *policy_args, "--cache-events", str(tmp / "events.jsonl")],
    )
    server.events_path = tmp / "events.jsonl"
    return server


@pytest.fixture(scope="module")
def scr_server(tiny_model_dir, tmp_path_factory):
    server = _server(tiny_model_dir, tmp_path_factory, "scr", ["--cache-policy", "scr", *SIDE])
    yield server
    server.flush_cache()
    server.stop()
    assert server.fatal_lines() == [], server.log_tail()


def conversation(seed: int) -> list[list[int]]:
    """Three turns: a 2400-token first message, then two turns that each delete a section from the
    middle of what came before and append new text (as an agent that edits its context)."""
    first = prompt_ids(seed, 2400)
    second = first[:1400] + first[1600:] + prompt_ids(seed + 1, 40)
    third = second[:1800] + second[1950:] + prompt_ids(seed + 2, 40)
    return [first, second, third]


def run_turns(server, turns, prefix: str, extra_key: str | None = None, max_new_tokens: int = 8) -> list[dict]:
    records = []
    for number, tokens in enumerate(turns, 1):
        extra = {"extra_key": extra_key} if extra_key is not None else {}
        response = server.generate(tokens, max_new_tokens, rid=f"{prefix}.{number}", return_logprob=True, **extra)
        records.append(output_record(response))
    return records


def events_of(server, prefix: str, count: int) -> list[dict]:
    rids = [f"{prefix}.{n}" for n in range(1, count + 1)]
    found = wait_for_events(server.events_path, rids)
    return [found[rid] for rid in rids]


def log_records(server, kind: str, rid: str | None = None) -> list[dict]:
    out = []
    for line in server.log_text().splitlines():
        text = line.split("] ", 1)[1] if line.startswith("[20") and "] " in line else line  # drop the time
        parsed = parse_line(text) if text.startswith(("[kvreuse", "[scr]")) else None
        if parsed and parsed["kind"] == kind and (rid is None or parsed.get("rid") == rid):
            out.append(parsed)
    return out


def assert_turns_equal_reference(server, ref, turns, records, prefix: str) -> int:
    """Each turn of one conversation against the independent SCR reference, given the server's
    decisions (its splice lines; its phase-1 tree hit and the start of each phase-1 forward, from
    which the reference replays the tree's relocated rows replacing re-read ones after each
    forward). Returns how many turns relocated rows."""
    conversation, relocated = Conversation(ref), 0
    for number, (prompt, record) in enumerate(zip(turns, records), 1):
        rid = f"{prefix}.{number}"
        blocks = relocations(server, rid)
        try:
            hit = phase1_hit(server, rid)
        except AssertionError:  # no phase 1: a plain read, or a splice before admission
            hit = None
        # Where each phase-1 forward began: with four conversations in a round the 256-token
        # budget is shared, so the forwards are not on the grid the reference would assume.
        starts = [int(n) for n in re.findall(rf"kv6 rid={re.escape(rid)} phase1 re-entry \([^)]*\): prefix=(\d+) ",
                                             server.log_text())]
        expected = conversation.serve(prompt, record["output_ids"], blocks, read_from=hit or 0,
                                      chunk=None if hit is None else 256, forward_starts=starts or None)
        check(record, expected, f"{prefix} turn {number}")
        relocated += bool(blocks)
    return relocated


@pytest.fixture(scope="module")
def ref(tiny_model_dir):
    from tests.reference.hybrid_reference import Reference

    return Reference(tiny_model_dir)


def test_short_pool_evicts_from_the_tree_and_retries_the_allocation(tiny_model_dir, tmp_path_factory, ref):
    """A 4096-slot pool holding two earlier prompts has too few free slots for the splice: the
    tree is evicted and the allocation retried once (docs/scr.md §10.3); nothing leaks, and the
    relocated turn's answer is the reference's for its history (the rows placed after the retry
    are the side rows, re-rotated, not whatever the evicted slots held)."""
    tmp = tmp_path_factory.mktemp("evict")
    args = ["--chunked-prefill-size", "256", "--max-running-requests", "4", "--cache-policy", "scr", *SIDE,
            "--cache-events", str(tmp / "events.jsonl")]
    server = start_server(tiny_model_dir, tmp, "evict", args)  # TEST_SERVER_ARGS: --max-total-tokens 4096
    server.events_path = tmp / "events.jsonl"
    try:
        first, second, _ = conversation(301)
        one = output_record(server.generate(first, 4, rid="evict.1"))
        server.generate(prompt_ids(302, 1500), 4, rid="other.1")
        two = output_record(server.generate(second, 4, rid="evict.2"))
        assert events_of(server, "evict", 2)[1]["moved"] == (2400 - 1600) - 16
        (retry,) = log_records(server, "evict_retry")
        assert retry["retry"] == "OK" and retry["evicted"] > 0
        assert assert_turns_equal_reference(server, ref, [first, second], [one, two], "evict") == 1
        server.flush_cache()
    finally:
        server.stop()
    assert server.fatal_lines() == [], server.log_tail()


def test_middle_deletions_relocate_rows_on_later_turns(scr_server):
    records = run_turns(scr_server, conversation(11), "edit")
    events = events_of(scr_server, "edit", 3)
    assert events[0]["moved"] == 0  # first turn: cold session
    for event, record in zip(events[1:], records[1:]):
        assert event["moved"] > 0, event
        assert 1 <= event["blocks"] <= MAX_BLOCKS
        assert event["prefix_reused"] + event["moved"] + event["read"] == event["prompt_tokens"]
        # SGLang counts the relocated rows twice in cached_tokens (docs/scr.md §7.5, §12).
        assert record["cached_tokens"] == event["prefix_reused"] + 2 * event["moved"]
        assert len(record["output_ids"]) == 8
    (banner,) = log_records(scr_server, "scr_site")  # what the authors' report reads K from
    assert banner["max_blocks"] == MAX_BLOCKS and banner["splice_retry"] == 8
    for number in (2, 3):
        splices = log_records(scr_server, "splice_ok", f"edit.{number}")
        assert splices and sum(s["relocated"] for s in splices) == events[number - 1]["moved"]
        trace = log_records(scr_server, "trace_req", f"edit.{number}")
        assert trace and trace[0]["n_old"] > 0  # matched the conversation's session


def test_relocated_rows_are_the_surviving_text(scr_server):
    """Turn 2 deletes [1400, 1600) of turn 1: the rows after the deletion move by -200 and the
    prompt's tail is read; the stop is the first token after the deletion."""
    turns = conversation(21)
    run_turns(scr_server, turns[:2], "shift")
    (splice,) = log_records(scr_server, "splice_ok", "shift.2")
    assert splice["stop"] == 1400
    phase2 = log_records(scr_server, "phase2", "shift.2")
    assert phase2[0]["rot_delta"] == -200
    # The relocated run is the surviving old text minus the last min_extend (16) tokens.
    assert splice["relocated"] == (2400 - 1600) - 16


def test_deletion_at_a_state_checkpoint_splices_before_admission(scr_server):
    """The deletion starts at 1280, a chunk end (5 x 256) where the tree holds a state: the radix
    match ends exactly at the stop, so the block is spliced on the waiting queue with no phase 1
    (spec §7.2 step 8), and the restore replaces the state copied from the matched node."""
    first = prompt_ids(35, 2400)
    second = first[:1280] + first[1480:] + prompt_ids(36, 40)
    records = run_turns(scr_server, [first, second], "direct")
    event = events_of(scr_server, "direct", 2)[1]
    assert not log_records(scr_server, "phase1", "direct.2")
    (phase2,) = log_records(scr_server, "phase2", "direct.2")
    assert phase2["prefilled_chunk1"] == 0
    assert event["prefix_reused"] == 1280 and event["moved"] == (2400 - 1480) - 16
    assert records[1]["cached_tokens"] == 1280 + 2 * event["moved"]
    assert any("ev=ssm_restore" in line and "rid=direct.2 " in line for line in scr_server.log_text().splitlines())


def test_two_deleted_sections_make_two_blocks(scr_server):
    first = prompt_ids(31, 2400)
    second = first[:1300] + first[1400:1900] + first[2000:] + prompt_ids(32, 40)
    run_turns(scr_server, [first, second], "two")
    (event,) = events_of(scr_server, "two", 2)[1:]
    assert event["blocks"] == 2
    splices = log_records(scr_server, "splice_ok", "two.2")
    assert [s["block"] for s in splices] == [1, 2] and {s["num_blocks"] for s in splices} == {2}
    assert event["moved"] == sum(s["relocated"] for s in splices)


def test_salts_never_share_a_session(scr_server):
    first, second, _ = conversation(41)
    run_turns(scr_server, [first], "salt-a", extra_key="tenant-a")
    # Same edit under another salt: a new session, nothing relocated.
    run_turns(scr_server, [second], "salt-b", extra_key="tenant-b")
    (event_b,) = events_of(scr_server, "salt-b", 1)
    assert event_b["moved"] == 0 and event_b["prefix_reused"] == 0
    assert log_records(scr_server, "trace_req", "salt-b.1")[0]["n_old"] == 0
    # The first salt's conversation still relocates.
    scr_server.generate(second, 4, rid="salt-a.2", extra_key="tenant-a")
    assert events_of(scr_server, "salt-a", 2)[1]["moved"] > 0


def test_conversation_longer_than_a_side_slot_falls_back(scr_server):
    first = prompt_ids(51, 4200)  # side_tokens = 4096
    second = first[:1400] + first[1600:] + prompt_ids(52, 40)
    run_turns(scr_server, [first, second], "long")
    events = events_of(scr_server, "long", 2)
    assert [e["moved"] for e in events] == [0, 0]
    assert log_records(scr_server, "trace_req", "long.2")[0]["n_old"] == 0  # the session was dropped
    assert "side store skipped (oversize)" in scr_server.log_text()


@pytest.mark.parametrize("mode", ["fork", "strict", "none"])
def test_each_ssm_mode_runs(scr_server, mode):
    """fork restores the saved state at block 1; none relocates without it; strict declines every
    default-path plan: its snapshot covers the whole previous prompt, more than the surviving rows
    (docs/scr.md §9.5)."""
    salt = f"kvreuse:knobs:ssm={mode}"
    records = run_turns(scr_server, conversation(60 + len(mode))[:2], f"mode-{mode}", extra_key=salt)
    event = events_of(scr_server, f"mode-{mode}", 2)[1]
    restores = [line for line in scr_server.log_text().splitlines()
                if "ev=ssm_restore" in line and f"rid=mode-{mode}.2 " in line]
    assert len(records[1]["output_ids"]) == 8
    if mode == "strict":
        assert event["moved"] == 0 and not restores
        assert "strict_snapshot_longer_than_rows" in scr_server.log_text()
    else:
        assert event["moved"] > 0
        assert bool(restores) == (mode == "fork")


def test_request_finishing_on_its_first_token_marks_its_state_stale(scr_server):
    """A one-chunk prompt that finishes on its first token is released inside the prefill result,
    before the state hook runs: its session's state is marked stale (docs/scr.md §9.2)."""
    first, second, _ = conversation(71)
    scr_server.generate(first[:200], 1, rid="stale.0")  # short: one chunk, finishes at once
    assert "ssm snapshot dropped: rid=stale.0" in scr_server.log_text()


def test_concurrent_conversations_relocate_and_return_every_slot(scr_server, ref):
    """Four conversations at once: plans wait for the chunked slot (DEFERRED-RETRY), a phase-1
    request owns its prefill rounds, and the idle leak check (strict) finds nothing afterwards.
    Every turn of every conversation equals the reference of its own history."""
    import threading

    failures, records = [], {}

    def run(number: int) -> None:
        try:
            records[number] = run_turns(scr_server, conversation(200 + number), f"conc{number}", max_new_tokens=16)
        except Exception as exc:  # noqa: BLE001 - reported below
            failures.append(exc)

    threads = [threading.Thread(target=run, args=(number,)) for number in range(4)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert failures == []
    events = [e for number in range(4) for e in events_of(scr_server, f"conc{number}", 3)]
    assert all(e["prefix_reused"] + e["moved"] + e["read"] == e["prompt_tokens"] for e in events)
    assert sum(e["moved"] > 0 for e in events) >= 4
    relocated = sum(assert_turns_equal_reference(scr_server, ref, conversation(200 + number), records[number],
                                                 f"conc{number}") for number in range(4))
    assert relocated == sum(e["moved"] > 0 for e in events)
    scr_server.flush_cache()  # idle: SGLang's strict leak check runs; a leak is a fatal line


@pytest.fixture(scope="module")
def off_pair(scr_server, tiny_model_dir, tmp_path_factory):
    """The same conversation under ``kvreuse:off`` on scr (the module's server, its cache flushed
    first) and on a fresh radix server with the same SGLang flags."""
    turns = conversation(81)
    scr_server.flush_cache()
    out = {"scr": run_turns(scr_server, turns, "off", extra_key="kvreuse:off")}
    out["scr_events"] = events_of(scr_server, "off", 3)
    out["scr_log"] = scr_server.log_text()
    server = _server(tiny_model_dir, tmp_path_factory, "off-radix", ["--cache-policy", "radix"])
    try:
        out["radix"] = run_turns(server, turns, "off", extra_key="kvreuse:off")
    finally:
        server.stop()
    assert server.fatal_lines() == [], server.log_tail()
    return out


def test_kvreuse_off_matches_radix_exactly(off_pair):
    assert off_pair["scr"] == off_pair["radix"]  # ids, logprobs, cached_tokens per turn
    assert [e["moved"] for e in off_pair["scr_events"]] == [0, 0, 0]
    assert "kv6trace ev=req rid=off." not in off_pair["scr_log"]


def test_relocated_rows_in_the_tree_serve_the_next_append(scr_server, tiny_model_dir, tmp_path_factory):
    """The default, ``relocated_in_tree=1`` (the authors' code; the module's server, its tree flushed
    first): the edited turn is cached like any request, relocated rows included, so the append turn
    after it hits the tree past the first stop. The ablation ``relocated_in_tree=0`` keeps in the
    tree only what phase 1 read exactly (up to the first stop)."""
    first, second, _ = conversation(91)
    fourth = second + prompt_ids(92, 30)
    hits = {}
    for setting in ("0", "1"):
        server = scr_server if setting == "1" else _server(
            tiny_model_dir, tmp_path_factory, "tree0",
            ["--cache-policy", "scr", *SIDE, "--cache-policy-set", "relocated_in_tree=0"])
        try:
            server.flush_cache()
            run_turns(server, [first, second, fourth], f"tree{setting}")
            events = events_of(server, f"tree{setting}", 3)
            server.flush_cache()
        finally:
            if server is not scr_server:
                server.stop()
        assert server.fatal_lines() == [], server.log_tail()
        assert events[1]["moved"] > 0
        hits[setting] = events[2]["prefix_reused"]
    assert hits["0"] <= 1400 < len(second) - 64 <= hits["1"]
